//! The channel against a guest played by the test (frames written and read
//! by hand on one end of an in-memory duplex) and a loopback echo server in
//! the proxy's place.

use std::time::Duration;

use hull_protocol::netmux::{decode_net, encode_net, NetFrame, MAX_DATA, MAX_STREAMS, WINDOW};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::serve;

/// The guest's end: sends frames, reads the next one.
struct Guest {
    io: DuplexStream,
    buf: Vec<u8>,
}

impl Guest {
    async fn send(&mut self, f: NetFrame) {
        self.io.write_all(&encode_net(&f).unwrap()).await.unwrap();
    }

    /// The next frame from hull (None after 2 s).
    async fn next(&mut self) -> Option<NetFrame> {
        loop {
            if let Some((f, used)) = decode_net(&self.buf).unwrap() {
                self.buf.drain(..used);
                return Some(f);
            }
            let mut chunk = [0u8; 4096];
            let n = tokio::time::timeout(Duration::from_secs(2), self.io.read(&mut chunk))
                .await
                .ok()?
                .ok()?;
            if n == 0 {
                return None;
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

/// A bridge whose streams reach a loopback echo server.
async fn bridge() -> Guest {
    let echo = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = echo.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = echo.accept().await else {
                break;
            };
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    let (guest, host) = tokio::io::duplex(1 << 20);
    tokio::spawn(serve(host, move || tokio::net::TcpStream::connect(addr)));
    Guest {
        io: guest,
        buf: Vec::new(),
    }
}

#[tokio::test]
async fn a_stream_carries_both_ways_and_credits_what_it_took() {
    let mut g = bridge().await;
    g.send(NetFrame::Open { stream: 1 }).await;
    g.send(NetFrame::Data {
        stream: 1,
        bytes: b"hello".to_vec(),
    })
    .await;
    let mut got = Vec::new();
    let mut credited = 0;
    while got.len() < 5 || credited < 5 {
        match g.next().await.expect("a frame") {
            NetFrame::Data { stream: 1, bytes } => got.extend(bytes),
            NetFrame::Credit { stream: 1, bytes } => credited += bytes,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!((got.as_slice(), credited), (&b"hello"[..], 5));
    // Half close: the echo server sees EOF and closes; hull says Close.
    g.send(NetFrame::Close { stream: 1 }).await;
    assert_eq!(g.next().await, Some(NetFrame::Close { stream: 1 }));
}

#[tokio::test]
async fn a_guest_beyond_its_window_or_its_streams_is_reset() {
    // A proxy that never answers: hull takes nothing of what the guest
    // sends, so the window is all the guest can make it hold.
    let (guest, host) = tokio::io::duplex(1 << 20);
    tokio::spawn(serve(host, || {
        std::future::pending::<std::io::Result<tokio::net::TcpStream>>()
    }));
    let mut g = Guest {
        io: guest,
        buf: Vec::new(),
    };
    g.send(NetFrame::Open { stream: 7 }).await;
    // An id reused while open: reset.
    g.send(NetFrame::Open { stream: 7 }).await;
    assert_eq!(g.next().await, Some(NetFrame::Reset { stream: 7 }));
    // More than the window: the stream is reset.
    g.send(NetFrame::Open { stream: 9 }).await;
    let chunk = vec![b'x'; MAX_DATA];
    let frames = WINDOW as usize / MAX_DATA + 8;
    let mut reset = false;
    for _ in 0..frames {
        g.send(NetFrame::Data {
            stream: 9,
            bytes: chunk.clone(),
        })
        .await;
    }
    for _ in 0..(frames * 4) {
        match g.next().await {
            Some(NetFrame::Reset { stream: 9 }) => {
                reset = true;
                break;
            }
            Some(_) => {}
            None => break,
        }
    }
    assert!(reset, "the flooding stream was not reset");
}

#[tokio::test]
async fn no_more_than_max_streams_are_open_at_once() {
    let mut g = bridge().await;
    for id in 1..=MAX_STREAMS as u32 {
        g.send(NetFrame::Open { stream: id }).await;
    }
    g.send(NetFrame::Open { stream: 100_000 }).await;
    assert_eq!(g.next().await, Some(NetFrame::Reset { stream: 100_000 }));
    // Data for a stream never opened is dropped without an answer; the
    // channel still works.
    g.send(NetFrame::Data {
        stream: 555_555,
        bytes: vec![1],
    })
    .await;
    g.send(NetFrame::Data {
        stream: 3,
        bytes: b"ok".to_vec(),
    })
    .await;
    loop {
        match g.next().await.expect("a frame") {
            NetFrame::Data { stream: 3, bytes } => {
                assert_eq!(bytes, b"ok");
                break;
            }
            NetFrame::Credit { .. } => {}
            other => panic!("{other:?}"),
        }
    }
}

/// This process's resident memory, in bytes.
fn resident() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap();
    kb * 1024
}

/// A guest that floods the port: every stream it may open sent eight
/// times its window, to a proxy that takes nothing. hull holds at most the
/// windows of the open streams (`MAX_STREAMS * WINDOW`, 32 MiB; each
/// overrun stream is reset and its bytes dropped): its memory grows by far
/// less than the 256 MiB the guest sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_guest_does_not_grow_hull_past_the_windows() {
    let (guest, host) = tokio::io::duplex(1 << 20);
    tokio::spawn(serve(host, || {
        std::future::pending::<std::io::Result<tokio::net::TcpStream>>()
    }));
    let (mut from_hull, mut to_hull) = tokio::io::split(guest);
    // hull's answers (resets) are read, or its writer would stop it.
    tokio::spawn(async move {
        let mut sink = vec![0u8; 1 << 16];
        while from_hull.read(&mut sink).await.is_ok_and(|n| n > 0) {}
    });
    let before = resident();
    let mut peak = before;
    let chunk = vec![b'x'; MAX_DATA];
    let frames_per_stream = 8 * WINDOW as usize / MAX_DATA;
    let mut sent: u64 = 0;
    for id in 1..=MAX_STREAMS as u32 {
        let open = encode_net(&NetFrame::Open { stream: id }).unwrap();
        to_hull.write_all(&open).await.unwrap();
        let data = encode_net(&NetFrame::Data {
            stream: id,
            bytes: chunk.clone(),
        })
        .unwrap();
        for _ in 0..frames_per_stream {
            to_hull.write_all(&data).await.unwrap();
            sent += MAX_DATA as u64;
        }
        peak = peak.max(resident());
    }
    // What hull read last is handled before the peak is taken.
    tokio::time::sleep(Duration::from_millis(200)).await;
    peak = peak.max(resident());
    let bound = (MAX_STREAMS as u64) * u64::from(WINDOW);
    assert_eq!(sent, 8 * bound);
    let grew = peak.saturating_sub(before);
    assert!(
        grew < bound * 2,
        "hull grew by {} MiB after a flood of {} MiB (bound {} MiB)",
        grew >> 20,
        sent >> 20,
        bound >> 20
    );
}

#[tokio::test]
async fn a_broken_frame_ends_the_channel() {
    let (mut guest, host) = tokio::io::duplex(4096);
    let served = tokio::spawn(serve(host, || async {
        Err::<tokio::net::TcpStream, _>(std::io::Error::other("unused"))
    }));
    guest.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
    let r = tokio::time::timeout(Duration::from_secs(2), served)
        .await
        .expect("the bridge did not end")
        .unwrap();
    assert!(r.is_err(), "{r:?}");
}

/// A loopback origin answering `hello` to every request and reporting
/// each request's first line, and a proxy process (`hull __net-proxy
/// --connections-fd`) allowing `pkgs.test` on its port (fixed to 127.0.0.1;
/// `other.test` too, not allowed), fed by the returned [`Feed`].
#[cfg(target_os = "linux")]
struct Proxied {
    port: u16,
    seen: std::sync::mpsc::Receiver<String>,
    proxy: std::process::Child,
    feed: std::sync::Arc<crate::helper::Feed>,
    _dir: tempfile::TempDir,
}

#[cfg(target_os = "linux")]
impl Proxied {
    fn start() -> Proxied {
        use std::io::{Read, Write};
        use std::os::fd::AsRawFd;
        let origin = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = origin.local_addr().unwrap().port();
        let (seen_tx, seen) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for s in origin.incoming() {
                let Ok(mut s) = s else { break };
                let mut buf = [0u8; 4096];
                let n = s.read(&mut buf).unwrap_or(0);
                let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                let _ = seen_tx.send(text.lines().next().unwrap_or("").to_string());
                let _ = s.write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: close\r\n\r\nhello",
                );
            }
        });
        let dir = tempfile::tempdir().unwrap();
        let pol = dir.path().join("net.toml");
        std::fs::write(
            &pol,
            format!(
                "version = 1\n[net]\nmode = \"allowlist\"\nallow = [\"pkgs.test\"]\nports = [{port}]\n\
                 hosts = {{ \"pkgs.test\" = \"127.0.0.1\", \"other.test\" = \"127.0.0.1\" }}\n\
                 allow_private = [\"127.0.0.1/32\"]\n"
            ),
        )
        .unwrap();
        let (feed, input) = crate::helper::Feed::pair().unwrap();
        let crate::helper::Input::Connections(theirs) = input else {
            unreachable!()
        };
        // Passed to the proxy: not close-on-exec in this (test) process.
        // SAFETY: fcntl on a descriptor this test owns.
        let r = unsafe { libc::fcntl(theirs.as_raw_fd(), libc::F_SETFD, 0) };
        assert_eq!(r, 0);
        let proxy = std::process::Command::new(hull_tests::hull_bin())
            .args(["__net-proxy", "--policy"])
            .arg(&pol)
            .args(["--connections-fd", &theirs.as_raw_fd().to_string()])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        drop(theirs);
        Proxied {
            port,
            seen,
            proxy,
            feed: std::sync::Arc::new(feed),
            _dir: dir,
        }
    }

    /// A bridge on `host` whose streams go to the proxy.
    fn bridge<P>(&self, host: P)
    where
        P: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let feed = std::sync::Arc::clone(&self.feed);
        tokio::spawn(serve(host, move || {
            let c = feed.connect();
            async move { c }
        }));
    }

    /// The origin saw exactly the one allowed request; the proxy ends with
    /// its stdin.
    fn finish(mut self) {
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(
            self.seen.try_iter().collect::<Vec<_>>(),
            vec!["GET /x HTTP/1.1".to_string()]
        );
        drop(self.proxy.stdin.take());
        let st = self.proxy.wait().unwrap();
        assert!(st.success(), "{st:?}");
    }
}

/// The host's whole side, with the real proxy process: a guest stream to
/// an allowed name arrives at a loopback origin through `hull __net-proxy
/// --connections-fd` (fed by [`crate::helper::Feed`]); a stream to a
/// name not allowed gets the proxy's 403 and the origin sees nothing.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guest_streams_reach_the_proxy_process_and_its_checks() {
    let p = Proxied::start();
    let port = p.port;
    let (guest, host) = tokio::io::duplex(1 << 20);
    p.bridge(host);
    let mut g = Guest {
        io: guest,
        buf: Vec::new(),
    };
    for (stream, host) in [(1u32, "pkgs.test"), (2, "other.test")] {
        g.send(NetFrame::Open { stream }).await;
        g.send(NetFrame::Data {
            stream,
            bytes: format!(
                "GET http://{host}:{port}/x HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n"
            )
            .into_bytes(),
        })
        .await;
    }
    let mut answers: std::collections::BTreeMap<u32, Vec<u8>> = Default::default();
    let mut closed = 0;
    while closed < 2 {
        match g.next().await.expect("a frame from hull") {
            NetFrame::Data { stream, bytes } => answers.entry(stream).or_default().extend(bytes),
            NetFrame::Close { .. } => closed += 1,
            NetFrame::Credit { .. } => {}
            other => panic!("{other:?}"),
        }
    }
    let text = |s| String::from_utf8_lossy(&answers[&s]).into_owned();
    assert!(
        text(1).starts_with("HTTP/1.1 200") && text(1).ends_with("hello"),
        "{}",
        text(1)
    );
    assert!(
        text(2).starts_with("HTTP/1.1 403")
            && text(2).to_ascii_lowercase().contains("x-hull-refused"),
        "{}",
        text(2)
    );
    p.finish();
}

/// Both ends of the channel, with real clients: curl, told the guest
/// relay's listener as its proxy (as `HTTP_PROXY` will in the container),
/// through `hull-agent`'s relay, the port (a socket pair here, the
/// virtio-serial port in the VM), hull's bridge and the proxy process, to
/// the origin; a name not allowed gets the 403.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_through_both_ends_of_the_channel() {
    let p = Proxied::start();
    let port = p.port;
    let (guest_end, host_end) = std::os::unix::net::UnixStream::pair().unwrap();
    host_end.set_nonblocking(true).unwrap();
    p.bridge(tokio::net::UnixStream::from_std(host_end).unwrap());
    let relay = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let relay_addr = relay.local_addr().unwrap();
    let out = guest_end.try_clone().unwrap();
    std::thread::spawn(move || hull_agent::netrelay::serve(relay, guest_end, out));
    let curl = |host: &str| {
        let url = format!("http://{host}:{port}/x");
        let proxy = format!("http://{relay_addr}");
        tokio::task::spawn_blocking(move || {
            std::process::Command::new("curl")
                .args(["-sS", "-m", "10", "-D", "-", "-x", &proxy, &url])
                .output()
                .expect("curl (scripts/setup.sh --test installs it)")
        })
    };
    let ok = curl("pkgs.test").await.unwrap();
    let out = String::from_utf8_lossy(&ok.stdout);
    assert!(
        out.starts_with("HTTP/1.1 200") && out.ends_with("hello"),
        "{out} {}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let refused = curl("other.test").await.unwrap();
    let out = String::from_utf8_lossy(&refused.stdout);
    assert!(out.starts_with("HTTP/1.1 403"), "{out}");
    p.finish();
}
