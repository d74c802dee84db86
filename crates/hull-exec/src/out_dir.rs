//! A directory hull writes into for its caller at a path the caller named
//! (`hull batch --out`, `hull batch merge --out`, `hull compare`'s work
//! directory), and bounded reads of files in it.
//!
//! hull often runs as root there, and the path may lie where another local
//! user can write (`/tmp`, a group-writable parent), or hold what a run
//! left. So the directory is opened once (`O_DIRECTORY | O_NOFOLLOW`) and
//! kept only when hull made it or it belongs to hull's user and no one
//! else may write in it; nothing another user planted can then be in it.
//! Every file is made or opened beneath that descriptor, never following a
//! link (`O_NOFOLLOW`, new files `O_EXCL`, a replaced file renamed over
//! within the directory), and a child process that must name a file in it
//! gets a path through the held descriptor (`/proc/<hull's pid>/fd/N/..`),
//! never the caller's path resolved again.

// The caller's path is resolved once, here; everything after goes through
// the descriptor (clippy.toml).
#![deny(clippy::disallowed_methods)]

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

#[derive(Debug, thiserror::Error)]
pub enum OutDirError {
    #[error("{path}: {what}: {source}")]
    Io {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error(
        "{path} is a symbolic link: hull writes only into a directory itself, never \
         through a link another user could have planted; name the directory it points to"
    )]
    Link { path: PathBuf },
    #[error(
        "{path} belongs to uid {uid} with mode {mode:04o}: hull writes only into a \
         directory it made, or one of uid {me} that no one else may write in (another \
         user could plant links there); choose another directory"
    )]
    NotYours {
        path: PathBuf,
        uid: u32,
        mode: u32,
        me: u32,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{path}: {what}: {source}")]
    Io {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("{path} is not a regular file (a link, a FIFO or a device): refused")]
    NotRegular { path: PathBuf },
    #[error("{path} is larger than {limit} bytes: refused")]
    TooLarge { path: PathBuf, limit: u64 },
}

/// A directory opened once and checked (see the module comment).
#[derive(Debug)]
pub struct OutDir {
    path: PathBuf,
    fd: OwnedFd,
}

impl OutDir {
    /// Opens the directory at `path`, made when absent (mode 0700: what
    /// jobs print is the caller's; its missing parents too). Refused, by
    /// name: a symbolic link there, and a directory that is not hull's
    /// user's or that group or others may write in.
    // The caller's own path, resolved once.
    pub fn open_or_make(path: &Path) -> Result<OutDir, OutDirError> {
        OutDir::open(path, false)
    }

    /// [`OutDir::open_or_make`] for a directory that must not exist yet:
    /// hull makes it, or refuses.
    pub fn make_new(path: &Path) -> Result<OutDir, OutDirError> {
        OutDir::open(path, true)
    }

    #[allow(clippy::disallowed_methods)]
    fn open(path: &Path, new: bool) -> Result<OutDir, OutDirError> {
        let io_err = |what| {
            move |source| OutDirError::Io {
                path: path.to_path_buf(),
                what,
                source,
            }
        };
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(io_err("cannot make its parent"))?;
        }
        match rustix::fs::mkdir(path, Mode::from_raw_mode(0o700)) {
            Ok(()) => {}
            Err(rustix::io::Errno::EXIST) if !new => {}
            Err(e) => return Err(io_err("cannot make it")(e.into())),
        }
        let fd = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| {
            let at = rustix::fs::statat(rustix::fs::CWD, path, AtFlags::SYMLINK_NOFOLLOW);
            refused(path.to_path_buf(), e, at)
        })?;
        OutDir::checked(path.to_path_buf(), fd)
    }

    /// The directory `name` in this one, made when absent, checked as
    /// [`OutDir::open_or_make`] checks.
    pub fn subdir(&self, name: &str) -> Result<OutDir, OutDirError> {
        let path = self.path.join(name);
        match rustix::fs::mkdirat(&self.fd, name, Mode::from_raw_mode(0o700)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => {
                return Err(OutDirError::Io {
                    path,
                    what: "cannot make it",
                    source: e.into(),
                })
            }
        }
        match rustix::fs::openat(
            &self.fd,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => OutDir::checked(path, fd),
            Err(e) => {
                let at = rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW);
                Err(refused(path, e, at))
            }
        }
    }

    fn checked(path: PathBuf, fd: OwnedFd) -> Result<OutDir, OutDirError> {
        let st = rustix::fs::fstat(&fd).map_err(|e| OutDirError::Io {
            path: path.clone(),
            what: "cannot stat it",
            source: e.into(),
        })?;
        let me = rustix::process::geteuid().as_raw();
        // u16 on macOS.
        #[allow(clippy::useless_conversion)]
        let mode = u32::from(st.st_mode) & 0o7777;
        if st.st_uid != me || mode & 0o022 != 0 {
            return Err(OutDirError::NotYours {
                path,
                uid: st.st_uid,
                mode,
                me,
            });
        }
        Ok(OutDir { path, fd })
    }

    /// The path the caller named (for messages and records only).
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// `name` in this directory as the caller named it (for messages).
    pub fn shown(&self, name: impl AsRef<OsStr>) -> PathBuf {
        self.path.join(name.as_ref())
    }

    /// `name` in this directory through hull's held descriptor, for a
    /// child process of hull to open (`/proc/<pid>/fd/<n>/name`): it
    /// reaches this directory whatever was renamed on the caller's path
    /// since, while hull holds it.
    pub fn through_fd(&self, name: impl AsRef<OsStr>) -> PathBuf {
        PathBuf::from(format!(
            "/proc/{}/fd/{}",
            std::process::id(),
            self.fd.as_raw_fd()
        ))
        .join(name.as_ref())
    }

    /// A new file `name` for writing (mode 0644), replacing what is there
    /// (an earlier run's file of the same name is removed first, a link
    /// included, never followed; a directory is refused).
    pub fn create(&self, name: &str) -> io::Result<File> {
        match rustix::fs::unlinkat(&self.fd, name, AtFlags::empty()) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => {}
            Err(e) => return Err(e.into()),
        }
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o644),
        )?;
        Ok(File::from(fd))
    }

    /// `name` opened for reading and appending, made when absent: a
    /// regular file, never through a link.
    pub fn open_append(&self, name: &str) -> io::Result<File> {
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            OFlags::RDWR
                | OFlags::APPEND
                | OFlags::CREATE
                | OFlags::NOFOLLOW
                | OFlags::NONBLOCK
                | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o644),
        )?;
        let st = rustix::fs::fstat(&fd)?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file",
            ));
        }
        // Blocking again for the appends.
        rustix::fs::fcntl_setfl(&fd, OFlags::APPEND)?;
        Ok(File::from(fd))
    }

    /// The whole of regular file `name`, at most `limit` bytes.
    pub fn read(&self, name: &str, limit: u64) -> Result<Vec<u8>, ReadError> {
        read_at(self.fd(), name, &self.shown(name), limit)
    }

    /// The last `limit` bytes at most of regular file `name`.
    pub fn read_tail(&self, name: &str, limit: u64) -> Result<Vec<u8>, ReadError> {
        let shown = self.shown(name);
        let mut f = open_regular(self.fd(), name, &shown)?;
        let len = f
            .metadata()
            .map_err(|source| ReadError::Io {
                path: shown.clone(),
                what: "cannot stat",
                source,
            })?
            .len();
        f.seek(SeekFrom::Start(len.saturating_sub(limit)))
            .map_err(|source| ReadError::Io {
                path: shown.clone(),
                what: "cannot seek in",
                source,
            })?;
        let mut out = Vec::new();
        f.take(limit)
            .read_to_end(&mut out)
            .map_err(|source| ReadError::Io {
                path: shown,
                what: "cannot read",
                source,
            })?;
        Ok(out)
    }
}

/// Why opening directory `path` failed with `e`, given what is there
/// (`at`, not following a link): a link there is named as such.
fn refused(
    path: PathBuf,
    e: rustix::io::Errno,
    at: rustix::io::Result<rustix::fs::Stat>,
) -> OutDirError {
    match at {
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Symlink => {
            OutDirError::Link { path }
        }
        _ => OutDirError::Io {
            path,
            what: "cannot open it as a directory",
            source: e.into(),
        },
    }
}

/// Opens `name` in `dir` for reading: a regular file, not through a link
/// (a FIFO is not waited for: it is refused).
fn open_regular(dir: BorrowedFd<'_>, name: &str, shown: &Path) -> Result<File, ReadError> {
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        rustix::io::Errno::LOOP | rustix::io::Errno::NXIO => ReadError::NotRegular {
            path: shown.to_path_buf(),
        },
        e => ReadError::Io {
            path: shown.to_path_buf(),
            what: "cannot open",
            source: e.into(),
        },
    })?;
    let st = rustix::fs::fstat(&fd).map_err(|e| ReadError::Io {
        path: shown.to_path_buf(),
        what: "cannot stat",
        source: e.into(),
    })?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(ReadError::NotRegular {
            path: shown.to_path_buf(),
        });
    }
    Ok(File::from(fd))
}

/// The whole of regular file `name` in `dir` (`shown` in messages), at
/// most `limit` bytes: bounded by the bytes read, not by its size (a file
/// that grows while read is refused too).
pub fn read_at(
    dir: BorrowedFd<'_>,
    name: &str,
    shown: &Path,
    limit: u64,
) -> Result<Vec<u8>, ReadError> {
    let f = open_regular(dir, name, shown)?;
    let mut out = Vec::new();
    f.take(limit.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(|source| ReadError::Io {
            path: shown.to_path_buf(),
            what: "cannot read",
            source,
        })?;
    if out.len() as u64 > limit {
        return Err(ReadError::TooLarge {
            path: shown.to_path_buf(),
            limit,
        });
    }
    Ok(out)
}

/// [`read_at`] for a file the caller named: its directory opened by path
/// once (the caller's), the file beneath it without following a link.
// The caller's own path, resolved once.
#[allow(clippy::disallowed_methods)]
pub fn read_named(path: &Path, limit: u64) -> Result<Vec<u8>, ReadError> {
    let (dir, name) = match (path.parent(), path.file_name().and_then(OsStr::to_str)) {
        (Some(d), Some(n)) => (
            if d.as_os_str().is_empty() {
                Path::new(".")
            } else {
                d
            },
            n,
        ),
        _ => {
            return Err(ReadError::NotRegular {
                path: path.to_path_buf(),
            })
        }
    };
    let dir = rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| ReadError::Io {
        path: path.to_path_buf(),
        what: "cannot open the directory of",
        source: e.into(),
    })?;
    read_at(dir.as_fd(), name, path, limit)
}

/// Writes `bytes` as the file `path` the caller named (a report, a page):
/// its directory opened once by the caller's path, the bytes written to a
/// new name beneath it (`O_EXCL | O_NOFOLLOW`) and renamed over `path`,
/// which replaces a link planted there instead of writing through it.
/// (The directory may be `/tmp` or another anyone can write in: nothing
/// hull writes goes through what another user made there.)
// The caller's own path, resolved once.
#[allow(clippy::disallowed_methods)]
pub fn write_file(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let (dir, name) = match (path.parent(), path.file_name()) {
        (Some(d), Some(n)) => (
            if d.as_os_str().is_empty() {
                Path::new(".")
            } else {
                d
            },
            n,
        ),
        _ => return Err(io::Error::new(io::ErrorKind::InvalidInput, "names no file")),
    };
    let dir = rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    replace_at(dir.as_fd(), name, bytes)
}

/// Writes `bytes` as `name` in `dir`: to a new name beneath it (`O_EXCL |
/// O_NOFOLLOW`), synced, then renamed over `name`, replacing whatever is
/// there (a link included, never followed).
pub fn replace_at(dir: BorrowedFd<'_>, name: &OsStr, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write;
    let tmp = format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        uuid::Uuid::new_v4().simple()
    );
    let fd = rustix::fs::openat(
        dir,
        tmp.as_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
    )?;
    let mut f = File::from(fd);
    let done = f
        .write_all(bytes)
        .and_then(|()| f.sync_all())
        .and_then(|()| Ok(rustix::fs::renameat(dir, tmp.as_str(), dir, name)?));
    if done.is_err() {
        let _ = rustix::fs::unlinkat(dir, tmp.as_str(), AtFlags::empty());
    }
    done
}

#[cfg(test)]
// Tests build their trees by path.
#[allow(clippy::disallowed_methods)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_made_directory_takes_files_and_a_link_in_it_is_replaced_not_followed() {
        let t = tempfile::tempdir().unwrap();
        let victim = t.path().join("victim");
        std::fs::write(&victim, "keep").unwrap();
        let out = OutDir::open_or_make(&t.path().join("a/out")).unwrap();
        std::os::unix::fs::symlink(&victim, t.path().join("a/out/f")).unwrap();
        out.create("f").unwrap().write_all(b"new").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        assert_eq!(
            std::fs::read_to_string(t.path().join("a/out/f")).unwrap(),
            "new"
        );
        std::os::unix::fs::symlink(&victim, t.path().join("a/out/log")).unwrap();
        assert!(out.open_append("log").is_err());
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        let sub = out.subdir("jobs").unwrap();
        assert_eq!(
            std::fs::read_link(sub.through_fd("x").parent().unwrap()).unwrap(),
            t.path().join("a/out/jobs")
        );
    }

    #[test]
    fn a_link_or_a_directory_others_may_write_is_refused_by_name() {
        let t = tempfile::tempdir().unwrap();
        let real = t.path().join("real");
        std::fs::create_dir(&real).unwrap();
        std::os::unix::fs::symlink(&real, t.path().join("link")).unwrap();
        let e = OutDir::open_or_make(&t.path().join("link")).unwrap_err();
        assert!(matches!(e, OutDirError::Link { .. }), "{e}");
        assert!(e.to_string().contains("link"), "{e}");
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = OutDir::open_or_make(&real).unwrap_err();
        assert!(e.to_string().contains("mode 0777"), "{e}");
        assert!(e.to_string().contains(&real.display().to_string()), "{e}");
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(OutDir::open_or_make(&real).is_ok());
    }

    #[test]
    fn a_named_file_replaces_a_planted_link() {
        let t = tempfile::tempdir().unwrap();
        let victim = t.path().join("victim");
        std::fs::write(&victim, "keep").unwrap();
        let page = t.path().join("page.html");
        std::os::unix::fs::symlink(&victim, &page).unwrap();
        write_file(&page, b"<html>").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        assert_eq!(std::fs::read_to_string(&page).unwrap(), "<html>");
        assert!(!std::fs::symlink_metadata(&page).unwrap().is_symlink());
        assert_eq!(std::fs::read_dir(t.path()).unwrap().count(), 2);
    }

    #[test]
    fn reads_are_bounded_by_the_bytes_read_and_only_of_regular_files() {
        let t = tempfile::tempdir().unwrap();
        let out = OutDir::open_or_make(t.path()).unwrap();
        std::fs::write(t.path().join("small"), "0123456789").unwrap();
        assert_eq!(out.read("small", 10).unwrap(), b"0123456789");
        assert_eq!(out.read_tail("small", 4).unwrap(), b"6789");
        let e = out.read("small", 9).unwrap_err();
        assert!(e.to_string().contains("larger than 9 bytes"), "{e}");
        std::os::unix::fs::symlink("/dev/zero", t.path().join("zero")).unwrap();
        let e = out.read("zero", 1 << 20).unwrap_err();
        assert!(matches!(e, ReadError::NotRegular { .. }), "{e}");
        let fifo = t.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = out.read("fifo", 1 << 20).unwrap_err();
        assert!(matches!(e, ReadError::NotRegular { .. }), "{e}");
        let e = read_named(&t.path().join("zero"), 1 << 20).unwrap_err();
        assert!(matches!(e, ReadError::NotRegular { .. }), "{e}");
    }
}
