//! hull's end of tier 3's network channel (`hull_protocol::netmux`): each
//! stream the guest opens on the port becomes one connection to the run's
//! proxy, which checks it as on the other tiers.
//!
//! Every byte on the port is the guest's, so it is hostile: frames are
//! checked before their payload, a stream the guest overruns (data beyond
//! its window, more streams than allowed, an id reused) is reset, and what
//! hull holds for the guest is at most the window per open stream. Bytes
//! from the proxy go back under the guest's window: a guest that stops
//! crediting stops its own downloads, nothing else.
//!
//! `vm::net_channel` runs it for a run whose policy has an allow list,
//! between the VM's `net.0` port and the run's proxy process.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use hull_protocol::netmux::{
    decode_net, encode_net, NetError, NetFrame, Streams, MAX_DATA, NET_HEADER_LEN, WINDOW,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, Semaphore};

/// Why the channel as a whole ended.
#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    #[error("the network channel's framing broke: {0}")]
    Framing(#[from] NetError),
    #[error("the network channel: {0}")]
    Io(#[from] std::io::Error),
}

/// Frames waiting to be written to the port, at most.
const OUTBOX: usize = 256;

/// What the reader keeps of one open stream.
struct Open {
    /// Bytes from the guest, for the stream's task (bounded by the window:
    /// the accounting refuses more before anything is queued).
    inbound: mpsc::UnboundedSender<Inbound>,
    /// Bytes hull may still send the guest on this stream.
    window: Arc<Semaphore>,
    task: tokio::task::JoinHandle<()>,
}

enum Inbound {
    Data(Vec<u8>),
    Close,
}

/// Serves the channel on `port` until the guest closes it: each `Open`
/// gets a connection from `connect` (to the run's proxy).
pub async fn serve<P, C, F, S>(port: P, connect: C) -> Result<(), BridgeError>
where
    P: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    C: Fn() -> F + Send + Sync + 'static,
    F: Future<Output = std::io::Result<S>> + Send + 'static,
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut reader, mut writer) = tokio::io::split(port);
    let (out_tx, mut out_rx) = mpsc::channel::<NetFrame>(OUTBOX);
    let writing = tokio::spawn(async move {
        while let Some(f) = out_rx.recv().await {
            let bytes = encode_net(&f)?;
            writer.write_all(&bytes).await?;
        }
        writer.flush().await?;
        Ok::<(), BridgeError>(())
    });
    let accounts = Arc::new(Mutex::new(Streams::new()));
    let connect = Arc::new(connect);
    let mut open: HashMap<u32, Open> = HashMap::new();
    let mut buf: Vec<u8> = Vec::with_capacity(NET_HEADER_LEN + MAX_DATA);
    let mut chunk = vec![0u8; NET_HEADER_LEN + MAX_DATA];
    let result = 'read: loop {
        // Whole frames first; the buffer never holds more than one frame
        // and a read.
        loop {
            let (frame, used) = match decode_net(&buf) {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => break 'read Err(BridgeError::Framing(e)),
            };
            buf.drain(..used);
            handle(frame, &mut open, &accounts, &out_tx, &connect).await;
        }
        match reader.read(&mut chunk).await {
            Ok(0) => break Ok(()),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) => break Err(BridgeError::Io(e)),
        }
    };
    for (_, s) in open.drain() {
        s.task.abort();
    }
    drop(out_tx);
    let _ = writing.await;
    result
}

async fn handle<C, F, S>(
    frame: NetFrame,
    open: &mut HashMap<u32, Open>,
    accounts: &Arc<Mutex<Streams>>,
    out: &mpsc::Sender<NetFrame>,
    connect: &Arc<C>,
) where
    C: Fn() -> F + Send + Sync + 'static,
    F: Future<Output = std::io::Result<S>> + Send + 'static,
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let reset = |stream| NetFrame::Reset { stream };
    match frame {
        NetFrame::Open { stream } => {
            // Streams whose task ended (closed both ways) leave the map
            // here, so it holds no more than the accounting's open streams.
            open.retain(|_, s| !s.task.is_finished());
            let opened = lock(accounts).open(stream);
            if let Err(e) = opened {
                tracing::debug!("network channel: refused stream {stream}: {e}");
                // Reuse of an open id: that stream goes too.
                if let Some(s) = open.remove(&stream) {
                    s.task.abort();
                    lock(accounts).forget(stream);
                }
                let _ = out.send(reset(stream)).await;
                return;
            }
            let (tx, rx) = mpsc::unbounded_channel();
            let window = Arc::new(Semaphore::new(WINDOW as usize));
            let task = tokio::spawn(carry(
                stream,
                rx,
                Arc::clone(&window),
                Arc::clone(accounts),
                out.clone(),
                connect(),
            ));
            open.insert(
                stream,
                Open {
                    inbound: tx,
                    window,
                    task,
                },
            );
        }
        NetFrame::Data { stream, bytes } => {
            let counted = lock(accounts).received(stream, bytes.len());
            match (counted, open.get(&stream)) {
                (Err(e), _) => {
                    tracing::debug!("network channel: stream {stream}: {e}");
                    end(stream, open, accounts);
                    let _ = out.send(reset(stream)).await;
                }
                (Ok(()), Some(s)) => {
                    let _ = s.inbound.send(Inbound::Data(bytes));
                }
                // A stream hull already reset: dropped.
                (Ok(()), None) => {}
            }
        }
        NetFrame::Credit { stream, bytes } => {
            let credited = lock(accounts).credited(stream, bytes);
            match (credited, open.get(&stream)) {
                (Err(e), _) => {
                    tracing::debug!("network channel: stream {stream}: {e}");
                    end(stream, open, accounts);
                    let _ = out.send(reset(stream)).await;
                }
                (Ok(()), Some(s)) => s.window.add_permits(bytes as usize),
                (Ok(()), None) => {}
            }
        }
        NetFrame::Close { stream } => {
            if let Some(s) = open.get(&stream) {
                let _ = s.inbound.send(Inbound::Close);
            }
        }
        NetFrame::Reset { stream } => end(stream, open, accounts),
    }
}

/// Ends a stream on hull's side: its task and its accounting.
fn end(stream: u32, open: &mut HashMap<u32, Open>, accounts: &Arc<Mutex<Streams>>) {
    if let Some(s) = open.remove(&stream) {
        s.task.abort();
    }
    lock(accounts).forget(stream);
}

fn lock(m: &Mutex<Streams>) -> std::sync::MutexGuard<'_, Streams> {
    // A panic while holding it cannot leave the accounting half-updated in
    // a way that grants more than a window: take it as it is.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One stream: the guest's bytes to the proxy (credited back as written),
/// the proxy's bytes to the guest (as its window allows).
async fn carry<F, S>(
    stream: u32,
    mut inbound: mpsc::UnboundedReceiver<Inbound>,
    window: Arc<Semaphore>,
    accounts: Arc<Mutex<Streams>>,
    out: mpsc::Sender<NetFrame>,
    connect: F,
) where
    F: Future<Output = std::io::Result<S>>,
    S: AsyncRead + AsyncWrite + Unpin,
{
    let conn = match connect.await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!("network channel: cannot reach the proxy: {e}");
            lock(&accounts).forget(stream);
            let _ = out.send(NetFrame::Reset { stream }).await;
            return;
        }
    };
    let (mut from_proxy, mut to_proxy) = tokio::io::split(conn);
    let up = async {
        while let Some(m) = inbound.recv().await {
            match m {
                Inbound::Data(bytes) => {
                    if to_proxy.write_all(&bytes).await.is_err() {
                        return false;
                    }
                    let credit = lock(&accounts).consumed(stream, bytes.len() as u32);
                    if let Some(c) = credit {
                        if out.send(c).await.is_err() {
                            return false;
                        }
                    }
                }
                Inbound::Close => {
                    let _ = to_proxy.shutdown().await;
                    return true;
                }
            }
        }
        true
    };
    let down = async {
        let mut buf = vec![0u8; MAX_DATA];
        loop {
            let n = match from_proxy.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            // Wait for the guest's window; a guest that never credits
            // stalls this stream only.
            let Ok(permits) = window.acquire_many(n as u32).await else {
                return false;
            };
            permits.forget();
            if lock(&accounts).sent(stream, n).is_err() {
                return false;
            }
            let data = NetFrame::Data {
                stream,
                bytes: buf[..n].to_vec(),
            };
            if out.send(data).await.is_err() {
                return false;
            }
        }
        out.send(NetFrame::Close { stream }).await.is_ok()
    };
    let (a, b) = tokio::join!(up, down);
    if !(a && b) {
        let _ = out.send(NetFrame::Reset { stream }).await;
    }
    lock(&accounts).forget(stream);
}

#[cfg(test)]
mod tests;
