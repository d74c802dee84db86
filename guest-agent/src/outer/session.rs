//! The host's session: hello, then each frame handled; `Configure` on a
//! thread of its own, exec frames relayed to and from the inner agent, only
//! for the exec ids the host started.

use std::collections::{HashMap, HashSet};
use std::io;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Instant;

use hull_protocol::client::{check_peer_hello, hello_message};
use hull_protocol::{
    ConfigureSpec, Configured, ConnError, ErrorCode, Frame, FrameReader, FrameWriter, Message, Role,
};

use crate::outbox::Outbox;
use crate::serve::{error_chain, SessionEnd};
use crate::transport::Transport;

use super::{lock, Backend, SetupError, HANDSHAKE_TIMEOUT, MAX_RUNNING};

/// The link to the inner agent of the configured container.
struct InnerLink {
    out: Outbox,
    reader: Option<JoinHandle<()>>,
    alive: Arc<AtomicBool>,
    /// The inner agent's pid (its socket's peer): the container's cgroup
    /// is found from it.
    pid: Option<u32>,
}

/// State shared by the session's threads.
struct Shared {
    host: Outbox,
    /// Exec ids relayed to the inner agent and not yet ended.
    running: Mutex<HashSet<u32>>,
    /// The ids that ended last ([`ENDED_KEPT`]): stdin or a kill the host
    /// sent before an exec's end reached it is dropped, not answered with
    /// `UnknownId` (which could reach the host before the exec's `Exit`,
    /// sent from the inner link's thread, and fail the exec there).
    ended: Mutex<std::collections::VecDeque<u32>>,
    /// The container's memory peak, reset when each running exec started.
    peaks: Mutex<HashMap<u32, super::kernel::MemoryPeak>>,
    inner: Mutex<Option<InnerLink>>,
    /// Why there is no inner link, for the errors execs get.
    no_inner: Mutex<String>,
    configuring: AtomicBool,
}

enum Step {
    Continue,
    End(SessionEnd),
}

/// Serve one host session on `t` until it ends. The inner link is closed at the
/// end (the inner agent then kills the session's commands); the container and the
/// mounts stay for the next session.
pub fn serve_session(t: Transport, backend: &Arc<dyn Backend>) -> SessionEnd {
    let Transport {
        reader,
        writer,
        closer,
        name,
    } = t;
    let host = Outbox::new(writer, Arc::from(closer));
    let shared = Arc::new(Shared {
        host: host.clone(),
        running: Mutex::new(HashSet::new()),
        ended: Mutex::new(std::collections::VecDeque::new()),
        peaks: Mutex::new(HashMap::new()),
        inner: Mutex::new(None),
        no_inner: Mutex::new("not configured: send configure first".into()),
        configuring: AtomicBool::new(false),
    });
    let software = format!("hull-agent {} (outer)", env!("CARGO_PKG_VERSION"));
    host.send(&hello_message(Role::OuterAgent, &software), 0);
    let mut reader = FrameReader::new(reader);
    let mut configure_thread: Option<JoinHandle<()>> = None;
    let end = match handshake(&shared, &mut reader) {
        Err(end) => end,
        Ok(()) => {
            if let Some(r) = backend.reconnect() {
                match r.and_then(|s| connect_inner(s, &shared)) {
                    Ok(sw) => tracing::info!("reconnected to the inner agent ({sw})"),
                    Err(e) => {
                        tracing::error!("{e}");
                        *lock(&shared.no_inner) =
                            format!("the inner agent is not reachable: {}", error_chain(&e));
                    }
                }
            }
            loop {
                let frame = match recv(&shared, &mut reader) {
                    Ok(f) => f,
                    Err(end) => break end,
                };
                match handle(&shared, backend, &mut configure_thread, frame) {
                    Step::Continue => {}
                    Step::End(end) => break end,
                }
            }
        }
    };
    tracing::info!(transport = %name, "host session ended: {end:?}");
    if let Some(t) = configure_thread.take() {
        let _ = t.join();
    }
    close_inner(&shared);
    host.close();
    end
}

fn fatal(shared: &Shared, code: ErrorCode, msg: String) -> SessionEnd {
    shared.host.send(&Message::error(code, msg.clone()), 0);
    SessionEnd::ProtocolError(msg)
}

fn recv<R: io::Read>(shared: &Shared, reader: &mut FrameReader<R>) -> Result<Frame, SessionEnd> {
    match reader.recv() {
        Ok(f) => Ok(f),
        Err(ConnError::Decode(e)) => Err(fatal(shared, e.code(), e.to_string())),
        Err(ConnError::Truncated { buffered }) => Err(SessionEnd::ProtocolError(format!(
            "connection closed in the middle of a frame ({buffered} bytes)"
        ))),
        Err(e) => {
            tracing::debug!("host connection ended: {e}");
            Err(SessionEnd::Closed)
        }
    }
}

fn handshake<R: io::Read>(shared: &Shared, reader: &mut FrameReader<R>) -> Result<(), SessionEnd> {
    let frame = recv(shared, reader)?;
    match check_peer_hello(frame) {
        Ok((hello, version)) if hello.role == Role::Host => {
            tracing::info!(version, peer = %hello.software, "host handshake done");
            Ok(())
        }
        Ok((hello, _)) => Err(fatal(
            shared,
            ErrorCode::BadRequest,
            format!("a {:?} peer may not drive the outer agent", hello.role),
        )),
        Err(ConnError::Version(e)) => Err(fatal(shared, ErrorCode::VersionMismatch, e.to_string())),
        Err(ConnError::Peer { code, message }) => {
            tracing::warn!("host reported {code} before hello: {message}");
            Err(SessionEnd::Closed)
        }
        Err(e) => Err(fatal(shared, ErrorCode::BadRequest, e.to_string())),
    }
}

fn handle(
    shared: &Arc<Shared>,
    backend: &Arc<dyn Backend>,
    configure_thread: &mut Option<JoinHandle<()>>,
    frame: Frame,
) -> Step {
    let id = frame.id;
    match frame.message {
        Message::Configure(spec) => {
            start_configure(shared, backend, configure_thread, spec);
            Step::Continue
        }
        Message::Exec(req) => forward_exec(shared, id, Message::Exec(req)),
        m @ (Message::Stdin(_) | Message::StdinEof | Message::Signal { .. } | Message::Kill) => {
            forward_to_running(shared, id, m);
            Step::Continue
        }
        Message::Error { code, message } => {
            tracing::warn!(id, "host reported {code}: {message}");
            if id == 0 {
                return Step::End(SessionEnd::Closed);
            }
            // The host gave up on this exec: the inner agent kills it.
            if lock(&shared.running).contains(&id) {
                send_inner(shared, &Message::error(code, message), id);
            }
            Step::Continue
        }
        Message::Ping { nonce } => {
            shared.host.send(&Message::Pong { nonce }, 0);
            Step::Continue
        }
        Message::Shutdown => Step::End(SessionEnd::Shutdown),
        Message::Hello(_) => Step::End(fatal(
            shared,
            ErrorCode::BadRequest,
            "a second hello".into(),
        )),
        m @ (Message::Started { .. }
        | Message::StdinAck { .. }
        | Message::Stdout(_)
        | Message::Stderr(_)
        | Message::Usage { .. }
        | Message::Exit(_)
        | Message::Configured(_)
        | Message::Pong { .. }) => Step::End(fatal(
            shared,
            ErrorCode::BadRequest,
            format!("{} frames are only sent by the agent", m.kind().name()),
        )),
    }
}

fn start_configure(
    shared: &Arc<Shared>,
    backend: &Arc<dyn Backend>,
    configure_thread: &mut Option<JoinHandle<()>>,
    spec: ConfigureSpec,
) {
    if shared.configuring.swap(true, Ordering::SeqCst) {
        shared.host.send(
            &Message::error(ErrorCode::Busy, "a configure is already running"),
            0,
        );
        return;
    }
    if let Some(t) = configure_thread.take() {
        let _ = t.join();
    }
    let (shared2, backend2) = (shared.clone(), backend.clone());
    let spawned = thread::Builder::new()
        .name("configure".into())
        .spawn(move || {
            let t0 = Instant::now();
            let result = backend2
                .configure(&spec)
                .and_then(|(name, stream)| connect_inner(stream, &shared2).map(|sw| (name, sw)));
            let msg = match result {
                Ok((container, inner_software)) => {
                    tracing::info!(
                        "configured {container} in {:.2} s",
                        t0.elapsed().as_secs_f64()
                    );
                    Message::Configured(Configured {
                        container,
                        inner_software,
                    })
                }
                Err(e) => {
                    let text = error_chain(&e);
                    tracing::error!("configure failed: {text}");
                    Message::error(ErrorCode::SetupFailed, text)
                }
            };
            shared2.host.send(&msg, 0);
            shared2.configuring.store(false, Ordering::SeqCst);
        });
    match spawned {
        Ok(t) => *configure_thread = Some(t),
        Err(e) => {
            shared.configuring.store(false, Ordering::SeqCst);
            shared.host.send(
                &Message::error(ErrorCode::Internal, format!("cannot start configure: {e}")),
                0,
            );
        }
    }
}

/// Why an exec cannot be relayed now.
fn no_inner_reason(shared: &Shared) -> String {
    if shared.configuring.load(Ordering::SeqCst) {
        "configure is still running; wait for configured".into()
    } else {
        lock(&shared.no_inner).clone()
    }
}

fn forward_exec(shared: &Arc<Shared>, id: u32, msg: Message) -> Step {
    let inner = lock(&shared.inner);
    let link = match inner.as_ref() {
        Some(l) if l.alive.load(Ordering::SeqCst) => l,
        _ => {
            drop(inner);
            let reason = no_inner_reason(shared);
            shared
                .host
                .send(&Message::error(ErrorCode::BadRequest, reason), id);
            return Step::Continue;
        }
    };
    {
        let mut running = lock(&shared.running);
        if running.contains(&id) {
            drop(running);
            drop(inner);
            return Step::End(fatal(
                shared,
                ErrorCode::BadRequest,
                format!("exec id {id} is already running"),
            ));
        }
        if running.len() >= MAX_RUNNING {
            drop(running);
            drop(inner);
            shared.host.send(
                &Message::error(ErrorCode::Busy, format!("{MAX_RUNNING} execs are running")),
                id,
            );
            return Step::Continue;
        }
        running.insert(id);
    }
    if let Some(peak) = link.pid.and_then(super::kernel::MemoryPeak::start) {
        lock(&shared.peaks).insert(id, peak);
    }
    if !link.out.send(&msg, id) {
        drop(inner);
        lock(&shared.running).remove(&id);
        shared.host.send(
            &Message::error(
                ErrorCode::Internal,
                "the connection to the inner agent is lost",
            ),
            id,
        );
    }
    Step::Continue
}

/// How many ended ids are remembered.
const ENDED_KEPT: usize = 64;

fn forward_to_running(shared: &Shared, id: u32, msg: Message) {
    if !lock(&shared.running).contains(&id) {
        if lock(&shared.ended).contains(&id) {
            tracing::debug!(id, "a frame for an exec that just ended, dropped");
            return;
        }
        shared.host.send(
            &Message::error(
                ErrorCode::UnknownId,
                format!("no exec with id {id} is running"),
            ),
            id,
        );
        return;
    }
    send_inner(shared, &msg, id);
}

fn send_inner(shared: &Shared, msg: &Message, id: u32) {
    let inner = lock(&shared.inner);
    if let Some(l) = inner.as_ref() {
        l.out.send(msg, id);
    }
}

/// Say hello to the inner agent on `stream`, then relay its frames to the host
/// from a thread. Returns the inner agent's software string.
fn connect_inner(stream: UnixStream, shared: &Arc<Shared>) -> Result<String, SetupError> {
    let hs = |e: String| SetupError::Handshake(e);
    stream
        .set_read_timeout(Some(HANDSHAKE_TIMEOUT))
        .map_err(|e| hs(e.to_string()))?;
    let mut writer = FrameWriter::new(stream.try_clone().map_err(|e| hs(e.to_string()))?);
    let mut reader = FrameReader::new(stream.try_clone().map_err(|e| hs(e.to_string()))?);
    let software = format!("hull-agent {} (outer)", env!("CARGO_PKG_VERSION"));
    writer
        .send(&hello_message(Role::OuterAgent, &software), 0)
        .map_err(|e| hs(e.to_string()))?;
    let frame = reader.recv().map_err(|e| hs(e.to_string()))?;
    let (hello, _) = check_peer_hello(frame).map_err(|e| hs(e.to_string()))?;
    if hello.role != Role::InnerAgent {
        return Err(hs(format!("the peer says it is a {:?} agent", hello.role)));
    }
    reader
        .get_ref()
        .set_read_timeout(None)
        .map_err(|e| hs(e.to_string()))?;
    let pid = rustix::net::sockopt::socket_peercred(&stream)
        .ok()
        .and_then(|c| c.pid.as_raw_nonzero().get().try_into().ok());
    let closer = stream;
    let out = Outbox::new(
        Box::new(writer.into_inner()),
        Arc::new(move || {
            let _ = closer.shutdown(std::net::Shutdown::Both);
        }),
    );
    let alive = Arc::new(AtomicBool::new(true));
    let (shared2, alive2) = (shared.clone(), alive.clone());
    let reader_thread = thread::Builder::new()
        .name("inner-relay".into())
        .spawn(move || relay_inner(reader, &shared2, &alive2))
        .map_err(|e| hs(format!("cannot start the relay thread: {e}")))?;
    let old = lock(&shared.inner).replace(InnerLink {
        out,
        reader: Some(reader_thread),
        alive,
        pid,
    });
    if let Some(mut old) = old {
        old.out.close();
        if let Some(t) = old.reader.take() {
            let _ = t.join();
        }
    }
    Ok(hello.software)
}

/// Inner agent to host. Ends (and fails every running exec) when the inner agent
/// closes, breaks the protocol, or sends what only a host or outer agent may.
fn relay_inner(mut reader: FrameReader<UnixStream>, shared: &Shared, alive: &AtomicBool) {
    let reason = loop {
        let frame = match reader.recv() {
            Ok(f) => f,
            Err(ConnError::Closed) => break "the inner agent closed the connection".to_owned(),
            Err(e) => break format!("the inner agent connection failed: {e}"),
        };
        let id = frame.id;
        let terminal = matches!(frame.message, Message::Exit(_) | Message::Error { .. });
        match frame.message {
            Message::Error { code, message } if id == 0 => {
                break format!("the inner agent reported {code}: {message}");
            }
            Message::Pong { .. } => continue,
            m @ (Message::Started { .. }
            | Message::Stdout(_)
            | Message::Stderr(_)
            | Message::StdinAck { .. }
            | Message::Exit(_)
            | Message::Error { .. }) => {
                let known = {
                    let mut running = lock(&shared.running);
                    let known = running.contains(&id);
                    if known && terminal {
                        running.remove(&id);
                        let mut ended = lock(&shared.ended);
                        if ended.len() == ENDED_KEPT {
                            ended.pop_front();
                        }
                        ended.push_back(id);
                    }
                    known
                };
                // Before its end: what the command's container used.
                let peak = terminal.then(|| lock(&shared.peaks).remove(&id)).flatten();
                if let (true, Message::Exit(_), Some(bytes)) =
                    (known, &m, peak.and_then(|p| p.read()))
                {
                    shared.host.send(
                        &Message::Usage {
                            peak_memory_bytes: bytes.min(hull_protocol::limits::MAX_PEAK_MEMORY),
                        },
                        id,
                    );
                }
                if known {
                    shared.host.send(&m, id);
                } else {
                    tracing::warn!(
                        id,
                        "dropping a {} frame for an exec the host did not start",
                        m.kind().name()
                    );
                }
            }
            other => break format!("the inner agent sent a {} frame", other.kind().name()),
        }
    };
    alive.store(false, Ordering::SeqCst);
    tracing::warn!("inner link ended: {reason}");
    *lock(&shared.no_inner) = format!("the inner agent is gone: {reason}");
    let ids: Vec<u32> = lock(&shared.running).drain().collect();
    for id in ids {
        shared
            .host
            .send(&Message::error(ErrorCode::Internal, reason.clone()), id);
    }
    let _ = reader.get_ref().shutdown(std::net::Shutdown::Both);
}

fn close_inner(shared: &Shared) {
    let link = lock(&shared.inner).take();
    if let Some(mut l) = link {
        l.out.close();
        if let Some(t) = l.reader.take() {
            let _ = t.join();
        }
    }
}
