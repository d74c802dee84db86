// Shared sample messages for the protocol tests.
#![allow(dead_code)]

use hull_protocol::*;

pub fn sample_spec() -> ConfigureSpec {
    ConfigureSpec {
        shares: vec![
            Share {
                tag: "project".into(),
                guest_path: "/mnt/hull/project".into(),
                container_path: "/home/user/proj".into(),
                readonly: false,
                subdir: None,
                noexec: false,
            },
            Share {
                tag: "spill".into(),
                guest_path: "/mnt/hull/spill".into(),
                container_path: "/tmp/hull-runs/x/spill".into(),
                readonly: true,
                subdir: None,
                noexec: false,
            },
        ],
        container: ContainerSpec {
            name: "hull-abc".into(),
            base: "base/ready".into(),
            uid: 1000,
            gid: 1000,
            memory_bytes: Some(1 << 30),
            cpus: Some(2),
            processes: None,
        },
        clock_unix_ns: 1_764_000_000_000_000_000,
        prepare: false,
        network: None,
        overlay: None,
    }
}

/// Every message variant, with the id it is sent under.
pub fn samples() -> Vec<(Message, u32)> {
    vec![
        (
            Message::Hello(Hello {
                version: 3,
                min_version: 1,
                role: Role::Host,
                software: "hull 0.1.0".into(),
            }),
            0,
        ),
        (
            Message::Hello(Hello {
                version: 1,
                min_version: 1,
                role: Role::InnerAgent,
                software: String::new(),
            }),
            0,
        ),
        (Message::Configure(sample_spec()), 0),
        (
            Message::Configured(Configured {
                container: "hull-abc".into(),
                inner_software: "hull-agent 0.1.0".into(),
            }),
            0,
        ),
        (
            Message::Exec(Exec {
                argv: vec![
                    Bytes::from("sh"),
                    Bytes::from("-c"),
                    Bytes(vec![0xff, 0xfe, b'x', 0x80]),
                ],
                env: vec![
                    ("PATH".into(), "/usr/bin:/bin".into()),
                    ("EMPTY".into(), String::new()),
                ],
                cwd: Bytes(vec![b'/', 0xc3, 0x28]),
                timeout_ms: Some(5000),
                stdin: true,
                uid: Some(1000),
                gid: Some(1000),
                scrub: vec![Bytes::from("/tmp"), Bytes(vec![b'/', 0xff])],
                keep_leftovers: true,
                user: None,
            }),
            7,
        ),
        (
            Message::Exec(Exec {
                argv: vec![Bytes::from("adduser")],
                env: vec![],
                cwd: Bytes::default(),
                timeout_ms: None,
                stdin: false,
                uid: None,
                gid: None,
                scrub: vec![Bytes::from("/tmp")],
                keep_leftovers: true,
                user: Some("root".into()),
            }),
            8,
        ),
        (
            Message::Exec(Exec {
                argv: vec![Bytes::from("true")],
                env: vec![],
                cwd: Bytes::default(),
                timeout_ms: None,
                stdin: false,
                uid: None,
                gid: None,
                scrub: vec![],
                keep_leftovers: false,
                user: None,
            }),
            u32::MAX,
        ),
        (Message::Started { pid: 4242 }, 7),
        (Message::Stdin(b"hello\n".to_vec()), 7),
        (Message::Stdin(Vec::new()), 7),
        (Message::StdinEof, 7),
        (Message::StdinAck { bytes: 6 }, 7),
        (Message::Stdout((0..=255u8).collect()), 7),
        (Message::Stderr(vec![0; 1000]), 7),
        (Message::Exit(ExitStatus::Code(3)), 7),
        (Message::Exit(ExitStatus::Code(-1)), 7),
        (Message::Exit(ExitStatus::Signal(9)), 7),
        (Message::Exit(ExitStatus::TimedOut), 7),
        (
            Message::Usage {
                peak_memory_bytes: 106_627_072,
            },
            7,
        ),
        (Message::Signal { signo: 15 }, 7),
        (Message::Kill, 7),
        (Message::Ping { nonce: u64::MAX }, 0),
        (Message::Pong { nonce: 0 }, 0),
        (Message::Shutdown, 0),
        (
            Message::error(ErrorCode::ExecFailed, "no such program: foo"),
            7,
        ),
        (Message::error(ErrorCode::BadFrame, "bad magic"), 0),
    ]
}

/// A raw frame with arbitrary header fields.
pub fn raw_frame(kind: u16, flags: u16, id: u32, payload: &[u8]) -> Vec<u8> {
    raw_frame_len(kind, flags, id, payload.len() as u32, payload)
}

pub fn raw_frame_len(kind: u16, flags: u16, id: u32, len: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(b"HULL");
    v.extend_from_slice(&kind.to_le_bytes());
    v.extend_from_slice(&flags.to_le_bytes());
    v.extend_from_slice(&id.to_le_bytes());
    v.extend_from_slice(&len.to_le_bytes());
    v.extend_from_slice(payload);
    v
}

/// Feed all of `bytes` and collect every frame, or the first error.
pub fn decode_all(bytes: &[u8]) -> Result<Vec<Frame>, DecodeError> {
    let mut d = Decoder::new();
    d.feed(bytes)?;
    let mut out = Vec::new();
    while let Some(f) = d.next_frame()? {
        out.push(f);
    }
    assert_eq!(d.buffered(), 0, "bytes left over after the last frame");
    Ok(out)
}

/// A small deterministic PRNG (xorshift64*), so property loops need no crate.
#[derive(Debug)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}
