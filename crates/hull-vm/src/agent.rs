//! The host side of the agent session: hello, configure, exec.
//!
//! What this protects against: a hostile guest. Every frame is decoded by
//! `hull-protocol` (sizes capped before allocation, payloads validated, a bad
//! stream poisons the decoder); on top of that this session accepts only the
//! frames that make sense at this point of the conversation (a `Stdout` for
//! the running exec id, one `Started`, one terminal `Exit` or `Error`), and
//! anything else is an error that ends the session, never a panic or a
//! guess. Reads go through a bounded channel, so a guest that floods output
//! is slowed down to the speed of the sink instead of filling host memory.
//! Every wait has a deadline: a command past its wall time is sent `Kill`,
//! and a guest that does not answer that either is reported as unresponsive
//! so the caller kills the VM.
//!
//! What it does not: decide what a command may do (the policy and the
//! container do), or authenticate the guest (the transport is a local socket
//! in the instance dir).

use std::io::{self, Read};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use hull_protocol::client::check_peer_hello;
use hull_protocol::limits::{MAX_TIMEOUT_MS, STDIN_WINDOW};
use hull_protocol::{
    Bytes, ConfigureSpec, Configured, ConnError, ErrorCode, Exec, Frame, FrameReader, FrameWriter,
    Hello, Message, Role,
};

use crate::exec::{CommandSpec, ExitStatus, OutputSink};
use crate::heartbeat::{Beat, Heartbeat};

/// Frames buffered between the socket reader and the session (each at most
/// 1 MiB): the guest is slowed down, not buffered without bound.
const CHANNEL_FRAMES: usize = 16;
/// Extra time past a command's wall time before hull sends `Kill` itself
/// (the agent enforces `timeout_ms` first).
pub const TIMEOUT_GRACE: Duration = Duration::from_secs(5);
/// How long the guest gets to answer `Kill` with `Exit`.
pub const KILL_GRACE: Duration = Duration::from_secs(10);
/// How long it gets after an interrupt: Ctrl-C and SIGTERM end a run within
/// 2 s, whatever the guest does (the VM is killed after this).
pub const INTERRUPT_GRACE: Duration = Duration::from_secs(1);
/// Bytes read from stdin per `Stdin` frame.
const STDIN_CHUNK: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("tier vm: cannot connect to the agent socket {path}: {source}")]
    Connect {
        path: std::path::PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("tier vm: the guest agent did not say hello within {secs}s")]
    HelloTimeout { secs: u64 },
    #[error("tier vm: the VM stopped before the agent answered")]
    VmGone,
    #[error("tier vm: cancelled while waiting for the guest")]
    Cancelled,
    #[error("{0}")]
    Stopped(String),
    #[error("tier vm: agent handshake: {0}")]
    Handshake(#[source] ConnError),
    #[error("tier vm: the peer says it is {0:?}, not a guest agent")]
    WrongRole(Role),
    #[error("tier vm: agent connection: {0}")]
    Connection(#[source] ConnError),
    #[error("tier vm: the guest sent an unexpected {kind} frame (id {id}) {when}; session closed")]
    Unexpected {
        kind: &'static str,
        id: u32,
        when: &'static str,
    },
    #[error("tier vm: the guest broke the protocol: {0}; session closed")]
    Protocol(String),
    #[error("tier vm: the agent reported {code}: {message}")]
    Peer { code: ErrorCode, message: String },
    #[error("tier vm: the command could not run in the guest: {code}: {message}")]
    ExecFailed { code: ErrorCode, message: String },
    /// The program is not there (127) or not executable (126) in the guest.
    #[error("{message} (tier vm)")]
    NotRunnable { exit: i32, message: String },
    /// The exec's user is not one of the container's: nothing started.
    #[error("{message} (tier vm)")]
    UnknownUser { message: String },
    #[error("tier vm: container setup failed in the guest: {code}: {message}")]
    ConfigureFailed { code: ErrorCode, message: String },
    #[error("tier vm: {what} got no answer from the guest within {secs}s")]
    Timeout { what: &'static str, secs: u64 },
    #[error(
        "tier vm: the guest did not answer Kill within {secs}s after {why}; the VM must be killed"
    )]
    Unresponsive { why: &'static str, secs: u64 },
    #[error("tier vm: the guest has not answered for {secs}s (its agent wedged, its kernel hung, or its vCPUs stopped)")]
    Silent { secs: u64 },
    #[error("tier vm: writing the command's output failed: {0}")]
    Sink(#[source] io::Error),
    #[error("tier vm: the agent session is closed after an earlier error")]
    Closed,
    #[error("tier vm: {0}")]
    Request(String),
}

/// Options of one exec.
pub struct ExecOptions {
    /// The command's stdin; `None` gives it `/dev/null`.
    pub stdin: Option<Box<dyn Read + Send>>,
    /// uid and gid in the guest/container (defaults to the agent's choice).
    pub uid_gid: Option<(u32, u32)>,
    /// Set to a signal number (non-zero) to end the command: hull sends
    /// `Kill` and reports [`ExitStatus::Interrupted`].
    pub interrupt: Option<Arc<AtomicI32>>,
    /// How long the guest gets to answer `Kill`.
    pub kill_grace: Duration,
    /// How long the guest may answer nothing, not even a `Ping`
    /// ([`crate::heartbeat`]).
    pub silence_limit: Duration,
    /// Directories of the container's own filesystem the agent empties,
    /// as `uid_gid` (required), before the command starts
    /// ([`hull_protocol::Exec::scrub`]).
    pub scrub: Vec<std::path::PathBuf>,
    /// What the command leaves running when it exits by itself runs on
    /// ([`hull_protocol::Exec::keep_leftovers`]): a session's exec.
    pub keep_leftovers: bool,
}

/// What may end an exec besides its command: its timeout, an interrupt,
/// the grace the guest gets to answer `Kill`, and the caller's watch.
struct Ends<'a> {
    timeout: Option<Duration>,
    interrupt: Option<Arc<AtomicI32>>,
    kill_grace: Duration,
    silence_limit: Duration,
    watch: &'a mut dyn FnMut() -> Option<String>,
}

impl std::fmt::Debug for ExecOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecOptions")
            .field("stdin", &self.stdin.is_some())
            .field("uid_gid", &self.uid_gid)
            .field("kill_grace", &self.kill_grace)
            .field("silence_limit", &self.silence_limit)
            .field("scrub", &self.scrub)
            .field("keep_leftovers", &self.keep_leftovers)
            .finish()
    }
}

impl Default for ExecOptions {
    fn default() -> Self {
        ExecOptions {
            stdin: None,
            uid_gid: None,
            interrupt: None,
            kill_grace: KILL_GRACE,
            silence_limit: crate::heartbeat::SILENCE_LIMIT,
            scrub: Vec::new(),
            keep_leftovers: false,
        }
    }
}

type Writer = Arc<Mutex<FrameWriter<UnixStream>>>;

/// One session with a guest agent over a unix socket (the VM's
/// virtio-serial chardev, or a `hull vm` supervisor's control socket).
#[derive(Debug)]
pub struct AgentSession {
    stream: UnixStream,
    writer: Writer,
    rx: Receiver<Result<Frame, ConnError>>,
    peer: Option<Hello>,
    next_id: u32,
    /// Ids of execs that ended; late `Error` frames for them are ignored.
    finished: Vec<u32>,
    broken: bool,
    /// Handed over with [`AgentSession::into_raw`]: Drop leaves the socket open.
    detached: bool,
    /// The last exec's `Usage`: the container's peak memory while it ran.
    last_peak: Option<u64>,
}

/// The frame-level halves of a session after the hello, for a relay.
#[derive(Debug)]
pub struct RawSession {
    pub stream: UnixStream,
    pub writer: Arc<Mutex<FrameWriter<UnixStream>>>,
    /// Validated frames from the peer, in order; an `Err` ends the stream.
    pub rx: Receiver<Result<Frame, ConnError>>,
}

impl AgentSession {
    /// Connects to `path`, retrying until `deadline` (QEMU creates it as it starts).
    pub fn connect(path: &Path, deadline: Duration) -> Result<AgentSession, AgentError> {
        let end = Instant::now() + deadline;
        loop {
            match UnixStream::connect(path) {
                Ok(s) => {
                    return AgentSession::new(s).map_err(|source| AgentError::Connect {
                        path: path.to_path_buf(),
                        source,
                    })
                }
                Err(source) if Instant::now() >= end => {
                    return Err(AgentError::Connect {
                        path: path.to_path_buf(),
                        source,
                    })
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// Wraps a connected stream; starts the reader thread.
    pub fn new(stream: UnixStream) -> io::Result<AgentSession> {
        let read_half = stream.try_clone()?;
        let write_half = stream.try_clone()?;
        // A guest that stops reading cannot block hull forever.
        write_half.set_write_timeout(Some(Duration::from_secs(30)))?;
        let (tx, rx) = mpsc::sync_channel(CHANNEL_FRAMES);
        std::thread::Builder::new()
            .name("hull-agent-rx".into())
            .spawn(move || {
                let mut r = FrameReader::new(read_half);
                loop {
                    let f = r.recv();
                    let end = f.is_err();
                    if tx.send(f).is_err() || end {
                        break;
                    }
                }
            })?;
        Ok(AgentSession {
            stream,
            writer: Arc::new(Mutex::new(FrameWriter::new(write_half))),
            rx,
            peer: None,
            next_id: 1,
            finished: Vec::new(),
            broken: false,
            detached: false,
            last_peak: None,
        })
    }

    /// The agent's hello, after [`AgentSession::hello`].
    pub fn peer(&self) -> Option<&Hello> {
        self.peer.as_ref()
    }

    fn send(&mut self, msg: &Message, id: u32) -> Result<(), AgentError> {
        let r = match self.writer.lock() {
            Ok(mut w) => w.send(msg, id),
            Err(_) => return Err(AgentError::Closed),
        };
        r.map_err(|e| {
            self.broken = true;
            AgentError::Connection(e)
        })
    }

    /// Next frame, or `None` after `slice` without one.
    fn recv(&mut self, slice: Duration) -> Result<Option<Frame>, AgentError> {
        match self.rx.recv_timeout(slice) {
            Ok(Ok(f)) => Ok(Some(f)),
            Ok(Err(e)) => {
                self.broken = true;
                Err(AgentError::Connection(e))
            }
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(RecvTimeoutError::Disconnected) => {
                self.broken = true;
                Err(AgentError::Connection(ConnError::Closed))
            }
        }
    }

    fn unexpected(&mut self, f: &Frame, when: &'static str) -> AgentError {
        self.broken = true;
        AgentError::Unexpected {
            kind: f.message.kind().name(),
            id: f.id,
            when,
        }
    }

    /// Sends our hello and waits up to `deadline` for the agent's, checking
    /// `alive()` (is the VM still running?) while waiting.
    pub fn hello(
        &mut self,
        deadline: Duration,
        alive: &mut dyn FnMut() -> bool,
    ) -> Result<&Hello, AgentError> {
        let software = format!("hull {}", env!("CARGO_PKG_VERSION"));
        self.send(
            &hull_protocol::client::hello_message(Role::Host, &software),
            0,
        )?;
        let end = Instant::now() + deadline;
        loop {
            if Instant::now() >= end {
                return Err(AgentError::HelloTimeout {
                    secs: deadline.as_secs(),
                });
            }
            if !alive() {
                return Err(AgentError::VmGone);
            }
            let Some(f) = self.recv(Duration::from_millis(100))? else {
                continue;
            };
            match check_peer_hello(f) {
                Ok((h, _v)) => {
                    if h.role == Role::Host {
                        self.broken = true;
                        return Err(AgentError::WrongRole(h.role));
                    }
                    return Ok(self.peer.insert(h));
                }
                Err(e) => {
                    self.broken = true;
                    if let ConnError::Version(v) = &e {
                        let _ = self.send(
                            &Message::error(ErrorCode::VersionMismatch, v.to_string()),
                            0,
                        );
                    }
                    return Err(AgentError::Handshake(e));
                }
            }
        }
    }

    /// Asks the outer agent to set up the container; waits for `Configured`.
    /// `cancelled()` is polled while waiting (Ctrl-C, the VM died).
    pub fn configure(
        &mut self,
        spec: &ConfigureSpec,
        deadline: Duration,
        cancelled: &mut dyn FnMut() -> bool,
    ) -> Result<Configured, AgentError> {
        self.ready()?;
        spec.validate().map_err(AgentError::Request)?;
        self.send(&Message::Configure(spec.clone()), 0)?;
        let end = Instant::now() + deadline;
        loop {
            if cancelled() {
                self.broken = true;
                return Err(AgentError::Cancelled);
            }
            if Instant::now() >= end {
                self.broken = true;
                return Err(AgentError::Timeout {
                    what: "container setup (Configure)",
                    secs: deadline.as_secs(),
                });
            }
            let Some(f) = self.recv(Duration::from_millis(100))? else {
                continue;
            };
            match (f.id, &f.message) {
                (0, Message::Configured(c)) => return Ok(c.clone()),
                (0, Message::Error { code, message }) => {
                    return Err(AgentError::ConfigureFailed {
                        code: *code,
                        message: crate::proc::guest_text(message),
                    })
                }
                (0, Message::Pong { .. }) => {}
                (0, Message::Ping { nonce }) => {
                    let n = *nonce;
                    self.send(&Message::Pong { nonce: n }, 0)?;
                }
                _ => return Err(self.unexpected(&f, "while waiting for Configured")),
            }
        }
    }

    /// Round trip of a `Ping`.
    pub fn ping(&mut self, deadline: Duration) -> Result<Duration, AgentError> {
        self.ready()?;
        let nonce = u64::from(self.next_id) << 32 | 0x5eed;
        let start = Instant::now();
        self.send(&Message::Ping { nonce }, 0)?;
        loop {
            if start.elapsed() >= deadline {
                return Err(AgentError::Timeout {
                    what: "ping",
                    secs: deadline.as_secs(),
                });
            }
            let Some(f) = self.recv(Duration::from_millis(50))? else {
                continue;
            };
            match (f.id, &f.message) {
                (0, Message::Pong { nonce: n }) if *n == nonce => return Ok(start.elapsed()),
                (0, Message::Pong { .. }) => {}
                (id, Message::Error { .. }) if self.finished.contains(&id) => {}
                _ => return Err(self.unexpected(&f, "while waiting for Pong")),
            }
        }
    }

    /// Ends the session politely (`Shutdown`); errors are ignored.
    pub fn shutdown(&mut self) {
        if !self.broken {
            let _ = self.send(&Message::Shutdown, 0);
        }
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        self.broken = true;
    }

    fn ready(&self) -> Result<(), AgentError> {
        if self.broken {
            return Err(AgentError::Closed);
        }
        if self.peer.is_none() {
            return Err(AgentError::Request("no hello yet".into()));
        }
        Ok(())
    }

    /// The container's peak memory during the last exec, in bytes, when
    /// the guest told it (an untrusted figure, bounded by the protocol).
    pub fn last_peak_memory(&self) -> Option<u64> {
        self.last_peak
    }

    fn fresh_id(&mut self) -> u32 {
        let id = self.next_id;
        self.next_id = self.next_id.checked_add(1).unwrap_or(1);
        id
    }

    /// Runs `cmd` in the guest, streaming its output to `sink`, and returns
    /// how it ended. `cmd.cwd` and `cmd.env` are the container's view.
    pub fn exec(
        &mut self,
        cmd: &CommandSpec,
        sink: &mut dyn OutputSink,
        opts: ExecOptions,
    ) -> Result<ExitStatus, AgentError> {
        self.exec_watched(cmd, sink, opts, &mut || None)
    }

    /// [`AgentSession::exec`], asking `watch` between frames (every 50 ms
    /// at most) whether the run must stop now: a reason ends the exec with
    /// [`AgentError::Stopped`] at once, without waiting for the guest (the
    /// caller then kills the VM).
    pub fn exec_watched(
        &mut self,
        cmd: &CommandSpec,
        sink: &mut dyn OutputSink,
        opts: ExecOptions,
        watch: &mut dyn FnMut() -> Option<String>,
    ) -> Result<ExitStatus, AgentError> {
        self.ready()?;
        let id = self.fresh_id();
        self.last_peak = None;
        let req = build_exec(cmd, &opts)?;
        self.send(&Message::Exec(req), id)?;
        let stdin = opts
            .stdin
            .map(|src| StdinPump::start(src, self.writer.clone(), id));
        let ends = Ends {
            timeout: cmd.timeout,
            interrupt: opts.interrupt,
            kill_grace: opts.kill_grace,
            silence_limit: opts.silence_limit,
            watch,
        };
        let result = self.exec_loop(id, sink, ends, stdin.as_ref());
        if let Some(p) = stdin {
            p.stop();
        }
        self.finished.push(id);
        if self.finished.len() > 64 {
            self.finished.remove(0);
        }
        result
    }

    fn exec_loop(
        &mut self,
        id: u32,
        sink: &mut dyn OutputSink,
        ends: Ends<'_>,
        stdin: Option<&StdinPump>,
    ) -> Result<ExitStatus, AgentError> {
        let Ends {
            timeout,
            interrupt,
            kill_grace,
            silence_limit,
            watch,
        } = ends;
        let start = Instant::now();
        let mut beat = Heartbeat::new(silence_limit, start);
        let host_deadline = timeout.map(|t| t + TIMEOUT_GRACE);
        let mut started = false;
        // Why hull sent Kill, and when the guest must have answered by.
        let mut killed: Option<(KillWhy, Instant)> = None;
        let mut sink_error: Option<io::Error> = None;
        loop {
            if let Some(reason) = watch() {
                self.broken = true;
                return Err(AgentError::Stopped(reason));
            }
            if killed.is_none() {
                let why = if let Some(sig) = interrupt
                    .as_ref()
                    .map(|i| i.load(Ordering::SeqCst))
                    .filter(|s| *s != 0)
                {
                    Some(KillWhy::Interrupted(sig))
                } else if host_deadline.is_some_and(|d| start.elapsed() >= d) {
                    Some(KillWhy::Timeout)
                } else if sink_error.is_some() {
                    Some(KillWhy::Sink)
                } else {
                    None
                };
                if let Some(why) = why {
                    self.send(&Message::Kill, id)?;
                    killed = Some((why, Instant::now() + why.grace(kill_grace)));
                }
            }
            if let Some((why, by)) = &killed {
                if Instant::now() >= *by {
                    self.broken = true;
                    return Err(AgentError::Unresponsive {
                        why: why.describe(),
                        secs: why.grace(kill_grace).as_secs(),
                    });
                }
            }
            match beat.poll(Instant::now()) {
                Beat::Quiet => {}
                Beat::Ping(nonce) => self.send(&Message::Ping { nonce }, 0)?,
                Beat::Silent(d) => {
                    self.broken = true;
                    return Err(AgentError::Silent { secs: d.as_secs() });
                }
            }
            let Some(f) = self.recv(Duration::from_millis(50))? else {
                continue;
            };
            beat.heard(Instant::now());
            if f.id != id {
                match (f.id, &f.message) {
                    (0, Message::Pong { .. }) => continue,
                    (0, Message::Ping { nonce }) => {
                        let n = *nonce;
                        self.send(&Message::Pong { nonce: n }, 0)?;
                        continue;
                    }
                    (0, Message::Error { code, message }) => {
                        self.broken = true;
                        return Err(AgentError::Peer {
                            code: *code,
                            message: crate::proc::guest_text(message),
                        });
                    }
                    (other, Message::Error { .. }) if self.finished.contains(&other) => continue,
                    _ => return Err(self.unexpected(&f, "for another exec id")),
                }
            }
            match f.message {
                Message::Started { .. } if !started => {
                    tracing::debug!("tier vm: the guest started the command");
                    started = true;
                }
                Message::Stdout(b) => {
                    if sink_error.is_none() {
                        if let Err(e) = sink.stdout(&b) {
                            sink_error = Some(e);
                        }
                    }
                }
                Message::Stderr(b) => {
                    if sink_error.is_none() {
                        if let Err(e) = sink.stderr(&b) {
                            sink_error = Some(e);
                        }
                    }
                }
                Message::StdinAck { bytes } => match stdin {
                    Some(p) => p.ack(bytes).map_err(|m| {
                        self.broken = true;
                        AgentError::Protocol(m)
                    })?,
                    None => {
                        let f = Frame {
                            id,
                            message: Message::StdinAck { bytes },
                        };
                        return Err(self.unexpected(&f, "without stdin"));
                    }
                },
                Message::Usage { peak_memory_bytes } => {
                    self.last_peak = Some(peak_memory_bytes);
                }
                Message::Exit(st) => {
                    tracing::debug!(
                        "tier vm: the guest's longest silence in this exec: {:.3} s",
                        beat.longest_silence().as_secs_f64()
                    );
                    if let Some(e) = sink_error {
                        return Err(AgentError::Sink(e));
                    }
                    sink.finish().map_err(AgentError::Sink)?;
                    return Ok(match (killed.map(|k| k.0), st) {
                        (Some(KillWhy::Interrupted(sig)), _) => ExitStatus::Interrupted(sig),
                        (Some(KillWhy::Timeout), _) => ExitStatus::TimedOut,
                        (_, hull_protocol::ExitStatus::TimedOut) => ExitStatus::TimedOut,
                        (_, hull_protocol::ExitStatus::Code(c)) => ExitStatus::Code(c),
                        (_, hull_protocol::ExitStatus::Signal(s)) => ExitStatus::Signal(s),
                    });
                }
                // Not there, or not executable: the shell's 127 and 126.
                Message::Error {
                    code: code @ (ErrorCode::CommandNotFound | ErrorCode::CommandNotExecutable),
                    message,
                } => {
                    return Err(AgentError::NotRunnable {
                        exit: if code == ErrorCode::CommandNotFound {
                            127
                        } else {
                            126
                        },
                        message: crate::proc::guest_text(&message),
                    });
                }
                Message::Error {
                    code: ErrorCode::UnknownUser,
                    message,
                } => {
                    return Err(AgentError::UnknownUser {
                        message: crate::proc::guest_text(&message),
                    });
                }
                Message::Error { code, message } => {
                    return Err(AgentError::ExecFailed {
                        code,
                        message: crate::proc::guest_text(&message),
                    });
                }
                other => {
                    let f = Frame { id, message: other };
                    let when = if started {
                        "while a command runs"
                    } else {
                        "before the command started"
                    };
                    return Err(self.unexpected(&f, when));
                }
            }
        }
    }
}

impl AgentSession {
    /// Hands the connection over at frame level (after hello and configure).
    pub fn into_raw(mut self) -> io::Result<RawSession> {
        let (_tx, empty) = mpsc::sync_channel(0);
        let rx = std::mem::replace(&mut self.rx, empty);
        self.detached = true;
        Ok(RawSession {
            stream: self.stream.try_clone()?,
            writer: self.writer.clone(),
            rx,
        })
    }
}

impl Drop for AgentSession {
    fn drop(&mut self) {
        if !self.detached {
            let _ = self.stream.shutdown(std::net::Shutdown::Both);
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum KillWhy {
    Interrupted(i32),
    Timeout,
    Sink,
}

impl KillWhy {
    /// How long the guest gets to answer this `Kill`.
    fn grace(self, kill_grace: Duration) -> Duration {
        match self {
            KillWhy::Interrupted(_) => kill_grace.min(INTERRUPT_GRACE),
            KillWhy::Timeout | KillWhy::Sink => kill_grace,
        }
    }

    fn describe(self) -> &'static str {
        match self {
            KillWhy::Interrupted(_) => "hull was interrupted",
            KillWhy::Timeout => "the wall-time limit",
            KillWhy::Sink => "the output could not be written",
        }
    }
}

/// The protocol `Exec` for a command.
pub fn build_exec(cmd: &CommandSpec, opts: &ExecOptions) -> Result<Exec, AgentError> {
    use std::os::unix::ffi::OsStrExt;
    let timeout_ms = cmd
        .timeout
        .map(|t| (t.as_millis().min(u128::from(MAX_TIMEOUT_MS)) as u64).max(1));
    // A user named by the caller in place of the plan's ids.
    let ids = cmd.user.is_none().then_some(opts.uid_gid).flatten();
    let e = Exec {
        argv: cmd
            .argv
            .iter()
            .map(|a| Bytes::from(a.as_os_str()))
            .collect(),
        env: cmd.env.clone(),
        cwd: Bytes::from(cmd.cwd.as_os_str().as_bytes()),
        timeout_ms,
        stdin: opts.stdin.is_some(),
        uid: ids.map(|u| u.0),
        gid: ids.map(|u| u.1),
        scrub: opts
            .scrub
            .iter()
            .map(|d| Bytes::from(d.as_os_str().as_bytes()))
            .collect(),
        keep_leftovers: opts.keep_leftovers,
        user: cmd.user.clone(),
    };
    Message::Exec(e.clone())
        .validate()
        .map_err(AgentError::Request)?;
    Ok(e)
}

/// Copies stdin to the guest in `Stdin` frames, never more than the
/// flow-control window ahead of the agent's acknowledgements.
///
/// Lock order: the writer, then the pump state (never the reverse), and the
/// state is never held while writing, so a guest that is slow to read stdin
/// cannot stall the output path (acknowledgements only take the state).
struct StdinPump {
    state: Arc<(Mutex<PumpState>, Condvar)>,
    writer: Writer,
}

#[derive(Debug, Default)]
struct PumpState {
    sent: u64,
    acked: u64,
    stop: bool,
}

impl StdinPump {
    fn start(mut src: Box<dyn Read + Send>, writer: Writer, id: u32) -> StdinPump {
        let state = Arc::new((Mutex::new(PumpState::default()), Condvar::new()));
        let st = state.clone();
        let w = writer.clone();
        let _ = std::thread::Builder::new()
            .name("hull-agent-stdin".into())
            .spawn(move || {
                let mut buf = vec![0u8; STDIN_CHUNK];
                loop {
                    let n = match src.read(&mut buf) {
                        Ok(n) => n,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(_) => 0,
                    };
                    {
                        let (lock, cv) = &*st;
                        let Ok(mut s) = lock.lock() else { return };
                        while !s.stop && n > 0 && s.sent - s.acked + n as u64 > STDIN_WINDOW {
                            s = match cv.wait(s) {
                                Ok(s) => s,
                                Err(_) => return,
                            };
                        }
                        if s.stop {
                            return;
                        }
                        // Counted before sending: the ack may arrive first.
                        s.sent += n as u64;
                    }
                    let msg = if n == 0 {
                        Message::StdinEof
                    } else {
                        Message::Stdin(buf[..n].to_vec())
                    };
                    let Ok(mut wr) = w.lock() else { return };
                    // Checked under the writer lock: after `stop` returns no
                    // frame of this exec is sent any more.
                    if st.0.lock().map(|s| s.stop).unwrap_or(true) {
                        return;
                    }
                    if wr.send(&msg, id).is_err() || n == 0 {
                        return;
                    }
                }
            });
        StdinPump { state, writer }
    }

    fn ack(&self, bytes: u64) -> Result<(), String> {
        let (lock, cv) = &*self.state;
        let mut s = lock
            .lock()
            .map_err(|_| "stdin state poisoned".to_string())?;
        let outstanding = s.sent - s.acked;
        if bytes > outstanding {
            return Err(format!(
                "StdinAck of {bytes} bytes, but only {outstanding} are unacknowledged"
            ));
        }
        s.acked += bytes;
        cv.notify_all();
        Ok(())
    }

    fn stop(&self) {
        let (lock, cv) = &*self.state;
        if let Ok(mut s) = lock.lock() {
            s.stop = true;
        }
        cv.notify_all();
        // Barrier: waits for a send in flight to finish.
        drop(self.writer.lock());
    }
}

#[cfg(test)]
mod tests {
    //! The session against a scripted peer speaking the real protocol over a
    //! real socket pair (the real agent is exercised by the VM tests).
    use super::*;
    use hull_protocol::client::hello_message;
    use hull_protocol::Connection;

    #[derive(Default)]
    struct Collect {
        out: Vec<u8>,
        err: Vec<u8>,
        finished: bool,
    }

    impl OutputSink for Collect {
        fn stdout(&mut self, d: &[u8]) -> io::Result<()> {
            self.out.extend_from_slice(d);
            Ok(())
        }
        fn stderr(&mut self, d: &[u8]) -> io::Result<()> {
            self.err.extend_from_slice(d);
            Ok(())
        }
        fn finish(&mut self) -> io::Result<()> {
            self.finished = true;
            Ok(())
        }
    }

    fn pair(
        guest: impl FnOnce(Connection<UnixStream>) + Send + 'static,
    ) -> (AgentSession, std::thread::JoinHandle<()>) {
        let (h, g) = UnixStream::pair().unwrap();
        let t = std::thread::spawn(move || {
            let mut c = Connection::new(g);
            c.hello(Role::OuterAgent, "fake-agent").unwrap();
            guest(c);
        });
        let mut s = AgentSession::new(h).unwrap();
        s.hello(Duration::from_secs(5), &mut || true).unwrap();
        (s, t)
    }

    fn cmd() -> CommandSpec {
        CommandSpec {
            argv: vec!["sh".into(), "-c".into(), "cat".into()],
            cwd: "/work/proj".into(),
            env: vec![("PATH".into(), "/usr/bin:/bin".into())],
            timeout: None,
            user: None,
        }
    }

    #[test]
    fn exec_streams_output_passes_stdin_and_returns_the_code() {
        let (mut s, t) = pair(|mut c| {
            let (id, m) = c.recv().unwrap();
            let Message::Exec(e) = m else { panic!("{m:?}") };
            assert!(e.stdin);
            assert_eq!(e.uid, Some(1000));
            assert_eq!(e.cwd.as_slice(), b"/work/proj");
            c.send(&Message::Started { pid: 7 }, id).unwrap();
            let mut got = Vec::new();
            loop {
                match c.recv().unwrap() {
                    (i, Message::Stdin(b)) if i == id => {
                        c.send(
                            &Message::StdinAck {
                                bytes: b.len() as u64,
                            },
                            id,
                        )
                        .unwrap();
                        got.extend(b);
                    }
                    (i, Message::StdinEof) if i == id => break,
                    other => panic!("{other:?}"),
                }
            }
            c.send(&Message::Stdout(got), id).unwrap();
            c.send(&Message::Stderr(b"warn".to_vec()), id).unwrap();
            c.send(&Message::Exit(hull_protocol::ExitStatus::Code(3)), id)
                .unwrap();
        });
        let mut sink = Collect::default();
        let input = vec![b'x'; 200_000];
        let st = s
            .exec(
                &cmd(),
                &mut sink,
                ExecOptions {
                    stdin: Some(Box::new(io::Cursor::new(input.clone()))),
                    uid_gid: Some((1000, 1000)),
                    ..ExecOptions::default()
                },
            )
            .unwrap();
        t.join().unwrap();
        assert_eq!(st, ExitStatus::Code(3));
        assert_eq!(sink.out, input);
        assert_eq!(sink.err, b"warn");
        assert!(sink.finished);
    }

    /// The guest's "not there" and "not executable" are the shell's 127
    /// and 126.
    #[test]
    fn a_program_the_guest_cannot_find_or_run_is_127_or_126() {
        for (code, exit) in [
            (ErrorCode::CommandNotFound, 127),
            (ErrorCode::CommandNotExecutable, 126),
        ] {
            let (mut s, t) = pair(move |mut c| {
                let (id, _) = c.recv().unwrap();
                c.send(&Message::error(code, "cannot run \"x\""), id)
                    .unwrap();
            });
            let mut sink = Collect::default();
            let e = s
                .exec(&cmd(), &mut sink, ExecOptions::default())
                .unwrap_err();
            t.join().unwrap();
            assert!(
                matches!(&e, AgentError::NotRunnable { exit: x, .. } if *x == exit),
                "{e:?}"
            );
        }
    }

    /// What a hostile guest puts in an error reaches the user escaped and
    /// bounded: no terminal escape, no megabyte of text.
    #[test]
    fn a_guest_error_message_is_escaped_and_bounded() {
        let (mut s, t) = pair(|mut c| {
            let (id, _) = c.recv().unwrap();
            let evil = format!("\x1b]0;pwned\x07\x1b[2J{}", "A".repeat(500_000));
            c.send(&Message::error(ErrorCode::ExecFailed, evil), id)
                .unwrap();
        });
        let mut sink = Collect::default();
        let e = s
            .exec(&cmd(), &mut sink, ExecOptions::default())
            .unwrap_err()
            .to_string();
        t.join().unwrap();
        assert!(!e.chars().any(|c| c.is_control() && c != '\n'), "{e:?}");
        assert!(e.contains("\\x1b]0;pwned\\x07"), "{e:.200}");
        assert!(e.len() < 4096, "{} bytes", e.len());
    }

    #[test]
    fn unexpected_frames_close_the_session_instead_of_being_guessed_at() {
        let (mut s, t) = pair(|mut c| {
            let (id, _) = c.recv().unwrap();
            // A Configured in the middle of an exec: nonsense.
            c.send(
                &Message::Configured(Configured {
                    container: "x".into(),
                    inner_software: "y".into(),
                }),
                0,
            )
            .unwrap();
            let _ = id;
        });
        let mut sink = Collect::default();
        let e = s
            .exec(&cmd(), &mut sink, ExecOptions::default())
            .unwrap_err();
        assert!(
            matches!(
                e,
                AgentError::Unexpected {
                    kind: "configured",
                    ..
                }
            ),
            "{e}"
        );
        assert!(matches!(
            s.exec(&cmd(), &mut sink, ExecOptions::default()),
            Err(AgentError::Closed)
        ));
        t.join().unwrap();
    }

    #[test]
    fn garbage_bytes_are_a_connection_error() {
        let (h, mut g) = UnixStream::pair().unwrap();
        let t = std::thread::spawn(move || {
            use std::io::Write;
            // A header announcing a 4 GiB payload.
            let mut hdr = b"HULL".to_vec();
            hdr.extend_from_slice(&1u16.to_le_bytes());
            hdr.extend_from_slice(&0u16.to_le_bytes());
            hdr.extend_from_slice(&0u32.to_le_bytes());
            hdr.extend_from_slice(&u32::MAX.to_le_bytes());
            g.write_all(&hdr).unwrap();
            let mut sink = Vec::new();
            let _ = g.read_to_end(&mut sink);
        });
        let mut s = AgentSession::new(h).unwrap();
        let e = s.hello(Duration::from_secs(5), &mut || true).unwrap_err();
        assert!(
            matches!(e, AgentError::Connection(ConnError::Decode(_))),
            "{e}"
        );
        drop(s);
        t.join().unwrap();
    }

    #[test]
    fn a_host_role_peer_or_silence_is_refused() {
        let (h, g) = UnixStream::pair().unwrap();
        let t = std::thread::spawn(move || {
            let mut c = Connection::new(g);
            c.send(&hello_message(Role::Host, "imposter"), 0).unwrap();
            let _ = c.recv();
        });
        let mut s = AgentSession::new(h).unwrap();
        let e = s.hello(Duration::from_secs(5), &mut || true).unwrap_err();
        assert!(matches!(e, AgentError::WrongRole(Role::Host)), "{e}");
        drop(s);
        t.join().unwrap();

        let (h, _g) = UnixStream::pair().unwrap();
        let mut s = AgentSession::new(h).unwrap();
        let e = s
            .hello(Duration::from_millis(300), &mut || true)
            .unwrap_err();
        assert!(matches!(e, AgentError::HelloTimeout { .. }), "{e}");
        let (h, _g) = UnixStream::pair().unwrap();
        let mut dead = AgentSession::new(h).unwrap();
        let e = dead
            .hello(Duration::from_secs(5), &mut || false)
            .unwrap_err();
        assert!(matches!(e, AgentError::VmGone), "{e}");
    }

    #[test]
    fn interrupt_sends_kill_and_a_silent_guest_is_unresponsive() {
        let (mut s, t) = pair(|mut c| {
            let (id, _) = c.recv().unwrap();
            c.send(&Message::Started { pid: 9 }, id).unwrap();
            let (kid, m) = c.recv().unwrap();
            assert_eq!((kid, m), (id, Message::Kill));
            c.send(&Message::Exit(hull_protocol::ExitStatus::Signal(9)), id)
                .unwrap();
            // The second exec: Kill is ignored.
            let (id2, _) = c.recv().unwrap();
            let (_, m) = c.recv().unwrap();
            assert_eq!(m, Message::Kill);
            let _ = id2;
            std::thread::sleep(Duration::from_secs(2));
        });
        let mut sink = Collect::default();
        let irq = Arc::new(AtomicI32::new(2));
        let st = s
            .exec(
                &cmd(),
                &mut sink,
                ExecOptions {
                    interrupt: Some(irq.clone()),
                    ..ExecOptions::default()
                },
            )
            .unwrap();
        assert_eq!(st, ExitStatus::Interrupted(2));
        // An interrupt gives the guest INTERRUPT_GRACE, not the 10 s
        // KILL_GRACE a timeout gives it.
        let t0 = Instant::now();
        let e = s
            .exec(
                &cmd(),
                &mut sink,
                ExecOptions {
                    interrupt: Some(irq),
                    ..ExecOptions::default()
                },
            )
            .unwrap_err();
        assert!(matches!(e, AgentError::Unresponsive { secs: 1, .. }), "{e}");
        assert!(
            t0.elapsed() < Duration::from_millis(1800),
            "{:?}",
            t0.elapsed()
        );
        t.join().unwrap();
    }

    #[test]
    fn a_guest_that_answers_pings_lives_and_one_that_answers_nothing_is_silent() {
        let limit = Duration::from_millis(1500);
        let (mut s, t) = pair(|mut c| {
            // First exec: quiet for 2 s, but every Ping answered.
            let (id, _) = c.recv().unwrap();
            c.send(&Message::Started { pid: 9 }, id).unwrap();
            for _ in 0..2 {
                let (pid, m) = c.recv().unwrap();
                let Message::Ping { nonce } = m else {
                    panic!("{m:?}")
                };
                assert_eq!(pid, 0);
                c.send(&Message::Pong { nonce }, 0).unwrap();
            }
            c.send(&Message::Exit(hull_protocol::ExitStatus::Code(0)), id)
                .unwrap();
            // Second exec: no answer at all.
            let (id2, _) = c.recv().unwrap();
            c.send(&Message::Started { pid: 10 }, id2).unwrap();
            while c.recv().is_ok() {}
        });
        let mut sink = Collect::default();
        let opts = || ExecOptions {
            silence_limit: limit,
            ..ExecOptions::default()
        };
        let t0 = Instant::now();
        let st = s.exec(&cmd(), &mut sink, opts()).unwrap();
        assert_eq!(st, ExitStatus::Code(0));
        assert!(t0.elapsed() > limit, "{:?}", t0.elapsed());
        let t1 = Instant::now();
        let e = s.exec(&cmd(), &mut sink, opts()).unwrap_err();
        assert!(matches!(e, AgentError::Silent { secs: 1 }), "{e}");
        let took = t1.elapsed();
        assert!(took >= limit && took < limit * 2, "{took:?}");
        drop(s);
        t.join().unwrap();
    }

    #[test]
    fn an_ack_for_bytes_never_sent_is_a_protocol_error() {
        let (mut s, t) = pair(|mut c| {
            let (id, _) = c.recv().unwrap();
            c.send(&Message::StdinAck { bytes: 4096 }, id).unwrap();
            let _ = c.recv();
        });
        let mut sink = Collect::default();
        let e = s
            .exec(
                &cmd(),
                &mut sink,
                ExecOptions {
                    stdin: Some(Box::new(io::empty())),
                    ..ExecOptions::default()
                },
            )
            .unwrap_err();
        assert!(matches!(e, AgentError::Protocol(_)), "{e}");
        drop(s);
        t.join().unwrap();
    }
}
