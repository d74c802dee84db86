//! The container's end of tier 3's network channel, started by a
//! `Configure` that asks for it: a listener on the container's loopback
//! (made in its network namespace, which holds nothing else) whose
//! connections `netrelay` carries over the [`PORT_NAME`] port to hull.
//!
//! The container gets no interface and no route: what it can reach is
//! hull's proxy through this listener, and the proxy decides. The relay
//! decides nothing; a command that gains root in the container can at most
//! write frames to the port, which hull checks as hostile.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use hull_protocol::netmux::PORT_NAME;
use hull_protocol::NetworkSpec;

use super::SetupError;
use crate::transport::{self, Port};

/// How long hull has to be connected to the port: it connects before it
/// sends the `Configure`.
const HOST_WAIT: Duration = Duration::from_secs(10);

fn fail(what: String) -> impl FnOnce(std::io::Error) -> SetupError {
    move |source| SetupError::Network { what, source }
}

/// Starts the relay for the container whose init is `pid`; it runs on its
/// own threads until hull closes the port.
pub fn start(pid: u32, spec: &NetworkSpec) -> Result<(), SetupError> {
    let ns_path = format!("/proc/{pid}/ns/net");
    let netns = std::fs::File::open(&ns_path).map_err(fail(format!("open {ns_path}")))?;
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, spec.listen_port));
    let listener = crate::netrelay::listen_in(netns, addr).map_err(fail(format!(
        "listen on {addr} in the container's network namespace"
    )))?;
    let path = transport::find_port(PORT_NAME).map_err(|e| SetupError::Network {
        what: "find the network channel's port".into(),
        source: std::io::Error::other(e.to_string()),
    })?;
    let port = Port::open(&path).map_err(|e| SetupError::Network {
        what: format!("open {}", path.display()),
        source: std::io::Error::other(e.to_string()),
    })?;
    let end = Instant::now() + HOST_WAIT;
    while !port
        .host_connected()
        .map_err(fail(format!("poll {}", path.display())))?
    {
        if Instant::now() >= end {
            return Err(SetupError::Network {
                what: format!("wait for hull on {}", path.display()),
                source: std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("hull did not connect within {} s", HOST_WAIT.as_secs()),
                ),
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let session = port.session();
    std::thread::Builder::new()
        .name("net-relay".into())
        .spawn(
            move || match crate::netrelay::serve(listener, session.reader, session.writer) {
                Ok(()) => tracing::info!("the network channel closed"),
                Err(e) => tracing::warn!("the network channel ended: {e}"),
            },
        )
        .map_err(fail("start the relay's thread".into()))?;
    tracing::info!("network relay listening on {addr} in the container");
    Ok(())
}
