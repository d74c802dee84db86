//! The `.active` lock, per OS.
//!
//! Protocol (the same names on every OS): a process using an instance holds a
//! *shared* hold on `.active`; cleanup may touch a run dir only while it holds
//! an *exclusive* hold, taken without waiting. A hold handed to children
//! (inherited) keeps the instance in use after hull itself died.
//!
//! - Unix: `flock(2)`. The lock belongs to the open file description, so a
//!   child that inherited the descriptor holds it until the child and every
//!   other holder of that description closed it.
//! - Windows: share modes. A holder opens `.active` allowing other readers
//!   and writers; cleanup opens it sharing nothing but delete, which fails
//!   with a sharing violation while any handle is open anywhere, inherited
//!   handles included. (`LockFileEx` locks are released when the locking
//!   process exits even if a child inherited the handle, so they cannot carry
//!   the lock over to children.)

use std::fs::File;
use std::io;
use std::path::Path;

/// Opens (optionally creating) `.active` and takes a shared hold, waiting
/// while an exclusive hold exists.
pub(crate) fn hold_shared(path: &Path, create_new: bool) -> io::Result<File> {
    imp::hold_shared(path, create_new)
}

/// Tries to take an exclusive hold without waiting: `Ok(None)` while anyone
/// holds the lock, or when `path` no longer names the file that was locked.
pub(crate) fn try_exclusive(path: &Path) -> io::Result<Option<File>> {
    imp::try_exclusive(path)
}

/// Whether `file` (a held lock) is still the file at `path`: false after a
/// cleanup removed or replaced `.active` while we waited for the lock.
pub(crate) fn still_at(file: &File, path: &Path) -> io::Result<bool> {
    imp::still_at(file, path)
}

/// Makes the hold inheritable by children started afterwards (Windows; on
/// unix the descriptor is made inheritable in the child only).
#[cfg(windows)]
pub(crate) fn set_inheritable(file: &File) -> io::Result<()> {
    imp::set_inheritable(file)
}

#[cfg(unix)]
mod imp {
    use std::fs::{File, OpenOptions};
    use std::io;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    use std::path::Path;

    use rustix::fs::{flock, FlockOperation};
    use rustix::io::Errno;

    fn open(path: &Path, create_new: bool) -> io::Result<File> {
        let mut o = OpenOptions::new();
        o.read(true)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32);
        if create_new {
            // `create_new` needs write access in std's option checks.
            o.write(true).create_new(true).mode(0o600);
        }
        o.open(path)
    }

    fn lock(file: &File, op: FlockOperation) -> io::Result<bool> {
        loop {
            match flock(file, op) {
                Ok(()) => return Ok(true),
                Err(Errno::INTR) => continue,
                Err(Errno::WOULDBLOCK) => return Ok(false),
                Err(e) => return Err(e.into()),
            }
        }
    }

    pub(super) fn hold_shared(path: &Path, create_new: bool) -> io::Result<File> {
        let f = open(path, create_new)?;
        lock(&f, FlockOperation::LockShared)?;
        Ok(f)
    }

    pub(super) fn try_exclusive(path: &Path) -> io::Result<Option<File>> {
        let f = match open(path, false) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        if !lock(&f, FlockOperation::NonBlockingLockExclusive)? {
            return Ok(None);
        }
        if !still_at(&f, path)? {
            return Ok(None);
        }
        Ok(Some(f))
    }

    pub(super) fn still_at(file: &File, path: &Path) -> io::Result<bool> {
        let held = file.metadata()?;
        match std::fs::symlink_metadata(path) {
            Ok(now) => Ok(now.dev() == held.dev() && now.ino() == held.ino()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }
}

#[cfg(windows)]
mod imp {
    use std::fs::{File, OpenOptions};
    use std::io;
    use std::os::windows::fs::OpenOptionsExt;
    use std::os::windows::io::AsRawHandle;
    use std::path::Path;
    use std::time::Duration;

    use windows_sys::Win32::Foundation::{
        SetHandleInformation, ERROR_SHARING_VIOLATION, HANDLE, HANDLE_FLAG_INHERIT,
    };
    use windows_sys::Win32::Storage::FileSystem::{
        FILE_FLAG_OPEN_REPARSE_POINT, FILE_SHARE_DELETE, FILE_SHARE_READ, FILE_SHARE_WRITE,
    };

    fn open(path: &Path, create_new: bool, share: u32) -> io::Result<File> {
        let mut o = OpenOptions::new();
        o.read(true)
            .share_mode(share)
            .custom_flags(FILE_FLAG_OPEN_REPARSE_POINT);
        if create_new {
            o.write(true).create_new(true);
        }
        o.open(path)
    }

    fn is_sharing_violation(e: &io::Error) -> bool {
        e.raw_os_error() == Some(ERROR_SHARING_VIOLATION as i32)
    }

    pub(super) fn hold_shared(path: &Path, create_new: bool) -> io::Result<File> {
        // An exclusive hold is short (one cleanup pass): wait for it.
        let mut tries = 0u32;
        loop {
            match open(path, create_new, FILE_SHARE_READ | FILE_SHARE_WRITE) {
                Err(e) if is_sharing_violation(&e) && tries < 600 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(50));
                }
                r => return r,
            }
        }
    }

    pub(super) fn try_exclusive(path: &Path) -> io::Result<Option<File>> {
        // Sharing nothing but delete: fails while any other handle is open,
        // and lets the holder of this one remove `.active`.
        match open(path, false, FILE_SHARE_DELETE) {
            Ok(f) => Ok(Some(f)),
            Err(e) if is_sharing_violation(&e) => Ok(None),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub(super) fn still_at(_file: &File, path: &Path) -> io::Result<bool> {
        // Without FILE_SHARE_DELETE nobody can remove or rename `.active`
        // while we hold it; it is ours if it still exists.
        match std::fs::symlink_metadata(path) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    pub(super) fn set_inheritable(file: &File) -> io::Result<()> {
        let h = file.as_raw_handle() as HANDLE;
        // SAFETY: `h` is a valid handle owned by `file` for this call.
        let ok = unsafe { SetHandleInformation(h, HANDLE_FLAG_INHERIT, HANDLE_FLAG_INHERIT) };
        if ok == 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_holds_coexist_and_block_exclusive() {
        let _serial = crate::runtime::serial();
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join(".active");
        let a = hold_shared(&p, true).unwrap();
        let b = hold_shared(&p, false).unwrap();
        assert!(try_exclusive(&p).unwrap().is_none());
        drop(a);
        assert!(try_exclusive(&p).unwrap().is_none(), "b still holds");
        drop(b);
        let x = try_exclusive(&p).unwrap();
        assert!(x.is_some(), "nobody holds it any more");
        assert!(still_at(x.as_ref().unwrap(), &p).unwrap());
        drop(x);
        std::fs::remove_file(&p).unwrap();
        assert!(try_exclusive(&p).unwrap().is_none(), "gone");
    }

    #[cfg(unix)]
    #[test]
    fn replaced_file_is_not_ours() {
        let _serial = crate::runtime::serial();
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join(".active");
        let a = hold_shared(&p, true).unwrap();
        std::fs::remove_file(&p).unwrap();
        std::fs::write(&p, b"").unwrap();
        assert!(!still_at(&a, &p).unwrap());
    }
}
