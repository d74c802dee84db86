//! Brokers: hull threads that answer a sandboxed command's system calls.
//!
//! Some calls cannot be decided by a seccomp filter, because what they act
//! on sits behind a pointer (a path, a socket address). The command's
//! filter stops them (`SECCOMP_RET_USER_NOTIF`) and a broker thread in hull
//! answers: it reads the call's arguments once from the command's memory,
//! resolves what they name itself, decides, and performs the call itself on
//! what it resolved, so changing the memory or the file system after the
//! check changes nothing.
//!
//! - [`metadata`]: chmod, chown, utimes and xattrs on the landlock tier
//!   when hull is not root (Landlock does not mediate them);
//! - [`watch`]: `inotify_add_watch` on the landlock tier (Landlock does not
//!   mediate it: a watch on a directory the command cannot list showed the
//!   names created in it);
//! - [`create`]: creating, removing and renaming entries directly in a
//!   writable directory the landlock tier split around protected paths
//!   (from a pool of spare inodes that carry rules of their own);
//! - [`connect`]: `connect` on the bwrap tier (a read-only bind mount does
//!   not stop a connect to a host service's socket under it).
//!
//! The filter is installed in the child before it execs, with a listener
//! the child sends over a socketpair ([`send_listener`]); the broker thread
//! serves until every filtered process is gone.

// A command can write the trees this module works on: no path-based
// filesystem call (clippy.toml).
#![deny(clippy::disallowed_methods)]

mod connect;
mod create;
mod metadata;
mod watch;

pub use create::{Creates, Split};
pub use metadata::Scope;

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Longest path read from the command (PATH_MAX).
const MAX_PATH: usize = 4096;

/// `fd` by path, through the calling thread's own table entry: a worker
/// that took the command's credentials may not open `/proc/self/fd` of hull
/// (root's), but always its own thread's.
fn proc_fd(fd: BorrowedFd<'_>) -> String {
    format!("/proc/thread-self/fd/{}", fd.as_raw_fd())
}

/// What a broker answers.
#[derive(Debug)]
pub enum Handler {
    /// The landlock tier: inotify watches, allowed inside `watch` (what
    /// the policy grants at all); metadata changes, allowed inside
    /// `metadata`'s writable roots. Watches run on workers, and so do
    /// metadata changes when hull is root (as the command).
    Landlock {
        watch: Scope,
        metadata: Scope,
        workers: Arc<Workers>,
        /// Creates in split directories (None: no directory was split, or
        /// no spares could be made, which the user was told).
        creates: Option<Arc<Creates>>,
        /// Connects to unix sockets, where the filter brokers them
        /// (Landlock ABI < 9): pathname sockets this scope allows.
        connect: Scope,
    },
    /// Connects, each on a worker (a connect may block until the peer
    /// accepts).
    Connect(Arc<Workers>),
}

/// Most calls answered on workers at once; beyond it a call fails with
/// EAGAIN.
const MAX_IN_FLIGHT: usize = 64;

/// The worker threads of one broker: one short-lived thread per call, which
/// may take the command's credentials (irreversibly: it ends after the
/// call).
#[derive(Debug)]
pub struct Workers {
    in_flight: AtomicUsize,
    /// Act as the command (hull is root): the kernel's permission checks
    /// and the credentials a peer sees are then the command's.
    as_command: bool,
}

impl Workers {
    pub fn new(as_command: bool) -> Arc<Workers> {
        Arc::new(Workers {
            in_flight: AtomicUsize::new(0),
            as_command,
        })
    }

    /// Answers `req` with `op` on a worker thread.
    fn answer(
        self: &Arc<Self>,
        listener: &Arc<OwnedFd>,
        req: libc::seccomp_notif,
        op: impl FnOnce(&Task<'_>, bool) -> std::io::Result<i64> + Send + 'static,
    ) {
        if self.in_flight.fetch_add(1, Ordering::AcqRel) >= MAX_IN_FLIGHT {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            respond(listener, req.id, Err(err(libc::EAGAIN)));
            return;
        }
        let (me, l) = (Arc::clone(self), Arc::clone(listener));
        let spawned = std::thread::Builder::new()
            .name("hull-broker-call".into())
            .spawn(move || {
                let result = Task::of(&l, &req).and_then(|t| op(&t, me.as_command));
                respond(&l, req.id, result);
                me.in_flight.fetch_sub(1, Ordering::AcqRel);
            });
        if spawned.is_err() {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            respond(listener, req.id, Err(err(libc::EAGAIN)));
        }
    }
}

/// The command's identity, from `/proc/TID/status` (hull's view).
struct Identity {
    uid: u32,
    gid: u32,
    groups: Vec<u32>,
}

#[allow(clippy::disallowed_methods)] // procfs: the kernel's, of a task the pending notification pins
fn identity(tid: i32) -> std::io::Result<Identity> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status"))?;
    let field = |name: &str| -> Option<Vec<u32>> {
        let line = status.lines().find_map(|l| l.strip_prefix(name))?;
        line.split_ascii_whitespace()
            .map(|v| v.parse().ok())
            .collect()
    };
    let effective = |v: Option<Vec<u32>>| v.and_then(|v| v.get(1).copied());
    Ok(Identity {
        uid: effective(field("Uid:")).ok_or_else(|| err(libc::ESRCH))?,
        gid: effective(field("Gid:")).ok_or_else(|| err(libc::ESRCH))?,
        groups: field("Groups:")
            .unwrap_or_default()
            .into_iter()
            .take(65536)
            .collect(),
    })
}

/// Takes `who`'s credentials on the calling thread only (raw system calls;
/// libc would change every thread of hull). Irreversible: only a worker
/// that ends after its call does this.
fn become_on_this_thread(who: &Identity) -> std::io::Result<()> {
    use rustix::process::{Gid, Uid};
    use rustix::thread::{set_thread_groups, set_thread_res_gid, set_thread_res_uid};
    let gids: Vec<Gid> = who.groups.iter().map(|g| Gid::from_raw(*g)).collect();
    set_thread_groups(&gids)?;
    let gid = Gid::from_raw(who.gid);
    set_thread_res_gid(gid, gid, gid)?;
    let uid = Uid::from_raw(who.uid);
    set_thread_res_uid(uid, uid, uid)?;
    Ok(())
}

/// The broker thread of one run; stopped (and joined) on drop.
#[derive(Debug)]
pub struct Broker {
    stop: Arc<AtomicBool>,
    /// The socket the listener arrives on, shut down on drop: a run that
    /// failed before its child started (a cgroup that could not be made)
    /// never sends one, and the thread must not wait for it forever.
    arrival: OwnedFd,
    thread: Option<JoinHandle<()>>,
}

impl Broker {
    /// Starts the thread: it waits on `sock` for the listener the child
    /// sends, then answers until every filtered process is gone.
    pub fn start(sock: OwnedFd, handler: Handler) -> std::io::Result<Broker> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let arrival = sock.try_clone()?;
        let thread = std::thread::Builder::new()
            .name("hull-broker".into())
            .spawn(move || {
                if let Some(listener) = crate::exec::fds::receive_fd(sock.as_fd()) {
                    drop(sock);
                    serve(&Arc::new(listener), &handler, &flag);
                }
            })?;
        Ok(Broker {
            stop,
            arrival,
            thread: Some(thread),
        })
    }
}

/// The child's half of a broker: installs the filter with a listener just
/// before the exec and sends the listener to the broker thread.
#[derive(Debug)]
pub struct Handoff {
    sock: OwnedFd,
    filter: crate::seccomp::Raw,
}

impl Broker {
    /// A broker for `handler`, and the handoff that installs `filter` in
    /// the child: register it last, after every other pre-exec step (it
    /// sets no_new_privs, and the filter then binds the exec'd program and
    /// everything it starts).
    pub fn with_handoff(
        handler: Handler,
        filter: crate::seccomp::Raw,
    ) -> std::io::Result<(Broker, Handoff)> {
        let (ours, theirs) = crate::exec::fds::descriptor_pair()?;
        let broker = Broker::start(ours, handler)?;
        Ok((
            broker,
            Handoff {
                sock: theirs,
                filter,
            },
        ))
    }
}

impl Handoff {
    /// Registers the child's step on `cmd`. The child's end of the socket
    /// closes at the exec (close-on-exec), the parent's when `cmd` drops.
    pub fn install(self, cmd: &mut impl crate::exec::spawn::PreExec) {
        use std::os::fd::AsFd;
        let Handoff { sock, filter } = self;
        // SAFETY: prctl, seccomp, sendmsg and close: raw, async-signal-safe
        // system calls on memory prepared before the fork.
        unsafe {
            cmd.pre_exec_step(Box::new(move || {
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let listener = filter.apply_with_listener_in_child();
                if listener < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let sent = send_listener(sock.as_fd(), BorrowedFd::borrow_raw(listener));
                libc::close(listener);
                sent
            }));
        }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = rustix::net::shutdown(&self.arrival, rustix::net::Shutdown::Both);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Sends `listener` over `sock` (the helper's side).
pub fn send_listener(sock: BorrowedFd<'_>, listener: BorrowedFd<'_>) -> std::io::Result<()> {
    crate::exec::fds::send_fd(sock, listener)
}

fn serve(listener: &Arc<OwnedFd>, handler: &Handler, stop: &AtomicBool) {
    loop {
        let mut pfd = libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd we own; 100 ms, so a stop is seen soon.
        let n = unsafe { libc::poll(&mut pfd, 1, 100) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        if n == 0 {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            continue;
        }
        if pfd.revents & libc::POLLIN != 0 {
            answer_one(listener, handler);
        } else if pfd.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
            // No process is left under the filter.
            return;
        }
    }
}

fn answer_one(listener: &Arc<OwnedFd>, handler: &Handler) {
    // SAFETY: an all-zero seccomp_notif is valid (plain integers), and the
    // kernel requires it zeroed.
    let mut req: libc::seccomp_notif = unsafe { std::mem::zeroed() };
    // SAFETY: the ioctl writes a seccomp_notif into `req`, which is one.
    let r = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_RECV,
            &mut req as *mut libc::seccomp_notif,
        )
    };
    if r != 0 {
        return; // the caller died before we read it (ENOENT)
    }
    match handler {
        Handler::Landlock {
            watch,
            metadata,
            workers,
            creates,
            connect,
        } => {
            let nr = req.data.nr as i64;
            if nr == libc::SYS_connect {
                let scope = connect.clone();
                workers.answer(listener, req, move |t, as_command| {
                    t.connect(&req, as_command, Some(&scope)).map(|()| 0)
                });
                return;
            }
            if nr == libc::SYS_inotify_add_watch {
                let scope = watch.clone();
                workers.answer(listener, req, move |t, as_command| {
                    t.watch(&req, &scope, as_command)
                });
                return;
            }
            if let Some(c) = creates.as_deref().filter(|_| create::is_create_call(nr)) {
                match Task::of(listener, &req).and_then(|t| t.create(&req, c)) {
                    Ok(create::Answer::Continue) => respond_continue(listener, req.id),
                    Ok(create::Answer::Value(v)) => respond(listener, req.id, Ok(v)),
                    Ok(create::Answer::Sent) => {}
                    Err(e) => respond(listener, req.id, Err(e)),
                }
                return;
            }
            if workers.as_command {
                // hull is root: the change is made on a worker with the
                // command's credentials, so the kernel's owner checks (on
                // the idmapped mounts the command sees) are the command's.
                let scope = metadata.clone();
                workers.answer(listener, req, move |t, as_command| {
                    t.metadata(&req, &scope, as_command).map(|()| 0)
                });
            } else {
                let result =
                    Task::of(listener, &req).and_then(|t| t.metadata(&req, metadata, false));
                respond(listener, req.id, result.map(|()| 0));
            }
        }
        Handler::Connect(workers) => workers.answer(listener, req, move |t, as_command| {
            t.connect(&req, as_command, None).map(|()| 0)
        }),
    }
}

/// Answers notification `id`: the call returns the value, or fails with
/// the error.
fn respond(listener: &OwnedFd, id: u64, result: std::io::Result<i64>) {
    let (val, errno) = match result {
        Ok(v) => (v, 0),
        Err(e) => (0, e.raw_os_error().unwrap_or(libc::EPERM)),
    };
    let mut resp = libc::seccomp_notif_resp {
        id,
        val,
        error: -errno,
        flags: 0,
    };
    // SAFETY: the ioctl reads a seccomp_notif_resp from `resp`, which is one.
    unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_SEND,
            &mut resp as *mut libc::seccomp_notif_resp,
        );
    }
}

/// Lets the kernel run notification `id`'s call itself. Only for calls
/// another mechanism still checks (Landlock): the arguments may have
/// changed since the broker read them.
fn respond_continue(listener: &OwnedFd, id: u64) {
    let mut resp = libc::seccomp_notif_resp {
        id,
        val: 0,
        error: 0,
        flags: libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE as u32,
    };
    // SAFETY: the ioctl reads a seccomp_notif_resp from `resp`, which is one.
    unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_SEND,
            &mut resp as *mut libc::seccomp_notif_resp,
        );
    }
}

/// The calling process, held still by its pending notification.
struct Task<'a> {
    listener: &'a OwnedFd,
    id: u64,
    /// The calling thread.
    pid: i32,
    /// Its process (thread group), opened when first needed.
    pidfd: std::cell::OnceCell<OwnedFd>,
}

fn err(errno: i32) -> std::io::Error {
    std::io::Error::from_raw_os_error(errno)
}

impl Task<'_> {
    /// The process behind notification `req`. The caller may be any
    /// thread; descriptors and memory belong to its process (thread group),
    /// which a pidfd must name.
    fn of<'a>(listener: &'a OwnedFd, req: &libc::seccomp_notif) -> std::io::Result<Task<'a>> {
        let task = Task {
            listener,
            id: req.id,
            pid: req.pid as i32,
            pidfd: std::cell::OnceCell::new(),
        };
        task.valid()?;
        Ok(task)
    }

    /// A pidfd of the calling thread's process, checked to be that process
    /// by the notification still pending after it was opened.
    fn pidfd(&self) -> std::io::Result<&OwnedFd> {
        if let Some(fd) = self.pidfd.get() {
            return Ok(fd);
        }
        let tgid = thread_group(self.pid)?;
        // SAFETY: pidfd_open with integer arguments; returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, tgid, 0 as libc::c_uint) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: the kernel just returned this descriptor to us.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        self.valid()?;
        Ok(self.pidfd.get_or_init(|| fd))
    }

    /// The notification is still pending: the pid is still that process.
    fn valid(&self) -> std::io::Result<()> {
        let mut id = self.id;
        // SAFETY: the ioctl reads a u64 from `id`.
        let r = unsafe {
            libc::ioctl(
                self.listener.as_raw_fd(),
                libc::SECCOMP_IOCTL_NOTIF_ID_VALID,
                &mut id as *mut u64,
            )
        };
        if r == 0 {
            Ok(())
        } else {
            Err(err(libc::ENOENT))
        }
    }

    /// Reads `len` bytes at `addr` of the process's memory.
    fn read(&self, addr: u64, len: usize) -> std::io::Result<Vec<u8>> {
        let mut buf = vec![0u8; len];
        let local = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: len,
        };
        let remote = libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: len,
        };
        // SAFETY: `local` describes `buf`, owned and `len` long; the kernel
        // reads the other process's memory, never ours beyond `buf`.
        let n = unsafe { libc::process_vm_readv(self.pid, &local, 1, &remote, 1, 0) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        buf.truncate(n as usize);
        Ok(buf)
    }

    /// Whether `file`, which hull resolved for the thread, lies on a mount
    /// of the thread's own mount namespace. When the command has one of
    /// its own (a `--cow` run as a user: the overlay over the project), a
    /// path hull resolved from its own root (an absolute link met on the
    /// way) would reach the host's mounts instead: the project below the
    /// overlay.
    fn in_view(&self, file: &OwnedFd) -> std::io::Result<bool> {
        use rustix::fs::{statx, AtFlags, StatxFlags};
        if mount_ns(&self.pid.to_string())? == own_mount_ns()? {
            return Ok(true);
        }
        let st = statx(file, "", AtFlags::EMPTY_PATH, StatxFlags::MNT_ID)?;
        if st.stx_mask & StatxFlags::MNT_ID.bits() == 0 {
            return Err(err(libc::ENOSYS));
        }
        let text = read_bounded(&format!("/proc/{}/mountinfo", self.pid), 4 << 20)?;
        Ok(crate::mountinfo::has_mount(&text, st.stx_mnt_id))
    }

    /// A descriptor of the process, duplicated into hull.
    fn fd(&self, n: RawFd) -> std::io::Result<OwnedFd> {
        // SAFETY: pidfd_getfd with integer arguments; returns a new fd or -1.
        let r = unsafe {
            libc::syscall(
                libc::SYS_pidfd_getfd,
                self.pidfd()?.as_raw_fd(),
                n,
                0 as libc::c_uint,
            )
        };
        if r < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: the kernel just returned this descriptor to us.
        Ok(unsafe { OwnedFd::from_raw_fd(r as RawFd) })
    }
}

/// The mount namespace of process `pid` (or `self`): its device and inode.
#[allow(clippy::disallowed_methods)] // procfs: the kernel's, of a task the pending notification pins
fn mount_ns(pid: &str) -> std::io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(format!("/proc/{pid}/ns/mnt"))?;
    Ok((m.dev(), m.ino()))
}

/// hull's own mount namespace, read once.
fn own_mount_ns() -> std::io::Result<(u64, u64)> {
    static OWN: std::sync::OnceLock<(u64, u64)> = std::sync::OnceLock::new();
    if let Some(ns) = OWN.get() {
        return Ok(*ns);
    }
    let ns = mount_ns("self")?;
    Ok(*OWN.get_or_init(|| ns))
}

/// The text of the file `path`, at most `max` bytes of it.
#[allow(clippy::disallowed_methods)] // procfs files of a pinned task only (its callers)
fn read_bounded(path: &str, max: u64) -> std::io::Result<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(max)
        .read_to_string(&mut text)?;
    Ok(text)
}

/// The thread group (process) of thread `tid`, from `/proc/TID/status`;
/// checked afterwards by the notification still being valid.
#[allow(clippy::disallowed_methods)] // procfs: the kernel's, of a task the pending notification pins
fn thread_group(tid: i32) -> std::io::Result<i32> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| err(libc::ESRCH))
}

#[cfg(test)]
// Tests build their trees by path.
#[allow(clippy::disallowed_methods)]
mod tests {
    use super::*;

    /// A run that fails before its child starts (a cgroup it may not make)
    /// drops the broker while hull still holds the child's end of the
    /// socket: the drop returns at once, it does not wait for a listener
    /// that never comes (hull hung there, as a non-root user).
    #[test]
    fn a_broker_whose_child_never_started_stops_when_dropped() {
        let (ours, theirs) = crate::exec::fds::descriptor_pair().unwrap();
        let broker = Broker::start(ours, Handler::Connect(Workers::new(false))).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            drop(broker);
            let _ = tx.send(());
        });
        assert!(
            rx.recv_timeout(std::time::Duration::from_secs(5)).is_ok(),
            "the broker's drop waited for a listener"
        );
        drop(theirs);
    }
}
