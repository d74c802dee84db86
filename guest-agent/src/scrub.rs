//! An exec's `scrub` ([`hull_protocol::Exec::scrub`]): empties the
//! container's own scratch directories (`/tmp`, `/var/tmp`, `/dev/shm`,
//! the runs' home there) before a kept VM's run starts, so nothing one run
//! left there reaches the next.
//!
//! Runs as the exec's own user ([`scrub_as`]: a thread of the agent whose
//! credentials alone are changed, then ended) while no command runs (the
//! run's turn is held, and the last run's cgroup is empty): every entry a
//! run made is that user's, so it can remove it (opening up a directory of
//! its own it made unreadable first); an entry of another user (container
//! root's) is not a run's, and stays. Walks with descriptors only
//! (`openat` with `O_NOFOLLOW`, `unlinkat`): a link is removed, never
//! followed. Never crosses into another filesystem: a share mounted below
//! `/tmp` (the VM's tmp, a project under `/tmp`) is another device, left
//! as it is, with the directories on the way to it.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{openat, statat, unlinkat, AtFlags, Dir, FileType, Mode, OFlags, CWD};
use rustix::io::Errno;

fn uid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// Deeper trees than this are left (and said).
const MAX_DEPTH: u32 = 512;

fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

/// What was left and why, per top directory.
#[derive(Debug, Default)]
pub struct Scrubbed {
    pub removed: u64,
    /// Entries kept: on another filesystem, or the way to one.
    pub kept: u64,
}

/// Empties `dir` (it stays), on its own filesystem only.
pub fn scrub(dir: &Path) -> io::Result<Scrubbed> {
    let fd = match openat(CWD, dir, dir_flags(), Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(Scrubbed::default()),
        Err(e) => return Err(e.into()),
    };
    let dev = rustix::fs::fstat(&fd)?.st_dev;
    let mut out = Scrubbed::default();
    empty(&fd, dev, 0, &mut out)?;
    Ok(out)
}

/// Removes every entry of `fd` on device `dev`; whether all went.
fn empty(fd: &OwnedFd, dev: u64, depth: u32, out: &mut Scrubbed) -> io::Result<bool> {
    if depth > MAX_DEPTH {
        return Err(io::Error::other(format!(
            "a directory tree deeper than {MAX_DEPTH} levels"
        )));
    }
    let mut names: Vec<CString> = Vec::new();
    for entry in Dir::read_from(fd)? {
        let entry = entry?;
        let name = entry.file_name();
        if name.to_bytes() == b"." || name.to_bytes() == b".." {
            continue;
        }
        names.push(name.to_owned());
    }
    let mut all = true;
    for name in names {
        all &= remove(fd, &name, dev, depth, out)?;
    }
    Ok(all)
}

fn remove(
    parent: &OwnedFd,
    name: &CStr,
    dev: u64,
    depth: u32,
    out: &mut Scrubbed,
) -> io::Result<bool> {
    let st = match statat(parent, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::NOENT) => return Ok(true),
        Err(e) => return Err(e.into()),
    };
    if st.st_dev != dev {
        // A mount point (a share): not ours to touch.
        out.kept += 1;
        return Ok(false);
    }
    if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
        return match unlinkat(parent, name, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => {
                out.removed += 1;
                Ok(true)
            }
            // Another user's, in a sticky or unwritable directory: not a
            // run's.
            Err(Errno::ACCESS) | Err(Errno::PERM) if st.st_uid != uid() => {
                out.kept += 1;
                Ok(false)
            }
            Err(e) => Err(e.into()),
        };
    }
    let mine = st.st_uid == uid();
    if mine && st.st_mode & 0o700 != 0o700 {
        // A directory of its own a run made unreadable or unwritable:
        // opened as a path (never through a link) and changed through it.
        let path = openat(
            parent,
            name,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let fd = std::os::fd::AsRawFd::as_raw_fd(&path);
        rustix::fs::chmod(format!("/proc/self/fd/{fd}").as_str(), Mode::RWXU)?;
    }
    let sub = match openat(parent, name, dir_flags(), Mode::empty()) {
        Ok(sub) => sub,
        Err(Errno::NOENT) => return Ok(true),
        Err(Errno::ACCESS) | Err(Errno::PERM) if !mine => {
            out.kept += 1;
            return Ok(false);
        }
        Err(e) => return Err(e.into()),
    };
    // Still the directory looked at (nothing else runs, but be exact).
    let now = rustix::fs::fstat(&sub)?;
    if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) {
        return Err(io::Error::other(format!(
            "{} changed while it was emptied",
            String::from_utf8_lossy(name.to_bytes())
        )));
    }
    if !empty(&sub, dev, depth + 1, out)? {
        // The way to a mount point: kept.
        out.kept += 1;
        return Ok(false);
    }
    drop(sub);
    match unlinkat(parent, name, AtFlags::REMOVEDIR) {
        Ok(()) | Err(Errno::NOENT) => {
            out.removed += 1;
            Ok(true)
        }
        // A mount point of the same filesystem (a bind), or another
        // user's: kept.
        Err(Errno::BUSY) => {
            out.kept += 1;
            Ok(false)
        }
        Err(Errno::ACCESS) | Err(Errno::PERM) if !mine => {
            out.kept += 1;
            Ok(false)
        }
        Err(e) => Err(e.into()),
    }
}

/// Why a scrub failed.
#[derive(Debug, thiserror::Error)]
pub enum ScrubError {
    #[error("a scrub never runs as root")]
    AsRoot,
    #[error("cannot take the ids {uid}:{gid} to empty the scratch: {source}")]
    Ids {
        uid: u32,
        gid: u32,
        #[source]
        source: io::Error,
    },
    #[error("cannot empty {dir} as {uid}:{gid}: {source}")]
    Dir {
        dir: String,
        uid: u32,
        gid: u32,
        #[source]
        source: io::Error,
    },
    #[error("cannot start the thread that empties the scratch: {0}")]
    Thread(#[source] io::Error),
    #[error("the thread that empties the scratch panicked")]
    Panicked,
}

/// Empties each of `dirs` as `ids` (uid, gid; the gid its only group), in
/// a thread of its own: on Linux credentials belong to a thread, and the
/// raw calls (unlike libc's, which change every thread) change that
/// thread's alone, which also drops its capabilities. So the walk can do
/// nothing the exec's command itself could not, the agent's other threads
/// never run as another user, and the thread ends with the walk. Stops at
/// the first directory that cannot be emptied, naming it.
pub fn scrub_as(ids: (u32, u32), dirs: &[std::path::PathBuf]) -> Result<(), ScrubError> {
    use rustix::process::{Gid, Uid};
    if ids.0 == 0 {
        return Err(ScrubError::AsRoot);
    }
    let dirs = dirs.to_vec();
    let walk = move || -> Result<(), ScrubError> {
        let (uid, gid) = (Uid::from_raw(ids.0), Gid::from_raw(ids.1));
        let became = rustix::thread::set_thread_groups(&[gid])
            .and_then(|()| rustix::thread::set_thread_res_gid(gid, gid, gid))
            .and_then(|()| rustix::thread::set_thread_res_uid(uid, uid, uid));
        became.map_err(|e| ScrubError::Ids {
            uid: ids.0,
            gid: ids.1,
            source: e.into(),
        })?;
        for d in &dirs {
            let s = scrub(d).map_err(|source| ScrubError::Dir {
                dir: String::from_utf8_lossy(d.as_os_str().as_bytes()).into_owned(),
                uid: ids.0,
                gid: ids.1,
                source,
            })?;
            tracing::debug!(dir = %d.display(), removed = s.removed, kept = s.kept, "scrubbed");
        }
        Ok(())
    };
    std::thread::Builder::new()
        .name("scrub".into())
        .spawn(walk)
        .map_err(ScrubError::Thread)?
        .join()
        .map_err(|_| ScrubError::Panicked)?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empties_a_tree_keeps_the_top_and_follows_no_link() {
        let d = tempfile::tempdir().unwrap();
        let top = d.path().join("tmp");
        let outside = d.path().join("outside");
        std::fs::create_dir_all(top.join("a/b/c")).unwrap();
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), "x").unwrap();
        std::fs::write(top.join("a/b/c/f"), "x").unwrap();
        std::fs::write(top.join("g"), "x").unwrap();
        std::os::unix::fs::symlink(&outside, top.join("link")).unwrap();
        std::os::unix::fs::symlink(&outside, top.join("a/link")).unwrap();
        // A directory of its own made unreadable and unwritable.
        std::fs::create_dir(top.join("locked")).unwrap();
        std::fs::write(top.join("locked/f"), "x").unwrap();
        std::fs::set_permissions(
            top.join("locked"),
            std::os::unix::fs::PermissionsExt::from_mode(0o000),
        )
        .unwrap();
        let s = scrub(&top).unwrap();
        assert_eq!(std::fs::read_dir(&top).unwrap().count(), 0);
        assert!(top.is_dir());
        assert!(outside.join("keep").exists(), "a link was followed");
        assert_eq!(s.kept, 0);
        assert!(s.removed >= 9, "{s:?}");
        // A missing directory is empty.
        assert_eq!(scrub(&d.path().join("none")).unwrap().removed, 0);
    }
}
