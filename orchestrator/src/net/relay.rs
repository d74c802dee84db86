//! The relay inside a sandbox that has a network namespace of its own
//! (bwrap): it listens on the sandbox's loopback, where `HTTP_PROXY` points,
//! and carries each connection to the proxy's unix socket, bound into the
//! sandbox. It starts the command as its child and exits as the command
//! did (its code, or the same signal).

use std::ffi::OsString;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

/// Where the relay listens in the sandbox, and what `HTTP_PROXY` says.
pub const LISTEN: &str = "127.0.0.1:3128";

/// The variables that point the command's clients at the relay; `NO_PROXY`
/// is removed (nothing is reached directly).
pub fn proxy_env() -> Vec<(String, String)> {
    let url = format!("http://{LISTEN}");
    ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"]
        .into_iter()
        .flat_map(|k| [k.to_string(), k.to_ascii_lowercase()])
        .map(|k| (k, url.clone()))
        .collect()
}

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("the network relay cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("the network relay cannot start {program}: {source}")]
    Start {
        program: String,
        #[source]
        source: io::Error,
    },
    #[error("the network relay lost its command: {0}")]
    Wait(#[source] io::Error),
}

/// Listens on `listen`, starts `argv`, relays until it exits; returns its
/// exit code (a command killed by a signal is re-raised here first).
pub fn run(listen: SocketAddr, socket: PathBuf, argv: &[OsString]) -> Result<i32, RelayError> {
    let l = TcpListener::bind(listen).map_err(|source| RelayError::Listen {
        addr: listen,
        source,
    })?;
    let program = argv.first().cloned().unwrap_or_default();
    let mut child = std::process::Command::new(&program)
        .args(argv.iter().skip(1))
        .spawn()
        .map_err(|source| RelayError::Start {
            program: program.to_string_lossy().into_owned(),
            source,
        })?;
    std::thread::spawn(move || accept_loop(l, &socket));
    let st = child.wait().map_err(RelayError::Wait)?;
    use std::os::unix::process::ExitStatusExt;
    if let Some(sig) = st.signal() {
        // SAFETY: signal(2) to the default action, then kill(2) of this
        // process with the command's signal: integers only.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::kill(libc::getpid(), sig);
        }
        return Ok(128 + sig);
    }
    Ok(st.code().unwrap_or(crate::EXIT_HULL_FAILED))
}

fn accept_loop(l: TcpListener, socket: &Path) {
    for conn in l.incoming() {
        let Ok(conn) = conn else {
            // EMFILE and the like: wait a moment instead of spinning.
            std::thread::sleep(std::time::Duration::from_millis(50));
            continue;
        };
        let socket = socket.to_path_buf();
        std::thread::spawn(move || {
            if let Err(e) = carry(conn, &socket) {
                tracing::debug!("relay: {e}");
            }
        });
    }
}

/// Copies both ways until each side has finished sending.
pub fn carry(tcp: TcpStream, socket: &Path) -> io::Result<()> {
    let unix = UnixStream::connect(socket)?;
    let (mut t2, mut u2) = (tcp.try_clone()?, unix.try_clone()?);
    let up = std::thread::spawn(move || {
        let r = io::copy(&mut t2, &mut u2);
        let _ = u2.shutdown(Shutdown::Write);
        r
    });
    let (mut t1, mut u1) = (tcp, unix);
    let r = io::copy(&mut u1, &mut t1);
    let _ = t1.shutdown(Shutdown::Write);
    let _ = up.join();
    r.map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixListener;

    /// A connection to the relay reaches the unix socket, both ways, and
    /// each side sees the other's end.
    #[test]
    fn carries_both_ways() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("proxy.sock");
        let ul = UnixListener::bind(&sock).unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = ul.accept().unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).unwrap();
            s.write_all(b"answer").unwrap();
            got
        });
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let sock2 = sock.clone();
        std::thread::spawn(move || accept_loop(l, &sock2));
        let mut c = TcpStream::connect(addr).unwrap();
        c.write_all(b"question").unwrap();
        c.shutdown(Shutdown::Write).unwrap();
        let mut back = Vec::new();
        c.read_to_end(&mut back).unwrap();
        assert_eq!(back, b"answer");
        assert_eq!(server.join().unwrap(), b"question");
    }
}
