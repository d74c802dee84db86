//! One virtiofsd per share, started and supervised by hull.
//!
//! What this protects against, on the host side (a compromised guest kernel
//! cannot undo any of it):
//! - writes to read-only shares: `--readonly` makes virtiofsd refuse every
//!   write with EROFS, also after a guest `mount -o remount,rw`;
//! - the guest reaching outside the share: `--sandbox=namespace` (pivot_root
//!   into the share, new pid/net namespaces) and `--seccomp=kill`; `chroot`
//!   only when namespaces are impossible, and then with a warning;
//! - writes to protected paths inside a writable share (`.git`, `.hull`,
//!   policy `deny` entries): virtiofsd starts in a private mount namespace
//!   where hull has bind-mounted each protected path read-only onto itself
//!   (or masked it with an empty read-only tmpfs or file). virtiofsd's own
//!   sandbox clones that tree recursively, so the guest sees the masks and
//!   cannot remove them. A protected path that does not exist yet gets an
//!   empty placeholder on the host first (removed again when the share ends,
//!   if still empty), so the guest cannot create it either;
//! - host-root ownership leaking in: ids are translated (`--translate-uid`,
//!   `--translate-gid`) so the files virtiofsd sees as uid/gid 0 appear as
//!   [`GUEST_UID`](super::GUEST_UID) in the guest, the unprivileged uid the
//!   container runs commands as.
//!
//! What it does not: a protected path that is a symlink, or lies below a
//! symlink inside the share, cannot be masked (a mount follows the link); it
//! is refused (fail closed). Writes are write-through (`--cache=auto`, no
//! `--writeback`): what the command wrote is on the host when it exits, but
//! host-side changes may take up to a second to show in the guest.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde::Serialize;

/// How virtiofsd isolates itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SandboxMode {
    /// Mount, pid and network namespaces, pivot_root into the share.
    Namespace,
    /// chroot into the share (root only); weaker, used only when namespaces fail.
    Chroot,
}

impl SandboxMode {
    pub fn name(self) -> &'static str {
        match self {
            SandboxMode::Namespace => "namespace",
            SandboxMode::Chroot => "chroot",
        }
    }
}

/// How a protected path inside a share is masked in virtiofsd's mount namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MaskKind {
    /// Bind-mounted read-only onto itself: readable, never writable.
    ReadOnly,
    /// Covered by an empty read-only directory or file.
    Hidden,
}

/// A protected path inside a share.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostMask {
    /// Absolute host path, below the share's `shared_dir`.
    pub path: PathBuf,
    pub kind: MaskKind,
    /// When missing, the placeholder to create: a file (shell rc files) or a dir.
    pub placeholder_is_file: bool,
}

/// Everything one virtiofsd is started with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VirtiofsdSpec {
    pub tag: String,
    pub shared_dir: PathBuf,
    pub socket: PathBuf,
    pub readonly: bool,
    pub sandbox: SandboxMode,
    /// The guest uid and gid the files virtiofsd sees as owned by uid and
    /// gid 0 appear as (the command's own shares); `None` shows every id as
    /// it is on the host (a host root file is then nobody's in the
    /// container, read as "others").
    pub translate: Option<(u32, u32)>,
    pub masks: Vec<HostMask>,
}

impl VirtiofsdSpec {
    /// virtiofsd's arguments (without the program name).
    pub fn argv(&self) -> Vec<OsString> {
        let mut a: Vec<OsString> = Vec::new();
        let mut kv = |k: &str, v: &OsString| {
            let mut s = OsString::from(k);
            s.push(v);
            a.push(s);
        };
        kv("--socket-path=", &self.socket.clone().into_os_string());
        kv("--shared-dir=", &self.shared_dir.clone().into_os_string());
        kv("--sandbox=", &self.sandbox.name().into());
        kv("--seccomp=", &"kill".into());
        // Write-through data cache with short metadata timeouts: writes land
        // on the host before the guest's write(2) returns.
        kv("--cache=", &"auto".into());
        // Files virtiofsd sees as 0 (host root, or the host user inside
        // virtiofsd's user namespace) appear as the guest's command uid.
        if let Some((uid, gid)) = self.translate {
            kv("--translate-uid=", &format!("map:{uid}:0:1").into());
            kv("--translate-gid=", &format!("map:{gid}:0:1").into());
        }
        kv("--log-level=", &"info".into());
        if self.readonly {
            a.push("--readonly".into());
        }
        a
    }
}

/// Finds virtiofsd: `HULL_VIRTIOFSD`, `PATH`, `/usr/libexec/virtiofsd`,
/// `/usr/lib/qemu/virtiofsd`, `~/.cargo/bin/virtiofsd`. Absolute path.
pub fn find_virtiofsd() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("HULL_VIRTIOFSD") {
        let p = PathBuf::from(p);
        return p.is_absolute().then_some(p);
    }
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.push("/usr/libexec".into());
    dirs.push("/usr/lib/qemu".into());
    if let Some(home) = std::env::var_os("HOME") {
        dirs.push(Path::new(&home).join(".cargo/bin"));
    }
    super::qemu::find_in(&dirs, "virtiofsd")
}

/// `virtiofsd 1.14.0`.
pub fn version(bin: &Path) -> Option<String> {
    let out = std::process::Command::new(bin)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

#[cfg(target_os = "linux")]
pub use imp::*;

#[cfg(target_os = "linux")]
mod imp {
    use std::ffi::CString;
    use std::fs;
    use std::io::{self, BufRead, Write};
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::process::CommandExt;
    use std::path::{Component, Path, PathBuf};
    use std::process::{Command, Stdio};
    use std::sync::mpsc;
    use std::time::Duration;

    use super::{MaskKind, SandboxMode, VirtiofsdSpec};
    use crate::runtime::placeholder::{self, Held, Wanted};
    use crate::vm::proc::{self, Supervised};

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
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
        proc::tie_to_parent(&mut cmd);
        if !spec.masks.is_empty() {
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
    fn read_line_bounded<R: BufRead>(
        r: &mut R,
        out: &mut Vec<u8>,
        max: usize,
    ) -> io::Result<usize> {
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

    /// Checks that `mask` lies below `share` with no symlink on the way.
    fn check_mask_path(tag: &str, share: &Path, mask: &Path) -> Result<(), VirtiofsdError> {
        let rel = mask
            .strip_prefix(share)
            .ok()
            .filter(|r| !r.as_os_str().is_empty())
            .ok_or_else(|| VirtiofsdError::MaskOutside {
                tag: tag.to_string(),
                path: mask.to_path_buf(),
                share: share.to_path_buf(),
            })?;
        let mut p = share.to_path_buf();
        for c in rel.components() {
            match c {
                Component::Normal(n) => p.push(n),
                _ => {
                    return Err(VirtiofsdError::MaskOutside {
                        tag: tag.to_string(),
                        path: mask.to_path_buf(),
                        share: share.to_path_buf(),
                    })
                }
            }
            if let Ok(m) = fs::symlink_metadata(&p) {
                if m.file_type().is_symlink() {
                    return Err(VirtiofsdError::SymlinkMask {
                        tag: tag.to_string(),
                        path: mask.to_path_buf(),
                        what: if p == mask {
                            "a symlink"
                        } else {
                            "below a symlink"
                        },
                        share: share.to_path_buf(),
                    });
                }
            }
        }
        Ok(())
    }

    /// Placeholders for protected paths that do not exist yet: an empty
    /// directory (or file) the mask is mounted on, with missing parents.
    /// Held while virtiofsd runs and removed after it is gone when no other
    /// run or VM uses them (`runtime::placeholder`).
    fn hold_placeholders(spec: &VirtiofsdSpec) -> Result<Held, VirtiofsdError> {
        for m in &spec.masks {
            check_mask_path(&spec.tag, &spec.shared_dir, &m.path)?;
        }
        if spec.readonly {
            // Nothing can be created through a read-only share.
            return Ok(Held::default());
        }
        let wanted: Vec<Wanted> = spec
            .masks
            .iter()
            .filter(|m| fs::symlink_metadata(&m.path).is_err())
            .map(|m| Wanted {
                path: m.path.clone(),
                root: spec.shared_dir.clone(),
                dir: !m.placeholder_is_file,
            })
            .collect();
        placeholder::hold(&wanted, &crate::runtime::runs_root()).map_err(|source| {
            VirtiofsdError::Placeholder {
                tag: spec.tag.clone(),
                source,
            }
        })
    }

    /// Mounts prepared before the fork, applied in the child before exec.
    struct MountPlan {
        userns: bool,
        uid_map: CString,
        gid_map: CString,
        ops: Vec<MountOp>,
    }

    enum MountOp {
        /// Bind `src` onto `dst`, then remount it read-only keeping `flags`.
        BindRo {
            src: CString,
            dst: CString,
            flags: libc::c_ulong,
        },
        /// An empty read-only tmpfs over the directory `dst`.
        EmptyDir { dst: CString },
        /// `dst` bound onto itself (writable as before): a mount point.
        Pin { dst: CString },
    }

    fn cstr(p: &Path) -> io::Result<CString> {
        CString::new(p.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path has a NUL byte"))
    }

    /// The mount flags of the mount holding `p` that a user namespace may
    /// not clear (they must be repeated on a remount).
    fn locked_flags(p: &Path) -> io::Result<libc::c_ulong> {
        let c = cstr(p)?;
        // SAFETY: statvfs writes into the zeroed struct we own; `c` is a valid C string.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let f = st.f_flag;
        let mut out: libc::c_ulong = 0;
        for (st_flag, ms_flag) in [
            (libc::ST_NOSUID, libc::MS_NOSUID),
            (libc::ST_NODEV, libc::MS_NODEV),
            (libc::ST_NOEXEC, libc::MS_NOEXEC),
            (libc::ST_NOATIME, libc::MS_NOATIME),
            (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
            (libc::ST_RELATIME, libc::MS_RELATIME),
        ] {
            if f & st_flag != 0 {
                out |= ms_flag;
            }
        }
        Ok(out)
    }

    impl MountPlan {
        fn new(spec: &VirtiofsdSpec, dir: &Path) -> io::Result<MountPlan> {
            // SAFETY: geteuid/getegid have no preconditions.
            let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
            MountPlan::for_ids(spec, dir, uid, gid)
        }

        /// The plan for a process running as `uid`/`gid` (non-root: in a
        /// user namespace of its own, mapping only itself).
        fn for_ids(spec: &VirtiofsdSpec, dir: &Path, uid: u32, gid: u32) -> io::Result<MountPlan> {
            let mut ops = Vec::new();
            // Pins first: every directory between the share's root and a
            // mask becomes a mount point of its own, which the guest cannot
            // rename (EBUSY). Renaming an ancestor of a mount is allowed and
            // would let it recreate the masked path unmasked.
            if !spec.readonly {
                let mut pins: Vec<&Path> = Vec::new();
                for m in &spec.masks {
                    for a in m.path.ancestors().skip(1) {
                        if a == spec.shared_dir || !a.starts_with(&spec.shared_dir) {
                            break;
                        }
                        if !pins.contains(&a) {
                            pins.push(a);
                        }
                    }
                }
                pins.sort_by_key(|p| p.components().count());
                for p in pins {
                    if fs::symlink_metadata(p).is_ok_and(|m| m.is_dir()) {
                        ops.push(MountOp::Pin { dst: cstr(p)? });
                    }
                }
            }
            let mut empty_file: Option<PathBuf> = None;
            for m in &spec.masks {
                let meta = match fs::symlink_metadata(&m.path) {
                    Ok(meta) => meta,
                    // Only in a read-only share (writable ones got a
                    // placeholder): nothing to hide, and nothing can create it.
                    Err(e) if e.kind() == io::ErrorKind::NotFound && spec.readonly => continue,
                    Err(e) => return Err(e),
                };
                if meta.file_type().is_symlink() {
                    return Err(io::Error::other(format!(
                        "{} became a symlink",
                        m.path.display()
                    )));
                }
                let dst = cstr(&m.path)?;
                match m.kind {
                    MaskKind::ReadOnly => ops.push(MountOp::BindRo {
                        src: dst.clone(),
                        dst,
                        flags: locked_flags(&m.path)?,
                    }),
                    MaskKind::Hidden if meta.is_dir() => ops.push(MountOp::EmptyDir { dst }),
                    MaskKind::Hidden => {
                        let f = match &empty_file {
                            Some(f) => f.clone(),
                            None => {
                                let f = dir.join("vfs-empty");
                                fs::write(&f, b"")?;
                                empty_file = Some(f.clone());
                                f
                            }
                        };
                        ops.push(MountOp::BindRo {
                            src: cstr(&f)?,
                            dst,
                            flags: locked_flags(&m.path)?,
                        });
                    }
                }
            }
            Ok(MountPlan {
                userns: uid != 0,
                uid_map: CString::new(format!("0 {uid} 1")).map_err(io::Error::other)?,
                gid_map: CString::new(format!("0 {gid} 1")).map_err(io::Error::other)?,
                ops,
            })
        }

        /// Runs in the child between fork and exec: async-signal-safe calls only.
        fn apply(&self) -> io::Result<()> {
            // SAFETY: plain system calls on C strings owned by `self`,
            // which outlives the call; no allocation.
            unsafe {
                let flags = if self.userns {
                    libc::CLONE_NEWUSER | libc::CLONE_NEWNS
                } else {
                    libc::CLONE_NEWNS
                };
                if libc::unshare(flags) != 0 {
                    return Err(io::Error::last_os_error());
                }
                if self.userns {
                    write_proc(c"/proc/self/setgroups", b"deny")?;
                    write_proc(c"/proc/self/uid_map", self.uid_map.as_bytes())?;
                    write_proc(c"/proc/self/gid_map", self.gid_map.as_bytes())?;
                }
                if libc::mount(
                    std::ptr::null(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_SLAVE,
                    std::ptr::null(),
                ) != 0
                {
                    return Err(io::Error::last_os_error());
                }
                for op in &self.ops {
                    match op {
                        MountOp::BindRo { src, dst, flags } => {
                            if libc::mount(
                                src.as_ptr(),
                                dst.as_ptr(),
                                std::ptr::null(),
                                libc::MS_BIND | libc::MS_REC,
                                std::ptr::null(),
                            ) != 0
                            {
                                return Err(io::Error::last_os_error());
                            }
                            if libc::mount(
                                std::ptr::null(),
                                dst.as_ptr(),
                                std::ptr::null(),
                                libc::MS_BIND
                                    | libc::MS_REMOUNT
                                    | libc::MS_RDONLY
                                    | libc::MS_NOSUID
                                    | libc::MS_NODEV
                                    | flags,
                                std::ptr::null(),
                            ) != 0
                            {
                                return Err(io::Error::last_os_error());
                            }
                        }
                        MountOp::Pin { dst } => {
                            if libc::mount(
                                dst.as_ptr(),
                                dst.as_ptr(),
                                std::ptr::null(),
                                libc::MS_BIND,
                                std::ptr::null(),
                            ) != 0
                            {
                                return Err(io::Error::last_os_error());
                            }
                        }
                        MountOp::EmptyDir { dst } => {
                            if libc::mount(
                                c"tmpfs".as_ptr(),
                                dst.as_ptr(),
                                c"tmpfs".as_ptr(),
                                libc::MS_RDONLY
                                    | libc::MS_NOSUID
                                    | libc::MS_NODEV
                                    | libc::MS_NOEXEC,
                                c"size=4k,mode=0555".as_ptr().cast(),
                            ) != 0
                            {
                                return Err(io::Error::last_os_error());
                            }
                        }
                    }
                }
            }
            Ok(())
        }
    }

    /// open + write + close, for /proc/self/{uid_map,gid_map,setgroups}.
    ///
    /// # Safety
    /// Async-signal-safe; `path` is a valid C string.
    unsafe fn write_proc(path: &std::ffi::CStr, data: &[u8]) -> io::Result<()> {
        // SAFETY: the caller guarantees `path` is valid; `data` is a live slice.
        unsafe {
            let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            let n = libc::write(fd, data.as_ptr().cast(), data.len());
            let err = io::Error::last_os_error();
            libc::close(fd);
            if n != data.len() as isize {
                return Err(err);
            }
        }
        Ok(())
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

        /// The masks as an unprivileged user would get them: a user
        /// namespace mapping only that user, the same read-only binds and
        /// empty tmpfs. Checked with a real process writing through them.
        #[test]
        fn masks_hold_for_an_unprivileged_user_in_its_own_namespace() {
            use std::os::unix::fs::PermissionsExt;
            use std::os::unix::process::CommandExt;
            // SAFETY: geteuid has no preconditions.
            if unsafe { libc::geteuid() } != 0 {
                panic!("this test switches to uid 65534 and needs root (tests run as root here)");
            }
            let d = tempfile::tempdir().unwrap();
            fs::set_permissions(d.path(), fs::Permissions::from_mode(0o755)).unwrap();
            let share = d.path().join("p");
            fs::create_dir_all(share.join(".git")).unwrap();
            fs::create_dir_all(share.join(".hull")).unwrap();
            fs::write(share.join(".git/config"), b"[core]\n").unwrap();
            fs::write(share.join(".hull/policy.toml"), b"secret\n").unwrap();
            for p in [
                &share,
                &share.join(".git"),
                &share.join(".git/config"),
                &share.join(".hull"),
            ] {
                std::os::unix::fs::chown(p, Some(65534), Some(65534)).unwrap();
            }
            let spec = VirtiofsdSpec {
                tag: "p".into(),
                shared_dir: share.clone(),
                socket: d.path().join("s.sock"),
                readonly: false,
                sandbox: SandboxMode::Namespace,
                translate: Some((1000, 1000)),
                masks: vec![
                    super::super::HostMask {
                        path: share.join(".git"),
                        kind: MaskKind::ReadOnly,
                        placeholder_is_file: false,
                    },
                    super::super::HostMask {
                        path: share.join(".hull"),
                        kind: MaskKind::Hidden,
                        placeholder_is_file: false,
                    },
                ],
            };
            let plan = MountPlan::for_ids(&spec, d.path(), 65534, 65534).unwrap();
            assert!(plan.userns);
            let script = format!(
                "cd {}; echo evil >> .git/config && echo GIT-WRITTEN; ls -A .hull | wc -l; \
                 cat .hull/policy.toml && echo HULL-READ; echo ok > new && echo NEW-OK; id -u",
                share.display()
            );
            let mut cmd = Command::new("/bin/sh");
            cmd.arg("-c").arg(script).uid(65534).gid(65534);
            // SAFETY: as in `start_once`: system calls only, on prepared data.
            // The uid switch made the process non-dumpable, which a real
            // unprivileged hull never is; undo that so /proc/self/uid_map
            // stays writable for it, as it is for a real non-root user.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) != 0 {
                        return Err(io::Error::last_os_error());
                    }
                    plan.apply()
                });
            }
            let out = cmd.output().unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "{stdout} {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(
                stdout,
                "0\nNEW-OK\n0\n",
                "stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(fs::read(share.join(".git/config")).unwrap(), b"[core]\n");
            assert_eq!(fs::read(share.join("new")).unwrap(), b"ok\n");
        }

        #[test]
        fn masks_must_be_below_the_share_without_symlinks() {
            let d = tempfile::tempdir().unwrap();
            let share = d.path().join("p");
            fs::create_dir_all(share.join("real")).unwrap();
            std::os::unix::fs::symlink("/etc", share.join("link")).unwrap();
            assert!(check_mask_path("p", &share, &share.join("real/.git")).is_ok());
            assert!(check_mask_path("p", &share, &share.join("missing/.git")).is_ok());
            assert!(matches!(
                check_mask_path("p", &share, &share.join("link")),
                Err(VirtiofsdError::SymlinkMask {
                    what: "a symlink",
                    ..
                })
            ));
            assert!(matches!(
                check_mask_path("p", &share, &share.join("link/shadow")),
                Err(VirtiofsdError::SymlinkMask {
                    what: "below a symlink",
                    ..
                })
            ));
            assert!(matches!(
                check_mask_path("p", &share, Path::new("/etc/x")),
                Err(VirtiofsdError::MaskOutside { .. })
            ));
            assert!(matches!(
                check_mask_path("p", &share, &share),
                Err(VirtiofsdError::MaskOutside { .. })
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_argv() {
        let spec = VirtiofsdSpec {
            tag: "spill".into(),
            shared_dir: "/tmp/hull-runs/ID/spill".into(),
            socket: "/tmp/hull-runs/ID/vfs-spill.sock".into(),
            readonly: true,
            sandbox: SandboxMode::Namespace,
            translate: Some((1000, 1000)),
            masks: vec![],
        };
        let got: Vec<String> = spec
            .argv()
            .into_iter()
            .map(|s| s.into_string().unwrap())
            .collect();
        assert_eq!(
            got,
            [
                "--socket-path=/tmp/hull-runs/ID/vfs-spill.sock",
                "--shared-dir=/tmp/hull-runs/ID/spill",
                "--sandbox=namespace",
                "--seccomp=kill",
                "--cache=auto",
                "--translate-uid=map:1000:0:1",
                "--translate-gid=map:1000:0:1",
                "--log-level=info",
                "--readonly",
            ]
        );
        let mut rw = spec.clone();
        rw.readonly = false;
        rw.sandbox = SandboxMode::Chroot;
        let got: Vec<String> = rw
            .argv()
            .into_iter()
            .map(|s| s.into_string().unwrap())
            .collect();
        assert!(!got.iter().any(|a| a == "--readonly"));
        assert!(got.iter().any(|a| a == "--sandbox=chroot"));
    }
}
