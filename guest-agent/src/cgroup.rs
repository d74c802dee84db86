//! Each command in a cgroup of its own, ended by `cgroup.kill`.
//!
//! In the container, the inner agent makes a child of its own cgroup for
//! every exec (`hull-exec-<agent pid>-<n>`); the command's process moves
//! into it (writing to `cgroup.procs` through a descriptor the agent opened)
//! before anything of it runs, so every process it ever starts is there,
//! wherever it reparents. Ending the tree is one write of `1` to
//! `cgroup.kill`: the kernel kills every member and every process forked
//! into it meanwhile, so no `/proc` walk can be outrun by a process that
//! forks whenever a pid frees. The shepherd stays outside, to reap and
//! report. Whether the tree is gone is the cgroup's `populated` flag; one
//! that stays populated past a bound (a process in uninterruptible sleep)
//! is said to the host, which takes the VM down.

use std::fs::File;
use std::io::{self, Read, Seek, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long a killed tree has to be gone.
pub const GONE_WITHIN: Duration = Duration::from_secs(10);

static NEXT: AtomicU64 = AtomicU64::new(1);

/// One exec's cgroup.
#[derive(Debug)]
pub struct ExecCgroup {
    path: PathBuf,
    /// Its `cgroup.procs`, opened by the agent: the command writes `0` to
    /// it between fork and exec.
    procs: File,
    kill: File,
    events: File,
}

#[derive(Debug, thiserror::Error)]
#[error("the command's cgroup {path}: cannot {what}: {source}")]
pub struct CgroupError {
    what: &'static str,
    path: PathBuf,
    #[source]
    source: io::Error,
}

/// The agent's own cgroup directory: `/sys/fs/cgroup` joined with its
/// cgroup v2 path (`0::/...` in `/proc/self/cgroup`).
fn own_dir() -> io::Result<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/cgroup")?;
    let rel = text
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or_else(|| io::Error::other("not in a cgroup v2 hierarchy"))?;
    if rel.split('/').any(|c| c == "..") {
        return Err(io::Error::other(format!("odd cgroup path {rel:?}")));
    }
    Ok(Path::new("/sys/fs/cgroup").join(rel.trim_start_matches('/')))
}

impl ExecCgroup {
    /// Makes a new cgroup for one exec below the agent's own.
    pub fn new() -> Result<ExecCgroup, CgroupError> {
        let base = own_dir().map_err(|source| CgroupError {
            what: "find the agent's cgroup",
            path: PathBuf::from("/proc/self/cgroup"),
            source,
        })?;
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = base.join(format!("hull-exec-{}-{n}", std::process::id()));
        let err = |what: &'static str, path: &Path| {
            let path = path.to_path_buf();
            move |source| CgroupError { what, path, source }
        };
        std::fs::create_dir(&path).map_err(err("make", &path))?;
        let open = |name: &str, write: bool| {
            let p = path.join(name);
            std::fs::OpenOptions::new()
                .read(!write)
                .write(write)
                .open(&p)
                .map_err(err("open its control file", &p))
        };
        let made = (|| {
            Ok::<_, CgroupError>(ExecCgroup {
                procs: open("cgroup.procs", true)?,
                kill: open("cgroup.kill", true)?,
                events: open("cgroup.events", false)?,
                path: path.clone(),
            })
        })();
        if made.is_err() {
            let _ = std::fs::remove_dir(&path);
        }
        made
    }

    /// The descriptor the command writes `0` to, joining the cgroup.
    pub fn procs_fd(&self) -> RawFd {
        self.procs.as_raw_fd()
    }

    /// Kills every process in the cgroup (and any forked into it while
    /// the kill runs).
    pub fn kill(&self) {
        if let Err(e) = (&self.kill).write_all(b"1") {
            tracing::error!(cgroup = %self.path.display(), "cgroup.kill: {e}");
        }
    }

    /// SIGKILL to the process of each thread `cgroup.threads` lists: the
    /// kernel's `cgroup.kill` walks processes by their leader, and passes
    /// over one whose leader thread exited while others run on (seen on
    /// 6.12). Each thread is pinned by a pidfd and checked to be in this
    /// cgroup before the signal, so a recycled id is never signalled.
    fn kill_listed(&self) {
        /// `PIDFD_THREAD` (Linux 6.9): a pidfd for a thread, not only a leader.
        const PIDFD_THREAD: libc::c_int = libc::O_EXCL;
        let Ok(text) = std::fs::read_to_string(self.path.join("cgroup.threads")) else {
            return;
        };
        let rel = self
            .path
            .strip_prefix("/sys/fs/cgroup")
            .map(|r| format!("0::/{}", r.display()))
            .unwrap_or_default();
        for tid in text
            .lines()
            .filter_map(|l| l.trim().parse::<libc::pid_t>().ok())
        {
            // SAFETY: pidfd_open(2) with integer arguments.
            let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, tid, PIDFD_THREAD) };
            if fd < 0 {
                continue;
            }
            // SAFETY: pidfd_open returned a new descriptor this owns.
            let fd = unsafe {
                <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as RawFd)
            };
            let ours = std::fs::read_to_string(format!("/proc/{tid}/cgroup"))
                .is_ok_and(|t| t.lines().any(|l| l == rel));
            if ours {
                // SAFETY: pidfd_send_signal(2) on the pinned thread; a
                // fatal signal ends its whole process.
                unsafe {
                    libc::syscall(
                        libc::SYS_pidfd_send_signal,
                        fd.as_raw_fd(),
                        libc::SIGKILL,
                        std::ptr::null::<libc::siginfo_t>(),
                        0u32,
                    )
                };
            }
        }
    }

    /// Whether a process is still in the cgroup (`populated 1`); an
    /// unreadable file counts as populated.
    pub fn populated(&self) -> bool {
        let mut text = String::new();
        let mut f = &self.events;
        if f.seek(io::SeekFrom::Start(0)).is_err() || f.read_to_string(&mut text).is_err() {
            return true;
        }
        !text.lines().any(|l| l.trim() == "populated 0")
    }

    /// Waits up to `bound` for the cgroup to be empty, killing what it
    /// still lists every 100 ms; whether it is.
    pub fn wait_gone(&self, bound: Duration) -> bool {
        let end = Instant::now() + bound;
        let mut round = 0u32;
        loop {
            if !self.populated() {
                return true;
            }
            if Instant::now() >= end {
                return false;
            }
            if round.is_multiple_of(10) {
                self.kill_listed();
            }
            round += 1;
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How many processes are still in it.
    pub fn left(&self) -> usize {
        std::fs::read_to_string(self.path.join("cgroup.procs"))
            .map(|t| t.lines().count())
            .unwrap_or(0)
    }
}

impl Drop for ExecCgroup {
    fn drop(&mut self) {
        // Empty by now, or left for the host to take the VM down.
        if !self.populated() {
            if let Err(e) = std::fs::remove_dir(&self.path) {
                tracing::warn!(cgroup = %self.path.display(), "cannot remove: {e}");
            }
        }
    }
}
