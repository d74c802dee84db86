//! Tier 1 on Linux: Landlock path rules, a seccomp filter that refuses IP
//! sockets and escape syscalls, no_new_privs, and no capabilities.
//!
//! The command's own process restricts itself between its clone and its
//! `execve` ([`Direct`]): hull binds the rules and builds the filters
//! before the clone, and the child applies them with raw system calls,
//! then executes the command with the command's environment, so nothing
//! runs between the restrictions and the command and nothing of the
//! command's environment is loaded before them.
//!
//! A `--cow` run, whose rules on the overlay can only be opened after the
//! child's mounts, re-executes hull as `hull __landlock-exec --plan-fd N --
//! CMD`: that single-threaded process reads its plan from a sealed memfd (never
//! the command line, which every local user can read: the plan holds the
//! command's environment), drops every capability, applies the plan and the
//! filter, and then executes the command with the plan's environment, so
//! nothing runs between the restrictions and the command. The helper itself
//! starts from the environment hull builds (`exec::helper_env`): nothing of
//! the command's (an `LD_PRELOAD` of its choosing) is loaded into it. It fails closed: a kernel that does not
//! enforce the Landlock features the plan needs (ABI 3: truncate) is an
//! error, never a run without them.
//!
//! Not protected by this tier (see docs/tiers.md): other processes of the
//! same user are visible in /proc (but not ptrace-able); without Landlock ABI
//! 9 pathname unix sockets cannot be mediated, so unix socket creation is
//! refused entirely; pids limits are not enforced for uid 0.

use std::ffi::OsString;
use std::process::Command;

use serde::{Deserialize, Serialize};

use crate::policy::lower::landlock::LandlockPlan;

/// The minimum Landlock ABI this tier runs with: 6 scopes signals and
/// abstract unix sockets to the sandbox (without it the command could
/// SIGSTOP hull and outlive its wall-time limit).
pub const MIN_ABI: i32 = 6;
/// The ABI from which connecting to pathname unix sockets is mediated.
pub const UNIX_SOCKET_ABI: i32 = 9;

#[derive(Debug, thiserror::Error)]
pub enum LandlockError {
    #[error("tier landlock: the kernel does not support Landlock (needs Linux 6.2+ with landlock in the `lsm=` list); ask for --tier bwrap, or --tier none to run unsandboxed")]
    Unsupported,
    #[error("tier landlock: the kernel's Landlock ABI is {found}, hull needs at least {MIN_ABI} (Linux 6.12), which keeps signals and abstract unix sockets inside the sandbox; use --tier bwrap")]
    TooOld { found: i32 },
    #[error("tier landlock: cannot open {path} for a rule: {reason}")]
    Rule { path: String, reason: String },
    #[error("tier landlock: {0}")]
    Ruleset(String),
    #[error("tier landlock: the ruleset was not fully enforced ({0}); refusing to run")]
    NotEnforced(String),
    #[error("tier landlock: {0}")]
    Seccomp(#[from] crate::seccomp::SeccompError),
    #[error("tier landlock: cannot hand the metadata broker its listener: {0}")]
    Broker(#[source] std::io::Error),
    #[error("tier landlock: dropping capabilities failed: {0}")]
    Caps(std::io::Error),
    #[error("tier landlock: the sandbox could not be set up, the command did not run: {0}")]
    SetupFailed(String),
    #[error("tier landlock: bad plan: {0}")]
    Plan(String),
    #[error("tier landlock: cannot pass the plan to the helper: {0}")]
    PlanFd(#[source] std::io::Error),
    #[error("tier landlock: cannot execute {program}: {source}")]
    Exec {
        program: String,
        #[source]
        source: std::io::Error,
    },
}

/// The Landlock ABI the running kernel supports (0 when none).
pub fn kernel_abi() -> i32 {
    crate::exec::domain::kernel_abi()
}

/// The largest plan the helper reads (its environment included).
const MAX_PLAN: u64 = 64 << 20;

/// What `__landlock-exec` receives. The rules themselves are not in it:
/// hull bound them to descriptors it opened once and built the ruleset
/// (`tier::rules`); the helper gets the ruleset's descriptor.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExecPlan {
    /// The command's whole environment, set at its `execve` only.
    pub env: Vec<(String, String)>,
    /// The ruleset hull built, inherited by number.
    pub ruleset_fd: i32,
    /// `--cow`: the rules on the overlay, added by the helper after its
    /// mounts, beneath its working directory.
    #[serde(default)]
    pub deferred: Vec<crate::rules::Deferred>,
    pub allow_unix_sockets: bool,
    /// Unix sockets whose connects hull's broker answers (Landlock cannot
    /// mediate them here): [`unix_sockets`].
    #[serde(default)]
    pub unix_brokered: bool,
    pub memory: Option<u64>,
    pub pids: Option<u64>,
    /// The socket on which the helper sends hull the listener of the
    /// broker's filter (`tier::broker`).
    #[serde(default)]
    pub broker_fd: Option<i32>,
    /// Whether creates in split directories go to the broker (spare
    /// entries of `tier::spares` renamed into place).
    #[serde(default)]
    pub spares: bool,
    /// The policy's allow list: the command is in a network namespace of
    /// its own (made by hull before this helper, `net::netns`) where hull's
    /// proxy listens on a loopback port; IP sockets are allowed, and the
    /// ruleset lets TCP connect to that port only (binds none).
    #[serde(default)]
    pub inet: bool,
}

/// What a landlock run's helper is built from.
#[derive(Debug)]
pub struct Request<'a> {
    pub plan: &'a LandlockPlan,
    pub limits: &'a crate::policy::Limits,
    pub argv: &'a [OsString],
    /// The command's environment (the helper starts from
    /// [`crate::exec::helper_env`]).
    pub env: &'a [(String, String)],
    pub broker_fd: Option<i32>,
    /// The spare pools whose entries carry writable rules.
    pub pools: &'a [std::sync::Arc<crate::spares::Pool>],
    pub proxy_port: Option<u16>,
    /// `--cow`: the project, an overlay only the child's mount namespace
    /// has: its rules are the helper's to open (its working directory).
    pub in_child: Option<&'a std::path::Path>,
}

/// Probes the tier.
pub fn probe() -> crate::probe::Probe {
    use crate::{probe::Probe, Tier};
    match verdict(kernel_abi()) {
        Ok(detail) => Probe::available(Tier::Landlock, detail, Vec::new()),
        Err(e) => Probe::unavailable(Tier::Landlock, e.to_string()),
    }
}

/// What the tier can do with the kernel's Landlock ABI `abi`, or why not.
fn verdict(abi: i32) -> Result<String, LandlockError> {
    if abi == 0 {
        return Err(LandlockError::Unsupported);
    }
    if abi < MIN_ABI {
        return Err(LandlockError::TooOld { found: abi });
    }
    let unix = if abi >= UNIX_SOCKET_ABI {
        "unix sockets mediated by Landlock"
    } else {
        "unix sockets connect through hull's broker (ABI < 9 cannot mediate them): \
         pathname sockets in the writable roots only, no abstract ones, no datagrams \
         (with an allow list: refused)"
    };
    Ok(format!(
        "Landlock ABI {abi}; signals and abstract sockets scoped; seccomp; {unix}"
    ))
}

/// A handle on a run's ruleset (another descriptor of it), to add the
/// rules of what hull mounts for a session in the child, detached until
/// then: its own `/tmp` and its own terminals. Rules belong to inodes, so
/// they hold once the child attaches those mounts.
#[derive(Debug)]
pub struct Rules {
    ruleset: std::os::fd::OwnedFd,
    allow_unix_sockets: bool,
}

impl Rules {
    fn of(
        ruleset: &std::os::fd::OwnedFd,
        allow_unix_sockets: bool,
    ) -> Result<Rules, LandlockError> {
        Ok(Rules {
            ruleset: ruleset.try_clone().map_err(LandlockError::PlanFd)?,
            allow_unix_sockets,
        })
    }

    /// Lets the command use the terminals of `pts`, a devpts of a
    /// session's own ([`crate::identity::Switch::with_private_pts`]).
    pub fn allow_pty(&self, pts: &std::os::fd::OwnedFd) -> Result<(), LandlockError> {
        crate::rules::add_pty(&self.ruleset, pts).map_err(|e| LandlockError::Rule {
            path: "the session's own /dev/pts".into(),
            reason: e.to_string(),
        })
    }

    /// Lets the command write beneath `dir` too, `what` in an error: a
    /// session's own `/tmp`, detached until the child attaches it.
    pub fn allow_writable_dir(
        &self,
        dir: &std::os::fd::OwnedFd,
        what: &str,
    ) -> Result<(), LandlockError> {
        crate::rules::add_writable_dir(&self.ruleset, dir, self.allow_unix_sockets).map_err(|e| {
            LandlockError::Rule {
                path: what.to_string(),
                reason: e.to_string(),
            }
        })
    }
}

/// The helper command, and a pipe on which it reports a setup failure: the
/// write end is close-on-exec in the helper, so EOF with no data means the
/// command was executed with every restriction in place.
#[derive(Debug)]
pub struct Prepared {
    /// The helper (through `exe`) and its arguments.
    pub argv: Vec<OsString>,
    pub error_w: std::os::fd::OwnedFd,
    pub error_r: std::os::fd::OwnedFd,
    /// hull's executable, which `argv[0]` names: open (close-on-exec:
    /// the kernel opened it before the exec closes it) until it is spawned.
    pub exe: std::os::fd::OwnedFd,
    /// Descriptors the helper inherits and closes itself before the
    /// command runs: the sealed plan (`--plan-fd`) and the ruleset.
    pub inherit: Vec<std::os::fd::OwnedFd>,
    /// A handle on the ruleset, to add rules before the helper starts.
    pub rules: Rules,
}

/// What the command's own process applies to itself between its clone and
/// the command's `execve`, where no helper is executed (every run but a
/// `--cow` one, whose rules on the overlay are the helper's to open after
/// its mounts): the ruleset hull bound and the filter hull built, applied
/// by raw system calls on memory prepared before the clone. The process
/// is the one [`crate::exec::spawn::CgroupCommand`] starts: it set no
/// new privileges, dropped every capability and left hull's session
/// (`launch::ChildSetup`), and installs the broker's filter last.
/// Executing hull again for this cost a process start (a millisecond
/// and more: the dynamic loader, the C library's start, hull's own) and
/// the plan's parse on every run.
#[derive(Debug)]
pub struct Direct {
    ruleset: std::os::fd::OwnedFd,
    /// Whether the ruleset handles the resolution of unix sockets.
    allow_unix_sockets: bool,
    /// Whether the command's connects go to the broker
    /// ([`Direct::unix_brokered`]).
    unix_brokered: bool,
    filter: crate::seccomp::Raw,
    /// Where the step names its failure (a byte: [`Direct::failure`]),
    /// close-on-exec.
    failed_r: std::os::fd::OwnedFd,
    failed_w: std::os::fd::OwnedFd,
}

/// The step's failures, as the byte it writes.
const FAILED_RESTRICT: u8 = 1;
const FAILED_FILTER: u8 = 2;

impl Direct {
    /// Binds the plan's rules and builds the filter, or None for a run
    /// whose rules are the helper's to add ([`Request::in_child`]).
    pub fn prepare(req: &Request<'_>) -> Result<Option<Direct>, LandlockError> {
        if req.in_child.is_some() {
            return Ok(None);
        }
        let (bound, allow_unix_sockets) = bind(req)?;
        if !bound.deferred.is_empty() {
            return Err(LandlockError::Plan(
                "rules left to a helper where none runs".into(),
            ));
        }
        let unix = unix_sockets(allow_unix_sockets, req.proxy_port.is_some());
        let prog = crate::seccomp::build(crate::seccomp::Profile::Landlock {
            unix,
            inet: req.proxy_port.is_some(),
            broker: true,
        })?;
        // Read without waiting (hull holds the write end too, in the step).
        let (failed_r, failed_w) = rustix::pipe::pipe_with(
            rustix::pipe::PipeFlags::CLOEXEC | rustix::pipe::PipeFlags::NONBLOCK,
        )
        .map_err(|e| LandlockError::PlanFd(e.into()))?;
        Ok(Some(Direct {
            ruleset: bound.ruleset,
            allow_unix_sockets,
            unix_brokered: unix == crate::seccomp::UnixSockets::Brokered,
            filter: crate::seccomp::Raw::new(&prog),
            failed_r,
            failed_w,
        }))
    }

    /// Whether the command's unix sockets connect through the broker: its
    /// filter must then stop every `connect` ([`crate::seccomp::build_broker`]).
    pub fn unix_brokered(&self) -> bool {
        self.unix_brokered
    }

    /// A handle on the ruleset, to add rules before the command starts.
    pub fn rules(&self) -> Result<Rules, LandlockError> {
        Rules::of(&self.ruleset, self.allow_unix_sockets)
    }

    /// Registers the step on `cmd`: after hull's child setup (no new
    /// privileges, capabilities dropped), before the broker's handoff.
    /// Returns what reads its failure after a failed spawn.
    pub fn install(self, cmd: &mut impl crate::exec::spawn::PreExec) -> Failure {
        use std::os::fd::AsRawFd;
        let Direct {
            ruleset,
            allow_unix_sockets: _,
            unix_brokered: _,
            filter,
            failed_r,
            failed_w,
        } = self;
        // SAFETY: landlock_restrict_self, prctl and write: raw,
        // async-signal-safe system calls on descriptors and memory prepared
        // before the clone; nothing is allocated. The descriptors are
        // close-on-exec: the command holds neither.
        unsafe {
            cmd.pre_exec_step(Box::new(move || {
                let failed = |code: u8| {
                    let e = std::io::Error::last_os_error();
                    libc::write(failed_w.as_raw_fd(), [code].as_ptr().cast(), 1);
                    Err(e)
                };
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                    || libc::syscall(libc::SYS_landlock_restrict_self, ruleset.as_raw_fd(), 0u32)
                        != 0
                {
                    return failed(FAILED_RESTRICT);
                }
                if !filter.apply_in_child() {
                    return failed(FAILED_FILTER);
                }
                Ok(())
            }));
        }
        Failure(failed_r)
    }
}

/// Reads which part of [`Direct`]'s step failed.
#[derive(Debug)]
pub struct Failure(std::os::fd::OwnedFd);

impl Failure {
    /// The error a failed spawn stands for, when the step failed (else
    /// None: the spawn's own error, the exec's, says it).
    pub fn of(self, spawn: &std::io::Error) -> Option<LandlockError> {
        // The child is gone (reaped by the spawn): what it wrote is there.
        let mut b = [0u8; 1];
        match rustix::io::read(&self.0, &mut b) {
            Ok(1) if b[0] == FAILED_RESTRICT => Some(LandlockError::NotEnforced(format!(
                "the kernel refused the ruleset: {spawn}"
            ))),
            Ok(1) if b[0] == FAILED_FILTER => Some(LandlockError::SetupFailed(format!(
                "the kernel refused the seccomp filter: {spawn}"
            ))),
            _ => None,
        }
    }
}

/// The request's rules bound (`tier::rules`) on a kernel that runs this
/// tier, and whether its Landlock mediates unix sockets.
fn bind(req: &Request<'_>) -> Result<(crate::rules::Bound, bool), LandlockError> {
    let abi = kernel_abi();
    verdict(abi)?;
    let allow_unix_sockets = abi >= UNIX_SOCKET_ABI;
    let bound = crate::rules::bind(
        req.plan,
        req.pools,
        allow_unix_sockets,
        req.proxy_port,
        req.in_child,
    )?;
    Ok((bound, allow_unix_sockets))
}

/// How a run's unix sockets are kept: by Landlock itself where it mediates
/// them (`landlock_unix`, ABI 9); otherwise by hull's connect broker,
/// unless the command has a network namespace of its own (`inet`, the
/// allow list: its connects are Landlock's to check, port by port, which
/// a connect hull makes on its behalf would not be), where they are
/// refused.
pub fn unix_sockets(landlock_unix: bool, inet: bool) -> crate::seccomp::UnixSockets {
    use crate::seccomp::UnixSockets;
    match (landlock_unix, inet) {
        (true, _) => UnixSockets::Landlock,
        (false, false) => UnixSockets::Brokered,
        (false, true) => UnixSockets::Refused,
    }
}

/// Reads the helper's error pipe after it is done.
pub fn check_started(error_r: std::os::fd::OwnedFd) -> Result<(), LandlockError> {
    let mut text = String::new();
    let f = std::fs::File::from(error_r);
    let _ = std::io::Read::read_to_string(&mut std::io::Read::take(f, 16 * 1024), &mut text);
    if text.is_empty() {
        Ok(())
    } else {
        Err(LandlockError::SetupFailed(text))
    }
}

/// Binds the plan's rules (`tier::rules`) and builds the command that
/// restricts itself with them and then runs the command. Start it with
/// [`crate::exec::helper_env`], never the command's environment.
pub fn command(req: &Request<'_>) -> Result<Prepared, LandlockError> {
    let (bound, allow_unix_sockets) = bind(req)?;
    let exec = ExecPlan {
        env: req.env.to_vec(),
        ruleset_fd: std::os::fd::AsRawFd::as_raw_fd(&bound.ruleset),
        deferred: bound.deferred,
        allow_unix_sockets,
        unix_brokered: unix_sockets(allow_unix_sockets, req.proxy_port.is_some())
            == crate::seccomp::UnixSockets::Brokered,
        memory: req.limits.memory,
        pids: req.limits.pids,
        broker_fd: req.broker_fd,
        spares: !req.pools.is_empty(),
        inet: req.proxy_port.is_some(),
    };
    let json = serde_json::to_vec(&exec).map_err(|e| LandlockError::Plan(e.to_string()))?;
    let plan_fd =
        crate::exec::memfd::sealed("hull-landlock-plan", &json).map_err(LandlockError::PlanFd)?;
    // The helper is this executable, started through a descriptor: when
    // hull runs as root the helper runs as the sandbox user, who may not be
    // able to search the directories hull lives in (a 0700 home).
    let exe = rustix::fs::open(
        "/proc/self/exe",
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| LandlockError::Exec {
        program: "hull (/proc/self/exe)".into(),
        source: e.into(),
    })?;
    let (error_r, error_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| LandlockError::Caps(e.into()))?;
    // Executed before the exec closes the (close-on-exec) descriptor.
    let mut helper: Vec<OsString> = vec![
        format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&exe)).into(),
        "__landlock-exec".into(),
        "--plan-fd".into(),
        std::os::fd::AsRawFd::as_raw_fd(&plan_fd).to_string().into(),
        "--error-fd".into(),
        std::os::fd::AsRawFd::as_raw_fd(&error_w).to_string().into(),
        "--".into(),
    ];
    helper.extend(req.argv.iter().cloned());
    let rules = Rules::of(&bound.ruleset, allow_unix_sockets)?;
    Ok(Prepared {
        argv: helper,
        error_w,
        error_r,
        exe,
        inherit: vec![plan_fd, bound.ruleset],
        rules,
    })
}

/// `hull __landlock-exec`: restrict this process, then exec the command.
/// Only returns on error, which it also writes to `error_fd`.
pub fn exec_main(plan_fd: i32, error_fd: Option<i32>, argv: Vec<OsString>) -> anyhow::Result<i32> {
    let r = restrict_and_exec(plan_fd, error_fd, &argv);
    let e = match r {
        Ok(never) => match never {},
        Err(e) => e,
    };
    if let Some(fd) = error_fd {
        // SAFETY: the fd was handed to us by hull on the command line and is
        // open for writing; we own it from here on.
        let f = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        if std::io::Write::write_all(&mut &f, e.to_string().as_bytes()).is_ok() {
            // hull reports it; printing here too would say it twice.
            return Ok(hull_exec::EXIT_HULL_FAILED);
        }
    }
    Err(e.into())
}

enum Never {}

/// Reads the plan hull sealed in the memfd `fd` (this process owns it from
/// here; it is closed before the command runs), at most [`MAX_PLAN`] bytes.
fn read_plan(fd: i32) -> Result<ExecPlan, LandlockError> {
    // SAFETY: hull passed this descriptor by number for us alone; owning it
    // closes it when read.
    let f = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut std::io::Read::take(&f, MAX_PLAN + 1), &mut bytes)
        .map_err(LandlockError::PlanFd)?;
    if bytes.len() as u64 > MAX_PLAN {
        return Err(LandlockError::Plan(format!("larger than {MAX_PLAN} bytes")));
    }
    serde_json::from_slice(&bytes).map_err(|e| LandlockError::Plan(e.to_string()))
}

fn restrict_and_exec(
    plan_fd: i32,
    error_fd: Option<i32>,
    argv: &[OsString],
) -> Result<Never, LandlockError> {
    let plan = read_plan(plan_fd)?;
    if let Some(fd) = error_fd {
        // Closed by the exec of the command: EOF then tells hull it started.
        // SAFETY: fcntl on an fd number, integer arguments only.
        unsafe {
            libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
        }
    }
    restrict(&plan)?;
    let program = argv
        .first()
        .ok_or_else(|| LandlockError::Plan("empty command".into()))?;
    let mut command = Command::new(program);
    command
        .args(&argv[1..])
        .env_clear()
        .envs(plan.env.iter().map(|(k, v)| (k, v)));
    let err = std::os::unix::process::CommandExt::exec(&mut command);
    Err(LandlockError::Exec {
        program: program.to_string_lossy().into_owned(),
        source: err,
    })
}

fn restrict(plan: &ExecPlan) -> Result<(), LandlockError> {
    // SAFETY: setsid takes no arguments; a new session detaches the command
    // from hull's controlling terminal.
    unsafe {
        libc::setsid();
    }
    set_rlimits(plan);
    drop_capabilities().map_err(LandlockError::Caps)?;
    // SAFETY: hull passed the ruleset by number for us alone; owning it
    // closes it once the restriction holds (before the command runs).
    let ruleset =
        unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(plan.ruleset_fd) };
    crate::rules::add_deferred(&ruleset, &plan.deferred)?;
    crate::rules::restrict_self(ruleset)?;
    // Brokered only where the broker's filter goes on too.
    let brokered = plan.unix_brokered && plan.broker_fd.is_some();
    let unix = match (plan.allow_unix_sockets, brokered) {
        (true, _) => crate::seccomp::UnixSockets::Landlock,
        (false, true) => crate::seccomp::UnixSockets::Brokered,
        (false, false) => crate::seccomp::UnixSockets::Refused,
    };
    let prog = crate::seccomp::build(crate::seccomp::Profile::Landlock {
        unix,
        inet: plan.inet,
        // Metadata calls go to the broker: Landlock does not mediate them.
        broker: true,
    })?;
    crate::seccomp::apply(&prog)?;
    if let Some(fd) = plan.broker_fd {
        // SAFETY: hull passed this socket by number; we own it from here,
        // and it closes before the command runs.
        let sock = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let broker = crate::seccomp::build_broker(true, plan.spares, brokered)?;
        let listener = crate::seccomp::apply_with_listener(&broker)?;
        crate::broker::send_listener(
            std::os::fd::AsFd::as_fd(&sock),
            std::os::fd::AsFd::as_fd(&listener),
        )
        .map_err(LandlockError::Broker)?;
        // The command must never hold the listener of its own filter.
        drop(listener);
        drop(sock);
    }
    Ok(())
}

fn set_rlimits(plan: &ExecPlan) {
    if let Some(m) = plan.memory {
        let r = libc::rlimit {
            rlim_cur: m,
            rlim_max: m,
        };
        // SAFETY: setrlimit with a valid pointer to a local struct.
        unsafe {
            libc::setrlimit(libc::RLIMIT_DATA, &r);
        }
    }
    if let Some(p) = plan.pids {
        let r = libc::rlimit {
            rlim_cur: p,
            rlim_max: p,
        };
        // SAFETY: as above.
        unsafe {
            libc::setrlimit(libc::RLIMIT_NPROC, &r);
        }
    }
}

/// Drops every capability for good ([`crate::launch::drop_all_caps_raw`]:
/// bounding set, ambient set, the securebits that stop uid 0 from regaining
/// them at exec, the current sets), then checks nothing effective or
/// permitted is left.
pub fn drop_capabilities() -> std::io::Result<()> {
    crate::launch::drop_all_caps_raw()?;
    let now = rustix::thread::capabilities(None).map_err(std::io::Error::from)?;
    if !now.effective.is_empty() || !now.permitted.is_empty() {
        return Err(std::io::Error::other(
            "capabilities still present after dropping",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernel_without_scoping_is_refused_with_the_reason() {
        let e = verdict(5).unwrap_err().to_string();
        assert!(e.contains("ABI is 5") && e.contains("signals"), "{e}");
        assert!(matches!(verdict(0), Err(LandlockError::Unsupported)));
        assert!(verdict(6).unwrap().contains("scoped"));
        assert!(verdict(9).unwrap().contains("mediated by Landlock"));
    }
}
