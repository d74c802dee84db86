//! Starting a command born inside its run's cgroup.
//!
//! std's `Command` forks, and the child then moved itself into the run's
//! cgroup by writing `0` to `cgroup.procs`. That write is a migration, and
//! a migration waits for an RCU grace period when none happened lately:
//! 12-24 ms measured here against 0.1-0.2 ms for `clone3(CLONE_INTO_CGROUP)`
//! (Linux 5.7), which starts the child inside (`benches/experiments/
//! clone_into_cgroup.c`). std cannot pass a cgroup, so this is hull's own
//! spawn, doing what std does between fork and exec in the same order:
//! stdio, working directory, signal mask and SIGPIPE, the pre-exec steps,
//! `execve`. The child runs only raw, async-signal-safe calls on memory
//! prepared before the clone (the parent has other threads).
//!
//! Where `clone3` is refused (a container's seccomp profile answers
//! ENOSYS), the child is forked and moves itself in as before: slower,
//! the same boundary.

use std::ffi::{CString, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use super::cgroup::RunCgroup;

/// One step run in the child between the clone and `execve`.
pub type Step = Box<dyn FnMut() -> io::Result<()> + Send + Sync>;

/// Something a pre-exec step can be added to: std's `Command` or
/// [`CgroupCommand`].
pub trait PreExec {
    /// Adds `step`, run in the child after the steps added before it.
    ///
    /// # Safety
    /// `step` runs in a child of a multi-threaded process between clone and
    /// exec: it may only make async-signal-safe calls and must not
    /// allocate or take locks. After clone3 glibc still believes the
    /// parent's threads exist, so its set*id and setgroups wrappers (which
    /// signal every thread and wait) hang: use the raw system calls.
    unsafe fn pre_exec_step(&mut self, step: Step);
}

impl PreExec for std::process::Command {
    unsafe fn pre_exec_step(&mut self, step: Step) {
        // SAFETY: the caller upholds pre_exec's contract (see the trait).
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(self, step);
        }
    }
}

/// A command started with [`CgroupCommand::spawn`]: the program, its
/// arguments, exactly `env` as its environment, and the steps.
pub struct CgroupCommand {
    argv: Vec<OsString>,
    env: Vec<(String, String)>,
    cwd: Option<PathBuf>,
    steps: Vec<Step>,
    /// Where the program is looked for, in order, as `execvp` does; None:
    /// `argv[0]` is the program's path.
    search: Option<Vec<OsString>>,
    /// The cgroup's directory (for clone3) and its `cgroup.procs` (for the
    /// fallback), duplicated so they outlive the spawn whoever owns the
    /// cgroup.
    dir: OwnedFd,
    procs: OwnedFd,
}

impl std::fmt::Debug for CgroupCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CgroupCommand")
            .field("argv", &self.argv)
            .field("cwd", &self.cwd)
            .field("steps", &self.steps.len())
            .finish_non_exhaustive()
    }
}

impl PreExec for CgroupCommand {
    unsafe fn pre_exec_step(&mut self, step: Step) {
        self.steps.push(step);
    }
}

/// Which of the child's standard streams hull pipes (the others are
/// inherited).
#[derive(Debug, Clone, Copy, Default)]
pub struct Piped {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
}

/// A started child: its pid and hull's ends of the piped streams.
#[derive(Debug)]
pub struct Spawned {
    pub pid: i32,
    pub stdin: Option<File>,
    pub stdout: Option<File>,
    pub stderr: Option<File>,
}

impl CgroupCommand {
    /// `program` (an absolute path: nothing searches PATH) to be started
    /// inside `cgroup`.
    pub fn new(program: impl Into<OsString>, cgroup: &RunCgroup) -> io::Result<CgroupCommand> {
        Ok(CgroupCommand {
            argv: vec![program.into()],
            env: Vec::new(),
            cwd: None,
            steps: Vec::new(),
            search: None,
            dir: cgroup.dir_fd().try_clone_to_owned()?,
            procs: cgroup.procs_fd().try_clone_to_owned()?,
        })
    }

    pub fn arg(&mut self, a: impl Into<OsString>) -> &mut Self {
        self.argv.push(a.into());
        self
    }

    pub fn args<I: IntoIterator<Item = S>, S: Into<OsString>>(&mut self, args: I) -> &mut Self {
        self.argv.extend(args.into_iter().map(Into::into));
        self
    }

    /// The whole environment of the command (nothing is inherited).
    pub fn env(&mut self, env: &[(String, String)]) -> &mut Self {
        self.env = env.to_vec();
        self
    }

    pub fn current_dir(&mut self, dir: impl Into<PathBuf>) -> &mut Self {
        self.cwd = Some(dir.into());
        self
    }

    pub fn program(&self) -> &OsString {
        &self.argv[0]
    }

    /// The program is looked for at `paths`, in order, with `execvp`'s
    /// rules (made by [`search_paths`]): the first that executes is it; a
    /// path refused (EACCES) or missing is passed over, and a file that
    /// is no executable format is run by `/bin/sh`. `argv[0]` stays the
    /// name the command was given.
    pub fn search(&mut self, paths: Vec<OsString>) -> &mut Self {
        self.search = Some(paths);
        self
    }

    /// Starts the command inside the cgroup. Returns once it was executed
    /// (the exec closed the error pipe), or with the error of the step or
    /// the `execve` that failed (the child then reaped).
    pub fn spawn(self, piped: Piped) -> io::Result<Spawned> {
        self.spawn_by(piped, How::Clone3)
    }

    fn spawn_by(mut self, piped: Piped, how: How) -> io::Result<Spawned> {
        let cstr = |b: &[u8]| {
            CString::new(b).map_err(|_| {
                io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in the command")
            })
        };
        let argv: Vec<CString> = self
            .argv
            .iter()
            .map(|a| cstr(a.as_bytes()))
            .collect::<Result<_, _>>()?;
        let env: Vec<CString> = self
            .env
            .iter()
            .map(|(k, v)| cstr(format!("{k}={v}").as_bytes()))
            .collect::<Result<_, _>>()?;
        let cwd = self
            .cwd
            .as_ref()
            .map(|d| cstr(d.as_os_str().as_bytes()))
            .transpose()?;
        let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
        argv_ptrs.push(std::ptr::null());
        let mut env_ptrs: Vec<*const libc::c_char> = env.iter().map(|e| e.as_ptr()).collect();
        env_ptrs.push(std::ptr::null());

        let pipe = || rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC);
        // (hull's end, the child's end) for each piped stream.
        let stdin = piped.stdin.then(pipe).transpose()?.map(|(r, w)| (w, r));
        let stdout = piped.stdout.then(pipe).transpose()?;
        let stderr = piped.stderr.then(pipe).transpose()?;
        let child_fds: [Option<RawFd>; 3] = [
            stdin.as_ref().map(|(_, c)| c.as_raw_fd()),
            stdout.as_ref().map(|(_, c)| c.as_raw_fd()),
            stderr.as_ref().map(|(_, c)| c.as_raw_fd()),
        ];
        let (err_r, err_w) = pipe()?;
        let candidates: Vec<CString> = match &self.search {
            Some(paths) => paths
                .iter()
                .map(|p| cstr(p.as_bytes()))
                .collect::<Result<_, _>>()?,
            None => vec![argv[0].clone()],
        };
        let candidate_ptrs: Vec<*const libc::c_char> =
            candidates.iter().map(|c| c.as_ptr()).collect();
        // `/bin/sh PATH ARGS...` for a file no format executes (slot 1 is
        // set to the path in the child, as glibc's execvp does).
        let mut sh_ptrs: Vec<*const libc::c_char> = Vec::with_capacity(argv.len() + 2);
        sh_ptrs.push(c"/bin/sh".as_ptr());
        sh_ptrs.push(std::ptr::null());
        sh_ptrs.extend(argv[1..].iter().map(|a| a.as_ptr()));
        sh_ptrs.push(std::ptr::null());

        let child = Child {
            candidates: &candidate_ptrs,
            sh_argv: sh_ptrs.as_mut_ptr(),
            search: self.search.is_some(),
            argv: argv_ptrs.as_ptr(),
            envp: env_ptrs.as_ptr(),
            cwd: cwd.as_ref().map(|c| c.as_ptr()),
            stdio: child_fds,
            err_w: err_w.as_raw_fd(),
        };
        let cloned = match how {
            How::Clone3 => clone_into(&self.dir),
            How::Fork => Err(io::Error::from_raw_os_error(libc::ENOSYS)),
        };
        let pid = match cloned {
            Ok(0) => child.run(&mut self.steps, None),
            Ok(pid) => pid,
            Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
                tracing::debug!("no clone3 (ENOSYS): fork, then move into the cgroup");
                // SAFETY: fork(2); the child only runs `Child::run`, which
                // makes async-signal-safe calls on memory prepared above.
                match unsafe { libc::fork() } {
                    -1 => return Err(io::Error::last_os_error()),
                    0 => child.run(&mut self.steps, Some(self.procs.as_raw_fd())),
                    pid => pid,
                }
            }
            Err(e) => return Err(e),
        };
        // The child has its copies: ours must go (the pipes then see EOF
        // when the child's close).
        drop(err_w);
        let hull_end = |p: Option<(OwnedFd, OwnedFd)>| p.map(|(ours, _theirs)| File::from(ours));
        let spawned = Spawned {
            pid,
            stdin: hull_end(stdin),
            stdout: hull_end(stdout),
            stderr: hull_end(stderr),
        };
        // EOF: executed. Four bytes: the errno of the step or exec that
        // failed, after which the child exits.
        let mut errno = [0u8; 4];
        let mut got = 0;
        while got < errno.len() {
            match rustix::io::read(&err_r, &mut errno[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => {
                    reap(pid);
                    return Err(e.into());
                }
            }
        }
        if got == 0 {
            return Ok(spawned);
        }
        reap(pid);
        if got < errno.len() {
            return Err(io::Error::other("the child failed before exec"));
        }
        Err(io::Error::from_raw_os_error(i32::from_ne_bytes(errno)))
    }
}

/// How the child is started: cloned into the cgroup, or (where clone3 is
/// refused, and in tests) forked and moved in.
#[derive(Debug, Clone, Copy)]
enum How {
    Clone3,
    // What a refused clone3 falls back to; chosen directly only by tests.
    #[cfg_attr(not(test), allow(dead_code))]
    Fork,
}

/// Where `execvp` looks for `program` with the environment `env`: the
/// name itself when it holds a `/`, else each entry of its `PATH` (glibc's
/// `/bin:/usr/bin` when it has none; an empty entry is the working
/// directory), joined with the name.
pub fn search_paths(program: &std::ffi::OsStr, env: &[(String, String)]) -> Vec<OsString> {
    if program.as_bytes().contains(&b'/') || program.is_empty() {
        return vec![program.to_os_string()];
    }
    // The first, as getenv finds it.
    let path = env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map_or("/bin:/usr/bin", |(_, v)| v.as_str());
    path.split(':')
        .map(|dir| {
            let mut p = OsString::from(if dir.is_empty() { "." } else { dir });
            p.push("/");
            p.push(program);
            p
        })
        .collect()
}

/// In a child that has just unshared a user namespace: refuses setgroups
/// and writes its uid and gid maps (`/proc/self/{setgroups,uid_map,
/// gid_map}`), with raw calls only, so it can run as a pre-exec step.
pub fn map_ids_in_child(uid_map: &[u8], gid_map: &[u8]) -> io::Result<()> {
    write_proc(c"/proc/self/setgroups", b"deny")?;
    write_proc(c"/proc/self/uid_map", uid_map)?;
    write_proc(c"/proc/self/gid_map", gid_map)
}

/// open + write + close of a file of /proc (no allocation).
fn write_proc(path: &std::ffi::CStr, bytes: &[u8]) -> io::Result<()> {
    // SAFETY: open/write/close on a NUL-terminated string and a live
    // slice that outlive the calls; the descriptor is closed on every path.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = libc::write(fd, bytes.as_ptr().cast(), bytes.len());
        let e = io::Error::last_os_error();
        libc::close(fd);
        if n != bytes.len() as isize {
            return Err(e);
        }
    }
    Ok(())
}

/// Waits for `pid` and returns its status (EINTR retried).
pub fn wait(pid: i32) -> io::Result<std::process::ExitStatus> {
    use std::os::unix::process::ExitStatusExt;
    loop {
        let mut status = 0;
        // SAFETY: waitpid on our own child with a valid out-pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            return Ok(std::process::ExitStatus::from_raw(status));
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

fn reap(pid: i32) {
    let _ = wait(pid);
}

/// The kernel's `struct clone_args` (its first, version 2, 88-byte form).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// clone3 as a fork into the cgroup `dir`: 0 in the child, its pid in the
/// parent.
fn clone_into(dir: &OwnedFd) -> io::Result<i32> {
    let args = CloneArgs {
        flags: CLONE_INTO_CGROUP,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: dir.as_raw_fd() as u64,
        ..CloneArgs::default()
    };
    // SAFETY: clone3 without CLONE_VM and without a stack is fork: the child
    // gets a copy of this address space and returns here with 0. It then
    // runs only `Child::run` (async-signal-safe calls, no allocation) and
    // never returns into Rust code that assumes the parent's threads.
    let r = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as i32)
    }
}

/// What the child needs, as raw pointers and descriptors made before the
/// clone.
struct Child<'a> {
    /// The program's paths, tried in order (one unless searched).
    candidates: &'a [*const libc::c_char],
    /// `/bin/sh`, a free slot, the arguments: for a file without a format.
    sh_argv: *mut *const libc::c_char,
    /// Whether the candidates came from a search (then ENOEXEC runs sh,
    /// and a refused or missing candidate passes to the next).
    search: bool,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    cwd: Option<*const libc::c_char>,
    stdio: [Option<RawFd>; 3],
    err_w: RawFd,
}

impl Child<'_> {
    /// Runs in the child: never returns. `procs`, when given, is the
    /// cgroup's `cgroup.procs` to move into first (the fork fallback).
    fn run(&self, steps: &mut [Step], procs: Option<RawFd>) -> ! {
        let e = match self.prepare(steps, procs) {
            Ok(()) => self.exec(),
            Err(e) => e,
        };
        let errno = e.raw_os_error().unwrap_or(libc::EINVAL).to_ne_bytes();
        // SAFETY: write(2) of a local buffer, then _exit(2): both
        // async-signal-safe; _exit runs no destructors or atexit handlers.
        unsafe {
            libc::write(self.err_w, errno.as_ptr().cast(), errno.len());
            libc::_exit(127)
        }
    }

    /// Executes the first candidate that can be, with glibc `execvp`'s
    /// rules when searching; returns why none could.
    fn exec(&self) -> io::Error {
        let mut refused = false;
        for &path in self.candidates {
            // SAFETY: pointers to NUL-terminated strings and NULL-terminated
            // arrays that live in this (copied) address space until exec
            // replaces it; `sh_argv` has the slot 1 this child may set.
            unsafe {
                libc::execve(path, self.argv, self.envp);
                let e = io::Error::last_os_error();
                if !self.search {
                    return e;
                }
                match e.raw_os_error().unwrap_or(0) {
                    libc::ENOEXEC => {
                        *self.sh_argv.add(1) = path;
                        libc::execve(c"/bin/sh".as_ptr(), self.sh_argv.cast_const(), self.envp);
                        return io::Error::last_os_error();
                    }
                    libc::EACCES => refused = true,
                    libc::ENOENT
                    | libc::ESTALE
                    | libc::ENOTDIR
                    | libc::ENODEV
                    | libc::ETIMEDOUT => {}
                    _ => return e,
                }
            }
        }
        io::Error::from_raw_os_error(if refused { libc::EACCES } else { libc::ENOENT })
    }

    fn prepare(&self, steps: &mut [Step], procs: Option<RawFd>) -> io::Result<()> {
        let check = |r: libc::c_int| {
            if r < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(())
            }
        };
        // SAFETY: raw system calls on descriptors and C strings made before
        // the clone; no allocation, no locks.
        unsafe {
            if let Some(procs) = procs {
                if libc::write(procs, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(io::Error::last_os_error());
                }
            }
            for (target, fd) in self.stdio.iter().enumerate() {
                let Some(fd) = *fd else { continue };
                let target = target as RawFd;
                if fd == target {
                    // dup2 onto itself keeps close-on-exec: clear it.
                    check(libc::fcntl(fd, libc::F_SETFD, 0))?;
                } else {
                    check(libc::dup2(fd, target))?;
                }
            }
            if let Some(cwd) = self.cwd {
                check(libc::chdir(cwd))?;
            }
            // As std does: an empty signal mask, and SIGPIPE back to its
            // default (Rust programs ignore it, and exec keeps ignored
            // signals ignored).
            let mut set = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
            check(libc::sigemptyset(set.as_mut_ptr()))?;
            check(libc::sigprocmask(
                libc::SIG_SETMASK,
                set.as_ptr(),
                std::ptr::null_mut(),
            ))?;
            if libc::signal(libc::SIGPIPE, libc::SIG_DFL) == libc::SIG_ERR {
                return Err(io::Error::last_os_error());
            }
        }
        for step in steps.iter_mut() {
            step()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn cgroup(name: &str) -> RunCgroup {
        RunCgroup::create(&format!("spawn-test-{name}-{}", std::process::id()))
            .expect("the spawn tests need a cgroup v2 hull can create (run as root, as CI does)")
    }

    fn output(s: Spawned) -> (String, std::process::ExitStatus) {
        let mut out = String::new();
        s.stdout.unwrap().read_to_string(&mut out).unwrap();
        (out, wait(s.pid).unwrap())
    }

    /// Both ways of starting: the child is inside the cgroup before it
    /// runs a single instruction of the command, with exactly the given
    /// argv, environment and working directory; the exit code comes back.
    #[test]
    fn the_child_is_born_inside_the_cgroup() {
        for how in [How::Clone3, How::Fork] {
            let cg = cgroup(&format!("{how:?}"));
            let mut c = CgroupCommand::new("/bin/sh", &cg).unwrap();
            c.args([
                "-c",
                "cat /proc/self/cgroup; echo \"$0 $X $HOME\"; pwd; exit 7",
                "zero",
            ])
            .env(&[("X".into(), "ex".into())])
            .current_dir("/usr");
            let (out, st) = output(
                c.spawn_by(
                    Piped {
                        stdout: true,
                        ..Piped::default()
                    },
                    how,
                )
                .unwrap(),
            );
            let name = cg.dir().file_name().unwrap().to_string_lossy().into_owned();
            assert!(
                out.lines()
                    .any(|l| l.starts_with("0::/") && l.ends_with(&name)),
                "{how:?}: not in {name}: {out}"
            );
            assert!(out.contains("zero ex \n/usr\n"), "{how:?}: {out}");
            assert_eq!(st.code(), Some(7), "{how:?}");
            assert!(cg.is_empty());
        }
    }

    /// A searched program is the first candidate that executes, with
    /// execvp's rules: a file without an execute bit (EACCES) and a
    /// missing one are passed over, a file of no executable format runs
    /// under /bin/sh with its path as `$0`, and `argv[0]` stays the name
    /// given; none that executes is EACCES when one was refused, else
    /// ENOENT.
    #[test]
    fn a_searched_program_is_found_as_execvp_finds_it() {
        use std::os::unix::fs::PermissionsExt;
        let cg = cgroup("search");
        let t = tempfile::tempdir().unwrap();
        let (refused, missing, script) =
            (t.path().join("a"), t.path().join("b"), t.path().join("c"));
        for d in [&refused, &script] {
            std::fs::create_dir(d).unwrap();
        }
        std::fs::write(refused.join("prog"), "echo refused\n").unwrap();
        std::fs::set_permissions(refused.join("prog"), std::fs::Permissions::from_mode(0o644))
            .unwrap();
        std::fs::write(script.join("prog"), "echo \"sh $0 $1\"\n").unwrap();
        std::fs::set_permissions(script.join("prog"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
        let env = vec![(
            "PATH".to_string(),
            format!(
                "{}:{}:{}",
                refused.display(),
                missing.display(),
                script.display()
            ),
        )];
        let paths = search_paths(std::ffi::OsStr::new("prog"), &env);
        assert_eq!(
            paths,
            [&refused, &missing, &script].map(|d| d.join("prog").into_os_string())
        );
        let mut c = CgroupCommand::new("prog", &cg).unwrap();
        c.arg("one").env(&env).search(paths.clone());
        let (out, st) = output(
            c.spawn(Piped {
                stdout: true,
                ..Piped::default()
            })
            .unwrap(),
        );
        assert_eq!(out, format!("sh {} one\n", script.join("prog").display()));
        assert_eq!(st.code(), Some(0));
        let fails = |paths: Vec<OsString>| {
            let mut c = CgroupCommand::new("prog", &cg).unwrap();
            c.search(paths);
            c.spawn(Piped::default()).unwrap_err().raw_os_error()
        };
        assert_eq!(fails(paths[..2].to_vec()), Some(libc::EACCES));
        assert_eq!(fails(paths[1..2].to_vec()), Some(libc::ENOENT));
        // A name with a slash is that path; no PATH is glibc's default.
        assert_eq!(search_paths(std::ffi::OsStr::new("./x"), &env), ["./x"]);
        assert_eq!(
            search_paths(std::ffi::OsStr::new("x"), &[]),
            ["/bin/x", "/usr/bin/x"]
        );
    }

    /// A step that fails stops the exec: spawn returns the step's error,
    /// the program never ran and the child is reaped; so is a program that
    /// does not exist.
    #[test]
    fn a_failing_step_or_exec_is_the_spawns_error() {
        let cg = cgroup("fail");
        let marker = std::env::temp_dir().join(format!("hull-spawn-{}", std::process::id()));
        let _ = std::fs::remove_file(&marker);
        let mut c = CgroupCommand::new("/usr/bin/touch", &cg).unwrap();
        c.arg(&marker);
        // SAFETY: returns an error without any call.
        unsafe {
            c.pre_exec_step(Box::new(|| Err(io::Error::from_raw_os_error(libc::EACCES))));
        }
        let e = c.spawn(Piped::default()).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EACCES));
        assert!(!marker.exists(), "the program ran after a failed step");
        let e = CgroupCommand::new("/no/such/program", &cg)
            .unwrap()
            .spawn(Piped::default())
            .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
        // Both children were reaped: this thread has none but the cgroup's
        // watchdog, not even a zombie (the list is per thread, so other
        // tests' do not count).
        let children = format!(
            "/proc/self/task/{}/children",
            rustix::thread::gettid().as_raw_nonzero()
        );
        let watchdog = cg.watchdog_pid().map(|p| p.to_string()).unwrap_or_default();
        assert_eq!(std::fs::read_to_string(&children).unwrap().trim(), watchdog);
        // And with the step gone, the same command runs and lands.
        let mut c = CgroupCommand::new("/usr/bin/touch", &cg).unwrap();
        c.arg(&marker);
        let s = c.spawn(Piped::default()).unwrap();
        assert!(wait(s.pid).unwrap().success());
        assert!(marker.exists());
        let _ = std::fs::remove_file(&marker);
    }

    /// stdin piped from hull reaches the command; SIGPIPE is back to its
    /// default in the command although hull ignores it.
    #[test]
    fn stdin_is_piped_and_sigpipe_is_default() {
        use std::io::Write;
        let cg = cgroup("stdin");
        let mut c = CgroupCommand::new("/bin/sh", &cg).unwrap();
        c.args(["-c", "grep SigIgn /proc/self/status; cat"]);
        let mut s = c
            .spawn(Piped {
                stdin: true,
                stdout: true,
                stderr: false,
            })
            .unwrap();
        s.stdin.take().unwrap().write_all(b"through\n").unwrap();
        let (out, st) = output(s);
        assert!(st.success());
        assert!(out.ends_with("through\n"), "{out}");
        let ign = out
            .lines()
            .next()
            .unwrap()
            .split_whitespace()
            .nth(1)
            .unwrap();
        let mask = u64::from_str_radix(ign, 16).unwrap();
        assert_eq!(
            mask & (1 << (libc::SIGPIPE - 1)),
            0,
            "SIGPIPE ignored: {out}"
        );
    }
}
