//! A native session's one sandbox: `hull run --session-leader` starts
//! hull's agent as the command of a single run (landlock or bwrap, the
//! session's policy and project), and every exec of the session is an
//! `Exec` frame to it on that run's stdin, answered on its stdout. So all
//! execs share one set of namespaces (bwrap) or one Landlock domain and
//! cgroup (landlock), the boundary of `hull run` itself; what one exec
//! leaves running, or writes to the run's `TMPDIR`, is there for the next.
//! The leader ends when the session closes (its stdin closes: the agent
//! kills every exec's tree and exits; the run then removes its instance).
//!
//! The agent runs with the command's privileges, inside the sandbox: it is
//! no more trusted than the command. Everything it sends is decoded with
//! the protocol's bounds; a frame it may not send, or a broken stream,
//! ends the session (its run is killed); output beyond what an exec keeps
//! is counted and dropped; an exec the agent does not end within its
//! time limit and a grace period ends the session too.

use std::collections::HashMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hull_protocol::limits::STDIN_WINDOW;
use hull_protocol::{encode, Decoder, ErrorCode, Exec, ExitStatus, Message, Role};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

/// Frames queued for one exec before the reader waits (the leader then
/// waits to write).
const EXEC_QUEUE: usize = 8;
/// What an exec's stdin frames carry at most.
const STDIN_CHUNK: usize = (STDIN_WINDOW / 4) as usize;
/// How long the agent has to answer its hello.
const HELLO_WITHIN: Duration = Duration::from_secs(60);
/// How long past an exec's own limit the agent has to end it.
const EXEC_GRACE: Duration = Duration::from_secs(15);
/// How long a closing leader has to end after its stdin closed, then
/// after SIGTERM.
const CLOSE_GRACE: Duration = Duration::from_secs(20);
/// The tail of the run's stderr kept for errors.
const STDERR_KEPT: usize = 8 << 10;

/// Why the session's sandbox cannot run an exec.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error("cannot start hull run: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("the session's sandbox did not start: {0}")]
    NoHello(String),
    #[error("the session's sandbox has ended: {0}")]
    Gone(String),
    /// The exec cannot be framed (its command line or environment is
    /// beyond the protocol's bounds); nothing was sent.
    #[error("{0}")]
    TooLarge(#[source] hull_protocol::EncodeError),
}

/// How one exec ended, as the agent said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    Exit(ExitStatus),
    /// The agent refused or could not start it.
    Refused {
        code: ErrorCode,
        message: String,
    },
}

/// Shared between the session and its reader.
#[derive(Debug, Default)]
struct State {
    /// Each exec in progress: where its frames go.
    execs: Mutex<HashMap<u32, mpsc::Sender<Message>>>,
    /// Why the leader is gone, once it is.
    gone: Mutex<Option<String>>,
    stderr: Mutex<Vec<u8>>,
}

impl State {
    fn gone(&self) -> Option<String> {
        self.gone.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Marks the leader gone (the first reason stays) and ends every exec
    /// waiting on it.
    fn end(&self, why: String) {
        let mut g = self.gone.lock().unwrap_or_else(|e| e.into_inner());
        if g.is_none() {
            let tail = self.stderr.lock().unwrap_or_else(|e| e.into_inner());
            let tail = crate::text::printable(String::from_utf8_lossy(&tail).trim_end());
            *g = Some(if tail.is_empty() {
                why
            } else {
                format!("{why}; hull run said: {tail}")
            });
        }
        drop(g);
        self.execs.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

/// The change set ID the leader's run wrote on `r` (before its agent
/// said hello, so it is there now): letters and digits, as the store's.
fn changes_id(r: &std::os::fd::OwnedFd) -> Result<String, String> {
    let _ = rustix::fs::fcntl_setfl(r, rustix::fs::OFlags::NONBLOCK);
    let mut buf = [0u8; 64];
    let n = rustix::io::read(r, &mut buf).unwrap_or(0);
    let text = std::str::from_utf8(&buf[..n]).unwrap_or("");
    let id = text.strip_suffix('\n').unwrap_or("");
    if id.is_empty() || id.len() > 32 || !id.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(format!(
            "the run named no change set (it wrote {:?})",
            crate::text::printable(text)
        ));
    }
    Ok(id.to_string())
}

/// What the writer task does next.
#[derive(Debug)]
enum Out {
    Frame(Vec<u8>),
    /// Close the agent's stdin: the session ends.
    Close,
}

/// A session's leader: the `hull run` and the agent in it.
#[derive(Debug)]
pub struct Leader {
    child: tokio::sync::Mutex<tokio::process::Child>,
    /// Frames to the agent, written in order by one task.
    out: mpsc::UnboundedSender<Out>,
    state: Arc<State>,
    next: AtomicU32,
    closing: AtomicBool,
}

impl Leader {
    /// Starts the leader of a `tier` session under `policy` on `project`
    /// and waits for its agent's hello. With `cow`, the run keeps the
    /// session's writes in a change set (`hull run --cow`), whose ID comes
    /// back with the leader. With `image` (bwrap), the container image is
    /// the sandbox's `/`.
    pub async fn start(
        hull: &Path,
        tier: &str,
        policy: &str,
        project: &Path,
        cow: bool,
        image: Option<&str>,
    ) -> Result<(Leader, Option<String>), LeaderError> {
        let mut c = tokio::process::Command::new(hull);
        c.args([
            "run",
            "--session-leader",
            "--tier",
            tier,
            "--policy",
            policy,
        ]);
        if let Some(r) = image {
            c.args(["--image", r]);
        }
        // The run tells the set's ID on a pipe of its own, before the
        // agent starts (so before its hello).
        let id_pipe = if cow {
            let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
                .map_err(|e| LeaderError::Spawn(e.into()))?;
            let raw = std::os::fd::AsRawFd::as_raw_fd(&w);
            c.args(["--cow", "--changes-id-fd", &raw.to_string()]);
            // SAFETY: fcntl only, async-signal-safe, on a descriptor number
            // held open here while the child starts.
            unsafe {
                c.pre_exec(move || crate::exec::env_fd::keep_in_child(raw));
            }
            Some((r, w))
        } else {
            None
        };
        c.arg("--project")
            .arg(project)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = c.spawn().map_err(LeaderError::Spawn)?;
        // Only the run holds the write end now.
        let id_pipe = id_pipe.map(|(r, _w)| r);
        let (Some(stdin), Some(mut stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(LeaderError::Spawn(std::io::Error::other("no pipes")));
        };
        let state = Arc::new(State::default());
        tokio::spawn(keep_stderr(stderr, Arc::clone(&state)));
        let (out, rx) = mpsc::unbounded_channel();
        tokio::spawn(write_frames(stdin, rx, Arc::clone(&state)));
        let leader = Leader {
            child: tokio::sync::Mutex::new(child),
            out,
            state,
            next: AtomicU32::new(1),
            closing: AtomicBool::new(false),
        };
        let software = format!("hull {}", env!("CARGO_PKG_VERSION"));
        leader.send(
            &hull_protocol::client::hello_message(Role::Host, &software),
            0,
        )?;
        let mut decoder = Decoder::new();
        let hello = tokio::time::timeout(HELLO_WITHIN, first_frame(&mut stdout, &mut decoder))
            .await
            .unwrap_or_else(|_| Err(format!("no hello within {HELLO_WITHIN:?}")))
            .and_then(|f| hull_protocol::client::check_peer_hello(f).map_err(|e| e.to_string()));
        match hello {
            Ok((h, _)) if h.role == Role::InnerAgent => {}
            Ok((h, _)) => return Err(leader.fail_start(format!("a {:?} answered", h.role)).await),
            Err(e) => return Err(leader.fail_start(e).await),
        }
        let changes = match id_pipe.map(|r| changes_id(&r)) {
            None => None,
            Some(Ok(id)) => Some(id),
            Some(Err(why)) => return Err(leader.fail_start(why).await),
        };
        tokio::spawn(read_frames(
            stdout,
            decoder,
            Arc::clone(&leader.state),
            leader.out.clone(),
        ));
        Ok((leader, changes))
    }

    /// The leader did not come up: its run is killed, and the reason says
    /// what it printed.
    async fn fail_start(&self, why: String) -> LeaderError {
        let mut child = self.child.lock().await;
        let _ = child.start_kill();
        let _ = tokio::time::timeout(CLOSE_GRACE, child.wait()).await;
        // What it printed has reached us by now, or never will.
        tokio::time::sleep(Duration::from_millis(50)).await;
        self.state.end(why);
        LeaderError::NoHello(self.state.gone().unwrap_or_default())
    }

    fn send(&self, msg: &Message, id: u32) -> Result<(), LeaderError> {
        let bytes = encode(msg, id).map_err(|e| LeaderError::Gone(e.to_string()))?;
        self.out
            .send(Out::Frame(bytes))
            .map_err(|_| LeaderError::Gone(self.state.gone().unwrap_or_default()))
    }

    /// A fresh exec id, not in use.
    fn id(&self) -> u32 {
        loop {
            let id = self.next.fetch_add(1, Ordering::Relaxed);
            if id != 0
                && !self
                    .state
                    .execs
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .contains_key(&id)
            {
                return id;
            }
        }
    }

    /// Runs `exec` in the sandbox: `stdin` is written to it (then closed),
    /// `on_output` gets each piece of output (stream 1 or 2) as it comes.
    /// Dropped before it ends, the exec's tree is killed.
    pub async fn exec(
        &self,
        mut exec: Exec,
        stdin: Option<Vec<u8>>,
        on_output: &mut (dyn FnMut(u8, &[u8]) + Send),
    ) -> Result<Ended, LeaderError> {
        if let Some(why) = self.state.gone() {
            return Err(LeaderError::Gone(why));
        }
        if self.closing.load(Ordering::Acquire) {
            return Err(LeaderError::Gone("the session is closing".into()));
        }
        let id = self.id();
        let (tx, mut rx) = mpsc::channel(EXEC_QUEUE);
        let input = stdin.unwrap_or_default();
        exec.stdin = !input.is_empty();
        let deadline = exec
            .timeout_ms
            .map(|ms| tokio::time::Instant::now() + Duration::from_millis(ms) + EXEC_GRACE);
        let framed = encode(&Message::Exec(exec), id).map_err(LeaderError::TooLarge)?;
        self.state
            .execs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, tx);
        let mut guard = KillOnDrop {
            leader: self,
            id,
            done: false,
        };
        self.out
            .send(Out::Frame(framed))
            .map_err(|_| LeaderError::Gone(self.state.gone().unwrap_or_default()))?;
        let (mut sent, mut acked) = (0usize, 0u64);
        let mut eof_sent = input.is_empty();
        let mut started = false;
        loop {
            // Stdin within the window, once the command runs.
            while started && !eof_sent {
                let in_flight = sent as u64 - acked;
                let n = STDIN_CHUNK.min(input.len() - sent);
                if n == 0 {
                    self.send(&Message::StdinEof, id)?;
                    eof_sent = true;
                } else if in_flight + n as u64 <= STDIN_WINDOW {
                    self.send(&Message::Stdin(input[sent..sent + n].to_vec()), id)?;
                    sent += n;
                } else {
                    break;
                }
            }
            let msg = match deadline {
                Some(d) => match tokio::time::timeout_at(d, rx.recv()).await {
                    Ok(m) => m,
                    Err(_) => {
                        let why = format!(
                            "its agent did not end exec {id} within {EXEC_GRACE:?} of its time limit; the session was ended"
                        );
                        return Err(self.end_run(why).await);
                    }
                },
                None => rx.recv().await,
            };
            let Some(msg) = msg else {
                return Err(LeaderError::Gone(
                    self.state
                        .gone()
                        .unwrap_or_else(|| "the session is closing".into()),
                ));
            };
            match msg {
                Message::Started { .. } => started = true,
                Message::StdinAck { bytes } => {
                    if bytes > sent as u64 - acked {
                        let why = format!(
                            "its agent acknowledged stdin it was not sent (exec {id}); the session was ended"
                        );
                        return Err(self.end_run(why).await);
                    }
                    acked += bytes;
                }
                Message::Stdout(b) => on_output(1, &b),
                Message::Stderr(b) => on_output(2, &b),
                Message::Exit(status) => {
                    guard.done = true;
                    return Ok(Ended::Exit(status));
                }
                Message::Error { code, message } => {
                    guard.done = true;
                    return Ok(Ended::Refused { code, message });
                }
                // `Usage` (the reader passes only an agent's exec frames).
                _ => {}
            }
        }
    }

    /// Ends the session's sandbox for `why` (its agent cannot be trusted
    /// to go on): its run is killed.
    async fn end_run(&self, why: String) -> LeaderError {
        self.state.end(why);
        let _ = self.child.lock().await.start_kill();
        LeaderError::Gone(self.state.gone().unwrap_or_default())
    }

    /// Ends the session's sandbox: no exec starts; the agent's stdin
    /// closes (it kills every exec's tree and exits, and the run removes
    /// its instance); SIGTERM, then SIGKILL, if the run takes longer.
    /// Returns once the run has ended.
    pub async fn close(&self) {
        self.closing.store(true, Ordering::Release);
        let _ = self.out.send(Out::Close);
        let mut child = self.child.lock().await;
        if tokio::time::timeout(CLOSE_GRACE, child.wait())
            .await
            .is_err()
        {
            if let Some(pid) = child.id() {
                // SAFETY: kill(2) on our own child, not yet reaped (tokio
                // still knows its pid).
                unsafe { libc::kill(pid as i32, libc::SIGTERM) };
            }
            if tokio::time::timeout(CLOSE_GRACE, child.wait())
                .await
                .is_err()
            {
                tracing::warn!("hull serve: a session's leader did not end on SIGTERM; killed");
                let _ = child.kill().await;
            }
        }
        self.state.end("the session was closed".into());
    }
}

/// Kills an exec that was not waited to its end (its client went away).
struct KillOnDrop<'a> {
    leader: &'a Leader,
    id: u32,
    done: bool,
}

impl Drop for KillOnDrop<'_> {
    fn drop(&mut self) {
        self.leader
            .state
            .execs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
        if !self.done {
            let _ = self.leader.send(&Message::Kill, self.id);
        }
    }
}

/// Keeps the tail of the run's stderr (and logs it).
async fn keep_stderr(mut stderr: tokio::process::ChildStderr, state: Arc<State>) {
    let mut buf = vec![0u8; 4096];
    while let Ok(n) = stderr.read(&mut buf).await {
        if n == 0 {
            break;
        }
        // What the agent (as sandboxed as the command) writes there: no
        // control character reaches the log.
        tracing::info!(
            "session leader: {}",
            crate::text::printable(String::from_utf8_lossy(&buf[..n]).trim_end())
        );
        let mut kept = state.stderr.lock().unwrap_or_else(|e| e.into_inner());
        kept.extend_from_slice(&buf[..n]);
        if kept.len() > STDERR_KEPT {
            let cut = kept.len() - STDERR_KEPT;
            kept.drain(..cut);
        }
    }
}

/// Writes the session's frames to the agent, in order, until told to
/// close its stdin.
async fn write_frames(
    mut stdin: tokio::process::ChildStdin,
    mut rx: mpsc::UnboundedReceiver<Out>,
    state: Arc<State>,
) {
    while let Some(o) = rx.recv().await {
        match o {
            Out::Frame(bytes) => {
                if let Err(e) = stdin.write_all(&bytes).await {
                    state.end(format!("writing to its agent: {e}"));
                    return;
                }
            }
            Out::Close => return,
        }
    }
}

async fn first_frame(
    r: &mut tokio::process::ChildStdout,
    decoder: &mut Decoder,
) -> Result<hull_protocol::Frame, String> {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        if let Some(f) = decoder.next_frame().map_err(|e| e.to_string())? {
            return Ok(f);
        }
        let n = r.read(&mut buf).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("its agent ended before its hello".into());
        }
        decoder.feed(&buf[..n]).map_err(|e| e.to_string())?;
    }
}

/// Reads the agent's frames and hands each exec's to it; answers pings.
/// A frame the agent may not send, a broken stream or its end ends the
/// session.
async fn read_frames(
    mut r: tokio::process::ChildStdout,
    mut decoder: Decoder,
    state: Arc<State>,
    out: mpsc::UnboundedSender<Out>,
) {
    let mut buf = vec![0u8; 64 << 10];
    let why = 'read: loop {
        loop {
            let frame = match decoder.next_frame() {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => break 'read format!("its agent sent a malformed stream: {e}"),
            };
            let id = frame.id;
            match frame.message {
                // The host never pings the agent here, and is not pinged:
                // an answer would queue without bound for an agent that
                // does not read.
                Message::Pong { .. } if id == 0 => {}
                Message::Error { code, message } if id == 0 => {
                    break 'read format!("its agent reported {code}: {message}")
                }
                m @ (Message::Started { .. }
                | Message::StdinAck { .. }
                | Message::Stdout(_)
                | Message::Stderr(_)
                | Message::Usage { .. }
                | Message::Exit(_)
                | Message::Error { .. })
                    if id != 0 =>
                {
                    let tx = state
                        .execs
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .get(&id)
                        .cloned();
                    // An exec given up on: its frames are dropped.
                    if let Some(tx) = tx {
                        let _ = tx.send(m).await;
                    }
                }
                m => {
                    break 'read format!(
                        "its agent sent a {} frame (id {id}), which it may not",
                        m.kind().name()
                    )
                }
            }
        }
        match r.read(&mut buf).await {
            Ok(0) => break 'read "its agent ended".to_string(),
            Ok(n) => {
                if let Err(e) = decoder.feed(&buf[..n]) {
                    break 'read format!("its agent sent a malformed stream: {e}");
                }
            }
            Err(e) => break 'read format!("reading from its agent: {e}"),
        }
    };
    state.end(why);
    // Whatever the agent does now, it is not heard: the writer stops too.
    let _ = out.send(Out::Close);
}
