//! Starting a command and keeping the runtime's directories.
//!
//! The floor above the policy: [`exec`] starts a lowered command (a tier's
//! launcher gives it the argv), streams its output, applies the timeout and
//! ends its whole process tree, and maps the exit status to hull's exit
//! code; [`runtime`] owns the per-instance run directories (create, join,
//! lock, spill, bounded reads, cleanup) and the descriptor-relative walks
//! ([`runtime::beneath`], [`runtime::fsx`]) every tree a command can write
//! is worked on with; [`settings`] reads hull's `HULL_*` variables once,
//! and [`state`] says where hull keeps its own state; [`sandbox_user`] is
//! the unprivileged user hull's helpers and commands run as when hull is
//! root; [`mountinfo`] reads the mount table; [`os`] names the host's
//! operating system and [`text`] makes text from outside hull safe to
//! print; `winsec` (Windows) holds the SIDs and ACLs the Windows tiers and
//! the Hyper-V backend both use.
//!
//! What it may not do: know a tier. It uses only `hull-policy` and
//! `hull-protocol` below it; the tiers, the VM, the network proxy and the
//! commands are in the crates above, which give it what it needs from them
//! as values or functions (the cleanup of a crashed tier-3 run reaches
//! [`runtime::gc()`] as a [`runtime::Reclaim`]).

pub mod exec;
pub mod mountinfo;
pub mod os;
#[cfg(unix)]
pub mod out_dir;
pub mod runtime;
pub mod sandbox_user;
pub mod settings;
pub mod state;
pub mod text;
#[cfg(windows)]
pub mod winsec;

use hull_policy as policy;

/// Exit code when hull itself failed (the command did not run, or its
/// result is unknown). Distinct from any exit code `sh` gives a command.
pub const EXIT_HULL_FAILED: i32 = 125;
/// Exit code when the command was killed because it exceeded its wall time.
pub const EXIT_TIMEOUT: i32 = 124;
