//! The byte pipes the agent serves on: a unix socket, its own stdio, or a
//! virtio-serial port.
//!
//! A [`Transport`] is a reader, a writer and a way to break both (so a
//! session can end even while a writer is blocked on a peer that stopped
//! reading). Guards against: protocol bytes mixing with stray output (the
//! stdio transport moves the protocol to private fds and points fd 0 at
//! `/dev/null` and fd 1 at stderr), a stale socket file (only a socket is
//! ever replaced), other local users (the socket is mode 0600), and a
//! virtio-serial host that is not connected (the agent waits for it instead
//! of writing into the void or spinning on EOF). It does not authenticate
//! the peer: whoever can open the socket or the port is the host.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("{path}: {what}: {source}")]
    Io {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("{path} exists and is not a socket; refusing to replace it")]
    NotASocket { path: PathBuf },
    #[error("no virtio-serial port named {name:?} under /sys/class/virtio-ports (found: {found})")]
    NoPort { name: String, found: String },
}

fn io_err<'a>(path: &'a Path, what: &'static str) -> impl FnOnce(io::Error) -> TransportError + 'a {
    move |source| TransportError::Io {
        path: path.to_path_buf(),
        what,
        source,
    }
}

/// One connection's byte streams.
pub struct Transport {
    pub reader: Box<dyn Read + Send>,
    pub writer: Box<dyn Write + Send>,
    /// Breaks the connection: pending and later reads and writes fail or end.
    pub closer: Box<dyn Fn() + Send + Sync>,
    /// For logs.
    pub name: String,
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transport")
            .field("name", &self.name)
            .finish()
    }
}

impl Transport {
    /// A connected unix stream (also one end of a socketpair, in tests).
    pub fn from_unix(stream: UnixStream, name: &str) -> io::Result<Transport> {
        let reader = stream.try_clone()?;
        let closer = stream.try_clone()?;
        Ok(Transport {
            reader: Box::new(reader),
            writer: Box::new(stream),
            closer: Box::new(move || {
                let _ = closer.shutdown(std::net::Shutdown::Both);
            }),
            name: name.to_owned(),
        })
    }

    /// The agent's own stdin and stdout. Takes private copies of fds 0 and 1,
    /// then points fd 0 at `/dev/null` and fd 1 at stderr so nothing else in
    /// the process can write into the protocol stream.
    pub fn stdio() -> io::Result<Transport> {
        let input: OwnedFd = rustix::io::fcntl_dupfd_cloexec(io::stdin().as_fd(), 3)?;
        let output: OwnedFd = rustix::io::fcntl_dupfd_cloexec(io::stdout().as_fd(), 3)?;
        let null = File::open("/dev/null")?;
        // SAFETY: dup2 onto fds 0 and 1, which stay open (now pointing
        // elsewhere); no Rust object owns them exclusively.
        unsafe {
            if libc::dup2(null.as_raw_fd(), 0) < 0 || libc::dup2(2, 1) < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(Transport {
            reader: Box::new(File::from(input)),
            writer: Box::new(File::from(output)),
            closer: Box::new(|| {}),
            name: "stdio".into(),
        })
    }
}

/// Bind a listening unix socket at `path` (mode 0600), replacing a stale
/// socket but never another kind of file.
pub fn listen_unix(path: &Path) -> Result<UnixListener, TransportError> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            fs::remove_file(path).map_err(io_err(path, "remove stale socket"))?
        }
        Ok(_) => {
            return Err(TransportError::NotASocket {
                path: path.to_path_buf(),
            })
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(path, "stat")(e)),
    }
    let listener = UnixListener::bind(path).map_err(io_err(path, "bind"))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o600)).map_err(io_err(path, "chmod"))?;
    Ok(listener)
}

/// Find `/dev/vportNpM` for the virtio-serial port called `name`.
pub fn find_port(name: &str) -> Result<PathBuf, TransportError> {
    find_port_in(
        Path::new("/sys/class/virtio-ports"),
        Path::new("/dev"),
        name,
    )
}

/// [`find_port`] with the sysfs and dev directories given (for tests).
pub fn find_port_in(sys: &Path, dev: &Path, name: &str) -> Result<PathBuf, TransportError> {
    let mut found = Vec::new();
    if let Ok(entries) = fs::read_dir(sys) {
        for e in entries.flatten() {
            let Ok(port_name) = fs::read_to_string(e.path().join("name")) else {
                continue;
            };
            let port_name = port_name.trim_end_matches('\n');
            if port_name == name {
                return Ok(dev.join(e.file_name()));
            }
            found.push(port_name.to_owned());
        }
    }
    Err(TransportError::NoPort {
        name: name.to_owned(),
        found: if found.is_empty() {
            "none".into()
        } else {
            found.join(", ")
        },
    })
}

/// A virtio-serial port opened once, read-write, non-blocking, driven with
/// `poll`. The guest driver reports "host not connected" as `POLLHUP` and
/// returns end-of-file from `read`; writes would block until a host
/// connects. Each host connection is one session.
#[derive(Debug)]
pub struct Port {
    file: Arc<File>,
    path: PathBuf,
}

/// How long one `poll` waits before rechecking the close flag.
const POLL_SLICE_MS: i32 = 200;

fn poll_one(fd: &File, events: libc::c_short, timeout_ms: i32) -> io::Result<libc::c_short> {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events,
        revents: 0,
    };
    // SAFETY: one valid pollfd on the stack.
    let r = unsafe { libc::poll(&mut p, 1, timeout_ms) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(0);
        }
        return Err(e);
    }
    Ok(p.revents)
}

impl Port {
    pub fn open(path: &Path) -> Result<Port, TransportError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
            .open(path)
            .map_err(io_err(path, "open virtio-serial port"))?;
        Ok(Port {
            file: Arc::new(file),
            path: path.to_path_buf(),
        })
    }

    /// Block until a host is connected to the port.
    pub fn wait_for_host(&self) -> Result<(), TransportError> {
        loop {
            let rev = poll_one(&self.file, libc::POLLIN | libc::POLLOUT, POLL_SLICE_MS)
                .map_err(io_err(&self.path, "poll"))?;
            if rev != 0 && rev & libc::POLLHUP == 0 {
                return Ok(());
            }
            if rev & libc::POLLHUP != 0 {
                // poll returns at once while nobody is connected: do not spin.
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// Whether a host is connected now (no wait).
    pub fn host_connected(&self) -> io::Result<bool> {
        let rev = poll_one(&self.file, libc::POLLIN | libc::POLLOUT, 0)?;
        Ok(rev != 0 && rev & libc::POLLHUP == 0)
    }

    /// A transport for the current host connection.
    pub fn session(&self) -> Transport {
        let closed = Arc::new(AtomicBool::new(false));
        let r = PortIo {
            file: self.file.clone(),
            closed: closed.clone(),
        };
        let w = PortIo {
            file: self.file.clone(),
            closed: closed.clone(),
        };
        Transport {
            reader: Box::new(r),
            writer: Box::new(w),
            closer: Box::new(move || closed.store(true, Ordering::SeqCst)),
            name: self.path.display().to_string(),
        }
    }
}

struct PortIo {
    file: Arc<File>,
    closed: Arc<AtomicBool>,
}

impl Read for PortIo {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if self.closed.load(Ordering::SeqCst) {
                return Ok(0);
            }
            match (&*self.file).read(buf) {
                // 0: no data and the host is not connected: end of session.
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    poll_one(&self.file, libc::POLLIN, POLL_SLICE_MS)?;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

impl Write for PortIo {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        loop {
            if self.closed.load(Ordering::SeqCst) {
                return Err(io::ErrorKind::BrokenPipe.into());
            }
            match (&*self.file).write(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let rev = poll_one(&self.file, libc::POLLOUT, POLL_SLICE_MS)?;
                    if rev & libc::POLLHUP != 0 {
                        return Err(io::Error::new(
                            io::ErrorKind::BrokenPipe,
                            "virtio-serial host disconnected",
                        ));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_port_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let sys = dir.path().join("sys");
        for (dev, name) in [
            ("vport0p1", "org.qemu.guest_agent.0"),
            ("vport1p1", "agent.0"),
        ] {
            fs::create_dir_all(sys.join(dev)).unwrap();
            fs::write(sys.join(dev).join("name"), format!("{name}\n")).unwrap();
        }
        let p = find_port_in(&sys, Path::new("/dev"), "agent.0").unwrap();
        assert_eq!(p, Path::new("/dev/vport1p1"));
        let e = find_port_in(&sys, Path::new("/dev"), "nope").unwrap_err();
        assert!(e.to_string().contains("agent.0"), "{e}");
    }

    #[test]
    fn listen_replaces_a_stale_socket_but_not_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("a.sock");
        drop(listen_unix(&sock).unwrap());
        let l = listen_unix(&sock).unwrap();
        let mode = fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        drop(l);
        let file = dir.path().join("plain");
        fs::write(&file, b"keep").unwrap();
        assert!(matches!(
            listen_unix(&file),
            Err(TransportError::NotASocket { .. })
        ));
        assert_eq!(fs::read(&file).unwrap(), b"keep");
    }
}
