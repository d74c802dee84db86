//! The run's proxy as a process of its own: `hull __net-proxy`, started by
//! the run beside the command and owned by it.
//!
//! The proxy parses what the command sends (HTTP requests, TLS
//! ClientHellos), so it does not run inside hull's process, which is root
//! in CI: it is hull's executable again, given the policy's network part,
//! the socket its listener arrives on (`net::netns`) and the audit file
//! already open, and nothing else. When hull is root it runs as the sandbox
//! user with no capabilities (set before the exec, with no_new_privs); it
//! dies with hull (PDEATHSIG) and ends when its stdin closes, printing one
//! line per refused host. If it ends while the command runs, the run ends
//! the command and fails naming it (`exec::process::Helper`).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::policy::NetPolicy;

/// Why a run's proxy did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot open the network audit {path}: {source}")]
    Audit {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    User(#[from] crate::sandbox_user::SandboxUserError),
    #[error("cannot start the network proxy (hull __net-proxy): {0}")]
    Spawn(#[source] io::Error),
}

/// Starts the proxy of a run: its decisions appended to the spill's
/// audit, run as the sandbox user when hull is root. `label` prefixes its
/// lines ("tier bwrap").
pub fn start_for_run(
    label: &str,
    net: &NetPolicy,
    spill: &Path,
    input: Input,
) -> Result<ProxyProcess, StartError> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = spill.join(crate::audit::FILE);
    let audit = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .map_err(|source| StartError::Audit {
            path: path.clone(),
            source,
        })?;
    let who = if crate::sandbox_user::hull_is_root() {
        let ids = crate::sandbox_user::lookup("the network proxy")?;
        Some(As {
            uid: ids.uid,
            gid: ids.gid,
        })
    } else {
        None
    };
    ProxyProcess::start(label, net, input, audit, who).map_err(StartError::Spawn)
}

/// A started proxy process.
#[derive(Debug)]
pub struct ProxyProcess {
    child: Child,
    pidfd: OwnedFd,
    /// What the user reads: "tier bwrap: the network proxy (pid N)".
    name: String,
}

/// Where the proxy's connections come from.
#[derive(Debug)]
pub enum Input {
    /// A listener in the command's network namespace, still to arrive on
    /// this socket (`net::netns`).
    Arrival(OwnedFd),
    /// Connections sent one by one over this socket ([`Feed`]: tier 3).
    Connections(OwnedFd),
}

/// hull's end of [`Input::Connections`]: each [`Feed::connect`] makes a
/// connected pair, sends one end to the proxy and returns the other.
#[derive(Debug)]
pub struct Feed(OwnedFd);

impl Feed {
    /// A feed and the proxy's end of it.
    pub fn pair() -> io::Result<(Feed, Input)> {
        let (ours, theirs) = crate::exec::fds::descriptor_pair()?;
        Ok((Feed(ours), Input::Connections(theirs)))
    }

    /// A new connection to the proxy.
    pub fn connect(&self) -> io::Result<tokio::net::UnixStream> {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
        crate::exec::fds::send_fd(
            std::os::fd::AsFd::as_fd(&self.0),
            std::os::fd::AsFd::as_fd(&theirs),
        )?;
        drop(theirs);
        ours.set_nonblocking(true)?;
        tokio::net::UnixStream::from_std(ours)
    }
}

/// Who the proxy runs as when hull is root.
#[derive(Debug, Clone, Copy)]
pub struct As {
    pub uid: u32,
    pub gid: u32,
}

impl ProxyProcess {
    /// Starts the proxy for `net`: its connections come from `input`, its
    /// decisions go to `audit`; `label` prefixes its lines ("tier bwrap").
    pub fn start(
        label: &str,
        net: &NetPolicy,
        input: Input,
        audit: std::fs::File,
        who: Option<As>,
    ) -> io::Result<ProxyProcess> {
        let json = serde_json::to_string(net).map_err(io::Error::other)?;
        let exe = rustix::fs::open(
            "/proc/self/exe",
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )?;
        let (input_flag, input) = match input {
            Input::Arrival(fd) => ("--arrival-fd", fd),
            Input::Connections(fd) => ("--connections-fd", fd),
        };
        let (input_fd, audit_fd) = (input.as_raw_fd(), audit.as_raw_fd());
        let mut cmd = Command::new(format!("/proc/self/fd/{}", exe.as_raw_fd()));
        cmd.arg("__net-proxy")
            .args(["--net-json", &json])
            .args([input_flag, &input_fd.to_string()])
            .args(["--audit-fd", &audit_fd.to_string()])
            .args(["--label", label])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .env_clear()
            .env("PATH", crate::exec::HELPER_PATH);
        let keep = [input_fd, audit_fd];
        // SAFETY: the closure makes raw, async-signal-safe system calls
        // (prctl, setgroups, setresgid, setresuid, setpgid, fcntl) on integers
        // captured before the fork; it allocates nothing.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
                crate::exec::fds::cloexec_from(3)?;
                for fd in keep {
                    if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                        return Err(io::Error::last_os_error());
                    }
                }
                if let Some(who) = who {
                    for cap in 0..=63 {
                        libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0);
                    }
                    let none: *const libc::gid_t = std::ptr::null();
                    if libc::syscall(libc::SYS_setgroups, 0, none) != 0
                        || libc::syscall(libc::SYS_setresgid, who.gid, who.gid, who.gid) != 0
                        || libc::syscall(libc::SYS_setresuid, who.uid, who.uid, who.uid) != 0
                    {
                        return Err(io::Error::last_os_error());
                    }
                }
                // A process group of its own: a Ctrl-C at the terminal is
                // hull's to handle (it ends the command, then the proxy).
                if libc::setpgid(0, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                    || libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0
                {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        // A proxy taken over by what it parses reaches no run's processes.
        #[cfg(target_os = "linux")]
        crate::exec::domain::confine(&mut cmd, "the network proxy");
        let child = cmd.spawn()?;
        // The child has its copies.
        drop((input, audit, exe));
        let pid = rustix::process::Pid::from_raw(child.id() as i32)
            .ok_or_else(|| io::Error::other("the proxy has no pid"))?;
        let pidfd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())?;
        Ok(ProxyProcess {
            name: format!("{label}: the network proxy (pid {})", child.id()),
            child,
            pidfd,
        })
    }

    /// The watch the run keeps on it while the command runs.
    pub fn watch(&self) -> io::Result<crate::exec::process::Helper> {
        let pidfd = self.pidfd.try_clone()?;
        Ok(crate::exec::process::Helper {
            name: self.name.clone(),
            pid: self.child.id() as i32,
            wait: Box::new(move || how_it_ended(&pidfd)),
        })
    }

    /// How it ended, if it has (it stays unreaped for its owner).
    pub fn ended(&self) -> Option<String> {
        use rustix::process::{waitid, WaitId, WaitIdOptions};
        match waitid(
            WaitId::PidFd(std::os::fd::AsFd::as_fd(&self.pidfd)),
            WaitIdOptions::EXITED | WaitIdOptions::NOWAIT | WaitIdOptions::NOHANG,
        ) {
            Ok(Some(st)) => Some(describe(&st)),
            Ok(None) | Err(rustix::io::Errno::INTR) => None,
            Err(e) => Some(format!("its state is unknown: {e}")),
        }
    }

    /// What the user reads: "tier vm: the network proxy (pid N)".
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Ends the proxy after the command: closes its stdin (it prints its
    /// refused hosts and exits), waits up to `grace`, then kills it.
    pub fn finish(mut self, grace: Duration) {
        drop(self.child.stdin.take());
        let end = Instant::now() + grace;
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) if Instant::now() >= end => break,
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
        tracing::warn!("{} did not end within {grace:?}; killed", self.name);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits on the pidfd for the process to end and says how, without
/// reaping it (its owner does).
fn how_it_ended(pidfd: &OwnedFd) -> String {
    use rustix::process::{waitid, WaitId, WaitIdOptions};
    loop {
        match waitid(
            WaitId::PidFd(std::os::fd::AsFd::as_fd(pidfd)),
            WaitIdOptions::EXITED | WaitIdOptions::NOWAIT,
        ) {
            Ok(Some(st)) => return describe(&st),
            Ok(None) => continue,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return format!("its state is unknown: {e}"),
        }
    }
}

fn describe(st: &rustix::process::WaitIdStatus) -> String {
    if let Some(sig) = st.terminating_signal() {
        format!("killed by signal {sig}")
    } else {
        format!("exited with code {}", st.exit_status().unwrap_or(-1))
    }
}

impl Drop for ProxyProcess {
    /// A proxy its owner did not finish (an error on the way) does not
    /// outlive it.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
