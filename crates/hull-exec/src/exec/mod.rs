//! Starting a lowered command, streaming its output, and ending its tree.
//!
//! The contract every tier shares: the command's stdout and stderr reach the
//! caller as they are produced (byte for byte, or through the spill sink when
//! `--spill` is asked for); stdin is passed through; the exit status maps to
//! hull's exit code ([`ExitStatus::exit_code`]); a timeout or Ctrl-C ends the
//! whole process tree, including grandchildren that called `setsid`.

#[cfg(target_os = "linux")]
pub mod cgroup;
#[cfg(target_os = "linux")]
pub mod domain;
#[cfg(target_os = "linux")]
pub mod env_fd;
#[cfg(unix)]
pub mod fds;
#[cfg(target_os = "linux")]
pub mod memfd;
#[cfg(not(target_os = "linux"))]
pub mod portable;
#[cfg(unix)]
pub mod process;
#[cfg(unix)]
pub mod resolve;
#[cfg(target_os = "linux")]
pub mod spawn;
#[cfg(unix)]
pub mod terminal;

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

/// The search path of every helper hull starts.
pub const HELPER_PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";

/// The whole environment of every helper hull starts (its own re-exec as
/// the Landlock helper, `bwrap`, the network proxy, virtiofsd, QEMU): built
/// by hull, never the command's. The command's environment (`--env`, a
/// batch job's or a session exec's `env`, the policy's) is applied at the
/// command's own `execve` only, so an `LD_PRELOAD` or `LD_LIBRARY_PATH` it
/// sets acts inside the boundary, never in a helper before it is in place.
pub fn helper_env() -> Vec<(String, String)> {
    vec![("PATH".into(), HELPER_PATH.into())]
}

/// What to run, independent of the tier that runs it.
#[derive(Debug, Clone)]
pub struct CommandSpec {
    pub argv: Vec<OsString>,
    /// Working directory (inside the sandbox's view; the project by default).
    pub cwd: PathBuf,
    /// The complete environment of the command (already filtered by policy).
    pub env: Vec<(String, String)>,
    /// Wall-time limit for the whole tree.
    pub timeout: Option<Duration>,
    /// A user of tier 3's container to run as, by name, in place of the
    /// plan's uid (`hull run --user`, a session's `user=`). The process
    /// tiers run only as the sandbox's own user: `hull run` refuses a
    /// user there before any tier starts, and they never read this.
    pub user: Option<String>,
}

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ExitStatus {
    /// Exited with this code.
    Code(i32),
    /// Killed by this signal.
    Signal(i32),
    /// Killed by hull after the wall-time limit.
    TimedOut,
    /// Killed by hull because hull received this signal (Ctrl-C is 2).
    Interrupted(i32),
}

impl ExitStatus {
    /// The exit code hull itself exits with: the command's code, 128+N for
    /// signal N, 124 after a timeout, 128+N when hull was interrupted by N.
    pub fn exit_code(self) -> i32 {
        match self {
            ExitStatus::Code(c) => c,
            ExitStatus::Signal(n) | ExitStatus::Interrupted(n) => 128 + n,
            ExitStatus::TimedOut => crate::EXIT_TIMEOUT,
        }
    }
}

/// Where the command's output goes. Implementations must not block for long:
/// they are called as output arrives.
pub trait OutputSink: Send {
    fn stdout(&mut self, data: &[u8]) -> std::io::Result<()>;
    fn stderr(&mut self, data: &[u8]) -> std::io::Result<()>;
    /// Called once after the command ended and all output was delivered.
    fn finish(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("cannot start {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("waiting for the command failed: {0}")]
    Wait(#[source] std::io::Error),
    #[error("cannot install signal handlers: {0}")]
    Signals(#[source] std::io::Error),
    #[error("writing the command's output failed: {0}")]
    Output(#[source] std::io::Error),
    #[error("{name} ended while the command ran ({how}); the command was ended with it")]
    HelperEnded { name: String, how: String },
}

/// Maps a host exit status: code, or signal.
pub fn map_status(st: std::process::ExitStatus) -> ExitStatus {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = st.signal() {
            return ExitStatus::Signal(sig);
        }
    }
    ExitStatus::Code(st.code().unwrap_or(crate::EXIT_HULL_FAILED))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes() {
        assert_eq!(ExitStatus::Code(3).exit_code(), 3);
        assert_eq!(ExitStatus::Signal(9).exit_code(), 137);
        assert_eq!(ExitStatus::TimedOut.exit_code(), 124);
        assert_eq!(ExitStatus::Interrupted(2).exit_code(), 130);
    }
}
