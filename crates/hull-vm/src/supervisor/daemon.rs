//! `hull vm up`: the detached supervisor process, started and waited for,
//! and its life (boot, ready, relay, down or failed) in the state file.

use std::fs;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::machine::{Machine, Tools};
use crate::policy::lower::vm::{self as lower_vm};

use super::relay::{relay, End};
use super::{
    fingerprint, io_err, lock_held, now_unix, read_state, set_private, vm_dir, write_state, Phase,
    SupervisorError, UpOptions, VmState,
};

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
    let _ = crate::machine::cleanup_stale(&dir.join("m"));
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
        let accel = crate::accel::probe_accel().accel;
        let (boot, setup) = crate::shape::deadlines(accel);
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
                tail: crate::proc::log_tail(&log, 3000),
                log,
            });
        }
        if Instant::now() >= end {
            let _ = child.kill();
            let _ = child.wait();
            return Err(SupervisorError::Timeout {
                name: o.name.clone(),
                secs: deadline.as_secs(),
                tail: crate::proc::log_tail(&log, 3000),
                log,
            });
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

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
        signal_hook::flag::register(sig, term.clone()).map_err(SupervisorError::Signals)?;
    }
    let me = std::process::id();
    let mut state = VmState {
        name: o.name.clone(),
        pid: me,
        start_time: crate::proc::own_start_time(),
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
        faulted: false,
    };
    write_state(&dir, &state)?;
    match boot(o, &dir, &mut state, &term) {
        Ok((machine, raw, net)) => {
            state.state = Phase::Ready;
            write_state(&dir, &state)?;
            eprintln!("hull vm {}: ready", o.name);
            let r = relay(o, &dir, machine, raw, net, &term);
            match &r {
                Ok(End::Stopped) => state.state = Phase::Down,
                Ok(End::Fault(why)) => {
                    state.state = Phase::Failed;
                    state.error = Some(why.clone());
                    state.faulted = true;
                }
                Err(e) => {
                    state.state = Phase::Failed;
                    state.error = Some(e.to_string());
                    state.faulted = true;
                }
            }
            let _ = write_state(&dir, &state);
            super::remove_leftovers(&dir);
            drop(lock);
            r.map(|_| ())
        }
        Err(e) => {
            state.state = Phase::Failed;
            state.error = Some(e.to_string());
            let _ = write_state(&dir, &state);
            super::remove_leftovers(&dir);
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
) -> Result<
    (
        Machine,
        crate::agent::RawSession,
        Option<crate::net_channel::NetChannel>,
    ),
    SupervisorError,
> {
    let runs = crate::runtime::runs_root();
    let project =
        crate::prepare::project_path(&o.project, &runs).map_err(SupervisorError::Project)?;
    state.project = project.clone();
    // Empty, whatever an earlier VM of this name (maybe for another
    // project) left: nothing of one VM's runs reaches the next's.
    for d in [&state.tmp, &state.spill] {
        crate::runtime::remove_tree(d).map_err(io_err("empty", d))?;
        fs::create_dir_all(d).map_err(io_err("create", d))?;
    }
    let pf = crate::policy::profiles::load(&o.policy)?;
    let vars = crate::prepare::vars_for(project, state.tmp.clone(), state.spill.clone(), runs);
    let (policy, _) = crate::prepare::resolve_policy(&pf, &vars)?;
    let plan = lower_vm::lower(&policy, &crate::policy::RealFs)?;
    state.shares = fingerprint(&plan);
    state.shares.push(super::net_fingerprint(&policy.net));
    let recipe = crate::assemble::recipe_for(&policy.vm)?;
    state.shares.push(super::userland_fingerprint(&recipe));
    let tools = Tools::find()?;
    let image = crate::assemble::find_image(&recipe)?;
    let accel = crate::accel::probe_accel().accel;
    state.accel = accel.name().into();
    let mdir = dir.join("m");
    fs::create_dir_all(&mdir).map_err(io_err("create", &mdir))?;
    let stopped = || term.load(Ordering::SeqCst);
    let start = crate::session::StartOptions {
        plan: &plan,
        tools: &tools,
        image: &image,
        accel,
        vm_name: format!("hull-vm-{}", o.name),
        dir: &mdir,
        log_dir: &mdir,
    };
    let mut session = crate::session::VmSession::start(start, &stopped)?;
    // The snapshot is only read while QEMU starts; the VM keeps its overlay.
    session.release_snapshot();
    // The allow list: the VM's proxy, for its policy, auditing into its
    // spill (every run in it has that policy: `run_in` checks).
    if policy.net.mode == crate::policy::NetMode::Allowlist {
        session.start_network(&format!("hull vm {}", o.name), &policy.net, &state.spill)?;
    }
    session.configure(lower_vm::RUN_CONTAINER, &stopped)?;
    Ok(session.into_raw()?)
}
