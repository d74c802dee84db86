//! What every Linux process tier shares when it builds the command: finding
//! helper binaries at absolute paths, creating masks,
//! passing file descriptors through exec, and resource limits.

use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use crate::exec::spawn::PreExec;
use crate::policy::lower::bwrap::Masks;
use crate::policy::Limits;

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("cannot create mask {path}: {source}")]
    Mask {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot pass the seccomp filter to {tier}: {source}")]
    SeccompFd {
        tier: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// Searches fixed system locations, then PATH, for `name`; returns the
/// canonical absolute path. Found once per hull process by the caller.
pub fn find_binary(name: &str, fixed: &[&str]) -> Option<PathBuf> {
    for f in fixed {
        let p = Path::new(f);
        if is_executable(p) {
            return std::fs::canonicalize(p).ok();
        }
    }
    let path = std::env::var_os("PATH")?;
    for dir in std::env::split_paths(&path) {
        if !dir.is_absolute() {
            continue;
        }
        let p = dir.join(name);
        if is_executable(&p) {
            return std::fs::canonicalize(p).ok();
        }
    }
    None
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Creates the empty dir and file protections are masked with, mode 0: a
/// command reading a hidden path gets "Permission denied", as on the other
/// tiers, never an empty file (bwrap drops every capability, and binds
/// them read-only, so no command can chmod them).
pub fn create_masks(run_dir: &Path) -> Result<Masks, LaunchError> {
    use std::os::unix::fs::PermissionsExt;
    let base = run_dir.join("mask");
    let masks = Masks {
        empty_dir: base.join("dir"),
        empty_file: base.join("file"),
    };
    let mk = |p: &Path, e: std::io::Error| LaunchError::Mask {
        path: p.to_path_buf(),
        source: e,
    };
    std::fs::create_dir_all(&masks.empty_dir).map_err(|e| mk(&masks.empty_dir, e))?;
    if !masks.empty_file.exists() {
        std::fs::write(&masks.empty_file, b"").map_err(|e| mk(&masks.empty_file, e))?;
    }
    std::fs::set_permissions(&masks.empty_file, std::fs::Permissions::from_mode(0o000))
        .map_err(|e| mk(&masks.empty_file, e))?;
    std::fs::set_permissions(&masks.empty_dir, std::fs::Permissions::from_mode(0o000))
        .map_err(|e| mk(&masks.empty_dir, e))?;
    Ok(masks)
}

/// A memfd holding `bytes`, positioned at the start.
pub fn memfd_with(name: &str, bytes: &[u8]) -> std::io::Result<OwnedFd> {
    use rustix::fs::{memfd_create, MemfdFlags};
    let fd = memfd_create(name, MemfdFlags::CLOEXEC).map_err(std::io::Error::from)?;
    let mut f = std::fs::File::from(fd);
    std::io::Write::write_all(&mut f, bytes)?;
    std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(0))?;
    Ok(OwnedFd::from(f))
}

/// Settings applied in the child between fork and exec.
#[derive(Debug, Default, Clone)]
pub struct ChildSetup {
    /// Descriptors to keep open across exec (CLOEXEC cleared in the child).
    pub keep_fds: Vec<RawFd>,
    /// RLIMIT_DATA in bytes.
    pub memory: Option<u64>,
    /// RLIMIT_NPROC (not enforced by the kernel for uid 0).
    pub pids: Option<u64>,
    /// Put the child in its own session.
    pub setsid: bool,
    /// Drop every capability (bounding set included) before exec.
    pub drop_caps: bool,
}

impl ChildSetup {
    pub fn from_limits(limits: &Limits) -> ChildSetup {
        ChildSetup {
            memory: limits.memory,
            pids: limits.pids,
            ..ChildSetup::default()
        }
    }

    /// Installs the settings as a pre-exec step on `cmd`.
    pub fn install(self, cmd: &mut impl PreExec) {
        let keep = self.keep_fds;
        let memory = self.memory;
        let pids = self.pids;
        let setsid = self.setsid;
        let drop_caps = self.drop_caps;
        // SAFETY: the closure runs in the forked child before exec and calls
        // only async-signal-safe syscalls (fcntl, setrlimit, setsid, prctl)
        // on plain integers; it allocates nothing.
        unsafe {
            cmd.pre_exec_step(Box::new(move || {
                // Only the descriptors passed on purpose survive the exec.
                crate::exec::fds::cloexec_from(3)?;
                for fd in &keep {
                    if libc::fcntl(*fd, libc::F_SETFD, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                if let Some(m) = memory {
                    let r = libc::rlimit {
                        rlim_cur: m,
                        rlim_max: m,
                    };
                    if libc::setrlimit(libc::RLIMIT_DATA, &r) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                if let Some(p) = pids {
                    let r = libc::rlimit {
                        rlim_cur: p,
                        rlim_max: p,
                    };
                    if libc::setrlimit(libc::RLIMIT_NPROC, &r) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                if setsid && libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if drop_caps {
                    drop_all_caps_raw()?;
                }
                // The command never gains privileges through exec (setuid
                // binaries, file capabilities), whatever the tier.
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The command dies if hull dies.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            }));
        }
    }
}

/// Drops every capability of the calling process: bounding and ambient
/// sets, securebits so uid 0 regains nothing at exec, then the current
/// sets. Async-signal-safe (raw syscalls, no allocation), for pre-exec use.
pub fn drop_all_caps_raw() -> std::io::Result<()> {
    #[repr(C)]
    struct CapHeader {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct CapData {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    // SAFETY: integer-only prctl calls; capset gets valid pointers to local,
    // correctly laid out (repr(C)) header and two data structs.
    unsafe {
        for cap in 0..=63 {
            libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0);
        }
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        );
        // SECBIT_NOROOT, SECBIT_NO_SETUID_FIXUP, SECBIT_KEEP_CAPS_LOCKED,
        // SECBIT_NO_CAP_AMBIENT_RAISE and their locks (0xff). EPERM without
        // CAP_SETPCAP (not root): then there is nothing to regain anyway.
        libc::prctl(libc::PR_SET_SECUREBITS, 0xff, 0, 0, 0);
        let mut hdr = CapHeader {
            version: LINUX_CAPABILITY_VERSION_3,
            pid: 0,
        };
        let data = [CapData {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        }; 2];
        if libc::syscall(libc::SYS_capset, &mut hdr as *mut CapHeader, data.as_ptr()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// An fd number as an argument.
pub fn fd_arg(fd: &OwnedFd) -> OsString {
    fd.as_raw_fd().to_string().into()
}
