//! `hull-agent outer`: the agent in the outer VM. It serves the host on the
//! virtio-serial port, builds the per-instance container on `Configure` (mount the
//! virtiofs shares, clone or reuse the container, add the shares as Incus disk
//! devices, set limits, start it), connects to the inner agent that is the
//! container's init, and relays exec frames between the host and it.
//!
//! Guards against: running anything in the outer guest for the host (every exec
//! goes to the container; before `Configure` succeeds execs are refused), a
//! container that is not isolated (privileged, with a NIC or host devices, or with
//! guest root mapped in: checked before and after start, fail closed), and a
//! hostile inner agent (a command that gained container root can speak for it):
//! its frames are decoded with the same bounds as the host's, only frames of exec
//! ids the host started are relayed, and anything else ends the link. Every setup
//! failure reaches the host as an `Error{SetupFailed}` naming the step. Does not
//! guard against a hostile host (it owns the VM) or a hostile guest kernel.

use std::collections::HashSet;
use std::io;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use hull_protocol::client::{check_peer_hello, hello_message};
use hull_protocol::{
    ConfigureSpec, Configured, ConnError, ErrorCode, Frame, FrameReader, FrameWriter, Message, Role,
};

use crate::incus::{self, Config, ContainerRoot, Devices, Incus, IncusError};
use crate::mounts::{self, MountError};
use crate::outbox::Outbox;
use crate::serve::{error_chain, SessionEnd};
use crate::transport::{self, Port, Transport, TransportError};

/// Guest directory with one control directory per container (`<name>/inner.sock`).
pub const CTL_ROOT: &str = "/run/hull/ctl";
/// Where the control directory appears in the container.
pub const CTL_IN_CONTAINER: &str = "/run/hull";
/// The inner agent's socket name in the control directory.
pub const INNER_SOCKET: &str = "inner.sock";
/// Device names.
const CTL_DEVICE: &str = "hull-ctl";
const SHARE_DEVICE_PREFIX: &str = "hull-share-";
/// Most exec ids relayed at once (the inner agent caps concurrency lower).
const MAX_RUNNING: usize = 1024;
/// Incus operation timeouts, generous for TCG.
const CREATE_TIMEOUT_S: u64 = 300;
const START_TIMEOUT_S: u64 = 180;
/// How long the inner agent may take to listen after the container started.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(60);
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// Arguments of `hull-agent outer`.
#[derive(Debug, clap::Args)]
pub struct OuterArgs {
    /// virtio-serial port to serve the host on (`/sys/class/virtio-ports/*/name`).
    #[arg(long, value_name = "NAME", default_value = "agent.0")]
    pub port: String,
    /// Serve on this unix socket instead of the port (development).
    #[arg(long, value_name = "PATH")]
    pub listen_unix: Option<PathBuf>,
    /// incusd's REST socket.
    #[arg(long, value_name = "PATH", default_value = incus::DEFAULT_SOCKET)]
    pub incus_socket: PathBuf,
    /// Seconds to wait for incusd before serving; the agent's hello follows readiness.
    #[arg(long, value_name = "SECS", default_value_t = 300)]
    pub ready_timeout: u64,
    /// On the host's `Shutdown`: flush the shares and power the guest off
    /// (the guest's init passes it; the root disk is a throwaway overlay, so
    /// only the shares need flushing).
    #[arg(long)]
    pub poweroff: bool,
}

/// A setup step that failed; the message names the step.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("step clock: cannot set the guest clock")]
    Clock(#[source] io::Error),
    #[error("step incus: incusd is not usable: {0}")]
    IncusNotReady(String),
    #[error("step mount")]
    Mount(#[from] MountError),
    #[error("step create: cannot create container {name} from {base}")]
    Create {
        name: String,
        base: String,
        #[source]
        source: Box<IncusError>,
    },
    #[error("step create: container {name} was already configured in this VM; boot or restore a fresh VM for a fresh container")]
    AlreadyConfigured { name: String },
    #[error("step isolation")]
    Isolation(#[source] Box<IncusError>),
    #[error("step control: {path}")]
    Control {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("step config: cannot add the shares and limits to container {name}")]
    Config {
        name: String,
        #[source]
        source: Box<IncusError>,
    },
    #[error("step start: cannot start container {name}")]
    Start {
        name: String,
        #[source]
        source: Box<IncusError>,
    },
    #[error("step verify: container {name}: {why}")]
    Verify { name: String, why: String },
    #[error("step connect: the inner agent did not answer on {path} within {secs} s: {last}")]
    Connect {
        path: PathBuf,
        secs: u64,
        last: String,
    },
    #[error("step handshake: inner agent: {0}")]
    Handshake(String),
    #[error("step attach")]
    Attach(#[from] mounts::InjectError),
}

/// What sets up the container and reaches its inner agent. The real one drives
/// incusd ([`IncusBackend`]); tests use one that serves a local inner agent.
pub trait Backend: Send + Sync {
    /// Build and start the container `spec` asks for; return its name and a
    /// connected stream to its inner agent (before the handshake).
    fn configure(&self, spec: &ConfigureSpec) -> Result<(String, UnixStream), SetupError>;
    /// A new stream to the configured container's inner agent (for a later host
    /// session), or `None` when nothing is configured.
    fn reconnect(&self) -> Option<Result<UnixStream, SetupError>>;
}

pub fn run(args: OuterArgs) -> anyhow::Result<()> {
    let transport = incus::UnixTransport::new(
        &args.incus_socket,
        Duration::from_secs(CREATE_TIMEOUT_S + 30),
    )?;
    let incus = Incus::new(transport);
    let t0 = Instant::now();
    let not_ready = match incus.wait_ready(Duration::from_secs(args.ready_timeout)) {
        Ok(()) => {
            tracing::info!("incusd ready after {:.1} s", t0.elapsed().as_secs_f64());
            None
        }
        Err(e) => {
            tracing::error!("{e}");
            Some(e.to_string())
        }
    };
    let backend: Arc<dyn Backend> =
        Arc::new(IncusBackend::new(incus, not_ready, PathBuf::from(CTL_ROOT)));
    match &args.listen_unix {
        Some(path) => {
            let listener = transport::listen_unix(path)?;
            tracing::info!("outer agent listening on {}", path.display());
            loop {
                let (stream, _) = listener.accept()?;
                let t = Transport::from_unix(stream, &path.display().to_string())?;
                if serve_session(t, &backend) == SessionEnd::Shutdown {
                    return Ok(());
                }
            }
        }
        None => {
            let path = transport::find_port(&args.port)?;
            let port = Port::open(&path)?;
            tracing::info!(
                "outer agent serving on virtio-serial port {} ({})",
                args.port,
                path.display()
            );
            loop {
                port.wait_for_host()
                    .map_err(|e: TransportError| anyhow::anyhow!(e))?;
                if serve_session(port.session(), &backend) == SessionEnd::Shutdown {
                    if args.poweroff {
                        power_off();
                    }
                    return Ok(());
                }
            }
        }
    }
}

/// The link to the inner agent of the configured container.
struct InnerLink {
    out: Outbox,
    reader: Option<JoinHandle<()>>,
    alive: Arc<AtomicBool>,
}

/// State shared by the session's threads.
struct Shared {
    host: Outbox,
    /// Exec ids relayed to the inner agent and not yet ended.
    running: Mutex<HashSet<u32>>,
    inner: Mutex<Option<InnerLink>>,
    /// Why there is no inner link, for the errors execs get.
    no_inner: Mutex<String>,
    configuring: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
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

fn forward_to_running(shared: &Shared, id: u32, msg: Message) {
    if !lock(&shared.running).contains(&id) {
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
                    }
                    known
                };
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

/// The per-instance container's config keys from the spec's limits.
pub fn container_config(spec: &ConfigureSpec) -> Config {
    let mut c = Config::new();
    let c_ = &spec.container;
    if let Some(m) = c_.memory_bytes {
        c.insert("limits.memory".into(), m.to_string());
    }
    if let Some(n) = c_.cpus {
        c.insert("limits.cpu".into(), n.to_string());
    }
    if let Some(n) = c_.processes {
        c.insert("limits.processes".into(), n.to_string());
    }
    c
}

/// The disk devices: one per share at its host path (read-only shares with
/// `readonly=true`), and the control directory.
pub fn container_devices(spec: &ConfigureSpec, ctl_dir: &Path) -> Devices {
    let disk = |source: &str, path: &str, readonly: bool| {
        let mut d = std::collections::BTreeMap::new();
        d.insert("type".to_owned(), "disk".to_owned());
        d.insert("source".to_owned(), source.to_owned());
        d.insert("path".to_owned(), path.to_owned());
        if readonly {
            d.insert("readonly".to_owned(), "true".to_owned());
        }
        d
    };
    let mut devs = Devices::new();
    for s in &spec.shares {
        devs.insert(
            format!("{SHARE_DEVICE_PREFIX}{}", s.tag),
            disk(&s.guest_path, &s.container_path, s.readonly),
        );
    }
    devs.insert(
        CTL_DEVICE.to_owned(),
        disk(&ctl_dir.to_string_lossy(), CTL_IN_CONTAINER, false),
    );
    devs
}

/// Check a running container's `uid_map` (`/proc/<init>/uid_map` or `gid_map`):
/// container root is `root` and no range reaches guest id 0.
pub fn check_id_map(text: &str, root: u32) -> Result<(), String> {
    let mut saw_root = false;
    for line in text.lines() {
        let f: Vec<u64> = line
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        let [ns, host, count] = f[..] else {
            return Err(format!("malformed id map line {line:?}"));
        };
        if host == 0 {
            return Err("a range maps guest id 0 into the container".into());
        }
        if ns == 0 {
            if host != u64::from(root) {
                return Err(format!(
                    "container root is guest id {host}, expected {root}"
                ));
            }
            saw_root = true;
        }
        if count == 0 {
            return Err(format!("empty id map line {line:?}"));
        }
    }
    if saw_root {
        Ok(())
    } else {
        Err("container root is not mapped (not a user namespace?)".into())
    }
}

fn set_clock(unix_ns: u64) -> io::Result<()> {
    if unix_ns == 0 {
        return Ok(());
    }
    let ts = libc::timespec {
        tv_sec: (unix_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (unix_ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: `ts` is a valid timespec on the stack; clock_settime only reads it.
    if unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &ts) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Flushes every share mounted under the share root (`syncfs`), so writes
/// still in the guest's page cache reach the host, then powers off. Returns
/// only if the power-off was refused.
fn power_off() {
    let t0 = Instant::now();
    for p in mounts::mounted_shares() {
        match std::fs::File::open(&p) {
            Ok(f) => {
                if let Err(e) = rustix::fs::syncfs(&f) {
                    tracing::warn!("syncfs {}: {e}", p.display());
                }
            }
            Err(e) => tracing::warn!("open {}: {e}", p.display()),
        }
    }
    tracing::info!(
        "shares flushed in {:.3} s; powering off",
        t0.elapsed().as_secs_f64()
    );
    if let Err(e) = rustix::system::reboot(rustix::system::RebootCommand::PowerOff) {
        tracing::error!("power off refused: {e}; the guest's init takes over");
    }
}

/// Container init `pid`'s uid and gid maps: container root is `root`, and no
/// range reaches guest id 0.
fn check_init_ids(name: &str, pid: u32, root: ContainerRoot) -> Result<(), SetupError> {
    let verr = |why: String| SetupError::Verify {
        name: name.to_owned(),
        why,
    };
    for (file, id) in [("uid_map", root.uid), ("gid_map", root.gid)] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/{file}"))
            .map_err(|e| verr(format!("cannot read /proc/{pid}/{file}: {e}")))?;
        check_id_map(&text, id).map_err(|w| verr(format!("{file}: {w}")))?;
    }
    Ok(())
}

/// Interface names in a `/proc/<pid>/net/dev` text.
pub fn interfaces(netdev: &str) -> Vec<String> {
    netdev
        .lines()
        .skip(2)
        .filter_map(|l| l.split_once(':'))
        .map(|(n, _)| n.trim().to_owned())
        .collect()
}

/// The cgroup v2 files and values for the spec's limits (what Incus's
/// `limits.memory`, `limits.processes` and a CPU-time bound for `limits.cpu`
/// come to): `memory.max` (and no swap), `pids.max`, `cpu.max`.
pub fn cgroup_limits(spec: &ConfigureSpec) -> Vec<(&'static str, String)> {
    let c = &spec.container;
    let mut v = Vec::new();
    if let Some(m) = c.memory_bytes {
        v.push(("memory.max", m.to_string()));
        v.push(("memory.swap.max", "0".to_string()));
    }
    if let Some(n) = c.processes {
        v.push(("pids.max", n.to_string()));
    }
    if let Some(n) = c.cpus {
        v.push(("cpu.max", format!("{} 100000", u64::from(n) * 100_000)));
    }
    v
}

/// Writes [`cgroup_limits`] into the cgroup of container init `pid` (the
/// container's delegated root: with `nsdelegate`, container root cannot
/// change these files of its own namespace root).
fn set_cgroup_limits(pid: u32, spec: &ConfigureSpec) -> Result<(), String> {
    let limits = cgroup_limits(spec);
    if limits.is_empty() {
        return Ok(());
    }
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .map_err(|e| format!("cannot read /proc/{pid}/cgroup: {e}"))?;
    let rel = text
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or_else(|| format!("container init {pid} is not in a cgroup v2 hierarchy"))?;
    if !rel.starts_with("/lxc.payload.") || rel.contains("..") {
        return Err(format!(
            "container init {pid} is in cgroup {rel}, not an Incus payload"
        ));
    }
    let dir = Path::new("/sys/fs/cgroup").join(rel.trim_start_matches('/'));
    for (file, value) in limits {
        let p = dir.join(file);
        if file == "memory.swap.max" && !p.exists() {
            continue;
        }
        std::fs::write(&p, &value)
            .map_err(|e| format!("cannot write {value} to {}: {e}", p.display()))?;
    }
    Ok(())
}

/// Mixes 64 bytes from the host's virtio-rng into the guest's pool (best
/// effort: the pool is never made weaker by a failed read).
fn reseed_crng() {
    use std::io::{Read, Write};
    let mut buf = [0u8; 64];
    let got = std::fs::File::open("/dev/hwrng").and_then(|mut f| f.read_exact(&mut buf));
    match got {
        Ok(()) => {
            if let Err(e) = std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/urandom")
                .and_then(|mut f| f.write_all(&buf))
            {
                tracing::warn!("cannot mix host entropy into /dev/urandom: {e}");
            }
        }
        Err(e) => tracing::warn!("cannot read /dev/hwrng for a reseed: {e}"),
    }
}

/// `sync; echo 3 > /proc/sys/vm/drop_caches` (best effort).
fn drop_caches() {
    rustix::fs::sync();
    if let Err(e) = std::fs::write("/proc/sys/vm/drop_caches", b"3\n") {
        tracing::warn!("cannot drop the page cache before the snapshot: {e}");
    }
}

/// The real backend: incusd in the outer guest.
pub struct IncusBackend<T: incus::Transport> {
    incus: Incus<T>,
    not_ready: Option<String>,
    ctl_root: PathBuf,
    configured: Mutex<Option<Use>>,
}

/// What the one container of this VM is used for so far.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Use {
    /// Started without shares for a snapshot; exactly one later `Configure`
    /// (after a restore) may add shares to it. Its init pid and root ids
    /// were checked when it started (memory restored from the snapshot
    /// still holds them).
    Prepared {
        name: String,
        pid: u32,
        root: ContainerRoot,
    },
    /// Serving a run: its shares are fixed.
    Configured(String),
}

impl Use {
    fn name(&self) -> &str {
        match self {
            Use::Prepared { name: n, .. } | Use::Configured(n) => n,
        }
    }
}

impl<T: incus::Transport> std::fmt::Debug for IncusBackend<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IncusBackend")
            .field("ctl_root", &self.ctl_root)
            .field("configured", &*lock(&self.configured))
            .finish()
    }
}

impl<T: incus::Transport> IncusBackend<T> {
    pub fn new(incus: Incus<T>, not_ready: Option<String>, ctl_root: PathBuf) -> Self {
        IncusBackend {
            incus,
            not_ready,
            ctl_root,
            configured: Mutex::new(None),
        }
    }

    fn socket_of(&self, name: &str) -> PathBuf {
        self.ctl_root.join(name).join(INNER_SOCKET)
    }

    fn prepare_ctl_dir(&self, dir: &Path, root: ContainerRoot) -> Result<(), SetupError> {
        let err = |source: io::Error| SetupError::Control {
            path: dir.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(&self.ctl_root).map_err(err)?;
        match std::fs::create_dir(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                // A stale socket from an earlier start of a stopped container.
                match std::fs::remove_file(dir.join(INNER_SOCKET)) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(err(e)),
                }
            }
            Err(e) => return Err(err(e)),
        }
        rustix::fs::chown(
            dir,
            Some(rustix::fs::Uid::from_raw(root.uid)),
            Some(rustix::fs::Gid::from_raw(root.gid)),
        )
        .map_err(|e| err(e.into()))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(err)?;
        Ok(())
    }

    /// The one `Configure` of a prepared container after a restore: limits
    /// written to its cgroup, the shares attached to it as it runs, then a
    /// new link to its inner agent. No Incus call: each costs about half a
    /// second under emulation, and the container's Incus config (checked
    /// when it was prepared) is not changed.
    fn configure_prepared(
        &self,
        spec: &ConfigureSpec,
        pid: u32,
        root: ContainerRoot,
    ) -> Result<(String, UnixStream), SetupError> {
        let name = spec.container.name.clone();
        let t0 = Instant::now();
        let verr = |why: String| SetupError::Verify {
            name: name.clone(),
            why,
        };
        check_init_ids(&name, pid, root)?;
        let netdev = std::fs::read_to_string(format!("/proc/{pid}/net/dev"))
            .map_err(|e| verr(format!("cannot read /proc/{pid}/net/dev: {e}")))?;
        let nics = interfaces(&netdev);
        if nics.iter().any(|n| n != "lo") {
            return Err(verr(format!("network interfaces besides lo: {nics:?}")));
        }
        set_cgroup_limits(pid, spec).map_err(|why| SetupError::Verify {
            name: name.clone(),
            why,
        })?;
        let binds: Vec<mounts::Bind> = spec
            .shares
            .iter()
            .map(|s| mounts::Bind {
                tag: s.tag.clone(),
                source: PathBuf::from(&s.guest_path),
                target: PathBuf::from(&s.container_path),
                readonly: s.readonly,
            })
            .collect();
        mounts::inject(pid, (root.uid, root.gid), &binds)?;
        tracing::info!(
            "limits set and {} shares attached in {:.3} s",
            binds.len(),
            t0.elapsed().as_secs_f64()
        );
        let stream = connect_retry(&self.socket_of(&name), CONNECT_TIMEOUT)?;
        *lock(&self.configured) = Some(Use::Configured(name.clone()));
        Ok((name, stream))
    }

    /// The running container's init pid, its id maps checked.
    fn verify_running(&self, name: &str, root: ContainerRoot) -> Result<u32, SetupError> {
        let pid = self.incus.init_pid(name).map_err(|e| SetupError::Verify {
            name: name.to_owned(),
            why: e.to_string(),
        })?;
        check_init_ids(name, pid, root)?;
        Ok(pid)
    }
}

fn connect_retry(path: &Path, timeout: Duration) -> Result<UnixStream, SetupError> {
    let start = Instant::now();
    loop {
        match UnixStream::connect(path) {
            Ok(s) => return Ok(s),
            Err(e) => {
                if start.elapsed() >= timeout {
                    return Err(SetupError::Connect {
                        path: path.to_path_buf(),
                        secs: timeout.as_secs(),
                        last: e.to_string(),
                    });
                }
            }
        }
        thread::sleep(Duration::from_millis(25));
    }
}

impl<T: incus::Transport> Backend for IncusBackend<T> {
    fn configure(&self, spec: &ConfigureSpec) -> Result<(String, UnixStream), SetupError> {
        let name = spec.container.name.clone();
        match lock(&self.configured).as_ref() {
            None => {}
            Some(Use::Prepared { name: p, .. }) if *p == name && !spec.prepare => {}
            Some(u) => {
                return Err(SetupError::AlreadyConfigured {
                    name: u.name().to_owned(),
                })
            }
        }
        if let Some(e) = &self.not_ready {
            // Maybe it came up late.
            self.incus
                .wait_ready(Duration::from_secs(5))
                .map_err(|_| SetupError::IncusNotReady(e.clone()))?;
        }
        set_clock(spec.clock_unix_ns).map_err(SetupError::Clock)?;
        if !spec.prepare {
            // Every VM restored from one snapshot starts with the same CRNG
            // state: mix in fresh bytes from the host (virtio-rng) before
            // anything runs (vmgenid reseeds too, where the kernel has it).
            reseed_crng();
        }
        for share in &spec.shares {
            mounts::mount(&mounts::plan(share)?)?;
        }
        let prepared = match lock(&self.configured).as_ref() {
            Some(Use::Prepared { pid, root, .. }) => Some((*pid, *root)),
            _ => None,
        };
        if let Some((pid, root)) = prepared {
            return self.configure_prepared(spec, pid, root);
        }
        let ctl_dir = self.ctl_root.join(&name);
        let config = container_config(spec);
        let devices = container_devices(spec, &ctl_dir);
        let create_err = |source| SetupError::Create {
            name: name.clone(),
            base: spec.container.base.clone(),
            source: Box::new(source),
        };
        let config_err = |source| SetupError::Config {
            name: name.clone(),
            source: Box::new(source),
        };
        let start_err = |source| SetupError::Start {
            name: name.clone(),
            source: Box::new(source),
        };
        let isolation_err = |e| SetupError::Isolation(Box::new(e));
        let existing = self.incus.instance(&name).map_err(create_err)?;
        let fresh = existing.is_none();
        if fresh {
            let req = incus::copy_request(&name, &spec.container.base, &config, &devices)
                .map_err(create_err)?;
            self.incus
                .call(&req, CREATE_TIMEOUT_S)
                .map_err(create_err)?;
        }
        let inst = self
            .incus
            .instance(&name)
            .map_err(create_err)?
            .ok_or_else(|| {
                create_err(IncusError::Malformed {
                    method: "GET",
                    path: format!("/1.0/instances/{name}"),
                    message: "the container vanished after its creation".into(),
                })
            })?;
        let root = incus::check_isolated(&inst, spec.container.uid, spec.container.gid)
            .map_err(isolation_err)?;
        if !inst.is_running() {
            self.prepare_ctl_dir(&ctl_dir, root)?;
        }
        if !fresh {
            // A container from the image: add the shares before it starts.
            let req = incus::patch_request(&name, &config, &devices).map_err(config_err)?;
            self.incus
                .call(&req, CREATE_TIMEOUT_S)
                .map_err(config_err)?;
            // Devices and limits changed: check again before anything runs in it.
            let inst = self
                .incus
                .instance(&name)
                .map_err(create_err)?
                .ok_or_else(|| SetupError::Verify {
                    name: name.clone(),
                    why: "the container vanished".into(),
                })?;
            incus::check_isolated(&inst, spec.container.uid, spec.container.gid)
                .map_err(isolation_err)?;
        }
        if !inst.is_running() {
            let req =
                incus::state_request(&name, "start", false, START_TIMEOUT_S).map_err(start_err)?;
            self.incus.call(&req, START_TIMEOUT_S).map_err(start_err)?;
        }
        let pid = self.verify_running(&name, root)?;
        let stream = connect_retry(&self.socket_of(&name), CONNECT_TIMEOUT)?;
        if spec.prepare {
            // Less guest memory in the snapshot: every page the page cache
            // holds would be saved and restored.
            drop_caches();
            *lock(&self.configured) = Some(Use::Prepared {
                name: name.clone(),
                pid,
                root,
            });
        } else {
            *lock(&self.configured) = Some(Use::Configured(name.clone()));
        }
        Ok((name, stream))
    }

    fn reconnect(&self) -> Option<Result<UnixStream, SetupError>> {
        // A prepared container serves no session until a `Configure` adds
        // its shares (and the inner agent serves one link at a time).
        let name = match lock(&self.configured).as_ref()? {
            Use::Configured(n) => n.clone(),
            Use::Prepared { .. } => return None,
        };
        Some(connect_retry(
            &self.socket_of(&name),
            Duration::from_secs(5),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hull_protocol::{ContainerSpec, Share};

    fn spec() -> ConfigureSpec {
        ConfigureSpec {
            shares: vec![
                Share {
                    tag: "project".into(),
                    guest_path: "/mnt/hull/project".into(),
                    container_path: "/work/proj".into(),
                    readonly: false,
                },
                Share {
                    tag: "spill".into(),
                    guest_path: "/mnt/hull/spill".into(),
                    container_path: "/tmp/hull-runs/x/spill".into(),
                    readonly: true,
                },
            ],
            container: ContainerSpec {
                name: "hull-run".into(),
                base: "hull-base".into(),
                uid: 1000,
                gid: 1000,
                memory_bytes: Some(512 << 20),
                cpus: Some(1),
                processes: None,
            },
            clock_unix_ns: 0,
            prepare: false,
        }
    }

    #[test]
    fn devices_put_shares_at_host_paths_and_spill_readonly() {
        let d = container_devices(&spec(), Path::new("/run/hull/ctl/hull-run"));
        let p = &d["hull-share-project"];
        assert_eq!(p["type"], "disk");
        assert_eq!(p["source"], "/mnt/hull/project");
        assert_eq!(p["path"], "/work/proj");
        assert!(!p.contains_key("readonly"));
        let s = &d["hull-share-spill"];
        assert_eq!(s["readonly"], "true");
        assert_eq!(s["path"], "/tmp/hull-runs/x/spill");
        assert_eq!(d["hull-ctl"]["source"], "/run/hull/ctl/hull-run");
        assert_eq!(d["hull-ctl"]["path"], CTL_IN_CONTAINER);
        assert_eq!(d.len(), 3);
        for n in d.keys() {
            assert!(incus::check_name("device", n).is_ok(), "{n}");
        }
    }

    #[test]
    fn config_carries_only_the_limits_given() {
        let c = container_config(&spec());
        assert_eq!(c["limits.memory"], (512u64 << 20).to_string());
        assert_eq!(c["limits.cpu"], "1");
        assert!(!c.contains_key("limits.processes"));
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn net_dev_names_every_interface() {
        let t = "Inter-|   Receive\n face |bytes\n    lo: 0 0 0\n  eth0: 1 2 3\n";
        assert_eq!(interfaces(t), ["lo", "eth0"]);
        assert_eq!(interfaces("a\nb\n    lo: 0\n"), ["lo"]);
    }

    #[test]
    fn cgroup_limits_follow_the_spec() {
        let mut s = spec();
        assert_eq!(
            cgroup_limits(&s),
            [
                ("memory.max", (512u64 << 20).to_string()),
                ("memory.swap.max", "0".to_string()),
                ("cpu.max", "100000 100000".to_string()),
            ]
        );
        s.container.processes = Some(64);
        s.container.memory_bytes = None;
        s.container.cpus = None;
        assert_eq!(cgroup_limits(&s), [("pids.max", "64".to_string())]);
    }

    #[test]
    fn id_maps_must_not_reach_guest_root() {
        let ok = "         0    1000000       1000\n      1000       1000          1\n      1001    1001001  999998999\n";
        assert_eq!(check_id_map(ok, 1000000), Ok(()));
        assert!(check_id_map(ok, 1000).is_err());
        assert!(check_id_map("0 0 4294967295\n", 0).is_err());
        assert!(check_id_map("0 1000000 1000\n5 0 1\n", 1000000).is_err());
        assert!(check_id_map("1000 1000 1\n", 1000000).is_err());
        assert!(check_id_map("garbage\n", 1000000).is_err());
    }
}
