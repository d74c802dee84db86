//! virtiofsd started (namespace sandbox, chroot only as root after it
//! failed), waited for until it listens, logged with a cap, supervised and
//! stopped; a stopped worker is killed with it.

use std::fs;
use std::io::{self, BufRead, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use super::{SandboxMode, VirtiofsdSpec};
use crate::proc::{self, Supervised};
use crate::runtime::placeholder::Held;

use super::mask::{hold_placeholders, prepare_view, MountPlan};

/// How long virtiofsd may take to reach "waiting for connection".
pub const START_DEADLINE: Duration = Duration::from_secs(15);
/// Log bytes kept per virtiofsd (the rest is dropped).
const MAX_LOG: u64 = 1 << 20;
/// Longest log line read from virtiofsd.
const MAX_LINE: usize = 8192;
const READY_LINE: &str = "Waiting for vhost-user socket connection";

#[derive(Debug, thiserror::Error)]
pub enum VirtiofsdError {
    #[error("tier vm: share {tag}: shared dir {path} is not a directory")]
    NotADir { tag: String, path: PathBuf },
    #[error(
        "tier vm: share {tag}: protected path {path} is {what}; tier vm can only mask real \
         files and directories (a mount would follow the link), so it refuses to share {share}"
    )]
    SymlinkMask {
        tag: String,
        path: PathBuf,
        what: &'static str,
        share: PathBuf,
    },
    #[error("tier vm: share {tag}: protected path {path} is not below the shared dir {share}")]
    MaskOutside {
        tag: String,
        path: PathBuf,
        share: PathBuf,
    },
    #[error("tier vm: share {tag}: {source}")]
    Placeholder {
        tag: String,
        #[source]
        source: crate::runtime::placeholder::PlaceholderError,
    },
    #[error("tier vm: share {tag}: {what}: {source}")]
    Io {
        tag: String,
        what: String,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Proc(#[from] proc::ProcError),
    #[error(
        "tier vm: virtiofsd for share {tag} ({dir}) exited before serving ({status}); log {log}:\n{tail}"
    )]
    Exited {
        tag: String,
        dir: PathBuf,
        status: String,
        log: PathBuf,
        tail: String,
    },
    #[error(
        "tier vm: virtiofsd for share {tag} did not get ready within {secs}s; log {log}:\n{tail}"
    )]
    Timeout {
        tag: String,
        secs: u64,
        log: PathBuf,
        tail: String,
    },
}

/// A running virtiofsd. Killed on drop.
#[derive(Debug)]
pub struct Virtiofsd {
    pub spec: VirtiofsdSpec,
    /// The sandbox actually used (chroot only after namespace failed).
    pub sandbox_used: SandboxMode,
    pub log: PathBuf,
    proc: Supervised,
    /// Dropped after `proc` (fields drop in order): a placeholder goes
    /// only once the mount namespace with its mask is gone.
    placeholders: Held,
}

impl Virtiofsd {
    /// Starts virtiofsd for `spec` with its pid file in `dir` and its log
    /// in `log_dir`, and waits until it listens. Falls back from
    /// namespace to chroot only when the namespace sandbox itself fails
    /// and hull is root.
    pub fn start(
        bin: &Path,
        spec: &VirtiofsdSpec,
        dir: &Path,
        log_dir: &Path,
    ) -> Result<Self, VirtiofsdError> {
        let mut v = Self::start_all(bin, std::slice::from_ref(spec), dir, log_dir)?;
        Ok(v.remove(0))
    }

    /// [`Virtiofsd::start`] for every spec: all are spawned first, then
    /// waited for, so their start-ups overlap. On any error the ones
    /// already started are killed (dropped).
    pub fn start_all(
        bin: &Path,
        specs: &[VirtiofsdSpec],
        dir: &Path,
        log_dir: &Path,
    ) -> Result<Vec<Self>, VirtiofsdError> {
        for spec in specs {
            prepare_view(spec)?;
            if !spec.shared_dir.is_dir() {
                return Err(VirtiofsdError::NotADir {
                    tag: spec.tag.clone(),
                    path: spec.shared_dir.clone(),
                });
            }
        }
        let mut held = Vec::new();
        for spec in specs {
            held.push(hold_placeholders(spec)?);
        }
        let mut pending = Vec::new();
        for spec in specs {
            pending.push(spawn_once(bin, spec, dir, log_dir)?);
        }
        let mut out = Vec::new();
        for ((spec, p), placeholders) in specs.iter().zip(pending).zip(held) {
            let mut v = Self::ready_or_fallback(bin, spec, dir, log_dir, p.wait())?;
            v.placeholders = placeholders;
            out.push(v);
        }
        Ok(out)
    }

    fn ready_or_fallback(
        bin: &Path,
        spec: &VirtiofsdSpec,
        dir: &Path,
        log_dir: &Path,
        waited: Result<(Supervised, PathBuf), VirtiofsdError>,
    ) -> Result<Self, VirtiofsdError> {
        match waited {
            Ok((proc, log)) => Ok(Virtiofsd {
                spec: spec.clone(),
                sandbox_used: spec.sandbox,
                log,
                proc,
                placeholders: Held::default(),
            }),
            Err(VirtiofsdError::Exited { tail, .. })
                if spec.sandbox == SandboxMode::Namespace
                    && tail.contains("Error entering sandbox")
                    // SAFETY: geteuid has no preconditions.
                    && unsafe { libc::geteuid() } == 0 =>
            {
                tracing::warn!(
                    "tier vm: virtiofsd for share {} cannot use --sandbox=namespace on this \
                     host ({}); falling back to --sandbox=chroot, which does not isolate pids \
                     or network",
                    spec.tag,
                    tail.lines().last().unwrap_or("")
                );
                let mut s = spec.clone();
                s.sandbox = SandboxMode::Chroot;
                let (proc, log) = start_once(bin, &s, dir, log_dir)?;
                Ok(Virtiofsd {
                    spec: s,
                    sandbox_used: SandboxMode::Chroot,
                    log,
                    proc,
                    placeholders: Held::default(),
                })
            }
            Err(e) => Err(e),
        }
    }

    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// True while the process runs.
    pub fn is_running(&mut self) -> bool {
        self.proc.try_wait().is_none()
    }

    /// How it ended, once it has (reaps it).
    pub fn try_wait(&mut self) -> Option<std::process::ExitStatus> {
        self.proc.try_wait()
    }

    /// True when it, or the worker it forked, is stopped (state `T`):
    /// the guest's I/O on the share then waits.
    pub fn is_stopped(&mut self) -> bool {
        self.proc.is_stopped()
    }

    /// Stops it (SIGTERM, then SIGKILL after a moment) and removes placeholders.
    pub fn stop(mut self) {
        self.proc.terminate();
        if self.proc.wait_timeout(Duration::from_secs(2)).is_none() {
            self.proc.kill_children();
            self.proc.kill();
        }
    }
}

impl Drop for Virtiofsd {
    fn drop(&mut self) {
        // A stopped worker would ignore the SIGTERM its parent's death
        // sends it: SIGKILL it first.
        self.proc.kill_children();
        self.proc.kill();
        let _ = fs::remove_file(&self.spec.socket);
        let mut pid = self.spec.socket.clone().into_os_string();
        pid.push(".pid");
        let _ = fs::remove_file(pid);
    }
}

fn start_once(
    bin: &Path,
    spec: &VirtiofsdSpec,
    dir: &Path,
    log_dir: &Path,
) -> Result<(Supervised, PathBuf), VirtiofsdError> {
    spawn_once(bin, spec, dir, log_dir)?.wait()
}

/// A virtiofsd started and not yet known to listen.
struct Pending {
    tag: String,
    shared_dir: PathBuf,
    child: Supervised,
    log: PathBuf,
    ready: mpsc::Receiver<()>,
}

fn spawn_once(
    bin: &Path,
    spec: &VirtiofsdSpec,
    dir: &Path,
    log_dir: &Path,
) -> Result<Pending, VirtiofsdError> {
    let io_err = |what: &str| {
        let tag = spec.tag.clone();
        let what = what.to_string();
        move |source| VirtiofsdError::Io { tag, what, source }
    };
    let _ = fs::remove_file(&spec.socket);
    let log = log_dir.join(format!("vfs-{}.log", spec.tag));
    let mut log_file = fs::File::create(&log).map_err(io_err("create log"))?;
    let mut cmd = Command::new(bin);
    cmd.args(spec.argv())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .env_clear()
        .env("PATH", crate::exec::HELPER_PATH);
    proc::tie_to_parent(&mut cmd);
    if !spec.masks.is_empty() || !spec.views.is_empty() {
        let plan = MountPlan::new(spec, dir).map_err(io_err("prepare masks"))?;
        // SAFETY: the hook runs in the forked child before exec; it only
        // makes system calls (unshare, open, write, close, mount) on data
        // prepared before the fork, and allocates nothing.
        unsafe {
            cmd.pre_exec(move || plan.apply());
        }
    }
    let mut child = Supervised::spawn(cmd, &format!("vfs-{}", spec.tag), dir)?;
    // The stderr pipe: forward to the log, report readiness.
    let (tx, rx) = mpsc::channel::<()>();
    let stderr = child.take_stderr();
    if let Some(stderr) = stderr {
        std::thread::Builder::new()
            .name(format!("vfs-{}-log", spec.tag))
            .spawn(move || {
                let mut r = io::BufReader::new(stderr);
                let mut written: u64 = 0;
                let mut line = Vec::new();
                let mut tx = Some(tx);
                loop {
                    line.clear();
                    match read_line_bounded(&mut r, &mut line, MAX_LINE) {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    }
                    if written < MAX_LOG {
                        let _ = log_file.write_all(&line);
                        written += line.len() as u64;
                    }
                    if String::from_utf8_lossy(&line).contains(READY_LINE) {
                        if let Some(t) = tx.take() {
                            let _ = t.send(());
                        }
                    }
                }
            })
            .map_err(io_err("start log thread"))?;
    }
    Ok(Pending {
        tag: spec.tag.clone(),
        shared_dir: spec.shared_dir.clone(),
        child,
        log,
        ready: rx,
    })
}

impl Pending {
    /// Waits until it says it listens; an exit or the deadline is an error.
    fn wait(self) -> Result<(Supervised, PathBuf), VirtiofsdError> {
        let Pending {
            tag,
            shared_dir,
            mut child,
            log,
            ready,
        } = self;
        let deadline = std::time::Instant::now() + START_DEADLINE;
        loop {
            match ready.recv_timeout(Duration::from_millis(50)) {
                Ok(()) => return Ok((child, log)),
                Err(mpsc::RecvTimeoutError::Timeout)
                | Err(mpsc::RecvTimeoutError::Disconnected) => {}
            }
            if let Some(status) = child.try_wait() {
                // Give the log thread a moment to flush the last lines.
                std::thread::sleep(Duration::from_millis(50));
                return Err(VirtiofsdError::Exited {
                    tag,
                    dir: shared_dir,
                    status: status.to_string(),
                    tail: proc::log_tail(&log, 2000),
                    log,
                });
            }
            if std::time::Instant::now() >= deadline {
                return Err(VirtiofsdError::Timeout {
                    tag,
                    secs: START_DEADLINE.as_secs(),
                    tail: proc::log_tail(&log, 2000),
                    log,
                });
            }
        }
    }
}

/// Reads one line of at most `max` bytes (a longer line is cut there).
fn read_line_bounded<R: BufRead>(r: &mut R, out: &mut Vec<u8>, max: usize) -> io::Result<usize> {
    loop {
        let buf = r.fill_buf()?;
        if buf.is_empty() {
            return Ok(out.len());
        }
        let room = max.saturating_sub(out.len());
        let (take, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) if i < room => (i + 1, true),
            _ if buf.len() >= room => (room, true),
            _ => (buf.len(), false),
        };
        out.extend_from_slice(&buf[..take]);
        r.consume(take);
        if done {
            if out.last() != Some(&b'\n') {
                out.push(b'\n');
            }
            return Ok(out.len());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_lines() {
        let mut r = io::BufReader::with_capacity(4, &b"abcdefgh\nxy\n"[..]);
        let mut l = Vec::new();
        read_line_bounded(&mut r, &mut l, 5).unwrap();
        assert_eq!(l, b"abcde\n");
        l.clear();
        read_line_bounded(&mut r, &mut l, 5).unwrap();
        assert_eq!(l, b"fgh\n");
        l.clear();
        read_line_bounded(&mut r, &mut l, 5).unwrap();
        assert_eq!(l, b"xy\n");
        l.clear();
        assert_eq!(read_line_bounded(&mut r, &mut l, 5).unwrap(), 0);
    }
}
