//! Copying a tree the command can write (a session's workspace) into a
//! directory of hull's own (a template), while the command may still be
//! changing it: every entry is reached from a held descriptor of its
//! parent, one `openat(O_NOFOLLOW)` at a time, and made in the copy the same
//! way, so a directory swapped for a link mid-copy is an entry that fails
//! to open (and is left out, counted), never a way out of the tree. A link
//! is copied as a link, never followed; fifos, sockets and device nodes are
//! left out; no owner is taken (the copy is hull's), set-id bits are
//! cleared; entries, bytes and depth are bounded.

use std::io;
use std::os::fd::{AsFd, BorrowedFd};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

/// How much a copy may hold, and for whom it is made.
#[derive(Debug, Clone, Copy)]
pub struct CopyLimits {
    pub entries: u64,
    pub bytes: u64,
    /// The uid the copy is made for, when hull copies with more rights
    /// than that user has (hull as root, for a caller): an entry that user
    /// could not read (a directory: read and search) by its owner's or
    /// others' bits is left out, so the copy, which is hull's, gives them
    /// nothing they could not read before. None or 0: everything.
    pub reader: Option<u32>,
}

/// Whether `reader` may read an entry of `st` (and search it, for a
/// directory) by its owner's or others' bits (group bits are not
/// counted: the reader's groups are not known here, so a group-only
/// entry is left out).
fn readable(st: &rustix::fs::Stat, reader: Option<u32>, dir: bool) -> bool {
    let Some(uid) = reader.filter(|u| *u != 0) else {
        return true;
    };
    let (own, other) = match dir {
        true => (0o500, 0o005),
        false => (0o400, 0o004),
    };
    (st.st_uid == uid && st.st_mode & own == own) || st.st_mode & other == other
}

/// What a copy held.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Copied {
    pub entries: u64,
    pub bytes: u64,
    /// Entries left out (a fifo, socket or device node, or one that changed
    /// kind while it was copied), by path below the tree, the first 100.
    pub left_out: Vec<String>,
    /// How many were left out in all.
    pub left_out_count: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error("{path}: cannot {what}: {source}")]
    Io {
        path: String,
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("the tree holds more than {0} entries")]
    Entries(u64),
    #[error("the tree holds more than {0} bytes")]
    Bytes(u64),
    #[error("{0}: directories nest deeper than {max}", max = crate::MAX_DEPTH)]
    Depth(String),
}

/// Copies the contents of the directory `src` into the empty directory
/// `dst` (both held), as the module says.
pub fn copy_tree(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    limits: CopyLimits,
) -> Result<Copied, CopyError> {
    let mut copied = Copied::default();
    copy_dir(src, dst, "", 0, limits, &mut copied)?;
    Ok(copied)
}

fn io_err<'a>(
    path: &'a str,
    what: &'static str,
) -> impl FnOnce(rustix::io::Errno) -> CopyError + 'a {
    move |e| CopyError::Io {
        path: if path.is_empty() {
            ".".into()
        } else {
            path.into()
        },
        what,
        source: e.into(),
    }
}

fn copy_dir(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    at: &str,
    depth: usize,
    limits: CopyLimits,
    copied: &mut Copied,
) -> Result<(), CopyError> {
    if depth > crate::MAX_DEPTH {
        return Err(CopyError::Depth(at.to_string()));
    }
    let dir = rustix::fs::Dir::read_from(src).map_err(io_err(at, "read the directory"))?;
    for entry in dir {
        let entry = entry.map_err(io_err(at, "read the directory"))?;
        let name = entry.file_name();
        if matches!(name.to_bytes(), b"." | b"..") {
            continue;
        }
        let path = match at {
            "" => String::from_utf8_lossy(name.to_bytes()).into_owned(),
            _ => format!("{at}/{}", String::from_utf8_lossy(name.to_bytes())),
        };
        copied.entries += 1;
        if copied.entries > limits.entries {
            return Err(CopyError::Entries(limits.entries));
        }
        let left_out = |copied: &mut Copied, path: String| {
            copied.left_out_count += 1;
            if copied.left_out.len() < 100 {
                copied.left_out.push(path);
            }
        };
        let st = match rustix::fs::statat(src, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            // Gone since the directory was read.
            Err(rustix::io::Errno::NOENT) => {
                left_out(copied, path);
                continue;
            }
            Err(e) => return Err(io_err(&path, "inspect")(e)),
        };
        let mode = Mode::from_raw_mode(st.st_mode & 0o1777);
        let kind = FileType::from_raw_mode(st.st_mode);
        if kind != FileType::Symlink && !readable(&st, limits.reader, kind == FileType::Directory) {
            left_out(copied, path);
            continue;
        }
        match kind {
            FileType::Directory => {
                let inner = match rustix::fs::openat(
                    src,
                    name,
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                ) {
                    Ok(fd) => fd,
                    // Replaced by a link or a file since: left out.
                    Err(rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR)
                    | Err(rustix::io::Errno::NOENT) => {
                        left_out(copied, path);
                        continue;
                    }
                    Err(e) => return Err(io_err(&path, "open")(e)),
                };
                rustix::fs::mkdirat(dst, name, Mode::from_raw_mode(0o700))
                    .map_err(io_err(&path, "make the copy of"))?;
                let made = rustix::fs::openat(
                    dst,
                    name,
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(io_err(&path, "open the copy of"))?;
                copy_dir(
                    inner.as_fd(),
                    made.as_fd(),
                    &path,
                    depth + 1,
                    limits,
                    copied,
                )?;
                rustix::fs::fchmod(&made, mode).map_err(io_err(&path, "set the mode of"))?;
                times(&made, &st);
            }
            FileType::RegularFile => {
                let from = match rustix::fs::openat(
                    src,
                    name,
                    OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
                    Mode::empty(),
                ) {
                    Ok(fd) => fd,
                    Err(rustix::io::Errno::LOOP | rustix::io::Errno::NOENT) => {
                        left_out(copied, path);
                        continue;
                    }
                    Err(e) => return Err(io_err(&path, "open")(e)),
                };
                // What was opened is what is copied: a regular file still,
                // which the reader may read.
                let now = rustix::fs::fstat(&from).map_err(io_err(&path, "inspect"))?;
                if FileType::from_raw_mode(now.st_mode) != FileType::RegularFile
                    || !readable(&now, limits.reader, false)
                {
                    left_out(copied, path);
                    continue;
                }
                let to = rustix::fs::openat(
                    dst,
                    name,
                    OFlags::WRONLY
                        | OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o600),
                )
                .map_err(io_err(&path, "make the copy of"))?;
                let left = limits.bytes.saturating_sub(copied.bytes);
                let mut reader = io::Read::take(std::fs::File::from(from), left + 1);
                let mut out = std::fs::File::from(to);
                let n = io::copy(&mut reader, &mut out).map_err(|source| CopyError::Io {
                    path: path.clone(),
                    what: "copy",
                    source,
                })?;
                if n > left {
                    return Err(CopyError::Bytes(limits.bytes));
                }
                copied.bytes += n;
                rustix::fs::fchmod(&out, Mode::from_raw_mode(now.st_mode & 0o777))
                    .map_err(io_err(&path, "set the mode of"))?;
                times(&out, &now);
            }
            FileType::Symlink => {
                let target = match rustix::fs::readlinkat(src, name, Vec::new()) {
                    Ok(t) => t,
                    Err(rustix::io::Errno::INVAL | rustix::io::Errno::NOENT) => {
                        left_out(copied, path);
                        continue;
                    }
                    Err(e) => return Err(io_err(&path, "read the link")(e)),
                };
                rustix::fs::symlinkat(target.as_c_str(), dst, name)
                    .map_err(io_err(&path, "make the copy of"))?;
            }
            _ => left_out(copied, path),
        }
    }
    Ok(())
}

/// The copy keeps the original's modification time (best effort).
fn times(fd: impl AsFd, st: &rustix::fs::Stat) {
    let t = rustix::fs::Timestamps {
        last_access: rustix::fs::Timespec {
            tv_sec: st.st_atime as _,
            tv_nsec: st.st_atime_nsec as _,
        },
        last_modification: rustix::fs::Timespec {
            tv_sec: st.st_mtime as _,
            tv_nsec: st.st_mtime_nsec as _,
        },
    };
    let _ = rustix::fs::futimens(fd.as_fd(), &t);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::OwnedFd;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn open(p: &std::path::Path) -> OwnedFd {
        rustix::fs::open(
            p,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap()
    }

    const ROOMY: CopyLimits = CopyLimits {
        entries: 1000,
        bytes: 1 << 20,
        reader: None,
    };

    #[test]
    fn a_tree_is_copied_links_as_links_and_set_id_cleared() {
        let t = tempfile::tempdir().unwrap();
        let (src, dst) = (t.path().join("src"), t.path().join("dst"));
        std::fs::create_dir_all(src.join("a/b")).unwrap();
        std::fs::create_dir(&dst).unwrap();
        std::fs::write(src.join("a/b/f"), "body").unwrap();
        std::fs::write(src.join("run"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(src.join("run"), std::fs::Permissions::from_mode(0o4755)).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", src.join("out")).unwrap();
        std::os::unix::fs::symlink("a/b", src.join("in")).unwrap();
        rustix::fs::mknodat(
            open(&src),
            "fifo",
            FileType::Fifo,
            Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        let c = copy_tree(open(&src).as_fd(), open(&dst).as_fd(), ROOMY).unwrap();
        assert_eq!(std::fs::read_to_string(dst.join("a/b/f")).unwrap(), "body");
        assert_eq!(
            std::fs::metadata(dst.join("run")).unwrap().mode() & 0o7777,
            0o755
        );
        // The links are links, not what they name.
        assert_eq!(
            std::fs::read_link(dst.join("out")).unwrap(),
            std::path::Path::new("/etc/passwd")
        );
        assert!(std::fs::symlink_metadata(dst.join("in"))
            .unwrap()
            .file_type()
            .is_symlink());
        assert!(!dst.join("fifo").exists());
        assert_eq!(c.left_out, vec!["fifo".to_string()]);
        assert_eq!((c.entries, c.bytes), (7, 14));
    }

    /// While the copy runs, the tree's `d` flips between a directory and a
    /// link to a directory outside it: no copy ever holds what is outside
    /// (a copier that resolved `d/secret` by path would, some of the time).
    #[test]
    fn a_directory_swapped_for_a_link_mid_copy_never_brings_in_the_outside() {
        let t = tempfile::tempdir().unwrap();
        let (src, outside) = (t.path().join("src"), t.path().join("outside"));
        std::fs::create_dir_all(src.join("d")).unwrap();
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("secret"), "outside").unwrap();
        for i in 0..50 {
            std::fs::write(src.join(format!("d/f{i}")), "inside").unwrap();
        }
        std::fs::write(src.join("d/secret"), "inside").unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flipper = {
            let (src, outside, stop) = (src.clone(), outside.clone(), stop.clone());
            std::thread::spawn(move || {
                let (d, kept) = (src.join("d"), src.join("d.kept"));
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::fs::rename(&d, &kept).unwrap();
                    std::os::unix::fs::symlink(&outside, &d).unwrap();
                    std::fs::remove_file(&d).unwrap();
                    std::fs::rename(&kept, &d).unwrap();
                }
            })
        };
        // The control: resolving `d/secret` by path does reach outside.
        let by_path = (0..100_000)
            .any(|_| std::fs::read_to_string(src.join("d/secret")).is_ok_and(|b| b == "outside"));
        assert!(
            by_path,
            "the flip never showed the outside to a path lookup"
        );
        for i in 0..200 {
            let dst = t.path().join(format!("copy{i}"));
            std::fs::create_dir(&dst).unwrap();
            copy_tree(open(&src).as_fd(), open(&dst).as_fd(), ROOMY).unwrap();
            // A link in the copy is the link the tree held then (a copy
            // holds links as links); what matters is what the copy's own
            // directories hold.
            for (dir, name) in [("d", "d/secret"), ("d.kept", "d.kept/secret")] {
                let is_dir = std::fs::symlink_metadata(dst.join(dir)).is_ok_and(|m| m.is_dir());
                if !is_dir {
                    continue;
                }
                if let Ok(m) = std::fs::symlink_metadata(dst.join(name)) {
                    if m.is_file() {
                        let body = std::fs::read_to_string(dst.join(name)).unwrap();
                        assert_eq!(body, "inside", "copy {i}: {name}");
                    }
                }
            }
            std::fs::remove_dir_all(&dst).unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        flipper.join().unwrap();
    }

    /// Copied as root for a user: what that user could not read (a file
    /// of root's 0600, a file of another user's 0640, a directory they
    /// cannot search) is left out; their own and world-readable ones are
    /// copied. As the copy is hull's, it would otherwise hand them over.
    #[test]
    fn what_the_reader_could_not_read_is_left_out() {
        assert!(
            rustix::process::geteuid().is_root(),
            "needs root, to make files of other owners (CI runs as root)"
        );
        let t = tempfile::tempdir().unwrap();
        let (src, dst) = (t.path().join("src"), t.path().join("dst"));
        std::fs::create_dir_all(src.join("closed")).unwrap();
        std::fs::create_dir(&dst).unwrap();
        let file = |name: &str, uid: u32, mode: u32| {
            std::fs::write(src.join(name), name).unwrap();
            std::os::unix::fs::chown(src.join(name), Some(uid), Some(uid)).unwrap();
            std::fs::set_permissions(src.join(name), std::fs::Permissions::from_mode(mode))
                .unwrap();
        };
        file("mine", 1500, 0o600);
        file("roots", 0, 0o600);
        file("group-only", 0, 0o640);
        file("world", 0, 0o644);
        file("closed/inside", 1500, 0o644);
        std::os::unix::fs::chown(src.join("closed"), Some(0), Some(0)).unwrap();
        std::fs::set_permissions(src.join("closed"), std::fs::Permissions::from_mode(0o700))
            .unwrap();
        let c = copy_tree(
            open(&src).as_fd(),
            open(&dst).as_fd(),
            CopyLimits {
                reader: Some(1500),
                ..ROOMY
            },
        )
        .unwrap();
        let mut copied: Vec<_> = std::fs::read_dir(&dst)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        copied.sort();
        assert_eq!(copied, ["mine", "world"]);
        let mut left = c.left_out.clone();
        left.sort();
        assert_eq!(left, ["closed", "group-only", "roots"]);
        // As root (or for no one in particular), everything.
        let all = t.path().join("all");
        std::fs::create_dir(&all).unwrap();
        let c = copy_tree(open(&src).as_fd(), open(&all).as_fd(), ROOMY).unwrap();
        assert!(c.left_out.is_empty(), "{c:?}");
    }

    #[test]
    fn limits_end_the_copy_by_name() {
        let t = tempfile::tempdir().unwrap();
        let (src, dst) = (t.path().join("src"), t.path().join("dst"));
        std::fs::create_dir(&src).unwrap();
        std::fs::create_dir(&dst).unwrap();
        for i in 0..5 {
            std::fs::write(src.join(format!("f{i}")), "0123456789").unwrap();
        }
        let e = copy_tree(
            open(&src).as_fd(),
            open(&dst).as_fd(),
            CopyLimits {
                entries: 3,
                bytes: 1 << 20,
                reader: None,
            },
        )
        .unwrap_err();
        assert!(matches!(e, CopyError::Entries(3)), "{e}");
        let dst2 = t.path().join("dst2");
        std::fs::create_dir(&dst2).unwrap();
        let e = copy_tree(
            open(&src).as_fd(),
            open(&dst2).as_fd(),
            CopyLimits {
                entries: 100,
                bytes: 25,
                reader: None,
            },
        )
        .unwrap_err();
        assert!(matches!(e, CopyError::Bytes(25)), "{e}");
    }
}
