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
//! Runs in one kept VM take turns ([`turn`]): every run's command is the
//! container's uid 1000, so two at once could read each other's
//! environment through `/proc` and signal each other. Each run has a tmp of
//! its own (its `TMPDIR` and, in the shipped profiles, `HOME`), made by
//! hull in the VM's tmp when its turn comes and removed when it ends; the
//! VM's tmp and spill go when the VM goes down (and by `hull runs gc`
//! after a killed supervisor). Each command is in a cgroup of its own in
//! the container, ended by `cgroup.kill`; a command whose processes
//! outlive that (uninterruptible sleep) faults the VM, which then serves
//! nothing more: after any fault the next run starts a fresh VM of the same
//! project, policy and idle time (`client::fresh_after_fault`), saying so. A `hull serve` session holds its VM's turn for its life:
//! its execs share the session's tmp.
//!
//! Before a run that holds its own turn, what the runs' user may write in
//! the container's own filesystem (`/tmp`, `/var/tmp`, `/run/lock`,
//! `/home/hull`) is emptied (`hull-agent scrub`).
//!
//! What it does not: give each run a fresh container (its kernel, its
//! page cache, what container root changed); a run that needs one uses a
//! fresh VM (no `--vm`).
//!
//! Here: a VM's state file, names and dirs, `status` and `down`; in
//! [`daemon`] `up` and the supervisor process; in [`relay`] its relay of
//! agent sessions, with the watch and heartbeat that end a faulted VM; in
//! [`turn`] the runs' turns and tmps; in [`client`] the side of a `hull
//! run --vm`.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::agent::AgentError;
use crate::machine::MachineError;
use crate::policy::lower::vm::{ShareOrigin, VmLowerError, VmPlan};
use crate::policy::PolicyError;
use crate::proc::PidRecord;

mod client;
mod daemon;
mod relay;
mod turn;

pub use client::{rebase_env, run_in};
pub use daemon::{serve, up};
pub use turn::hold_turn;

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
    #[error(
        "tier vm (VM {name}): --user {user} is refused in a kept VM that runs take turns in: \
         what that user changes in the container (root's packages, users, files) would reach \
         the VM's later runs. Run without --vm (a fresh VM), or in a `hull serve` session's VM"
    )]
    UserInSharedVm { name: String, user: String },
    #[error("hull vm: cannot copy the host's certificate authorities into the run's tmp: {0}")]
    Trust(#[source] std::io::Error),
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
        "tier vm: VM {name} was started with other shares, another network or another container userland than this run's policy; refusing.\n  \
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
    Session(#[from] crate::session::SessionError),
    #[error("{source}\n  console log: {console}")]
    Agent {
        console: PathBuf,
        #[source]
        source: AgentError,
    },
    #[error("hull vm: the project: {0}")]
    Project(#[source] crate::prepare::ProjectError),
    #[error(transparent)]
    Prepare(#[from] crate::prepare::PrepareError),
    #[error(transparent)]
    Image(#[from] crate::assemble::AssembleError),
    #[error("hull vm: cannot encode the VM's state file")]
    EncodeState(#[source] serde_json::Error),
    #[error("hull vm: cannot install the signal handlers")]
    Signals(#[source] io::Error),
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
    /// A fault took the VM down after it was ready (a helper died, the
    /// guest went silent or broke the protocol, a run's processes could
    /// not be ended): the next run starts a fresh one.
    #[serde(default)]
    pub faulted: bool,
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
    crate::state::vms_root()
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

/// The container userland of a kept VM's policy (its `[vm] packages`), as
/// a line of its fingerprint: a run needing other programs must not get
/// the VM's.
pub fn userland_fingerprint(recipe: &crate::image::recipe::Recipe) -> String {
    format!("userland {} ({})", recipe.id(), recipe.userland())
}

/// The network part of a kept VM's policy, as a line of its fingerprint: a
/// run joins the VM only with the same (its proxy serves the VM's policy,
/// and a run without a network must not get one).
pub fn net_fingerprint(net: &crate::policy::NetPolicy) -> String {
    if net.mode == crate::policy::NetMode::None {
        return "network none".into();
    }
    let list = |v: &[crate::policy::net::HostPattern]| {
        v.iter()
            .map(|p| p.to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    let hosts: Vec<String> = net.hosts.iter().map(|(n, a)| format!("{n}={a}")).collect();
    let private: Vec<String> = net.allow_private.iter().map(|p| p.to_string()).collect();
    let ports: Vec<String> = net.ports.iter().map(u16::to_string).collect();
    format!(
        "network allowlist allow={} deny={} ports={} hosts={} private={}",
        list(&net.allow),
        list(&net.deny),
        ports.join(","),
        hosts.join(","),
        private.join(",")
    )
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
    let text = serde_json::to_vec_pretty(s).map_err(SupervisorError::EncodeState)?;
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
            let _ = crate::machine::cleanup_stale(&dir.join("m"));
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
        let _ = crate::machine::cleanup_stale(&dir.join("m"));
        remove_leftovers(&dir);
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
    let _ = crate::machine::cleanup_stale(&dir.join("m"));
    if !lock_held(&dir) {
        remove_leftovers(&dir);
    }
    Ok(true)
}

/// Removes the tmp and spill of every kept VM that no live supervisor
/// holds (`hull runs gc`); the names of those that had any.
pub fn sweep_leftovers() -> Vec<String> {
    let Ok(root) = checked_vms_root() else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir(&root) else {
        return Vec::new();
    };
    let mut swept = Vec::new();
    for e in entries.flatten() {
        let Some(name) = e.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let dir = e.path();
        let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
        if validate_name(&name).is_err() || !is_dir || lock_held(&dir) {
            continue;
        }
        if ["tmp", "spill"].iter().any(|d| dir.join(d).exists()) {
            remove_leftovers(&dir);
            swept.push(name);
        }
    }
    swept
}

/// Removes the tmp and spill (its runs' `TMPDIR`, `HOME` and spill) of VM
/// directory `dir` once its VM is down: nothing of its runs stays on the
/// host. Said on stderr when one cannot be removed.
fn remove_leftovers(dir: &Path) {
    for d in ["tmp", "spill"] {
        let path = dir.join(d);
        if let Err(e) = crate::runtime::remove_tree(&path) {
            eprintln!("hull vm: cannot remove {}: {e}", path.display());
        }
    }
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
}
