//! Tier 2 on Linux: bubblewrap namespaces and mounts, plus seccomp.
//!
//! The argv comes from `policy::lower::bwrap` (pure, golden-tested); this
//! module finds bwrap once at an absolute path, probes that it can create
//! the namespaces it needs, and builds the command with the seccomp filter
//! passed as a file descriptor (`--seccomp FD`).

use std::ffi::OsString;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use crate::policy::lower::bwrap::BwrapPlan;
use crate::probe::{Helper, Probe};
use crate::Tier;

const FIXED: &[&str] = &["/usr/bin/bwrap", "/usr/local/bin/bwrap", "/bin/bwrap"];

#[derive(Debug, thiserror::Error)]
pub enum BwrapError {
    #[error("tier bwrap: bubblewrap is not installed (looked in {} and PATH); install it with `apt-get install bubblewrap`, or ask for a lower tier explicitly with --tier landlock", FIXED.join(", "))]
    Missing,
    #[error("tier bwrap: {path} cannot create namespaces: {detail}")]
    Unusable { path: PathBuf, detail: String },
    #[error("tier bwrap: {0}")]
    Seccomp(#[from] crate::seccomp::SeccompError),
    #[error("tier bwrap: cannot pass the seccomp filter: {0}")]
    SeccompFd(std::io::Error),
    #[error("tier bwrap: cannot pass the command's environment: {0}")]
    EnvFd(#[source] std::io::Error),
    #[error("tier bwrap: the environment variable {name:?} holds a NUL byte or its name an `=`; the command did not run")]
    BadEnv { name: String },
    #[error("tier bwrap: bubblewrap could not set up the sandbox (its message is above); the command did not run")]
    SetupFailed,
    /// bwrap itself was killed while the command ran (the command died
    /// with it: `--die-with-parent`).
    #[error("tier bwrap: bubblewrap itself was killed by signal {signal} while the command ran (by someone on the host); the command was killed with it, and its exit status is unknown")]
    Died { signal: i32 },
}

/// The bwrap binary, found once.
pub fn binary() -> Option<&'static PathBuf> {
    static BIN: OnceLock<Option<PathBuf>> = OnceLock::new();
    BIN.get_or_init(|| crate::launch::find_binary("bwrap", FIXED))
        .as_ref()
}

/// `bubblewrap 0.8.0`, or `unknown`.
pub fn version(bin: &PathBuf) -> String {
    Command::new(bin)
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

/// Probes the tier: bwrap present, and able to unshare every namespace.
pub fn probe() -> Probe {
    let Some(bin) = binary() else {
        return Probe::unavailable(Tier::Bwrap, BwrapError::Missing.to_string());
    };
    let helpers = vec![Helper {
        name: "bwrap".into(),
        path: bin.display().to_string(),
        version: version(bin),
    }];
    match smoke_test(bin) {
        Ok(()) => Probe {
            helpers,
            ..Probe::available(Tier::Bwrap, "bubblewrap can unshare user, mount, pid, net, ipc, uts namespaces; unix connects brokered (writable mounts only), unix datagram sockets refused", Vec::new())
        },
        Err(detail) => Probe {
            helpers,
            ..Probe::unavailable(
                Tier::Bwrap,
                format!("{} cannot create namespaces ({detail}); unprivileged user namespaces may be blocked (sysctl kernel.unprivileged_userns_clone, AppArmor restrict_unprivileged_userns)", bin.display()),
            )
        },
    }
}

/// The cheap check before a run: bwrap is installed. If it cannot create
/// its namespaces the run fails with bwrap's own error, and nothing runs.
pub fn ready() -> Probe {
    match binary() {
        Some(bin) => Probe::available(
            Tier::Bwrap,
            format!("bwrap at {}", bin.display()),
            Vec::new(),
        ),
        None => Probe::unavailable(Tier::Bwrap, BwrapError::Missing.to_string()),
    }
}

fn smoke_test(bin: &PathBuf) -> Result<(), String> {
    let out = Command::new(bin)
        .args([
            "--unshare-all",
            "--unshare-user",
            "--die-with-parent",
            "--ro-bind",
            "/",
            "/",
            "--",
            "/bin/true",
        ])
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// The command to spawn, the descriptors the child needs (close ours after
/// spawning), and the read end of bwrap's status pipe.
#[derive(Debug)]
pub struct Prepared {
    pub command: Command,
    pub keep: Vec<OwnedFd>,
    pub status: OwnedFd,
}

/// Reads bwrap's `--json-status-fd` after it exited with `exit`: Ok when
/// the sandbox was set up and bwrap saw the command end, an error naming
/// the failure otherwise (the sandbox never came up, or bwrap itself was
/// killed: it reports the command's end as an `exit-code` line, and exits
/// with a code, never by a signal, when the command was killed).
pub fn check_started(status: OwnedFd, exit: &crate::exec::ExitStatus) -> Result<(), BwrapError> {
    let mut text = String::new();
    let mut f = std::fs::File::from(status);
    let _ = std::io::Read::take(&mut f, 64 * 1024).read_to_string(&mut text);
    verdict(&text, exit)
}

fn verdict(text: &str, exit: &crate::exec::ExitStatus) -> Result<(), BwrapError> {
    if !text.contains("\"child-pid\"") {
        return Err(BwrapError::SetupFailed);
    }
    match exit {
        crate::exec::ExitStatus::Signal(signal) if !text.contains("\"exit-code\"") => {
            Err(BwrapError::Died { signal: *signal })
        }
        _ => Ok(()),
    }
}

/// bwrap's arguments that give the command exactly `env`: `--clearenv`,
/// then `--setenv NAME VALUE` for each, NUL-separated for `--args FD`
/// (never on bwrap's command line, which every local user can read). A NUL
/// in a name or value would split it into arguments of bwrap's own, and an
/// `=` in a name cannot be set: both are refused.
fn env_args(env: &[(String, String)]) -> Result<Vec<u8>, BwrapError> {
    let mut out = b"--clearenv\0".to_vec();
    for (k, v) in env {
        if k.is_empty() || k.contains(['=', '\0']) || v.contains('\0') {
            return Err(BwrapError::BadEnv { name: k.clone() });
        }
        for part in ["--setenv", k, v] {
            out.extend_from_slice(part.as_bytes());
            out.push(0);
        }
    }
    Ok(out)
}

/// Builds the bwrap command for a lowered plan, the command getting `env`
/// (bwrap itself starts from [`crate::exec::helper_env`]). `share_net`:
/// keep the network namespace bwrap starts in, which hull made for the
/// command with its proxy's listener in it (`net::netns`), instead of a
/// new empty one.
pub fn command(
    plan: &BwrapPlan,
    argv: &[OsString],
    env: &[(String, String)],
    share_net: bool,
) -> Result<Prepared, BwrapError> {
    let bin = binary().ok_or(BwrapError::Missing)?;
    let prog = crate::seccomp::build(crate::seccomp::Profile::Bwrap)?;
    let fd = crate::launch::memfd_with("hull-seccomp", &crate::seccomp::to_bytes(&prog))
        .map_err(BwrapError::SeccompFd)?;
    let (status_r, status_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| BwrapError::SeccompFd(e.into()))?;
    let env_fd =
        crate::exec::memfd::sealed("hull-bwrap-env", &env_args(env)?).map_err(BwrapError::EnvFd)?;
    let mut cmd = Command::new(bin);
    cmd.args(&plan.args);
    cmd.arg("--args").arg(env_fd.as_raw_fd().to_string());
    if share_net {
        cmd.arg("--share-net");
    }
    cmd.arg("--seccomp").arg(fd.as_raw_fd().to_string());
    cmd.arg("--json-status-fd")
        .arg(status_w.as_raw_fd().to_string());
    let keep = vec![fd, status_w, env_fd];
    cmd.arg("--");
    cmd.args(argv);
    Ok(Prepared {
        command: cmd,
        keep,
        status: status_r,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::ExitStatus;

    const STARTED: &str = "{ \"child-pid\": 7, \"mnt-namespace\": 1, \"pid-namespace\": 2 }\n";

    #[test]
    fn the_environment_goes_to_the_command_only_and_cannot_add_arguments() {
        let args = env_args(&[("A".into(), "1 2".into()), ("B".into(), String::new())]).unwrap();
        assert_eq!(args, b"--clearenv\0--setenv\0A\x001 2\0--setenv\0B\0\0");
        for (k, v) in [
            ("A", "x\0--bind\0/\0/h"),
            ("A=B", "1"),
            ("", "1"),
            ("A\0", ""),
        ] {
            assert!(
                matches!(
                    env_args(&[(k.into(), v.into())]),
                    Err(BwrapError::BadEnv { .. })
                ),
                "{k:?}={v:?}"
            );
        }
    }

    #[test]
    fn a_killed_bwrap_is_told_from_a_killed_command() {
        let ended = format!("{STARTED}{{ \"exit-code\": 137 }}\n");
        assert!(verdict(&ended, &ExitStatus::Code(137)).is_ok());
        assert!(verdict(&ended, &ExitStatus::Code(0)).is_ok());
        assert!(matches!(
            verdict(STARTED, &ExitStatus::Signal(9)),
            Err(BwrapError::Died { signal: 9 })
        ));
        // hull's own kill (timeout, interrupt) is not a helper's death.
        assert!(verdict(STARTED, &ExitStatus::TimedOut).is_ok());
        assert!(verdict(STARTED, &ExitStatus::Interrupted(2)).is_ok());
        assert!(matches!(
            verdict("", &ExitStatus::Code(1)),
            Err(BwrapError::SetupFailed)
        ));
    }
}
