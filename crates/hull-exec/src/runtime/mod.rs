//! The per-instance runtime: run directories, their lock, cleanup, spill, and
//! bounded symlink-safe reads.
//!
//! A hull instance (one `hull` process, or several that join the same id,
//! with everything they launched) owns `<runs_root>/<uuid>/`:
//!
//! ```text
//! <runs_root>/<uuid>/
//! ├── .active   OS file lock: shared while in use, held by hull and its children
//! ├── tmp/      read-write for the command (TMPDIR, TMP, TEMP); removed when idle
//! └── spill/    written by hull only (large outputs); readable by the command; kept 24 h
//! ```
//!
//! - [`Instance`]: create or join a run dir and hold its lock ([`instance`]).
//! - [`gc()`], [`list()`]: clean what no process holds, report what exists ([`gc`]).
//! - [`SpillSink`], [`PassThrough`]: the [`crate::exec::OutputSink`]s ([`spill`]).
//! - [`ReadScope`]: `hull read`, bounded reads with a cursor ([`read`]).
//!
//! What this module protects against: one instance cleaning up another that
//! is still in use (also when the hull process died and only a child holds
//! the inherited lock); a read through hull escaping the project or this
//! instance's spill by `..`, a symlink, or a path into another run dir; a
//! cursor replayed against a changed file or from another instance; unbounded
//! answers. What it does not: a command that releases the inherited lock of
//! its own instance (it can only make its own instance look idle once hull is
//! gone); hard links (a hard link inside the project to a file elsewhere reads
//! like any project file, since the sandbox never lets a command create one
//! to a file it cannot see); another process of the same user that edits the
//! runs root directly (the root must be owned by this user and not writable
//! by group or others, which is checked).

pub mod gc;
pub mod instance;
#[cfg(target_os = "linux")]
pub mod placeholder;
pub mod read;
#[cfg(target_os = "linux")]
pub mod setid;
pub mod spill;

pub mod beneath;
mod cursor;
pub mod fsx;
mod lock;

#[cfg(unix)]
pub use fsx::remove_tree;

#[cfg(test)]
#[cfg(target_os = "linux")]
mod tests;

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use serde::{Serialize, Serializer};
use uuid::Uuid;

pub use gc::{
    gc, gc_if_due, list, GcEntry, GcError, GcOutcome, GcReport, Reclaim, RunInfo, RunState,
};
pub use instance::{FinishOutcome, Instance, InstanceError};
pub use read::{ReadAnswer, ReadError, ReadRequest, ReadScope, READ_MAX_BYTES};
pub use spill::{PassThrough, SpillError, SpillSink, DEFAULT_SPILL_BYTES};

/// Environment variable naming the instance (set for commands; read by `hull read`).
pub const INSTANCE_ENV: &str = "HULL_INSTANCE";
/// Environment variable with the instance's spill dir, set for commands.
pub const SPILL_ENV: &str = "HULL_SPILL";

/// Name of the lock file inside a run dir.
pub const LOCK_FILE: &str = ".active";
/// Name of the command's scratch dir inside a run dir.
pub const TMP_DIR: &str = "tmp";
/// Name of the spill dir inside a run dir.
pub const SPILL_DIR: &str = "spill";
/// Name of the dir of hull's own logs inside a run dir (a tier-3 run's
/// console, QEMU and virtiofsd logs): kept like the spill, never shared
/// with the command.
pub const LOGS_DIR: &str = "logs";

/// Where run dirs live: `$HULL_RUNS_DIR` when set (made absolute against
/// the current directory), else `std::env::temp_dir()/hull-runs`. Does not
/// create it; [`Instance::create`] does, and checks it is private.
pub fn runs_root() -> PathBuf {
    match &crate::settings::get().runs_dir {
        Some(p) => std::path::absolute(p).unwrap_or_else(|_| p.clone()),
        None => std::env::temp_dir().join("hull-runs"),
    }
}

/// The raw lock descriptor type, for launchers that keep descriptors by
/// number ([`Instance::lock_raw_fd`]).
#[cfg(unix)]
pub type LockFd = std::os::fd::RawFd;
/// The raw lock handle type ([`Instance::lock_raw_fd`]).
#[cfg(windows)]
pub type LockFd = std::os::windows::io::RawHandle;

/// An instance id: a random (v4) UUID, written hyphenated and lower case.
/// That spelling is also the run dir's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InstanceId(Uuid);

impl InstanceId {
    /// A fresh random id.
    pub fn new() -> Self {
        InstanceId(Uuid::new_v4())
    }

    /// The id spelled by a run dir's name, if that name is exactly the
    /// canonical spelling of an id (anything else in the runs root is not a
    /// run dir and is left alone).
    pub fn from_dir_name(name: &str) -> Option<Self> {
        let id = Uuid::try_parse(name).ok().map(InstanceId)?;
        (id.to_string() == name).then_some(id)
    }
}

impl Default for InstanceId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for InstanceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0.hyphenated(), f)
    }
}

/// The error for a string that is not an instance id.
#[derive(Debug, thiserror::Error)]
#[error("not a hull instance id (a UUID such as 0b6c1e9a-4f7e-4b1a-9d2e-2f1c3a4b5c6d): {0:?}")]
pub struct BadInstanceId(pub String);

impl FromStr for InstanceId {
    type Err = BadInstanceId;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Uuid::try_parse(s.trim())
            .map(InstanceId)
            .map_err(|_| BadInstanceId(s.to_string()))
    }
}

impl Serialize for InstanceId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Tests that fork, or that assert a lock is free, run one at a time: a
/// child between fork and exec briefly holds a copy of every descriptor of
/// this process, locks included (close-on-exec only acts at exec).
#[cfg(test)]
pub(crate) fn serial() -> std::sync::MutexGuard<'static, ()> {
    static M: std::sync::Mutex<()> = std::sync::Mutex::new(());
    M.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod id_tests {
    use super::*;

    #[test]
    fn id_round_trips_and_dir_names_are_strict() {
        let id = InstanceId::new();
        let s = id.to_string();
        assert_eq!(s.len(), 36);
        assert_eq!(s.parse::<InstanceId>().unwrap(), id);
        assert_eq!(InstanceId::from_dir_name(&s), Some(id));
        // Other spellings parse as input but are not run dir names.
        let upper = s.to_uppercase();
        assert_eq!(upper.parse::<InstanceId>().unwrap(), id);
        assert_eq!(InstanceId::from_dir_name(&upper), None);
        assert_eq!(InstanceId::from_dir_name(&s.replace('-', "")), None);
        assert_eq!(InstanceId::from_dir_name(".new-x"), None);
        assert!("../etc".parse::<InstanceId>().is_err());
    }
}
