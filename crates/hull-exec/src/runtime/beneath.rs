//! Opening a path beneath a directory without leaving it.
//!
//! Linux: `openat2` with `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS` (and
//! `RESOLVE_NO_SYMLINKS` when symlinks are not allowed at all): the kernel
//! refuses any resolution that leaves the root, through `..`, an absolute
//! symlink or a relative one climbing out. Where `openat2` is missing
//! (ENOSYS), and on other unix systems, the same is done in user space: one
//! component at a time with `O_NOFOLLOW`, symlink targets read and spliced
//! in, `..` never popping above the root. Windows: every component is
//! checked with no reparse point allowed, and the file is opened without
//! following one; that walk is path based, so a rename race between check
//! and open is not excluded there.

use std::fs::File;
use std::io;
use std::path::Path;

/// How often [`openat2`] resolves again after the kernel could not vouch
/// for a `..` step.
#[cfg(any(target_os = "linux", target_os = "android"))]
pub const SETTLE_TRIES: usize = 64;

/// `openat2(2)`, resolved again when the kernel answers EAGAIN: with
/// `RESOLVE_BENEATH` or `RESOLVE_IN_ROOT`, a `..` step is refused that way
/// whenever a rename or mount ran anywhere on the system during the walk
/// (the kernel cannot then tell that `..` stayed inside), and the man page
/// asks the caller to retry. On a busy machine that is routine, not an
/// attack; after [`SETTLE_TRIES`] walks in a row the EAGAIN stands. Every
/// scoped `openat2` of hull's goes through here, but the raw one a forked
/// child makes (`tier::mounts`), which retries the same way.
#[cfg(any(target_os = "linux", target_os = "android"))]
pub fn openat2<Fd: std::os::fd::AsFd, P: rustix::path::Arg + Copy>(
    dir: Fd,
    path: P,
    flags: rustix::fs::OFlags,
    mode: rustix::fs::Mode,
    resolve: rustix::fs::ResolveFlags,
) -> rustix::io::Result<std::os::fd::OwnedFd> {
    let mut tries = 1;
    loop {
        match rustix::fs::openat2(&dir, path, flags, mode, resolve) {
            Err(rustix::io::Errno::AGAIN) if tries < SETTLE_TRIES => tries += 1,
            done => return done,
        }
    }
}

/// Whether symlinks beneath the root may be followed (always staying beneath).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Symlinks {
    /// Followed while they stay beneath the root.
    Follow,
    /// Any symlink is refused.
    Refuse,
}

#[derive(Debug, thiserror::Error)]
pub enum BeneathError {
    #[error("leaves the allowed directory (through `..` or a symlink)")]
    Escape,
    #[error("passes through a symlink, which is not allowed here")]
    Symlink,
    #[error("no such file")]
    NotFound,
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// An opened root directory.
#[derive(Debug)]
pub struct Root {
    #[cfg(unix)]
    fd: std::os::fd::OwnedFd,
    #[cfg(windows)]
    path: std::path::PathBuf,
}

impl Root {
    /// Opens a trusted directory (symlinks in its own path are followed).
    pub fn open(path: &Path) -> io::Result<Root> {
        imp::open_root(path)
    }

    /// Opens `rel` beneath this root: a directory when `dir`, else any
    /// non-directory (the caller checks it is a regular file; FIFOs do not
    /// block the open).
    pub fn open_beneath(
        &self,
        rel: &Path,
        dir: bool,
        symlinks: Symlinks,
    ) -> Result<File, BeneathError> {
        imp::open_beneath(self, rel, dir, symlinks)
    }

    /// A root at a directory opened beneath this one.
    pub fn sub(&self, rel: &Path, symlinks: Symlinks) -> Result<Root, BeneathError> {
        let f = self.open_beneath(rel, true, symlinks)?;
        #[cfg(unix)]
        {
            Ok(Root {
                fd: std::os::fd::OwnedFd::from(f),
            })
        }
        #[cfg(windows)]
        {
            drop(f);
            Ok(Root {
                path: self.path.join(rel),
            })
        }
    }
}

#[cfg(unix)]
mod imp {
    use std::collections::VecDeque;
    use std::ffi::{OsStr, OsString};
    use std::fs::File;
    use std::io;
    use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    use std::path::{Component, Path};

    use rustix::fs::{openat, readlinkat, statat, AtFlags, FileType, Mode, OFlags, CWD};
    use rustix::io::Errno;

    use super::{BeneathError, Root, Symlinks};

    /// Symlinks followed in one resolution, as Linux allows.
    const MAX_LINKS: u32 = 40;

    pub(super) fn open_root(path: &Path) -> io::Result<Root> {
        let fd = openat(
            CWD,
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Root { fd })
    }

    fn final_flags(dir: bool) -> OFlags {
        let f = OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK;
        if dir {
            f | OFlags::DIRECTORY
        } else {
            f
        }
    }

    pub(super) fn open_beneath(
        root: &Root,
        rel: &Path,
        dir: bool,
        symlinks: Symlinks,
    ) -> Result<File, BeneathError> {
        if rel.is_absolute() {
            return Err(BeneathError::Escape);
        }
        #[cfg(any(target_os = "linux", target_os = "android"))]
        {
            use rustix::fs::ResolveFlags;
            let mut how = ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS;
            if symlinks == Symlinks::Refuse {
                how |= ResolveFlags::NO_SYMLINKS;
            }
            match super::openat2(&root.fd, rel, final_flags(dir), Mode::empty(), how) {
                Ok(fd) => return Ok(File::from(fd)),
                Err(Errno::NOSYS) => {} // old kernel: walk in user space
                Err(Errno::XDEV) => return Err(BeneathError::Escape),
                Err(Errno::LOOP) if symlinks == Symlinks::Refuse => {
                    return Err(BeneathError::Symlink)
                }
                Err(Errno::NOENT) => return Err(BeneathError::NotFound),
                Err(e) => return Err(BeneathError::Io(e.into())),
            }
        }
        walk(root.fd.as_fd(), rel, dir, symlinks).map(File::from)
    }

    /// The user-space resolution: exactly one directory descriptor per level
    /// beneath the root, `O_NOFOLLOW` on every open, symlinks resolved by us.
    pub fn walk(
        root: BorrowedFd<'_>,
        rel: &Path,
        dir: bool,
        symlinks: Symlinks,
    ) -> Result<OwnedFd, BeneathError> {
        let mut queue: VecDeque<OsString> = VecDeque::new();
        push_front(&mut queue, rel)?;
        let mut stack: Vec<OwnedFd> = Vec::new();
        let mut links = 0u32;
        while let Some(name) = queue.pop_front() {
            if name == ".." {
                if stack.pop().is_none() {
                    return Err(BeneathError::Escape);
                }
                continue;
            }
            let cur = stack.last().map(|f| f.as_fd()).unwrap_or(root);
            let st = match statat(cur, &name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                Err(Errno::NOENT) => return Err(BeneathError::NotFound),
                Err(e) => return Err(BeneathError::Io(e.into())),
            };
            let ft = FileType::from_raw_mode(st.st_mode);
            if ft == FileType::Symlink {
                if symlinks == Symlinks::Refuse {
                    return Err(BeneathError::Symlink);
                }
                links += 1;
                if links > MAX_LINKS {
                    return Err(BeneathError::Io(Errno::LOOP.into()));
                }
                let target = readlinkat(cur, &name, Vec::new()).map_err(io::Error::from)?;
                let target = Path::new(OsStr::from_bytes(target.as_bytes()));
                if target.has_root() {
                    return Err(BeneathError::Escape);
                }
                push_front(&mut queue, target)?;
                continue;
            }
            let last = queue.is_empty();
            let flags = if last {
                final_flags(dir) | OFlags::NOFOLLOW
            } else {
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
            };
            // NOFOLLOW: a symlink swapped in since the stat fails here.
            let fd = match openat(cur, &name, flags, Mode::empty()) {
                Ok(fd) => fd,
                Err(Errno::NOENT) => return Err(BeneathError::NotFound),
                Err(Errno::LOOP) => return Err(BeneathError::Symlink),
                Err(e) => return Err(BeneathError::Io(e.into())),
            };
            if last {
                return Ok(fd);
            }
            stack.push(fd);
        }
        // The path named the root itself or ended in `..`.
        if dir {
            let cur = stack.last().map(|f| f.as_fd()).unwrap_or(root);
            return Ok(rustix::io::dup(cur).map_err(io::Error::from)?);
        }
        Err(BeneathError::Io(Errno::ISDIR.into()))
    }

    fn push_front(queue: &mut VecDeque<OsString>, p: &Path) -> Result<(), BeneathError> {
        let mut parts = Vec::new();
        for c in p.components() {
            match c {
                Component::Normal(n) => parts.push(n.to_os_string()),
                Component::ParentDir => parts.push(OsString::from("..")),
                Component::CurDir => {}
                Component::RootDir | Component::Prefix(_) => return Err(BeneathError::Escape),
            }
        }
        for part in parts.into_iter().rev() {
            queue.push_front(part);
        }
        Ok(())
    }
}

#[cfg(windows)]
mod imp {
    use std::fs::{File, OpenOptions};
    use std::io;
    use std::os::windows::fs::{MetadataExt, OpenOptionsExt};
    use std::path::{Component, Path};

    use windows_sys::Win32::Storage::FileSystem::{
        FILE_ATTRIBUTE_REPARSE_POINT, FILE_FLAG_BACKUP_SEMANTICS, FILE_FLAG_OPEN_REPARSE_POINT,
    };

    use super::{BeneathError, Root, Symlinks};

    pub(super) fn open_root(path: &Path) -> io::Result<Root> {
        let md = std::fs::metadata(path)?;
        if !md.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                "not a directory",
            ));
        }
        Ok(Root {
            path: path.to_path_buf(),
        })
    }

    fn is_reparse(md: &std::fs::Metadata) -> bool {
        md.file_attributes() & FILE_ATTRIBUTE_REPARSE_POINT != 0
    }

    pub(super) fn open_beneath(
        root: &Root,
        rel: &Path,
        dir: bool,
        symlinks: Symlinks,
    ) -> Result<File, BeneathError> {
        // No symlink or junction is followed on Windows, whatever `symlinks`
        // says: the path-based walk cannot keep them beneath the root.
        let _ = symlinks;
        let mut p = root.path.clone();
        for c in rel.components() {
            match c {
                Component::Normal(n) => p.push(n),
                Component::CurDir => continue,
                _ => return Err(BeneathError::Escape),
            }
            let md = match std::fs::symlink_metadata(&p) {
                Ok(m) => m,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    return Err(BeneathError::NotFound)
                }
                Err(e) => return Err(e.into()),
            };
            if is_reparse(&md) {
                return Err(BeneathError::Symlink);
            }
        }
        let mut flags = FILE_FLAG_OPEN_REPARSE_POINT;
        if dir {
            flags |= FILE_FLAG_BACKUP_SEMANTICS;
        }
        let f = OpenOptions::new().read(true).custom_flags(flags).open(&p)?;
        if is_reparse(&f.metadata()?) {
            return Err(BeneathError::Symlink);
        }
        Ok(f)
    }
}

#[cfg(test)]
#[cfg(unix)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::AsFd;
    use std::os::unix::fs::symlink;

    struct Fixture {
        _d: tempfile::TempDir,
        root: std::path::PathBuf,
    }

    fn fixture() -> Fixture {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("root");
        std::fs::create_dir_all(root.join("sub/deeper")).unwrap();
        std::fs::write(root.join("sub/file"), b"inside").unwrap();
        std::fs::write(d.path().join("secret"), b"outside").unwrap();
        symlink("sub/file", root.join("rel_ok")).unwrap();
        symlink("../file", root.join("sub/deeper/up_ok")).unwrap();
        symlink("../secret", root.join("rel_out")).unwrap();
        symlink(d.path().join("secret"), root.join("abs_out")).unwrap();
        symlink("sub/../../secret", root.join("sneaky")).unwrap();
        symlink("loop2", root.join("loop1")).unwrap();
        symlink("loop1", root.join("loop2")).unwrap();
        Fixture { _d: d, root }
    }

    fn read(f: File) -> String {
        let mut s = String::new();
        let mut f = f;
        f.read_to_string(&mut s).unwrap();
        s
    }

    /// Both resolvers (openat2 and the user-space walk) agree on every case.
    fn check(open: &dyn Fn(&Path, Symlinks) -> Result<File, BeneathError>) {
        assert_eq!(
            read(open(Path::new("sub/file"), Symlinks::Follow).unwrap()),
            "inside"
        );
        assert_eq!(
            read(open(Path::new("./sub/./file"), Symlinks::Refuse).unwrap()),
            "inside"
        );
        assert_eq!(
            read(open(Path::new("rel_ok"), Symlinks::Follow).unwrap()),
            "inside"
        );
        assert_eq!(
            read(open(Path::new("sub/deeper/up_ok"), Symlinks::Follow).unwrap()),
            "inside"
        );
        for p in [
            "rel_out",
            "abs_out",
            "sneaky",
            "../secret",
            "sub/../../secret",
        ] {
            let e = open(Path::new(p), Symlinks::Follow).unwrap_err();
            assert!(matches!(e, BeneathError::Escape), "{p}: {e:?}");
        }
        for p in ["rel_ok", "abs_out", "rel_out"] {
            let e = open(Path::new(p), Symlinks::Refuse).unwrap_err();
            assert!(matches!(e, BeneathError::Symlink), "{p}: {e:?}");
        }
        assert!(matches!(
            open(Path::new("nope"), Symlinks::Follow),
            Err(BeneathError::NotFound)
        ));
        assert!(open(Path::new("loop1"), Symlinks::Follow).is_err());
        assert!(matches!(
            open(Path::new("/etc/passwd"), Symlinks::Follow),
            Err(BeneathError::Escape)
        ));
    }

    #[test]
    fn openat2_or_platform_default() {
        let fx = fixture();
        let root = Root::open(&fx.root).unwrap();
        check(&|p, s| root.open_beneath(p, false, s));
    }

    #[test]
    fn user_space_walk() {
        let fx = fixture();
        let root = Root::open(&fx.root).unwrap();
        check(&|p, s| {
            if p.is_absolute() {
                return Err(BeneathError::Escape);
            }
            imp::walk(root.fd.as_fd(), p, false, s).map(File::from)
        });
    }

    /// A `..` walked while renames run elsewhere: the kernel's own
    /// `openat2` fails with EAGAIN now and then (the control), hull's
    /// never does.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_walk_through_dotdot_beside_renames_settles() {
        use rustix::fs::{Mode, OFlags, ResolveFlags};
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::time::{Duration, Instant};
        let fx = fixture();
        let dir = Root::open(&fx.root).unwrap();
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let renamer = {
            let (stop, at) = (stop.clone(), fx.root.join("sub/deeper"));
            std::thread::spawn(move || {
                let (a, b) = (at.join("a"), at.join("b"));
                std::fs::write(&a, b"").unwrap();
                while !stop.load(Ordering::Relaxed) {
                    std::fs::rename(&a, &b).unwrap();
                    std::fs::rename(&b, &a).unwrap();
                }
            })
        };
        let (flags, how) = (
            OFlags::PATH | OFlags::CLOEXEC,
            ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS,
        );
        let rel = Path::new("sub/deeper/../deeper/../file");
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut raw_again = 0;
        while raw_again == 0 && Instant::now() < deadline {
            for _ in 0..1000 {
                if let Err(rustix::io::Errno::AGAIN) =
                    rustix::fs::openat2(&dir.fd, rel, flags, Mode::empty(), how)
                {
                    raw_again += 1;
                }
            }
        }
        let mut settled_failures = Vec::new();
        for _ in 0..20_000 {
            if let Err(e) = openat2(&dir.fd, rel, flags, Mode::empty(), how) {
                settled_failures.push(e);
            }
        }
        stop.store(true, Ordering::Relaxed);
        renamer.join().unwrap();
        assert!(
            raw_again > 0,
            "control: the kernel's openat2 never said EAGAIN beside renames in 20 s"
        );
        assert!(settled_failures.is_empty(), "{settled_failures:?}");
    }
}
