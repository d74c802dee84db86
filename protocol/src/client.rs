//! Blocking, transport-agnostic helpers over any `Read`/`Write`: what the
//! orchestrator (and the outer agent, towards the inner one) use to talk.
//!
//! [`Connection`] owns one duplex transport. To read and write from two
//! threads, split the transport first (`UnixStream::try_clone`, two `File`s
//! for a virtio-serial port) and use a [`FrameReader`] and a [`FrameWriter`].
//!
//! Guards against the same as the decoder (bounded, poisoning) and against a
//! peer that skips the handshake or speaks another version. It does not add
//! timeouts: set them on the transport (`set_read_timeout`) if needed.

use std::io::{self, Read, Write};

use crate::decode::{DecodeError, Decoder};
use crate::frame::{encode_into, EncodeError, HEADER_LEN, MAX_PAYLOAD};
use crate::message::{ErrorCode, Frame, Hello, Message, Role};
use crate::version::{
    negotiate, VersionError, VersionRange, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION,
};

/// Bytes asked of the transport per read.
const READ_CHUNK: usize = 64 * 1024;
const _: () = assert!(READ_CHUNK <= HEADER_LEN + MAX_PAYLOAD);

#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    #[error("transport I/O failed: {0}")]
    Io(#[source] io::Error),
    #[error("the peer closed the connection")]
    Closed,
    #[error("the peer closed the connection in the middle of a frame ({buffered} bytes pending)")]
    Truncated { buffered: usize },
    #[error("the peer sent a malformed stream: {0}")]
    Decode(#[from] DecodeError),
    #[error("could not encode a frame: {0}")]
    Encode(#[from] EncodeError),
    #[error("handshake failed: expected hello first, got a {got} frame")]
    NoHello { got: &'static str },
    #[error("handshake failed: {0}")]
    Version(#[from] VersionError),
    #[error("the peer reported error {code}: {message}")]
    Peer { code: ErrorCode, message: String },
}

/// The reading half: pulls bytes from `R` and yields validated frames.
#[derive(Debug)]
pub struct FrameReader<R> {
    inner: R,
    decoder: Decoder,
    buf: Box<[u8]>,
}

impl<R: Read> FrameReader<R> {
    pub fn new(inner: R) -> Self {
        FrameReader {
            inner,
            decoder: Decoder::new(),
            buf: vec![0u8; READ_CHUNK].into_boxed_slice(),
        }
    }

    /// The next frame; blocks until one is complete. `Err(Closed)` on a clean
    /// end of stream at a frame boundary.
    pub fn recv(&mut self) -> Result<Frame, ConnError> {
        loop {
            if let Some(frame) = self.decoder.next_frame()? {
                return Ok(frame);
            }
            let n = match self.inner.read(&mut self.buf) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(ConnError::Io(e)),
            };
            if n == 0 {
                return Err(if self.decoder.at_boundary() {
                    ConnError::Closed
                } else {
                    ConnError::Truncated {
                        buffered: self.decoder.buffered(),
                    }
                });
            }
            self.decoder.feed(&self.buf[..n])?;
        }
    }

    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    pub fn get_mut(&mut self) -> &mut R {
        &mut self.inner
    }

    pub fn into_inner(self) -> R {
        self.inner
    }
}

/// The writing half: encodes and writes whole frames to `W`.
#[derive(Debug)]
pub struct FrameWriter<W> {
    inner: W,
    buf: Vec<u8>,
}

impl<W: Write> FrameWriter<W> {
    pub fn new(inner: W) -> Self {
        FrameWriter {
            inner,
            buf: Vec::new(),
        }
    }

    /// Encode `msg` under `id` and write it (then flush).
    pub fn send(&mut self, msg: &Message, id: u32) -> Result<(), ConnError> {
        send_with(&mut self.inner, &mut self.buf, msg, id)
    }

    /// Send our `Hello`.
    pub fn send_hello(&mut self, role: Role, software: &str) -> Result<(), ConnError> {
        self.send(&hello_message(role, software), 0)
    }

    pub fn get_ref(&self) -> &W {
        &self.inner
    }

    pub fn get_mut(&mut self) -> &mut W {
        &mut self.inner
    }

    pub fn into_inner(self) -> W {
        self.inner
    }
}

fn send_with<W: Write>(
    w: &mut W,
    buf: &mut Vec<u8>,
    msg: &Message,
    id: u32,
) -> Result<(), ConnError> {
    buf.clear();
    encode_into(msg, id, buf)?;
    w.write_all(buf).map_err(ConnError::Io)?;
    w.flush().map_err(ConnError::Io)?;
    // Do not keep a frame-sized buffer around after one big frame.
    if buf.capacity() > 2 * READ_CHUNK {
        *buf = Vec::new();
    }
    Ok(())
}

/// Our `Hello` for `role`, speaking [`VersionRange::CURRENT`].
pub fn hello_message(role: Role, software: &str) -> Message {
    Message::Hello(Hello {
        version: PROTOCOL_VERSION,
        min_version: MIN_PROTOCOL_VERSION,
        role,
        software: crate::message::truncate_utf8(software, crate::limits::MAX_SOFTWARE).to_owned(),
    })
}

/// Check the peer's first frame: it must be a `Hello` with a version in common.
/// Returns the peer's hello and the negotiated version.
pub fn check_peer_hello(frame: Frame) -> Result<(Hello, u32), ConnError> {
    match frame.message {
        Message::Hello(h) => {
            let v = negotiate(VersionRange::CURRENT, VersionRange::of(&h))?;
            Ok((h, v))
        }
        Message::Error { code, message } => Err(ConnError::Peer { code, message }),
        other => Err(ConnError::NoHello {
            got: other.kind().name(),
        }),
    }
}

/// A blocking duplex connection over one transport.
#[derive(Debug)]
pub struct Connection<T> {
    reader: FrameReader<T>,
    wbuf: Vec<u8>,
    peer: Option<Hello>,
    version: Option<u32>,
}

impl<T: Read + Write> Connection<T> {
    pub fn new(io: T) -> Self {
        Connection {
            reader: FrameReader::new(io),
            wbuf: Vec::new(),
            peer: None,
            version: None,
        }
    }

    /// Send our `Hello` as `role` and wait for the peer's; negotiate the
    /// version. On a version mismatch an `Error{VersionMismatch}` is sent
    /// (best effort) before the error is returned.
    pub fn hello(&mut self, role: Role, software: &str) -> Result<&Hello, ConnError> {
        self.send(&hello_message(role, software), 0)?;
        let frame = self.reader.recv()?;
        match check_peer_hello(frame) {
            Ok((h, v)) => {
                self.version = Some(v);
                Ok(self.peer.insert(h))
            }
            Err(ConnError::Version(e)) => {
                let _ = self.send(
                    &Message::error(ErrorCode::VersionMismatch, e.to_string()),
                    0,
                );
                Err(ConnError::Version(e))
            }
            Err(ConnError::NoHello { got }) => {
                let _ = self.send(
                    &Message::error(ErrorCode::BadRequest, format!("expected hello, got {got}")),
                    0,
                );
                Err(ConnError::NoHello { got })
            }
            Err(e) => Err(e),
        }
    }

    /// Encode and write one frame.
    pub fn send(&mut self, msg: &Message, id: u32) -> Result<(), ConnError> {
        send_with(self.reader.get_mut(), &mut self.wbuf, msg, id)
    }

    /// The next frame as `(id, message)`.
    pub fn recv(&mut self) -> Result<(u32, Message), ConnError> {
        let f = self.reader.recv()?;
        Ok((f.id, f.message))
    }

    /// The peer's hello, after [`Connection::hello`].
    pub fn peer(&self) -> Option<&Hello> {
        self.peer.as_ref()
    }

    /// The negotiated version, after [`Connection::hello`].
    pub fn version(&self) -> Option<u32> {
        self.version
    }

    pub fn get_ref(&self) -> &T {
        self.reader.get_ref()
    }

    pub fn get_mut(&mut self) -> &mut T {
        self.reader.get_mut()
    }

    pub fn into_inner(self) -> T {
        self.reader.into_inner()
    }
}
