//! Every message survives encode -> decode, whole, byte by byte, many per
//! feed, and over random splits.

mod common;

use common::*;
use hull_protocol::*;

#[test]
fn every_kind_has_a_sample() {
    let samples = samples();
    for k in Kind::ALL {
        assert!(
            samples.iter().any(|(m, _)| m.kind() == k),
            "no sample for {}",
            k.name()
        );
    }
}

#[test]
fn round_trip_each_message() {
    for (msg, id) in samples() {
        let bytes = encode(&msg, id).unwrap();
        assert_eq!(&bytes[..4], b"HULL");
        assert_eq!(u16::from_le_bytes([bytes[4], bytes[5]]), msg.kind() as u16);
        assert_eq!(
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]),
            id
        );
        let len = u32::from_le_bytes([bytes[12], bytes[13], bytes[14], bytes[15]]) as usize;
        assert_eq!(len, bytes.len() - HEADER_LEN);
        let frames = decode_all(&bytes).unwrap();
        assert_eq!(
            frames,
            vec![Frame {
                id,
                message: msg.clone()
            }],
            "{msg:?}"
        );
    }
}

#[test]
fn non_utf8_argv_survives_exactly() {
    let weird: Vec<u8> = vec![0x80, 0xff, b'a', 0xc0, 0xaf];
    let msg = Message::Exec(Exec {
        argv: vec![Bytes::from("printf"), Bytes(weird.clone())],
        env: vec![],
        cwd: Bytes::from("/tmp"),
        timeout_ms: None,
        stdin: false,
        uid: None,
        gid: None,
        scrub: vec![],
        keep_leftovers: false,
        user: None,
    });
    let frames = decode_all(&encode(&msg, 1).unwrap()).unwrap();
    match &frames[0].message {
        Message::Exec(e) => assert_eq!(e.argv[1].as_slice(), &weird[..]),
        other => panic!("decoded {other:?}"),
    }
}

#[test]
fn utf8_bytes_are_json_strings() {
    let msg = Message::Exec(Exec {
        argv: vec![Bytes::from("echo"), Bytes(vec![0xff])],
        env: vec![],
        cwd: Bytes::from("/"),
        timeout_ms: None,
        stdin: false,
        uid: None,
        gid: None,
        scrub: vec![],
        keep_leftovers: false,
        user: None,
    });
    let bytes = encode(&msg, 1).unwrap();
    let json = std::str::from_utf8(&bytes[HEADER_LEN..]).unwrap();
    assert!(json.contains(r#""argv":["echo",[255]]"#), "{json}");
}

#[test]
fn byte_by_byte_feeding() {
    let mut all = Vec::new();
    for (msg, id) in samples() {
        encode_into(&msg, id, &mut all).unwrap();
    }
    let mut d = Decoder::new();
    let mut got = Vec::new();
    for b in &all {
        d.feed(std::slice::from_ref(b)).unwrap();
        while let Some(f) = d.next_frame().unwrap() {
            got.push(f);
        }
    }
    let want: Vec<Frame> = samples()
        .into_iter()
        .map(|(message, id)| Frame { id, message })
        .collect();
    assert_eq!(got, want);
    assert!(d.at_boundary());
}

#[test]
fn many_frames_in_one_feed() {
    let mut all = Vec::new();
    for i in 1..=500u32 {
        encode_into(&Message::Stdout(i.to_le_bytes().to_vec()), i, &mut all).unwrap();
    }
    let frames = decode_all(&all).unwrap();
    assert_eq!(frames.len(), 500);
    for (i, f) in frames.iter().enumerate() {
        let n = i as u32 + 1;
        assert_eq!(f.id, n);
        assert_eq!(f.message, Message::Stdout(n.to_le_bytes().to_vec()));
    }
}

#[test]
fn random_splits_give_the_same_frames() {
    let mut all = Vec::new();
    let mut want = Vec::new();
    for (msg, id) in samples() {
        encode_into(&msg, id, &mut all).unwrap();
        want.push(Frame { id, message: msg });
    }
    // A maximal frame too, so splits cross a big payload.
    let big = Message::Stdout(vec![0xab; MAX_PAYLOAD]);
    encode_into(&big, 9, &mut all).unwrap();
    want.push(Frame {
        id: 9,
        message: big,
    });

    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for round in 0..200 {
        let mut d = Decoder::new();
        let mut got = Vec::new();
        let mut pos = 0;
        while pos < all.len() {
            let max = if round % 2 == 0 { 64 } else { 200_000 };
            let n = (1 + rng.below(max)).min(all.len() - pos);
            d.feed(&all[pos..pos + n]).unwrap();
            pos += n;
            while let Some(f) = d.next_frame().unwrap() {
                got.push(f);
            }
        }
        assert_eq!(got, want, "round {round}");
        assert!(d.at_boundary());
    }
}

#[test]
fn max_payload_is_accepted_and_one_more_is_refused_by_the_encoder() {
    let ok = Message::Stdin(vec![1; MAX_PAYLOAD]);
    let frames = decode_all(&encode(&ok, 1).unwrap()).unwrap();
    assert_eq!(frames[0].message, ok);

    let too_big = Message::Stdout(vec![1; MAX_PAYLOAD + 1]);
    let mut out = vec![7u8];
    let err = encode_into(&too_big, 1, &mut out).unwrap_err();
    assert!(matches!(err, EncodeError::Oversized { .. }), "{err}");
    assert_eq!(out, vec![7u8], "output must be unchanged on error");
}

#[test]
fn encoder_refuses_wrong_ids_and_invalid_messages() {
    assert!(matches!(
        encode(&Message::Kill, 0),
        Err(EncodeError::BadId { .. })
    ));
    assert!(matches!(
        encode(&Message::Ping { nonce: 1 }, 5),
        Err(EncodeError::BadId { .. })
    ));
    let empty_argv = Message::Exec(Exec {
        argv: vec![],
        env: vec![],
        cwd: Bytes::default(),
        timeout_ms: None,
        stdin: false,
        uid: None,
        gid: None,
        scrub: vec![],
        keep_leftovers: false,
        user: None,
    });
    assert!(matches!(
        encode(&empty_argv, 1),
        Err(EncodeError::Invalid { .. })
    ));
    assert!(matches!(
        encode(&Message::Signal { signo: 0 }, 1),
        Err(EncodeError::Invalid { .. })
    ));
}

#[test]
fn long_error_messages_are_truncated_on_a_char_boundary() {
    // 'é' is two bytes: 3000 of them is 6000 bytes, cut at <= 4096.
    let msg = Message::error(ErrorCode::Internal, "é".repeat(3000));
    let frames = decode_all(&encode(&msg, 0).unwrap()).unwrap();
    match &frames[0].message {
        Message::Error { code, message } => {
            assert_eq!(*code, ErrorCode::Internal);
            assert_eq!(message.len(), 4096);
            assert!(message.chars().all(|c| c == 'é'));
        }
        other => panic!("decoded {other:?}"),
    }
}

#[test]
fn error_codes_are_stable() {
    let expected = [
        (ErrorCode::BadFrame, 1),
        (ErrorCode::Oversized, 2),
        (ErrorCode::UnknownKind, 3),
        (ErrorCode::VersionMismatch, 4),
        (ErrorCode::BadRequest, 5),
        (ErrorCode::ExecFailed, 6),
        (ErrorCode::UnknownId, 7),
        (ErrorCode::PolicyDenied, 8),
        (ErrorCode::SetupFailed, 9),
        (ErrorCode::Internal, 10),
        (ErrorCode::Busy, 11),
        (ErrorCode::Timeout, 12),
        (ErrorCode::Unsupported, 13),
        (ErrorCode::FlowControl, 14),
        (ErrorCode::CommandNotFound, 15),
        (ErrorCode::CommandNotExecutable, 16),
        (ErrorCode::TreeSurvived, 17),
        (ErrorCode::ScrubFailed, 18),
        (ErrorCode::UnknownUser, 19),
    ];
    assert_eq!(ErrorCode::ALL.len(), expected.len());
    for (code, n) in expected {
        assert_eq!(code as u16, n);
        assert_eq!(ErrorCode::from_u16(n), Some(code));
    }
    assert_eq!(ErrorCode::from_u16(0), None);
    assert_eq!(ErrorCode::from_u16(999), None);
}

#[test]
fn kind_numbers_are_stable() {
    let expected: [(Kind, u16); 17] = [
        (Kind::Hello, 1),
        (Kind::Error, 2),
        (Kind::Ping, 3),
        (Kind::Pong, 4),
        (Kind::Shutdown, 5),
        (Kind::Configure, 6),
        (Kind::Configured, 7),
        (Kind::Exec, 16),
        (Kind::Started, 17),
        (Kind::Stdin, 18),
        (Kind::StdinEof, 19),
        (Kind::StdinAck, 20),
        (Kind::Stdout, 21),
        (Kind::Stderr, 22),
        (Kind::Exit, 23),
        (Kind::Signal, 24),
        (Kind::Kill, 25),
    ];
    for (k, n) in expected {
        assert_eq!(k as u16, n);
        assert_eq!(Kind::from_u16(n), Some(k));
    }
}

#[test]
fn a_user_is_a_name_and_never_given_with_ids() {
    let exec = |user: &str, ids: Option<u32>| {
        Message::Exec(Exec {
            argv: vec![Bytes::from("whoami")],
            env: vec![],
            cwd: Bytes::default(),
            timeout_ms: None,
            stdin: false,
            uid: ids,
            gid: ids,
            scrub: vec![],
            keep_leftovers: false,
            user: Some(user.into()),
        })
    };
    for good in [
        "root",
        "hull",
        "inspect-ai-test-exec-as-user",
        "a.b_c",
        "machine$",
    ] {
        assert!(exec(good, None).validate().is_ok(), "{good}");
    }
    let long = "a".repeat(hull_protocol::limits::MAX_USER + 1);
    for bad in [
        "",
        "-rf",
        "1000",
        "a:b",
        "a/b",
        "a b",
        "röot",
        "$",
        long.as_str(),
    ] {
        let e = exec(bad, None).validate().unwrap_err();
        assert!(e.contains("is not a user name"), "{bad}: {e}");
    }
    let e = exec("root", Some(0)).validate().unwrap_err();
    assert!(e.contains("not given with uid and gid"), "{e}");
}
