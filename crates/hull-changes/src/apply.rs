//! Applying a change set to its project.
//!
//! Every change is checked before anything is written: a path the project
//! changed since the run started (its stamp differs from the baseline's;
//! for a directory deleted or replaced, anything below it) is a conflict,
//! and so is a path whose parent is no longer a directory (a symlink
//! planted since). With no paths named, one conflict applies nothing; with
//! paths named, the others are applied and the conflicts reported.
//!
//! Writing follows no link: each parent is opened one component at a time
//! with `O_NOFOLLOW`, files and symlinks are made under a temporary name
//! beside their place and renamed over it (a link at the place is
//! replaced, never written through), a file's bytes are checked against
//! the digest the scan recorded while they are copied, set-id bits are
//! never applied, and nothing below `.git` or `.hull` is touched. When hull
//! runs as root, what it makes is given to the project's owner.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::baseline::Stamp;
use super::store::ChangeSet;
use super::{at, is_protected, Change, ChangesError, Node, Op, MAX_DEPTH};

/// What an apply did.
#[derive(Debug, Default, Serialize)]
pub struct ApplyReport {
    /// The paths written, in order.
    pub applied: Vec<String>,
    /// Paths the project changed since the run started: left alone.
    pub conflicts: Vec<Skipped>,
    /// Changes a change set never applies (fifos and the like, `.git`,
    /// `.hull`).
    pub refused: Vec<Skipped>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Skipped {
    pub path: String,
    pub why: String,
}

/// Applies `set` to its project: all of it, or the changes at or below the
/// paths in `only`.
pub fn apply(set: &ChangeSet, only: &[String]) -> Result<ApplyReport, ChangesError> {
    let project = set.meta.project.clone();
    let chosen = select(set, only)?;
    let io = |what: &'static str, p: &Path| {
        let path = p.to_path_buf();
        move |source| ChangesError::Io { what, path, source }
    };
    let root = at::open_root(&project).map_err(io("cannot open the project", &project))?;
    // The directory the run saw, or nothing is applied: a project replaced
    // since (a link to elsewhere put in its place) is refused by name.
    let replaced = |why: String| ChangesError::ProjectReplaced {
        id: set.meta.id.clone(),
        path: project.clone(),
        why,
    };
    let st =
        rustix::fs::fstat(&root).map_err(|e| io("cannot stat the project", &project)(e.into()))?;
    match set.meta.project_id {
        Some(id) if id == (st.st_dev, st.st_ino) => {}
        Some((dev, ino)) => {
            return Err(replaced(format!(
                "device {dev} inode {ino} then, device {} inode {} now",
                st.st_dev, st.st_ino
            )))
        }
        None => {
            return Err(replaced(
                "the change set was made by an older hull and records no identity to check; \
                 discard it and run again"
                    .into(),
            ))
        }
    }
    let upper_dir = set.upper();
    let upper = at::open_root(&upper_dir).map_err(io("cannot open", &upper_dir))?;
    let mut report = ApplyReport::default();

    // Check everything first.
    let mut todo = Vec::new();
    for c in chosen {
        if c.op == Op::Refused {
            report.refused.push(Skipped {
                path: c.path.clone(),
                why: c.reason.clone().unwrap_or_else(|| "refused".into()),
            });
        } else if is_protected(&c.path) {
            report.refused.push(Skipped {
                path: c.path.clone(),
                why: "inside .git or .hull, which a change set never touches".into(),
            });
        } else if let Some(why) = conflict(root.as_fd(), set, c) {
            report.conflicts.push(Skipped {
                path: c.path.clone(),
                why,
            });
        } else {
            todo.push(c);
        }
    }
    if !report.conflicts.is_empty() && only.is_empty() {
        return Ok(report);
    }
    let owner = owner_for_new_entries(root.as_fd()).map_err(io("cannot stat", &project))?;
    for c in todo {
        write(root.as_fd(), upper.as_fd(), c, owner).map_err(|source| ChangesError::Io {
            what: "cannot apply",
            path: project.join(&c.path),
            source,
        })?;
        report.applied.push(c.path.clone());
    }
    // On disk before hull says so: one syncfs for the project's filesystem
    // rather than an fsync per file.
    if !report.applied.is_empty() {
        rustix::fs::syncfs(&root).map_err(|e| ChangesError::Io {
            what: "cannot sync",
            path: project.clone(),
            source: e.into(),
        })?;
    }
    Ok(report)
}

/// The changes at or below each path of `only` (all when empty), with the
/// new directories above them (their parents must exist).
fn select<'a>(set: &'a ChangeSet, only: &[String]) -> Result<Vec<&'a Change>, ChangesError> {
    let chosen = set.select(only)?;
    if only.is_empty() {
        return Ok(chosen);
    }
    let paths: Vec<&str> = chosen.iter().map(|c| c.path.as_str()).collect();
    Ok(set
        .changes
        .iter()
        .filter(|c| {
            let makes_dir = matches!(c.after, Some(Node::Dir { .. })) && c.op != Op::Mode;
            paths.contains(&c.path.as_str())
                || (makes_dir && paths.iter().any(|p| p.starts_with(&format!("{}/", c.path))))
        })
        .collect())
}

/// Why `c` conflicts with what the project holds now, if it does.
fn conflict(root: BorrowedFd<'_>, set: &ChangeSet, c: &Change) -> Option<String> {
    if set.meta.baseline.changed_during(&c.path) {
        return Some("changed in the project since the run started".into());
    }
    let (parent_rel, name) = split(&c.path);
    let base = set.meta.baseline.get(&c.path);
    let parent = match at::open_dir_path(root, parent_rel) {
        Ok(p) => p,
        // A parent the run made (a new directory) is not there yet.
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) && base.is_none() => return None,
        Err(e) => {
            return Some(format!(
                "its parent directory is not what it was ({e}): the project changed since the run started"
            ))
        }
    };
    let now = match at::stat(parent.as_fd(), name) {
        Ok(s) => s.map(|s| Stamp::of_stat(&s)),
        Err(e) => return Some(format!("cannot stat it in the project: {e}")),
    };
    if !same(base, now.as_ref()) {
        return Some(match (base, now) {
            (None, Some(_)) => "the project has it now, made since the run started".into(),
            (Some(_), None) => "removed from the project since the run started".into(),
            _ => "changed in the project since the run started".into(),
        });
    }
    // A directory deleted or replaced: nothing below it may have changed.
    if matches!(c.before, Some(Node::Dir { .. })) && c.op != Op::Mode {
        let mut found = BTreeMap::new();
        let dir = match at::open_dir(parent.as_fd(), name) {
            Ok(d) => d,
            Err(e) => return Some(format!("cannot open it in the project: {e}")),
        };
        if let Err(e) = stamps_below(dir.as_fd(), &c.path, 0, &mut found) {
            return Some(format!("cannot read it in the project: {e}"));
        }
        let was: BTreeMap<&String, &Stamp> = set.meta.baseline.below(&c.path).collect();
        for (p, s) in &found {
            if !same(was.get(p).copied(), Some(s)) {
                return Some(format!(
                    "{p} below it changed in the project since the run started"
                ));
            }
        }
        if let Some(p) = was.keys().find(|p| !found.contains_key(**p)) {
            return Some(format!(
                "{p} below it was removed from the project since the run started"
            ));
        }
    }
    None
}

/// Two stamps of one path are the same state. A directory is compared by
/// type, mode and inode only: its times move with what is in it, each of
/// which is checked on its own.
fn same(a: Option<&Stamp>, b: Option<&Stamp>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => {
            let dir = FileType::from_raw_mode(a.mode) == FileType::Directory;
            if dir {
                a.mode == b.mode && a.ino == b.ino
            } else {
                a == b
            }
        }
        _ => false,
    }
}

pub(super) fn stamps_below(
    dir: BorrowedFd<'_>,
    rel: &str,
    depth: usize,
    out: &mut BTreeMap<String, Stamp>,
) -> std::io::Result<()> {
    if depth > MAX_DEPTH {
        return Err(std::io::Error::other("nested too deep"));
    }
    for name in at::list(dir)? {
        let Some(name) = name.to_str() else { continue };
        let path = format!("{rel}/{name}");
        if is_protected(&path) {
            continue;
        }
        let Some(st) = at::stat(dir, name)? else {
            continue;
        };
        out.insert(path.clone(), Stamp::of_stat(&st));
        if at::file_type(&st) == FileType::Directory {
            let sub = at::open_dir(dir, name)?;
            stamps_below(sub.as_fd(), &path, depth + 1, out)?;
        }
    }
    Ok(())
}

/// `(parent, name)` of a relative path.
fn split(path: &str) -> (&str, &str) {
    match path.rsplit_once('/') {
        Some((p, n)) => (p, n),
        None => ("", path),
    }
}

/// When hull runs as root, the owner of the project's top directory: what
/// an apply makes is theirs, as if they had written it.
fn owner_for_new_entries(root: BorrowedFd<'_>) -> std::io::Result<Option<(u32, u32)>> {
    if !rustix::process::geteuid().is_root() {
        return Ok(None);
    }
    let st = rustix::fs::fstat(root)?;
    Ok(Some((st.st_uid, st.st_gid)))
}

fn chown_at(dir: BorrowedFd<'_>, name: &str, owner: Option<(u32, u32)>) -> std::io::Result<()> {
    if let Some((u, g)) = owner {
        let (u, g) = (rustix::fs::Uid::from_raw(u), rustix::fs::Gid::from_raw(g));
        rustix::fs::chownat(dir, name, Some(u), Some(g), AtFlags::SYMLINK_NOFOLLOW)?;
    }
    Ok(())
}

/// A name beside `name` for making its replacement.
fn temp_name(name: &str) -> String {
    let n: String = name.chars().take(100).collect();
    format!(".{n}.hull-apply-{}", std::process::id())
}

/// Removes `name` in `dir` (a directory with everything below it), following
/// no link.
fn remove_at(dir: BorrowedFd<'_>, name: &str, depth: usize) -> std::io::Result<()> {
    let Some(st) = at::stat(dir, name)? else {
        return Ok(());
    };
    if at::file_type(&st) != FileType::Directory {
        return Ok(rustix::fs::unlinkat(dir, name, AtFlags::empty())?);
    }
    if depth > MAX_DEPTH {
        return Err(std::io::Error::other("nested too deep"));
    }
    let sub = at::open_dir(dir, name)?;
    for n in at::list(sub.as_fd())? {
        let n = n
            .to_str()
            .ok_or_else(|| std::io::Error::other("a name below it is not UTF-8"))?
            .to_string();
        remove_at(sub.as_fd(), &n, depth + 1)?;
    }
    Ok(rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)?)
}

fn write(
    root: BorrowedFd<'_>,
    upper: BorrowedFd<'_>,
    c: &Change,
    owner: Option<(u32, u32)>,
) -> std::io::Result<()> {
    let (parent_rel, name) = split(&c.path);
    let parent = at::open_dir_path(root, parent_rel)?;
    let parent = parent.as_fd();
    let existing = at::stat(parent, name)?.map(|s| at::file_type(&s));
    match (&c.op, &c.after) {
        (Op::Deleted, _) => remove_at(parent, name, 0),
        (Op::Mode, Some(after)) => {
            let mode = after.mode().unwrap_or(0o644);
            let fd: OwnedFd = match after {
                Node::Dir { .. } => at::open_dir(parent, name)?,
                _ => OwnedFd::from(at::open_file(parent, name)?),
            };
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(safe_mode(after, mode)))?;
            Ok(())
        }
        (_, Some(after @ Node::Dir { mode })) => {
            if existing.is_some_and(|t| t != FileType::Directory) {
                rustix::fs::unlinkat(parent, name, AtFlags::empty())?;
            }
            if existing != Some(FileType::Directory) {
                rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(0o700))?;
                chown_at(parent, name, owner)?;
            }
            let d = at::open_dir(parent, name)?;
            rustix::fs::fchmod(&d, Mode::from_raw_mode(safe_mode(after, *mode)))?;
            Ok(())
        }
        (_, Some(after @ Node::File { mode, sha256, .. })) => {
            let tmp = temp_name(name);
            let _ = rustix::fs::unlinkat(parent, tmp.as_str(), AtFlags::empty());
            let fd = rustix::fs::openat(
                parent,
                tmp.as_str(),
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            )?;
            replace_with(parent, &tmp, name, existing, || {
                let mut out = std::fs::File::from(fd);
                let up_parent = at::open_dir_path(upper, parent_rel)?;
                let mut src = at::open_file(up_parent.as_fd(), name)?;
                let mut h = Sha256::new();
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let n = src.read(&mut buf)?;
                    if n == 0 {
                        break;
                    }
                    h.update(&buf[..n]);
                    out.write_all(&buf[..n])?;
                }
                if hull_exec::text::hex(&h.finalize()) != *sha256 {
                    return Err(std::io::Error::other(
                        "its bytes in the change set differ from what the scan recorded",
                    ));
                }
                rustix::fs::fchmod(&out, Mode::from_raw_mode(safe_mode(after, *mode)))?;
                if let Some((u, g)) = owner {
                    let (u, g) = (rustix::fs::Uid::from_raw(u), rustix::fs::Gid::from_raw(g));
                    rustix::fs::fchown(&out, Some(u), Some(g))?;
                }
                Ok(())
            })
        }
        (_, Some(Node::Symlink { target })) => {
            let tmp = temp_name(name);
            let _ = rustix::fs::unlinkat(parent, tmp.as_str(), AtFlags::empty());
            rustix::fs::symlinkat(target.as_str(), parent, tmp.as_str())?;
            replace_with(parent, &tmp, name, existing, || {
                chown_at(parent, &tmp, owner)
            })
        }
        (_, None) => Err(std::io::Error::other("a change with nothing to write")),
    }
}

/// Finishes the entry made as `tmp` beside `name` (`finish`), then puts it
/// in `name`'s place (a directory there is removed first; a link there is
/// replaced, not followed); on any failure `tmp` is removed.
fn replace_with(
    parent: BorrowedFd<'_>,
    tmp: &str,
    name: &str,
    existing: Option<FileType>,
    finish: impl FnOnce() -> std::io::Result<()>,
) -> std::io::Result<()> {
    let done = (|| {
        finish()?;
        if existing == Some(FileType::Directory) {
            remove_at(parent, name, 0)?;
        }
        Ok(rustix::fs::renameat(parent, tmp, parent, name)?)
    })();
    if done.is_err() {
        let _ = rustix::fs::unlinkat(parent, tmp, AtFlags::empty());
    }
    done
}

/// The permission bits applied: never set-uid or set-gid; the sticky bit
/// on directories only.
fn safe_mode(node: &Node, mode: u32) -> u32 {
    match node {
        Node::Dir { .. } => mode & 0o1777,
        _ => mode & 0o777,
    }
}
