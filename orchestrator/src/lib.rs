//! hull: run a command behind an operating-system boundary.
//!
//! The crate is organised by what each part protects:
//! - [`policy`]: what a command may touch, and its lowered form per tier;
//! - [`runtime`]: the per-instance directories, lock, spill and safe reads;
//! - [`tier`]: the closed set of tiers, probing, and each tier's launcher;
//! - [`exec`]: starting a lowered command, streaming it, killing its tree;
//! - [`vm`]: tier 3, the outer VM and its guest agent;
//! - [`templates`]: sessions' workspaces kept under a name to start from;
//! - [`cli`]: argument parsing and output only.

pub mod batch;
#[cfg(unix)]
pub mod canary;
pub mod cli;
pub mod compare;
pub mod result_file;
pub mod run;
#[cfg(target_os = "linux")]
pub mod serve;
#[cfg(target_os = "linux")]
pub mod templates;
pub mod tier;

/// Tier 3, the outer VM, and what every run is prepared from: the `hull-vm`
/// crate.
pub use hull_vm as vm;
pub use hull_vm::prepare;

/// The policy, its resolution and its lowering: the `hull-policy` crate.
pub use hull_policy as policy;

/// Starting a command, the runtime's directories, the settings, the mount
/// table, and hull's own exit codes: the `hull-exec` crate.
pub use hull_exec::{
    exec, mountinfo, os, runtime, sandbox_user, settings, state, text, EXIT_HULL_FAILED,
    EXIT_TIMEOUT,
};

/// Directories hull writes its outputs into (batch results, compare and
/// canary pages), opened once and written relative to the held descriptor:
/// `hull-exec`'s `out_dir`.
#[cfg(unix)]
pub use hull_exec::out_dir;

/// Windows SIDs and ACLs, which the Windows tiers and the Hyper-V backend
/// both use: `hull-exec`'s `winsec`.
#[cfg(windows)]
pub use hull_exec::winsec;

/// Change sets: what a copy-on-write run wrote, reviewed and applied: the
/// `hull-changes` crate.
#[cfg(target_os = "linux")]
pub use hull_changes as changes;

/// The egress proxy and everything of the network a policy allows: the
/// `hull-net` crate.
#[cfg(unix)]
pub use hull_net as net;
