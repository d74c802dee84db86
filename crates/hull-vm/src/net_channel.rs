//! hull's end of a VM's network channel for one run: the run's proxy
//! process and the bridge (`net::bridge`) between the VM's network port
//! and it, on a thread of their own.
//!
//! Every byte on the port is the guest's: the bridge bounds what it holds
//! and the proxy checks what each stream asks for, as on the other tiers.
//! The channel lives as long as the run's VM; one run's proxy never serves
//! another run (each run starts its own, with its own policy).

use std::io;
use std::os::unix::net::UnixStream;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::net::helper::{Feed, ProxyProcess};

/// A run's proxy, fed by the bridge from the VM's port.
#[derive(Debug)]
pub struct NetChannel {
    proxy: ProxyProcess,
    /// Shut down at the end, so the bridge's thread ends even if QEMU
    /// has not closed its side yet.
    port: UnixStream,
    bridge: Option<JoinHandle<()>>,
}

impl NetChannel {
    /// Bridges `port` (connected to QEMU's socket for the VM's network
    /// port) to `proxy`, whose connections come through `feed`.
    pub fn start(port: UnixStream, proxy: ProxyProcess, feed: Feed) -> io::Result<NetChannel> {
        let ours = port.try_clone()?;
        ours.set_nonblocking(true)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()?;
        let bridge = std::thread::Builder::new()
            .name("net-bridge".into())
            .spawn(move || {
                let served = runtime.block_on(async move {
                    let port = tokio::net::UnixStream::from_std(ours)?;
                    crate::net::bridge::serve(port, move || {
                        let conn = feed.connect();
                        async move { conn }
                    })
                    .await
                    .map_err(io::Error::other)
                });
                match served {
                    Ok(()) => tracing::debug!("tier vm: the network channel closed"),
                    // A guest that breaks the framing loses its network;
                    // the command runs on without it.
                    Err(e) => tracing::warn!("tier vm: the network channel ended: {e}"),
                }
            })?;
        Ok(NetChannel {
            proxy,
            port,
            bridge: Some(bridge),
        })
    }

    /// The proxy's name and how it ended, if it has.
    pub fn ended(&self) -> Option<(String, String)> {
        self.proxy
            .ended()
            .map(|how| (self.proxy.name().to_string(), how))
    }

    /// Ends the channel after the command and its VM: the proxy prints one
    /// line per refused host and exits (killed after `grace`).
    pub fn finish(mut self, grace: Duration) {
        let _ = self.port.shutdown(std::net::Shutdown::Both);
        if let Some(b) = self.bridge.take() {
            let _ = b.join();
        }
        self.proxy.finish(grace);
    }
}
