//! hull: run a command behind an operating-system boundary.
//!
//! The crate is organised by what each part protects:
//! - [`policy`]: what a command may touch, and its lowered form per tier;
//! - [`runtime`]: the per-instance directories, lock, spill and safe reads;
//! - [`tier`]: the closed set of tiers, probing, and each tier's launcher;
//! - [`exec`]: starting a lowered command, streaming it, killing its tree;
//! - [`vm`]: tier 3, the outer VM and its guest agent;
//! - [`cli`]: argument parsing and output only.

pub mod batch;
#[cfg(unix)]
pub mod canary;
#[cfg(target_os = "linux")]
pub mod changes;
pub mod cli;
pub mod compare;
pub mod exec;
pub mod mountinfo;
#[cfg(unix)]
pub mod net;
pub mod os;
#[cfg(unix)]
pub mod out_dir;
pub mod result_file;
pub mod run;
pub mod runtime;
pub mod sandbox_user;
#[cfg(target_os = "linux")]
pub mod serve;
pub mod settings;
pub mod text;
pub mod tier;
pub mod vm;
#[cfg(windows)]
pub mod winsec;

/// The policy, its resolution and its lowering: the `hull-policy` crate.
pub use hull_policy as policy;

/// Exit code when hull itself failed (the command did not run, or its
/// result is unknown). Distinct from any exit code `sh` gives a command.
pub const EXIT_HULL_FAILED: i32 = 125;
/// Exit code when the command was killed because it exceeded its wall time.
pub const EXIT_TIMEOUT: i32 = 124;
