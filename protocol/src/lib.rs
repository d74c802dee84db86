//! `hull-protocol`: the wire contract between hull (the host) and its guest
//! agents (`hull-agent` in the outer VM and inside the container).
//!
//! # Wire format
//!
//! Every frame is a fixed 16-byte little-endian header followed by a payload:
//!
//! | offset | size | field         | meaning                                        |
//! |--------|------|---------------|------------------------------------------------|
//! | 0      | 4    | `magic`       | the bytes `HULL`                               |
//! | 4      | 2    | `kind`        | a [`Kind`]; unknown kinds are rejected         |
//! | 6      | 2    | `flags`       | 0; any set bit is rejected (reserved)          |
//! | 8      | 4    | `id`          | exec/stream id; 0 is the control channel       |
//! | 12     | 4    | `payload_len` | at most [`MAX_PAYLOAD`], checked before any allocation |
//!
//! Control payloads are bounded serde JSON; stream payloads (stdin, stdout,
//! stderr) are raw bytes. See [`Message`] for every message, its kind and its id
//! rule, and [`ErrorCode`] for the stable error codes.
//!
//! # Conversation
//!
//! 1. Both sides send [`Message::Hello`] first (the agent does not wait for
//!    the host: on virtio-serial the host may connect before the guest opens
//!    the port). Each side checks the other's with [`negotiate`]; on failure it
//!    sends `Error{VersionMismatch}` and closes.
//! 2. The host sends `Exec` under a fresh non-zero id. The agent answers
//!    `Started{pid}`, then `Stdout`/`Stderr` as output arrives, then exactly
//!    one `Exit`, which the outer agent may precede with one `Usage` (the
//!    container's peak memory while the command ran). Instead of `Started`/`Exit` an exec may end with an `Error`
//!    frame carrying its id (for example `ExecFailed`): `Exit` and `Error` are
//!    the two terminal frames of an id.
//! 3. While an exec runs the host may send `Stdin`, `StdinEof`, `Signal` and
//!    `Kill` under its id. Stdin is flow-controlled: the host keeps at most
//!    [`limits::STDIN_WINDOW`] bytes sent but not yet acknowledged by a
//!    `StdinAck`; the agent treats more as a protocol violation.
//!
//! # What this crate protects against, and what it does not
//!
//! It protects the reader of a stream from a hostile writer: sizes are capped
//! before allocation, every header field and payload is validated, every
//! string and list in a control payload is bounded ([`limits`]), and a decode
//! error poisons the [`Decoder`] so a desynchronised stream is never
//! reinterpreted. It does not authenticate the peer, encrypt, or decide what
//! a valid request may do (policy is the agent's and the orchestrator's job);
//! a transport that can be spoofed must be secured below this crate.

mod bytes;
pub mod client;
mod decode;
mod error_text;
mod frame;
pub mod limits;
mod message;
pub mod mountinfo;
pub mod netmux;
pub mod setup;
pub mod shebang;
mod version;

pub use bytes::Bytes;
pub use client::{ConnError, Connection, FrameReader, FrameWriter};
pub use decode::{DecodeError, Decoder, BUFFER_CAPACITY};
pub use error_text::{error_chain, error_chain_with};
pub use frame::{encode, encode_into, EncodeError, Header, Kind, HEADER_LEN, MAGIC, MAX_PAYLOAD};
pub use message::{check_user_name, ErrorCode, Exec, ExitStatus, Frame, Hello, Message, Role};
pub use setup::{ConfigureSpec, Configured, ContainerSpec, NetworkSpec, OverlaySpec, Share};
pub use version::{negotiate, VersionError, VersionRange, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION};
