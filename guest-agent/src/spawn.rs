//! Starting one command under its own shepherd process (raw fork/exec).
//!
//! Layout of one exec:
//!
//! ```text
//! agent ── shepherd (new session, PR_SET_CHILD_SUBREAPER) ── command (own process group)
//!                 └─ every orphaned descendant of the command reparents here
//! ```
//!
//! The shepherd exists so the agent knows exactly which processes belong to
//! which exec: a grandchild that calls `setsid` or double-forks still
//! reparents to its exec's shepherd, never to init, so killing "every
//! descendant of the shepherd" kills the whole tree, also with several execs
//! running at once. The shepherd reports over a status pipe: the command's
//! pid, a failure to start (which step, errno), and the command's wait status;
//! it keeps reaping orphans and exits once it has no children left.
//!
//! Between `fork` and `execve` only async-signal-safe libc calls run (the
//! agent is multi-threaded): everything is allocated before forking.
//!
//! Guards against: inherited descriptors (the shepherd closes every fd but its
//! own four before forking the command), inherited signal state (mask
//! cleared, dispositions reset), privilege (`setgroups`/`setgid`/`setuid` when
//! asked, and `no_new_privs` always, so setuid binaries gain nothing), and
//! set-id files: the `hull-seccomp` guest filter refuses set-id mode bits,
//! which would land on the host through virtiofs as set-id files of the host
//! user the share maps to. It does
//! not drop capabilities when the agent runs as root and no uid is given:
//! the caller decides the uid (the session policy can force one).

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use hull_protocol::Exec;

/// Status records the shepherd writes: tag, then two little-endian i32s.
pub(crate) const RECORD_LEN: usize = 9;
pub(crate) const REC_STARTED: u8 = 1;
pub(crate) const REC_START_FAILED: u8 = 2;
pub(crate) const REC_EXITED: u8 = 3;

/// Which step of starting the command failed (first field of `REC_START_FAILED`).
pub(crate) fn step_name(step: i32) -> &'static str {
    match step {
        STEP_FORK => "fork",
        STEP_SETGROUPS => "setgroups",
        STEP_SETGID => "setgid",
        STEP_SETUID => "setuid",
        STEP_NO_NEW_PRIVS => "prctl(PR_SET_NO_NEW_PRIVS)",
        STEP_SECCOMP => "installing the seccomp filter",
        STEP_CGROUP => "joining the command's cgroup",
        STEP_CHDIR => "chdir",
        STEP_EXEC => "execve",
        _ => "an unknown step",
    }
}
/// Whether the failed step was the chdir to the working directory.
pub(crate) fn is_chdir(step: i32) -> bool {
    step == STEP_CHDIR
}
/// Whether the failed step was the execve of the command.
pub(crate) fn is_exec(step: i32) -> bool {
    step == STEP_EXEC
}
const STEP_FORK: i32 = 1;
const STEP_SETGROUPS: i32 = 2;
const STEP_SETGID: i32 = 3;
const STEP_SETUID: i32 = 4;
const STEP_NO_NEW_PRIVS: i32 = 5;
const STEP_CHDIR: i32 = 6;
const STEP_EXEC: i32 = 7;
const STEP_SECCOMP: i32 = 8;
const STEP_CGROUP: i32 = 9;

/// The guest filter, built once per agent.
fn guest_filter() -> Result<&'static hull_seccomp::Raw, SpawnError> {
    static RAW: std::sync::OnceLock<Result<hull_seccomp::Raw, String>> = std::sync::OnceLock::new();
    RAW.get_or_init(|| {
        hull_seccomp::build(hull_seccomp::Profile::Guest)
            .map(|p| hull_seccomp::Raw::new(&p))
            .map_err(|e| e.to_string())
    })
    .as_ref()
    .map_err(|e| SpawnError::Seccomp(e.clone()))
}

/// Pids of live shepherds. Held across `fork` + insert so a concurrent
/// orphan sweep never mistakes a fresh shepherd for an orphan.
pub(crate) static SHEPHERDS: Mutex<Vec<i32>> = Mutex::new(Vec::new());

const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("argv[0] {program:?} was not found in PATH {path:?}")]
    NotFound { program: String, path: String },
    #[error("could not create {what} for the command: {source}")]
    Resource {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("fork of the exec shepherd failed: {0}")]
    Fork(#[source] io::Error),
    #[error("the command's seccomp filter: {0}")]
    Seccomp(String),
}

/// The agent's ends of a started exec.
#[derive(Debug)]
pub struct Spawned {
    /// The program execve was given (argv[0] resolved in PATH).
    pub program: PathBuf,
    pub shepherd: i32,
    pub status: File,
    pub stdout: File,
    pub stderr: File,
    pub stdin: Option<File>,
}

/// Everything the child side needs, allocated before `fork`.
struct Prepared {
    /// The program as resolved (for errors), and as execve gets it.
    program: PathBuf,
    path: CString,
    argv: Vec<CString>,
    envp: Vec<CString>,
    cwd: Option<CString>,
    ids: Option<(u32, u32)>,
}

/// Resolve `argv[0]` like `execvp` would, in the command's own `PATH`.
fn resolve(program: &[u8], env: &[(String, String)]) -> Result<PathBuf, SpawnError> {
    let p = Path::new(std::ffi::OsStr::from_bytes(program));
    if program.contains(&b'/') {
        return Ok(p.to_path_buf());
    }
    let path = env
        .iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str())
        .unwrap_or(DEFAULT_PATH);
    for dir in path.split(':').filter(|d| !d.is_empty()) {
        let cand = Path::new(dir).join(p);
        if is_executable_file(&cand) {
            return Ok(cand);
        }
    }
    Err(SpawnError::NotFound {
        program: String::from_utf8_lossy(program).into_owned(),
        path: path.to_owned(),
    })
}

fn is_executable_file(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

fn cstring(b: &[u8]) -> CString {
    // The protocol validated that no argument, variable or path has a NUL.
    CString::new(b).unwrap_or_default()
}

fn prepare(req: &Exec, ids: Option<(u32, u32)>) -> Result<Prepared, SpawnError> {
    let path = resolve(req.argv[0].as_slice(), &req.env)?;
    Ok(Prepared {
        path: cstring(path.as_os_str().as_bytes()),
        program: path,
        argv: req.argv.iter().map(|a| cstring(a.as_slice())).collect(),
        envp: req
            .env
            .iter()
            .map(|(k, v)| cstring(format!("{k}={v}").as_bytes()))
            .collect(),
        cwd: (!req.cwd.is_empty()).then(|| cstring(req.cwd.as_slice())),
        ids,
    })
}

fn pipe() -> Result<(OwnedFd, OwnedFd), SpawnError> {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| SpawnError::Resource {
        what: "a pipe",
        source: e.into(),
    })
}

/// Start `req` (already validated) as the given ids; with `cgroup_procs`
/// (a cgroup's `cgroup.procs`, open for writing), the command joins that
/// cgroup before anything of it runs.
pub fn spawn(
    req: &Exec,
    ids: Option<(u32, u32)>,
    cgroup_procs: Option<RawFd>,
) -> Result<Spawned, SpawnError> {
    let prep = prepare(req, ids)?;
    let (status_r, status_w) = pipe()?;
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    let (in_r, in_w) = if req.stdin {
        let (r, w) = pipe()?;
        (r, Some(w))
    } else {
        let null = File::open("/dev/null").map_err(|source| SpawnError::Resource {
            what: "/dev/null for stdin",
            source,
        })?;
        (OwnedFd::from(null), None)
    };

    let argv_ptrs: Vec<*const libc::c_char> = prep
        .argv
        .iter()
        .map(|c| c.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let envp_ptrs: Vec<*const libc::c_char> = prep
        .envp
        .iter()
        .map(|c| c.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let child = Child {
        path: prep.path.as_ptr(),
        argv: argv_ptrs.as_ptr(),
        envp: envp_ptrs.as_ptr(),
        cwd: prep.cwd.as_ref().map(|c| c.as_ptr()),
        ids: prep.ids,
        cgroup_procs: cgroup_procs.unwrap_or(-1),
        filter: guest_filter()?,
        fds: [
            in_r.as_raw_fd(),
            out_w.as_raw_fd(),
            err_w.as_raw_fd(),
            status_w.as_raw_fd(),
        ],
    };

    let mut shepherds = SHEPHERDS.lock().unwrap_or_else(|p| p.into_inner());
    // SAFETY: fork in a multi-threaded process; the child only runs
    // `shepherd`, which calls async-signal-safe libc functions on data
    // allocated above and never returns.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: we are the freshly forked child; see `shepherd`.
        unsafe { shepherd(&child) }
    }
    if pid < 0 {
        return Err(SpawnError::Fork(io::Error::last_os_error()));
    }
    shepherds.push(pid);
    drop(shepherds);
    // The child ends (in_r, out_w, err_w, status_w) drop here, in the agent.
    Ok(Spawned {
        program: prep.program,
        shepherd: pid,
        status: File::from(status_r),
        stdout: File::from(out_r),
        stderr: File::from(err_r),
        stdin: in_w.map(File::from),
    })
}

/// Forget a shepherd the agent has reaped.
pub(crate) fn forget_shepherd(pid: i32) {
    let mut s = SHEPHERDS.lock().unwrap_or_else(|p| p.into_inner());
    s.retain(|p| *p != pid);
}

/// Read one status record; `Ok(None)` at end of stream.
pub(crate) fn read_record(f: &mut File) -> io::Result<Option<(u8, i32, i32)>> {
    let mut b = [0u8; RECORD_LEN];
    let mut got = 0;
    while got < RECORD_LEN {
        match f.read(&mut b[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let a = i32::from_le_bytes([b[1], b[2], b[3], b[4]]);
    let c = i32::from_le_bytes([b[5], b[6], b[7], b[8]]);
    Ok(Some((b[0], a, c)))
}

struct Child {
    path: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    cwd: Option<*const libc::c_char>,
    ids: Option<(u32, u32)>,
    /// The command's cgroup's `cgroup.procs` (or -1): moved to
    /// [`CGROUP_FD`] in the shepherd, written by the command.
    cgroup_procs: RawFd,
    filter: &'static hull_seccomp::Raw,
    /// stdin, stdout, stderr, status: moved to 0, 1, 2, 3 in the shepherd.
    fds: [RawFd; 4],
}

/// Where the shepherd keeps the cgroup's `cgroup.procs` for the command.
const CGROUP_FD: RawFd = 4;

fn errno() -> i32 {
    // SAFETY: __errno_location returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() }
}

/// Write a whole status record, retrying on EINTR (async-signal-safe).
unsafe fn write_record(fd: RawFd, tag: u8, a: i32, b: i32) {
    let mut rec = [0u8; RECORD_LEN];
    rec[0] = tag;
    rec[1..5].copy_from_slice(&a.to_le_bytes());
    rec[5..9].copy_from_slice(&b.to_le_bytes());
    let mut off = 0;
    while off < RECORD_LEN {
        // SAFETY: writing from a live stack buffer.
        let n = unsafe { libc::write(fd, rec[off..].as_ptr().cast(), RECORD_LEN - off) };
        if n < 0 {
            if errno() == libc::EINTR {
                continue;
            }
            return;
        }
        off += n as usize;
    }
}

/// The shepherd: runs in the forked child, never returns.
///
/// # Safety
/// Must only be called in a freshly forked child; uses only async-signal-safe calls.
unsafe fn shepherd(c: &Child) -> ! {
    // SAFETY: (whole body) async-signal-safe libc calls on pointers into
    // memory the parent allocated before fork, which the child's copy of the
    // address space still holds.
    unsafe {
        libc::setsid();
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
        // Lift the fds above 0..=4 first, so moving them cannot clobber
        // one another, then place them.
        let with_cgroup = c.cgroup_procs >= 0;
        let fds = [c.fds[0], c.fds[1], c.fds[2], c.fds[3], c.cgroup_procs];
        let n = if with_cgroup { 5 } else { 4 };
        let mut high = [0; 5];
        for i in 0..n {
            high[i] = libc::fcntl(fds[i], libc::F_DUPFD_CLOEXEC, 10);
            if high[i] < 0 {
                libc::_exit(126);
            }
        }
        for (target, fd) in high.iter().enumerate().take(n) {
            if libc::dup2(*fd, target as RawFd) < 0 {
                libc::_exit(126);
            }
        }
        // Close everything else: other execs' pipes, the transport.
        if libc::syscall(libc::SYS_close_range, n as u32, u32::MAX, 0u32) != 0 {
            for fd in n as RawFd..65536 {
                libc::close(fd);
            }
        }
        let mut errp = [-1; 2];
        if libc::pipe2(errp.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            write_record(3, REC_START_FAILED, STEP_FORK, errno());
            libc::_exit(126);
        }
        let pid = libc::fork();
        if pid == 0 {
            command(c, errp[1]);
        }
        if pid < 0 {
            write_record(3, REC_START_FAILED, STEP_FORK, errno());
            libc::_exit(126);
        }
        libc::close(0);
        libc::close(1);
        libc::close(2);
        if with_cgroup {
            libc::close(CGROUP_FD);
        }
        libc::close(errp[1]);
        // The command writes (step, errno) if it fails before execve; a
        // successful execve closes the pipe (CLOEXEC) and read returns 0.
        let mut fail = [0u8; 8];
        let mut got = 0usize;
        loop {
            let n = libc::read(errp[0], fail[got..].as_mut_ptr().cast(), 8 - got);
            if n < 0 && errno() == libc::EINTR {
                continue;
            }
            if n <= 0 {
                break;
            }
            got += n as usize;
            if got == 8 {
                break;
            }
        }
        libc::close(errp[0]);
        // Report only after execve succeeded, so `Started` means it runs.
        if got == 8 {
            let step = i32::from_le_bytes([fail[0], fail[1], fail[2], fail[3]]);
            let err = i32::from_le_bytes([fail[4], fail[5], fail[6], fail[7]]);
            write_record(3, REC_START_FAILED, step, err);
        } else {
            write_record(3, REC_STARTED, pid, 0);
        }
        // Reap the command and every orphan that reparents to us.
        loop {
            let mut st = 0;
            let r = libc::waitpid(-1, &mut st, 0);
            if r == pid {
                if got != 8 {
                    write_record(3, REC_EXITED, st, 0);
                }
            } else if r < 0 {
                if errno() == libc::EINTR {
                    continue;
                }
                break;
            }
        }
        libc::_exit(0)
    }
}

/// The command: runs in the shepherd's forked child, never returns.
///
/// # Safety
/// Must only be called in a freshly forked child; uses only async-signal-safe calls.
unsafe fn command(c: &Child, errfd: RawFd) -> ! {
    // SAFETY: (whole body) as in `shepherd`.
    unsafe {
        let fail = |step: i32| fail_start(errfd, step);
        libc::close(3);
        // Into the command's cgroup before anything else: every process it
        // ever starts is there.
        if c.cgroup_procs >= 0 {
            if libc::write(CGROUP_FD, b"0".as_ptr().cast(), 1) != 1 {
                fail(STEP_CGROUP);
            }
            libc::close(CGROUP_FD);
        }
        libc::setpgid(0, 0);
        // Signal state: nothing blocked, every disposition default (the Rust
        // runtime ignores SIGPIPE, and ignored signals survive execve).
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
        for sig in 1..32 {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::signal(sig, libc::SIG_DFL);
            }
        }
        if let Some((uid, gid)) = c.ids {
            let groups = [gid as libc::gid_t];
            if libc::setgroups(1, groups.as_ptr()) != 0 {
                fail(STEP_SETGROUPS);
            }
            if libc::setgid(gid) != 0 {
                fail(STEP_SETGID);
            }
            if libc::setuid(uid) != 0 {
                fail(STEP_SETUID);
            }
        }
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            fail(STEP_NO_NEW_PRIVS);
        }
        if !c.filter.apply_in_child() {
            fail(STEP_SECCOMP);
        }
        if let Some(cwd) = c.cwd {
            if libc::chdir(cwd) != 0 {
                fail(STEP_CHDIR);
            }
        }
        libc::execve(c.path, c.argv, c.envp);
        fail(STEP_EXEC)
    }
}

/// Report which step failed (and errno) to the shepherd, then exit.
///
/// # Safety
/// Only in the forked command child (async-signal-safe calls only).
unsafe fn fail_start(errfd: RawFd, step: i32) -> ! {
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&step.to_le_bytes());
    b[4..].copy_from_slice(&errno().to_le_bytes());
    // SAFETY: writing a stack buffer to our own pipe, then exiting.
    unsafe {
        libc::write(errfd, b.as_ptr().cast(), 8);
        libc::_exit(127)
    }
}
