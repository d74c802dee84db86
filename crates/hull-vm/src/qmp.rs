//! A small QMP client over QEMU's unix control socket.
//!
//! What this protects against: a QEMU that answers with garbage or never
//! answers. Every read has a deadline, every line a size cap (checked while
//! reading, before it grows), replies are parsed as JSON and matched to the
//! command by id; asynchronous events are kept (bounded) for the caller.
//!
//! What it does not: authenticate QEMU. The socket lives in the instance
//! dir, which only hull's user can reach.

use std::collections::VecDeque;
use std::io::{self, BufRead, BufReader, Write};
use std::os::fd::BorrowedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// Longest QMP line accepted (query-migrate or an event is under a few KiB).
pub const MAX_LINE: usize = 1 << 20;
/// Events kept for [`Qmp::events`].
const MAX_EVENTS: usize = 64;
/// Default deadline of one command.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    #[error("tier vm: cannot connect to QMP socket {path} within {secs}s: {source}")]
    Connect {
        path: PathBuf,
        secs: u64,
        #[source]
        source: io::Error,
    },
    #[error("tier vm: QMP {cmd}: {source}")]
    Io {
        cmd: String,
        #[source]
        source: io::Error,
    },
    #[error("tier vm: QMP {cmd}: no reply within {secs}s")]
    Timeout { cmd: String, secs: u64 },
    #[error("tier vm: QMP {cmd}: QEMU closed the control socket")]
    Closed { cmd: String },
    #[error("tier vm: QMP {cmd}: reply line longer than {MAX_LINE} bytes")]
    TooLong { cmd: String },
    #[error("tier vm: QMP {cmd}: reply is not a QMP message: {detail}")]
    Protocol { cmd: String, detail: String },
    #[error("tier vm: QMP {cmd} failed: {class}: {desc}")]
    Command {
        cmd: String,
        class: String,
        desc: String,
    },
    #[error("tier vm: migration {0}")]
    Migration(String),
}

/// The VM's run state (`query-status`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunState {
    pub running: bool,
    /// `running`, `paused`, `inmigrate`, `postmigrate`, `shutdown`, ...
    pub status: String,
}

/// A migration's state (`query-migrate`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrateState {
    /// `none`, `setup`, `active`, `completed`, `failed`, `cancelled`, ...
    pub status: String,
    pub error: Option<String>,
}

/// A connected, negotiated QMP session.
#[derive(Debug)]
pub struct Qmp {
    writer: UnixStream,
    reader: BufReader<UnixStream>,
    next_id: u64,
    events: VecDeque<Value>,
    /// QEMU's version from the greeting (`10.0.2`).
    pub version: String,
}

impl Qmp {
    /// Connects (retrying until `deadline`, QEMU creates the socket as it
    /// starts), reads the greeting and negotiates capabilities.
    pub fn connect(path: &Path, deadline: Duration) -> Result<Qmp, QmpError> {
        let end = Instant::now() + deadline;
        let stream = loop {
            match UnixStream::connect(path) {
                Ok(s) => break s,
                Err(e) if Instant::now() >= end => {
                    return Err(QmpError::Connect {
                        path: path.to_path_buf(),
                        secs: deadline.as_secs(),
                        source: e,
                    })
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        let io_err = |source| QmpError::Io {
            cmd: "connect".into(),
            source,
        };
        let reader = BufReader::new(stream.try_clone().map_err(io_err)?);
        let mut q = Qmp {
            writer: stream,
            reader,
            next_id: 1,
            events: VecDeque::new(),
            version: String::new(),
        };
        let greeting = q.read_message("greeting", end.max(Instant::now() + COMMAND_TIMEOUT))?;
        let v = greeting
            .get("QMP")
            .and_then(|g| g.get("version"))
            .and_then(|v| v.get("qemu"))
            .ok_or_else(|| QmpError::Protocol {
                cmd: "greeting".into(),
                detail: "no QMP.version.qemu".into(),
            })?;
        q.version = format!(
            "{}.{}.{}",
            v.get("major").and_then(Value::as_u64).unwrap_or(0),
            v.get("minor").and_then(Value::as_u64).unwrap_or(0),
            v.get("micro").and_then(Value::as_u64).unwrap_or(0)
        );
        q.execute("qmp_capabilities", None)?;
        Ok(q)
    }

    /// Runs one command and returns its `return` value.
    pub fn execute(&mut self, cmd: &str, args: Option<Value>) -> Result<Value, QmpError> {
        self.execute_timeout(cmd, args, COMMAND_TIMEOUT)
    }

    pub fn execute_timeout(
        &mut self,
        cmd: &str,
        args: Option<Value>,
        timeout: Duration,
    ) -> Result<Value, QmpError> {
        self.execute_with_fd(cmd, args, None, timeout)
    }

    /// Hands QEMU an open file: `add-fd` with the descriptor passed over the
    /// socket (SCM_RIGHTS), into a new fd set whose id is returned. QEMU
    /// then opens `/dev/fdset/ID` without any access of its own to the
    /// file's path (it may run as a user that has none).
    pub fn add_fd(&mut self, fd: BorrowedFd<'_>, opaque: &str) -> Result<u64, QmpError> {
        let r = self.execute_with_fd(
            "add-fd",
            Some(json!({ "opaque": opaque })),
            Some(fd),
            COMMAND_TIMEOUT,
        )?;
        r.get("fdset-id")
            .and_then(Value::as_u64)
            .ok_or_else(|| QmpError::Protocol {
                cmd: "add-fd".into(),
                detail: "no fdset-id in the reply".into(),
            })
    }

    fn execute_with_fd(
        &mut self,
        cmd: &str,
        args: Option<Value>,
        fd: Option<BorrowedFd<'_>>,
        timeout: Duration,
    ) -> Result<Value, QmpError> {
        let id = self.next_id;
        self.next_id += 1;
        let mut msg = json!({ "execute": cmd, "id": id });
        if let Some(a) = args {
            msg["arguments"] = a;
        }
        let mut line = msg.to_string();
        line.push('\n');
        self.send(line.as_bytes(), fd)
            .map_err(|source| QmpError::Io {
                cmd: cmd.into(),
                source,
            })?;
        let end = Instant::now() + timeout;
        loop {
            let m = self.read_message(cmd, end)?;
            if m.get("event").is_some() {
                if self.events.len() == MAX_EVENTS {
                    self.events.pop_front();
                }
                self.events.push_back(m);
                continue;
            }
            if m.get("id").and_then(Value::as_u64) != Some(id) {
                // A reply to an earlier command that timed out: skip it.
                continue;
            }
            if let Some(r) = m.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = m.get("error") {
                return Err(QmpError::Command {
                    cmd: cmd.into(),
                    class: e.get("class").and_then(Value::as_str).unwrap_or("?").into(),
                    desc: e.get("desc").and_then(Value::as_str).unwrap_or("?").into(),
                });
            }
            return Err(QmpError::Protocol {
                cmd: cmd.into(),
                detail: "reply has neither return nor error".into(),
            });
        }
    }

    /// Writes `line`, the descriptor (if any) riding on its first bytes.
    fn send(&mut self, line: &[u8], fd: Option<BorrowedFd<'_>>) -> std::io::Result<()> {
        use rustix::net::{sendmsg, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
        let Some(fd) = fd else {
            return self.writer.write_all(line);
        };
        let fds = [fd];
        let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
            return Err(std::io::Error::other("no room for the descriptor"));
        }
        let n = loop {
            match sendmsg(
                &self.writer,
                &[std::io::IoSlice::new(line)],
                &mut control,
                SendFlags::empty(),
            ) {
                Err(rustix::io::Errno::INTR) => continue,
                r => break r?,
            }
        };
        self.writer.write_all(&line[n..])
    }

    /// Events received so far (oldest first, at most 64 kept).
    pub fn events(&self) -> impl Iterator<Item = &Value> {
        self.events.iter()
    }

    fn read_message(&mut self, cmd: &str, end: Instant) -> Result<Value, QmpError> {
        let secs = end
            .saturating_duration_since(Instant::now())
            .as_secs()
            .max(1);
        let mut buf = Vec::new();
        loop {
            let now = Instant::now();
            if now >= end {
                return Err(QmpError::Timeout {
                    cmd: cmd.into(),
                    secs,
                });
            }
            self.reader
                .get_ref()
                .set_read_timeout(Some(end - now))
                .map_err(|source| QmpError::Io {
                    cmd: cmd.into(),
                    source,
                })?;
            let chunk = match self.reader.fill_buf() {
                Ok([]) => return Err(QmpError::Closed { cmd: cmd.into() }),
                Ok(c) => c,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(QmpError::Timeout {
                        cmd: cmd.into(),
                        secs,
                    })
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(source) => {
                    return Err(QmpError::Io {
                        cmd: cmd.into(),
                        source,
                    })
                }
            };
            let (take, done) = match chunk.iter().position(|&b| b == b'\n') {
                Some(i) => (i + 1, true),
                None => (chunk.len(), false),
            };
            if buf.len() + take > MAX_LINE {
                return Err(QmpError::TooLong { cmd: cmd.into() });
            }
            buf.extend_from_slice(&chunk[..take]);
            self.reader.consume(take);
            if done {
                let text = String::from_utf8_lossy(&buf);
                let t = text.trim();
                if t.is_empty() {
                    buf.clear();
                    continue;
                }
                let v: Value = serde_json::from_str(t).map_err(|e| QmpError::Protocol {
                    cmd: cmd.into(),
                    detail: e.to_string(),
                })?;
                if !v.is_object() {
                    return Err(QmpError::Protocol {
                        cmd: cmd.into(),
                        detail: "not a JSON object".into(),
                    });
                }
                return Ok(v);
            }
        }
    }

    pub fn query_status(&mut self) -> Result<RunState, QmpError> {
        let r = self.execute("query-status", None)?;
        Ok(RunState {
            running: r.get("running").and_then(Value::as_bool).unwrap_or(false),
            status: r
                .get("status")
                .and_then(Value::as_str)
                .unwrap_or("unknown")
                .to_string(),
        })
    }

    pub fn stop(&mut self) -> Result<(), QmpError> {
        self.execute("stop", None).map(drop)
    }

    pub fn cont(&mut self) -> Result<(), QmpError> {
        self.execute("cont", None).map(drop)
    }

    /// Asks QEMU to exit. QEMU may close the socket before replying; both
    /// count as done.
    pub fn quit(&mut self) -> Result<(), QmpError> {
        match self.execute_timeout("quit", None, Duration::from_secs(5)) {
            Ok(_) | Err(QmpError::Closed { .. }) => Ok(()),
            Err(QmpError::Io { source, .. })
                if matches!(
                    source.kind(),
                    io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    pub fn migrate_set_capabilities(&mut self, caps: &[(&str, bool)]) -> Result<(), QmpError> {
        let list: Vec<Value> = caps
            .iter()
            .map(|(c, on)| json!({ "capability": c, "state": on }))
            .collect();
        self.execute(
            "migrate-set-capabilities",
            Some(json!({ "capabilities": list })),
        )
        .map(drop)
    }

    /// Starts an outgoing migration to `uri` (e.g. `file:/path`).
    pub fn migrate(&mut self, uri: &str) -> Result<(), QmpError> {
        self.execute("migrate", Some(json!({ "uri": uri })))
            .map(drop)
    }

    /// Starts the incoming side (QEMU started with `-incoming defer`).
    pub fn migrate_incoming(&mut self, uri: &str) -> Result<(), QmpError> {
        self.execute("migrate-incoming", Some(json!({ "uri": uri })))
            .map(drop)
    }

    pub fn query_migrate(&mut self) -> Result<MigrateState, QmpError> {
        let r = self.execute("query-migrate", None)?;
        Ok(MigrateState {
            status: r
                .get("status")
                .and_then(Value::as_str)
                .unwrap_or("none")
                .to_string(),
            error: r
                .get("error-desc")
                .and_then(Value::as_str)
                .map(str::to_string),
        })
    }

    /// Polls `query-migrate` until `completed`; `failed`/`cancelled` or the
    /// deadline are errors.
    pub fn wait_migration(&mut self, deadline: Duration) -> Result<(), QmpError> {
        let end = Instant::now() + deadline;
        loop {
            let s = self.query_migrate()?;
            match s.status.as_str() {
                "completed" => return Ok(()),
                "failed" | "cancelled" => {
                    return Err(QmpError::Migration(format!(
                        "{}: {}",
                        s.status,
                        s.error.unwrap_or_default()
                    )))
                }
                _ => {}
            }
            if Instant::now() >= end {
                return Err(QmpError::Migration(format!(
                    "still {} after {}s",
                    s.status,
                    deadline.as_secs()
                )));
            }
            // A restore loads a few hundred MiB in a few hundred ms: a
            // short tick, each a cheap QMP round trip.
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

#[cfg(test)]
mod tests {
    //! The QMP client against a scripted peer on a real unix socket (the
    //! real QEMU is exercised by the machine tests).
    use super::*;
    use std::io::Read;
    use std::os::unix::net::UnixListener;

    fn peer(script: impl FnOnce(UnixStream) + Send + 'static) -> (tempfile::TempDir, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("qmp.sock");
        let l = UnixListener::bind(&p).unwrap();
        std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            script(s);
        });
        (d, p)
    }

    fn read_cmd(r: &mut BufReader<UnixStream>) -> Value {
        let mut l = String::new();
        r.read_line(&mut l).unwrap();
        serde_json::from_str(&l).unwrap()
    }

    const GREETING: &str = "{\"QMP\": {\"version\": {\"qemu\": {\"micro\": 2, \"minor\": 0, \"major\": 10}}, \"capabilities\": []}}\n";

    #[test]
    fn negotiates_skips_events_and_maps_errors() {
        let (_d, p) = peer(|mut s| {
            let mut r = BufReader::new(s.try_clone().unwrap());
            s.write_all(GREETING.as_bytes()).unwrap();
            let c = read_cmd(&mut r);
            assert_eq!(c["execute"], "qmp_capabilities");
            writeln!(s, "{{\"return\": {{}}, \"id\": {}}}", c["id"]).unwrap();
            let c = read_cmd(&mut r);
            assert_eq!(c["execute"], "query-status");
            writeln!(s, "{{\"event\": \"RESUME\", \"data\": {{}}}}").unwrap();
            writeln!(
                s,
                "{{\"return\": {{\"running\": true, \"status\": \"running\"}}, \"id\": {}}}",
                c["id"]
            )
            .unwrap();
            let c = read_cmd(&mut r);
            writeln!(
                s,
                "{{\"error\": {{\"class\": \"GenericError\", \"desc\": \"nope\"}}, \"id\": {}}}",
                c["id"]
            )
            .unwrap();
            let c = read_cmd(&mut r);
            assert_eq!(c["execute"], "quit");
            // QEMU exits without replying.
        });
        let mut q = Qmp::connect(&p, Duration::from_secs(5)).unwrap();
        assert_eq!(q.version, "10.0.2");
        let st = q.query_status().unwrap();
        assert!(st.running);
        assert_eq!(q.events().count(), 1);
        match q.stop() {
            Err(QmpError::Command { class, desc, .. }) => {
                assert_eq!((class.as_str(), desc.as_str()), ("GenericError", "nope"))
            }
            other => panic!("{other:?}"),
        }
        q.quit().unwrap();
    }

    #[test]
    fn oversized_and_garbage_replies_are_errors_not_allocations() {
        let (_d, p) = peer(|mut s| {
            s.write_all(GREETING.as_bytes()).unwrap();
            let mut r = BufReader::new(s.try_clone().unwrap());
            let _ = read_cmd(&mut r);
            // An endless line without a newline.
            let junk = vec![b'x'; 64 * 1024];
            for _ in 0..(MAX_LINE / junk.len() + 2) {
                if s.write_all(&junk).is_err() {
                    return;
                }
            }
            let mut sink = Vec::new();
            let _ = s.read_to_end(&mut sink);
        });
        let e = Qmp::connect(&p, Duration::from_secs(5)).unwrap_err();
        assert!(matches!(e, QmpError::TooLong { .. }), "{e}");

        let (_d, p) = peer(|mut s| {
            s.write_all(b"[1,2,3]\n").unwrap();
        });
        let e = Qmp::connect(&p, Duration::from_secs(5)).unwrap_err();
        assert!(matches!(e, QmpError::Protocol { .. }), "{e}");
    }

    #[test]
    fn missing_socket_is_a_connect_error_naming_it() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("none.sock");
        let e = Qmp::connect(&p, Duration::from_millis(100)).unwrap_err();
        assert!(e.to_string().contains("none.sock"), "{e}");
    }
}
