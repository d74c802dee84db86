//! A cgroup v2 of its own for one run's process tree, so that ending the
//! tree is one write the kernel makes certain (`cgroup.kill`, Linux 5.14)
//! rather than a chase through `/proc` that a process changing its pid in
//! a loop can outrun.
//!
//! The cgroup is made below hull's own (`/proc/self/cgroup`, the `0::`
//! line), in the cgroup2 mount `/proc/self/mountinfo` names; the child is
//! started inside it (`clone3(CLONE_INTO_CGROUP)`, see [`super::spawn`]),
//! so everything the command starts is born inside. The
//! command cannot leave it: the landlock tier grants no write under
//! `/sys`, and the sandbox user (when hull is root) owns nothing there.
//!
//! No process of the run outlives hull, however hull ends: beside the
//! cgroup hull forks a watchdog (before the command starts; hull's own
//! code, no exec, raw system calls only) that holds the read end of a pipe
//! only hull writes to, and the cgroup's `cgroup.kill`. When hull is gone
//! (SIGKILL included) the pipe reads EOF and the watchdog kills the cgroup
//! and removes it. It ignores the terminal's signals (Ctrl-C reaches hull,
//! which ends the run itself), holds none of hull's other descriptors, and
//! is out of the command's reach: outside its Landlock domain, which
//! scopes signals and ptrace.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("no cgroup v2 hierarchy is mounted (looked in /proc/self/mountinfo)")]
    NoHierarchy,
    #[error("hull's own cgroup v2 is unknown (no 0:: line in /proc/self/cgroup)")]
    NoOwnCgroup,
    #[error("cannot create {path}: {source}")]
    Create {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} has no cgroup.kill (needs Linux 5.14)")]
    NoKill { path: PathBuf },
}

/// The run's cgroup: killed and removed on drop.
#[derive(Debug)]
pub struct RunCgroup {
    dir: PathBuf,
    /// The directory itself, for `clone3(CLONE_INTO_CGROUP)`.
    dir_fd: File,
    procs: File,
    /// Kills the cgroup if hull dies first.
    watchdog: Option<Watchdog>,
}

/// The watchdog of a run's cgroup (see the module comment).
#[derive(Debug)]
struct Watchdog {
    pid: libc::pid_t,
    /// The write end of the pipe: closing it (or hull's death) wakes it.
    alive: Option<std::os::fd::OwnedFd>,
}

impl Watchdog {
    fn start(dir: &Path) -> io::Result<Watchdog> {
        use std::os::fd::AsRawFd;
        use std::os::unix::ffi::OsStrExt;
        let kill = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(dir.join("cgroup.kill"))?;
        let dir_c = std::ffi::CString::new(dir.as_os_str().as_bytes())
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
        let (r_fd, k_fd) = (r.as_raw_fd(), kill.as_raw_fd());
        let (lo, hi) = (
            r_fd.min(k_fd) as libc::c_uint,
            r_fd.max(k_fd) as libc::c_uint,
        );
        // SAFETY: fork; the child only makes raw, async-signal-safe system
        // calls (prctl, signal, close_range, read, write, rmdir, nanosleep,
        // _exit) on values prepared before the fork, and never returns.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(io::Error::last_os_error());
        }
        if pid == 0 {
            // SAFETY: as above; the child of the fork.
            unsafe {
                libc::prctl(libc::PR_SET_NAME, c"hull-watchdog".as_ptr(), 0, 0, 0);
                for sig in [
                    libc::SIGINT,
                    libc::SIGQUIT,
                    libc::SIGHUP,
                    libc::SIGTSTP,
                    libc::SIGTTIN,
                    libc::SIGTTOU,
                    libc::SIGPIPE,
                ] {
                    libc::signal(sig, libc::SIG_IGN);
                }
                // Everything but the pipe's read end and cgroup.kill.
                if lo > 0 {
                    libc::syscall(libc::SYS_close_range, 0u32, lo - 1, 0u32);
                }
                if hi > lo + 1 {
                    libc::syscall(libc::SYS_close_range, lo + 1, hi - 1, 0u32);
                }
                libc::syscall(libc::SYS_close_range, hi + 1, libc::c_uint::MAX, 0u32);
                let mut b = [0u8; 16];
                loop {
                    let n = libc::read(r_fd, b.as_mut_ptr().cast(), b.len());
                    if n == 0 || (n < 0 && *libc::__errno_location() != libc::EINTR) {
                        break;
                    }
                }
                libc::write(k_fd, b"1".as_ptr().cast(), 1);
                let pause = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 10_000_000,
                };
                for _ in 0..1000 {
                    if libc::rmdir(dir_c.as_ptr()) == 0 || *libc::__errno_location() == libc::ENOENT
                    {
                        break;
                    }
                    libc::nanosleep(&pause, std::ptr::null_mut());
                }
                libc::_exit(0);
            }
        }
        Ok(Watchdog {
            pid,
            alive: Some(w),
        })
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        drop(self.alive.take());
        let mut status = 0;
        // SAFETY: waits for our own child, which exits at once now.
        unsafe {
            libc::waitpid(self.pid, &mut status, 0);
        }
    }
}

impl RunCgroup {
    /// Makes `hull-<id>` below hull's own cgroup.
    pub fn create(id: &str) -> Result<RunCgroup, CgroupError> {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
            .map_err(|_| CgroupError::NoHierarchy)?;
        let mount = cgroup2_mount(&mountinfo).ok_or(CgroupError::NoHierarchy)?;
        let own = std::fs::read_to_string("/proc/self/cgroup")
            .ok()
            .and_then(|t| own_path(&t))
            .ok_or(CgroupError::NoOwnCgroup)?;
        let parent = mount.join(own.trim_start_matches('/'));
        remove_stale(&parent);
        let dir = parent.join(format!("hull-{id}"));
        std::fs::create_dir(&dir).map_err(|source| CgroupError::Create {
            path: dir.clone(),
            source,
        })?;
        let fail = |e: CgroupError| {
            let _ = std::fs::remove_dir(&dir);
            e
        };
        if !dir.join("cgroup.kill").exists() {
            return Err(fail(CgroupError::NoKill { path: dir.clone() }));
        }
        let procs = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.join("cgroup.procs"))
            .map_err(|source| {
                fail(CgroupError::Create {
                    path: dir.join("cgroup.procs"),
                    source,
                })
            })?;
        let dir_fd = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY)
            .open(&dir)
            .map_err(|source| {
                fail(CgroupError::Create {
                    path: dir.clone(),
                    source,
                })
            })?;
        let watchdog = Watchdog::start(&dir).map_err(|source| {
            fail(CgroupError::Create {
                path: dir.join("cgroup.kill"),
                source,
            })
        })?;
        Ok(RunCgroup {
            dir,
            dir_fd,
            procs,
            watchdog: Some(watchdog),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The watchdog's pid: hull's own child, not the command's, spared by
    /// the sweeps that end the tree.
    pub fn watchdog_pid(&self) -> Option<i32> {
        self.watchdog.as_ref().map(|w| w.pid)
    }

    /// The cgroup's directory, which a child is cloned into
    /// (close-on-exec).
    pub fn dir_fd(&self) -> BorrowedFd<'_> {
        self.dir_fd.as_fd()
    }

    /// The `cgroup.procs` a forked child writes `0` to, before exec, to
    /// move itself in (close-on-exec).
    pub fn procs_fd(&self) -> BorrowedFd<'_> {
        self.procs.as_fd()
    }

    /// Kills every process in the cgroup.
    pub fn kill(&self) {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .write(true)
            .open(self.dir.join("cgroup.kill"))
        {
            let _ = f.write_all(b"1");
        }
    }

    /// Kills every process in the cgroup and waits until none is left
    /// (they die at once; polled every 200 µs); false after `limit`.
    pub fn kill_and_wait(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        self.kill();
        while !self.is_empty() {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        true
    }

    /// Whether no process is left in it.
    pub fn is_empty(&self) -> bool {
        std::fs::read_to_string(self.dir.join("cgroup.events"))
            .map(|t| t.lines().any(|l| l == "populated 0"))
            .unwrap_or(true)
    }
}

impl Drop for RunCgroup {
    fn drop(&mut self) {
        self.kill_and_wait(Duration::from_secs(5));
        let removed = std::fs::remove_dir(&self.dir);
        // Woken once the cgroup is gone: it finds nothing left to do.
        drop(self.watchdog.take());
        if let Err(e) = removed {
            tracing::warn!("cannot remove the run's cgroup {}: {e}", self.dir.display());
        }
    }
}

/// Removes the cgroups of runs whose hull died before removing them (a
/// signal before its handlers were in place, SIGKILL): empty and older
/// than a minute, so never one a starting run is about to move into.
fn remove_stale(parent: &Path) {
    let Ok(rd) = std::fs::read_dir(parent) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name();
        if !name.to_string_lossy().starts_with("hull-") {
            continue;
        }
        let dir = e.path();
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > Duration::from_secs(60));
        let empty = std::fs::read_to_string(dir.join("cgroup.events"))
            .is_ok_and(|t| t.lines().any(|l| l == "populated 0"));
        if old && empty {
            let _ = std::fs::remove_dir(&dir);
        }
    }
}

/// The mount point of the cgroup2 hierarchy in a mountinfo text.
fn cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        if right.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        let point = left.split_whitespace().nth(4)?;
        Some(PathBuf::from(crate::mountinfo::unescape(point)))
    })
}

/// hull's path in the cgroup2 hierarchy, from a /proc/self/cgroup text.
fn own_path(text: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_hierarchy_and_our_place_in_it() {
        let hybrid =
            "35 24 0:30 / /sys/fs/cgroup/unified rw,relatime shared:10 - cgroup2 cgroup2 rw\n\
                      36 24 0:31 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n";
        assert_eq!(
            cgroup2_mount(hybrid),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        let unified = "29 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(
            cgroup2_mount(unified),
            Some(PathBuf::from("/sys/fs/cgroup"))
        );
        assert_eq!(cgroup2_mount("1 2 0:1 / / rw - ext4 /dev/vda rw\n"), None);
        assert_eq!(
            own_path("4:memory:/x\n0::/user.slice/u.scope\n").as_deref(),
            Some("/user.slice/u.scope")
        );
        assert_eq!(
            cgroup2_mount("9 1 0:2 / /a\\040b rw - cgroup2 cgroup2 rw\n"),
            Some(PathBuf::from("/a b"))
        );
    }
}
