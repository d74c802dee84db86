//! The typed messages and their payload (de)serialization and validation.
//!
//! Guards against: a payload that parses but is out of bounds (every list and
//! string is checked against [`crate::limits`]), payload text the other side
//! cannot reproduce (unknown JSON fields are rejected), and error frames that
//! leak debug dumps (`Error` carries a code and a bounded message only).

use serde::{Deserialize, Serialize};

use crate::bytes::Bytes;
use crate::frame::{Kind, Payload};
use crate::limits::*;
use crate::setup::{ConfigureSpec, Configured};

/// Who is speaking.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// hull on the host.
    Host,
    /// `hull-agent outer`, in the outer VM.
    OuterAgent,
    /// `hull-agent inner` (or `serve`), next to the commands it runs.
    InnerAgent,
}

/// The first message of each side.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hello {
    /// Highest protocol version this side speaks.
    pub version: u32,
    /// Lowest protocol version this side speaks.
    pub min_version: u32,
    pub role: Role,
    /// Free text for logs, for example `hull-agent 0.1.0`. At most
    /// [`MAX_SOFTWARE`] bytes.
    pub software: String,
}

/// Run a command. Sent by the host under a fresh non-zero id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Exec {
    /// Program and arguments; `argv[0]` is looked up in the `PATH` of `env`
    /// when it has no slash. Bytes, so non-UTF-8 arguments survive.
    pub argv: Vec<Bytes>,
    /// The complete environment of the command (nothing is inherited).
    pub env: Vec<(String, String)>,
    /// Working directory; empty means the agent's own.
    pub cwd: Bytes,
    /// Wall-time limit for the whole process tree.
    pub timeout_ms: Option<u64>,
    /// Whether the host will send `Stdin`; otherwise stdin is `/dev/null`.
    pub stdin: bool,
    /// Run as this uid (requires `gid` too).
    pub uid: Option<u32>,
    /// Run as this gid, which is also the only supplementary group.
    pub gid: Option<u32>,
    /// Directories of the agent's own filesystem to empty before the
    /// command starts, as the exec's uid and gid (required), on their own
    /// filesystem only and following no link: what the last command left
    /// there reaches no later one. The command does not start when one
    /// cannot be emptied. At most [`MAX_SCRUB`], each absolute.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scrub: Vec<Bytes>,
    /// What the command leaves running when it exits by itself runs on,
    /// until the session ends (a session's own sandbox, as `docker exec`
    /// does); without it the exec's whole tree ends with the command. A
    /// kill or a timeout ends the whole tree either way.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub keep_leftovers: bool,
    /// Run as this user of the agent's system, by name: its uid and
    /// primary gid as the agent's `/etc/passwd` gives them (the gid the
    /// only supplementary group), `HOME`, `USER` and `LOGNAME` set from
    /// it. Not with `uid` and `gid`. At most [`MAX_USER`] bytes, a name
    /// as `useradd` takes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExitStatus {
    /// Exited with this code.
    Code(i32),
    /// Killed by this signal.
    Signal(i32),
    /// Killed by the agent after `timeout_ms`.
    TimedOut,
}

macro_rules! error_codes {
    ($( $(#[$doc:meta])* $name:ident = $val:literal, )*) => {
        /// Stable error codes carried by `Error` frames. The numbers are part
        /// of the wire format: never renumber, only add.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u16)]
        pub enum ErrorCode {
            $( $(#[$doc])* $name = $val, )*
        }

        impl ErrorCode {
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$name,)*];

            pub fn from_u16(v: u16) -> Option<ErrorCode> {
                match v {
                    $( $val => Some(ErrorCode::$name), )*
                    _ => None,
                }
            }

            pub fn name(self) -> &'static str {
                match self {
                    $( ErrorCode::$name => stringify!($name), )*
                }
            }
        }
    };
}

error_codes! {
    /// A frame could not be parsed: bad magic, unknown flag bits, a payload
    /// that is not valid JSON for its kind, an id that breaks the kind's rule.
    /// Fatal: the sender closes the connection.
    BadFrame = 1,
    /// A frame announced a payload above `MAX_PAYLOAD`. Fatal.
    Oversized = 2,
    /// A frame kind this side does not know. Fatal.
    UnknownKind = 3,
    /// The two `Hello`s share no protocol version. Fatal.
    VersionMismatch = 4,
    /// A well-formed message that is not allowed here: out of bounds, out of
    /// order (no `Hello` first, `Stdin` after `StdinEof`), an id already in
    /// use, a message only the other side may send.
    BadRequest = 5,
    /// The command could not be started (program not found, not executable,
    /// the uid switch failed). Terminal for that exec id.
    ExecFailed = 6,
    /// A frame names an exec id that is not running (stdin or a kill for an
    /// exec that has just ended is dropped instead: the host could not know,
    /// and the exec's terminal frame is on its way).
    UnknownId = 7,
    /// The request is refused by the agent's session policy.
    PolicyDenied = 8,
    /// `Configure` failed (container, shares, limits); the message says which step.
    SetupFailed = 9,
    /// The agent failed in a way that is not the request's fault.
    Internal = 10,
    /// Too many concurrent execs; retry after one ends.
    Busy = 11,
    /// An operation of the agent itself timed out (not a command's `timeout_ms`,
    /// which is reported as `Exit(TimedOut)`).
    Timeout = 12,
    /// A valid message this role does not handle (for example `Configure`
    /// sent to an inner agent).
    Unsupported = 13,
    /// The peer broke stdin flow control (more than `STDIN_WINDOW` bytes unacknowledged).
    FlowControl = 14,
    /// The command's program is not there (not in its `PATH`, or no such
    /// file). Terminal for that exec id; the host exits 127, as a shell.
    CommandNotFound = 15,
    /// The command's program is there but cannot be executed (no execute
    /// permission, a directory, a `noexec` mount, an unknown format).
    /// Terminal for that exec id; the host exits 126, as a shell.
    CommandNotExecutable = 16,
    /// Processes of the command outlived its kill past the agent's bound
    /// (uninterruptible sleep): the sandbox must not serve another command,
    /// and the host takes its VM down. Terminal for that exec id.
    TreeSurvived = 17,
    /// A directory of the exec's `scrub` could not be emptied: the command
    /// did not start, and the sandbox must not serve another command (what
    /// an earlier one left may still be there): the host takes its VM
    /// down. Terminal for that exec id.
    ScrubFailed = 18,
    /// The exec's `user` is not a user of the agent's system (its
    /// `/etc/passwd`): the command did not start. Terminal for that exec
    /// id; the host exits 126, as `docker exec -u` does.
    UnknownUser = 19,
}

impl Serialize for ErrorCode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u16(*self as u16)
    }
}

impl<'de> Deserialize<'de> for ErrorCode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = u16::deserialize(d)?;
        ErrorCode::from_u16(v)
            .ok_or_else(|| serde::de::Error::custom(format_args!("unknown error code {v}")))
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name(), *self as u16)
    }
}

/// Every message of the protocol. The kind, payload form and id rule of each
/// are listed in [`Kind`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// Both sides, first, id 0.
    Hello(Hello),
    /// Host to outer agent, id 0: set up the tier-3 container.
    Configure(ConfigureSpec),
    /// Outer agent to host, id 0: the container is ready.
    Configured(Configured),
    /// Host to agent: run a command under this id.
    Exec(Exec),
    /// Agent to host: the command runs with this pid (in the agent's pid namespace).
    Started { pid: u32 },
    /// Host to agent: bytes for the command's stdin.
    Stdin(Vec<u8>),
    /// Host to agent: close the command's stdin.
    StdinEof,
    /// Agent to host: this many stdin bytes were consumed (written to the
    /// command, or dropped because it closed its stdin).
    StdinAck { bytes: u64 },
    /// Agent to host: output, as it arrives.
    Stdout(Vec<u8>),
    /// Agent to host: output, as it arrives.
    Stderr(Vec<u8>),
    /// Agent to host, just before `Exit`: what the command used. The
    /// container's peak memory while it ran (its cgroup's `memory.peak`,
    /// reset when the command started; the container's other processes
    /// included), when the guest can tell.
    Usage { peak_memory_bytes: u64 },
    /// Agent to host: the command ended and all its output was sent. Terminal.
    Exit(ExitStatus),
    /// Host to agent: deliver a signal to the command's process group.
    Signal { signo: i32 },
    /// Host to agent: kill the command's whole process tree.
    Kill,
    /// Either side, id 0.
    Ping { nonce: u64 },
    /// Answer to `Ping`, same nonce.
    Pong { nonce: u64 },
    /// Host to agent, id 0: kill every exec and end the session.
    Shutdown,
    /// Either side. Id 0: about the connection (fatal codes close it);
    /// non-zero: about that exec, terminal for it.
    Error { code: ErrorCode, message: String },
}

/// One decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub id: u32,
    pub message: Message,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PidP {
    pid: u32,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct AckP {
    bytes: u64,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct UsageP {
    peak_memory_bytes: u64,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SignalP {
    signo: i32,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct NonceP {
    nonce: u64,
}

#[derive(Serialize)]
struct ErrorOut<'a> {
    code: ErrorCode,
    message: &'a str,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ErrorIn {
    code: ErrorCode,
    message: String,
}

/// Why a payload was refused (wrapped into a `DecodeError` with the kind).
#[derive(Debug)]
pub(crate) enum PayloadError {
    Json(String),
    Invalid(String),
    NotEmpty(usize),
}

impl Message {
    /// An `Error` message. The text is truncated to [`MAX_ERROR_MESSAGE`]
    /// bytes when encoded; build it from `Display`, never from `Debug`.
    pub fn error(code: ErrorCode, message: impl Into<String>) -> Message {
        Message::Error {
            code,
            message: message.into(),
        }
    }

    pub fn kind(&self) -> Kind {
        match self {
            Message::Hello(_) => Kind::Hello,
            Message::Configure(_) => Kind::Configure,
            Message::Configured(_) => Kind::Configured,
            Message::Exec(_) => Kind::Exec,
            Message::Started { .. } => Kind::Started,
            Message::Stdin(_) => Kind::Stdin,
            Message::StdinEof => Kind::StdinEof,
            Message::StdinAck { .. } => Kind::StdinAck,
            Message::Stdout(_) => Kind::Stdout,
            Message::Stderr(_) => Kind::Stderr,
            Message::Exit(_) => Kind::Exit,
            Message::Usage { .. } => Kind::Usage,
            Message::Signal { .. } => Kind::Signal,
            Message::Kill => Kind::Kill,
            Message::Ping { .. } => Kind::Ping,
            Message::Pong { .. } => Kind::Pong,
            Message::Shutdown => Kind::Shutdown,
            Message::Error { .. } => Kind::Error,
        }
    }

    /// Length of a raw payload, for a size check before copying it.
    pub(crate) fn raw_len(&self) -> Option<usize> {
        match self {
            Message::Stdin(b) | Message::Stdout(b) | Message::Stderr(b) => Some(b.len()),
            _ => None,
        }
    }

    /// Check every bound of the message (both when encoding and decoding).
    pub fn validate(&self) -> Result<(), String> {
        match self {
            Message::Hello(h) => validate_hello(h),
            Message::Configure(spec) => spec.validate(),
            Message::Configured(c) => c.validate(),
            Message::Exec(e) => validate_exec(e),
            Message::Started { pid } => {
                if *pid == 0 || *pid > i32::MAX as u32 {
                    return Err(format!("pid {pid} is out of range"));
                }
                Ok(())
            }
            Message::StdinAck { bytes } => {
                if *bytes > STDIN_WINDOW {
                    return Err(format!(
                        "acknowledges {bytes} bytes, more than the {STDIN_WINDOW}-byte window"
                    ));
                }
                Ok(())
            }
            Message::Exit(ExitStatus::Signal(n)) | Message::Signal { signo: n } => {
                if !(1..=MAX_SIGNAL).contains(n) {
                    return Err(format!("signal {n} is not in 1..={MAX_SIGNAL}"));
                }
                Ok(())
            }
            Message::Usage { peak_memory_bytes } => {
                if *peak_memory_bytes > MAX_PEAK_MEMORY {
                    return Err(format!(
                        "a peak of {peak_memory_bytes} bytes is beyond any guest's memory"
                    ));
                }
                Ok(())
            }
            Message::Exit(_)
            | Message::Stdin(_)
            | Message::StdinEof
            | Message::Stdout(_)
            | Message::Stderr(_)
            | Message::Kill
            | Message::Ping { .. }
            | Message::Pong { .. }
            | Message::Shutdown
            | Message::Error { .. } => Ok(()),
        }
    }

    /// Append the payload bytes to `out`.
    pub(crate) fn write_payload(&self, out: &mut Vec<u8>) -> Result<(), String> {
        let json = |out: &mut Vec<u8>, v: &dyn erased::Ser| v.to_json(out);
        match self {
            Message::Hello(h) => json(out, h),
            Message::Configure(s) => json(out, s),
            Message::Configured(c) => json(out, c),
            Message::Exec(e) => json(out, e),
            Message::Started { pid } => json(out, &PidP { pid: *pid }),
            Message::StdinAck { bytes } => json(out, &AckP { bytes: *bytes }),
            Message::Exit(st) => json(out, st),
            Message::Usage { peak_memory_bytes } => json(
                out,
                &UsageP {
                    peak_memory_bytes: *peak_memory_bytes,
                },
            ),
            Message::Signal { signo } => json(out, &SignalP { signo: *signo }),
            Message::Ping { nonce } | Message::Pong { nonce } => {
                json(out, &NonceP { nonce: *nonce })
            }
            Message::Error { code, message } => json(
                out,
                &ErrorOut {
                    code: *code,
                    message: truncate_utf8(message, MAX_ERROR_MESSAGE),
                },
            ),
            Message::Stdin(b) | Message::Stdout(b) | Message::Stderr(b) => {
                out.extend_from_slice(b);
                Ok(())
            }
            Message::StdinEof | Message::Kill | Message::Shutdown => Ok(()),
        }
    }

    /// Parse and validate the payload of a frame of `kind`.
    pub(crate) fn from_payload(kind: Kind, payload: &[u8]) -> Result<Message, PayloadError> {
        match kind.payload() {
            Payload::Empty if !payload.is_empty() => {
                return Err(PayloadError::NotEmpty(payload.len()))
            }
            _ => {}
        }
        let msg = match kind {
            Kind::Hello => Message::Hello(parse(payload)?),
            Kind::Configure => Message::Configure(parse(payload)?),
            Kind::Configured => Message::Configured(parse(payload)?),
            Kind::Exec => Message::Exec(parse(payload)?),
            Kind::Started => Message::Started {
                pid: parse::<PidP>(payload)?.pid,
            },
            Kind::StdinAck => Message::StdinAck {
                bytes: parse::<AckP>(payload)?.bytes,
            },
            Kind::Exit => Message::Exit(parse(payload)?),
            Kind::Usage => Message::Usage {
                peak_memory_bytes: parse::<UsageP>(payload)?.peak_memory_bytes,
            },
            Kind::Signal => Message::Signal {
                signo: parse::<SignalP>(payload)?.signo,
            },
            Kind::Ping => Message::Ping {
                nonce: parse::<NonceP>(payload)?.nonce,
            },
            Kind::Pong => Message::Pong {
                nonce: parse::<NonceP>(payload)?.nonce,
            },
            Kind::Error => {
                let e: ErrorIn = parse(payload)?;
                if e.message.len() > MAX_ERROR_MESSAGE {
                    return Err(PayloadError::Invalid(format!(
                        "error message of {} bytes exceeds {MAX_ERROR_MESSAGE}",
                        e.message.len()
                    )));
                }
                Message::Error {
                    code: e.code,
                    message: e.message,
                }
            }
            Kind::Stdin => Message::Stdin(payload.to_vec()),
            Kind::Stdout => Message::Stdout(payload.to_vec()),
            Kind::Stderr => Message::Stderr(payload.to_vec()),
            Kind::StdinEof => Message::StdinEof,
            Kind::Kill => Message::Kill,
            Kind::Shutdown => Message::Shutdown,
        };
        msg.validate().map_err(PayloadError::Invalid)?;
        Ok(msg)
    }
}

fn parse<'a, T: Deserialize<'a>>(payload: &'a [u8]) -> Result<T, PayloadError> {
    serde_json::from_slice(payload).map_err(|e| PayloadError::Json(e.to_string()))
}

mod erased {
    /// Object-safe "serialize to JSON" so `write_payload` has one call site.
    pub(super) trait Ser {
        fn to_json(&self, out: &mut Vec<u8>) -> Result<(), String>;
    }

    impl<T: serde::Serialize> Ser for T {
        fn to_json(&self, out: &mut Vec<u8>) -> Result<(), String> {
            serde_json::to_writer(out, self).map_err(|e| e.to_string())
        }
    }
}

/// The longest prefix of `s` of at most `max` bytes that ends on a char boundary.
pub(crate) fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn validate_hello(h: &Hello) -> Result<(), String> {
    if h.software.len() > MAX_SOFTWARE {
        return Err(format!(
            "software string of {} bytes exceeds {MAX_SOFTWARE}",
            h.software.len()
        ));
    }
    if h.min_version == 0 || h.min_version > h.version {
        return Err(format!(
            "version range {}..={} is empty or starts at 0",
            h.min_version, h.version
        ));
    }
    Ok(())
}

/// Whether `u` is a user name as `useradd` takes it (Debian's default
/// `NAME_REGEX`, upper case and a trailing `$` too): 1 to [`MAX_USER`]
/// bytes of ASCII letters, digits, `_`, `-` and `.`, not starting with
/// `-`, and not digits only (which would read as a uid); else why not.
/// The one check of an `Exec.user`, `hull run --user` and the API's.
pub fn check_user_name(u: &str) -> Result<(), String> {
    let b = u.as_bytes();
    let body = b.strip_suffix(b"$").unwrap_or(b);
    let ok = !body.is_empty()
        && b.len() <= MAX_USER
        && body[0] != b'-'
        && !body.iter().all(u8::is_ascii_digit)
        && body
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.'));
    if ok {
        return Ok(());
    }
    Err(format!(
        "user {:?} is not a user name (1 to {MAX_USER} bytes of letters, digits, _, - and ., \
         not starting with - and not digits only)",
        u.chars().take(64).collect::<String>()
    ))
}

fn validate_exec(e: &Exec) -> Result<(), String> {
    if e.argv.is_empty() {
        return Err("argv is empty".into());
    }
    if e.argv.len() > MAX_ARGS {
        return Err(format!(
            "argv has {} entries, more than {MAX_ARGS}",
            e.argv.len()
        ));
    }
    let argv_bytes: usize = e.argv.iter().map(|a| a.len() + 1).sum();
    if argv_bytes > MAX_ARGV_BYTES {
        return Err(format!(
            "argv has {argv_bytes} bytes, more than {MAX_ARGV_BYTES}"
        ));
    }
    if let Some(i) = e.argv.iter().position(|a| a.as_slice().contains(&0)) {
        return Err(format!("argv[{i}] contains a NUL byte"));
    }
    if e.argv[0].is_empty() {
        return Err("argv[0] is empty".into());
    }
    if e.env.len() > MAX_ENV {
        return Err(format!(
            "env has {} entries, more than {MAX_ENV}",
            e.env.len()
        ));
    }
    let env_bytes: usize = e.env.iter().map(|(k, v)| k.len() + v.len() + 2).sum();
    if env_bytes > MAX_ENV_BYTES {
        return Err(format!(
            "env has {env_bytes} bytes, more than {MAX_ENV_BYTES}"
        ));
    }
    for (i, (k, v)) in e.env.iter().enumerate() {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(format!(
                "env[{i}] has an invalid name (empty, or contains '=' or NUL)"
            ));
        }
        if v.contains('\0') {
            return Err(format!("env[{i}] value contains a NUL byte"));
        }
    }
    if e.cwd.len() > MAX_PATH {
        return Err(format!(
            "cwd has {} bytes, more than {MAX_PATH}",
            e.cwd.len()
        ));
    }
    if e.cwd.as_slice().contains(&0) {
        return Err("cwd contains a NUL byte".into());
    }
    if let Some(t) = e.timeout_ms {
        if t > MAX_TIMEOUT_MS {
            return Err(format!("timeout_ms {t} exceeds {MAX_TIMEOUT_MS}"));
        }
    }
    if e.uid.is_some() != e.gid.is_some() {
        return Err("uid and gid must be given together".into());
    }
    if let Some(u) = &e.user {
        if e.uid.is_some() {
            return Err("user is not given with uid and gid".into());
        }
        check_user_name(u)?;
    }
    if e.scrub.len() > MAX_SCRUB {
        return Err(format!(
            "scrub has {} directories, more than {MAX_SCRUB}",
            e.scrub.len()
        ));
    }
    if !e.scrub.is_empty() && e.uid.is_none() && e.user.is_none() {
        return Err("scrub needs the user, or the uid and gid, it runs as".into());
    }
    for (i, d) in e.scrub.iter().enumerate() {
        let d = d.as_slice();
        if d.len() > MAX_PATH {
            return Err(format!(
                "scrub[{i}] has {} bytes, more than {MAX_PATH}",
                d.len()
            ));
        }
        if d.first() != Some(&b'/') || d.contains(&0) {
            return Err(format!(
                "scrub[{i}] is not an absolute path without NUL bytes"
            ));
        }
    }
    Ok(())
}
