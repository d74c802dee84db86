//! Tier 0: no boundary at all. The command runs in the project with the
//! policy's environment (host secrets scrubbed) and nothing else. Used only
//! when asked for by name, and hull says so loudly on every run.

use std::ffi::OsString;
use std::process::Command;

use crate::{probe::Probe, Tier};

/// The warning printed on every tier-0 run.
pub const WARNING: &str = "hull: WARNING: --tier none: the command runs UNSANDBOXED; it can read, write and reach everything you can. Only the environment is scrubbed.";

pub fn probe() -> Probe {
    Probe::available(Tier::None, "always available; isolates nothing", Vec::new())
}

/// The command for tier 0.
pub fn command(argv: &[OsString]) -> Command {
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    cmd
}
