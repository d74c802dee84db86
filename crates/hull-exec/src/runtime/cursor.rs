//! The `hull read` cursor: where the next answer resumes.
//!
//! Opaque to callers: URL-safe base64 of a small JSON record with the
//! instance id, which root and path, the file's identity when the cursor was
//! made, the byte offset, the line at that offset and the lines left in the
//! selected range. It grants nothing: a decoded cursor goes through the same
//! path checks as a fresh request, so a forged one can only read what a
//! plain `hull read` could.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::{Deserialize, Serialize};

/// Longest cursor string accepted (checked before decoding).
pub(crate) const MAX_CURSOR_LEN: usize = 4096;

/// Which allowed root a path is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum RootKind {
    #[serde(rename = "p")]
    Project,
    #[serde(rename = "s")]
    Spill,
}

/// A file's identity: any change to it refuses the cursor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct FileIdent {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Cursor {
    pub v: u8,
    /// The instance the cursor belongs to (None: read without an instance).
    pub inst: Option<String>,
    pub root: RootKind,
    /// Relative to the root, `/`-separated, UTF-8.
    pub path: String,
    pub file: FileIdent,
    pub off: u64,
    /// Line number (1-based) of the byte at `off`.
    pub line: u64,
    /// Lines left in the range, counting the one at `off`; None: to the end.
    pub rem: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum CursorDecodeError {
    #[error("longer than {MAX_CURSOR_LEN} characters")]
    TooLong,
    #[error("not base64")]
    Base64,
    #[error("not a hull cursor")]
    Format,
    #[error("cursor version {0} is not supported")]
    Version(u8),
}

impl Cursor {
    pub(crate) const VERSION: u8 = 1;

    pub(crate) fn encode(&self) -> String {
        // Serializing a plain struct of strings and integers cannot fail.
        let json = serde_json::to_vec(self).unwrap_or_default();
        URL_SAFE_NO_PAD.encode(json)
    }

    pub(crate) fn decode(s: &str) -> Result<Cursor, CursorDecodeError> {
        let s = s.trim();
        if s.len() > MAX_CURSOR_LEN {
            return Err(CursorDecodeError::TooLong);
        }
        let raw = URL_SAFE_NO_PAD
            .decode(s)
            .map_err(|_| CursorDecodeError::Base64)?;
        let c: Cursor = serde_json::from_slice(&raw).map_err(|_| CursorDecodeError::Format)?;
        if c.v != Self::VERSION {
            return Err(CursorDecodeError::Version(c.v));
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_garbage() {
        let c = Cursor {
            v: 1,
            inst: Some("x".into()),
            root: RootKind::Spill,
            path: "a/b.txt".into(),
            file: FileIdent {
                dev: 1,
                ino: 2,
                size: 3,
                mtime_ns: -4,
            },
            off: 5,
            line: 6,
            rem: None,
        };
        let s = c.encode();
        assert!(s
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
        assert_eq!(Cursor::decode(&s).unwrap(), c);
        assert!(matches!(
            Cursor::decode("%%%"),
            Err(CursorDecodeError::Base64)
        ));
        assert!(matches!(
            Cursor::decode(&URL_SAFE_NO_PAD.encode(b"{\"v\":1}")),
            Err(CursorDecodeError::Format)
        ));
        assert!(matches!(
            Cursor::decode(&"A".repeat(5000)),
            Err(CursorDecodeError::TooLong)
        ));
        let mut v2 = c.clone();
        v2.v = 2;
        assert!(matches!(
            Cursor::decode(&v2.encode()),
            Err(CursorDecodeError::Version(2))
        ));
    }
}
