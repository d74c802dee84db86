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

use std::io;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use hull_protocol::ConfigureSpec;

use crate::incus::{self, Incus, IncusError};
use crate::mounts::{self, MountError};
use crate::serve::SessionEnd;
use crate::transport::{self, Port, Transport, TransportError};

mod container;
mod kernel;
mod network;
mod session;

pub use container::{check_id_map, container_devices, interfaces, IncusBackend};
pub use kernel::cgroup_limits;
pub use session::serve_session;

/// Guest directory with one control directory per container (`<name>/inner.sock`).
pub const CTL_ROOT: &str = "/run/hull/ctl";
/// Where the control directory appears in the container.
pub const CTL_IN_CONTAINER: &str = "/run/hull";
/// The inner agent's socket name in the control directory.
pub const INNER_SOCKET: &str = "inner.sock";
/// The agent disk's mount point in the guest and in the container (the
/// container's init, the inner agent, runs from it).
pub const AGENT_DIR: &str = "/opt/hull";
/// Device names.
const CTL_DEVICE: &str = "hull-ctl";
const AGENT_DEVICE: &str = "hull-agent";
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
    #[error("step limits: container {name}")]
    Limits {
        name: String,
        #[source]
        source: kernel::LimitError,
    },
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
    #[error("step network: cannot {what}")]
    Network {
        what: String,
        #[source]
        source: io::Error,
    },
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
                        kernel::power_off();
                    }
                    return Ok(());
                }
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A `Configure` for the unit tests of the submodules.
#[cfg(test)]
fn test_spec() -> hull_protocol::ConfigureSpec {
    ConfigureSpec {
        shares: vec![
            hull_protocol::Share {
                tag: "project".into(),
                guest_path: "/mnt/hull/project".into(),
                container_path: "/work/proj".into(),
                readonly: false,
                subdir: None,
                noexec: false,
            },
            hull_protocol::Share {
                tag: "spill".into(),
                guest_path: "/mnt/hull/spill".into(),
                container_path: "/tmp/hull-runs/x/spill".into(),
                readonly: true,
                subdir: None,
                noexec: false,
            },
        ],
        container: hull_protocol::ContainerSpec {
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
        network: None,
        overlay: None,
    }
}
