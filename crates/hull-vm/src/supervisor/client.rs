//! The side of `hull run --tier3 --vm NAME`: a session with the VM's
//! supervisor, the run's env rebased onto the VM's own dirs.

use std::io;
use std::os::fd::RawFd;
use std::path::Path;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::agent::{AgentError, AgentSession, ExecOptions};
use crate::exec::{CommandSpec, ExitStatus, OutputSink};
use crate::policy::lower::vm::VmPlan;
use crate::policy::Policy;

use super::turn::{RunTmp, Taken, Turn};
use super::{fingerprint, lock_held, read_state, vm_dir, Phase, SupervisorError, VmState};

/// Runs a command in VM `name` (`hull run --tier3 --vm NAME`), in its
/// turn ([`super::turn`]): the turn `turn_fd` hands down (a `hull serve`
/// session's), or one it waits for, with a tmp of its own.
pub fn run_in(
    name: &str,
    turn_fd: Option<RawFd>,
    policy: &Policy,
    plan: &VmPlan,
    spec: &CommandSpec,
    sink: &mut dyn OutputSink,
    irq: Arc<AtomicI32>,
) -> Result<ExitStatus, SupervisorError> {
    // Another user than the plan's would change the container for the
    // VM's later runs (the scrub empties only the plan's user's scratch):
    // only where one caller holds the turn for all of them (a session).
    if let (Some(user), None) = (&spec.user, turn_fd) {
        return Err(SupervisorError::UserInSharedVm {
            name: name.to_string(),
            user: user.clone(),
        });
    }
    let dir = vm_dir(name)?;
    let t0 = std::time::Instant::now();
    let at = || t0.elapsed().as_secs_f64();
    // The turn first: whoever holds it alone may start a fresh VM after a
    // fault, or use the VM.
    let _turn = match turn_fd {
        Some(fd) => Turn::inherited(fd, &dir)?,
        None => match Turn::take(&dir, name, &irq)? {
            Taken::Turn(t) => t,
            Taken::Interrupted(sig) => return Ok(ExitStatus::Interrupted(sig)),
        },
    };
    let st = match ready_state(name, &dir) {
        Ok(st) => st,
        Err(e) => fresh_after_fault(name, &dir).ok_or(e)??,
    };
    let mut want = fingerprint(plan);
    want.push(super::net_fingerprint(&policy.net));
    want.push(super::userland_fingerprint(&crate::assemble::recipe_for(
        &policy.vm,
    )?));
    if want != st.shares {
        return Err(SupervisorError::Mismatch {
            name: name.into(),
            vm: st.shares.join("; "),
            run: want.join("; "),
        });
    }
    // A run of its own turn has a tmp of its own; a session's execs share
    // the session's.
    let run_tmp = match turn_fd {
        Some(_) => None,
        None => Some(RunTmp::make(&st, &uuid::Uuid::new_v4().to_string())?),
    };
    let tmp = run_tmp.as_ref().map_or(&st.tmp, |t| &t.path);
    let mut cmd = spec.clone();
    cmd.env = rebase_env(
        &spec.env,
        &policy.vars.tmp,
        tmp,
        &policy.vars.spill,
        &st.spill,
    );

    if policy.net.mode == crate::policy::NetMode::Allowlist {
        // The VM's proxy (same policy: the fingerprint says so).
        cmd.env = crate::net::with_proxy_env(&cmd.env);
        // The host's authorities, in this run's tmp as the command's
        // variables (rebased above) name them.
        crate::net::trust::install(tmp).map_err(SupervisorError::Trust)?;
    }
    let ctl = dir.join("ctl.sock");
    let agent_err = |source| SupervisorError::Agent {
        console: st.console.clone(),
        source,
    };
    tracing::debug!("tier vm (VM {name}): turn taken, tmp made at {:.3} s", at());
    let mut s = AgentSession::connect(&ctl, Duration::from_secs(5)).map_err(agent_err)?;
    s.hello(Duration::from_secs(10), &mut || true)
        .map_err(agent_err)?;
    tracing::debug!(
        "tier vm (VM {name}): supervisor said hello at {:.3} s",
        at()
    );
    // A run of its own turn: the agent empties the container's scratch
    // first, as the command's user, while no command runs there.
    let scrub = match run_tmp {
        Some(_) => SCRATCH.iter().map(std::path::PathBuf::from).collect(),
        None => Vec::new(),
    };
    // A run whose turn its caller holds is a `hull serve` session's exec:
    // what it leaves running is the session's, until the session ends.
    let keep_leftovers = run_tmp.is_none();
    let opts = ExecOptions {
        stdin: Some(Box::new(io::stdin())),
        uid_gid: Some((plan.uid, plan.gid)),
        interrupt: Some(irq.clone()),
        scrub,
        keep_leftovers,
        ..ExecOptions::default()
    };
    // The VM's proxy audits every run into the VM's spill: what it
    // refused while this run ran is said at its end.
    let audit = (policy.net.mode == crate::policy::NetMode::Allowlist).then(|| {
        let path = st.spill.join(crate::net::audit::FILE);
        let len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        (path, len)
    });
    let ran = s.exec(&cmd, sink, opts);
    tracing::debug!(
        "tier vm (VM {name}): the command ended at {:.3} s (its scratch emptied first)",
        at()
    );
    if let Some((path, len)) = audit {
        for line in crate::net::Audit::refused_since(&path, len) {
            eprintln!("hull: tier vm (VM {name}): {line}");
        }
    }
    use hull_protocol::ErrorCode;
    if let Err(AgentError::ExecFailed {
        code: ErrorCode::ScrubFailed | ErrorCode::TreeSurvived,
        ..
    }) = &ran
    {
        wait_until_down(&dir);
    }
    match ran {
        // The supervisor kills what its client leaves; the run ends now.
        Err(AgentError::Unresponsive { .. }) if irq_sig(&irq) != 0 => {
            Ok(ExitStatus::Interrupted(irq_sig(&irq)))
        }
        Err(AgentError::ExecFailed {
            code: ErrorCode::ScrubFailed,
            message,
        }) => Err(SupervisorError::Other(format!(
            "tier vm: VM {name}: cannot empty the container's {} before the run, so the \
             command did not run ({message}); the VM is taken down, and the next run starts \
             a fresh one",
            SCRATCH.join(", ")
        ))),
        r => r.map_err(agent_err),
    }
}

/// How long a VM an exec's end faulted has to be down.
const DOWN_WITHIN: Duration = Duration::from_secs(30);

/// After an exec whose end takes the VM down (its tree outlived its kill,
/// or the container's scratch could not be emptied), waits, at most
/// [`DOWN_WITHIN`] and still holding the VM's turn, until its supervisor
/// has recorded the fault and ended: the next run then finds the fault
/// and starts a fresh VM, instead of a VM that is going down.
fn wait_until_down(dir: &Path) {
    let until = std::time::Instant::now() + DOWN_WITHIN;
    while lock_held(dir) && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// When a fault took VM `name` down after it was ready, starts a fresh
/// one with the same project, policy and idle time, saying so (the caller
/// holds the VM's turn, so one run alone does it): never the VM that
/// faulted. None when the VM did not end by a fault.
fn fresh_after_fault(name: &str, dir: &Path) -> Option<Result<VmState, SupervisorError>> {
    let old = read_state(dir).filter(|s| s.faulted && s.state == Phase::Failed)?;
    if lock_held(dir) {
        return None;
    }
    eprintln!(
        "hull: tier vm: VM {name} was taken down by a fault ({}); starting a fresh one \
         (project {}, policy {})",
        old.error.as_deref().unwrap_or("unknown"),
        old.project.display(),
        old.policy
    );
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => return Some(Err(super::io_err("find", Path::new("/proc/self/exe"))(e))),
    };
    let o = super::UpOptions {
        name: name.into(),
        project: old.project,
        policy: old.policy,
        idle: Duration::from_secs(old.idle_secs),
    };
    Some(super::up(&exe, &o, Some(FRESH_WITHIN)).and_then(|_| ready_state(name, dir)))
}

/// How long a fresh VM after a fault may take to be ready.
const FRESH_WITHIN: Duration = Duration::from_secs(300);

/// VM `name`'s state (its directory `dir`), when it is up and ready; a VM
/// a fault ended says so, with the fault.
fn ready_state(name: &str, dir: &Path) -> Result<VmState, SupervisorError> {
    if !lock_held(dir) {
        return Err(match read_state(dir) {
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
    let st = read_state(dir).ok_or_else(|| SupervisorError::NotUp { name: name.into() })?;
    if st.state != Phase::Ready {
        return Err(SupervisorError::NotReady {
            name: name.into(),
            state: st.state,
            detail: st.error.map(|e| format!(": {e}")).unwrap_or_default(),
        });
    }
    Ok(st)
}

/// What the runs' user may write in the container's own filesystem (its
/// scratch directories and its home there), emptied before each run of a
/// kept VM that holds its own turn ([`hull_protocol::Exec::scrub`]: by
/// the agent, as the command's user, before the command starts). Shares
/// mounted below them are another filesystem and stay.
const SCRATCH: [&str; 5] = ["/tmp", "/var/tmp", "/run/lock", "/dev/shm", "/home/hull"];

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
