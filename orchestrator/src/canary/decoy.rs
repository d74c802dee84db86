//! The canary's decoy: a home, a project and a directory outside every
//! grant, made for one canary and removed after it, plus the host things the
//! probes aim at (listeners, victim processes, a SysV segment).
//!
//! Everything in it is readable by any local user (the secret is random and
//! worthless): when hull runs as root the command runs as the sandbox user,
//! and the decoy must not lean on the caller's file modes, or a denial would
//! prove the modes and not the tier. The one exception is the root-only file,
//! which is the point of its probe.

use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::tier::Tier;

/// A host sysctl the kernel-knob probe writes (harmless: how many kernel
/// messages pass before rate limiting), put back after every run.
pub const SYSCTL: &str = "/proc/sys/kernel/printk_ratelimit_burst";
/// A host device node the device probe changes the mode of, put back after
/// every run.
pub const DEVICE: &str = "/dev/full";

/// What the project looks like for a probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setup {
    /// A git repository with hooks, config targets, a nested repository, a
    /// read-only grant inside and links planted out of it.
    Project,
    /// No `.git` and no `.hull`: the protections must hold for names that
    /// do not exist yet.
    Bare,
}

#[derive(Debug)]
pub struct Decoy {
    pub root: PathBuf,
    pub home: PathBuf,
    pub project: PathBuf,
    pub outside: PathBuf,
    /// Granted read-only by the canary's policy.
    pub shared: PathBuf,
    pub policy: PathBuf,
    pub secret: String,
    pub listener_port: u16,
    pub connections: Arc<AtomicUsize>,
    /// Stream connections and datagrams that reached the host's unix
    /// sockets (a pathname stream, a pathname datagram and an abstract
    /// stream socket).
    pub unix_arrivals: Arc<AtomicUsize>,
    /// The host's abstract socket's name (without the leading NUL).
    pub abstract_name: String,
    /// The port of a host vsock listener (None: this host has no vsock),
    /// and what reached it.
    pub vsock_port: Option<u32>,
    pub vsock_arrivals: Arc<AtomicUsize>,
    pub shm: Option<Shm>,
    /// Host processes the probes try to reach: one as the control's command
    /// runs, one as the tiers' command runs. Restarted by every reset.
    victims: Mutex<[Option<Victim>; 2]>,
    /// The host settings as they were, read under the probe's host lock
    /// (another canary's control may have one changed until it lets go)
    /// and put back after every run.
    host: Mutex<Host>,
}

#[derive(Debug)]
struct Victim {
    child: Child,
    /// Its open-files limit when it started, as /proc shows it.
    nofile: String,
}

fn mode(p: &Path, m: u32) -> std::io::Result<()> {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(m))
}

fn write(p: &Path, text: &str, m: u32) -> std::io::Result<()> {
    std::fs::write(p, text)?;
    mode(p, m)
}

/// Counts what `next` receives (true: one more arrived; false: stop), on
/// a thread of its own, into `n`.
fn count(n: &Arc<AtomicUsize>, mut next: impl FnMut() -> bool + Send + 'static) {
    let seen = Arc::clone(n);
    std::thread::spawn(move || {
        while next() {
            seen.fetch_add(1, Ordering::AcqRel);
        }
    });
}

impl Decoy {
    pub fn new() -> std::io::Result<Decoy> {
        // Short: tier 3's sockets live in the runs dir below it, and a unix
        // socket path has 107 bytes.
        let id = uuid::Uuid::new_v4().simple().to_string();
        let root = std::env::temp_dir().join(format!("hull-canary-{}", &id[..12]));
        std::fs::create_dir(&root)?;
        let d = Decoy::fill(root.clone());
        if d.is_err() {
            let _ = crate::runtime::remove_tree(&root);
        }
        d
    }

    fn fill(root: PathBuf) -> std::io::Result<Decoy> {
        mode(&root, 0o755)?;
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let listener_port = listener.local_addr()?.port();
        let connections = Arc::new(AtomicUsize::new(0));
        count(&connections, move || listener.accept().is_ok());
        let shared = root.join("shared");
        std::fs::create_dir(&shared)?;
        let stream = std::os::unix::net::UnixListener::bind(shared.join("host.sock"))?;
        let unix_arrivals = Arc::new(AtomicUsize::new(0));
        count(&unix_arrivals, move || stream.accept().is_ok());
        let dgram = std::os::unix::net::UnixDatagram::bind(shared.join("host.dgram"))?;
        count(&unix_arrivals, move || dgram.recv(&mut [0u8; 64]).is_ok());
        for s in ["host.sock", "host.dgram"] {
            // Writable by anyone: what stops the command must be hull.
            mode(&shared.join(s), 0o666)?;
        }
        // An abstract socket: no file to guard it, only the namespace (bwrap's
        // network namespace, the VM's kernel) or the connect's broker.
        let abstract_name = format!(
            "hull-canary-{}",
            root.file_name()
                .map(|n| n.to_string_lossy())
                .unwrap_or_default()
        );
        #[cfg(target_os = "linux")]
        {
            use std::os::linux::net::SocketAddrExt;
            let addr =
                std::os::unix::net::SocketAddr::from_abstract_name(abstract_name.as_bytes())?;
            let abs = std::os::unix::net::UnixListener::bind_addr(&addr)?;
            count(&unix_arrivals, move || abs.accept().is_ok());
        }
        let vsock_arrivals = Arc::new(AtomicUsize::new(0));
        let vsock_port = vsock::listen(&vsock_arrivals);
        let project = root.join("project");
        let policy = root.join("canary.toml");
        let text = crate::policy::profiles::PROFILES
            .iter()
            .find(|(n, _)| *n == "default")
            .map(|(_, t)| *t)
            .unwrap_or_default()
            .replacen(
                "read = [",
                &format!(
                    "read = [\"{}\", \"{}\", ",
                    shared.display(),
                    project.join("vendor/ro").display()
                ),
                1,
            );
        std::fs::write(&policy, text)?;
        let d = Decoy {
            home: root.join("home"),
            project,
            outside: root.join("outside"),
            shared,
            policy,
            secret: format!("canary-secret-{}", uuid::Uuid::new_v4().simple()),
            root,
            listener_port,
            connections,
            unix_arrivals,
            abstract_name,
            vsock_port,
            vsock_arrivals,
            shm: Shm::new(),
            victims: Mutex::new([None, None]),
            host: Mutex::new(Host::default()),
        };
        d.reset(Setup::Project)?;
        Ok(d)
    }

    /// Puts every area back as it was made, and starts the victims afresh.
    pub fn reset(&self, setup: Setup) -> std::io::Result<()> {
        let drop = self.root.join("drop");
        for dir in [&self.home, &self.project, &self.outside, &drop] {
            crate::runtime::remove_tree(dir)?;
        }
        // Anyone may write here: what the sandbox user's processes write
        // before a boundary is seen (`helper_environment`).
        std::fs::create_dir(&drop)?;
        mode(&drop, 0o1777)?;
        for dir in [&self.home, &self.home.join(".ssh"), &self.outside] {
            std::fs::create_dir(dir)?;
            mode(dir, 0o755)?;
        }
        let s = format!("{}\n", self.secret);
        write(&self.outside.join("secret.txt"), &s, 0o644)?;
        write(&self.outside.join("key"), &s, 0o644)?;
        write(&self.home.join(".ssh/id_canary"), &s, 0o644)?;
        write(&self.shared.join("root-only.txt"), &s, 0o600)?;
        write(&self.shared.join("public.txt"), "public-data\n", 0o644)?;
        // The granted directory itself is readable by anyone; one file in
        // it is the owner's alone.
        mode(&self.shared, 0o755)?;
        self.make_project(setup)?;
        self.connections.store(0, Ordering::Release);
        self.unix_arrivals.store(0, Ordering::Release);
        self.vsock_arrivals.store(0, Ordering::Release);
        if let Some(shm) = &self.shm {
            shm.set(SHM_DATA);
        }
        self.restart_victims()
    }

    fn make_project(&self, setup: Setup) -> std::io::Result<()> {
        let p = &self.project;
        for d in ["src", "vendor/ro", "vendor/nested/.git", ".githooks"] {
            std::fs::create_dir_all(p.join(d))?;
        }
        let s = format!("{}\n", self.secret);
        std::fs::write(p.join("input.txt"), &s)?;
        std::fs::write(p.join("vendor/ro/code.txt"), "vendored\n")?;
        std::fs::write(p.join("vendor/nested/.git/HEAD"), "ref: refs/heads/main\n")?;
        std::fs::write(
            p.join("vendor/nested/.git/config"),
            "[core]\n\tbare = false\n",
        )?;
        std::fs::write(p.join(".githooks/pre-commit"), "#!/bin/sh\nexit 0\n")?;
        std::fs::write(p.join("shared.gitconfig"), "[user]\n\tname = canary\n")?;
        std::os::unix::fs::symlink(self.outside.join("secret.txt"), p.join("src/link"))?;
        std::os::unix::fs::symlink(&self.outside, p.join("src/dirlink"))?;
        if setup == Setup::Project {
            std::fs::create_dir_all(p.join(".git/refs/heads"))?;
            std::fs::create_dir_all(p.join(".git/objects"))?;
            std::fs::create_dir_all(p.join(".hull"))?;
            std::fs::write(p.join(".git/HEAD"), "ref: refs/heads/main\n")?;
            std::fs::write(
                p.join(".git/config"),
                "[core]\n\tbare = false\n\thooksPath = .githooks\n\
                 [include]\n\tpath = ../shared.gitconfig\n",
            )?;
        }
        Ok(())
    }

    fn restart_victims(&self) -> std::io::Result<()> {
        let mut v = self.victims.lock().unwrap_or_else(|e| e.into_inner());
        for (i, slot) in v.iter_mut().enumerate() {
            if let Some(mut old) = slot.take() {
                let _ = old.child.kill();
                let _ = old.child.wait();
            }
            let child = victim_command(i == 0, &self.secret, &self.outside)?.spawn()?;
            let nofile = nofile_limit(child.id()).unwrap_or_default();
            *slot = Some(Victim { child, nofile });
        }
        Ok(())
    }

    /// The pid of the host process a command of `tier` may try to reach.
    pub fn victim_pid(&self, tier: Tier) -> u32 {
        let v = self.victims.lock().unwrap_or_else(|e| e.into_inner());
        v[slot(tier)].as_ref().map_or(0, |v| v.child.id())
    }

    /// What happened to a victim, if anything (each run starts with both
    /// afresh, so either one touched is this run's doing).
    pub fn victim_touched(&self) -> Option<String> {
        let mut v = self.victims.lock().unwrap_or_else(|e| e.into_inner());
        v.iter_mut().flatten().find_map(|v| {
            if matches!(v.child.try_wait(), Ok(Some(_))) {
                return Some("a host process was killed".into());
            }
            let now = nofile_limit(v.child.id())?;
            (now != v.nofile).then(|| format!("a host process's limit is now: {now}"))
        })
    }

    /// Reads the host setting `locked` ([`SYSCTL`] or [`DEVICE`]) as it
    /// is: called with the probe's lock on it held. Only that one is put
    /// back: another canary may be changing the other under its own lock.
    pub fn remember_host(&self, locked: &str) {
        *self.host.lock().unwrap_or_else(|e| e.into_inner()) = Host {
            sysctl: (locked == SYSCTL)
                .then(|| std::fs::read_to_string(SYSCTL).ok())
                .flatten(),
            device_mode: (locked == DEVICE).then(device_mode_now).flatten(),
        };
    }

    pub fn forget_host(&self) {
        *self.host.lock().unwrap_or_else(|e| e.into_inner()) = Host::default();
    }

    fn host(&self) -> Host {
        self.host.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Puts the host settings the probes aim at back as they were.
    pub fn restore_host(&self) {
        let was = self.host();
        if let Some(v) = &was.sysctl {
            if std::fs::read_to_string(SYSCTL).ok().as_ref() != Some(v) {
                let _ = std::fs::write(SYSCTL, v);
            }
        }
        if let Some(m) = was.device_mode {
            if device_mode_now() != Some(m) {
                let _ = mode(Path::new(DEVICE), m);
            }
        }
    }

    /// The sysctl's value when it differs from the one remembered.
    pub fn sysctl_changed(&self) -> Option<String> {
        let now = std::fs::read_to_string(SYSCTL).ok()?;
        let was = self.host().sysctl;
        (Some(&now) != was.as_ref()).then(|| {
            format!(
                "the host's {SYSCTL} is now {} (was {})",
                now.trim(),
                was.as_deref().unwrap_or("").trim()
            )
        })
    }

    pub fn sysctl_value(&self) -> u64 {
        self.host()
            .sysctl
            .as_deref()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    pub fn device_changed(&self) -> Option<String> {
        let now = device_mode_now()?;
        (Some(now) != self.host().device_mode)
            .then(|| format!("the host's {DEVICE} has mode {now:o} now"))
    }
}

/// Host settings a probe's control changes on purpose.
#[derive(Debug, Clone, Default)]
struct Host {
    sysctl: Option<String>,
    device_mode: Option<u32>,
}

fn device_mode_now() -> Option<u32> {
    std::fs::metadata(DEVICE)
        .ok()
        .map(|m| m.permissions().mode() & 0o7777)
}

impl Drop for Decoy {
    fn drop(&mut self) {
        let mut v = self.victims.lock().unwrap_or_else(|e| e.into_inner());
        for old in v.iter_mut().filter_map(Option::take) {
            let mut c = old.child;
            let _ = c.kill();
            let _ = c.wait();
        }
        drop(v);
        self.restore_host();
        let _ = crate::runtime::remove_tree(&self.root);
    }
}

fn slot(tier: Tier) -> usize {
    usize::from(tier != Tier::None)
}

/// A `sleep` on the host as the uid a command of the control (`control`)
/// or of a tier runs as: when hull is root, the control's command is root
/// without capabilities and a tier's is the sandbox user. It carries the
/// secret in its environment and works in `cwd` (where the secret is).
fn victim_command(control: bool, secret: &str, cwd: &Path) -> std::io::Result<Command> {
    const SETPRIV: &str = "/usr/bin/setpriv";
    let root = crate::sandbox_user::hull_is_root();
    let setpriv = root && Path::new(SETPRIV).exists();
    let mut c = Command::new(if setpriv { SETPRIV } else { "sleep" });
    // Works in `cwd` (where the secret is: what `other_run_cwd` reaches
    // through /proc), entered as root when hull is root: the sandbox user
    // may not search the way there (a private TMPDIR), and a process's cwd
    // is reached through /proc whatever the way.
    c.current_dir(cwd);
    if root && !control {
        let ids = crate::sandbox_user::lookup("hull canary")
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::NotFound, e))?;
        if setpriv {
            c.arg(format!("--reuid={}", ids.uid))
                .arg(format!("--regid={}", ids.gid))
                .arg("--clear-groups");
        } else {
            c.uid(ids.uid).gid(ids.gid).current_dir("/");
        }
    }
    if setpriv {
        c.args(["--inh-caps=-all", "--bounding-set=-all", "sleep"]);
    }
    c.arg("600")
        .env("HULL_CANARY_VICTIM", secret)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    Ok(c)
}

fn nofile_limit(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/limits"))
        .ok()?
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
}

pub const SHM_DATA: &[u8; 9] = b"host-data";

/// A host SysV shared memory segment, mode 0666 (only the tier stands in
/// the way), the canary's own and removed with it.
#[derive(Debug)]
pub struct Shm {
    pub key: i32,
    id: i32,
    mem: *mut libc::c_void,
}

// SAFETY: the mapping is process-wide; every access is a bounded copy of
// 9 bytes, and the decoy is dropped once.
unsafe impl Send for Shm {}
// SAFETY: as above; concurrent copies race only on the canary's own data.
unsafe impl Sync for Shm {}

impl Shm {
    fn new() -> Option<Shm> {
        for _ in 0..8 {
            let key = (uuid::Uuid::new_v4().as_u128() as i32) & 0x7fff_fff0 | 1;
            // SAFETY: plain SysV call; the segment is ours and removed on drop.
            let id = unsafe { libc::shmget(key, 4096, libc::IPC_CREAT | libc::IPC_EXCL | 0o666) };
            if id < 0 {
                continue;
            }
            // SAFETY: attach the segment we made; checked against (void*)-1.
            let mem = unsafe { libc::shmat(id, std::ptr::null(), 0) };
            if mem as isize == -1 {
                // SAFETY: remove the segment we made.
                unsafe { libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut()) };
                return None;
            }
            return Some(Shm { key, id, mem });
        }
        None
    }

    pub fn get(&self) -> [u8; 9] {
        let mut b = [0u8; 9];
        // SAFETY: the segment is 4096 bytes and attached until drop.
        unsafe { std::ptr::copy_nonoverlapping(self.mem as *const u8, b.as_mut_ptr(), 9) };
        b
    }

    fn set(&self, v: &[u8; 9]) {
        // SAFETY: as above, 9 bytes within the segment.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), self.mem as *mut u8, 9) };
    }
}

impl Drop for Shm {
    fn drop(&mut self) {
        // SAFETY: detach and remove our own segment.
        unsafe {
            libc::shmdt(self.mem);
            libc::shmctl(self.id, libc::IPC_RMID, std::ptr::null_mut());
        }
    }
}

/// A host vsock listener: a command that reaches it (CID 1, the host's
/// own) reached the host's vsock space.
#[cfg(target_os = "linux")]
mod vsock {
    use std::os::fd::{AsRawFd, OwnedFd};
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    use rustix::net::{AddressFamily, SocketFlags, SocketType};

    fn socket(flags: SocketFlags) -> Option<OwnedFd> {
        rustix::net::socket_with(AddressFamily::VSOCK, SocketType::STREAM, flags, None).ok()
    }

    /// A vsock address (rustix has none for this family).
    fn addr(cid: u32, port: u32) -> libc::sockaddr_vm {
        // SAFETY: sockaddr_vm is plain data; all-zero is a valid value.
        let mut a: libc::sockaddr_vm = unsafe { std::mem::zeroed() };
        a.svm_family = libc::AF_VSOCK as libc::sa_family_t;
        a.svm_cid = cid;
        a.svm_port = port;
        a
    }

    const ADDR_LEN: libc::socklen_t = std::mem::size_of::<libc::sockaddr_vm>() as libc::socklen_t;

    pub fn listen(arrivals: &Arc<AtomicUsize>) -> Option<u32> {
        let fd = socket(SocketFlags::CLOEXEC)?;
        let mut a = addr(libc::VMADDR_CID_ANY, libc::VMADDR_PORT_ANY);
        let mut len = ADDR_LEN;
        let p = &mut a as *mut libc::sockaddr_vm as *mut libc::sockaddr;
        // SAFETY: p and len describe `a`, which outlives the calls.
        let bound = unsafe {
            libc::bind(fd.as_raw_fd(), p, len) == 0
                && libc::getsockname(fd.as_raw_fd(), p, &mut len) == 0
        };
        if !bound || rustix::net::listen(&fd, 8).is_err() {
            return None;
        }
        // Reachable from here at all (a host without vsock_loopback or a
        // VM device has a vsock space nothing can connect within)?
        if !reachable(a.svm_port) {
            return None;
        }
        super::count(arrivals, move || {
            rustix::net::accept_with(&fd, SocketFlags::CLOEXEC).is_ok()
        });
        Some(a.svm_port)
    }

    /// Whether a connection to `port` on this host's own CID (1) is
    /// accepted by the kernel before the listener's thread runs.
    fn reachable(port: u32) -> bool {
        let Some(fd) = socket(SocketFlags::CLOEXEC | SocketFlags::NONBLOCK) else {
            return false;
        };
        let a = addr(libc::VMADDR_CID_LOCAL, port);
        let p = &a as *const libc::sockaddr_vm as *const libc::sockaddr;
        // SAFETY: p and ADDR_LEN describe `a`.
        if unsafe { libc::connect(fd.as_raw_fd(), p, ADDR_LEN) } == 0 {
            return true;
        }
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINPROGRESS) {
            return false;
        }
        let mut pfd = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLOUT,
            revents: 0,
        };
        // SAFETY: one pollfd, a 500 ms limit.
        let n = unsafe { libc::poll(&mut pfd, 1, 500) };
        n == 1 && matches!(rustix::net::sockopt::socket_error(&fd), Ok(Ok(())))
    }
}

#[cfg(not(target_os = "linux"))]
mod vsock {
    pub fn listen(_: &std::sync::Arc<std::sync::atomic::AtomicUsize>) -> Option<u32> {
        None
    }
}
