//! The guest's end of tier 3's network channel (`hull_protocol::netmux`):
//! each connection accepted on the container's loopback listener (where
//! `HTTP_PROXY` points) becomes one stream on the port, which hull connects
//! to the run's proxy. The guest decides nothing: it carries bytes, within
//! the windows both ends keep.
//!
//! Threads, as the rest of the agent: one accepting, one reading the port,
//! and per stream one carrying the connection's bytes up (as hull's window
//! allows) and one writing hull's bytes down (crediting each chunk once the
//! connection took it, so a client that stops reading stalls its own
//! stream, never the port).
//!
//! `outer::network` starts it when a `Configure` asks for the network,
//! with the listener made in the container's network namespace.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use hull_protocol::netmux::{
    decode_net, encode_net, NetFrame, Streams, MAX_DATA, MAX_STREAMS, NET_HEADER_LEN,
};

/// What the streams share: the accounting, the port's writer and each
/// stream's queue of hull's bytes.
struct Shared<W> {
    state: Mutex<State>,
    /// Signalled when a window opens or a stream ends.
    changed: Condvar,
    port: Mutex<W>,
}

struct State {
    accounts: Streams,
    down: HashMap<u32, mpsc::Sender<Down>>,
    /// Streams one of whose directions has closed.
    half_closed: std::collections::HashSet<u32>,
    next: u32,
}

enum Down {
    Data(Vec<u8>),
    Close,
}

impl<W: Write> Shared<W> {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn send(&self, f: &NetFrame) -> io::Result<()> {
        let bytes = encode_net(f).map_err(io::Error::other)?;
        let mut port = self.port.lock().unwrap_or_else(|p| p.into_inner());
        port.write_all(&bytes)?;
        port.flush()
    }

    /// Ends a stream on this side (its queue and accounting).
    fn forget(&self, stream: u32) {
        let mut st = self.lock();
        st.accounts.forget(stream);
        st.down.remove(&stream);
        st.half_closed.remove(&stream);
        self.changed.notify_all();
    }

    /// One direction of `stream` closed; the stream ends with the second.
    fn half_done(&self, stream: u32) {
        let both = {
            let mut st = self.lock();
            !st.half_closed.insert(stream)
        };
        if both {
            self.forget(stream);
        }
    }
}

/// Carries every connection accepted on `listener` over the port (read
/// from `port_in`, written to `port_out`) until the port closes.
pub fn serve<R, W>(listener: TcpListener, mut port_in: R, port_out: W) -> io::Result<()>
where
    R: Read,
    W: Write + Send + 'static,
{
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            accounts: Streams::new(),
            down: HashMap::new(),
            half_closed: Default::default(),
            next: 1,
        }),
        changed: Condvar::new(),
        port: Mutex::new(port_out),
    });
    {
        let shared = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("net-accept".into())
            .spawn(move || accept(listener, &shared))?;
    }
    let mut buf: Vec<u8> = Vec::with_capacity(NET_HEADER_LEN + MAX_DATA);
    let mut chunk = vec![0u8; NET_HEADER_LEN + MAX_DATA];
    loop {
        while let Some((frame, used)) = decode_net(&buf).map_err(io::Error::other)? {
            buf.drain(..used);
            from_hull(frame, &shared)?;
        }
        let n = port_in.read(&mut chunk)?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// One frame from hull.
fn from_hull<W: Write>(frame: NetFrame, shared: &Shared<W>) -> io::Result<()> {
    match frame {
        NetFrame::Data { stream, bytes } => {
            let mut st = shared.lock();
            if st.accounts.received(stream, bytes.len()).is_err() {
                // hull broke the window: end the stream.
                drop(st);
                shared.forget(stream);
                return shared.send(&NetFrame::Reset { stream });
            }
            if let Some(q) = st.down.get(&stream) {
                let _ = q.send(Down::Data(bytes));
            }
        }
        NetFrame::Credit { stream, bytes } => {
            let mut st = shared.lock();
            if st.accounts.credited(stream, bytes).is_err() {
                drop(st);
                shared.forget(stream);
                return shared.send(&NetFrame::Reset { stream });
            }
            shared.changed.notify_all();
        }
        NetFrame::Close { stream } => {
            if let Some(q) = shared.lock().down.get(&stream) {
                let _ = q.send(Down::Close);
            }
        }
        NetFrame::Reset { stream } => shared.forget(stream),
        // Streams are the guest's to open.
        NetFrame::Open { stream } => shared.send(&NetFrame::Reset { stream })?,
    }
    Ok(())
}

fn accept<W: Write + Send + 'static>(listener: TcpListener, shared: &Arc<Shared<W>>) {
    for conn in listener.incoming() {
        let Ok(conn) = conn else {
            std::thread::sleep(std::time::Duration::from_millis(50));
            continue;
        };
        let (tx, rx) = mpsc::channel();
        let stream = {
            let mut st = shared.lock();
            if st.accounts.len() >= MAX_STREAMS {
                // Refused at once: the client sees the connection close.
                continue;
            }
            let id = st.next;
            st.next = st.next.checked_add(1).unwrap_or(1);
            if st.accounts.open(id).is_err() {
                continue;
            }
            st.down.insert(id, tx);
            id
        };
        if shared.send(&NetFrame::Open { stream }).is_err() {
            return;
        }
        let Ok(down_conn) = conn.try_clone() else {
            shared.forget(stream);
            let _ = shared.send(&NetFrame::Reset { stream });
            continue;
        };
        let s = Arc::clone(shared);
        let _ = std::thread::Builder::new()
            .name(format!("net-up-{stream}"))
            .spawn(move || up(stream, conn, &s));
        let s = Arc::clone(shared);
        let _ = std::thread::Builder::new()
            .name(format!("net-down-{stream}"))
            .spawn(move || down(stream, down_conn, rx, &s));
    }
}

/// The connection's bytes to hull, as hull's window allows.
fn up<W: Write>(stream: u32, mut conn: TcpStream, shared: &Shared<W>) {
    let mut buf = vec![0u8; MAX_DATA];
    loop {
        let n = match conn.read(&mut buf) {
            Ok(0) => {
                let _ = shared.send(&NetFrame::Close { stream });
                shared.half_done(stream);
                return;
            }
            Ok(n) => n,
            Err(_) => break,
        };
        let mut at = 0;
        while at < n {
            // Wait for room in the window (or the stream's end).
            let take = {
                let mut st = shared.lock();
                loop {
                    if !st.accounts.is_open(stream) {
                        return;
                    }
                    let room = st.accounts.sendable(stream) as usize;
                    if room > 0 {
                        let take = room.min(n - at);
                        if st.accounts.sent(stream, take).is_err() {
                            return;
                        }
                        break take;
                    }
                    st = shared.changed.wait(st).unwrap_or_else(|p| p.into_inner());
                }
            };
            let data = NetFrame::Data {
                stream,
                bytes: buf[at..at + take].to_vec(),
            };
            if shared.send(&data).is_err() {
                return;
            }
            at += take;
        }
    }
    shared.forget(stream);
    let _ = shared.send(&NetFrame::Reset { stream });
}

/// hull's bytes to the connection, each chunk credited once written.
fn down<W: Write>(stream: u32, mut conn: TcpStream, rx: mpsc::Receiver<Down>, shared: &Shared<W>) {
    for m in rx {
        match m {
            Down::Data(bytes) => {
                if conn.write_all(&bytes).is_err() {
                    break;
                }
                let credit = shared.lock().accounts.consumed(stream, bytes.len() as u32);
                if let Some(c) = credit {
                    if shared.send(&c).is_err() {
                        return;
                    }
                }
            }
            Down::Close => {
                let _ = conn.shutdown(Shutdown::Write);
                shared.half_done(stream);
                return;
            }
        }
    }
    // The stream ended (reset) or the client went away.
    let _ = conn.shutdown(Shutdown::Both);
}

/// A TCP listener on `addr` inside the network namespace `netns` (the
/// container's, from `/proc/PID/ns/net` of its init), with that
/// namespace's `lo` brought up first. Made on a thread of its own that
/// enters the namespace and ends: a socket stays in the namespace it was
/// made in, and no thread of the agent stays there.
pub fn listen_in(netns: std::fs::File, addr: std::net::SocketAddr) -> io::Result<TcpListener> {
    std::thread::Builder::new()
        .name("net-listen".into())
        .spawn(move || {
            rustix::thread::move_into_link_name_space(
                std::os::fd::AsFd::as_fd(&netns),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )?;
            loopback_up()?;
            TcpListener::bind(addr)
        })?
        .join()
        .map_err(|_| io::Error::other("the thread entering the network namespace panicked"))?
}

/// `struct ifreq` as SIOCGIFFLAGS/SIOCSIFFLAGS use it.
#[repr(C)]
struct IfreqFlags {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// Brings this thread's network namespace's `lo` up.
fn loopback_up() -> io::Result<()> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    // SAFETY: socket(2) with integer arguments; owned from here.
    let s = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if s < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `s` was just made and nothing else owns it.
    let s = unsafe { OwnedFd::from_raw_fd(s) };
    let mut req = IfreqFlags {
        name: [0; libc::IFNAMSIZ],
        flags: 0,
        _pad: [0; 22],
    };
    req.name[..2].copy_from_slice(b"lo");
    // SAFETY: ioctls on a valid socket with a pointer to a local, correctly
    // laid out ifreq that outlives the calls.
    unsafe {
        if libc::ioctl(s.as_raw_fd(), libc::SIOCGIFFLAGS as _, &mut req) != 0 {
            return Err(io::Error::last_os_error());
        }
        req.flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(s.as_raw_fd(), libc::SIOCSIFFLAGS as _, &req) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
