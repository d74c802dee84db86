//! The blocking `Connection` helper over a real socketpair.

mod common;

use std::os::unix::net::UnixStream;
use std::thread;

use hull_protocol::*;

#[test]
fn hello_negotiates_and_frames_flow_both_ways() {
    let (a, b) = UnixStream::pair().unwrap();
    let peer = thread::spawn(move || {
        let mut c = Connection::new(b);
        let h = c.hello(Role::InnerAgent, "agent-test").unwrap().clone();
        assert_eq!(h.role, Role::Host);
        let (id, m) = c.recv().unwrap();
        assert_eq!((id, m), (0, Message::Ping { nonce: 7 }));
        c.send(&Message::Pong { nonce: 7 }, 0).unwrap();
        c.send(&Message::Stdout(vec![0xff; 200_000]), 3).unwrap();
    });
    let mut c = Connection::new(a);
    let h = c.hello(Role::Host, "host-test").unwrap();
    assert_eq!(h.role, Role::InnerAgent);
    assert_eq!(h.software, "agent-test");
    assert_eq!(c.version(), Some(PROTOCOL_VERSION));
    c.send(&Message::Ping { nonce: 7 }, 0).unwrap();
    assert_eq!(c.recv().unwrap(), (0, Message::Pong { nonce: 7 }));
    assert_eq!(c.recv().unwrap(), (3, Message::Stdout(vec![0xff; 200_000])));
    peer.join().unwrap();
    assert!(matches!(c.recv(), Err(ConnError::Closed)));
}

#[test]
fn version_mismatch_is_reported_to_the_peer() {
    let (a, b) = UnixStream::pair().unwrap();
    let peer = thread::spawn(move || {
        let mut w = FrameWriter::new(b.try_clone().unwrap());
        w.send(
            &Message::Hello(Hello {
                version: 99,
                min_version: 50,
                role: Role::InnerAgent,
                software: "future".into(),
            }),
            0,
        )
        .unwrap();
        let mut r = FrameReader::new(b);
        let _their_hello = r.recv().unwrap();
        r.recv().unwrap()
    });
    let mut c = Connection::new(a);
    let e = c.hello(Role::Host, "host").unwrap_err();
    assert!(matches!(e, ConnError::Version(_)), "{e}");
    drop(c);
    let f = peer.join().unwrap();
    match f.message {
        Message::Error { code, .. } => assert_eq!(code, ErrorCode::VersionMismatch),
        other => panic!("peer got {other:?}"),
    }
}

#[test]
fn eof_mid_frame_is_truncated_not_closed() {
    use std::io::Write;
    let (a, mut b) = UnixStream::pair().unwrap();
    let bytes = encode(&Message::Stdout(vec![1; 100]), 1).unwrap();
    b.write_all(&bytes[..50]).unwrap();
    drop(b);
    let mut r = FrameReader::new(a);
    assert!(matches!(
        r.recv(),
        Err(ConnError::Truncated { buffered: 50 })
    ));
}

#[test]
fn first_frame_must_be_hello() {
    let (a, b) = UnixStream::pair().unwrap();
    let peer = thread::spawn(move || {
        let mut w = FrameWriter::new(b.try_clone().unwrap());
        w.send(&Message::Ping { nonce: 1 }, 0).unwrap();
        let mut r = FrameReader::new(b);
        let _hello = r.recv().unwrap();
        r.recv().unwrap()
    });
    let mut c = Connection::new(a);
    assert!(matches!(
        c.hello(Role::Host, "h"),
        Err(ConnError::NoHello { got: "ping" })
    ));
    drop(c);
    assert!(matches!(
        peer.join().unwrap().message,
        Message::Error {
            code: ErrorCode::BadRequest,
            ..
        }
    ));
}
