//! The network the policy allows: hull's egress proxy, run on the host for
//! the length of a run, and its audit.

pub mod audit;
pub mod proxy;
pub mod relay;
pub mod sni;

use std::sync::Arc;

pub use audit::Audit;
pub use proxy::Shared;

/// Where the proxy listens.
#[derive(Debug)]
pub enum Listener {
    Tcp(std::net::TcpListener),
    #[cfg(unix)]
    Unix(std::os::unix::net::UnixListener),
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
}

impl Accept {
    async fn serve(self, shared: Arc<Shared>) {
        loop {
            let r = match &self {
                Accept::Tcp(l) => l.accept().await.map(|(s, _)| {
                    tokio::spawn(proxy::serve_connection(s, Arc::clone(&shared)));
                }),
                #[cfg(unix)]
                Accept::Unix(l) => l.accept().await.map(|(s, _)| {
                    tokio::spawn(proxy::serve_connection(s, Arc::clone(&shared)));
                }),
            };
            if let Err(e) = r {
                // EMFILE and the like: wait a moment instead of spinning.
                tracing::warn!("the proxy cannot accept: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}
