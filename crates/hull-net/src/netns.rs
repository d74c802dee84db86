//! The command's own network namespace, with the proxy's listener in it.
//!
//! The child hull starts for the command unshares a network namespace
//! before anything else (as root: before it takes the sandbox user; not
//! root: inside a user namespace of its own that maps only the caller's
//! uid and gid), brings its loopback up, listens on
//! [`crate::LISTEN`] there and sends that listener to hull's
//! proxy, which accepts on it directly. The namespace has no other
//! interface: a direct connection or a DNS query fails at once, and the
//! only thing listening is hull's proxy. No process relays in between.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

/// The child's half: makes the namespace and the listener, and sends it.
#[derive(Debug)]
pub struct Handoff {
    sock: OwnedFd,
    /// The user namespace's maps when hull is not root.
    userns: Option<Maps>,
}

/// `uid_map` and `gid_map` lines mapping the caller's own ids only.
#[derive(Debug)]
struct Maps {
    uid: Vec<u8>,
    gid: Vec<u8>,
}

/// The proxy's half: the socket the listener arrives on.
#[derive(Debug)]
pub struct Arrival(pub OwnedFd);

/// A handoff for the child and the socket its listener arrives on.
/// `userns`: make a user namespace too (hull is not root, and a network
/// namespace needs CAP_SYS_ADMIN over it).
pub fn prepare(userns: bool) -> io::Result<(Handoff, Arrival)> {
    let (ours, theirs) = crate::exec::fds::descriptor_pair()?;
    let userns = userns.then(|| {
        let (uid, gid) = (rustix::process::geteuid(), rustix::process::getegid());
        Maps {
            uid: format!("{0} {0} 1", uid.as_raw()).into_bytes(),
            gid: format!("{0} {0} 1", gid.as_raw()).into_bytes(),
        }
    });
    Ok((
        Handoff {
            sock: theirs,
            userns,
        },
        Arrival(ours),
    ))
}

impl Handoff {
    /// Registers the child's step on `cmd`: before the step that takes the
    /// sandbox user (it needs root's CAP_SYS_ADMIN), before every step
    /// that closes descriptors.
    pub fn install(self, cmd: &mut impl crate::exec::spawn::PreExec) {
        let Handoff { sock, userns } = self;
        // SAFETY: unshare, open/write/close, socket, ioctl, bind, listen
        // and sendmsg: raw, async-signal-safe system calls on memory
        // prepared before the clone.
        unsafe {
            cmd.pre_exec_step(Box::new(move || in_child(sock.as_fd(), userns.as_ref())));
        }
    }
}

/// The step itself, in the child.
fn in_child(sock: BorrowedFd<'_>, userns: Option<&Maps>) -> io::Result<()> {
    let flags = match userns {
        Some(_) => libc::CLONE_NEWUSER | libc::CLONE_NEWNET,
        None => libc::CLONE_NEWNET,
    };
    // SAFETY: unshare(2) with integer flags.
    if unsafe { libc::unshare(flags) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if let Some(maps) = userns {
        crate::exec::spawn::map_ids_in_child(&maps.uid, &maps.gid)?;
    }
    loopback_up()?;
    let listener = listen()?;
    let sent = crate::exec::fds::send_fd(sock, listener.as_fd());
    drop(listener);
    sent
}

/// `struct ifreq` as SIOCGIFFLAGS/SIOCSIFFLAGS use it: the name, then the
/// flags in a union of 24 bytes.
#[repr(C)]
struct IfreqFlags {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// Brings the new namespace's `lo` up.
fn loopback_up() -> io::Result<()> {
    // SAFETY: a datagram socket, two ioctls on a local, correctly laid out
    // ifreq, and close; integers and a pointer valid for the calls.
    unsafe {
        let s = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if s < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut req = IfreqFlags {
            name: [0; libc::IFNAMSIZ],
            flags: 0,
            _pad: [0; 22],
        };
        req.name[..2].copy_from_slice(b"lo");
        let mut r = libc::ioctl(s, libc::SIOCGIFFLAGS, &mut req);
        if r == 0 {
            req.flags |= libc::IFF_UP as libc::c_short;
            r = libc::ioctl(s, libc::SIOCSIFFLAGS, &req);
        }
        let e = io::Error::last_os_error();
        libc::close(s);
        if r != 0 {
            return Err(e);
        }
    }
    Ok(())
}

/// A TCP listener on the namespace's 127.0.0.1:[`PORT`].
fn listen() -> io::Result<OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: socket, bind and listen with integers and a pointer to a
    // local sockaddr_in; the descriptor is owned from its creation.
    unsafe {
        let s = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if s < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = OwnedFd::from_raw_fd(s);
        let addr = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: PORT.to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(std::net::Ipv4Addr::LOCALHOST).to_be(),
            },
            sin_zero: [0; 8],
        };
        if libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        ) != 0
            || libc::listen(fd.as_raw_fd(), 1024) != 0
        {
            return Err(io::Error::last_os_error());
        }
        Ok(fd)
    }
}

/// The port the listener takes (the one in [`crate::LISTEN`]).
pub const PORT: u16 = 3128;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_port_is_the_one_the_variables_name() {
        assert!(crate::LISTEN.ends_with(&format!(":{PORT}")));
    }
}
