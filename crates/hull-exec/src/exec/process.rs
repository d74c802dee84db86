//! Running a process-tier command on the host: spawn, stream, time out,
//! and end the whole tree.
//!
//! hull marks itself a child subreaper, so every process the command starts
//! (also one that called `setsid` and double-forked) stays a descendant of
//! hull until it is reaped. When the command ends, times out, or hull gets
//! SIGINT/SIGTERM/SIGHUP, every descendant of hull is killed, round after
//! round, until none is left. Process tiers run one command per hull process,
//! so "descendants of hull" is exactly the command's tree.

use std::fs::File;
use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::fds::Inheritable;
use super::{ExecError, ExitStatus, OutputSink};

/// Whether the tree can outlive the direct child.
#[derive(Debug)]
pub enum Containment {
    /// The direct child is the init of a pid namespace (bwrap): when it
    /// exits the kernel kills the rest, so a normal exit needs no sweep.
    PidNamespace,
    /// The tree lives in a cgroup of its own (the child moved itself in
    /// before exec): `cgroup.kill` ends it for certain, then the sweep
    /// reaps. Removed when the run ends.
    #[cfg(target_os = "linux")]
    Cgroup(super::cgroup::RunCgroup),
    /// Descendants may outlive the child: sweep after it exits.
    None,
}

impl Containment {
    /// Ends every process of the tree but the direct child's own wait.
    /// A cgroup's tree is gone once the cgroup is empty (no `/proc` sweep:
    /// nothing of the tree can leave it); one that does not empty within
    /// 2 s gets the sweep as well.
    /// `spared`: hull's own helpers for the run (the network proxy), which
    /// are hull's children too but not the command's.
    fn end_tree(&self, main: i32, spared: &[i32]) {
        #[cfg(target_os = "linux")]
        if let Containment::Cgroup(cg) = self {
            if cg.kill_and_wait(Duration::from_secs(2)) {
                return;
            }
        }
        kill_descendants(main, spared);
    }

    /// hull's own watchdog of the tree (a cgroup's), spared by the sweeps.
    fn watchdog(&self) -> Option<i32> {
        match self {
            #[cfg(target_os = "linux")]
            Containment::Cgroup(cg) => cg.watchdog_pid(),
            _ => None,
        }
    }

    /// Whether the tree needs ending after the direct child exits.
    fn needs_sweep(&self) -> bool {
        !matches!(self, Containment::PidNamespace)
    }
}

/// How the command is started: by std, or (landlock) born inside its
/// run's cgroup by hull's own spawn.
#[derive(Debug)]
pub enum Launch {
    Std(Command),
    #[cfg(target_os = "linux")]
    IntoCgroup(super::spawn::CgroupCommand),
}

impl From<Command> for Launch {
    fn from(c: Command) -> Launch {
        Launch::Std(c)
    }
}

#[cfg(target_os = "linux")]
impl super::spawn::PreExec for Launch {
    unsafe fn pre_exec_step(&mut self, step: super::spawn::Step) {
        // SAFETY: the caller upholds the contract; passed on unchanged.
        unsafe {
            match self {
                Launch::Std(c) => c.pre_exec_step(step),
                Launch::IntoCgroup(c) => c.pre_exec_step(step),
            }
        }
    }
}

impl Launch {
    /// The command's whole environment: exactly `env`, nothing inherited.
    pub fn set_env(&mut self, env: &[(String, String)]) {
        match self {
            Launch::Std(c) => {
                c.env_clear();
                c.envs(env.iter().map(|(k, v)| (k, v)));
            }
            #[cfg(target_os = "linux")]
            Launch::IntoCgroup(c) => {
                c.env(env);
            }
        }
    }

    fn program(&self) -> String {
        match self {
            Launch::Std(c) => c.get_program().to_string_lossy().into_owned(),
            #[cfg(target_os = "linux")]
            Launch::IntoCgroup(c) => c.program().to_string_lossy().into_owned(),
        }
    }

    /// Starts it with the streams marked piped as pipes to hull.
    fn spawn(self, stdin: bool, stdout: bool, stderr: bool) -> std::io::Result<Started> {
        let stdio = |piped: bool| {
            if piped {
                Stdio::piped()
            } else {
                Stdio::inherit()
            }
        };
        match self {
            Launch::Std(mut c) => {
                c.stdin(stdio(stdin));
                c.stdout(stdio(stdout));
                c.stderr(stdio(stderr));
                let mut child = c.spawn()?;
                let file = |fd: Option<std::os::fd::OwnedFd>| fd.map(File::from);
                Ok(Started {
                    pid: child.id() as i32,
                    stdin: file(child.stdin.take().map(Into::into)),
                    stdout: file(child.stdout.take().map(Into::into)),
                    stderr: file(child.stderr.take().map(Into::into)),
                    wait: Box::new(move || child.wait()),
                })
            }
            #[cfg(target_os = "linux")]
            Launch::IntoCgroup(c) => {
                let s = c.spawn(super::spawn::Piped {
                    stdin,
                    stdout,
                    stderr,
                })?;
                let pid = s.pid;
                Ok(Started {
                    pid,
                    stdin: s.stdin,
                    stdout: s.stdout,
                    stderr: s.stderr,
                    wait: Box::new(move || super::spawn::wait(pid)),
                })
            }
        }
    }
}

/// A started command: its pid, hull's ends of its piped streams, and how
/// to wait for it.
struct Started {
    pid: i32,
    stdin: Option<File>,
    stdout: Option<File>,
    stderr: Option<File>,
    wait: Box<dyn FnOnce() -> std::io::Result<std::process::ExitStatus> + Send>,
}

enum Event {
    Exited(std::io::Result<std::process::ExitStatus>),
    /// A helper of the run ended: its name and how.
    HelperEnded(String, String),
    Signal(i32),
    Out(Stream, Vec<u8>),
    Eof,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stream {
    Stdout,
    Stderr,
}

/// A process hull runs beside the command for the run (the network
/// proxy): if it ends while the command runs, the command's tree is ended
/// and the run fails naming it ([`ExecError::HelperEnded`]).
pub struct Helper {
    /// What the user reads: "the network proxy (pid 123)".
    pub name: String,
    pub pid: i32,
    /// Blocks until the helper ends and says how ("killed by signal 9"),
    /// without reaping it.
    pub wait: Box<dyn FnOnce() -> String + Send>,
}

impl std::fmt::Debug for Helper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Helper")
            .field("name", &self.name)
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

/// Spawns `cmd` and runs it to the end. With a `sink`, stdout and stderr are
/// piped through it; without one they are inherited (byte for byte, live)
/// when they are pipes, sockets, terminals or /dev/null, and relayed through
/// pipes otherwise (a regular file or directory could be reopened through
/// `/proc/self/fd`: see [`super::fds`]); stdin likewise.
pub fn run(
    cmd: impl Into<Launch>,
    timeout: Option<Duration>,
    sink: Option<&mut dyn OutputSink>,
    containment: Containment,
    close_after_spawn: Vec<std::os::fd::OwnedFd>,
    helpers: Vec<Helper>,
) -> Result<ExitStatus, ExecError> {
    become_subreaper();
    let cmd = cmd.into();
    let program = cmd.program();
    let relay = |fd| Inheritable::of(fd) == Inheritable::No;
    let (pipe_in, pipe_out, pipe_err) = (
        relay(0),
        sink.is_some() || relay(1),
        sink.is_some() || relay(2),
    );
    let (tx, rx) = mpsc::channel::<Event>();
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ])
    .map_err(ExecError::Signals)?;
    let sig_handle = signals.handle();
    {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for s in signals.forever() {
                if tx.send(Event::Signal(s)).is_err() {
                    break;
                }
            }
        });
    }
    // Put back when run returns, after the tree is gone (declared before
    // anything that could keep a process of the tree alive).
    let _terminal = super::terminal::save();
    let child = cmd
        .spawn(pipe_in, pipe_out, pipe_err)
        .map_err(|source| ExecError::Spawn {
            program: program.clone(),
            source,
        })?;
    tracing::debug!(pid = child.pid, "spawned");
    // The child has its copies; ours must go so pipes see EOF.
    drop(close_after_spawn);
    let Started {
        pid: main_pid,
        stdin,
        stdout,
        stderr,
        wait,
    } = child;
    if let Some(mut input) = stdin {
        // Ends at EOF, or with EPIPE once the command's tree is gone.
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut std::io::stdin().lock(), &mut input);
        });
    }
    let mut open_streams = 0;
    if let Some(out) = stdout {
        open_streams += 1;
        pump(out, Stream::Stdout, tx.clone());
    }
    if let Some(err) = stderr {
        open_streams += 1;
        pump(err, Stream::Stderr, tx.clone());
    }
    {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let _ = tx.send(Event::Exited(wait()));
        });
    }
    let spared: Vec<i32> = helpers
        .iter()
        .map(|h| h.pid)
        .chain(containment.watchdog())
        .collect();
    for h in helpers {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let how = (h.wait)();
            let _ = tx.send(Event::HelperEnded(h.name, how));
        });
    }
    drop(tx);

    let deadline = timeout.map(|t| Instant::now() + t);
    let mut sink = sink;
    let mut forced: Option<ExitStatus> = None;
    let mut exited: Option<std::process::ExitStatus> = None;
    let mut output_error: Option<std::io::Error> = None;
    let mut helper_ended: Option<(String, String)> = None;
    let mut swept = false;
    loop {
        if exited.is_some() && open_streams == 0 {
            break;
        }
        let wait = match (deadline, forced, exited) {
            (Some(d), None, None) => d.saturating_duration_since(Instant::now()),
            // After exit or a kill, streams close once the tree is gone.
            _ => Duration::from_millis(200),
        };
        match rx.recv_timeout(wait) {
            Ok(Event::Exited(r)) => {
                let st = r.map_err(ExecError::Wait)?;
                tracing::debug!(?st, "child exited");
                exited = Some(st);
                // The command is done: nothing it left behind may keep running.
                if containment.needs_sweep() || forced.is_some() {
                    containment.end_tree(main_pid, &spared);
                }
                swept = true;
            }
            Ok(Event::Signal(s)) => {
                if forced.is_none() {
                    forced = Some(ExitStatus::Interrupted(s));
                }
                containment.end_tree(main_pid, &spared);
            }
            Ok(Event::HelperEnded(name, how)) => {
                // Only while the command runs: after it, hull ends its
                // helpers itself.
                if exited.is_none() && forced.is_none() && helper_ended.is_none() {
                    tracing::debug!(%name, %how, "helper ended");
                    helper_ended = Some((name, how));
                    containment.end_tree(main_pid, &spared);
                }
            }
            Ok(Event::Out(stream, data)) => {
                let r = match (sink.as_deref_mut(), stream) {
                    (Some(s), Stream::Stdout) => s.stdout(&data),
                    (Some(s), Stream::Stderr) => s.stderr(&data),
                    (None, Stream::Stdout) => write_through(&mut std::io::stdout().lock(), &data),
                    (None, Stream::Stderr) => write_through(&mut std::io::stderr().lock(), &data),
                };
                if let Err(e) = r {
                    if output_error.is_none() {
                        output_error = Some(e);
                        containment.end_tree(main_pid, &spared);
                    }
                }
            }
            Ok(Event::Eof) => open_streams -= 1,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if exited.is_none() && forced.is_none() && helper_ended.is_none() {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        forced = Some(ExitStatus::TimedOut);
                        containment.end_tree(main_pid, &spared);
                    }
                } else {
                    containment.end_tree(main_pid, &spared);
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    tracing::debug!("streams closed");
    sig_handle.close();
    if !swept {
        containment.end_tree(main_pid, &spared);
    }
    if exited.is_some() {
        // Killed above, they may not have exited yet: each reaped one adds
        // its (and its reaped children's) peak to `peak_rss_of_children`.
        reap_tree(&spared, Duration::from_millis(500));
    }
    if let Some(s) = sink {
        s.finish().map_err(ExecError::Output)?;
    }
    if let Some(e) = output_error {
        return Err(ExecError::Output(e));
    }
    if let Some((name, how)) = helper_ended {
        return Err(ExecError::HelperEnded { name, how });
    }
    if let Some(f) = forced {
        return Ok(f);
    }
    let st = exited.ok_or_else(|| ExecError::Wait(std::io::Error::other("no exit status")))?;
    Ok(map_status(st))
}

/// Relays a chunk to hull's own stream as it arrives.
fn write_through(w: &mut impl std::io::Write, data: &[u8]) -> std::io::Result<()> {
    w.write_all(data)?;
    w.flush()
}

fn pump(mut r: impl Read + Send + 'static, stream: Stream, tx: mpsc::Sender<Event>) {
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match r.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx.send(Event::Out(stream, buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = tx.send(Event::Eof);
    });
}

pub use super::map_status;

#[cfg(target_os = "linux")]
fn become_subreaper() {
    // SAFETY: prctl(PR_SET_CHILD_SUBREAPER, 1) takes no pointers and only
    // changes how this process's orphaned descendants are reparented.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    }
}

#[cfg(not(target_os = "linux"))]
fn become_subreaper() {}

/// Kills every descendant of this process, round after round, until none
/// is left (a process forking while we kill is caught in the next round).
#[cfg(target_os = "linux")]
pub fn kill_descendants(main: i32, spared: &[i32]) {
    let me = std::process::id() as i32;
    for _ in 0..200 {
        let mut pids = descendants_of(me);
        pids.retain(|p| !spared.contains(p));
        if pids.is_empty() {
            return;
        }
        for p in &pids {
            // SAFETY: kill(2) with a pid we just read from /proc; at worst
            // the process is already gone (ESRCH).
            unsafe {
                libc::kill(*p, libc::SIGKILL);
            }
        }
        // Killed orphans are our zombies until reaped. The main child is
        // reaped by its waiting thread, never here.
        for p in &pids {
            if *p != main {
                let mut status = 0;
                // SAFETY: waitpid on one pid with a valid out-pointer, WNOHANG.
                unsafe {
                    libc::waitpid(*p, &mut status, libc::WNOHANG);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[cfg(not(target_os = "linux"))]
pub fn kill_descendants(_main: i32, _spared: &[i32]) {}

/// Every process in /proc: its pid, state (`R`, `S`, `Z`, ...) and
/// parent's pid.
#[cfg(target_os = "linux")]
fn proc_table() -> Vec<(i32, String, i32)> {
    use rustix::fs::{openat, Mode, OFlags, CWD};
    let mut out = Vec::new();
    let mut buf = [0u8; 512];
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in rd.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let path = format!("/proc/{pid}/stat");
        let Ok(fd) = openat(
            CWD,
            path.as_str(),
            OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        ) else {
            continue;
        };
        let n = rustix::io::read(&fd, &mut buf).unwrap_or(0);
        let stat = &buf[..n];
        // comm may contain spaces and parens: fields follow the last ')'.
        let Some(close) = stat.iter().rposition(|&b| b == b')') else {
            continue;
        };
        let rest = String::from_utf8_lossy(&stat[close + 1..]);
        let mut f = rest.split_whitespace();
        let state = f.next().unwrap_or("").to_string();
        let ppid = f.next().and_then(|s| s.parse::<i32>().ok()).unwrap_or(0);
        out.push((pid, state, ppid));
    }
    out
}

/// Every live (non-zombie) descendant of `root`, from /proc.
#[cfg(target_os = "linux")]
pub fn descendants_of(root: i32) -> Vec<i32> {
    let parent: Vec<(i32, i32)> = proc_table()
        .into_iter()
        // A zombie leader whose other threads still run (the main thread
        // called pthread_exit) shows as Z but is alive: a kill ends its
        // threads, and its children hang below it.
        .filter(|(pid, state, _)| !((state == "Z" || state == "X") && !has_live_threads(*pid)))
        .map(|(pid, _, ppid)| (pid, ppid))
        .collect();
    let mut out = Vec::new();
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for (c, pp) in &parent {
            if *pp == p && !out.contains(c) {
                out.push(*c);
                frontier.push(*c);
            }
        }
    }
    out
}

/// Whether `pid` has a thread besides its (exited) leader.
#[cfg(target_os = "linux")]
fn has_live_threads(pid: i32) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_name() != pid.to_string().as_str())
                .count()
                > 0
        })
        .unwrap_or(false)
}

/// Reaps exited children without blocking.
#[cfg(unix)]
fn reap_orphans() {
    loop {
        let mut status = 0;
        // SAFETY: waitpid with a valid out-pointer; WNOHANG never blocks.
        let r = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if r <= 0 {
            break;
        }
    }
}

#[cfg(not(unix))]
fn reap_orphans() {}

/// Reaps this process's children (the run's processes it inherited as
/// subreaper, all killed by then) until none but `spared` is left, or
/// `limit` passed.
#[cfg(target_os = "linux")]
fn reap_tree(spared: &[i32], limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        reap_orphans();
        let mut left = own_children();
        left.retain(|p| !spared.contains(p));
        if left.is_empty() || Instant::now() >= deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[cfg(all(unix, not(target_os = "linux")))]
fn reap_tree(_spared: &[i32], _limit: Duration) {
    reap_orphans();
}

/// This process's children, zombies included: each thread's
/// `/proc/self/task/TID/children` (a few small reads), else, where the
/// kernel has no such file (`CONFIG_PROC_CHILDREN`), every process of
/// /proc whose parent it is (a read per process on the machine: a
/// millisecond and more at every run's end).
#[cfg(target_os = "linux")]
fn own_children() -> Vec<i32> {
    if let Some(pids) = children_by_task() {
        return pids;
    }
    let me = std::process::id() as i32;
    proc_table()
        .into_iter()
        .filter(|(_, _, ppid)| *ppid == me)
        .map(|(pid, _, _)| pid)
        .collect()
}

/// The children of every thread of this process, from their `children`
/// files; None when the kernel does not have them.
#[cfg(target_os = "linux")]
fn children_by_task() -> Option<Vec<i32>> {
    let mut out = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let path = task.path().join("children");
        match std::fs::read_to_string(&path) {
            Ok(text) => out.extend(
                text.split_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok()),
            ),
            // The thread ended since the listing: it has no children.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && task.path().exists() => {
                return None
            }
            Err(_) => {}
        }
    }
    Some(out)
}

/// The largest resident set, in bytes, any process this one has waited
/// for (directly, or through the children that waited for theirs) had:
/// after a process tier's run, the peak of the command's largest process.
pub fn peak_rss_of_children() -> Option<u64> {
    // SAFETY: getrusage writes one rusage into the zeroed value it is
    // given and reads nothing else.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        (libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) == 0).then_some(ru)
    }?;
    // Linux counts it in KiB.
    u64::try_from(ru.ru_maxrss).ok().map(|k| k * 1024)
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// The children files list what /proc's parent links say: a live
    /// child and an exited (zombie) one, both until reaped, and neither
    /// after.
    #[test]
    fn own_children_are_what_proc_says_zombies_included() {
        let by_proc = || -> Vec<i32> {
            let me = std::process::id() as i32;
            let mut v: Vec<i32> = proc_table()
                .into_iter()
                .filter(|(_, _, ppid)| *ppid == me)
                .map(|(pid, _, _)| pid)
                .collect();
            v.sort();
            v
        };
        let by_task = || {
            let mut v = children_by_task().expect("this kernel has the children files");
            v.sort();
            v
        };
        let mut live = Command::new("sleep").arg("30").spawn().unwrap();
        let mut gone = Command::new("true").spawn().unwrap();
        // `true` a zombie now: exited, not reaped.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !proc_table()
            .iter()
            .any(|(p, st, _)| *p == gone.id() as i32 && st == "Z")
        {
            assert!(Instant::now() < deadline, "true did not exit");
            std::thread::sleep(Duration::from_millis(5));
        }
        let (l, g) = (live.id() as i32, gone.id() as i32);
        // Other tests of this binary start children too: compare the two
        // listings for ours.
        let ours = |v: Vec<i32>| {
            v.into_iter()
                .filter(|p| *p == l || *p == g)
                .collect::<Vec<_>>()
        };
        let mut want = vec![l, g];
        want.sort();
        assert_eq!(ours(by_task()), want);
        assert_eq!(ours(by_proc()), want);
        live.kill().unwrap();
        live.wait().unwrap();
        gone.wait().unwrap();
        assert_eq!(ours(by_task()), Vec::<i32>::new());
    }
}
