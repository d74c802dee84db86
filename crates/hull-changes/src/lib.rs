//! Change sets: what a command wrote in a copy-on-write run, kept apart
//! from the project until someone reviews and applies it.
//!
//! A `--cow` run shows the command its project through an overlay whose
//! lower layer is the project (read-only) and whose upper layer is the
//! change set's `layers/upper/` directory, kept by hull. When the run ends the
//! upper layer is read once ([`scan`]) into a structured list of changes
//! (added, modified, deleted, mode changes, symlinks, binary files by size
//! and hash; fifos, sockets and device nodes refused and reported), saved
//! beside it with the project's state at the start of the run for each
//! changed path ([`Baseline`]), so that [`apply`] can refuse a path the
//! project changed since.
//!
//! The upper layer was written by the untrusted command: nothing in it is
//! followed. It is read one component at a time with `O_NOFOLLOW`; a
//! symlink in it is a symlink to make, never a way in. Applying writes the
//! project the same way, with every parent opened without following links,
//! new files made under a temporary name and renamed into place, and never
//! a path through `.git` or `.hull`.
//!
//! [`copy`] copies a tree the command may still be changing (a session's
//! workspace, for a template) into one of hull's the same way: from held
//! descriptors, no link followed.
//!
//! One change set is a directory `<store>/<ID>/` ([`Store`]): `meta.json`
//! (what ran, where, when, and the baseline of the changed paths),
//! `changes.json` (the scan), `layers/upper/` and `layers/work/` (the
//! overlay's, alone in `layers/`: tier 3 serves that directory to the
//! guest).
//!
//! The floor above `hull-exec`, whose descriptor-relative walks
//! ([`hull_exec::runtime::fsx`]) and settings it uses. What it may not do:
//! know a tier, a VM or a run. The tiers above mount the overlay (the
//! process tiers) or serve `layers/` to the guest (tier 3) and hand the
//! upper layer back to [`scan`]; the commands above review and apply.
//! Linux only (the overlay is Linux's).

#![cfg(target_os = "linux")]

mod apply;
mod at;
mod baseline;
pub mod copy;
mod diff;
mod scan;
mod store;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use apply::{apply, ApplyReport, Skipped};
pub use at::digest as file_digest;
pub use baseline::{Baseline, Stamp};
pub use copy::{copy_tree, Copied, CopyError, CopyLimits};
pub use diff::diff;
pub use scan::scan;
pub use store::{ChangeSet, Counts, Layers, Meta, Store};

/// At most this many changes in one set (a scan past it fails naming it).
pub const MAX_CHANGES: usize = 1_000_000;
/// Directories nest at most this deep in an upper layer or a project.
pub const MAX_DEPTH: usize = 256;
/// A text diff shows files up to this size; larger ones by size and hash.
pub const MAX_DIFF_BYTES: u64 = 1 << 20;
/// Whether a file is binary is judged on its first bytes, as git does.
const BINARY_SNIFF: usize = 8000;

/// What is at a path, on one side of a change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Node {
    File {
        size: u64,
        /// Permission bits (`0o7777` at most; set-id bits are never applied).
        mode: u32,
        sha256: String,
        /// A NUL among its first 8000 bytes: shown by size and hash only.
        binary: bool,
    },
    Dir {
        mode: u32,
    },
    Symlink {
        target: String,
    },
}

impl Node {
    /// `file`, `dir` or `symlink`.
    pub fn kind(&self) -> &'static str {
        match self {
            Node::File { .. } => "file",
            Node::Dir { .. } => "dir",
            Node::Symlink { .. } => "symlink",
        }
    }

    pub fn mode(&self) -> Option<u32> {
        match self {
            Node::File { mode, .. } | Node::Dir { mode } => Some(*mode),
            Node::Symlink { .. } => None,
        }
    }
}

/// Where the overlay keeps its marks (opaque directories, whiteouts made
/// as xattrs): `trusted.overlay.*` when mounted by root, `user.overlay.*`
/// in a user namespace (`userxattr`). Only that namespace is read: under a
/// root mount the command may set `user.*` xattrs itself, and they must
/// not pass for the overlay's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Marks {
    #[default]
    Trusted,
    User,
}

/// What happened at a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// New: nothing was there in the project.
    Added,
    /// Contents or type changed (a file rewritten, a link retargeted, a
    /// file replaced by a directory).
    Modified,
    /// Removed (a directory with everything below it).
    Deleted,
    /// Only the permission bits changed.
    Mode,
    /// Something a change set does not carry (a fifo, a socket, a device
    /// node, a name that is not UTF-8): reported, never applied.
    Refused,
}

impl Op {
    /// One letter, as `hull changes show` prints it.
    pub fn letter(self) -> char {
        match self {
            Op::Added => 'A',
            Op::Modified => 'M',
            Op::Deleted => 'D',
            Op::Mode => 'm',
            Op::Refused => '!',
        }
    }
}

/// One change, at a path relative to the project (`/`-separated).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    pub path: String,
    pub op: Op,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before: Option<Node>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<Node>,
    /// Why a change is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The path's exact bytes in hex, when they are not UTF-8 (`path`
    /// then shows them with U+FFFD; such a change is always refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_hex: Option<String>,
}

/// Whether `path` (relative, `/`-separated) passes through `.git` or
/// `.hull`, which a change set never touches (any case: a project may live
/// on a case-insensitive filesystem).
pub fn is_protected(path: &str) -> bool {
    path.split('/')
        .any(|c| c.eq_ignore_ascii_case(".git") || c.eq_ignore_ascii_case(".hull"))
}

#[derive(Debug, thiserror::Error)]
pub enum ChangesError {
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: more than {limit} {what}; the change set is not kept")]
    TooMany {
        path: PathBuf,
        what: &'static str,
        limit: usize,
    },
    #[error("{path}: directories nest deeper than {MAX_DEPTH}")]
    TooDeep { path: PathBuf },
    #[error("no change set {id} in {store} (`hull changes list` shows them)")]
    NotFound { id: String, store: PathBuf },
    #[error(
        "{id} is not a change set ID (letters and digits, as `hull changes list` prints them)"
    )]
    BadId { id: String },
    #[error("change set {id}: {file} is unreadable: {source}")]
    Corrupt {
        id: String,
        file: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("change set {id}: no change at or below {path}")]
    NoSuchPath { id: String, path: String },
    #[error(
        "change set {id}: the project {path} is no longer the directory the run saw \
         ({why}): nothing was applied"
    )]
    ProjectReplaced {
        id: String,
        path: PathBuf,
        why: String,
    },
    #[error("change set {id} cannot be continued: {why}")]
    Continue { id: String, why: String },
}
