//! Hostile input: every malformed stream is rejected with the right error,
//! without allocating for an announced length, and the decoder stays poisoned.

mod common;

use common::*;
use hull_protocol::*;

fn first_error(bytes: &[u8]) -> DecodeError {
    match decode_all(bytes) {
        Err(e) => e,
        Ok(frames) => panic!("accepted malformed input as {frames:?}"),
    }
}

#[test]
fn bad_magic_is_rejected_early() {
    let mut d = Decoder::new();
    d.feed(b"HUX").unwrap();
    let e = d.next_frame().unwrap_err();
    assert!(matches!(e, DecodeError::BadMagic { .. }), "{e}");
    assert_eq!(e.code(), ErrorCode::BadFrame);
    // A correct prefix is just "need more bytes".
    let mut d = Decoder::new();
    d.feed(b"HU").unwrap();
    assert_eq!(d.next_frame().unwrap(), None);
}

#[test]
fn garbage_is_rejected() {
    let e = first_error(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(matches!(e, DecodeError::BadMagic { .. }), "{e}");
}

#[test]
fn unknown_kind_is_rejected() {
    for kind in [0u16, 8, 15, 27, 0xffff] {
        let e = first_error(&raw_frame(kind, 0, 0, b""));
        assert_eq!(e, DecodeError::UnknownKind { kind });
        assert_eq!(e.code(), ErrorCode::UnknownKind);
    }
}

#[test]
fn unknown_flags_are_rejected() {
    for flags in [1u16, 0x8000, 0xffff] {
        let e = first_error(&raw_frame(Kind::Kill as u16, flags, 1, b""));
        assert_eq!(e, DecodeError::UnknownFlags { flags });
    }
}

#[test]
fn oversized_length_is_rejected_from_the_header_alone() {
    // Only the 16 header bytes exist: the decoder must refuse the announced
    // 4 GiB without waiting for (or allocating) the payload.
    let header = raw_frame_len(Kind::Stdout as u16, 0, 1, u32::MAX, b"");
    assert_eq!(header.len(), HEADER_LEN);
    let mut d = Decoder::new();
    d.feed(&header).unwrap();
    let e = d.next_frame().unwrap_err();
    assert!(
        matches!(e, DecodeError::Oversized { len: u32::MAX, .. }),
        "{e}"
    );
    assert_eq!(e.code(), ErrorCode::Oversized);
    assert_eq!(d.buffered(), 0, "poisoned decoder drops its buffer");

    let one_more = raw_frame_len(Kind::Stdout as u16, 0, 1, (MAX_PAYLOAD + 1) as u32, b"");
    let mut d = Decoder::new();
    d.feed(&one_more).unwrap();
    assert!(matches!(d.next_frame(), Err(DecodeError::Oversized { .. })));
}

#[test]
fn decoder_buffer_is_bounded() {
    // A correct but incomplete maximal frame, then more than the capacity.
    let mut d = Decoder::new();
    let partial = raw_frame_len(Kind::Stdout as u16, 0, 1, MAX_PAYLOAD as u32, &[0; 1000]);
    d.feed(&partial).unwrap();
    assert_eq!(d.next_frame().unwrap(), None);
    let flood = vec![0u8; BUFFER_CAPACITY];
    let e = d.feed(&flood).unwrap_err();
    assert!(matches!(e, DecodeError::Overfull { .. }), "{e}");
    assert!(d.is_poisoned());
}

#[test]
fn wrong_ids_are_rejected() {
    let e = first_error(&raw_frame(Kind::Kill as u16, 0, 0, b""));
    assert!(matches!(e, DecodeError::BadId { id: 0, .. }), "{e}");
    let e = first_error(&raw_frame(Kind::Ping as u16, 0, 3, br#"{"nonce":1}"#));
    assert!(matches!(e, DecodeError::BadId { id: 3, .. }), "{e}");
}

#[test]
fn payload_for_an_empty_kind_is_rejected() {
    for kind in [Kind::Kill, Kind::StdinEof, Kind::Shutdown] {
        let id = if kind == Kind::Shutdown { 0 } else { 1 };
        let e = first_error(&raw_frame(kind as u16, 0, id, b"x"));
        assert!(matches!(e, DecodeError::NotEmpty { len: 1, .. }), "{e}");
    }
}

#[test]
fn truncated_and_garbage_json_is_rejected() {
    let cases: &[(Kind, u32, &[u8])] = &[
        (
            Kind::Hello,
            0,
            br#"{"version":1,"min_version":1,"role":"host","software":"x""#,
        ),
        (Kind::Hello, 0, b"\xff\xfe"),
        (Kind::Hello, 0, b""),
        (
            Kind::Hello,
            0,
            br#"{"version":1,"min_version":1,"role":"root","software":""}"#,
        ),
        (
            Kind::Hello,
            0,
            br#"{"version":1,"min_version":1,"role":"host","software":"","extra":1}"#,
        ),
        (Kind::Exec, 1, br#"{"argv":["sh"]}"#),
        (
            Kind::Exec,
            1,
            br#"{"argv":[[256]],"env":[],"cwd":"","timeout_ms":null,"stdin":false}"#,
        ),
        (Kind::Exit, 1, br#"{"code":"3"}"#),
        (Kind::Exit, 1, br#"{"bogus":3}"#),
        (Kind::Error, 1, br#"{"code":999,"message":"x"}"#),
        (Kind::Ping, 0, br#"{"nonce":-1}"#),
        (Kind::Started, 1, b"[]"),
        (Kind::Configure, 0, b"{}"),
        (Kind::Ping, 0, &[b'['; 10_000]),
    ];
    for (kind, id, payload) in cases {
        let e = first_error(&raw_frame(*kind as u16, 0, *id, payload));
        assert!(
            matches!(e, DecodeError::BadJson { .. }),
            "{}: {e}",
            String::from_utf8_lossy(payload)
        );
        assert_eq!(e.code(), ErrorCode::BadFrame);
    }
}

#[test]
fn out_of_bounds_messages_are_rejected() {
    let long_software = format!(
        r#"{{"version":1,"min_version":1,"role":"host","software":"{}"}}"#,
        "x".repeat(limits::MAX_SOFTWARE + 1)
    );
    let many_args = format!(
        r#"{{"argv":[{}],"env":[],"cwd":"","timeout_ms":null,"stdin":false,"uid":null,"gid":null}}"#,
        vec![r#""a""#; limits::MAX_ARGS + 1].join(",")
    );
    let long_error = format!(
        r#"{{"code":10,"message":"{}"}}"#,
        "x".repeat(limits::MAX_ERROR_MESSAGE + 1)
    );
    let cases: Vec<(Kind, u32, String)> = vec![
        (Kind::Hello, 0, long_software),
        (
            Kind::Hello,
            0,
            r#"{"version":1,"min_version":2,"role":"host","software":""}"#.into(),
        ),
        (Kind::Exec, 1, many_args),
        (
            Kind::Exec,
            1,
            r#"{"argv":["a\u0000b"],"env":[],"cwd":"","timeout_ms":null,"stdin":false}"#.into(),
        ),
        (
            Kind::Exec,
            1,
            r#"{"argv":["sh"],"env":[["A=B","c"]],"cwd":"","timeout_ms":null,"stdin":false}"#
                .into(),
        ),
        (
            Kind::Exec,
            1,
            r#"{"argv":["sh"],"env":[],"cwd":"","timeout_ms":null,"stdin":false,"uid":5}"#.into(),
        ),
        (
            Kind::Exec,
            1,
            r#"{"argv":["sh"],"env":[],"cwd":"","timeout_ms":99999999999999,"stdin":false}"#.into(),
        ),
        // A scrub: without the ids it runs as, of a relative path, of
        // more directories than the bound.
        (
            Kind::Exec,
            1,
            r#"{"argv":["sh"],"env":[],"cwd":"","timeout_ms":null,"stdin":false,"scrub":["/tmp"]}"#
                .into(),
        ),
        (
            Kind::Exec,
            1,
            r#"{"argv":["sh"],"env":[],"cwd":"","timeout_ms":null,"stdin":false,"uid":5,"gid":5,"scrub":["tmp"]}"#
                .into(),
        ),
        (
            Kind::Exec,
            1,
            format!(
                r#"{{"argv":["sh"],"env":[],"cwd":"","timeout_ms":null,"stdin":false,"uid":5,"gid":5,"scrub":[{}]}}"#,
                [r#""/tmp""#; limits::MAX_SCRUB + 1].join(",")
            ),
        ),
        (Kind::Signal, 1, r#"{"signo":65}"#.into()),
        (Kind::Exit, 1, r#"{"signal":0}"#.into()),
        (Kind::Started, 1, r#"{"pid":0}"#.into()),
        (
            Kind::Usage,
            1,
            r#"{"peak_memory_bytes":1099511627777}"#.into(),
        ),
        (Kind::Error, 1, long_error),
    ];
    for (kind, id, payload) in cases {
        let e = first_error(&raw_frame(kind as u16, 0, id, payload.as_bytes()));
        assert!(
            matches!(e, DecodeError::Invalid { .. }),
            "{}: {e}",
            kind.name()
        );
        assert_eq!(e.code(), ErrorCode::BadRequest);
    }
}

#[test]
fn errors_are_sticky() {
    let mut bytes = b"XXXXXXXXXXXXXXXX".to_vec();
    bytes.extend(encode(&Message::Kill, 1).unwrap());
    let mut d = Decoder::new();
    d.feed(&bytes).unwrap();
    let e1 = d.next_frame().unwrap_err();
    let e2 = d.next_frame().unwrap_err();
    assert_eq!(e1, e2);
    // Feeding a valid frame afterwards does not resurrect the stream.
    assert_eq!(d.feed(&encode(&Message::Kill, 1).unwrap()).unwrap_err(), e1);
    assert_eq!(d.next_frame().unwrap_err(), e1);
}

#[test]
fn valid_frames_before_garbage_are_delivered() {
    let mut bytes = encode(&Message::Ping { nonce: 1 }, 0).unwrap();
    bytes.extend_from_slice(b"garbage!");
    let mut d = Decoder::new();
    d.feed(&bytes).unwrap();
    assert_eq!(
        d.next_frame().unwrap(),
        Some(Frame {
            id: 0,
            message: Message::Ping { nonce: 1 }
        })
    );
    assert!(matches!(d.next_frame(), Err(DecodeError::BadMagic { .. })));
}

#[test]
fn random_corruption_never_panics() {
    let mut clean = Vec::new();
    for (msg, id) in samples() {
        encode_into(&msg, id, &mut clean).unwrap();
    }
    let mut rng = Rng(12345);
    for _ in 0..2000 {
        let mut bytes = clean.clone();
        for _ in 0..1 + rng.below(4) {
            let i = rng.below(bytes.len());
            bytes[i] = rng.next() as u8;
        }
        let cut = rng.below(bytes.len() + 1);
        let mut d = Decoder::new();
        if d.feed(&bytes[..cut]).is_ok() {
            while let Ok(Some(_)) = d.next_frame() {}
        }
    }
}
