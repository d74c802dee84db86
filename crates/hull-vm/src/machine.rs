//! Starting and stopping one VM for one hull instance.
//!
//! The order is fixed: check every input (image files, tools, socket path
//! lengths), start one virtiofsd per share and wait until each listens, start
//! QEMU (it connects to the virtiofsd sockets as it starts, and listens on
//! the agent and QMP sockets), negotiate QMP, then (on request) connect to
//! the agent's virtio-serial socket and wait for its hello while watching
//! that QEMU still runs. Every failure names its step and the console log.
//!
//! What this protects against: helpers outliving the instance (every process
//! is a [`Supervised`] child: PDEATHSIG, killed on drop, pid file for stale
//! cleanup), a VM that hangs at boot (every wait has a deadline), and a
//! half-started VM being used (any error tears down what was started).
//!
//! What it does not: choose what to share (see
//! [`policy::lower::vm`](crate::policy::lower::vm)) or talk to the agent
//! beyond the hello (see [`super::agent`]).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::agent::{AgentError, AgentSession};
use super::image::{agent_disk, GuestImage};
use super::proc::{self, Supervised};
use super::qemu::{
    Accel, Arch, ArgvError, Disk, DiskFormat, FsShare, Incoming, MachineConfig, MemBackend,
};
use super::qmp::{Qmp, QmpError};
use super::virtiofsd::{Virtiofsd, VirtiofsdError, VirtiofsdSpec};

/// The files a VM boots from. [`BootImage::from_image`] reads a built image
/// directory (`vmlinux`, `initrd.cpio`, `disk.raw`) and its agent disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootImage {
    pub kernel: PathBuf,
    pub initrd: Option<PathBuf>,
    pub disks: Vec<Disk>,
    /// Kernel parameters after `console=... panic=-1`.
    pub cmdline: String,
}

impl BootImage {
    /// A built guest image: the root disk is attached copy-on-write
    /// (`snapshot=on`), so no run changes the image, and the agent disk
    /// read-only after it (`/dev/vdb`).
    pub fn from_image(img: &GuestImage) -> Result<BootImage, MachineError> {
        let dir = &img.dir;
        let need = |name: &str| -> Result<PathBuf, MachineError> {
            let p = dir.join(name);
            if p.is_file() {
                Ok(p)
            } else {
                Err(MachineErrorKind::ImageIncomplete {
                    dir: dir.to_path_buf(),
                    missing: name.to_string(),
                }
                .into())
            }
        };
        Ok(BootImage {
            kernel: need("vmlinux")?,
            initrd: Some(need("initrd.cpio")?),
            disks: vec![
                Disk {
                    path: need("disk.raw")?,
                    format: DiskFormat::Raw,
                    readonly: false,
                    snapshot: true,
                },
                Disk {
                    path: need(&agent_disk::file_name(&img.agent.sha256))?,
                    format: DiskFormat::Raw,
                    readonly: true,
                    snapshot: false,
                },
            ],
            cmdline: "root=/dev/vda quiet".into(),
        })
    }
}

/// External programs a VM needs, found once.
#[derive(Debug, Clone)]
pub struct Tools {
    pub qemu: PathBuf,
    pub qemu_version: String,
    /// QEMU was built with `-sandbox` (seccomp).
    pub sandbox: bool,
    pub virtiofsd: Option<PathBuf>,
}

impl Tools {
    pub fn find() -> Result<Tools, MachineError> {
        let arch = Arch::host();
        let qemu = super::qemu::find_qemu(arch).ok_or(MachineErrorKind::ToolMissing {
            tool: arch.qemu_binary(),
            hint: "install QEMU 9 or later (Debian: apt-get install -t bookworm-backports qemu-system-x86; scripts/setup.sh --tier3)",
        })?;
        let facts = crate::qemu_facts::of(&qemu);
        let qemu_version = facts.version.unwrap_or_else(|| "unknown".into());
        let sandbox = facts.sandbox;
        Ok(Tools {
            qemu,
            qemu_version,
            sandbox,
            virtiofsd: super::virtiofsd::find_virtiofsd(),
        })
    }
}

/// Everything one VM is started with.
#[derive(Debug, Clone)]
pub struct MachineSpec {
    /// Shown in `ps`; also the QEMU `-name`.
    pub name: String,
    /// Sockets and pid files go here (the instance or VM state dir).
    pub dir: PathBuf,
    /// The console, QEMU and virtiofsd logs go here: a dir that outlives a
    /// failed run, so the error's console log path still exists.
    pub log_dir: PathBuf,
    pub image: BootImage,
    pub accel: Accel,
    pub memory_mib: u32,
    pub cpus: u32,
    /// One virtiofsd each; their sockets must be in `dir`.
    pub shares: Vec<VirtiofsdSpec>,
    pub incoming: Option<Incoming>,
    /// The user QEMU becomes once it has opened what it needs, before the
    /// guest runs (`-run-with user=`): a VM that runs untrusted code never
    /// keeps root's identity.
    pub run_as: Option<String>,
}

impl MachineSpec {
    pub fn agent_socket(&self) -> PathBuf {
        self.dir.join("agent.sock")
    }
    pub fn qmp_socket(&self) -> PathBuf {
        self.dir.join("qmp.sock")
    }
    /// The network channel's port (`hull_protocol::netmux`).
    pub fn net_socket(&self) -> PathBuf {
        self.dir.join("net.sock")
    }
    pub fn console_log(&self) -> PathBuf {
        self.log_dir.join("console.log")
    }
    /// The socket a share's virtiofsd listens on.
    pub fn share_socket(dir: &Path, tag: &str) -> PathBuf {
        dir.join(format!("vfs-{tag}.sock"))
    }

    /// The QEMU configuration for this spec.
    pub fn qemu_config(&self, sandbox: bool) -> MachineConfig {
        MachineConfig {
            name: self.name.clone(),
            arch: Arch::host(),
            accel: self.accel,
            mem_backend: crate::os::Os::current()
                .map(MemBackend::for_host)
                .unwrap_or(MemBackend::Private),
            memory_mib: self.memory_mib,
            cpus: self.cpus,
            kernel: self.image.kernel.clone(),
            initrd: self.image.initrd.clone(),
            cmdline: self.image.cmdline.clone(),
            disks: self.image.disks.clone(),
            shares: self
                .shares
                .iter()
                .map(|s| FsShare {
                    tag: s.tag.clone(),
                    socket: s.socket.clone(),
                })
                .collect(),
            agent_socket: self.agent_socket(),
            net_socket: self.net_socket(),
            qmp_socket: self.qmp_socket(),
            sandbox,
            incoming: self.incoming.clone(),
            run_as: self.run_as.clone(),
        }
    }
}

/// A step of bringing a VM up, for error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Prepare,
    Virtiofsd(String),
    Qemu,
    Qmp,
    Agent,
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Step::Prepare => f.write_str("preparing the instance dir"),
            Step::Virtiofsd(t) => write!(f, "starting virtiofsd for share {t}"),
            Step::Qemu => f.write_str("starting QEMU"),
            Step::Qmp => f.write_str("connecting to QMP"),
            Step::Agent => f.write_str("waiting for the guest agent"),
        }
    }
}

/// Why a VM could not be started (boxed: errors are rare, results are many).
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct MachineError(Box<MachineErrorKind>);

impl MachineError {
    pub fn kind(&self) -> &MachineErrorKind {
        &self.0
    }
}

impl<E: Into<MachineErrorKind>> From<E> for MachineError {
    fn from(e: E) -> Self {
        MachineError(Box::new(e.into()))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MachineErrorKind {
    #[error("tier vm: {tool} not found; {hint}")]
    ToolMissing {
        tool: &'static str,
        hint: &'static str,
    },
    #[error("tier vm: the guest image in {dir} is incomplete ({missing} missing); rebuild it with `hull image build`")]
    ImageIncomplete { dir: PathBuf, missing: String },
    #[error("tier vm: {what} {path} does not exist")]
    Missing { what: &'static str, path: PathBuf },
    #[error("tier vm: socket path {path} is longer than the {max} bytes a unix socket allows; use a shorter runs dir (HULL_RUNS_DIR)")]
    SocketPath { path: PathBuf, max: usize },
    #[error("tier vm: {0}")]
    Argv(#[from] ArgvError),
    #[error("tier vm: {step}: {source}\n  console log: {console}")]
    Io {
        step: Step,
        console: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{source}\n  console log: {console}")]
    Virtiofsd {
        console: PathBuf,
        #[source]
        source: VirtiofsdError,
    },
    #[error("tier vm: {step}: {source}\n  console log: {console}{tail}")]
    Qmp {
        step: Step,
        console: PathBuf,
        tail: String,
        #[source]
        source: QmpError,
    },
    #[error("tier vm: {step}: QEMU exited ({status}): {stderr}\n  console log: {console}{tail}")]
    QemuExited {
        step: Step,
        status: String,
        stderr: String,
        console: PathBuf,
        tail: String,
    },
    #[error("tier vm: {step}: {source}\n  console log: {console}{tail}")]
    Agent {
        step: Step,
        console: PathBuf,
        tail: String,
        #[source]
        source: AgentError,
    },
}

/// The longest unix socket path (sun_path without its NUL).
pub const MAX_SOCKET_PATH: usize = 107;
/// How long QEMU may take to create its QMP socket and answer.
const QMP_DEADLINE: Duration = Duration::from_secs(20);
/// The most of the guest's console kept per VM (a boot writes tens of KiB).
pub const MAX_CONSOLE_LOG: u64 = 4 << 20;
/// The most of QEMU's own messages kept per VM.
const MAX_QEMU_LOG: u64 = 1 << 20;

/// A running VM. Dropping it kills QEMU and every virtiofsd.
#[derive(Debug)]
pub struct Machine {
    pub name: String,
    dir: PathBuf,
    console_log: PathBuf,
    qemu_log: PathBuf,
    agent_socket: PathBuf,
    net_socket: PathBuf,
    // Field order is drop order: QEMU goes before the file servers.
    qmp: Option<Qmp>,
    qemu: Supervised,
    vfs: Vec<Virtiofsd>,
    stalls: Stalls,
}

/// When each helper was first seen stopped, checked at most every
/// [`STALL_CHECK`] (it reads `/proc`).
#[derive(Debug, Default)]
struct Stalls {
    checked: Option<Instant>,
    /// By helper: 0 is QEMU, 1.. the file servers in order.
    since: std::collections::HashMap<usize, Instant>,
}

/// How long a helper may stay stopped (SIGSTOP, a job-control stop) before
/// the VM counts as stalled.
pub const STALL_LIMIT: Duration = Duration::from_secs(3);
const STALL_CHECK: Duration = Duration::from_millis(250);

fn console_tail(console: &Path) -> String {
    let t = proc::log_tail(console, 1500);
    if t.is_empty() {
        String::new()
    } else {
        let lines: Vec<&str> = t.lines().collect();
        let last = &lines[lines.len().saturating_sub(12)..];
        format!("\n  last console lines:\n    {}", last.join("\n    "))
    }
}

impl Machine {
    /// Brings the VM up to the point where QMP answers (the guest boots on).
    pub fn start(spec: &MachineSpec, tools: &Tools) -> Result<Machine, MachineError> {
        let console = spec.console_log();
        let io_err = |step: Step| {
            let console = console.clone();
            move |source| MachineErrorKind::Io {
                step,
                console,
                source,
            }
        };
        for (what, p) in [("guest kernel", &spec.image.kernel)]
            .into_iter()
            .chain(spec.image.initrd.iter().map(|p| ("guest initrd", p)))
            .chain(spec.image.disks.iter().map(|d| ("guest disk", &d.path)))
        {
            if !p.is_file() {
                return Err(MachineErrorKind::Missing {
                    what,
                    path: p.clone(),
                }
                .into());
            }
        }
        let mut sockets = vec![spec.agent_socket(), spec.net_socket(), spec.qmp_socket()];
        sockets.extend(spec.shares.iter().map(|s| s.socket.clone()));
        for s in &sockets {
            if s.as_os_str().len() > MAX_SOCKET_PATH {
                return Err(MachineErrorKind::SocketPath {
                    path: s.clone(),
                    max: MAX_SOCKET_PATH,
                }
                .into());
            }
            let _ = fs::remove_file(s);
        }
        let config = spec.qemu_config(tools.sandbox);
        let argv = config.argv()?;
        fs::create_dir_all(&spec.dir).map_err(io_err(Step::Prepare))?;
        fs::create_dir_all(&spec.log_dir).map_err(io_err(Step::Prepare))?;
        // A fresh console log per boot, written by hull (capped).
        let console_file = fs::File::create(&console).map_err(io_err(Step::Prepare))?;

        let mut vfs = Vec::new();
        if !spec.shares.is_empty() {
            let bin = tools.virtiofsd.as_ref().ok_or(MachineErrorKind::ToolMissing {
                tool: "virtiofsd",
                hint: "install it (cargo install virtiofsd --version 1.14.0 --locked, needs libseccomp-dev libcap-ng-dev; scripts/setup.sh --tier3)",
            })?;
            vfs = Virtiofsd::start_all(bin, &spec.shares, &spec.dir, &spec.log_dir).map_err(
                |source| MachineErrorKind::Virtiofsd {
                    console: console.clone(),
                    source,
                },
            )?;
        }

        let qemu_log = spec.log_dir.join("qemu.log");
        let log = fs::File::create(&qemu_log).map_err(io_err(Step::Qemu))?;
        let mut cmd = Command::new(&tools.qemu);
        // stdout is the guest's console (`-chardev stdio`), stderr QEMU's
        // own messages; both reach their logs through hull, capped.
        cmd.args(&argv)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env_clear()
            // `snapshot=on` overlays live (and die) with the instance.
            .env("TMPDIR", &spec.dir);
        proc::tie_to_parent(&mut cmd);
        // A guest that took QEMU over reaches no run's processes.
        #[cfg(target_os = "linux")]
        crate::exec::domain::confine(&mut cmd, "tier vm: QEMU");
        let mut qemu =
            Supervised::spawn(cmd, "qemu", &spec.dir).map_err(|e| MachineErrorKind::Io {
                step: Step::Qemu,
                console: console.clone(),
                source: io::Error::other(e.to_string()),
            })?;
        for (out, file, cap, name) in [
            (
                qemu.take_stdout()
                    .map(|o| Box::new(o) as Box<dyn io::Read + Send>),
                console_file,
                MAX_CONSOLE_LOG,
                "qemu-console",
            ),
            (
                qemu.take_stderr()
                    .map(|e| Box::new(e) as Box<dyn io::Read + Send>),
                log,
                MAX_QEMU_LOG,
                "qemu-log",
            ),
        ] {
            if let Some(out) = out {
                proc::capped_log(out, file, cap, name).map_err(io_err(Step::Qemu))?;
            }
        }
        if spec.run_as.is_some() {
            // Its switch of user clears the PDEATHSIG tie_to_parent set.
            qemu.watch_parent().map_err(io_err(Step::Qemu))?;
        }
        let mut m = Machine {
            name: spec.name.clone(),
            dir: spec.dir.clone(),
            console_log: console.clone(),
            qemu_log,
            agent_socket: spec.agent_socket(),
            net_socket: spec.net_socket(),
            qmp: None,
            qemu,
            vfs,
            stalls: Stalls::default(),
        };
        // Wait for the QMP socket while QEMU lives (a bad option ends it at once).
        let qmp_end = Instant::now() + QMP_DEADLINE;
        while !spec.qmp_socket().exists() && Instant::now() < qmp_end {
            if m.qemu.try_wait().is_some() {
                if let Some(e) = m.exited_error(Step::Qemu) {
                    return Err(e);
                }
            }
            // QEMU makes it about 0.1 s after it starts: a short tick.
            std::thread::sleep(Duration::from_millis(2));
        }
        match Qmp::connect(
            &spec.qmp_socket(),
            qmp_end
                .saturating_duration_since(Instant::now())
                .max(Duration::from_secs(1)),
        ) {
            Ok(q) => m.qmp = Some(q),
            Err(source) => {
                if let Some(e) = m.exited_error(Step::Qemu) {
                    return Err(e);
                }
                return Err(MachineErrorKind::Qmp {
                    step: Step::Qmp,
                    tail: console_tail(&console),
                    console,
                    source,
                }
                .into());
            }
        }
        Ok(m)
    }

    /// If QEMU has exited (or exits within a moment: a closed socket often
    /// comes first), the error that says so, with its stderr.
    fn exited_error(&mut self, step: Step) -> Option<MachineError> {
        let status = self.qemu.wait_timeout(Duration::from_secs(2))?;
        Some(
            MachineErrorKind::QemuExited {
                step,
                status: status.to_string(),
                stderr: proc::log_tail(&self.qemu_log, 2000),
                console: self.console_log.clone(),
                tail: console_tail(&self.console_log),
            }
            .into(),
        )
    }

    /// Connects to the agent and waits up to `deadline` for its hello.
    pub fn connect_agent(&mut self, deadline: Duration) -> Result<AgentSession, MachineError> {
        self.connect_agent_until(deadline, &|| false)
    }

    /// [`Machine::connect_agent`], giving up early when `cancelled()` says so.
    pub fn connect_agent_until(
        &mut self,
        deadline: Duration,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<AgentSession, MachineError> {
        let console = self.console_log.clone();
        let mut session = match AgentSession::connect(&self.agent_socket, Duration::from_secs(10)) {
            Ok(s) => s,
            Err(source) => {
                return Err(self.exited_error(Step::Agent).unwrap_or_else(|| {
                    MachineErrorKind::Agent {
                        step: Step::Agent,
                        tail: console_tail(&console),
                        console,
                        source,
                    }
                    .into()
                }))
            }
        };
        let qemu = &mut self.qemu;
        let r = session.hello(deadline, &mut || !cancelled() && qemu.try_wait().is_none());
        if r.is_err() && cancelled() {
            return Err(MachineErrorKind::Agent {
                step: Step::Agent,
                tail: String::new(),
                console,
                source: AgentError::Cancelled,
            }
            .into());
        }
        match r {
            Ok(_) => Ok(session),
            Err(source) => Err(self.exited_error(Step::Agent).unwrap_or_else(|| {
                MachineErrorKind::Agent {
                    step: Step::Agent,
                    tail: console_tail(&console),
                    console,
                    source,
                }
                .into()
            })),
        }
    }

    /// Connects to the network channel's port (QEMU listens; one
    /// connection per VM). The guest's end answers only after a
    /// `Configure` that asks for the network.
    pub fn connect_net(&self) -> io::Result<std::os::unix::net::UnixStream> {
        std::os::unix::net::UnixStream::connect(&self.net_socket)
    }

    /// The QMP session (None after QEMU went away).
    pub fn qmp(&mut self) -> Option<&mut Qmp> {
        self.qmp.as_mut()
    }

    pub fn console_log(&self) -> &Path {
        &self.console_log
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn qemu_pid(&self) -> u32 {
        self.qemu.pid()
    }

    /// The pids of the virtiofsd processes, by tag.
    pub fn virtiofsd_pids(&self) -> Vec<(String, u32)> {
        self.vfs
            .iter()
            .map(|v| (v.spec.tag.clone(), v.pid()))
            .collect()
    }

    /// The sandbox each virtiofsd actually uses.
    pub fn virtiofsd_sandboxes(&self) -> Vec<(String, super::virtiofsd::SandboxMode)> {
        self.vfs
            .iter()
            .map(|v| (v.spec.tag.clone(), v.sandbox_used))
            .collect()
    }

    /// True while QEMU runs.
    pub fn is_running(&mut self) -> bool {
        self.qemu.try_wait().is_none()
    }

    /// The first helper of this VM that has died, or has been stopped for
    /// [`STALL_LIMIT`], if one has: QEMU, or the virtiofsd of a share (a
    /// dead or stopped file server leaves the guest's I/O on that share
    /// waiting forever).
    pub fn failed_helper(&mut self) -> Option<HelperFault> {
        let vfs_name = |v: &Virtiofsd| {
            format!(
                "the virtiofsd of {} (share {})",
                v.spec.shared_dir.display(),
                v.spec.tag
            )
        };
        if let Some(status) = self.qemu.try_wait() {
            return Some(HelperFault {
                name: "QEMU".into(),
                fault: Fault::Exited(status.to_string()),
                log: self.qemu_log.clone(),
            });
        }
        for v in &mut self.vfs {
            if let Some(status) = v.try_wait() {
                return Some(HelperFault {
                    name: vfs_name(v),
                    fault: Fault::Exited(status.to_string()),
                    log: v.log.clone(),
                });
            }
        }
        let now = Instant::now();
        if self
            .stalls
            .checked
            .is_some_and(|t| now.duration_since(t) < STALL_CHECK)
        {
            return None;
        }
        self.stalls.checked = Some(now);
        let mut stopped = vec![self.qemu.is_stopped()];
        stopped.extend(self.vfs.iter_mut().map(|v| v.is_stopped()));
        for (i, is) in stopped.into_iter().enumerate() {
            if !is {
                self.stalls.since.remove(&i);
                continue;
            }
            let since = *self.stalls.since.entry(i).or_insert(now);
            let d = now.duration_since(since);
            if d < STALL_LIMIT {
                continue;
            }
            let (name, log) = match i.checked_sub(1).and_then(|j| self.vfs.get(j)) {
                None => ("QEMU".to_string(), self.qemu_log.clone()),
                Some(v) => (vfs_name(v), v.log.clone()),
            };
            return Some(HelperFault {
                name,
                fault: Fault::Stopped(d),
                log,
            });
        }
        None
    }

    /// Waits up to `d` for QEMU to exit by itself (guest poweroff or panic).
    pub fn wait_exit(&mut self, d: Duration) -> Option<std::process::ExitStatus> {
        self.qemu.wait_timeout(d)
    }

    /// Clean stop: the agent's `Shutdown` (if given) and up to `grace` for
    /// the guest to sync and power off; else QMP `quit`, up to `grace` for
    /// QEMU to exit, then SIGKILL; then the file servers.
    pub fn shutdown(self, agent: Option<&mut AgentSession>, grace: Duration) {
        self.shutdown_unless(agent, grace, &|| false)
    }

    /// [`Machine::shutdown`] that kills the VM at once when `cancelled()`
    /// says so while it waits (a Ctrl-C ends a run within 2 s).
    pub fn shutdown_unless(
        mut self,
        agent: Option<&mut AgentSession>,
        grace: Duration,
        cancelled: &dyn Fn() -> bool,
    ) {
        let start = Instant::now();
        // QEMU's exit, waited for in slices; false when cancelled or late.
        let exited_within = |qemu: &mut Supervised, d: Duration| {
            let end = Instant::now() + d;
            loop {
                if qemu.try_wait().is_some() {
                    return true;
                }
                let left = end.saturating_duration_since(Instant::now());
                if cancelled() || left.is_zero() {
                    return false;
                }
                qemu.sleep_while_alive(left.min(Duration::from_millis(20)));
            }
        };
        // The guest syncs and powers off by itself after the agent's
        // Shutdown: wait for that, so what its page cache still holds (a file
        // written through mmap on a share) reaches the host before the VM goes.
        let powered_off = agent.is_some_and(|a| {
            a.shutdown();
            let done = exited_within(&mut self.qemu, grace);
            if !done && !cancelled() {
                tracing::warn!(
                    "tier vm: the guest did not power off within {grace:?}; quitting QEMU"
                );
            }
            done
        });
        if !powered_off {
            if !cancelled() {
                if let Some(q) = self.qmp.as_mut() {
                    if q.quit().is_err() {
                        tracing::debug!("tier vm: QMP quit failed; killing QEMU");
                    }
                }
            }
            if !exited_within(&mut self.qemu, grace.saturating_sub(start.elapsed())) {
                self.qemu.kill();
            }
        }
        self.qmp = None;
        for v in self.vfs.drain(..) {
            v.stop();
        }
    }

    /// Immediate stop: SIGKILL to QEMU and every virtiofsd.
    pub fn kill(mut self) {
        self.kill_now();
    }

    /// [`Machine::kill`] for an owner that keeps the (dead) machine.
    pub fn kill_now(&mut self) {
        self.qmp = None;
        self.qemu.kill();
        self.vfs.clear();
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        self.qmp = None;
        self.qemu.kill();
        self.vfs.clear();
        for s in [&self.agent_socket, &self.net_socket] {
            let _ = fs::remove_file(s);
        }
        let _ = fs::remove_file(self.dir.join("qmp.sock"));
    }
}

/// A helper process of a VM that died or stalled under it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelperFault {
    /// "QEMU", or "the virtiofsd of DIR (share TAG)".
    pub name: String,
    pub fault: Fault,
    pub log: PathBuf,
}

/// What happened to a helper.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// It ended, with this status as the OS reports it ("signal: 9 (SIGKILL)").
    Exited(String),
    /// It (or its worker) has been stopped by a signal for this long.
    Stopped(Duration),
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::Exited(status) => write!(f, "exited ({status})"),
            Fault::Stopped(d) => write!(
                f,
                "has been stopped by a signal (state T) for {:.1} s",
                d.as_secs_f64()
            ),
        }
    }
}

/// What a stale-instance cleanup did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StaleCleanup {
    /// Helper processes (QEMU, virtiofsd) still running and killed.
    pub killed: Vec<(PathBuf, u32)>,
}

/// Cleans what a crashed hull's VM left in `dir`: kills helpers recorded in
/// pid files that still run (pid, start time and program must match), and
/// removes the sockets (placeholders of protected paths stay, as after any
/// run). Call only for a dir whose `.active` lock is free.
pub fn cleanup_stale(dir: &Path) -> io::Result<StaleCleanup> {
    let mut out = StaleCleanup::default();
    for s in proc::kill_stale(dir)? {
        if s.killed {
            if let Some(r) = &s.record {
                out.killed.push((r.program.clone(), r.pid));
            }
        }
    }
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.filter_map(|e| e.ok()) {
            if e.path().extension().is_some_and(|x| x == "sock") {
                let _ = fs::remove_file(e.path());
            }
        }
    }
    Ok(out)
}
