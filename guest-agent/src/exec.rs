//! One exec from `Exec` to its terminal frame.
//!
//! Per exec a supervisor thread owns the lifecycle; helper threads read the
//! shepherd's status pipe, stdout and stderr, and write stdin. Output frames
//! are sent as bytes arrive (at most 64 KiB per frame, no buffering until
//! exit); `Exit` is sent only after both output pipes reached end of file.
//!
//! The whole tree is killed on `Kill`, on timeout, when the connection is
//! lost, and also when the command itself exits normally: nothing an exec
//! started outlives it. Except in a session that keeps what an exec left
//! ([`Mode::keep_leftovers`], a session's leader in a native sandbox, as
//! `docker exec` does): there an exec that ended by itself is over once its
//! output closes, or [`LINGER`] after its command exited when a leftover
//! holds the output open (what it writes later is read and dropped), and
//! its leftovers run on under its shepherd until the session ends. In the container the command has a cgroup of its
//! own ([`crate::cgroup`]) and the kill is its `cgroup.kill`; a tree still
//! there past [`crate::cgroup::GONE_WITHIN`] ends the exec with
//! `TreeSurvived`. Elsewhere it is SIGKILL to the command's process group
//! and to every descendant of the shepherd ([`crate::tree`]).
//!
//! Guards against: trees escaping by `setsid` or double fork (see
//! [`crate::spawn`]), output arriving after `Exit`, a shepherd that dies
//! early (its adopted orphans are swept and the exec ends with an `Error`),
//! and unbounded stdin buffering (the session enforces the stdin window).
//! Does not limit memory, cpu or pids of the command: that is the
//! container's (Incus limits) and the policy's job.

use std::fs::File;
use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use hull_protocol::{ErrorCode, Exec, ExitStatus, Message};

use crate::cgroup::{self, ExecCgroup};
use crate::outbox::Outbox;
use crate::spawn::{self, SpawnError, Spawned, REC_EXITED, REC_STARTED, REC_START_FAILED};
use crate::tree;

/// Largest output frame the agent sends.
const OUTPUT_CHUNK: usize = 64 * 1024;

/// What a supervisor reacts to.
#[derive(Debug)]
pub(crate) enum Event {
    /// Host asked to kill the tree.
    Kill,
    /// Host asked to signal the command's process group.
    Signal(i32),
    /// The connection is gone: kill the tree, send nothing more.
    ConnLost,
    /// A protocol violation on this exec: kill the tree, end with this error.
    Abort(ErrorCode, String),
    /// A record from the shepherd's status pipe.
    Record(u8, i32, i32),
    /// The shepherd exited and was reaped.
    ShepherdGone,
    /// stdout or stderr reached end of file.
    OutputDone,
}

/// Commands for the stdin writer.
#[derive(Debug)]
pub(crate) enum StdinCmd {
    Data(Vec<u8>),
    Eof,
}

/// The session's view of a running exec.
#[derive(Debug)]
pub(crate) struct ExecHandle {
    pub events: Sender<Event>,
    pub stdin: Option<StdinHandle>,
    pub kill_sent: bool,
    /// `Signal` frames received so far.
    pub signals: usize,
}

#[derive(Debug)]
pub(crate) struct StdinHandle {
    pub tx: Sender<StdinCmd>,
    /// Bytes received from the host and not yet acknowledged.
    pub in_flight: Arc<AtomicU64>,
    pub eof: bool,
}

/// Start `req` under `id`, in a cgroup of its own when `cgroups` says
/// so ([`crate::cgroup`]). `unregister` is called once, right before the
/// terminal frame, to remove the exec from the session's table.
/// How an exec's tree is kept.
#[derive(Debug, Clone, Copy, Default)]
pub struct Mode {
    /// The tree in a cgroup of its own, ended by `cgroup.kill`.
    pub cgroups: bool,
    /// What the command left running when it exited by itself is not
    /// killed (it is on a kill, a timeout or the session's end).
    pub keep_leftovers: bool,
}

/// How long an exec whose command exited waits for a leftover to close its
/// output (with [`Mode::keep_leftovers`]).
pub const LINGER: Duration = Duration::from_millis(100);

pub(crate) fn start(
    id: u32,
    req: &Exec,
    ids: Option<(u32, u32)>,
    mode: Mode,
    out: Outbox,
    unregister: Box<dyn FnOnce() + Send>,
) -> Result<(ExecHandle, JoinHandle<()>), SpawnError> {
    let cgroup = match mode.cgroups {
        true => Some(ExecCgroup::new().map_err(|e| SpawnError::Resource {
            what: "a cgroup",
            source: io::Error::other(e),
        })?),
        false => None,
    };
    let Spawned {
        program,
        shepherd,
        status,
        stdout,
        stderr,
        stdin,
    } = spawn::spawn(req, ids, cgroup.as_ref().map(ExecCgroup::procs_fd))?;
    let (tx, rx) = mpsc::channel();

    let status_tx = tx.clone();
    thread::Builder::new()
        .name(format!("exec{id}-status"))
        .spawn(move || watch_status(status, shepherd, status_tx))
        .map_err(|e| SpawnError::Resource {
            what: "a status thread",
            source: e,
        })?;

    let (stdin_handle, stdin_thread) = match stdin {
        Some(pipe) => {
            let (stx, srx) = mpsc::channel();
            let in_flight = Arc::new(AtomicU64::new(0));
            let (f, o) = (in_flight.clone(), out.clone());
            let t = thread::Builder::new()
                .name(format!("exec{id}-stdin"))
                .spawn(move || write_stdin(pipe, srx, f, o, id))
                .map_err(|e| SpawnError::Resource {
                    what: "a stdin thread",
                    source: e,
                })?;
            (
                Some(StdinHandle {
                    tx: stx,
                    in_flight,
                    eof: false,
                }),
                Some(t),
            )
        }
        None => (None, None),
    };

    let sup = Supervisor {
        id,
        argv0: String::from_utf8_lossy(req.argv[0].as_slice()).into_owned(),
        program,
        cwd: String::from_utf8_lossy(req.cwd.as_slice()).into_owned(),
        uid: req.uid,
        out,
        tx: tx.clone(),
        rx,
        shepherd,
        pid: None,
        wait_status: None,
        start_failed: None,
        outputs: Some((stdout, stderr)),
        outputs_open: 0,
        shepherd_gone: false,
        end: None,
        deadline: req
            .timeout_ms
            .and_then(|ms| Instant::now().checked_add(Duration::from_millis(ms))),
        stdin_thread,
        unregister: Some(unregister),
        cgroup,
        gone_by: None,
        survived: None,
        keep: mode.keep_leftovers,
        exited_at: None,
        detached: Arc::new(std::sync::Mutex::new(false)),
    };
    let handle = thread::Builder::new()
        .name(format!("exec{id}"))
        .spawn(move || sup.run())
        .map_err(|e| SpawnError::Resource {
            what: "a supervisor thread",
            source: e,
        })?;
    Ok((
        ExecHandle {
            events: tx,
            stdin: stdin_handle,
            kill_sent: false,
            signals: 0,
        },
        handle,
    ))
}

impl Supervisor {
    /// When the program is a script whose `#!` interpreter is not there
    /// (true) or exists but could not be executed (false): the message.
    /// The script is read without following a link or opening a FIFO.
    fn interpreter_trouble(&self) -> Option<(String, bool)> {
        use std::os::unix::ffi::OsStrExt;
        let cwd = std::path::Path::new(&self.cwd);
        let script = cwd.join(&self.program);
        let fd = rustix::fs::openat2(
            rustix::fs::CWD,
            &script,
            rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::NONBLOCK
                | rustix::fs::OFlags::NOCTTY
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
            rustix::fs::ResolveFlags::NO_MAGICLINKS,
        )
        .ok()?;
        let interp = hull_protocol::shebang::interpreter_of(&File::from(fd))?;
        let interp = cwd.join(std::ffi::OsStr::from_bytes(&interp));
        let missing = std::fs::metadata(&interp).is_err();
        let why = if missing {
            "is not there"
        } else {
            "cannot be executed"
        };
        Some((
            format!(
                "its interpreter {} (the #! line of {}) {why} in the container",
                interp.display(),
                script.display()
            ),
            missing,
        ))
    }
}

/// Why the tree was ended by the agent.
#[derive(Debug)]
enum End {
    Killed,
    TimedOut,
    ConnLost,
    Abort(ErrorCode, String),
}

struct Supervisor {
    id: u32,
    argv0: String,
    /// argv[0] as resolved in PATH (relative to `cwd` when relative).
    program: std::path::PathBuf,
    /// The working directory and user it was to start in and as (for errors).
    cwd: String,
    uid: Option<u32>,
    out: Outbox,
    tx: Sender<Event>,
    rx: Receiver<Event>,
    shepherd: i32,
    pid: Option<i32>,
    /// Raw wait status of the command, once the shepherd reaped it.
    wait_status: Option<i32>,
    /// (step, errno) when the command never reached execve.
    start_failed: Option<(i32, i32)>,
    outputs: Option<(File, File)>,
    outputs_open: usize,
    shepherd_gone: bool,
    end: Option<End>,
    deadline: Option<Instant>,
    stdin_thread: Option<JoinHandle<()>>,
    unregister: Option<Box<dyn FnOnce() + Send>>,
    /// The command's cgroup (inside the container), ended by `cgroup.kill`.
    cgroup: Option<ExecCgroup>,
    /// When a killed tree must be gone by.
    gone_by: Option<Instant>,
    /// How many processes outlived the kill past [`cgroup::GONE_WITHIN`].
    survived: Option<usize>,
    /// [`Mode::keep_leftovers`].
    keep: bool,
    /// When the command exited (with `keep`).
    exited_at: Option<Instant>,
    /// Set (under its lock) as the terminal frame is sent: output read
    /// after it is dropped, never sent.
    detached: Arc<std::sync::Mutex<bool>>,
}

impl Supervisor {
    fn run(mut self) {
        while !(self.shepherd_gone && self.outputs_open == 0) {
            // The command exited by itself and what it left is kept: the
            // exec is over once its output closed, or past the linger.
            let linger = match (self.keep, self.end.is_none(), self.exited_at) {
                (true, true, Some(at)) => {
                    if self.outputs_open == 0 || at.elapsed() >= LINGER {
                        break;
                    }
                    Some(at + LINGER)
                }
                _ => None,
            };
            let timeout = self
                .deadline
                .filter(|_| self.end.is_none() && self.exited_at.is_none());
            let wake = [timeout, self.gone_by, linger].into_iter().flatten().min();
            let ev = match wake {
                Some(d) => match self
                    .rx
                    .recv_timeout(d.saturating_duration_since(Instant::now()))
                {
                    Ok(ev) => ev,
                    Err(RecvTimeoutError::Timeout) => {
                        if linger.is_some_and(|l| Instant::now() >= l) {
                            continue;
                        }
                        if self.gone_by.is_some_and(|g| Instant::now() >= g) {
                            if self.tree_survived() {
                                break;
                            }
                        } else {
                            self.end_tree(End::TimedOut);
                        }
                        continue;
                    }
                    Err(RecvTimeoutError::Disconnected) => break,
                },
                None => match self.rx.recv() {
                    Ok(ev) => ev,
                    Err(_) => break,
                },
            };
            self.on_event(ev);
        }
        // Whatever is left in the cgroup goes now, within the bound
        // (unless it is kept: the command exited by itself).
        let kept = self.keep && self.end.is_none() && self.wait_status.is_some();
        if self.survived.is_none() && !kept {
            if let Some(cg) = &self.cgroup {
                if cg.populated() {
                    cg.kill();
                    if !cg.wait_gone(cgroup::GONE_WITHIN) {
                        self.survived = Some(cg.left().max(1));
                    }
                }
            }
        }
        if let Some(unregister) = self.unregister.take() {
            unregister();
        }
        if let Some(t) = self.stdin_thread.take() {
            // A kept leftover may hold the stdin pipe without reading it:
            // the thread ends when the pipe does.
            if !kept {
                let _ = t.join();
            }
        }
        let detached = Arc::clone(&self.detached);
        let mut detached = detached.lock().unwrap_or_else(|e| e.into_inner());
        *detached = true;
        if let Some(msg) = self.terminal_frame() {
            self.out.send(&msg, self.id);
        }
    }

    fn on_event(&mut self, ev: Event) {
        match ev {
            Event::Record(REC_STARTED, pid, _) => {
                self.pid = Some(pid);
                self.out
                    .send(&Message::Started { pid: pid as u32 }, self.id);
                self.start_output_readers();
            }
            Event::Record(REC_START_FAILED, step, errno) => {
                self.start_failed = Some((step, errno));
                self.outputs = None;
            }
            Event::Record(REC_EXITED, status, _) => {
                self.wait_status = Some(status);
                if self.keep {
                    self.exited_at = Some(Instant::now());
                } else {
                    // The command is done: whatever it left behind goes too.
                    self.kill_tree();
                }
            }
            Event::Record(tag, _, _) => {
                tracing::error!(id = self.id, tag, "unknown shepherd record");
            }
            Event::ShepherdGone => {
                self.shepherd_gone = true;
                self.outputs = None;
                if self.wait_status.is_none() && self.start_failed.is_none() {
                    // The shepherd died before the command: its tree was
                    // adopted by the agent. Kill it there.
                    if let Some(cg) = &self.cgroup {
                        cg.kill();
                    }
                    if let Err(e) = tree::sweep_orphans() {
                        tracing::error!(id = self.id, "orphan sweep failed: {e}");
                    }
                }
            }
            Event::OutputDone => self.outputs_open = self.outputs_open.saturating_sub(1),
            Event::Kill => self.end_tree(End::Killed),
            Event::ConnLost => self.end_tree(End::ConnLost),
            Event::Abort(code, msg) => self.end_tree(End::Abort(code, msg)),
            Event::Signal(sig) => {
                if let (Some(pid), None) = (self.pid, self.wait_status) {
                    // SAFETY: kill(2) with a negative pid signals that
                    // process group; the command (its leader) is not yet
                    // reaped, so the group id cannot have been recycled.
                    unsafe { libc::kill(-pid, sig) };
                }
            }
        }
    }

    fn start_output_readers(&mut self) {
        let Some((stdout, stderr)) = self.outputs.take() else {
            return;
        };
        for (file, is_err) in [(stdout, false), (stderr, true)] {
            let (out, tx, id) = (self.out.clone(), self.tx.clone(), self.id);
            let detached = Arc::clone(&self.detached);
            let name = format!("exec{id}-{}", if is_err { "stderr" } else { "stdout" });
            match thread::Builder::new()
                .name(name)
                .spawn(move || pump_output(file, is_err, out, tx, id, detached))
            {
                Ok(_) => self.outputs_open += 1,
                Err(e) => {
                    tracing::error!(id, "cannot start an output thread: {e}");
                    self.end_tree(End::Abort(
                        ErrorCode::Internal,
                        format!("cannot start an output thread: {e}"),
                    ));
                }
            }
        }
    }

    fn end_tree(&mut self, why: End) {
        if self.end.is_none() {
            self.end = Some(why);
        }
        self.kill_tree();
    }

    /// Past the bound for a killed tree: whether processes of it are
    /// still there (then the exec ends saying so; the host takes the VM
    /// down). Without a cgroup the shepherd's end is what tells.
    fn tree_survived(&mut self) -> bool {
        self.gone_by = None;
        match &self.cgroup {
            Some(cg) if cg.populated() => {
                self.survived = Some(cg.left().max(1));
                true
            }
            _ => false,
        }
    }

    fn kill_tree(&mut self) {
        if let Some(cg) = &self.cgroup {
            // One write ends every process of the command, wherever it
            // reparented, also one that forks as fast as pids free; what
            // it passes over is killed by its threads (briefly waited for
            // here, then up to the bound as the shepherd and outputs end).
            cg.kill();
            cg.wait_gone(Duration::from_millis(200));
            if self.gone_by.is_none() && self.survived.is_none() {
                self.gone_by = Some(Instant::now() + cgroup::GONE_WITHIN);
            }
            return;
        }
        if self.shepherd_gone {
            // The shepherd is reaped: its pid may be reused, never walk it.
            return;
        }
        if let (Some(pid), None) = (self.pid, self.wait_status) {
            // SAFETY: as for Signal; SIGKILL to the not-yet-reaped command's group.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
        if let Err(e) = tree::kill_descendants(self.shepherd) {
            tracing::error!(id = self.id, "killing the tree failed: {e}");
        }
    }

    fn terminal_frame(&mut self) -> Option<Message> {
        if let Some(left) = self.survived {
            let cg = self
                .cgroup
                .as_ref()
                .map(|c| c.path().display().to_string())
                .unwrap_or_default();
            return Some(Message::error(
                ErrorCode::TreeSurvived,
                format!(
                    "{left} process(es) of the command outlived SIGKILL for {} s (cgroup {cg}; \
                     uninterruptible sleep?): this sandbox must not serve another command",
                    cgroup::GONE_WITHIN.as_secs()
                ),
            ));
        }
        match self.end.take() {
            Some(End::ConnLost) => return None,
            Some(End::Abort(code, msg)) => return Some(Message::error(code, msg)),
            Some(End::TimedOut) if self.wait_status.is_some() => {
                return Some(Message::Exit(ExitStatus::TimedOut))
            }
            _ => {}
        }
        if let Some((step, errno)) = self.start_failed {
            let err = io::Error::from_raw_os_error(errno);
            let what = if spawn::is_chdir(step) {
                let user = self
                    .uid
                    .map(|u| format!("uid {u}"))
                    .unwrap_or_else(|| "the agent's user".into());
                format!(
                    "chdir to the working directory {:?} as {user} failed: {err}{}",
                    self.cwd,
                    if errno == libc::EACCES {
                        " (a directory on the way does not let that user through)"
                    } else {
                        ""
                    }
                )
            } else {
                format!("{} failed: {err}", spawn::step_name(step))
            };
            // What a shell tells apart: not there (127), not executable (126).
            let mut code = match (spawn::is_exec(step), errno) {
                (true, libc::ENOENT | libc::ENOTDIR) => ErrorCode::CommandNotFound,
                (true, libc::EACCES | libc::ENOEXEC | libc::EISDIR | libc::EPERM) => {
                    ErrorCode::CommandNotExecutable
                }
                _ => ErrorCode::ExecFailed,
            };
            // execve's error is about the script when its interpreter is
            // what is missing or refused: name the interpreter.
            let what = match spawn::is_exec(step) && matches!(errno, libc::ENOENT | libc::EACCES) {
                true => match self.interpreter_trouble() {
                    Some((why, missing)) => {
                        code = if missing {
                            ErrorCode::CommandNotFound
                        } else {
                            ErrorCode::CommandNotExecutable
                        };
                        why
                    }
                    None => what,
                },
                false => what,
            };
            return Some(Message::error(
                code,
                format!("cannot run {:?}: {what}", self.argv0),
            ));
        }
        match self.wait_status {
            Some(st) if libc::WIFEXITED(st) => {
                Some(Message::Exit(ExitStatus::Code(libc::WEXITSTATUS(st))))
            }
            Some(st) if libc::WIFSIGNALED(st) => {
                Some(Message::Exit(ExitStatus::Signal(libc::WTERMSIG(st))))
            }
            _ => Some(Message::error(
                ErrorCode::Internal,
                "the exec's shepherd process died before the command; its process tree was killed",
            )),
        }
    }
}

/// Read the shepherd's records until it exits, then reap it.
fn watch_status(mut status: File, shepherd: i32, tx: Sender<Event>) {
    loop {
        match spawn::read_record(&mut status) {
            Ok(Some((tag, a, b))) => {
                let _ = tx.send(Event::Record(tag, a, b));
            }
            Ok(None) => break,
            Err(e) => {
                tracing::error!(shepherd, "status pipe: {e}");
                break;
            }
        }
    }
    if let Some(pid) = rustix::process::Pid::from_raw(shepherd) {
        loop {
            match rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty()) {
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => tracing::error!(shepherd, "waitpid: {e}"),
                Ok(_) => {}
            }
            break;
        }
    }
    spawn::forget_shepherd(shepherd);
    let _ = tx.send(Event::ShepherdGone);
}

fn pump_output(
    mut file: File,
    is_err: bool,
    out: Outbox,
    tx: Sender<Event>,
    id: u32,
    detached: Arc<std::sync::Mutex<bool>>,
) {
    let mut buf = vec![0u8; OUTPUT_CHUNK];
    loop {
        match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                let data = buf[..n].to_vec();
                let msg = if is_err {
                    Message::Stderr(data)
                } else {
                    Message::Stdout(data)
                };
                // Keep draining after the connection died so the command
                // is not blocked on a full pipe before it is killed, and
                // after the exec ended so a kept leftover is not either.
                let detached = detached.lock().unwrap_or_else(|e| e.into_inner());
                if !*detached {
                    out.send(&msg, id);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                tracing::error!(id, "reading output: {e}");
                break;
            }
        }
    }
    let _ = tx.send(Event::OutputDone);
}

fn write_stdin(
    mut pipe: File,
    rx: Receiver<StdinCmd>,
    in_flight: Arc<AtomicU64>,
    out: Outbox,
    id: u32,
) {
    let mut broken = false;
    for cmd in rx {
        match cmd {
            StdinCmd::Data(data) => {
                if !broken {
                    if let Err(e) = pipe.write_all(&data) {
                        // The command closed its stdin: drop the rest, but
                        // keep acknowledging so the host is not stalled.
                        tracing::debug!(id, "stdin closed by the command: {e}");
                        broken = true;
                    }
                }
                let n = data.len() as u64;
                in_flight.fetch_sub(n, Ordering::SeqCst);
                out.send(&Message::StdinAck { bytes: n }, id);
            }
            StdinCmd::Eof => break,
        }
    }
}
