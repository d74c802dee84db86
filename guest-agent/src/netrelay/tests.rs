//! The relay against hull played by the test (frames by hand on one end
//! of a socket pair) and real TCP clients on its listener.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use hull_protocol::netmux::{decode_net, encode_net, NetFrame, WINDOW};

use super::serve;

/// hull's end of the port.
struct Hull {
    io: UnixStream,
    buf: Vec<u8>,
}

impl Hull {
    fn send(&mut self, f: NetFrame) {
        self.io.write_all(&encode_net(&f).unwrap()).unwrap();
    }

    /// The next frame, or None after `wait`.
    fn next_within(&mut self, wait: Duration) -> Option<NetFrame> {
        self.io.set_read_timeout(Some(wait)).unwrap();
        loop {
            if let Some((f, used)) = decode_net(&self.buf).unwrap() {
                self.buf.drain(..used);
                return Some(f);
            }
            let mut chunk = [0u8; 65536];
            match self.io.read(&mut chunk) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    fn next(&mut self) -> NetFrame {
        self.next_within(Duration::from_secs(5))
            .expect("a frame from the relay")
    }
}

/// A relay on a loopback listener; its port's other end, and the address.
fn relay() -> (Hull, std::net::SocketAddr) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (ours, theirs) = UnixStream::pair().unwrap();
    let out = theirs.try_clone().unwrap();
    std::thread::spawn(move || serve(l, theirs, out));
    (
        Hull {
            io: ours,
            buf: Vec::new(),
        },
        addr,
    )
}

#[test]
fn a_connection_is_a_stream_both_ways_and_ends_with_both_closes() {
    let (mut h, addr) = relay();
    for stream in [1u32, 2] {
        let mut c = TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.write_all(b"hi").unwrap();
        assert_eq!(h.next(), NetFrame::Open { stream });
        assert_eq!(
            h.next(),
            NetFrame::Data {
                stream,
                bytes: b"hi".to_vec()
            }
        );
        h.send(NetFrame::Data {
            stream,
            bytes: b"yo".to_vec(),
        });
        h.send(NetFrame::Close { stream });
        let mut got = Vec::new();
        c.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"yo");
        assert_eq!(h.next(), NetFrame::Credit { stream, bytes: 2 });
        c.shutdown(Shutdown::Write).unwrap();
        assert_eq!(h.next(), NetFrame::Close { stream });
    }
}

#[test]
fn the_relay_sends_no_more_than_hull_credits() {
    let (mut h, addr) = relay();
    let mut c = TcpStream::connect(addr).unwrap();
    let writer = std::thread::spawn(move || {
        let _ = c.write_all(&vec![7u8; 1 << 20]);
        c
    });
    assert_eq!(h.next(), NetFrame::Open { stream: 1 });
    let mut total = 0usize;
    while let Some(f) = h.next_within(Duration::from_millis(700)) {
        match f {
            NetFrame::Data { bytes, .. } => total += bytes.len(),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(total, WINDOW as usize, "sent beyond the window");
    h.send(NetFrame::Credit {
        stream: 1,
        bytes: WINDOW,
    });
    let mut more = 0usize;
    while let Some(NetFrame::Data { bytes, .. }) = h.next_within(Duration::from_millis(700)) {
        more += bytes.len();
    }
    assert_eq!(more, WINDOW as usize, "the credit did not open the window");
    h.send(NetFrame::Reset { stream: 1 });
    drop(h);
    let _ = writer.join();
}

#[test]
fn streams_are_the_guest_s_to_open() {
    let (mut h, _addr) = relay();
    h.send(NetFrame::Open { stream: 5 });
    assert_eq!(h.next(), NetFrame::Reset { stream: 5 });
}

/// The listener is made in the namespace it is given (a process's, as the
/// container's init): reachable from inside it, not from the agent's own
/// namespace, whose threads stay where they were.
#[test]
#[ignore = "needs root: enters another network namespace"]
fn the_listener_lives_in_the_namespace_it_was_made_in() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "needs root");
    let mut holder = std::process::Command::new("unshare")
        .args(["-n", "sleep", "30"])
        .spawn()
        .expect("unshare (util-linux)");
    // Until the child has entered its namespace.
    let mine = std::fs::read_link("/proc/self/ns/net").unwrap();
    let ns_path = format!("/proc/{}/ns/net", holder.id());
    let end = std::time::Instant::now() + Duration::from_secs(5);
    while std::fs::read_link(&ns_path).ok().as_ref() == Some(&mine)
        && std::time::Instant::now() < end
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    let ns = std::fs::File::open(&ns_path).unwrap();
    let l = super::listen_in(ns, "127.0.0.1:0".parse().unwrap()).unwrap();
    let port = l.local_addr().unwrap().port();
    assert_eq!(
        std::fs::read_link("/proc/thread-self/ns/net").unwrap(),
        mine
    );
    // From here: nothing listens on that port in this namespace.
    let here = TcpStream::connect(("127.0.0.1", port));
    assert!(here.is_err(), "reached from the agent's namespace");
    // From inside: the connection arrives.
    let inside = std::process::Command::new("nsenter")
        .args(["-t", &holder.id().to_string(), "-n", "python3", "-c"])
        .arg(format!(
            "import socket; socket.create_connection(('127.0.0.1', {port}), timeout=5).sendall(b'in')"
        ))
        .status()
        .unwrap();
    assert!(inside.success());
    let (mut c, _) = l.accept().unwrap();
    let mut got = Vec::new();
    c.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"in");
    let _ = holder.kill();
    let _ = holder.wait();
}
