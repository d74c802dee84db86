//! The side of `hull run --tier3 --vm NAME`: a session with the VM's
//! supervisor, the run's env rebased onto the VM's own dirs.

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::exec::{CommandSpec, ExitStatus, OutputSink};
use crate::policy::lower::vm::VmPlan;
use crate::policy::Policy;
use crate::vm::agent::{AgentError, AgentSession, ExecOptions};

use super::{fingerprint, lock_held, read_state, vm_dir, Phase, SupervisorError, VmState};

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
    let mut want = fingerprint(plan);
    want.push(super::net_fingerprint(&policy.net));
    want.push(super::userland_fingerprint(
        &crate::vm::assemble::recipe_for(&policy.vm)?,
    ));
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
    if policy.net.mode == crate::policy::NetMode::Allowlist {
        // The VM's proxy (same policy: the fingerprint says so).
        cmd.env = crate::net::with_proxy_env(&cmd.env);
    }
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
    // The VM's proxy audits every run into the VM's spill: what it
    // refused while this run ran is said at its end.
    let audit = (policy.net.mode == crate::policy::NetMode::Allowlist).then(|| {
        let path = st.spill.join(crate::net::audit::FILE);
        let len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        (path, len)
    });
    let ran = s.exec(&cmd, sink, opts);
    if let Some((path, len)) = audit {
        for line in crate::net::Audit::refused_since(&path, len) {
            eprintln!("hull: tier vm (VM {name}): {line}");
        }
    }
    match ran {
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
