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
