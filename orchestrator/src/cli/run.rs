//! `hull run`.
use std::ffi::OsString;
use std::path::PathBuf;

use clap::Args;

use crate::run::{RunOptions, TierChoice};

#[derive(Debug, Args)]
pub struct RunArgs {
    /// auto (the host's tier 2), none, landlock, bwrap, seatbelt, restricted, appcontainer, vm.
    #[arg(long, default_value = "auto")]
    pub tier: String,
    /// Tier 3: an outer VM running an unprivileged container (same as --tier vm).
    #[arg(long, conflicts_with = "tier")]
    pub tier3: bool,
    /// A shipped profile name (default, readonly, build) or a policy file.
    #[arg(long, default_value = "default")]
    pub policy: String,
    /// The project directory (default: the current directory).
    #[arg(long)]
    pub project: Option<PathBuf>,
    /// Set a variable in the command's environment (repeatable).
    #[arg(long = "env", value_name = "K=V", value_parser = parse_env)]
    pub env: Vec<(String, String)>,
    /// Kill the whole process tree after this long (e.g. 90s, 10m); overrides limits.wall_time.
    #[arg(long, value_parser = parse_timeout)]
    pub timeout: Option<std::time::Duration>,
    /// Store large output in the instance's spill dir and print head, tail and the path.
    #[arg(long, value_name = "BYTES", num_args = 0..=1, default_missing_value = "50000")]
    pub spill: Option<u64>,
    /// Join an existing instance (its spill stays readable), by id.
    #[arg(long, env = "HULL_INSTANCE")]
    pub instance: Option<String>,
    /// Tier 3: run in the VM named NAME kept up by `hull vm up`.
    #[arg(long)]
    pub vm: Option<String>,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    pub argv: Vec<OsString>,
}

fn parse_env(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected K=V"))?;
    if k.is_empty() || !k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return Err(format!("{k:?} is not a valid variable name"));
    }
    Ok((k.to_string(), v.to_string()))
}

fn parse_timeout(s: &str) -> Result<std::time::Duration, String> {
    crate::policy::resolve::parse_duration(s)
}

pub fn run(a: RunArgs) -> anyhow::Result<i32> {
    let tier = if a.tier3 || a.vm.is_some() {
        TierChoice::Named(crate::tier::Tier::Vm)
    } else {
        TierChoice::parse(&a.tier)?
    };
    let project = match a.project {
        Some(p) => p,
        None => super::default_project()?,
    };
    let opts = RunOptions {
        tier,
        policy: a.policy,
        project,
        env: a.env,
        timeout: a.timeout,
        spill: a.spill,
        instance: a.instance,
        vm: a.vm,
        argv: a.argv,
    };
    let status = crate::run::execute(opts)?;
    Ok(status.exit_code())
}
