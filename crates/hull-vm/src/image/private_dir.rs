//! The image cache's root, opened as one held directory that no other
//! user can change: every directory on the way to it is root's or ours and
//! writable by nobody else (a world-writable one only when sticky, and the
//! next one on the way is root's or ours), the root itself is ours, a real
//! directory, writable by nobody else, and nothing in it belongs to anyone
//! else. Missing directories are made (0700) relative to their held parent,
//! never by path. Reads and writes in it are relative to the held
//! descriptor, never follow a link, and a write goes to a new file
//! (`O_EXCL`) renamed into place.
//!
//! So `sudo -E hull` with another user's `XDG_CACHE_HOME` or
//! `HULL_IMAGE_CACHE`, or a cache made in `/tmp` by someone else, is
//! refused before root reads or writes anything in it.

#[cfg(unix)]
mod unix {
    use std::fs::File;
    use std::io::{self, Read, Write};
    use std::os::fd::OwnedFd;
    use std::os::unix::ffi::OsStrExt;
    use std::path::{Component, Path, PathBuf};

    use rustix::fs::{self as rfs, Mode, OFlags};

    /// Links followed on the way to the root before giving up.
    const MAX_LINKS: usize = 40;

    /// Why a directory cannot hold the cache.
    #[derive(Debug, thiserror::Error)]
    pub enum PrivateDirError {
        #[error("cannot {what} {path}: {source}")]
        Io {
            what: &'static str,
            path: PathBuf,
            #[source]
            source: io::Error,
        },
        #[error("{path}: {why}")]
        Untrusted { path: PathBuf, why: String },
    }

    /// The cache root, held open.
    #[derive(Debug)]
    pub struct PrivateDir {
        fd: OwnedFd,
        path: PathBuf,
    }

    fn io_err(
        what: &'static str,
        path: &Path,
    ) -> impl FnOnce(rustix::io::Errno) -> PrivateDirError {
        let path = path.to_path_buf();
        move |e| PrivateDirError::Io {
            what,
            path,
            source: e.into(),
        }
    }

    fn untrusted(path: &Path, why: String) -> PrivateDirError {
        PrivateDirError::Untrusted {
            path: path.to_path_buf(),
            why,
        }
    }

    /// Whether the directory `st` (at `path`) may be on the way to the root:
    /// root's or ours, and writable by nobody else unless sticky.
    fn check_on_the_way(st: &rfs::Stat, path: &Path, me: u32) -> Result<(), PrivateDirError> {
        if st.st_uid != 0 && st.st_uid != me {
            return Err(untrusted(
                path,
                format!(
                    "a directory on the way to the cache owned by uid {}, neither root nor us (uid {me}): \
                     its owner could move what is below it",
                    st.st_uid
                ),
            ));
        }
        let mode = st.st_mode & 0o7777;
        let sticky = mode & 0o1000 != 0;
        if mode & 0o022 != 0 && !sticky {
            return Err(untrusted(
                path,
                format!(
                    "a directory on the way to the cache writable by group or others (mode {mode:o}): \
                     they could move what is below it"
                ),
            ));
        }
        Ok(())
    }

    impl PrivateDir {
        /// Opens `path` (made, 0700, when missing), checking every directory on
        /// the way and the root itself as the module says.
        pub fn open(path: &Path) -> Result<PrivateDir, PrivateDirError> {
            let me = rustix::process::geteuid().as_raw();
            if !path.is_absolute() {
                return Err(untrusted(path, "not an absolute path".into()));
            }
            let dir_flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW;
            let root = Path::new("/");
            let mut at: OwnedFd =
                rfs::open(root, dir_flags, Mode::empty()).map_err(io_err("open", root))?;
            let mut at_path = PathBuf::from("/");
            let st = rfs::fstat(&at).map_err(io_err("inspect", root))?;
            check_on_the_way(&st, root, me)?;
            let mut todo: Vec<std::ffi::OsString> = names(path)?;
            todo.reverse();
            let mut links = 0;
            while let Some(name) = todo.pop() {
                if name == ".." {
                    // Only from a link's target: back up one held step by path
                    // is not possible without resolving again, so refuse.
                    return Err(untrusted(
                        path,
                        "a link on the way to the cache climbs with `..`".into(),
                    ));
                }
                let last = todo.is_empty();
                let here = at_path.join(&name);
                let opened = match rfs::openat(&at, &name, dir_flags, Mode::empty()) {
                    Err(rustix::io::Errno::NOENT) => {
                        match rfs::mkdirat(&at, &name, Mode::from_raw_mode(0o700)) {
                            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                            Err(e) => return Err(io_err("create", &here)(e)),
                        }
                        rfs::openat(&at, &name, dir_flags, Mode::empty())
                    }
                    other => other,
                };
                let fd = match opened {
                    Ok(fd) => fd,
                    Err(rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR) if !last => {
                        // A link on the way, in a directory checked above: its
                        // target is followed, one held step at a time.
                        links += 1;
                        if links > MAX_LINKS {
                            return Err(untrusted(path, "too many links on the way".into()));
                        }
                        // In a sticky directory others write, their link
                        // could be swapped: it must be root's or ours.
                        let st = rfs::statat(&at, &name, rfs::AtFlags::SYMLINK_NOFOLLOW)
                            .map_err(io_err("inspect", &here))?;
                        if st.st_uid != 0 && st.st_uid != me {
                            return Err(untrusted(
                                &here,
                                format!(
                                    "a link on the way to the cache owned by uid {}, neither root \
                                     nor us (uid {me})",
                                    st.st_uid
                                ),
                            ));
                        }
                        let target = rfs::readlinkat(&at, &name, Vec::new())
                            .map_err(io_err("read the link", &here))?;
                        let target = PathBuf::from(std::ffi::OsStr::from_bytes(target.as_bytes()));
                        let mut more = names(&target)?;
                        more.reverse();
                        todo.extend(more);
                        if target.is_absolute() {
                            at = rfs::open(root, dir_flags, Mode::empty()).map_err(io_err("open", root))?;
                            at_path = PathBuf::from("/");
                        }
                        continue;
                    }
                    Err(rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR) => {
                        return Err(untrusted(
                            &here,
                            "a symbolic link or not a directory (the cache must be a real directory)"
                                .into(),
                        ))
                    }
                    Err(e) => return Err(io_err("open", &here)(e)),
                };
                let st = rfs::fstat(&fd).map_err(io_err("inspect", &here))?;
                if last {
                    if st.st_uid != me {
                        return Err(untrusted(
                            &here,
                            format!("owned by uid {}, not by us (uid {me})", st.st_uid),
                        ));
                    }
                    let mode = st.st_mode & 0o7777;
                    if mode & 0o022 != 0 {
                        return Err(untrusted(
                            &here,
                            format!("writable by group or others (mode {mode:o})"),
                        ));
                    }
                } else {
                    check_on_the_way(&st, &here, me)?;
                }
                at = fd;
                at_path = here;
            }
            let dir = PrivateDir {
                fd: at,
                path: path.to_path_buf(),
            };
            dir.check_entries(me)?;
            Ok(dir)
        }

        /// Every entry of the root is ours.
        fn check_entries(&self, me: u32) -> Result<(), PrivateDirError> {
            let dup =
                rustix::io::fcntl_dupfd_cloexec(&self.fd, 0).map_err(io_err("list", &self.path))?;
            let mut d = rfs::Dir::new(dup).map_err(io_err("list", &self.path))?;
            while let Some(e) = d.read() {
                let e = e.map_err(io_err("list", &self.path))?;
                let name = e.file_name();
                if name == c"." || name == c".." {
                    continue;
                }
                let st = match rfs::statat(&self.fd, name, rfs::AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(st) => st,
                    // Gone since it was listed (a build of ours ended).
                    Err(rustix::io::Errno::NOENT) => continue,
                    Err(e) => return Err(io_err("inspect an entry of", &self.path)(e)),
                };
                if st.st_uid != me {
                    return Err(untrusted(
                        &self.path.join(name.to_string_lossy().as_ref()),
                        format!(
                            "an entry of the cache owned by uid {}, not by us (uid {me})",
                            st.st_uid
                        ),
                    ));
                }
            }
            Ok(())
        }

        pub fn path(&self) -> &Path {
            &self.path
        }

        /// The regular file `name` of the root, at most `max` bytes; `None`
        /// when there is none. A link, another kind of file, a file of someone
        /// else's or a longer one is an error.
        pub fn read(&self, name: &str, max: u64) -> io::Result<Option<Vec<u8>>> {
            let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
            let fd = match rfs::openat(&self.fd, name, flags, Mode::empty()) {
                Ok(fd) => fd,
                Err(rustix::io::Errno::NOENT) => return Ok(None),
                Err(e) => return Err(e.into()),
            };
            let st = rfs::fstat(&fd)?;
            if rfs::FileType::from_raw_mode(st.st_mode) != rfs::FileType::RegularFile
                || st.st_uid != rustix::process::geteuid().as_raw()
            {
                return Err(io::Error::other(format!(
                    "{}: not a regular file of ours",
                    self.path.join(name).display()
                )));
            }
            let mut out = Vec::new();
            File::from(fd).take(max + 1).read_to_end(&mut out)?;
            if out.len() as u64 > max {
                return Err(io::Error::other(format!(
                    "{}: more than {max} bytes",
                    self.path.join(name).display()
                )));
            }
            Ok(Some(out))
        }

        /// Writes `bytes` as the file `name` of the root: a new file of ours
        /// (`O_CREAT|O_EXCL|O_NOFOLLOW`, 0600) renamed over `name`.
        pub fn replace(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
            replace_at(&self.fd, name, bytes)
        }

        /// The directory `name` of the root, made (0700) when missing, held
        /// open: a directory of ours that nobody else may write, opened
        /// without following a link.
        pub fn subdir(&self, name: &str) -> io::Result<OwnedFd> {
            match rfs::mkdirat(&self.fd, name, Mode::from_raw_mode(0o700)) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(e.into()),
            }
            let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
            let fd = rfs::openat(&self.fd, name, flags, Mode::empty())?;
            let st = rfs::fstat(&fd)?;
            if st.st_uid != rustix::process::geteuid().as_raw() || st.st_mode & 0o022 != 0 {
                return Err(io::Error::other(format!(
                    "{}: a directory of someone else's, or writable by others",
                    self.path.join(name).display()
                )));
            }
            Ok(fd)
        }

        /// The lock file `name` of the root, made (0600) when missing: a
        /// regular file of ours, opened without following a link.
        pub fn open_lock(&self, name: &str) -> io::Result<File> {
            let flags = OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC;
            let fd = rfs::openat(&self.fd, name, flags, Mode::from_raw_mode(0o600))?;
            let st = rfs::fstat(&fd)?;
            if rfs::FileType::from_raw_mode(st.st_mode) != rfs::FileType::RegularFile
                || st.st_uid != rustix::process::geteuid().as_raw()
            {
                return Err(io::Error::other("not a regular file of ours"));
            }
            Ok(File::from(fd))
        }
    }

    /// Writes `bytes` as the file `name` of `dir`: a new file
    /// (`O_CREAT|O_EXCL|O_NOFOLLOW`, 0600) renamed over `name`, relative to
    /// the held directory.
    fn replace_at(dir: &OwnedFd, name: &str, bytes: &[u8]) -> io::Result<()> {
        let tmp = format!(
            ".{name}.{}.{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        );
        let flags =
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rfs::openat(dir, tmp.as_str(), flags, Mode::from_raw_mode(0o600))?;
        let mut f = File::from(fd);
        let written = f
            .write_all(bytes)
            .and_then(|()| f.sync_all())
            .and_then(|()| rfs::renameat(dir, tmp.as_str(), dir, name).map_err(io::Error::from));
        if written.is_err() {
            let _ = rfs::unlinkat(dir, tmp.as_str(), rfs::AtFlags::empty());
        }
        written
    }

    /// Writes `bytes` as the file `name` of the directory `dir` (a
    /// directory of the private cache, whose way is checked, or an image
    /// directory the user named), relative to it once held, as
    /// [`PrivateDir::replace`].
    pub fn replace_in(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
        let fd = rfs::open(
            dir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        replace_at(&fd, name, bytes)
    }

    /// The regular file `name` of the directory `dir`, at most `max` bytes,
    /// read relative to the held directory without following a link;
    /// `None` when there is none.
    pub fn read_in(dir: &Path, name: &str, max: u64) -> io::Result<Option<Vec<u8>>> {
        let fd = rfs::open(
            dir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let f = match rfs::openat(&fd, name, flags, Mode::empty()) {
            Ok(f) => f,
            Err(rustix::io::Errno::NOENT) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        if rfs::FileType::from_raw_mode(rfs::fstat(&f)?.st_mode) != rfs::FileType::RegularFile {
            return Err(io::Error::other(format!("{name}: not a regular file")));
        }
        let mut out = Vec::new();
        File::from(f).take(max + 1).read_to_end(&mut out)?;
        if out.len() as u64 > max {
            return Err(io::Error::other(format!("{name}: more than {max} bytes")));
        }
        Ok(Some(out))
    }

    /// The normal names of `path` (`.` dropped); a `..` is kept for the caller
    /// to refuse.
    fn names(path: &Path) -> Result<Vec<std::ffi::OsString>, PrivateDirError> {
        let mut out = Vec::new();
        for c in path.components() {
            match c {
                Component::RootDir | Component::CurDir => {}
                Component::ParentDir => out.push("..".into()),
                Component::Normal(n) => out.push(n.to_os_string()),
                Component::Prefix(_) => {
                    return Err(untrusted(path, "a path prefix this system has not".into()))
                }
            }
        }
        Ok(out)
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use std::os::unix::fs::PermissionsExt;

        #[test]
        fn a_private_dir_is_made_and_written_relative_to_its_descriptor() {
            let t = tempfile::tempdir().unwrap();
            let root = t.path().join("a/b/images");
            let d = PrivateDir::open(&root).unwrap();
            let mode = std::fs::metadata(&root).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o700);
            assert_eq!(d.read("x.json", 10).unwrap(), None);
            d.replace("x.json", b"{}").unwrap();
            assert_eq!(d.read("x.json", 10).unwrap().as_deref(), Some(&b"{}"[..]));
            assert!(d.read("x.json", 1).is_err(), "bounded");
            // Only the file itself is left: no temporary.
            let names: Vec<_> = std::fs::read_dir(&root)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(names, vec![std::ffi::OsString::from("x.json")]);
            // A planted link is never followed, for reading or writing.
            let victim = t.path().join("victim");
            std::fs::write(&victim, b"unchanged").unwrap();
            std::fs::remove_file(root.join("x.json")).unwrap();
            std::os::unix::fs::symlink(&victim, root.join("x.json")).unwrap();
            assert!(d.read("x.json", 100).is_err());
            d.replace("x.json", b"{}").unwrap();
            assert_eq!(std::fs::read(&victim).unwrap(), b"unchanged");
            assert!(!std::fs::symlink_metadata(root.join("x.json"))
                .unwrap()
                .file_type()
                .is_symlink());
            // A link on the way, in a directory of ours, is followed.
            let via = t.path().join("via");
            std::os::unix::fs::symlink(t.path().join("a"), &via).unwrap();
            PrivateDir::open(&via.join("b/images")).unwrap();
            // The root itself may not be a link.
            let e = PrivateDir::open(&t.path().join("via")).unwrap_err();
            assert!(e.to_string().contains("symbolic link"), "{e}");
        }

        /// Files hull writes in an image directory (the manifest, the
        /// digests' record) are written relative to the held directory:
        /// a link at the name is replaced, never written through, and
        /// never read through.
        #[test]
        fn an_image_directory_s_files_are_written_and_read_without_links() {
            let t = tempfile::tempdir().unwrap();
            let victim = t.path().join("victim");
            std::fs::write(&victim, b"unchanged").unwrap();
            let dir = t.path().join("img");
            std::fs::create_dir(&dir).unwrap();
            std::os::unix::fs::symlink(&victim, dir.join("manifest.json")).unwrap();
            assert!(read_in(&dir, "manifest.json", 100).is_err());
            replace_in(&dir, "manifest.json", b"{}").unwrap();
            assert_eq!(std::fs::read(&victim).unwrap(), b"unchanged");
            assert_eq!(
                read_in(&dir, "manifest.json", 100).unwrap().as_deref(),
                Some(&b"{}"[..])
            );
            assert_eq!(read_in(&dir, "none", 100).unwrap(), None);
        }

        #[test]
        fn a_root_or_way_others_can_write_is_refused() {
            let t = tempfile::tempdir().unwrap();
            let open = t.path().join("open");
            std::fs::create_dir(&open).unwrap();
            std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
            let e = PrivateDir::open(&open.join("images")).unwrap_err();
            assert!(e.to_string().contains("writable by group or others"), "{e}");
            assert!(!open.join("images").exists(), "nothing made below it");
            // Sticky, as /tmp: our own directory below it is fine.
            std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
            PrivateDir::open(&open.join("images")).unwrap();
            let root = t.path().join("loose");
            std::fs::create_dir(&root).unwrap();
            std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o775)).unwrap();
            let e = PrivateDir::open(&root).unwrap_err();
            assert!(e.to_string().contains("writable by group or others"), "{e}");
        }
    }
}

#[cfg(unix)]
pub use unix::{read_in, replace_in, PrivateDir, PrivateDirError};

#[cfg(not(unix))]
pub use other::{read_in, replace_in, PrivateDir, PrivateDirError};

/// Elsewhere: the root checked by path (hull's own state directories'
/// check), its files read and written by path.
#[cfg(not(unix))]
mod other {
    use std::io::{self, Read};
    use std::path::{Path, PathBuf};

    #[derive(Debug, thiserror::Error)]
    #[error("{path}: {why}")]
    pub struct PrivateDirError {
        path: PathBuf,
        why: String,
    }

    #[derive(Debug)]
    pub struct PrivateDir {
        path: PathBuf,
    }

    pub fn replace_in(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
        PrivateDir {
            path: dir.to_path_buf(),
        }
        .replace(name, bytes)
    }

    pub fn read_in(dir: &Path, name: &str, max: u64) -> io::Result<Option<Vec<u8>>> {
        PrivateDir {
            path: dir.to_path_buf(),
        }
        .read(name, max)
    }

    impl PrivateDir {
        pub fn open(path: &Path) -> Result<PrivateDir, PrivateDirError> {
            use crate::runtime::instance::{private_root, PrivateRootError};
            private_root(path).map_err(|e| PrivateDirError {
                path: path.to_path_buf(),
                why: match e {
                    PrivateRootError::Io { what, source } => format!("{what} it: {source}"),
                    PrivateRootError::Insecure(why) => why,
                },
            })?;
            Ok(PrivateDir {
                path: path.to_path_buf(),
            })
        }

        pub fn path(&self) -> &Path {
            &self.path
        }

        pub fn read(&self, name: &str, max: u64) -> io::Result<Option<Vec<u8>>> {
            let f = match std::fs::File::open(self.path.join(name)) {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(e),
            };
            let mut out = Vec::new();
            f.take(max + 1).read_to_end(&mut out)?;
            if out.len() as u64 > max {
                return Err(io::Error::other("too large"));
            }
            Ok(Some(out))
        }

        pub fn open_lock(&self, name: &str) -> io::Result<std::fs::File> {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(self.path.join(name))
        }

        pub fn replace(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
            let tmp = self
                .path
                .join(format!(".{name}.{}", uuid::Uuid::new_v4().simple()));
            std::fs::write(&tmp, bytes)?;
            std::fs::rename(&tmp, self.path.join(name))
        }
    }
}
