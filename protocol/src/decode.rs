//! The sans-I/O decoder: feed bytes, take frames.
//!
//! Guards against: a peer announcing a huge payload (the length is checked
//! against [`MAX_PAYLOAD`] from the header alone, before any payload byte is
//! awaited or stored, and nothing is ever reserved from an announced length),
//! a caller that feeds without draining (the buffer is capped at
//! [`BUFFER_CAPACITY`]), and resynchronising on garbage (any error poisons the
//! decoder: every later call returns the same error, so the caller sends an
//! `Error` frame with [`DecodeError::code`] and closes).

use crate::frame::{id_rule_text, Kind, HEADER_LEN, KNOWN_FLAGS, MAGIC, MAX_PAYLOAD};
use crate::message::{ErrorCode, Frame, Message, PayloadError};

/// The most bytes a decoder holds: room for one maximal frame being
/// completed plus one more maximal chunk. A caller that drains
/// [`Decoder::next_frame`] until `Ok(None)` between feeds of at most
/// `HEADER_LEN + MAX_PAYLOAD` bytes never hits [`DecodeError::Overfull`].
pub const BUFFER_CAPACITY: usize = 2 * (HEADER_LEN + MAX_PAYLOAD);

/// Why the byte stream was rejected. The decoder stays poisoned afterwards.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("frame does not start with the magic \"HULL\" (found bytes {found:02x?})")]
    BadMagic { found: Vec<u8> },
    #[error("frame has unknown flag bits {flags:#06x}")]
    UnknownFlags { flags: u16 },
    #[error("frame has unknown kind {kind}")]
    UnknownKind { kind: u16 },
    #[error("{kind} frame announces a {len}-byte payload, more than the {max}-byte limit")]
    Oversized {
        kind: &'static str,
        len: u32,
        max: usize,
    },
    #[error("{kind} frame with id {id}: {rule}")]
    BadId {
        kind: &'static str,
        id: u32,
        rule: &'static str,
    },
    #[error("{kind} frame must have an empty payload, got {len} bytes")]
    NotEmpty { kind: &'static str, len: usize },
    #[error("{kind} payload is not valid: {reason}")]
    BadJson { kind: &'static str, reason: String },
    #[error("{kind} message is out of bounds: {reason}")]
    Invalid { kind: &'static str, reason: String },
    #[error("decoder buffer would hold {wanted} bytes, more than its {capacity}-byte capacity (frames were not drained)")]
    Overfull { wanted: usize, capacity: usize },
}

impl DecodeError {
    /// The code to put in the `Error` frame sent before closing.
    pub fn code(&self) -> ErrorCode {
        match self {
            DecodeError::BadMagic { .. }
            | DecodeError::UnknownFlags { .. }
            | DecodeError::BadId { .. }
            | DecodeError::NotEmpty { .. }
            | DecodeError::BadJson { .. } => ErrorCode::BadFrame,
            DecodeError::UnknownKind { .. } => ErrorCode::UnknownKind,
            DecodeError::Oversized { .. } | DecodeError::Overfull { .. } => ErrorCode::Oversized,
            DecodeError::Invalid { .. } => ErrorCode::BadRequest,
        }
    }
}

/// Incremental frame decoder with a bounded buffer and a sticky error.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
    /// Bytes before `start` are consumed.
    start: usize,
    error: Option<DecodeError>,
}

impl Decoder {
    pub fn new() -> Decoder {
        Decoder::default()
    }

    /// Bytes fed but not yet returned as frames.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }

    /// Whether an error has poisoned the decoder.
    pub fn is_poisoned(&self) -> bool {
        self.error.is_some()
    }

    /// Whether the decoder sits at a frame boundary (no partial frame held).
    /// A transport EOF is clean only at a boundary.
    pub fn at_boundary(&self) -> bool {
        self.error.is_none() && self.buffered() == 0
    }

    /// Append bytes from the transport.
    pub fn feed(&mut self, data: &[u8]) -> Result<(), DecodeError> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        let wanted = self.buf.len().saturating_add(data.len());
        if wanted > BUFFER_CAPACITY {
            return Err(self.poison(DecodeError::Overfull {
                wanted,
                capacity: BUFFER_CAPACITY,
            }));
        }
        self.buf.extend_from_slice(data);
        Ok(())
    }

    /// The next complete frame, `Ok(None)` if more bytes are needed.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, DecodeError> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        match self.parse() {
            Ok(Some((frame, used))) => {
                self.start += used;
                if self.start == self.buf.len() {
                    self.buf.clear();
                    self.start = 0;
                }
                Ok(Some(frame))
            }
            Ok(None) => Ok(None),
            Err(e) => Err(self.poison(e)),
        }
    }

    fn poison(&mut self, e: DecodeError) -> DecodeError {
        self.buf = Vec::new();
        self.start = 0;
        self.error = Some(e.clone());
        e
    }

    fn parse(&self) -> Result<Option<(Frame, usize)>, DecodeError> {
        let avail = &self.buf[self.start..];
        // Reject garbage as soon as the first bytes disagree with the magic.
        let n = avail.len().min(MAGIC.len());
        if avail[..n] != MAGIC[..n] {
            return Err(DecodeError::BadMagic {
                found: avail[..n].to_vec(),
            });
        }
        if avail.len() < HEADER_LEN {
            return Ok(None);
        }
        let flags = u16::from_le_bytes([avail[6], avail[7]]);
        let raw_kind = u16::from_le_bytes([avail[4], avail[5]]);
        let id = u32::from_le_bytes([avail[8], avail[9], avail[10], avail[11]]);
        let len = u32::from_le_bytes([avail[12], avail[13], avail[14], avail[15]]);
        if flags & !KNOWN_FLAGS != 0 {
            return Err(DecodeError::UnknownFlags { flags });
        }
        let kind = Kind::from_u16(raw_kind).ok_or(DecodeError::UnknownKind { kind: raw_kind })?;
        if len as usize > MAX_PAYLOAD {
            return Err(DecodeError::Oversized {
                kind: kind.name(),
                len,
                max: MAX_PAYLOAD,
            });
        }
        if !kind.id_ok(id) {
            return Err(DecodeError::BadId {
                kind: kind.name(),
                id,
                rule: id_rule_text(kind),
            });
        }
        let total = HEADER_LEN + len as usize;
        if avail.len() < total {
            return Ok(None);
        }
        let payload = &avail[HEADER_LEN..total];
        let message = Message::from_payload(kind, payload).map_err(|e| match e {
            PayloadError::Json(reason) => DecodeError::BadJson {
                kind: kind.name(),
                reason,
            },
            PayloadError::Invalid(reason) => DecodeError::Invalid {
                kind: kind.name(),
                reason,
            },
            PayloadError::NotEmpty(len) => DecodeError::NotEmpty {
                kind: kind.name(),
                len,
            },
        })?;
        Ok(Some((Frame { id, message }, total)))
    }
}
