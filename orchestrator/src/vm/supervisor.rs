//! VMs that stay up: `hull vm up|status|down` and `hull run --tier3 --vm NAME`.
//!
//! `hull vm up --name N` starts a detached supervisor (`hull vm __serve`) that
//! owns the VM for its whole life: it holds an exclusive lock on
//! `<vms>/N/.active`, starts virtiofsd and QEMU as its own children (so they
//! die with it), sets up the container once, and then relays agent sessions
//! from `<vms>/N/ctl.sock` to the one virtio-serial connection, mapping each
//! client's exec ids to ids of its own so clients can neither see nor touch
//! each other's commands. It shuts the VM down after an idle time with no
//! client and no running command, on `hull vm down` (SIGTERM, after checking
//! the pid's start time and program), or when the VM dies.
//!
//! What this protects against: clients confusing the relay (only host-side
//! frame kinds are accepted from clients, ids are checked, a client that
//! breaks the protocol is dropped and its commands killed), a guest confusing
//! it (only guest-side kinds are relayed; anything else stops the VM), and
//! runs reaching shares they did not ask for (a run's policy must lower to
//! the shares the VM was started with, or it is refused).
//!
//! What it does not: give each run a fresh container. State in the
//! container persists between runs of the same VM by design; a run that
//! needs a clean container uses a fresh VM (no `--vm`).

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hull_protocol::client::{check_peer_hello, hello_message};
use hull_protocol::{ErrorCode, FrameReader, FrameWriter, Message, Role};
use serde::{Deserialize, Serialize};

use crate::exec::{CommandSpec, ExitStatus, OutputSink};
use crate::policy::lower::vm::{self as lower_vm, ShareOrigin, VmLowerError, VmPlan};
use crate::policy::{Policy, PolicyError};
use crate::vm::agent::{AgentError, AgentSession, ExecOptions};
use crate::vm::heartbeat::{Beat, Heartbeat, SILENCE_LIMIT};
use crate::vm::machine::{Machine, MachineError, Tools};
use crate::vm::proc::PidRecord;

/// Idle time after which a VM with no client and no command stops.
pub const DEFAULT_IDLE: Duration = Duration::from_secs(30 * 60);
const MAX_CLIENTS: usize = 32;
const MAX_EXECS: usize = 64;
const MAX_STATE_FILE: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    #[error(
        "hull vm: name {0:?} is not 1-32 characters of [a-z0-9-] starting with a letter or digit"
    )]
    BadName(String),
    #[error("hull vm: VM {name} is already up (supervisor pid {pid}); `hull vm down --name {name}` first")]
    AlreadyUp { name: String, pid: u32 },
    #[error("hull vm: no VM named {name} is up; start it with `hull vm up --name {name}`")]
    NotUp { name: String },
    #[error("hull vm: VM {name} is {state}, not ready{detail}")]
    NotReady {
        name: String,
        state: Phase,
        detail: String,
    },
    #[error("hull vm: {what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("hull vm: the supervisor of VM {name} exited before the VM was ready ({status}); log {log}:\n{tail}")]
    StartFailed {
        name: String,
        status: String,
        log: PathBuf,
        tail: String,
    },
    #[error("hull vm: VM {name} failed to start: {error}\n  log: {log}")]
    Failed {
        name: String,
        error: String,
        log: PathBuf,
    },
    #[error("hull vm: VM {name} was not ready within {secs}s; log {log}:\n{tail}")]
    Timeout {
        name: String,
        secs: u64,
        log: PathBuf,
        tail: String,
    },
    #[error(
        "tier vm: VM {name} was started with other shares than this run needs; refusing.\n  \
         VM {name}: {vm}\n  this run: {run}\n  start a VM for this project and policy: \
         hull vm up --name OTHER --project P --policy X"
    )]
    Mismatch {
        name: String,
        vm: String,
        run: String,
    },
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error(transparent)]
    Lower(#[from] VmLowerError),
    #[error(transparent)]
    Machine(#[from] MachineError),
    #[error(transparent)]
    Session(#[from] crate::vm::session::SessionError),
    #[error("{source}\n  console log: {console}")]
    Agent {
        console: PathBuf,
        #[source]
        source: AgentError,
    },
    #[error("hull vm: {0}")]
    Other(String),
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> SupervisorError {
    let path = path.to_path_buf();
    move |source| SupervisorError::Io { what, path, source }
}

/// What the supervisor records in `<vms>/NAME/vm.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmState {
    pub name: String,
    /// The supervisor process.
    pub pid: u32,
    pub start_time: Option<u64>,
    pub program: PathBuf,
    pub project: PathBuf,
    pub policy: String,
    pub idle_secs: u64,
    pub state: Phase,
    pub error: Option<String>,
    /// The VM's own tmp and spill (shared as the instance dirs of its runs).
    pub tmp: PathBuf,
    pub spill: PathBuf,
    /// The shares other than tmp/spill, as [`fingerprint`] lines.
    pub shares: Vec<String>,
    pub accel: String,
    pub started_unix: u64,
    pub console: PathBuf,
}

/// Where a kept VM is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Booting,
    Ready,
    /// It never became ready, or a fault ended it (`error` says which).
    Failed,
    /// Stopped on request or when idle.
    Down,
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(match self {
            Phase::Booting => "booting",
            Phase::Ready => "ready",
            Phase::Failed => "failed",
            Phase::Down => "down",
        })
    }
}

/// Options of `hull vm up`.
#[derive(Debug, Clone)]
pub struct UpOptions {
    pub name: String,
    pub project: PathBuf,
    pub policy: String,
    pub idle: Duration,
}

/// One line of `hull vm status`.
#[derive(Debug, Clone, Serialize)]
pub struct VmStatus {
    pub name: String,
    pub up: bool,
    pub state: Option<VmState>,
}

/// Where persistent VMs live: next to the runs dir (`/tmp/hull-vms`).
pub fn vms_root() -> PathBuf {
    crate::vm::supervisor_root()
}

pub fn validate_name(name: &str) -> Result<(), SupervisorError> {
    let ok = (1..=32).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(SupervisorError::BadName(name.to_string()))
    }
}

pub fn vm_dir(name: &str) -> Result<PathBuf, SupervisorError> {
    validate_name(name)?;
    Ok(checked_vms_root()?.join(name))
}

/// The VMs root, created private when missing and refused when another
/// user owns it or could write it (a directory pre-created in /tmp could
/// hold planted pid files and symlinks that hull, as root, would act on).
fn checked_vms_root() -> Result<PathBuf, SupervisorError> {
    let root = vms_root();
    crate::runtime::instance::private_root(&root).map_err(|e| match e {
        crate::runtime::instance::PrivateRootError::Io { what, source } => {
            io_err(what, &root)(source)
        }
        crate::runtime::instance::PrivateRootError::Insecure(reason) => {
            SupervisorError::Other(format!(
                "hull vm: the VMs directory {} is not safe to use: {reason}; set HULL_VMS_DIR to a private directory",
                root.display()
            ))
        }
    })
}

/// The shares of a plan that identify what a VM exposes (not its own tmp/spill).
pub fn fingerprint(plan: &VmPlan) -> Vec<String> {
    let mut v: Vec<String> = plan
        .shares
        .iter()
        .filter(|s| s.origin == ShareOrigin::Policy)
        .map(|s| {
            let masks: Vec<String> = s
                .masks
                .iter()
                .map(|m| format!("{:?}:{}", m.protection, m.path.display()))
                .collect();
            format!(
                "{} {}{} [{}]",
                if s.readonly { "ro" } else { "rw" },
                s.host_path.display(),
                if s.exec { "" } else { " noexec" },
                masks.join(" ")
            )
        })
        .collect();
    v.push(format!(
        "limits memory={:?} cpus={:?} processes={:?}",
        plan.limits.memory_bytes, plan.limits.cpus, plan.limits.processes
    ));
    v.sort();
    v
}

fn read_state(dir: &Path) -> Option<VmState> {
    use std::io::Read;
    let f = fs::File::open(dir.join("vm.json")).ok()?;
    let mut b = Vec::new();
    f.take(MAX_STATE_FILE).read_to_end(&mut b).ok()?;
    serde_json::from_slice(&b).ok()
}

fn write_state(dir: &Path, s: &VmState) -> Result<(), SupervisorError> {
    let p = dir.join("vm.json");
    let tmp = dir.join("vm.json.tmp");
    let text = serde_json::to_vec_pretty(s).map_err(|e| SupervisorError::Other(e.to_string()))?;
    fs::write(&tmp, text).map_err(io_err("write", &tmp))?;
    fs::rename(&tmp, &p).map_err(io_err("write", &p))
}

/// Is the supervisor's lock held (the VM is up)?
fn lock_held(dir: &Path) -> bool {
    let Ok(f) = fs::File::open(dir.join(".active")) else {
        return false;
    };
    match rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockShared) {
        Ok(()) => false,
        Err(_) => true,
    }
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// `hull vm up`: starts the supervisor `exe vm __serve ...` detached and
/// waits until the VM is ready (or failed), at most `ready_within` (default:
/// the accelerator's boot and setup deadlines plus a minute); past it the
/// supervisor is killed, and its VM with it (PDEATHSIG).
pub fn up(
    exe: &Path,
    o: &UpOptions,
    ready_within: Option<Duration>,
) -> Result<VmState, SupervisorError> {
    use std::os::unix::process::CommandExt;
    let dir = vm_dir(&o.name)?;
    fs::create_dir_all(&dir).map_err(io_err("create", &dir))?;
    set_private(&dir)?;
    if lock_held(&dir) {
        let pid = read_state(&dir).map(|s| s.pid).unwrap_or(0);
        return Err(SupervisorError::AlreadyUp {
            name: o.name.clone(),
            pid,
        });
    }
    // Whatever a crashed supervisor left behind.
    let _ = crate::vm::machine::cleanup_stale(&dir.join("m"));
    let _ = fs::remove_file(dir.join("vm.json"));
    let log = dir.join("supervisor.log");
    let logf = fs::File::create(&log).map_err(io_err("create", &log))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("vm")
        .arg("__serve")
        .arg("--name")
        .arg(&o.name)
        .arg("--project")
        .arg(&o.project)
        .arg("--policy")
        .arg(&o.policy)
        .arg("--idle-secs")
        .arg(o.idle.as_secs().to_string())
        .stdin(std::process::Stdio::null())
        .stdout(logf.try_clone().map_err(io_err("create", &log))?)
        .stderr(logf);
    // SAFETY: setsid(2) in the child before exec; async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(io_err("start the supervisor", exe))?;
    let deadline = ready_within.unwrap_or_else(|| {
        let accel = crate::vm::accel::probe_accel().accel;
        let (boot, setup) = crate::vm::assemble::deadlines(accel);
        boot + setup + Duration::from_secs(60)
    });
    let end = Instant::now() + deadline;
    loop {
        if let Some(s) = read_state(&dir) {
            match s.state {
                Phase::Ready => return Ok(s),
                Phase::Failed => {
                    let _ = child.wait();
                    return Err(SupervisorError::Failed {
                        name: o.name.clone(),
                        error: s.error.unwrap_or_default(),
                        log,
                    });
                }
                Phase::Booting | Phase::Down => {}
            }
        }
        if let Ok(Some(st)) = child.try_wait() {
            return Err(SupervisorError::StartFailed {
                name: o.name.clone(),
                status: st.to_string(),
                tail: crate::vm::proc::log_tail(&log, 3000),
                log,
            });
        }
        if Instant::now() >= end {
            let _ = child.kill();
            let _ = child.wait();
            return Err(SupervisorError::Timeout {
                name: o.name.clone(),
                secs: deadline.as_secs(),
                tail: crate::vm::proc::log_tail(&log, 3000),
                log,
            });
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn set_private(dir: &Path) -> Result<(), SupervisorError> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(io_err("chmod", dir))
}

/// `hull vm status`: every known VM and whether its supervisor runs.
/// Dirs of dead supervisors are cleaned (helpers killed, sockets removed).
pub fn status() -> Result<Vec<VmStatus>, SupervisorError> {
    let root = checked_vms_root()?;
    let mut out = Vec::new();
    let rd = match fs::read_dir(&root) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(io_err("list", &root)(e)),
    };
    for e in rd.filter_map(|e| e.ok()) {
        let name = e.file_name().to_string_lossy().into_owned();
        if validate_name(&name).is_err() {
            continue;
        }
        let dir = e.path();
        let up = lock_held(&dir);
        if !up {
            let _ = crate::vm::machine::cleanup_stale(&dir.join("m"));
        }
        out.push(VmStatus {
            name,
            up,
            state: read_state(&dir),
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// `hull vm down`: stops the VM's supervisor (which shuts the VM down
/// cleanly), killing it when it is not gone after `grace`. Returns false
/// when it was not up.
pub fn down(name: &str, grace: Duration) -> Result<bool, SupervisorError> {
    let dir = vm_dir(name)?;
    if !lock_held(&dir) {
        let _ = crate::vm::machine::cleanup_stale(&dir.join("m"));
        return Ok(false);
    }
    let s = read_state(&dir).ok_or_else(|| {
        SupervisorError::Other(format!(
            "VM {name} is up but {} is unreadable",
            dir.join("vm.json").display()
        ))
    })?;
    let rec = PidRecord {
        pid: s.pid,
        start_time: s.start_time,
        program: s.program.clone(),
    };
    if !rec.is_alive() {
        return Err(SupervisorError::Other(format!(
            "VM {name}: the recorded supervisor pid {} is not the process holding the lock; not signalling it",
            s.pid
        )));
    }
    // SAFETY: kill(2) on the process identified by pid, start time and program.
    unsafe {
        libc::kill(s.pid as libc::pid_t, libc::SIGTERM);
    }
    let end = Instant::now() + grace;
    while lock_held(&dir) {
        if Instant::now() >= end {
            if rec.is_alive() {
                // SAFETY: as above.
                unsafe {
                    libc::kill(s.pid as libc::pid_t, libc::SIGKILL);
                }
            }
            std::thread::sleep(Duration::from_millis(500));
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // The lock goes a moment before the process: wait for it to end too.
    let end = Instant::now() + Duration::from_secs(10);
    while rec.is_alive() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = crate::vm::machine::cleanup_stale(&dir.join("m"));
    Ok(true)
}

/// Runs a command in VM `name` (`hull run --tier3 --vm NAME`).
pub fn run_in(
    name: &str,
    policy: &Policy,
    plan: &VmPlan,
    spec: &CommandSpec,
    sink: &mut dyn OutputSink,
    irq: Arc<AtomicI32>,
) -> Result<ExitStatus, SupervisorError> {
    let dir = vm_dir(name)?;
    if !lock_held(&dir) {
        // A VM a fault ended says so, with the fault.
        return Err(match read_state(&dir) {
            Some(VmState {
                state: Phase::Failed,
                error: Some(e),
                ..
            }) => SupervisorError::NotReady {
                name: name.into(),
                state: Phase::Failed,
                detail: format!(": {e}"),
            },
            _ => SupervisorError::NotUp { name: name.into() },
        });
    }
    let st = read_state(&dir).ok_or_else(|| SupervisorError::NotUp { name: name.into() })?;
    if st.state != Phase::Ready {
        return Err(SupervisorError::NotReady {
            name: name.into(),
            state: st.state,
            detail: st.error.map(|e| format!(": {e}")).unwrap_or_default(),
        });
    }
    let want = fingerprint(plan);
    if want != st.shares {
        return Err(SupervisorError::Mismatch {
            name: name.into(),
            vm: st.shares.join("; "),
            run: want.join("; "),
        });
    }
    let mut cmd = spec.clone();
    cmd.env = rebase_env(
        &spec.env,
        &policy.vars.tmp,
        &st.tmp,
        &policy.vars.spill,
        &st.spill,
    );
    let ctl = dir.join("ctl.sock");
    let agent_err = |source| SupervisorError::Agent {
        console: st.console.clone(),
        source,
    };
    let mut s = AgentSession::connect(&ctl, Duration::from_secs(5)).map_err(agent_err)?;
    s.hello(Duration::from_secs(10), &mut || true)
        .map_err(agent_err)?;
    let opts = ExecOptions {
        stdin: Some(Box::new(io::stdin())),
        uid_gid: Some((plan.uid, plan.gid)),
        interrupt: Some(irq.clone()),
        ..ExecOptions::default()
    };
    match s.exec(&cmd, sink, opts) {
        // The supervisor kills what its client leaves; the run ends now.
        Err(AgentError::Unresponsive { .. }) if irq_sig(&irq) != 0 => {
            Ok(ExitStatus::Interrupted(irq_sig(&irq)))
        }
        r => r.map_err(agent_err),
    }
}

fn irq_sig(irq: &AtomicI32) -> i32 {
    irq.load(Ordering::SeqCst)
}

/// The run's env with its own tmp/spill paths replaced by the VM's (the
/// VM shares its own dirs, fixed when it started).
pub fn rebase_env(
    env: &[(String, String)],
    run_tmp: &Path,
    vm_tmp: &Path,
    run_spill: &Path,
    vm_spill: &Path,
) -> Vec<(String, String)> {
    let swap = |v: &str| -> String {
        for (from, to) in [(run_tmp, vm_tmp), (run_spill, vm_spill)] {
            let f = from.to_string_lossy();
            if let Some(rest) = v.strip_prefix(&*f) {
                if rest.is_empty() || rest.starts_with('/') {
                    return format!("{}{rest}", to.display());
                }
            }
        }
        v.to_string()
    };
    env.iter().map(|(k, v)| (k.clone(), swap(v))).collect()
}

// ---------------------------------------------------------------------------
// The supervisor process.

/// `hull vm __serve`: the supervisor body. Runs until idle, SIGTERM, or the
/// VM ends.
pub fn serve(o: &UpOptions) -> Result<(), SupervisorError> {
    let dir = vm_dir(&o.name)?;
    fs::create_dir_all(&dir).map_err(io_err("create", &dir))?;
    set_private(&dir)?;
    let lock_path = dir.join(".active");
    let lock = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(io_err("open", &lock_path))?;
    if rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err() {
        return Err(SupervisorError::AlreadyUp {
            name: o.name.clone(),
            pid: read_state(&dir).map(|s| s.pid).unwrap_or(0),
        });
    }
    let term = Arc::new(AtomicBool::new(false));
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        signal_hook::flag::register(sig, term.clone())
            .map_err(|e| SupervisorError::Other(format!("signal handler: {e}")))?;
    }
    let me = std::process::id();
    let mut state = VmState {
        name: o.name.clone(),
        pid: me,
        start_time: crate::vm::proc::own_start_time(),
        program: std::env::current_exe().unwrap_or_default(),
        project: o.project.clone(),
        policy: o.policy.clone(),
        idle_secs: o.idle.as_secs(),
        state: Phase::Booting,
        error: None,
        tmp: dir.join("tmp"),
        spill: dir.join("spill"),
        shares: Vec::new(),
        accel: String::new(),
        started_unix: now_unix(),
        console: dir.join("m").join("console.log"),
    };
    write_state(&dir, &state)?;
    match boot(o, &dir, &mut state, &term) {
        Ok((machine, raw)) => {
            state.state = Phase::Ready;
            write_state(&dir, &state)?;
            eprintln!("hull vm {}: ready", o.name);
            let r = relay(o, &dir, machine, raw, &term);
            match &r {
                Ok(End::Stopped) => state.state = Phase::Down,
                Ok(End::Fault(why)) => {
                    state.state = Phase::Failed;
                    state.error = Some(why.clone());
                }
                Err(e) => {
                    state.state = Phase::Failed;
                    state.error = Some(e.to_string());
                }
            }
            let _ = write_state(&dir, &state);
            drop(lock);
            r.map(|_| ())
        }
        Err(e) => {
            state.state = Phase::Failed;
            state.error = Some(e.to_string());
            let _ = write_state(&dir, &state);
            drop(lock);
            Err(e)
        }
    }
}

fn boot(
    o: &UpOptions,
    dir: &Path,
    state: &mut VmState,
    term: &AtomicBool,
) -> Result<(Machine, crate::vm::agent::RawSession), SupervisorError> {
    let runs = crate::runtime::runs_root();
    let project = crate::run::project_path(&o.project, &runs)
        .map_err(|e| SupervisorError::Other(e.to_string()))?;
    state.project = project.clone();
    for d in [&state.tmp, &state.spill] {
        fs::create_dir_all(d).map_err(io_err("create", d))?;
    }
    let pf = crate::policy::profiles::load(&o.policy)?;
    let vars = crate::run::vars_for(project, state.tmp.clone(), state.spill.clone(), runs);
    let (policy, _) = crate::run::resolve_policy(&pf, &vars)
        .map_err(|e| SupervisorError::Other(e.to_string()))?;
    let plan = lower_vm::lower(&policy, &crate::policy::RealFs)?;
    state.shares = fingerprint(&plan);
    let tools = Tools::find()?;
    let image_dir =
        crate::vm::assemble::find_image().map_err(|e| SupervisorError::Other(e.to_string()))?;
    let accel = crate::vm::accel::probe_accel().accel;
    state.accel = accel.name().into();
    let mdir = dir.join("m");
    fs::create_dir_all(&mdir).map_err(io_err("create", &mdir))?;
    let stopped = || term.load(Ordering::SeqCst);
    let start = crate::vm::session::StartOptions {
        plan: &plan,
        tools: &tools,
        image_dir: &image_dir,
        accel,
        vm_name: format!("hull-vm-{}", o.name),
        dir: &mdir,
        log_dir: &mdir,
    };
    let mut session = crate::vm::session::VmSession::start(start, &stopped)?;
    // The snapshot is only read while QEMU starts; the VM keeps its overlay.
    session.release_snapshot();
    session.configure(lower_vm::RUN_CONTAINER, &stopped)?;
    Ok(session.into_raw()?)
}

/// Waits until `fd` is readable (a pending connection) or `d` passes.
fn wait_readable(fd: &impl std::os::fd::AsRawFd, d: Duration) {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = d.as_millis().min(i32::MAX as u128) as libc::c_int;
    // SAFETY: `p` is one valid pollfd on the stack for the duration of the
    // call, and the count passed is 1.
    if unsafe { libc::poll(&mut p, 1, ms) } < 0 {
        std::thread::sleep(d);
    }
}

type ClientWriter = Arc<Mutex<FrameWriter<UnixStream>>>;

#[derive(Default)]
struct Routes {
    /// Supervisor id -> (client, the client's id).
    by_global: HashMap<u32, (u64, u32)>,
    /// Each client's writer, and its socket (to close it when the VM ends).
    clients: HashMap<u64, (ClientWriter, UnixStream)>,
    next_global: u32,
    next_client: u64,
}

impl Routes {
    fn global_of(&self, client: u64, local: u32) -> Option<u32> {
        self.by_global
            .iter()
            .find(|(_, (c, l))| *c == client && *l == local)
            .map(|(g, _)| *g)
    }

    fn fresh_global(&mut self) -> u32 {
        loop {
            self.next_global = self.next_global.wrapping_add(1);
            if self.next_global != 0 && !self.by_global.contains_key(&self.next_global) {
                return self.next_global;
            }
        }
    }
}

struct Hub {
    name: String,
    agent: Arc<Mutex<FrameWriter<UnixStream>>>,
    routes: Mutex<Routes>,
    activity: Mutex<Instant>,
    stop: AtomicBool,
    why: Mutex<Option<String>>,
    /// The stop is a fault (the VM is killed, clients told why).
    fault: AtomicBool,
    /// Whether the guest still answers ([`crate::vm::heartbeat`]).
    beat: Mutex<Heartbeat>,
}

/// How the relay ended.
#[derive(Debug)]
enum End {
    /// On request (`hull vm down`, a signal) or idle.
    Stopped,
    /// A helper died or stalled, or the guest went silent: the VM was killed.
    Fault(String),
}

impl Hub {
    fn new(name: String, agent: Arc<Mutex<FrameWriter<UnixStream>>>) -> Hub {
        Hub {
            name,
            agent,
            routes: Mutex::new(Routes::default()),
            activity: Mutex::new(Instant::now()),
            stop: AtomicBool::new(false),
            why: Mutex::new(None),
            fault: AtomicBool::new(false),
            beat: Mutex::new(Heartbeat::new(SILENCE_LIMIT, Instant::now())),
        }
    }

    fn heard(&self) {
        if let Ok(mut b) = self.beat.lock() {
            b.heard(Instant::now());
        }
    }

    fn fault_because(&self, why: String) {
        self.fault.store(true, Ordering::SeqCst);
        self.stop_because(why);
    }

    /// Every client is told why the VM ends, and its connection closed
    /// (its running commands end with that error).
    fn close_clients(&self, why: &str) {
        let clients: Vec<(ClientWriter, UnixStream)> = match self.routes.lock() {
            Ok(mut r) => {
                r.by_global.clear();
                r.clients.drain().map(|(_, c)| c).collect()
            }
            Err(_) => Vec::new(),
        };
        let msg = Message::error(
            ErrorCode::Internal,
            format!("hull vm {}: the VM ended: {why}", self.name),
        );
        for (w, s) in clients {
            if let Ok(mut w) = w.lock() {
                let _ = w.send(&msg, 0);
            }
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    fn touch(&self) {
        if let Ok(mut a) = self.activity.lock() {
            *a = Instant::now();
        }
    }

    fn stop_because(&self, why: String) {
        if let Ok(mut w) = self.why.lock() {
            w.get_or_insert(why);
        }
        self.stop.store(true, Ordering::SeqCst);
    }

    fn to_agent(&self, msg: &Message, id: u32) -> bool {
        match self.agent.lock() {
            Ok(mut w) => w.send(msg, id).is_ok(),
            Err(_) => false,
        }
    }
}

fn relay(
    o: &UpOptions,
    dir: &Path,
    mut machine: Machine,
    raw: crate::vm::agent::RawSession,
    term: &AtomicBool,
) -> Result<End, SupervisorError> {
    let ctl = dir.join("ctl.sock");
    let _ = fs::remove_file(&ctl);
    let listener = UnixListener::bind(&ctl).map_err(io_err("listen on", &ctl))?;
    listener
        .set_nonblocking(true)
        .map_err(io_err("listen on", &ctl))?;
    let hub = Arc::new(Hub::new(o.name.clone(), raw.writer.clone()));
    {
        let hub = hub.clone();
        let rx = raw.rx;
        std::thread::spawn(move || agent_reader(&hub, rx));
    }
    loop {
        if term.load(Ordering::SeqCst) {
            hub.stop_because("stopped by signal (hull vm down)".into());
        }
        if let Some(f) = machine.failed_helper() {
            hub.fault_because(format!(
                "{} {}; its log: {}",
                f.name,
                f.fault,
                f.log.display()
            ));
        }
        let beat = hub.beat.lock().map(|mut b| b.poll(Instant::now()));
        match beat {
            Ok(Beat::Ping(nonce)) => {
                hub.to_agent(&Message::Ping { nonce }, 0);
            }
            Ok(Beat::Silent(d)) => hub.fault_because(format!(
                "the guest has not answered for {} s (its agent wedged, its kernel hung, or its vCPUs stopped)",
                d.as_secs()
            )),
            Ok(Beat::Quiet) | Err(_) => {}
        }
        let idle = {
            let r = hub
                .routes
                .lock()
                .map(|r| r.by_global.is_empty() && r.clients.is_empty());
            let since = hub.activity.lock().map(|a| a.elapsed()).unwrap_or_default();
            r.unwrap_or(false) && since >= o.idle
        };
        if idle {
            hub.stop_because(format!("idle for {}s", o.idle.as_secs()));
        }
        if hub.stop.load(Ordering::SeqCst) {
            break;
        }
        match listener.accept() {
            Ok((s, _)) => {
                let hub = hub.clone();
                std::thread::spawn(move || client(&hub, s));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // Wake as soon as a client connects (a warm run waits for
                // this), else every 100 ms to check the VM and the flags.
                wait_readable(&listener, Duration::from_millis(100));
            }
            Err(e) => {
                hub.stop_because(format!("accept failed: {e}"));
            }
        }
    }
    let why = hub
        .why
        .lock()
        .ok()
        .and_then(|w| w.clone())
        .unwrap_or_default();
    drop(listener);
    let _ = fs::remove_file(&ctl);
    if hub.fault.load(Ordering::SeqCst) {
        eprintln!("hull vm {}: killed: {why}", o.name);
        machine.kill();
        hub.close_clients(&why);
        let _ = raw.stream.shutdown(std::net::Shutdown::Both);
        return Ok(End::Fault(why));
    }
    eprintln!("hull vm {}: shutting down: {why}", o.name);
    hub.close_clients(&why);
    let _ = hub.to_agent(&Message::Shutdown, 0);
    let _ = raw.stream.shutdown(std::net::Shutdown::Both);
    machine.shutdown(None, Duration::from_secs(20));
    Ok(End::Stopped)
}

/// Frames from the guest: relayed to the client owning the id.
fn agent_reader(
    hub: &Hub,
    rx: std::sync::mpsc::Receiver<Result<hull_protocol::Frame, hull_protocol::ConnError>>,
) {
    for f in rx {
        let f = match f {
            Ok(f) => f,
            Err(e) => {
                hub.fault_because(format!("agent connection: {e}"));
                return;
            }
        };
        hub.heard();
        if f.id == 0 {
            match f.message {
                Message::Ping { nonce } => {
                    hub.to_agent(&Message::Pong { nonce }, 0);
                }
                Message::Pong { .. } => {}
                other => {
                    hub.fault_because(format!(
                        "the guest sent {} on the control channel",
                        other.kind().name()
                    ));
                    return;
                }
            }
            continue;
        }
        let terminal = matches!(f.message, Message::Exit(_) | Message::Error { .. });
        let relayable = matches!(
            f.message,
            Message::Started { .. }
                | Message::Stdout(_)
                | Message::Stderr(_)
                | Message::StdinAck { .. }
                | Message::Exit(_)
                | Message::Error { .. }
        );
        if !relayable {
            hub.fault_because(format!(
                "the guest sent a {} frame for exec {}",
                f.message.kind().name(),
                f.id
            ));
            return;
        }
        let target = {
            let Ok(mut r) = hub.routes.lock() else { return };
            let t = r.by_global.get(&f.id).copied();
            if terminal {
                r.by_global.remove(&f.id);
            }
            t.and_then(|(c, l)| r.clients.get(&c).map(|(w, _)| (w.clone(), l)))
        };
        if terminal {
            hub.touch();
        }
        if let Some((w, local)) = target {
            if let Ok(mut w) = w.lock() {
                let _ = w.send(&f.message, local);
            }
        }
    }
    hub.fault_because("agent connection closed".into());
}

/// One client session on ctl.sock.
fn client(hub: &Hub, s: UnixStream) {
    let _ = s.set_write_timeout(Some(Duration::from_secs(30)));
    let (Ok(r), Ok(w)) = (s.try_clone(), s.try_clone()) else {
        return;
    };
    let writer: ClientWriter = Arc::new(Mutex::new(FrameWriter::new(w)));
    let mut reader = FrameReader::new(r);
    let send = |m: &Message, id: u32| {
        if let Ok(mut w) = writer.lock() {
            let _ = w.send(m, id);
        }
    };
    send(
        &hello_message(Role::OuterAgent, &format!("hull vm {}", hub.name)),
        0,
    );
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let hello = reader.recv().map_err(|e| e.to_string()).and_then(|f| {
        check_peer_hello(f)
            .map_err(|e| e.to_string())
            .and_then(|(h, _)| {
                if h.role == Role::Host {
                    Ok(())
                } else {
                    Err(format!("a {:?} is not a host", h.role))
                }
            })
    });
    if let Err(e) = hello {
        send(&Message::error(ErrorCode::BadRequest, e), 0);
        return;
    }
    let _ = s.set_read_timeout(None);
    let cid = {
        let Ok(mut r) = hub.routes.lock() else { return };
        if r.clients.len() >= MAX_CLIENTS {
            drop(r);
            send(&Message::error(ErrorCode::Busy, "too many clients"), 0);
            return;
        }
        r.next_client += 1;
        let c = r.next_client;
        let Ok(sock) = s.try_clone() else { return };
        r.clients.insert(c, (writer.clone(), sock));
        c
    };
    hub.touch();
    while let Ok(f) = reader.recv() {
        match (f.id, f.message) {
            (0, Message::Ping { nonce }) => send(&Message::Pong { nonce }, 0),
            (0, Message::Shutdown) => break,
            (local, Message::Exec(e)) if local != 0 => {
                let g = {
                    let Ok(mut r) = hub.routes.lock() else { break };
                    if r.global_of(cid, local).is_some() {
                        Err(Message::error(
                            ErrorCode::BadRequest,
                            format!("exec id {local} is in use"),
                        ))
                    } else if r.by_global.len() >= MAX_EXECS {
                        Err(Message::error(
                            ErrorCode::Busy,
                            "too many commands running in this VM",
                        ))
                    } else {
                        let g = r.fresh_global();
                        r.by_global.insert(g, (cid, local));
                        Ok(g)
                    }
                };
                match g {
                    Ok(g) => {
                        if !hub.to_agent(&Message::Exec(e), g) {
                            send(
                                &Message::error(ErrorCode::Internal, "the VM's agent is gone"),
                                local,
                            );
                            break;
                        }
                    }
                    Err(m) => send(&m, local),
                }
            }
            (
                local,
                m
                @ (Message::Stdin(_) | Message::StdinEof | Message::Signal { .. } | Message::Kill),
            ) if local != 0 => {
                let g = hub.routes.lock().ok().and_then(|r| r.global_of(cid, local));
                match g {
                    Some(g) => {
                        hub.to_agent(&m, g);
                    }
                    None => send(
                        &Message::error(
                            ErrorCode::UnknownId,
                            format!("exec id {local} is not running"),
                        ),
                        local,
                    ),
                }
            }
            (id, m) => {
                send(
                    &Message::error(
                        ErrorCode::BadRequest,
                        format!("a client may not send {} (id {id}) here", m.kind().name()),
                    ),
                    0,
                );
                break;
            }
        }
    }
    // The client is gone: its commands are killed.
    let mine: Vec<u32> = match hub.routes.lock() {
        Ok(mut r) => {
            r.clients.remove(&cid);
            r.by_global
                .iter()
                .filter(|(_, (c, _))| *c == cid)
                .map(|(g, _)| *g)
                .collect()
        }
        Err(_) => Vec::new(),
    };
    for g in mine {
        hub.to_agent(&Message::Kill, g);
    }
    hub.touch();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["default", "a", "build-2", "0x"] {
            assert!(validate_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-a", "A", "a/b", "..", "a b", &"x".repeat(33)] {
            assert!(validate_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn env_is_rebased_onto_the_vms_dirs() {
        let env = vec![
            ("TMPDIR".to_string(), "/r/ID/tmp".to_string()),
            ("HOME".to_string(), "/r/ID/tmp".to_string()),
            ("X".to_string(), "/r/ID/tmp/sub".to_string()),
            ("Y".to_string(), "/r/ID/tmpfoo".to_string()),
            ("HULL_SPILL".to_string(), "/r/ID/spill".to_string()),
        ];
        let got = rebase_env(
            &env,
            Path::new("/r/ID/tmp"),
            Path::new("/v/n/tmp"),
            Path::new("/r/ID/spill"),
            Path::new("/v/n/spill"),
        );
        let v: Vec<&str> = got.iter().map(|(_, v)| v.as_str()).collect();
        assert_eq!(
            v,
            [
                "/v/n/tmp",
                "/v/n/tmp",
                "/v/n/tmp/sub",
                "/r/ID/tmpfoo",
                "/v/n/spill"
            ]
        );
    }

    /// The relay against a scripted guest and two real clients over real
    /// sockets: ids are remapped per client, each sees only its own frames,
    /// a client's disconnect kills its command, bad client frames end it.
    #[test]
    fn relay_keeps_clients_apart() {
        use hull_protocol::Connection;
        let (host_end, guest_end) = UnixStream::pair().unwrap();
        // The scripted guest: echoes argv[0] back on stdout, exits 0; on Kill exits 137.
        let guest = std::thread::spawn(move || {
            let mut c = Connection::new(guest_end);
            let mut seen = Vec::new();
            while let Ok((id, m)) = c.recv() {
                match m {
                    Message::Exec(e) => {
                        seen.push(id);
                        let a0 = e.argv[0].as_slice().to_vec();
                        if a0 == b"hang" {
                            c.send(&Message::Started { pid: 5 }, id).unwrap();
                            continue;
                        }
                        c.send(&Message::Stdout(a0), id).unwrap();
                        c.send(&Message::Exit(hull_protocol::ExitStatus::Code(0)), id)
                            .unwrap();
                    }
                    Message::Kill => {
                        c.send(&Message::Exit(hull_protocol::ExitStatus::Signal(9)), id)
                            .unwrap();
                    }
                    Message::Shutdown => break,
                    _ => {}
                }
            }
            seen
        });
        let (tx, rx) = std::sync::mpsc::sync_channel(16);
        let reader_half = host_end.try_clone().unwrap();
        std::thread::spawn(move || {
            let mut r = FrameReader::new(reader_half);
            loop {
                let f = r.recv();
                let end = f.is_err();
                if tx.send(f).is_err() || end {
                    break;
                }
            }
        });
        let hub = Arc::new(Hub::new(
            "t".into(),
            Arc::new(Mutex::new(FrameWriter::new(host_end))),
        ));
        {
            let hub = hub.clone();
            std::thread::spawn(move || agent_reader(&hub, rx));
        }
        let connect = |hub: &Arc<Hub>| {
            let (c, s) = UnixStream::pair().unwrap();
            let hub = hub.clone();
            std::thread::spawn(move || client(&hub, s));
            let mut a = AgentSession::new(c).unwrap();
            a.hello(Duration::from_secs(5), &mut || true).unwrap();
            a
        };
        #[derive(Default)]
        struct Out(Vec<u8>);
        impl OutputSink for Out {
            fn stdout(&mut self, d: &[u8]) -> io::Result<()> {
                self.0.extend_from_slice(d);
                Ok(())
            }
            fn stderr(&mut self, _: &[u8]) -> io::Result<()> {
                Ok(())
            }
        }
        let spec = |a0: &str| CommandSpec {
            argv: vec![a0.into()],
            cwd: "/".into(),
            env: vec![],
            timeout: None,
        };
        let mut a = connect(&hub);
        let mut b = connect(&hub);
        // Both clients use exec id 1; the guest sees two different ids.
        let mut oa = Out::default();
        let mut ob = Out::default();
        assert_eq!(
            a.exec(&spec("alpha"), &mut oa, ExecOptions::default())
                .unwrap(),
            ExitStatus::Code(0)
        );
        assert_eq!(
            b.exec(&spec("beta"), &mut ob, ExecOptions::default())
                .unwrap(),
            ExitStatus::Code(0)
        );
        assert_eq!(oa.0, b"alpha");
        assert_eq!(ob.0, b"beta");

        // A client that disconnects mid-command gets its command killed.
        let (c, s) = UnixStream::pair().unwrap();
        {
            let hub = hub.clone();
            std::thread::spawn(move || client(&hub, s));
        }
        let mut conn = Connection::new(c);
        conn.hello(Role::Host, "test").unwrap();
        let e = crate::vm::agent::build_exec(&spec("hang"), &ExecOptions::default()).unwrap();
        conn.send(&Message::Exec(e), 7).unwrap();
        assert_eq!(conn.recv().unwrap(), (7, Message::Started { pid: 5 }));
        drop(conn);
        let end = Instant::now() + Duration::from_secs(5);
        while !hub.routes.lock().unwrap().by_global.is_empty() {
            assert!(
                Instant::now() < end,
                "the dropped client's command was not killed"
            );
            std::thread::sleep(Duration::from_millis(20));
        }

        // A client may not send agent-side frames.
        let (c, s) = UnixStream::pair().unwrap();
        {
            let hub = hub.clone();
            std::thread::spawn(move || client(&hub, s));
        }
        let mut conn = Connection::new(c);
        conn.hello(Role::Host, "test").unwrap();
        conn.send(&Message::Stdout(b"x".to_vec()), 3).unwrap();
        match conn.recv().unwrap() {
            (0, Message::Error { code, .. }) => assert_eq!(code, ErrorCode::BadRequest),
            other => panic!("{other:?}"),
        }
        assert!(
            conn.recv().is_err(),
            "the session is closed after a bad frame"
        );
        assert!(!hub.stop.load(Ordering::SeqCst));

        drop(a);
        drop(b);
        hub.to_agent(&Message::Shutdown, 0);
        let seen = guest.join().unwrap();
        assert_eq!(seen.len(), 3);
        let mut uniq = seen.clone();
        uniq.sort();
        uniq.dedup();
        assert_eq!(uniq.len(), 3, "guest ids are distinct: {seen:?}");
    }
}
