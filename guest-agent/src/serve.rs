//! The exec server: one session per connection, many concurrent execs per
//! session keyed by frame id.
//!
//! Every frame from the host is validated by the decoder (bounds, kinds, id
//! rules) and then checked against the session: the first frame must be a
//! `Hello` with a common version, only host-to-agent kinds are accepted, an
//! exec id may not be reused while it runs, the number of concurrent execs is
//! capped, stdin respects the flow-control window, and the session policy
//! (`run_as`) decides the uid and gid. A malformed stream gets one `Error`
//! frame with a stable code and the session ends; nothing panics on input.
//! When the session ends for any reason every exec's tree is killed.
//!
//! Does not authenticate the host (the transport decides who can connect).

use std::collections::{HashMap, VecDeque};
use std::error::Error as StdError;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};

use hull_protocol::client::{check_peer_hello, hello_message};
use hull_protocol::limits::STDIN_WINDOW;
use hull_protocol::{
    ConfigureSpec, Configured, ConnError, ErrorCode, Exec, Frame, FrameReader, Message, Role,
};

use crate::exec::{self, Event, ExecHandle, StdinCmd};
use crate::outbox::Outbox;
use crate::spawn::SpawnError;
use crate::transport::{self, Port, Transport, TransportError};

/// Where an exec's `user` is looked up.
const PASSWD: &str = "/etc/passwd";
/// Default cap on concurrent execs per session.
pub const DEFAULT_MAX_EXECS: usize = 64;
/// Most `Signal` frames one exec may receive; more is a protocol violation
/// (keeps a flooding host from queueing without bound).
const MAX_SIGNALS_PER_EXEC: usize = 256;

/// Handles `Configure` (the outer agent provides one).
pub trait Configurator: Send + Sync {
    fn configure(
        &self,
        spec: &ConfigureSpec,
    ) -> Result<Configured, Box<dyn StdError + Send + Sync>>;
}

/// What a session may do.
#[derive(Clone)]
pub struct ServeOptions {
    pub role: Role,
    pub max_execs: usize,
    /// When set, every exec runs as this (uid, gid); a request for other ids
    /// is refused with `PolicyDenied`.
    pub run_as: Option<(u32, u32)>,
    /// Every exec names the user, or the uid and gid, it runs as; one that
    /// names neither is refused (the inner agent: container root never
    /// runs a command as itself unasked).
    pub ids_required: bool,
    /// Every exec in a cgroup of its own below the agent's, ended by
    /// `cgroup.kill` ([`crate::cgroup`]): the inner agent, in the container.
    pub exec_cgroups: bool,
    /// Every exec's environment starts from this one, its own entries set
    /// on top: a session's leader inside a native sandbox (`hull run
    /// --session-leader`), whose environment is what the policy gives a
    /// command. `None`: an exec's environment is its own, whole.
    pub base_env: Option<Vec<(String, String)>>,
    /// The time limit of an exec that names none.
    pub default_timeout_ms: Option<u64>,
    /// What an exec left running when its command exited by itself runs
    /// on until the session ends ([`exec::Mode::keep_leftovers`]).
    pub keep_leftovers: bool,
    pub configurator: Option<Arc<dyn Configurator>>,
}

impl std::fmt::Debug for ServeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeOptions")
            .field("role", &self.role)
            .field("max_execs", &self.max_execs)
            .field("run_as", &self.run_as)
            .field("ids_required", &self.ids_required)
            .field("exec_cgroups", &self.exec_cgroups)
            .field("base_env", &self.base_env.as_ref().map(Vec::len))
            .field("default_timeout_ms", &self.default_timeout_ms)
            .field("keep_leftovers", &self.keep_leftovers)
            .field("configurator", &self.configurator.is_some())
            .finish()
    }
}

impl ServeOptions {
    pub fn new(role: Role) -> ServeOptions {
        ServeOptions {
            role,
            max_execs: DEFAULT_MAX_EXECS,
            run_as: None,
            ids_required: false,
            exec_cgroups: false,
            base_env: None,
            default_timeout_ms: None,
            keep_leftovers: false,
            configurator: None,
        }
    }
}

/// How a session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEnd {
    /// The host closed the connection (or it broke).
    Closed,
    /// The host sent `Shutdown`.
    Shutdown,
    /// The host broke the protocol; an `Error` frame was sent.
    ProtocolError(String),
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Transport(#[from] TransportError),
    #[error("cannot make the agent a child subreaper (orphans would escape to init): {0}")]
    Subreaper(#[source] std::io::Error),
    #[error("accept on {path}: {source}")]
    Accept {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot set up the stdio transport: {0}")]
    Stdio(#[source] std::io::Error),
}

/// Make orphans of this process reparent to it (process-wide, idempotent).
pub fn become_subreaper() -> Result<(), ServeError> {
    rustix::process::set_child_subreaper(Some(rustix::process::getpid()))
        .map_err(|e| ServeError::Subreaper(e.into()))
}

/// Serve sessions on a unix socket, one connection at a time, until a host
/// sends `Shutdown`.
pub fn serve_unix(path: &std::path::Path, opts: &ServeOptions) -> Result<(), ServeError> {
    become_subreaper()?;
    let listener = transport::listen_unix(path)?;
    tracing::info!("listening on {}", path.display());
    loop {
        let (stream, _) = listener.accept().map_err(|source| ServeError::Accept {
            path: path.display().to_string(),
            source,
        })?;
        let t = match Transport::from_unix(stream, &path.display().to_string()) {
            Ok(t) => t,
            Err(e) => {
                tracing::error!("cannot use accepted connection: {e}");
                continue;
            }
        };
        if serve_session(t, opts)? == SessionEnd::Shutdown {
            return Ok(());
        }
    }
}

/// Serve one session on stdin/stdout.
pub fn serve_stdio(opts: &ServeOptions) -> Result<(), ServeError> {
    become_subreaper()?;
    let t = Transport::stdio().map_err(ServeError::Stdio)?;
    serve_session(t, opts)?;
    Ok(())
}

/// Serve on the virtio-serial port called `name`: one session per host
/// connection, until a host sends `Shutdown`.
pub fn serve_port(name: &str, opts: &ServeOptions) -> Result<(), ServeError> {
    become_subreaper()?;
    let path = transport::find_port(name)?;
    let port = Port::open(&path)?;
    tracing::info!("serving on virtio-serial port {name} ({})", path.display());
    loop {
        port.wait_for_host()?;
        if serve_session(port.session(), opts)? == SessionEnd::Shutdown {
            return Ok(());
        }
    }
}

/// `req` with the session's defaults: its environment on top of
/// `base_env` (an entry of its own wins), and `default_timeout_ms` when it
/// names no limit.
fn complete(req: &Exec, opts: &ServeOptions) -> Exec {
    let mut req = req.clone();
    if let Some(base) = &opts.base_env {
        let own: std::collections::HashSet<&str> =
            req.env.iter().map(|(k, _)| k.as_str()).collect();
        let mut env: Vec<(String, String)> = base
            .iter()
            .filter(|(k, _)| !own.contains(k.as_str()))
            .cloned()
            .collect();
        env.append(&mut req.env);
        req.env = env;
    }
    if req.timeout_ms.is_none() {
        req.timeout_ms = opts.default_timeout_ms;
    }
    req
}

type ExecTable = Arc<Mutex<HashMap<u32, ExecHandle>>>;

/// The (uid, gid) an exec runs as (none: the agent's own), and the user it
/// named, if it named one.
type RunAs = (Option<(u32, u32)>, Option<crate::users::User>);

/// Ids of the execs that ended last: stdin or a kill the host sent before
/// their terminal frame reached it is dropped, not answered with
/// `UnknownId` (which would reach the host before the exec's own end).
type Ended = Arc<Mutex<VecDeque<u32>>>;

/// How many ended ids are remembered.
const ENDED_KEPT: usize = 64;

struct Session<'a> {
    opts: &'a ServeOptions,
    out: Outbox,
    execs: ExecTable,
    ended: Ended,
    threads: Vec<JoinHandle<()>>,
    configuring: Arc<AtomicBool>,
}

enum Step {
    Continue,
    End(SessionEnd),
}

/// Run one session on `t` until it ends; every exec is killed before return.
pub fn serve_session(t: Transport, opts: &ServeOptions) -> Result<SessionEnd, ServeError> {
    become_subreaper()?;
    let Transport {
        reader,
        writer,
        closer,
        name,
    } = t;
    let out = Outbox::new(writer, Arc::from(closer));
    let mut reader = FrameReader::new(reader);
    let mut s = Session {
        opts,
        out: out.clone(),
        execs: Arc::new(Mutex::new(HashMap::new())),
        ended: Arc::new(Mutex::new(VecDeque::new())),
        threads: Vec::new(),
        configuring: Arc::new(AtomicBool::new(false)),
    };
    // Say hello first: on virtio-serial the host may be waiting already.
    let software = format!("hull-agent {}", env!("CARGO_PKG_VERSION"));
    out.send(&hello_message(opts.role, &software), 0);
    let end = match s.handshake(&mut reader) {
        Ok(()) => loop {
            match s.next(&mut reader) {
                Step::Continue => {}
                Step::End(end) => break end,
            }
        },
        Err(end) => end,
    };
    tracing::info!(transport = %name, "session ended: {end:?}");
    s.teardown();
    Ok(end)
}

impl Session<'_> {
    fn fatal(&self, code: ErrorCode, msg: String) -> SessionEnd {
        self.out.send(&Message::error(code, msg.clone()), 0);
        SessionEnd::ProtocolError(msg)
    }

    fn recv<R: std::io::Read>(&self, reader: &mut FrameReader<R>) -> Result<Frame, SessionEnd> {
        match reader.recv() {
            Ok(f) => Ok(f),
            Err(ConnError::Decode(e)) => Err(self.fatal(e.code(), e.to_string())),
            Err(ConnError::Truncated { buffered }) => Err(SessionEnd::ProtocolError(format!(
                "connection closed in the middle of a frame ({buffered} bytes)"
            ))),
            Err(e) => {
                tracing::debug!("connection ended: {e}");
                Err(SessionEnd::Closed)
            }
        }
    }

    fn handshake<R: std::io::Read>(
        &mut self,
        reader: &mut FrameReader<R>,
    ) -> Result<(), SessionEnd> {
        let frame = self.recv(reader)?;
        match check_peer_hello(frame) {
            Ok((hello, version)) => {
                if hello.role != Role::Host
                    && !(self.opts.role == Role::InnerAgent && hello.role == Role::OuterAgent)
                {
                    return Err(self.fatal(
                        ErrorCode::BadRequest,
                        format!(
                            "a {:?} peer may not drive a {:?} agent",
                            hello.role, self.opts.role
                        ),
                    ));
                }
                tracing::info!(version, peer = %hello.software, "handshake done");
                Ok(())
            }
            Err(ConnError::Version(e)) => {
                Err(self.fatal(ErrorCode::VersionMismatch, e.to_string()))
            }
            Err(ConnError::Peer { code, message }) => {
                tracing::warn!("host reported {code} before hello: {message}");
                Err(SessionEnd::Closed)
            }
            Err(e) => Err(self.fatal(ErrorCode::BadRequest, e.to_string())),
        }
    }

    fn next<R: std::io::Read>(&mut self, reader: &mut FrameReader<R>) -> Step {
        let frame = match self.recv(reader) {
            Ok(f) => f,
            Err(end) => return Step::End(end),
        };
        let id = frame.id;
        match frame.message {
            Message::Exec(req) => self.start_exec(id, &req),
            Message::Stdin(data) => self.stdin(id, Some(data)),
            Message::StdinEof => self.stdin(id, None),
            Message::Signal { signo } => self.signal(id, signo),
            Message::Kill => {
                self.with_exec(id, |h| {
                    if !h.kill_sent {
                        h.kill_sent = true;
                        let _ = h.events.send(Event::Kill);
                    }
                });
                Step::Continue
            }
            Message::Ping { nonce } => {
                self.out.send(&Message::Pong { nonce }, 0);
                Step::Continue
            }
            Message::Shutdown => Step::End(SessionEnd::Shutdown),
            Message::Configure(spec) => self.configure(spec),
            Message::Error { code, message } => {
                tracing::warn!(id, "host reported {code}: {message}");
                if id == 0 {
                    return Step::End(SessionEnd::Closed);
                }
                // Never answer an error with an error (no ping-pong).
                let execs = self.execs.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(h) = execs.get(&id) {
                    let _ = h.events.send(Event::Kill);
                }
                Step::Continue
            }
            Message::Hello(_) => {
                Step::End(self.fatal(ErrorCode::BadRequest, "a second hello".into()))
            }
            m @ (Message::Started { .. }
            | Message::StdinAck { .. }
            | Message::Stdout(_)
            | Message::Stderr(_)
            | Message::Usage { .. }
            | Message::Exit(_)
            | Message::Configured(_)
            | Message::Pong { .. }) => Step::End(self.fatal(
                ErrorCode::BadRequest,
                format!("{} frames are only sent by the agent", m.kind().name()),
            )),
        }
    }

    /// Run `f` on the exec `id`, or answer `UnknownId`.
    fn with_exec(&self, id: u32, f: impl FnOnce(&mut ExecHandle)) {
        let mut execs = self.execs.lock().unwrap_or_else(|p| p.into_inner());
        match execs.get_mut(&id) {
            Some(h) => f(h),
            // Ended before this frame came: its terminal frame is sent.
            None if self
                .ended
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(&id) =>
            {
                tracing::debug!(id, "a frame for an exec that just ended, dropped");
            }
            None => {
                drop(execs);
                self.out.send(
                    &Message::error(
                        ErrorCode::UnknownId,
                        format!("no exec with id {id} is running"),
                    ),
                    id,
                );
            }
        }
    }

    /// The ids `req` runs as, and the user it named: what the session's
    /// policy forces, else what `req` asks (a user looked up in the agent's
    /// `/etc/passwd`); none asked where ids are required is refused.
    fn run_as(&self, req: &Exec) -> Result<RunAs, (ErrorCode, String)> {
        if let Some(forced) = self.opts.run_as {
            return match (req.uid.zip(req.gid), &req.user) {
                (Some(asked), _) if asked != forced => Err((
                    ErrorCode::PolicyDenied,
                    format!(
                        "this session runs commands as {}:{}, not {}:{}",
                        forced.0, forced.1, asked.0, asked.1
                    ),
                )),
                (_, Some(name)) => Err((
                    ErrorCode::PolicyDenied,
                    format!(
                        "this session runs commands as {}:{}, not as user {name}",
                        forced.0, forced.1
                    ),
                )),
                _ => Ok((Some(forced), None)),
            };
        }
        if let Some(name) = &req.user {
            let u = crate::users::lookup(std::path::Path::new(PASSWD), name).map_err(|e| {
                let code = match e {
                    crate::users::UserError::Unknown { .. } => ErrorCode::UnknownUser,
                    crate::users::UserError::Unreadable { .. } => ErrorCode::ExecFailed,
                };
                (code, format!("the command did not start: {e}"))
            })?;
            return Ok((Some((u.uid, u.gid)), Some(u)));
        }
        match req.uid.zip(req.gid) {
            None if self.opts.ids_required => Err((
                ErrorCode::PolicyDenied,
                "this agent runs no command without the user, or the uid and gid, to run it as"
                    .into(),
            )),
            asked => Ok((asked, None)),
        }
    }

    fn start_exec(&mut self, id: u32, req: &Exec) -> Step {
        self.threads.retain(|t| !t.is_finished());
        let completed;
        let req = if self.opts.base_env.is_some() || self.opts.default_timeout_ms.is_some() {
            completed = complete(req, self.opts);
            &completed
        } else {
            req
        };
        let (ids, user) = match self.run_as(req) {
            Ok(r) => r,
            Err((code, message)) => {
                self.out.send(&Message::error(code, message), id);
                return Step::Continue;
            }
        };
        let named;
        let req = match user {
            Some(u) => {
                // The user's own HOME, USER and LOGNAME over the exec's.
                let mut r = req.clone();
                let own = u.env();
                r.env.retain(|(k, _)| own.iter().all(|(o, _)| o != k));
                r.env.extend(own);
                named = r;
                &named
            }
            None => req,
        };
        if !req.scrub.is_empty() {
            // Before anything of the command runs, as its user (`validate`
            // made sure the ids are given; without them nothing runs).
            let dirs: Vec<std::path::PathBuf> = req
                .scrub
                .iter()
                .map(|d| {
                    use std::os::unix::ffi::OsStrExt;
                    std::path::PathBuf::from(std::ffi::OsStr::from_bytes(d.as_slice()))
                })
                .collect();
            let scrubbed = match ids {
                Some(ids) => crate::scrub::scrub_as(ids, &dirs).map_err(|e| e.to_string()),
                None => Err("a scrub needs the ids it runs as".into()),
            };
            if let Err(e) = scrubbed {
                self.out.send(
                    &Message::error(
                        ErrorCode::ScrubFailed,
                        format!("the command did not start: {e}"),
                    ),
                    id,
                );
                return Step::Continue;
            }
        }
        let mut execs = self.execs.lock().unwrap_or_else(|p| p.into_inner());
        if execs.contains_key(&id) {
            drop(execs);
            return Step::End(self.fatal(
                ErrorCode::BadRequest,
                format!("exec id {id} is already running"),
            ));
        }
        if execs.len() >= self.opts.max_execs {
            let n = execs.len();
            drop(execs);
            self.out.send(
                &Message::error(
                    ErrorCode::Busy,
                    format!(
                        "{n} execs are running, the limit is {}",
                        self.opts.max_execs
                    ),
                ),
                id,
            );
            return Step::Continue;
        }
        let table = self.execs.clone();
        let ended = self.ended.clone();
        ended
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|e| *e != id);
        let unregister = Box::new(move || {
            // Ended first, then out of the table: a frame that misses the
            // table finds it ended.
            let mut e = ended.lock().unwrap_or_else(|p| p.into_inner());
            if e.len() == ENDED_KEPT {
                e.pop_front();
            }
            e.push_back(id);
            drop(e);
            table.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
        });
        // The table stays locked until the exec is in it, so its
        // supervisor cannot unregister before it was registered.
        match exec::start(
            id,
            req,
            ids,
            exec::Mode {
                cgroups: self.opts.exec_cgroups,
                keep_leftovers: self.opts.keep_leftovers || req.keep_leftovers,
            },
            self.out.clone(),
            unregister,
        ) {
            Ok((handle, thread)) => {
                execs.insert(id, handle);
                self.threads.push(thread);
            }
            Err(e) => {
                drop(execs);
                let code = match e {
                    SpawnError::NotFound { .. } => ErrorCode::CommandNotFound,
                    _ => ErrorCode::ExecFailed,
                };
                self.out.send(&Message::error(code, e.to_string()), id);
            }
        }
        Step::Continue
    }

    fn stdin(&mut self, id: u32, data: Option<Vec<u8>>) -> Step {
        self.with_exec(id, |h| {
            let Some(stdin) = h.stdin.as_mut() else {
                let _ = h.events.send(Event::Abort(
                    ErrorCode::BadRequest,
                    "stdin frame for an exec started without stdin".into(),
                ));
                return;
            };
            if stdin.eof {
                let _ = h.events.send(Event::Abort(
                    ErrorCode::BadRequest,
                    "stdin frame after stdin_eof".into(),
                ));
                return;
            }
            match data {
                None => {
                    stdin.eof = true;
                    let _ = stdin.tx.send(StdinCmd::Eof);
                }
                Some(data) => {
                    let n = data.len() as u64;
                    let before = stdin.in_flight.fetch_add(n, Ordering::SeqCst);
                    if before + n > STDIN_WINDOW {
                        stdin.eof = true;
                        let _ = h.events.send(Event::Abort(
                            ErrorCode::FlowControl,
                            format!(
                                "{} stdin bytes unacknowledged, the window is {STDIN_WINDOW}",
                                before + n
                            ),
                        ));
                        return;
                    }
                    let _ = stdin.tx.send(StdinCmd::Data(data));
                }
            }
        });
        Step::Continue
    }

    fn signal(&mut self, id: u32, signo: i32) -> Step {
        let mut flooded = false;
        self.with_exec(id, |h| {
            h.signals += 1;
            if h.signals > MAX_SIGNALS_PER_EXEC {
                flooded = true;
            } else {
                let _ = h.events.send(Event::Signal(signo));
            }
        });
        if flooded {
            return Step::End(self.fatal(
                ErrorCode::BadRequest,
                format!("more than {MAX_SIGNALS_PER_EXEC} signal frames for exec {id}"),
            ));
        }
        Step::Continue
    }

    fn configure(&mut self, spec: ConfigureSpec) -> Step {
        let Some(conf) = self.opts.configurator.clone() else {
            self.out.send(
                &Message::error(
                    ErrorCode::Unsupported,
                    format!("a {:?} agent does not handle configure", self.opts.role),
                ),
                0,
            );
            return Step::Continue;
        };
        if self.configuring.swap(true, Ordering::SeqCst) {
            self.out.send(
                &Message::error(ErrorCode::Busy, "a configure is already running"),
                0,
            );
            return Step::Continue;
        }
        let (out, busy) = (self.out.clone(), self.configuring.clone());
        let t = thread::Builder::new()
            .name("configure".into())
            .spawn(move || {
                let msg = match conf.configure(&spec) {
                    Ok(done) => Message::Configured(done),
                    Err(e) => Message::error(ErrorCode::SetupFailed, error_chain(e.as_ref())),
                };
                out.send(&msg, 0);
                busy.store(false, Ordering::SeqCst);
            });
        match t {
            Ok(t) => self.threads.push(t),
            Err(e) => {
                self.configuring.store(false, Ordering::SeqCst);
                self.out.send(
                    &Message::error(ErrorCode::Internal, format!("cannot start configure: {e}")),
                    0,
                );
            }
        }
        Step::Continue
    }

    /// Kill every exec, break the transport, wait for every thread.
    fn teardown(&mut self) {
        {
            let execs = self.execs.lock().unwrap_or_else(|p| p.into_inner());
            for h in execs.values() {
                let _ = h.events.send(Event::ConnLost);
            }
        }
        self.out.close();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        if self.opts.keep_leftovers {
            // What ended execs left runs under their shepherds: it ends
            // with the session.
            if let Err(e) = crate::tree::kill_descendants(std::process::id() as i32) {
                tracing::error!("ending the session's leftovers: {e}");
            }
        }
    }
}

pub use hull_protocol::error_chain;

#[cfg(test)]
mod tests {
    use super::*;

    fn exec(env: &[(&str, &str)], timeout_ms: Option<u64>) -> Exec {
        Exec {
            argv: vec!["true".into()],
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            cwd: "".into(),
            timeout_ms,
            stdin: false,
            uid: None,
            gid: None,
            scrub: Vec::new(),
            keep_leftovers: false,
            user: None,
        }
    }

    /// A leader's exec starts from the sandbox's environment, its own
    /// entries winning, and takes the default limit only when it names none.
    #[test]
    fn an_exec_is_completed_with_the_session_s_environment_and_limit() {
        let mut opts = ServeOptions::new(Role::InnerAgent);
        opts.base_env = Some(vec![
            ("PATH".into(), "/usr/bin".into()),
            ("K".into(), "base".into()),
        ]);
        opts.default_timeout_ms = Some(5000);
        let got = complete(&exec(&[("K", "own"), ("X", "1")], None), &opts);
        let mut env = got.env.clone();
        env.sort();
        assert_eq!(
            env,
            [("K", "own"), ("PATH", "/usr/bin"), ("X", "1")]
                .map(|(k, v)| (k.to_string(), v.to_string()))
        );
        assert_eq!(got.timeout_ms, Some(5000));
        assert_eq!(complete(&exec(&[], Some(7)), &opts).timeout_ms, Some(7));
        // Without a base the exec's environment is its own, whole.
        let bare = ServeOptions::new(Role::InnerAgent);
        assert_eq!(complete(&exec(&[("K", "own")], None), &bare).env.len(), 1);
    }
}
