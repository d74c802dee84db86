//! The command's environment handed to a child `hull run` through a
//! descriptor (`hull run --env-fd N`) instead of its command line, which
//! every local user can read in `/proc/PID/cmdline`: a session exec's or a
//! batch job's secrets stay between hull and the command.
//!
//! The descriptor is a sealed memfd of `K=V` entries, each ended by a NUL;
//! it is close-on-exec except in the one child it is meant for.

use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// The most bytes read from the descriptor.
pub const MAX_BYTES: u64 = 1 << 20;
/// The most entries.
pub const MAX_ENTRIES: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum EnvFdError {
    #[error("--env-fd {fd}: not an open descriptor of hull's (0, 1 and 2 are not taken)")]
    NotOpen { fd: RawFd },
    #[error("--env-fd {fd}: cannot read: {source}")]
    Read {
        fd: RawFd,
        #[source]
        source: std::io::Error,
    },
    #[error("--env-fd {fd}: more than {MAX_BYTES} bytes or {MAX_ENTRIES} entries")]
    TooLarge { fd: RawFd },
    #[error("--env-fd {fd}: entry {n} is not K=V with a name of letters, digits and _")]
    Bad { fd: RawFd, n: usize },
}

/// The entries as the descriptor carries them; a name with `=` or a NUL
/// anywhere is refused (it would change what the entries say).
pub fn encode(env: &[(String, String)]) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    for (k, v) in env {
        if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{k:?}: not a variable"),
            ));
        }
        out.extend_from_slice(k.as_bytes());
        out.push(b'=');
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    Ok(out)
}

/// A sealed memfd holding `env` (close-on-exec: [`keep_in_child`] clears
/// that in the child it is for).
pub fn memfd(env: &[(String, String)]) -> std::io::Result<OwnedFd> {
    super::memfd::sealed("hull-env", &encode(env)?)
}

/// Clears close-on-exec on `fd` (in a child between fork and exec; only
/// async-signal-safe calls).
pub fn keep_in_child(fd: RawFd) -> std::io::Result<()> {
    // SAFETY: fcntl with integer arguments on a descriptor number.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Takes ownership of descriptor `fd`, handed to this process by its
/// caller on the command line (`--env-fd`, `--vm-turn-fd`): None unless it
/// is open and not a standard stream. Close-on-exec from here on.
pub fn adopt(fd: RawFd) -> Option<OwnedFd> {
    // SAFETY: fcntl(F_GETFD) with integer arguments only asks whether the
    // descriptor is open.
    if fd <= 2 || unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return None;
    }
    // SAFETY: the descriptor is open and was handed to this process to
    // own; nothing else in hull refers to it (each flag is read once).
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let _ = rustix::io::fcntl_setfd(&owned, rustix::io::FdFlags::CLOEXEC);
    Some(owned)
}

/// Takes descriptor `fd` (given to this process for it), reads its
/// entries and closes it.
pub fn take(fd: RawFd) -> Result<Vec<(String, String)>, EnvFdError> {
    let owned = adopt(fd).ok_or(EnvFdError::NotOpen { fd })?;
    let mut bytes = Vec::new();
    std::fs::File::from(owned)
        .take(MAX_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| EnvFdError::Read { fd, source })?;
    if bytes.len() as u64 > MAX_BYTES {
        return Err(EnvFdError::TooLarge { fd });
    }
    // Every entry ends with a NUL: none after the last.
    let Some(body) = bytes.strip_suffix(&[0]) else {
        return match bytes.is_empty() {
            true => Ok(Vec::new()),
            false => Err(EnvFdError::Bad {
                fd,
                n: bytes.iter().filter(|b| **b == 0).count() + 1,
            }),
        };
    };
    let mut out = Vec::new();
    for (n, entry) in body.split(|b| *b == 0).enumerate() {
        let bad = || EnvFdError::Bad { fd, n: n + 1 };
        let text = std::str::from_utf8(entry).map_err(|_| bad())?;
        let (k, v) = text.split_once('=').ok_or_else(bad)?;
        if k.is_empty() || !k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(bad());
        }
        out.push((k.to_string(), v.to_string()));
        if out.len() > MAX_ENTRIES {
            return Err(EnvFdError::TooLarge { fd });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_go_through_a_descriptor_and_come_back_exactly() {
        let env = vec![
            ("A".to_string(), "x=y z\nw".to_string()),
            ("EMPTY".to_string(), String::new()),
        ];
        let fd = memfd(&env).unwrap();
        let raw = rustix::io::dup(&fd).unwrap();
        let n = std::os::fd::IntoRawFd::into_raw_fd(raw);
        assert_eq!(take(n).unwrap(), env);
        // SAFETY: fcntl(F_GETFD) with integer arguments.
        assert!(unsafe { libc::fcntl(n, libc::F_GETFD) } < 0, "closed after");
        assert!(encode(&[("A=B".into(), "v".into())]).is_err());
        assert!(matches!(take(1), Err(EnvFdError::NotOpen { .. })));
    }
}
