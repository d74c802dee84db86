//! Directory-descriptor file operations that never follow a symlink: the
//! only way the change-set code touches an upper layer or a project.

use std::ffi::{CStr, OsString};
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use sha2::{Digest, Sha256};

use super::{Marks, BINARY_SNIFF};

/// Opens the directory `name` in `dir`; a symlink there is `ELOOP`, a
/// non-directory `ENOTDIR`.
pub(super) fn open_dir(dir: BorrowedFd<'_>, name: &str) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Opens a trusted directory by path (symlinks in it are followed: it is
/// the project or the store, named by the user).
pub(super) fn open_root(path: &std::path::Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Opens the directory at `rel` (`/`-separated, may be empty) beneath
/// `root`, one component at a time, following no link.
pub(super) fn open_dir_path(root: BorrowedFd<'_>, rel: &str) -> io::Result<OwnedFd> {
    let mut cur = rustix::io::dup(root)?;
    for c in rel.split('/').filter(|c| !c.is_empty()) {
        if c == "." || c == ".." {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        cur = open_dir(cur.as_fd(), c)?;
    }
    Ok(cur)
}

/// `fstatat` without following a link; `None` when nothing is there.
pub(super) fn stat(dir: BorrowedFd<'_>, name: &str) -> io::Result<Option<rustix::fs::Stat>> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(s) => Ok(Some(s)),
        Err(rustix::io::Errno::NOENT) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

pub(super) fn file_type(s: &rustix::fs::Stat) -> FileType {
    FileType::from_raw_mode(s.st_mode)
}

/// The permission bits of a stat (`0o7777`).
pub(super) fn perm(s: &rustix::fs::Stat) -> u32 {
    s.st_mode & 0o7777
}

/// The names in `dir`, sorted, without `.` and `..`.
pub(super) fn list(dir: BorrowedFd<'_>) -> io::Result<Vec<OsString>> {
    let mut d = rustix::fs::Dir::read_from(dir)?;
    let mut names = Vec::new();
    while let Some(e) = d.read() {
        let e = e?;
        let n = e.file_name().to_bytes();
        if n == b"." || n == b".." {
            continue;
        }
        names.push(OsString::from_vec(n.to_vec()));
    }
    names.sort();
    Ok(names)
}

/// Opens the regular file `name` in `dir` for reading (no link followed;
/// `O_NONBLOCK` so that a fifo put there in a race does not block).
pub(super) fn open_file(dir: BorrowedFd<'_>, name: &str) -> io::Result<std::fs::File> {
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
        Mode::empty(),
    )?;
    let st = rustix::fs::fstat(&fd)?;
    if file_type(&st) != FileType::RegularFile {
        return Err(io::Error::other("not a regular file"));
    }
    Ok(std::fs::File::from(fd))
}

/// The link's target.
pub(super) fn read_link(dir: BorrowedFd<'_>, name: &str) -> io::Result<Vec<u8>> {
    let t: std::ffi::CString = rustix::fs::readlinkat(dir, name, Vec::new())?;
    Ok(t.into_bytes())
}

/// Whether the directory has the overlay's opaque mark in `marks`' namespace.
pub(super) fn is_opaque(dir: BorrowedFd<'_>, marks: Marks) -> bool {
    match marks {
        Marks::Trusted => xattr_is(dir, c"trusted.overlay.opaque", b"y"),
        Marks::User => xattr_is(dir, c"user.overlay.opaque", b"y"),
    }
}

/// Whether a regular file is an overlay whiteout made with an xattr (the
/// layout of nested overlays) rather than a 0/0 character device.
pub(super) fn is_xattr_whiteout(file: &std::fs::File, marks: Marks) -> bool {
    match marks {
        Marks::Trusted => has_xattr(file.as_fd(), c"trusted.overlay.whiteout"),
        Marks::User => has_xattr(file.as_fd(), c"user.overlay.whiteout"),
    }
}

fn xattr_is(fd: BorrowedFd<'_>, name: &CStr, want: &[u8]) -> bool {
    let mut buf = [0u8; 8];
    matches!(rustix::fs::fgetxattr(fd, name, &mut buf), Ok(n) if &buf[..n] == want)
}

fn has_xattr(fd: BorrowedFd<'_>, name: &CStr) -> bool {
    let mut buf = [0u8; 8];
    !matches!(
        rustix::fs::fgetxattr(fd, name, &mut buf),
        Err(rustix::io::Errno::NODATA | rustix::io::Errno::NOTSUP)
    )
}

/// The sha256 (hex), size and binary-ness of an open file, read once.
pub fn digest(mut f: &std::fs::File) -> io::Result<(String, u64, bool)> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut size = 0u64;
    let mut binary = false;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        if size < BINARY_SNIFF as u64 {
            let upto = n.min(BINARY_SNIFF - size as usize);
            binary |= buf[..upto].contains(&0);
        }
        h.update(&buf[..n]);
        size += n as u64;
    }
    Ok((hull_exec::text::hex(&h.finalize()), size, binary))
}
