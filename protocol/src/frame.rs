//! The frame header and the encoder.
//!
//! Guards against: native-endian or unbounded length prefixes (the header is
//! fixed little-endian and the payload length is capped), and against this
//! side sending a frame the peer must reject (the encoder validates the
//! message and its id rule first).

use crate::message::Message;

/// The first four bytes of every frame.
pub const MAGIC: [u8; 4] = *b"HULL";
/// Length of the fixed header.
pub const HEADER_LEN: usize = 16;
/// Largest payload accepted or produced (8 MiB): an `Exec` of a command
/// line as long as Linux takes (`ARG_MAX`, 2 MiB of arguments and 2 MiB of
/// environment) fits with JSON's escapes; each side's decoder holds at
/// most two.
pub const MAX_PAYLOAD: usize = 8 * 1024 * 1024;
/// Flag bits defined so far: none. Any set bit is rejected.
pub(crate) const KNOWN_FLAGS: u16 = 0;

/// How a kind's payload is carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Payload {
    /// Bounded serde JSON.
    Json,
    /// Raw bytes (stream data).
    Raw,
    /// Must be empty.
    Empty,
}

/// Which ids a kind may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IdRule {
    /// Only id 0 (the control channel).
    Control,
    /// Only a non-zero exec id.
    Exec,
    /// Either: an `Error` with id 0 is about the connection, otherwise about that exec.
    Any,
}

/// The frame kinds. The numbers are part of the wire format and never change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Kind {
    Hello = 1,
    Error = 2,
    Ping = 3,
    Pong = 4,
    Shutdown = 5,
    Configure = 6,
    Configured = 7,
    Exec = 16,
    Started = 17,
    Stdin = 18,
    StdinEof = 19,
    StdinAck = 20,
    Stdout = 21,
    Stderr = 22,
    Exit = 23,
    Signal = 24,
    Kill = 25,
    Usage = 26,
}

impl Kind {
    /// Every kind, for tests and tables.
    pub const ALL: [Kind; 18] = [
        Kind::Hello,
        Kind::Error,
        Kind::Ping,
        Kind::Pong,
        Kind::Shutdown,
        Kind::Configure,
        Kind::Configured,
        Kind::Exec,
        Kind::Started,
        Kind::Stdin,
        Kind::StdinEof,
        Kind::StdinAck,
        Kind::Stdout,
        Kind::Stderr,
        Kind::Exit,
        Kind::Signal,
        Kind::Kill,
        Kind::Usage,
    ];

    pub fn from_u16(v: u16) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| *k as u16 == v)
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Hello => "hello",
            Kind::Error => "error",
            Kind::Ping => "ping",
            Kind::Pong => "pong",
            Kind::Shutdown => "shutdown",
            Kind::Configure => "configure",
            Kind::Configured => "configured",
            Kind::Exec => "exec",
            Kind::Started => "started",
            Kind::Stdin => "stdin",
            Kind::StdinEof => "stdin_eof",
            Kind::StdinAck => "stdin_ack",
            Kind::Stdout => "stdout",
            Kind::Stderr => "stderr",
            Kind::Exit => "exit",
            Kind::Signal => "signal",
            Kind::Kill => "kill",
            Kind::Usage => "usage",
        }
    }

    pub(crate) fn payload(self) -> Payload {
        match self {
            Kind::Stdin | Kind::Stdout | Kind::Stderr => Payload::Raw,
            Kind::Shutdown | Kind::StdinEof | Kind::Kill => Payload::Empty,
            _ => Payload::Json,
        }
    }

    pub(crate) fn id_rule(self) -> IdRule {
        match self {
            Kind::Hello
            | Kind::Ping
            | Kind::Pong
            | Kind::Shutdown
            | Kind::Configure
            | Kind::Configured => IdRule::Control,
            Kind::Error => IdRule::Any,
            Kind::Exec
            | Kind::Started
            | Kind::Stdin
            | Kind::StdinEof
            | Kind::StdinAck
            | Kind::Stdout
            | Kind::Stderr
            | Kind::Exit
            | Kind::Signal
            | Kind::Kill
            | Kind::Usage => IdRule::Exec,
        }
    }

    /// Whether `id` is allowed for this kind.
    pub fn id_ok(self, id: u32) -> bool {
        match self.id_rule() {
            IdRule::Control => id == 0,
            IdRule::Exec => id != 0,
            IdRule::Any => true,
        }
    }
}

/// A parsed, validated frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    pub flags: u16,
    pub id: u32,
    pub payload_len: u32,
}

impl Header {
    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4..6].copy_from_slice(&(self.kind as u16).to_le_bytes());
        b[6..8].copy_from_slice(&self.flags.to_le_bytes());
        b[8..12].copy_from_slice(&self.id.to_le_bytes());
        b[12..16].copy_from_slice(&self.payload_len.to_le_bytes());
        b
    }
}

/// Why a message could not be encoded. Nothing was appended to the output.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    #[error("{kind} frame with id {id}: {rule}")]
    BadId {
        kind: &'static str,
        id: u32,
        rule: &'static str,
    },
    #[error("{kind} payload of {len} bytes exceeds the {max}-byte frame limit")]
    Oversized {
        kind: &'static str,
        len: usize,
        max: usize,
    },
    #[error("{kind} message is invalid: {reason}")]
    Invalid { kind: &'static str, reason: String },
    #[error("{kind} payload could not be serialized: {reason}")]
    Json { kind: &'static str, reason: String },
}

/// Encode `msg` as one frame under `id`.
pub fn encode(msg: &Message, id: u32) -> Result<Vec<u8>, EncodeError> {
    let mut out = Vec::new();
    encode_into(msg, id, &mut out)?;
    Ok(out)
}

/// Append one frame for `msg` under `id` to `out`. On error `out` is unchanged.
pub fn encode_into(msg: &Message, id: u32, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    let kind = msg.kind();
    if !kind.id_ok(id) {
        return Err(EncodeError::BadId {
            kind: kind.name(),
            id,
            rule: id_rule_text(kind),
        });
    }
    msg.validate().map_err(|reason| EncodeError::Invalid {
        kind: kind.name(),
        reason,
    })?;
    if let Some(len) = msg.raw_len() {
        if len > MAX_PAYLOAD {
            return Err(EncodeError::Oversized {
                kind: kind.name(),
                len,
                max: MAX_PAYLOAD,
            });
        }
    }
    let start = out.len();
    out.extend_from_slice(&[0u8; HEADER_LEN]);
    if let Err(reason) = msg.write_payload(out) {
        out.truncate(start);
        return Err(EncodeError::Json {
            kind: kind.name(),
            reason,
        });
    }
    let len = out.len() - start - HEADER_LEN;
    if len > MAX_PAYLOAD {
        out.truncate(start);
        return Err(EncodeError::Oversized {
            kind: kind.name(),
            len,
            max: MAX_PAYLOAD,
        });
    }
    let header = Header {
        kind,
        flags: 0,
        id,
        // len <= MAX_PAYLOAD (1 MiB) fits in u32.
        payload_len: len as u32,
    };
    out[start..start + HEADER_LEN].copy_from_slice(&header.to_bytes());
    Ok(())
}

pub(crate) fn id_rule_text(kind: Kind) -> &'static str {
    match kind.id_rule() {
        IdRule::Control => "this kind belongs to the control channel and must use id 0",
        IdRule::Exec => "this kind belongs to an exec and must use a non-zero id",
        IdRule::Any => "any id is allowed",
    }
}
