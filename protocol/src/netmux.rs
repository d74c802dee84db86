//! The network channel of tier 3: many TCP connections of the container to
//! hull's proxy, carried over one dedicated virtio-serial port.
//!
//! The guest agent accepts a connection on the container's loopback (where
//! `HTTP_PROXY` points) and opens a stream for it; hull connects each
//! stream to the run's proxy, which checks everything the command sends as
//! on the other tiers. This module is only the framing and the accounting
//! both ends keep; it decides nothing about what may be reached.
//!
//! # Wire format
//!
//! Every frame is a fixed 12-byte little-endian header and a payload:
//!
//! | offset | size | field    | meaning                                         |
//! |--------|------|----------|-------------------------------------------------|
//! | 0      | 4    | `magic`  | the bytes `HNET`                                |
//! | 4      | 1    | `kind`   | a [`NetKind`]; unknown kinds are rejected       |
//! | 5      | 1    | `flags`  | 0; any set bit is rejected                      |
//! | 6      | 2    | `len`    | payload bytes, at most [`MAX_DATA`]             |
//! | 8      | 4    | `stream` | non-zero stream id                              |
//!
//! `Open` (guest to host only) starts a stream; `Data` carries bytes;
//! `Credit` (payload: a u32, little-endian) gives the peer back that many
//! bytes of its window; `Close` says the sender sends no more (half close);
//! `Reset` ends the stream both ways at once.
//!
//! # Bounds (what a hostile guest cannot make hull hold)
//!
//! Each side may have at most [`WINDOW`] bytes of a stream sent and not yet
//! credited back; at most [`MAX_STREAMS`] streams are open at once. So what
//! one side buffers for the other is at most `WINDOW` per stream and
//! `MAX_STREAMS * WINDOW` in all. [`Streams`] keeps that accounting and
//! says which frames break it; a peer that breaks it is cut off.

use std::collections::BTreeMap;

/// The first four bytes of every frame.
pub const NET_MAGIC: [u8; 4] = *b"HNET";
/// Length of the fixed header.
pub const NET_HEADER_LEN: usize = 12;
/// Largest payload of one frame.
pub const MAX_DATA: usize = 32 * 1024;
/// Bytes of one stream a side may have sent and not yet had credited.
pub const WINDOW: u32 = 256 * 1024;
/// Streams open at once.
pub const MAX_STREAMS: usize = 128;
/// The virtio-serial port the channel runs on
/// (`/sys/class/virtio-ports/*/name`; QEMU's `virtserialport name=`).
pub const PORT_NAME: &str = "net.0";

/// The frame kinds; the numbers are part of the wire format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum NetKind {
    Open = 1,
    Data = 2,
    Credit = 3,
    Close = 4,
    Reset = 5,
}

impl NetKind {
    fn from_u8(k: u8) -> Option<NetKind> {
        Some(match k {
            1 => NetKind::Open,
            2 => NetKind::Data,
            3 => NetKind::Credit,
            4 => NetKind::Close,
            5 => NetKind::Reset,
            _ => return None,
        })
    }
}

/// One frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetFrame {
    Open { stream: u32 },
    Data { stream: u32, bytes: Vec<u8> },
    Credit { stream: u32, bytes: u32 },
    Close { stream: u32 },
    Reset { stream: u32 },
}

impl NetFrame {
    pub fn stream(&self) -> u32 {
        match self {
            NetFrame::Open { stream }
            | NetFrame::Data { stream, .. }
            | NetFrame::Credit { stream, .. }
            | NetFrame::Close { stream }
            | NetFrame::Reset { stream } => *stream,
        }
    }
}

/// Why bytes are not a frame, or a frame breaks the accounting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetError {
    #[error("not a network frame (magic {0:02x?})")]
    Magic([u8; 4]),
    #[error("unknown network frame kind {0}")]
    Kind(u8),
    #[error("network frame flags {0:#x} are not defined")]
    Flags(u8),
    #[error("stream id 0")]
    StreamZero,
    #[error("a {kind:?} frame with {len} payload bytes")]
    Length { kind: NetKind, len: usize },
    #[error("stream {0} is already open")]
    AlreadyOpen(u32),
    #[error("more than {MAX_STREAMS} streams open")]
    TooManyStreams,
    #[error("stream {stream}: {bytes} bytes beyond the window of {WINDOW}")]
    Window { stream: u32, bytes: u64 },
    #[error("stream {stream}: a credit of {bytes} bytes for fewer sent")]
    Overcredit { stream: u32, bytes: u32 },
}

/// The frame's bytes. Panics never: a payload over [`MAX_DATA`] is an
/// error, as the peer would refuse it.
pub fn encode_net(frame: &NetFrame) -> Result<Vec<u8>, NetError> {
    let (kind, payload): (NetKind, std::borrow::Cow<'_, [u8]>) = match frame {
        NetFrame::Open { .. } => (NetKind::Open, (&[][..]).into()),
        NetFrame::Data { bytes, .. } => (NetKind::Data, bytes.as_slice().into()),
        NetFrame::Credit { bytes, .. } => (NetKind::Credit, bytes.to_le_bytes().to_vec().into()),
        NetFrame::Close { .. } => (NetKind::Close, (&[][..]).into()),
        NetFrame::Reset { .. } => (NetKind::Reset, (&[][..]).into()),
    };
    let stream = frame.stream();
    check_payload(kind, stream, payload.len())?;
    let mut out = Vec::with_capacity(NET_HEADER_LEN + payload.len());
    out.extend_from_slice(&NET_MAGIC);
    out.push(kind as u8);
    out.push(0);
    out.extend_from_slice(&(payload.len() as u16).to_le_bytes());
    out.extend_from_slice(&stream.to_le_bytes());
    out.extend_from_slice(&payload);
    Ok(out)
}

fn check_payload(kind: NetKind, stream: u32, len: usize) -> Result<(), NetError> {
    if stream == 0 {
        return Err(NetError::StreamZero);
    }
    let ok = match kind {
        NetKind::Data => (1..=MAX_DATA).contains(&len),
        NetKind::Credit => len == 4,
        NetKind::Open | NetKind::Close | NetKind::Reset => len == 0,
    };
    if ok {
        Ok(())
    } else {
        Err(NetError::Length { kind, len })
    }
}

/// Takes one frame off the front of `buf`: `Ok(None)` when `buf` holds
/// only part of one (read more), else the frame and how many bytes it took.
/// Every header field is checked before the payload is looked at; an error
/// means the stream of bytes can no longer be trusted.
pub fn decode_net(buf: &[u8]) -> Result<Option<(NetFrame, usize)>, NetError> {
    let Some(head) = buf.get(..NET_HEADER_LEN) else {
        // A wrong magic is told as soon as its bytes are in.
        let have = buf.len().min(4);
        if buf[..have] != NET_MAGIC[..have] {
            let mut m = [0u8; 4];
            m[..have].copy_from_slice(&buf[..have]);
            return Err(NetError::Magic(m));
        }
        return Ok(None);
    };
    let magic = [head[0], head[1], head[2], head[3]];
    if magic != NET_MAGIC {
        return Err(NetError::Magic(magic));
    }
    let kind = NetKind::from_u8(head[4]).ok_or(NetError::Kind(head[4]))?;
    if head[5] != 0 {
        return Err(NetError::Flags(head[5]));
    }
    let len = usize::from(u16::from_le_bytes([head[6], head[7]]));
    let stream = u32::from_le_bytes([head[8], head[9], head[10], head[11]]);
    check_payload(kind, stream, len)?;
    let Some(payload) = buf.get(NET_HEADER_LEN..NET_HEADER_LEN + len) else {
        return Ok(None);
    };
    let frame = match kind {
        NetKind::Open => NetFrame::Open { stream },
        NetKind::Data => NetFrame::Data {
            stream,
            bytes: payload.to_vec(),
        },
        NetKind::Credit => NetFrame::Credit {
            stream,
            bytes: u32::from_le_bytes([payload[0], payload[1], payload[2], payload[3]]),
        },
        NetKind::Close => NetFrame::Close { stream },
        NetKind::Reset => NetFrame::Reset { stream },
    };
    Ok(Some((frame, NET_HEADER_LEN + len)))
}

/// One side's accounting of the open streams: what it may still send on
/// each, and what the peer has sent it that it has not credited back.
#[derive(Debug, Default)]
pub struct Streams {
    open: BTreeMap<u32, Window>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Window {
    /// Sent by us, not yet credited by the peer.
    sent: u32,
    /// Received from the peer, not yet credited by us.
    received: u32,
}

/// Adds `n` bytes to a stream's count of bytes in flight one way: an
/// error (the count unchanged) when that passes [`WINDOW`].
fn within_window(count: &mut u32, stream: u32, n: usize) -> Result<(), NetError> {
    let total = u64::from(*count) + n as u64;
    if total > u64::from(WINDOW) {
        return Err(NetError::Window {
            stream,
            bytes: total - u64::from(WINDOW),
        });
    }
    *count = total as u32;
    Ok(())
}

impl Streams {
    pub fn new() -> Streams {
        Streams::default()
    }

    /// How many streams are open.
    pub fn len(&self) -> usize {
        self.open.len()
    }

    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    pub fn is_open(&self, stream: u32) -> bool {
        self.open.contains_key(&stream)
    }

    /// A stream opens (sent or received).
    pub fn open(&mut self, stream: u32) -> Result<(), NetError> {
        if stream == 0 {
            return Err(NetError::StreamZero);
        }
        if self.open.contains_key(&stream) {
            return Err(NetError::AlreadyOpen(stream));
        }
        if self.open.len() >= MAX_STREAMS {
            return Err(NetError::TooManyStreams);
        }
        self.open.insert(stream, Window::default());
        Ok(())
    }

    /// A stream ends (reset either way, or closed both ways).
    pub fn forget(&mut self, stream: u32) {
        self.open.remove(&stream);
    }

    /// How many bytes this side may send on `stream` now (0 for a stream
    /// not open).
    pub fn sendable(&self, stream: u32) -> u32 {
        self.open
            .get(&stream)
            .map_or(0, |w| WINDOW.saturating_sub(w.sent))
    }

    /// This side sends `n` bytes on `stream` (at most [`Streams::sendable`]).
    pub fn sent(&mut self, stream: u32, n: usize) -> Result<(), NetError> {
        let w = self.open.get_mut(&stream).ok_or(NetError::Window {
            stream,
            bytes: n as u64,
        })?;
        within_window(&mut w.sent, stream, n)
    }

    /// The peer sent `n` bytes on `stream`: an error when that is beyond
    /// its window. Data for a stream not open (one this side just reset)
    /// is not counted: the caller drops it.
    pub fn received(&mut self, stream: u32, n: usize) -> Result<(), NetError> {
        let Some(w) = self.open.get_mut(&stream) else {
            return Ok(());
        };
        within_window(&mut w.received, stream, n)
    }

    /// This side consumed `n` received bytes of `stream` and credits them
    /// back: the `Credit` frame to send (none for a stream not open).
    pub fn consumed(&mut self, stream: u32, n: u32) -> Option<NetFrame> {
        let w = self.open.get_mut(&stream)?;
        let n = n.min(w.received);
        if n == 0 {
            return None;
        }
        w.received -= n;
        Some(NetFrame::Credit { stream, bytes: n })
    }

    /// The peer credited `n` bytes back: more may be sent. A credit for
    /// more than was sent is an error; one for a stream not open is
    /// dropped.
    pub fn credited(&mut self, stream: u32, n: u32) -> Result<(), NetError> {
        let Some(w) = self.open.get_mut(&stream) else {
            return Ok(());
        };
        if n > w.sent {
            return Err(NetError::Overcredit { stream, bytes: n });
        }
        w.sent -= n;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_arrive_in_pieces() {
        let frames = [
            NetFrame::Open { stream: 1 },
            NetFrame::Data {
                stream: 1,
                bytes: b"GET / HTTP/1.1\r\n".to_vec(),
            },
            NetFrame::Credit {
                stream: 7,
                bytes: 65536,
            },
            NetFrame::Close { stream: 1 },
            NetFrame::Reset { stream: u32::MAX },
        ];
        let wire: Vec<u8> = frames.iter().flat_map(|f| encode_net(f).unwrap()).collect();
        // Fed a byte at a time: nothing is taken before a frame is whole.
        let mut buf = Vec::new();
        let mut got = Vec::new();
        for b in wire {
            buf.push(b);
            if let Some((f, used)) = decode_net(&buf).unwrap() {
                buf.drain(..used);
                got.push(f);
            }
        }
        assert!(buf.is_empty());
        assert_eq!(got, frames);
    }

    #[test]
    fn bad_frames_are_refused_before_their_payload() {
        let good = encode_net(&NetFrame::Open { stream: 3 }).unwrap();
        let with = |at: usize, v: u8| {
            let mut b = good.clone();
            b[at] = v;
            decode_net(&b)
        };
        assert!(matches!(decode_net(b"HNE"), Ok(None)));
        assert!(matches!(decode_net(b"HUL"), Err(NetError::Magic(_))));
        assert!(matches!(decode_net(b"XX"), Err(NetError::Magic(_))));
        assert!(matches!(with(4, 9), Err(NetError::Kind(9))));
        assert!(matches!(with(5, 1), Err(NetError::Flags(1))));
        // Open with a payload; a length beyond MAX_DATA is refused from the
        // header alone, whatever follows.
        assert!(matches!(with(6, 1), Err(NetError::Length { .. })));
        let mut huge = encode_net(&NetFrame::Data {
            stream: 3,
            bytes: vec![0; 8],
        })
        .unwrap();
        huge[6..8].copy_from_slice(&u16::MAX.to_le_bytes());
        huge.truncate(NET_HEADER_LEN);
        assert!(matches!(decode_net(&huge), Err(NetError::Length { .. })));
        let mut zero = good.clone();
        zero[8..12].copy_from_slice(&0u32.to_le_bytes());
        assert_eq!(decode_net(&zero), Err(NetError::StreamZero));
        // Data of no bytes, a credit of the wrong size: refused.
        for f in [
            NetFrame::Data {
                stream: 1,
                bytes: Vec::new(),
            },
            NetFrame::Data {
                stream: 1,
                bytes: vec![0; MAX_DATA + 1],
            },
        ] {
            assert!(matches!(encode_net(&f), Err(NetError::Length { .. })));
        }
    }

    #[test]
    fn the_window_bounds_what_a_peer_can_make_the_other_hold() {
        let mut s = Streams::new();
        s.open(1).unwrap();
        assert_eq!(s.open(1), Err(NetError::AlreadyOpen(1)));
        // A flooding peer: the window is all it gets.
        let chunk = MAX_DATA;
        let mut taken = 0usize;
        while s.received(1, chunk).is_ok() {
            taken += chunk;
        }
        assert_eq!(taken, WINDOW as usize);
        // Crediting back lets exactly that much more in.
        assert_eq!(
            s.consumed(1, 1000),
            Some(NetFrame::Credit {
                stream: 1,
                bytes: 1000
            })
        );
        assert!(s.received(1, 1000).is_ok());
        assert!(s.received(1, 1).is_err());
        // Sending: sendable shrinks, a credit restores it, an over-credit
        // is an error.
        assert_eq!(s.sendable(1), WINDOW);
        s.sent(1, 4096).unwrap();
        assert_eq!(s.sendable(1), WINDOW - 4096);
        assert!(s.sent(1, WINDOW as usize).is_err());
        s.credited(1, 4096).unwrap();
        assert_eq!(s.sendable(1), WINDOW);
        assert!(matches!(s.credited(1, 1), Err(NetError::Overcredit { .. })));
        // Data and credits for a stream not open are dropped, not counted.
        s.forget(1);
        assert!(s.received(1, MAX_DATA).is_ok());
        assert_eq!(s.sendable(1), 0);
        // At most MAX_STREAMS at once.
        for id in 1..=MAX_STREAMS as u32 {
            s.open(id).unwrap();
        }
        assert_eq!(s.open(10_000), Err(NetError::TooManyStreams));
        assert_eq!(s.len(), MAX_STREAMS);
    }
}
