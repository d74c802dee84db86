//! After a run: no set-id file the command made is left for the host.
//!
//! Seccomp refuses set-id mode bits on every tier. On tier 3 that filter is
//! enforced by the guest kernel, which the command may compromise without
//! compromising the host: this sweep is the second layer there, for when
//! hull runs as root (virtiofsd then writes the guest's files as root, and
//! a set-id one runs as root for any local user). The process tiers need
//! none: their filter is the host kernel's, and a command that defeats it
//! already owns the host. After the command's tree is gone, every writable root is walked
//! (never following a symlink, one directory descriptor at a time) and the
//! set-id bits of each entry changed since the run started (its ctime, with
//! a second of slack for the kernel's coarse file clock; the command cannot
//! set a ctime) are cleared.
//!
//! What it does not clear: an entry with more than one hard link. Its other
//! link may be a system file (a command running as root can link
//! `/usr/bin/passwd` into the project, and clearing the bits would break
//! the host's `passwd`); such an entry is reported, and the run fails.
//! Set-id entries older than the run are the project's own and stay.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use rustix::fs::{openat, statat, AtFlags, Dir, FileType, Mode, OFlags, CWD};

/// Deeper trees are reported, not walked.
const MAX_DEPTH: u32 = 512;

const SETID: u32 = libc::S_ISUID | libc::S_ISGID;

/// What a sweep found.
#[derive(Debug, Default)]
pub struct SweepReport {
    /// Entries whose set-id bits were cleared, with the mode they had.
    pub cleared: Vec<(PathBuf, u32)>,
    /// Set-id entries left as they are: hard-linked (the count given).
    pub linked: Vec<(PathBuf, u64)>,
}

#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error("cannot check {path} for set-id files the command left: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}: the directory tree is deeper than {MAX_DEPTH} levels; set-id files below it were not checked")]
    TooDeep { path: PathBuf },
    #[error("the command left set-id files with other hard links, not cleared (another link may be a system file): {paths}; remove them before anyone runs them")]
    Linked { paths: String },
}

/// Whether runs need the sweep: hull runs as root, so what the command
/// writes is root's.
pub fn needed() -> bool {
    // SAFETY: geteuid takes no arguments and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Sweeps every writable root; returns what was cleared, or fails when a
/// root could not be checked or a set-id entry could not be cleared.
pub fn sweep_roots<'a>(
    roots: impl IntoIterator<Item = &'a Path>,
    since: SystemTime,
) -> Result<Vec<(PathBuf, u32)>, SweepError> {
    let mut cleared = Vec::new();
    let mut linked = Vec::new();
    for root in roots {
        let r = sweep(root, since)?;
        cleared.extend(r.cleared);
        linked.extend(r.linked);
    }
    if linked.is_empty() {
        return Ok(cleared);
    }
    Err(SweepError::Linked {
        paths: linked
            .iter()
            .map(|(p, n)| format!("{} ({n} links)", p.display()))
            .collect::<Vec<_>>()
            .join(", "),
    })
}

/// Clears the set-id bits of every entry under `root` (itself included)
/// whose status changed at or after `since`. A missing root is empty.
pub fn sweep(root: &Path, since: SystemTime) -> Result<SweepReport, SweepError> {
    let mut report = SweepReport::default();
    // File times come from the kernel's coarse clock, a tick or more behind
    // the clock `since` was read from: a second of slack.
    let since = since
        .checked_sub(std::time::Duration::from_secs(1))
        .unwrap_or(since)
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| (d.as_secs() as i64, d.subsec_nanos() as i64))
        .unwrap_or((0, 0));
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |e: rustix::io::Errno| SweepError::Io {
            path,
            source: e.into(),
        }
    };
    let dir = match openat(CWD, root, dir_flags(), Mode::empty()) {
        Ok(d) => d,
        Err(rustix::io::Errno::NOENT) => return Ok(report),
        Err(e) => return Err(io_err(root)(e)),
    };
    let st = rustix::fs::fstat(&dir).map_err(io_err(root))?;
    check(&dir, None, root, &st, since, &mut report)?;
    walk(dir, root, 0, since, &mut report)?;
    Ok(report)
}

fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

fn walk(
    dir: OwnedFd,
    path: &Path,
    depth: u32,
    since: (i64, i64),
    report: &mut SweepReport,
) -> Result<(), SweepError> {
    if depth > MAX_DEPTH {
        return Err(SweepError::TooDeep {
            path: path.to_path_buf(),
        });
    }
    let err = |p: &Path, e: rustix::io::Errno| SweepError::Io {
        path: p.to_path_buf(),
        source: e.into(),
    };
    let mut subdirs = Vec::new();
    for entry in Dir::read_from(&dir).map_err(|e| err(path, e))? {
        let entry = entry.map_err(|e| err(path, e))?;
        let name = entry.file_name().to_owned();
        let bytes = name.as_bytes();
        if bytes == b"." || bytes == b".." {
            continue;
        }
        let child = path.join(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(bytes));
        let st = match statat(&dir, &name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            // Gone since the listing (the tree is dead; a race is harmless).
            Err(rustix::io::Errno::NOENT) => continue,
            Err(e) => return Err(err(&child, e)),
        };
        check(&dir, Some(&name), &child, &st, since, report)?;
        if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
            subdirs.push((name, child));
        }
    }
    for (name, child) in subdirs {
        let sub = match openat(&dir, &name, dir_flags(), Mode::empty()) {
            Ok(s) => s,
            // Replaced by a symlink or removed since: nothing to walk.
            Err(rustix::io::Errno::NOENT | rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR) => {
                continue
            }
            Err(e) => return Err(err(&child, e)),
        };
        walk(sub, &child, depth + 1, since, report)?;
    }
    Ok(())
}

/// Clears the set-id bits of one entry (`name` in `dir`, or `dir` itself)
/// when it has them and changed since the run started. `st` is a cheap
/// first look; the decision is made on the inode actually opened.
fn check(
    dir: &OwnedFd,
    name: Option<&std::ffi::CStr>,
    path: &Path,
    st: &rustix::fs::Stat,
    since: (i64, i64),
    report: &mut SweepReport,
) -> Result<(), SweepError> {
    if !candidate(st, since) {
        return Ok(());
    }
    let io = |e: io::Error| SweepError::Io {
        path: path.to_path_buf(),
        source: e,
    };
    // An O_PATH descriptor of exactly this inode (never a symlink's
    // target), then chmod through its /proc magic link: fchmod does not
    // take O_PATH descriptors, and opening a FIFO or device for real could
    // block or have effects.
    let target = match name {
        Some(n) => openat(
            dir,
            n,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io(e.into()))?,
        None => rustix::io::dup(dir).map_err(|e| io(e.into()))?,
    };
    let st = rustix::fs::fstat(&target).map_err(|e| io(e.into()))?;
    if !candidate(&st, since) {
        return Ok(());
    }
    let mode = st.st_mode as u32;
    if FileType::from_raw_mode(st.st_mode) != FileType::Directory && st.st_nlink > 1 {
        report.linked.push((path.to_path_buf(), st.st_nlink as u64));
        return Ok(());
    }
    let link = CString::new(format!(
        "/proc/thread-self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&target.as_fd())
    ))
    .map_err(|e| io(io::Error::other(e)))?;
    let keep = Mode::from_raw_mode((mode & 0o7777 & !SETID) as rustix::fs::RawMode);
    rustix::fs::chmodat(CWD, link.as_c_str(), keep, AtFlags::empty()).map_err(|e| io(e.into()))?;
    report.cleared.push((path.to_path_buf(), mode & 0o7777));
    Ok(())
}

/// A set-id entry (not a symlink) whose status changed since the run began.
fn candidate(st: &rustix::fs::Stat, since: (i64, i64)) -> bool {
    st.st_mode & SETID != 0
        && FileType::from_raw_mode(st.st_mode) != FileType::Symlink
        && (st.st_ctime, st.st_ctime_nsec as i64) >= since
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn clears_new_setid_bits_and_leaves_the_rest() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        let old = root.join("old-setuid");
        std::fs::write(&old, b"x").unwrap();
        std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o4755)).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1500));
        let since = SystemTime::now();
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        let new = root.join("a/b/new");
        std::fs::write(&new, b"x").unwrap();
        std::fs::set_permissions(&new, std::fs::Permissions::from_mode(0o6755)).unwrap();
        let dir = root.join("a/sgid-dir");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o2775)).unwrap();
        let plain = root.join("a/plain");
        std::fs::write(&plain, b"x").unwrap();
        std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o640)).unwrap();
        // A symlink to a set-id file outside: never followed.
        let outside = tempfile::tempdir().unwrap();
        let victim = outside.path().join("victim");
        std::fs::write(&victim, b"x").unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o4755)).unwrap();
        std::os::unix::fs::symlink(&victim, root.join("a/link")).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join("a/dirlink")).unwrap();
        // A hard link: reported, not changed.
        let linked = root.join("a/linked");
        std::fs::write(&linked, b"x").unwrap();
        std::fs::set_permissions(&linked, std::fs::Permissions::from_mode(0o4755)).unwrap();
        std::fs::hard_link(&linked, root.join("a/linked2")).unwrap();

        let r = sweep(root, since).unwrap();
        assert_eq!(mode(&new), 0o755);
        assert_eq!(mode(&dir), 0o775);
        assert_eq!(mode(&plain), 0o640);
        assert_eq!(mode(&old), 0o4755, "older than the run: the project's own");
        assert_eq!(mode(&victim), 0o4755, "outside, behind a symlink");
        assert_eq!(mode(&linked), 0o4755);
        let cleared: Vec<_> = r.cleared.iter().map(|(p, m)| (p.clone(), *m)).collect();
        assert!(cleared.contains(&(new.clone(), 0o6755)), "{cleared:?}");
        assert!(cleared.contains(&(dir.clone(), 0o2775)), "{cleared:?}");
        assert_eq!(cleared.len(), 2, "{cleared:?}");
        assert_eq!(r.linked.len(), 2, "{:?}", r.linked);
        assert!(r.linked.iter().all(|(_, n)| *n == 2));
        // A missing root is empty.
        let r = sweep(&root.join("nope"), since).unwrap();
        assert!(r.cleared.is_empty() && r.linked.is_empty());
    }
}
