//! Small filesystem helpers for run dirs: private directories, no-replace
//! rename, removal of trees a command wrote (never following symlinks, also
//! when the command left directories without write permission), and usage
//! sums.

use std::fs;
use std::io;
use std::path::Path;

/// Creates one directory, private to the user (0700 on unix).
pub fn make_private_dir(path: &Path) -> io::Result<()> {
    private_builder().create(path)
}

fn private_builder() -> fs::DirBuilder {
    #[allow(unused_mut)] // only unix sets a mode
    let mut b = fs::DirBuilder::new();
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        b.mode(0o700);
    }
    b
}

/// Creates a directory and its missing parents, each private to the user.
pub fn make_private_dir_all(path: &Path) -> io::Result<()> {
    private_builder().recursive(true).create(path)
}

/// Creates `path` as a private directory unless a directory (not a symlink)
/// is already there.
pub fn ensure_private_dir(path: &Path) -> io::Result<()> {
    match make_private_dir(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            let md = fs::symlink_metadata(path)?;
            if md.is_dir() {
                Ok(())
            } else {
                Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{} exists and is not a directory", path.display()),
                ))
            }
        }
        Err(e) => Err(e),
    }
}

/// Renames `from` to `to`, failing with `AlreadyExists` when `to` exists.
pub fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    #[cfg(any(target_os = "linux", target_os = "android", target_vendor = "apple"))]
    {
        use rustix::fs::{renameat_with, RenameFlags, CWD};
        match renameat_with(CWD, from, CWD, to, RenameFlags::NOREPLACE) {
            Ok(()) => return Ok(()),
            Err(rustix::io::Errno::EXIST) => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{} already exists", to.display()),
                ))
            }
            // The filesystem does not support the flag: fall through.
            Err(rustix::io::Errno::INVAL) | Err(rustix::io::Errno::NOSYS) => {}
            Err(e) => return Err(e.into()),
        }
    }
    if fs::symlink_metadata(to).is_ok() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{} already exists", to.display()),
        ));
    }
    // Windows refuses to rename onto an existing directory; elsewhere this is
    // only reached on filesystems without RENAME_NOREPLACE, where an empty
    // target created in between would be replaced (never a run dir: those
    // always hold `.active`).
    fs::rename(from, to)
}

/// Removes a tree without following symlinks. A missing tree is fine. When
/// removal is refused for lack of permission (a command left read-only
/// directories, as Go's module cache does), gives the user rwx back on every
/// directory in the tree and tries once more.
pub fn remove_tree(path: &Path) -> io::Result<()> {
    match fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        #[cfg(unix)]
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            perms::open_up_tree(path)?;
            match fs::remove_dir_all(path) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                r => r,
            }
        }
        Err(e) => Err(e),
    }
}

/// Gives the user rwx back on every directory in the tree (no link
/// followed), for a tree hull must read or remove: a command's read-only
/// directories, bwrap's masks (mode 0).
pub fn open_up(path: &Path) -> io::Result<()> {
    #[cfg(unix)]
    return perms::open_up_tree(path);
    #[cfg(not(unix))]
    {
        let _ = path;
        Ok(())
    }
}

/// Bytes and regular files under `path` (not following symlinks; symlinks
/// count their own size). A missing path is empty.
pub fn tree_usage(path: &Path) -> io::Result<(u64, u64)> {
    let mut bytes = 0u64;
    let mut files = 0u64;
    let mut stack = vec![path.to_path_buf()];
    while let Some(p) = stack.pop() {
        let md = match fs::symlink_metadata(&p) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        if md.is_dir() {
            match fs::read_dir(&p) {
                Ok(rd) => {
                    for e in rd {
                        stack.push(e?.path());
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        } else {
            bytes = bytes.saturating_add(md.len());
            if md.is_file() {
                files += 1;
            }
        }
    }
    Ok((bytes, files))
}

#[cfg(unix)]
mod perms {
    use std::io;
    use std::os::fd::{AsFd, OwnedFd};
    use std::path::Path;

    use rustix::fs::{fchmod, openat, statat, AtFlags, Dir, FileType, Mode, OFlags, CWD};
    use rustix::io::Errno;

    /// Deeper trees are left for the user (a command can nest directories
    /// far deeper than is worth recursing into).
    const MAX_DEPTH: u32 = 256;

    fn dir_flags() -> OFlags {
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
    }

    pub(super) fn open_up_tree(path: &Path) -> io::Result<()> {
        let fd = openat(CWD, path, dir_flags(), Mode::empty())?;
        open_up(fd, 0)
    }

    fn open_up(fd: OwnedFd, depth: u32) -> io::Result<()> {
        if depth > MAX_DEPTH {
            return Err(io::Error::other(format!(
                "directory tree deeper than {MAX_DEPTH} levels"
            )));
        }
        fchmod(&fd, Mode::RWXU)?;
        let mut subdirs = Vec::new();
        for entry in Dir::read_from(&fd)? {
            let entry = entry?;
            let name = entry.file_name().to_owned();
            let bytes = name.as_bytes();
            if bytes == b"." || bytes == b".." {
                continue;
            }
            let is_dir = match entry.file_type() {
                FileType::Directory => true,
                FileType::Unknown => {
                    FileType::from_raw_mode(statat(&fd, &name, AtFlags::SYMLINK_NOFOLLOW)?.st_mode)
                        == FileType::Directory
                }
                _ => false,
            };
            if is_dir {
                subdirs.push(name);
            }
        }
        for name in subdirs {
            let sub = match openat(&fd, &name, dir_flags(), Mode::empty()) {
                Ok(s) => s,
                Err(Errno::ACCESS) => {
                    chmod_nofollow(fd.as_fd(), &name)?;
                    openat(&fd, &name, dir_flags(), Mode::empty())?
                }
                Err(e) => return Err(e.into()),
            };
            open_up(sub, depth + 1)?;
        }
        Ok(())
    }

    /// Gives the user rwx on a directory we cannot open, without following a
    /// symlink that might have replaced it.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    fn chmod_nofollow(
        parent: std::os::fd::BorrowedFd<'_>,
        name: &std::ffi::CStr,
    ) -> io::Result<()> {
        // O_PATH needs no permission on the directory itself; chmod through
        // the /proc magic link then changes exactly that inode.
        let p = openat(
            parent,
            name,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        // thread-self: after a per-thread credential change /proc/self
        // (the thread group leader) may not be ours to look into.
        let proc_path = format!(
            "/proc/thread-self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&p)
        );
        rustix::fs::chmodat(CWD, proc_path.as_str(), Mode::RWXU, AtFlags::empty())?;
        Ok(())
    }

    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    fn chmod_nofollow(
        parent: std::os::fd::BorrowedFd<'_>,
        name: &std::ffi::CStr,
    ) -> io::Result<()> {
        rustix::fs::chmodat(parent, name, Mode::RWXU, AtFlags::SYMLINK_NOFOLLOW)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remove_tree_does_not_follow_symlinks() {
        let d = tempfile::tempdir().unwrap();
        let outside = d.path().join("outside");
        fs::create_dir(&outside).unwrap();
        fs::write(outside.join("keep"), b"k").unwrap();
        let t = d.path().join("tmp");
        fs::create_dir_all(t.join("a/b")).unwrap();
        fs::write(t.join("a/b/f"), b"x").unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(&outside, t.join("a/link")).unwrap();
        remove_tree(&t).unwrap();
        assert!(!t.exists());
        assert_eq!(fs::read(outside.join("keep")).unwrap(), b"k");
        remove_tree(&t).unwrap(); // missing is fine
    }

    #[test]
    fn rename_noreplace_refuses_existing() {
        let d = tempfile::tempdir().unwrap();
        let a = d.path().join("a");
        let b = d.path().join("b");
        fs::create_dir(&a).unwrap();
        fs::create_dir(&b).unwrap();
        let e = rename_noreplace(&a, &b).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        assert!(a.exists());
        let c = d.path().join("c");
        rename_noreplace(&a, &c).unwrap();
        assert!(c.is_dir() && !a.exists());
    }

    #[test]
    fn usage_counts_files_and_bytes() {
        let d = tempfile::tempdir().unwrap();
        fs::create_dir(d.path().join("s")).unwrap();
        fs::write(d.path().join("s/x"), vec![0u8; 100]).unwrap();
        fs::write(d.path().join("y"), vec![0u8; 23]).unwrap();
        assert_eq!(tree_usage(d.path()).unwrap(), (123, 2));
        assert_eq!(tree_usage(&d.path().join("nope")).unwrap(), (0, 0));
    }
}
