//! The watch broker of the landlock tier.
//!
//! Landlock does not mediate `inotify_add_watch`: a command could watch a
//! directory it cannot list and read the names created in it from the
//! events (a 0700 directory of the caller's, when hull is not root; any
//! world-readable one otherwise). The command's filter stops the call and
//! this answers it: the path, read once, is resolved as the command would
//! resolve it (its cwd, `IN_DONT_FOLLOW` honoured), and the watch is added
//! by hull, on the command's own inotify instance (`pidfd_getfd`), to that
//! resolved file, only when it lies inside what the policy lets the command
//! see at all (a grant, outside every hidden protection). Otherwise EACCES.
//! The watch descriptor is the call's return value, as the kernel's own.
//!
//! `fanotify_init` is refused by the landlock filter itself.

use std::ffi::{CString, OsStr};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::metadata::Target;
use super::{become_on_this_thread, err, identity, proc_fd, Scope, Task, MAX_PATH};

impl Task<'_> {
    /// Answers `inotify_add_watch(fd, path, mask)` with the watch
    /// descriptor. With `as_command` (hull is root) the path is resolved
    /// and the watch added with the command's credentials, so the kernel's
    /// own permission checks (search on every directory, read on the
    /// watched file) are the command's.
    pub(super) fn watch(
        &self,
        req: &libc::seccomp_notif,
        scope: &Scope,
        as_command: bool,
    ) -> std::io::Result<i64> {
        let [fd, path, mask, ..] = req.data.args;
        let mask = mask as u32;
        let path = self.string(path, MAX_PATH)?;
        let inotify = self.fd(fd as i32)?;
        if as_command {
            become_on_this_thread(&identity(self.pid)?)?;
        }
        let target = Target::At {
            dirfd: libc::AT_FDCWD,
            path,
            follow: mask & libc::IN_DONT_FOLLOW == 0,
            empty_path: false,
        };
        let file = self.resolve(&target)?;
        self.valid()?;
        let link = rustix::fs::readlinkat(rustix::fs::CWD, proc_fd(file.as_fd()), Vec::new())?;
        let at = Path::new(OsStr::from_bytes(link.as_bytes()));
        if !scope.allows_file(file.as_fd(), at) {
            tracing::debug!(path = %at.display(), "broker: refused an inotify watch outside the grants");
            return Err(err(libc::EACCES));
        }
        let st = rustix::fs::fstat(&file)?;
        if rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Symlink {
            // A watch on a link itself (IN_DONT_FOLLOW on a symlink): the
            // magic link below would reach its target instead.
            return Err(err(libc::EPERM));
        }
        let via = CString::new(proc_fd(file.as_fd())).map_err(|_| err(libc::EINVAL))?;
        // SAFETY: an inotify descriptor we hold, a NUL-terminated path we
        // own; returns a watch descriptor or -1.
        let wd = unsafe {
            libc::inotify_add_watch(
                inotify.as_raw_fd(),
                via.as_ptr(),
                mask & !libc::IN_DONT_FOLLOW,
            )
        };
        if wd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(i64::from(wd))
    }
}
