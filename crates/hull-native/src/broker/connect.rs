//! The connect broker: of the bwrap tier, and of the landlock tier where
//! its Landlock cannot mediate unix sockets (ABI < 9).
//!
//! A read-only bind mount does not stop `connect()` to a unix socket under
//! it, and the network namespace does not cover pathname sockets: without
//! this broker a command could talk to any host service whose socket lies
//! under a grant (a `docker.sock` would be host root). Every `connect` of
//! the command stops in its filter (`hull_seccomp::build_connect_broker`,
//! or `build_broker` with `connect` on landlock) and is answered here, on
//! a worker thread of its own (a connect may block until the peer
//! accepts):
//!
//! - the socket is the command's own, fetched with `pidfd_getfd`; its
//!   address is read once from the command's memory;
//! - a pathname address is resolved in the command's own view of the file
//!   system (`/proc/TID/root`, `RESOLVE_IN_ROOT`, no magic links), and the
//!   socket file must lie on a writable mount of that view (bwrap: the
//!   writable roots, the sandbox's own `/tmp`), or, on landlock, where the
//!   whole host is one view, in the writable roots outside every
//!   protection, or on a session's own `/tmp` (the metadata broker's
//!   [`super::Scope`]). Anything else is refused (EACCES);
//! - hull then connects that socket to the inode it resolved (through
//!   `/proc/thread-self/fd`), so renaming or replacing the path after the
//!   check changes nothing. On bwrap other addresses (inet, abstract unix
//!   sockets, both scoped to the sandbox's network namespace) are
//!   connected as read. On landlock a connect hull made would escape the
//!   command's Landlock domain (its scoping of abstract sockets), so only
//!   pathname unix addresses are connected, anything else refused (EACCES:
//!   the command has no other socket there, its filter refusing them);
//! - when hull is root the worker first takes the command's uid, gid and
//!   groups (on that thread only), so the kernel's permission check on the
//!   socket file and the peer's credentials are the command's.
//!
//! Unix datagram sockets, whose sends may name any socket, are refused by
//! the filter itself.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use super::{become_on_this_thread, err, identity, proc_fd, read_bounded, Task};

/// The largest address a connect takes (sizeof(struct sockaddr_storage)).
const MAX_ADDR: usize = 128;

/// A `sockaddr_un` holding `path`.
fn unix_address(path: &[u8]) -> std::io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: an all-zero sockaddr_un is valid (plain integers).
    let mut sa: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if path.len() >= sa.sun_path.len() {
        return Err(err(libc::ENAMETOOLONG));
    }
    sa.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in sa.sun_path.iter_mut().zip(path) {
        *d = *s as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + path.len() + 1;
    Ok((sa, len as libc::socklen_t))
}

fn connect_raw(
    sock: &OwnedFd,
    addr: *const libc::sockaddr,
    len: libc::socklen_t,
) -> std::io::Result<()> {
    // SAFETY: `addr` points at `len` bytes the caller owns, alive for the call.
    if unsafe { libc::connect(sock.as_raw_fd(), addr, len) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The pathname a unix address names, when it names one (not abstract,
/// not unnamed).
fn pathname(addr: &[u8]) -> Option<&[u8]> {
    let family = u16::from_ne_bytes([*addr.first()?, *addr.get(1)?]);
    if family != libc::AF_UNIX as u16 {
        return None;
    }
    let path = &addr[2..];
    if path.first().is_none_or(|b| *b == 0) {
        return None;
    }
    Some(path.split(|b| *b == 0).next().unwrap_or(path))
}

impl Task<'_> {
    /// Answers `connect(fd, addr, len)`: on bwrap (`scope` None) to a
    /// socket on a writable mount of the command's view, on landlock to a
    /// pathname socket `scope` allows.
    pub(super) fn connect(
        &self,
        req: &libc::seccomp_notif,
        as_command: bool,
        scope: Option<&super::Scope>,
    ) -> std::io::Result<()> {
        let [fd, addr, len, ..] = req.data.args;
        let len = len as u32 as usize;
        if len > MAX_ADDR {
            return Err(err(libc::EINVAL));
        }
        let bytes = self.read(addr, len)?;
        if bytes.len() != len {
            return Err(err(libc::EFAULT));
        }
        let sock = self.fd(fd as i32)?;
        let domain = rustix::net::sockopt::socket_domain(&sock).map_err(|e| {
            if e == rustix::io::Errno::NOTSOCK {
                err(libc::ENOTSOCK)
            } else {
                e.into()
            }
        })?;
        let who = if as_command {
            Some(identity(self.pid)?)
        } else {
            None
        };
        let path = if domain == rustix::net::AddressFamily::UNIX {
            pathname(&bytes)
        } else {
            None
        };
        let Some(path) = path else {
            if scope.is_some() {
                // Landlock: a pathname socket in scope, nothing else.
                tracing::debug!("broker: refused a connect to no pathname unix socket (landlock)");
                return Err(err(libc::EACCES));
            }
            self.valid()?;
            if let Some(who) = &who {
                become_on_this_thread(who)?;
            }
            // SAFETY: an all-zero sockaddr_storage is valid; `bytes` fits it.
            let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
            // SAFETY: copies `len` <= sizeof(ss) bytes into `ss`, which we own.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    bytes.as_ptr(),
                    (&mut ss as *mut libc::sockaddr_storage).cast::<u8>(),
                    len,
                )
            };
            return connect_raw(
                &sock,
                (&ss as *const libc::sockaddr_storage).cast(),
                len as libc::socklen_t,
            );
        };
        // On landlock the path is resolved as the command already (its
        // view is the host's); on bwrap in its mount namespace, as hull.
        let (early, late) = match scope {
            Some(_) => (who.as_ref(), None),
            None => (None, who.as_ref()),
        };
        if let Some(who) = early {
            become_on_this_thread(who)?;
        }
        let target = self.open_in_view(path)?;
        let allowed = match scope {
            Some(scope) => {
                let link =
                    rustix::fs::readlinkat(rustix::fs::CWD, proc_fd(target.as_fd()), Vec::new())?;
                let at = std::path::Path::new(std::ffi::OsStr::from_bytes(link.as_bytes()));
                scope.allows_file(target.as_fd(), at)
            }
            None => self.on_writable_mount(&target)?,
        };
        if !allowed {
            tracing::debug!(path = %String::from_utf8_lossy(path), "broker: refused a connect to a socket outside the writable roots");
            return Err(err(libc::EACCES));
        }
        self.valid()?;
        if let Some(who) = late {
            become_on_this_thread(who)?;
        }
        let via = proc_fd(target.as_fd());
        let (sa, salen) = unix_address(via.as_bytes())?;
        connect_raw(&sock, (&sa as *const libc::sockaddr_un).cast(), salen)
    }

    /// Opens `path` (O_PATH) as the calling thread would resolve it: in its
    /// root, from its cwd, with no magic link followed. A relative path is
    /// joined to the cwd as the thread sees it (`/proc/TID/cwd` reads in
    /// the thread's own mount namespace); however the cwd moves meanwhile,
    /// the result resolves inside the thread's root, and its mount decides.
    fn open_in_view(&self, path: &[u8]) -> std::io::Result<OwnedFd> {
        use crate::runtime::beneath::openat2;
        use rustix::fs::{openat, Mode, OFlags, ResolveFlags};
        let root = openat(
            rustix::fs::CWD,
            format!("/proc/{}/root", self.pid),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let mut full = Vec::with_capacity(path.len() + 64);
        if path.first() != Some(&b'/') {
            let cwd = rustix::fs::readlinkat(
                rustix::fs::CWD,
                format!("/proc/{}/cwd", self.pid),
                Vec::new(),
            )?;
            let cwd = cwd.as_bytes();
            if cwd.first() != Some(&b'/') {
                return Err(err(libc::ENOENT));
            }
            full.extend_from_slice(cwd);
            full.push(b'/');
        }
        full.extend_from_slice(path);
        let full = CString::new(full).map_err(|_| err(libc::EINVAL))?;
        Ok(openat2(
            &root,
            full.as_c_str(),
            OFlags::PATH | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
        )?)
    }

    /// Whether `file` lies on a mount that is writable in the calling
    /// thread's view (`/proc/TID/mountinfo`).
    fn on_writable_mount(&self, file: &OwnedFd) -> std::io::Result<bool> {
        use rustix::fs::{statx, AtFlags, StatxFlags};
        let st = statx(file, "", AtFlags::EMPTY_PATH, StatxFlags::MNT_ID)?;
        if st.stx_mask & StatxFlags::MNT_ID.bits() == 0 {
            return Err(err(libc::ENOSYS));
        }
        let text = read_bounded(&format!("/proc/{}/mountinfo", self.pid), 4 << 20)?;
        Ok(crate::mountinfo::mount_is_writable(&text, st.stx_mnt_id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pathnames_are_told_from_other_addresses() {
        let a = |fam: u16, rest: &[u8]| {
            let mut v = fam.to_ne_bytes().to_vec();
            v.extend_from_slice(rest);
            v
        };
        let unix = libc::AF_UNIX as u16;
        assert_eq!(
            pathname(&a(unix, b"/run/x.sock\0")),
            Some(&b"/run/x.sock"[..])
        );
        assert_eq!(pathname(&a(unix, b"rel.sock")), Some(&b"rel.sock"[..]));
        assert_eq!(pathname(&a(unix, b"\0abstract")), None);
        assert_eq!(pathname(&a(unix, b"")), None);
        assert_eq!(pathname(&a(libc::AF_INET as u16, b"/x")), None);
        assert_eq!(pathname(&[1]), None);
    }
}
