//! The descriptors a command starts with: exactly 0, 1 and 2 and the ones
//! hull passes on purpose, never one inherited from hull's caller.
//!
//! A descriptor reaches past every boundary a sandbox draws with paths: the
//! magic link `/proc/self/fd/N` of a directory hull's caller left open (a
//! shell's `3</root`, `flock DIR hull run ...`) opens anything below it,
//! whatever mounts or Landlock rules the command runs under. So hull marks
//! every inherited descriptor above 2 close-on-exec when it starts, and the
//! process tiers do it again in the child before exec, then clear the flag
//! on the descriptors they pass.
//!
//! Standard streams are the caller's on purpose, but a regular file, a
//! directory or a block device there can be reopened through the same magic
//! link, for writing too (the log a caller redirected stdout to, read back
//! from its start). [`Inheritable::of`] says which ones the command may get
//! as they are; the others are relayed through pipes (`exec::process`).

use std::io;
use std::os::fd::RawFd;

/// How many descriptors [`size_table`] makes room for: a landlock run holds
/// one per spare entry (320) while it binds their rules.
pub const TABLE_SLOTS: RawFd = 512;

/// Grows this process's descriptor table to hold `slots` descriptors, to be
/// called while the process has one thread. The kernel grows a table that
/// several threads share only after an RCU grace period (`expand_fdtable`),
/// once per doubling: 3-5 ms each on this kind of virtualized host, paid in
/// the middle of a run's start. Grown once here it never waits. Best effort:
/// nothing happens where the descriptor limit is lower.
#[cfg(target_os = "linux")]
pub fn size_table(slots: RawFd) {
    use std::os::fd::AsFd;
    let Ok(probe) = rustix::fs::open(
        "/",
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    ) else {
        return;
    };
    // F_DUPFD takes the lowest free slot at or above `slots - 1`: the
    // table is grown to hold it, then the copy goes.
    drop(rustix::io::fcntl_dupfd_cloexec(probe.as_fd(), slots - 1));
}

/// Marks every descriptor from `first` up close-on-exec. Async-signal-safe
/// (raw system calls, no allocation): usable between fork and exec.
pub fn cloexec_from(first: RawFd) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
        // SAFETY: close_range(2) with integer arguments; it only sets flags.
        let r = unsafe {
            libc::syscall(
                libc::SYS_close_range,
                first as libc::c_uint,
                libc::c_uint::MAX,
                CLOSE_RANGE_CLOEXEC,
            )
        };
        if r == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        // Kernels before 5.11 lack the flag (EINVAL) or the call (ENOSYS).
        if !matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOSYS)) {
            return Err(e);
        }
    }
    // One fcntl per possible descriptor, up to the soft limit.
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the local struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let end = lim.rlim_cur.min(1 << 20) as RawFd;
    for fd in first..end {
        // SAFETY: fcntl on an integer; EBADF for descriptors not open.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags >= 0 && flags & libc::FD_CLOEXEC == 0 {
                libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
            }
        }
    }
    Ok(())
}

/// Whether a standard stream of hull's may be handed to the command as it
/// is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inheritable {
    /// A pipe, a socket, a terminal or `/dev/null`: reopening it through
    /// `/proc/self/fd/N` reaches nothing the descriptor does not.
    Yes,
    /// A regular file, a directory, a block device or another device node:
    /// relay it through a pipe.
    No,
    /// Not open: the command gets it closed too.
    Closed,
}

impl Inheritable {
    pub fn of(fd: RawFd) -> Inheritable {
        // SAFETY: fstat into a zeroed local struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above; fd is an integer, EBADF when not open.
        if unsafe { libc::fstat(fd, &mut st) } != 0 {
            return Inheritable::Closed;
        }
        match st.st_mode & libc::S_IFMT {
            libc::S_IFIFO | libc::S_IFSOCK => Inheritable::Yes,
            // SAFETY: isatty on an integer.
            libc::S_IFCHR if unsafe { libc::isatty(fd) } == 1 => Inheritable::Yes,
            libc::S_IFCHR if is_dev_null(&st) => Inheritable::Yes,
            _ => Inheritable::No,
        }
    }
}

fn is_dev_null(st: &libc::stat) -> bool {
    let Ok(null) = std::fs::metadata("/dev/null") else {
        return false;
    };
    use std::os::unix::fs::MetadataExt;
    // dev_t is u64 on Linux, i32 on macOS.
    #[allow(clippy::unnecessary_cast)]
    let rdev = st.st_rdev as u64;
    null.rdev() == rdev
}

/// A connected pair of close-on-exec unix seqpacket sockets: one end for
/// hull, one for a child, to pass a descriptor over ([`send_fd`]).
#[cfg(target_os = "linux")]
pub fn descriptor_pair() -> io::Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)> {
    use rustix::net::{socketpair, AddressFamily, SocketFlags, SocketType};
    Ok(socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?)
}

/// Sends `fd` over the unix socket `sock`, with one byte of data.
/// Async-signal-safe (a raw sendmsg on a stack buffer): usable between
/// fork and exec.
#[cfg(target_os = "linux")]
pub fn send_fd(
    sock: std::os::fd::BorrowedFd<'_>,
    fd: std::os::fd::BorrowedFd<'_>,
) -> io::Result<()> {
    use rustix::net::{sendmsg, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let fds = [fd];
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut anc = SendAncillaryBuffer::new(&mut space);
    anc.push(SendAncillaryMessage::ScmRights(&fds));
    let byte = [b'L'];
    sendmsg(
        sock,
        &[io::IoSlice::new(&byte)],
        &mut anc,
        SendFlags::empty(),
    )?;
    Ok(())
}

/// Waits for a descriptor sent over `sock` ([`send_fd`]); None when the
/// other side closed without sending one.
#[cfg(target_os = "linux")]
pub fn receive_fd(sock: std::os::fd::BorrowedFd<'_>) -> Option<std::os::fd::OwnedFd> {
    loop {
        match receive_fd_with(sock, rustix::net::RecvFlags::empty()) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => return r.ok().flatten(),
        }
    }
}

/// [`receive_fd`] without waiting: `WouldBlock` when nothing was sent yet.
#[cfg(target_os = "linux")]
pub fn try_receive_fd(
    sock: std::os::fd::BorrowedFd<'_>,
) -> io::Result<Option<std::os::fd::OwnedFd>> {
    receive_fd_with(sock, rustix::net::RecvFlags::DONTWAIT)
}

#[cfg(target_os = "linux")]
fn receive_fd_with(
    sock: std::os::fd::BorrowedFd<'_>,
    flags: rustix::net::RecvFlags,
) -> io::Result<Option<std::os::fd::OwnedFd>> {
    use rustix::net::{recvmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut anc = RecvAncillaryBuffer::new(&mut space);
    let mut byte = [0u8; 1];
    recvmsg(
        sock,
        &mut [io::IoSliceMut::new(&mut byte)],
        &mut anc,
        RecvFlags::CMSG_CLOEXEC | flags,
    )?;
    let mut out = None;
    for msg in anc.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = msg {
            for fd in fds {
                out.get_or_insert(fd);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    /// The kernel's own count of this process's descriptor slots.
    #[cfg(target_os = "linux")]
    fn fd_slots() -> usize {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("FDSize:")).unwrap();
        line["FDSize:".len()..].trim().parse().unwrap()
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_descriptor_table_is_sized_once_and_left_empty() {
        // In a child of its own: this test process may have grown its
        // table already.
        let exe = std::env::current_exe().unwrap();
        if std::env::var_os("FDS_TEST_CHILD_SIZES_TABLE").is_some() {
            let before = fd_slots();
            size_table(TABLE_SLOTS);
            let after = fd_slots();
            // Nothing left open: the next descriptor is a low one.
            let next = std::fs::File::open("/dev/null").unwrap().as_raw_fd();
            println!("slots {before} -> {after}, next {next}");
            assert!(before < TABLE_SLOTS as usize, "{before}");
            assert!(after >= TABLE_SLOTS as usize, "{after}");
            assert!(next < 64, "{next}");
            return;
        }
        let out = std::process::Command::new(exe)
            .args([
                "--exact",
                "exec::fds::tests::the_descriptor_table_is_sized_once_and_left_empty",
                "--nocapture",
            ])
            .env("FDS_TEST_CHILD_SIZES_TABLE", "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains("slots "), "the child ran no check: {text}");
    }

    #[test]
    fn streams_are_classified() {
        let (r, w) = rustix::pipe::pipe().unwrap();
        assert_eq!(Inheritable::of(r.as_raw_fd()), Inheritable::Yes);
        assert_eq!(Inheritable::of(w.as_raw_fd()), Inheritable::Yes);
        let null = std::fs::File::open("/dev/null").unwrap();
        assert_eq!(Inheritable::of(null.as_raw_fd()), Inheritable::Yes);
        let file = tempfile::tempfile().unwrap();
        assert_eq!(Inheritable::of(file.as_raw_fd()), Inheritable::No);
        let dir = std::fs::File::open("/").unwrap();
        assert_eq!(Inheritable::of(dir.as_raw_fd()), Inheritable::No);
        let zero = std::fs::File::open("/dev/zero").unwrap();
        assert_eq!(Inheritable::of(zero.as_raw_fd()), Inheritable::No);
        assert_eq!(Inheritable::of(10_000), Inheritable::Closed);
    }
}
