//! The network the policy allows: hull's egress proxy, run on the host for
//! the length of a run, and its audit.
//!
//! The floor above `hull-exec`: the proxy ([`proxy`], [`socks`], [`sni`])
//! serves only the names and addresses the policy allows and records every
//! answer ([`audit`]); [`helper`] starts it as a confined helper process
//! (its own environment, the sandbox user when hull is root; Landlock on
//! itself, [`confine`], and the seccomp filter `hull __net-proxy` applies);
//! [`netns`] gives a process tier's
//! command a network namespace whose only way out is the proxy; [`bridge`]
//! carries tier 3's streams to it; [`registry`] asks the host's package
//! clients which registries they use; [`trust`] hands the host's certificate
//! authorities to the command's clients.
//!
//! What it may not do: know a tier, a VM or a run. It uses `hull-policy`,
//! `hull-exec` and `hull-protocol` below it; the crates above start it and
//! give it the policy's `[net]`. Unix only (no tier off unix has the allow
//! list yet).

#![cfg(unix)]

pub mod audit;
pub mod bridge;
#[cfg(target_os = "linux")]
pub mod confine;
#[cfg(target_os = "linux")]
pub mod helper;
#[cfg(target_os = "linux")]
pub mod netns;
pub mod proxy;
pub mod registry;
pub mod sni;
pub mod socks;
pub mod trust;

use std::sync::Arc;

#[cfg(target_os = "linux")]
use hull_exec::{exec, sandbox_user};
use hull_policy as policy;

pub use audit::Audit;
pub use proxy::Shared;

/// Where the proxy listens inside a sandbox with a network namespace of its
/// own ([`netns`]), and what `HTTP_PROXY` says.
pub const LISTEN: &str = "127.0.0.1:3128";

/// The variables that point the command's clients at the proxy; `NO_PROXY`
/// is removed (nothing is reached directly).
pub fn proxy_env() -> Vec<(String, String)> {
    let url = format!("http://{LISTEN}");
    ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"]
        .into_iter()
        .flat_map(|k| [k.to_string(), k.to_ascii_lowercase()])
        .map(|k| (k, url.clone()))
        .collect()
}

/// `env` with the proxy's variables set ([`proxy_env`]) and `NO_PROXY`
/// (any case) removed.
pub fn with_proxy_env(env: &[(String, String)]) -> Vec<(String, String)> {
    let extra = proxy_env();
    let mut out: Vec<(String, String)> = env
        .iter()
        .filter(|(k, _)| !k.eq_ignore_ascii_case("no_proxy"))
        .filter(|(k, _)| !extra.iter().any(|(x, _)| x == k))
        .cloned()
        .collect();
    out.extend(extra);
    out
}

/// Where the proxy listens.
#[derive(Debug)]
pub enum Listener {
    Tcp(std::net::TcpListener),
    #[cfg(unix)]
    Unix(std::os::unix::net::UnixListener),
    /// A TCP listener still to come over this socket, from the child that
    /// makes it in the command's network namespace ([`netns`]). Nothing is
    /// served when the child closes its end without sending one.
    #[cfg(target_os = "linux")]
    Handed(netns::Arrival),
    /// Connections already made, each sent over this socket as it comes
    /// (tier 3: one per stream of the guest's network channel, from
    /// [`bridge`]). Served until the sender closes its end.
    #[cfg(target_os = "linux")]
    Connections(std::os::fd::OwnedFd),
}

/// The proxy of one run: its own thread and runtime, stopped (and every
/// tunnel with it) when dropped.
#[derive(Debug)]
pub struct Proxy {
    shared: Arc<Shared>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    /// Starts serving `listener`.
    pub fn start(listener: Listener, shared: Shared) -> std::io::Result<Proxy> {
        let shared = Arc::new(shared);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("hull-proxy")
            .enable_all()
            .build()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let accepting = Arc::clone(&shared);
        // Registered with the runtime here, so an error shows now.
        let listener = {
            let _guard = rt.enter();
            match listener {
                Listener::Tcp(l) => {
                    l.set_nonblocking(true)?;
                    Accept::Tcp(tokio::net::TcpListener::from_std(l)?)
                }
                #[cfg(unix)]
                Listener::Unix(l) => {
                    l.set_nonblocking(true)?;
                    Accept::Unix(tokio::net::UnixListener::from_std(l)?)
                }
                #[cfg(target_os = "linux")]
                Listener::Handed(netns::Arrival(sock)) => {
                    rustix::io::ioctl_fionbio(&sock, true)?;
                    // SAFETY: `sock` is an owned, valid descriptor, moved
                    // into the AsyncFd, which closes it only when dropped.
                    Accept::Handed(unsafe { tokio::io::unix::AsyncFd::register(sock)? })
                }
                #[cfg(target_os = "linux")]
                Listener::Connections(sock) => {
                    rustix::io::ioctl_fionbio(&sock, true)?;
                    // SAFETY: as above.
                    Accept::Connections(unsafe { tokio::io::unix::AsyncFd::register(sock)? })
                }
            }
        };
        let thread = std::thread::Builder::new()
            .name("hull-proxy".into())
            .spawn(move || {
                rt.block_on(async move {
                    tokio::select! {
                        _ = stopped => {}
                        _ = listener.serve(accepting) => {}
                    }
                });
                // Tunnels still open end with the runtime.
                rt.shutdown_timeout(std::time::Duration::from_millis(200));
            })?;
        Ok(Proxy {
            shared,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The decisions so far.
    pub fn audit(&self) -> &Audit {
        &self.shared.audit
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

enum Accept {
    Tcp(tokio::net::TcpListener),
    #[cfg(unix)]
    Unix(tokio::net::UnixListener),
    #[cfg(target_os = "linux")]
    Handed(tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>),
    #[cfg(target_os = "linux")]
    Connections(tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>),
}

impl Accept {
    async fn serve(self, shared: Arc<Shared>) {
        #[cfg(target_os = "linux")]
        let this = match self {
            Accept::Handed(sock) => match Self::arrival(sock).await {
                Some(l) => Accept::Tcp(l),
                None => return,
            },
            Accept::Connections(sock) => return Self::connections(sock, shared).await,
            other => other,
        };
        #[cfg(not(target_os = "linux"))]
        let this = self;
        this.serve_accepted(shared).await
    }

    /// Serves each connection sent over `sock` until its sender is gone.
    #[cfg(target_os = "linux")]
    async fn connections(
        sock: tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>,
        shared: Arc<Shared>,
    ) {
        use std::os::fd::AsFd;
        loop {
            let Ok(mut ready) = sock.readable().await else {
                return;
            };
            let fd = match ready.try_io(|s| crate::exec::fds::try_receive_fd(s.get_ref().as_fd())) {
                Ok(Ok(Some(fd))) => fd,
                // The sender closed its end.
                Ok(Ok(None)) | Ok(Err(_)) => return,
                Err(_would_block) => continue,
            };
            let s = std::os::unix::net::UnixStream::from(fd);
            if s.set_nonblocking(true).is_err() {
                continue;
            }
            if let Ok(s) = tokio::net::UnixStream::from_std(s) {
                tokio::spawn(proxy::serve_connection(s, Arc::clone(&shared)));
            }
        }
    }

    /// Waits for the listener handed over `sock`.
    #[cfg(target_os = "linux")]
    async fn arrival(
        sock: tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>,
    ) -> Option<tokio::net::TcpListener> {
        use std::os::fd::AsFd;
        let fd = loop {
            let mut ready = sock.readable().await.ok()?;
            match ready.try_io(|s| crate::exec::fds::try_receive_fd(s.get_ref().as_fd())) {
                Ok(r) => break r.ok()??,
                Err(_would_block) => continue,
            }
        };
        let l = std::net::TcpListener::from(fd);
        l.set_nonblocking(true).ok()?;
        tokio::net::TcpListener::from_std(l).ok()
    }

    async fn serve_accepted(self, shared: Arc<Shared>) {
        loop {
            let r = match &self {
                Accept::Tcp(l) => l.accept().await.map(|(s, _)| {
                    tokio::spawn(proxy::serve_connection(s, Arc::clone(&shared)));
                }),
                #[cfg(unix)]
                Accept::Unix(l) => l.accept().await.map(|(s, _)| {
                    tokio::spawn(proxy::serve_connection(s, Arc::clone(&shared)));
                }),
                #[cfg(target_os = "linux")]
                Accept::Handed(_) | Accept::Connections(_) => return,
            };
            if let Err(e) = r {
                // EMFILE and the like: wait a moment instead of spinning.
                tracing::warn!("the proxy cannot accept: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}
