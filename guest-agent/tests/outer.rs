//! The outer agent's session and relay, in one process: a host speaking through
//! the protocol crate's client, the outer session, and a real inner agent
//! (`serve::serve_session`, running real processes) behind a test backend that
//! stands in for Incus. The Incus and mount steps are tested by booting the image
//! (images/README.md); here the frame handling is.

#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used)] // test-only crate

use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use hull_agent::outer::{self, Backend, SetupError};
use hull_agent::serve::{self, ServeOptions, SessionEnd};
use hull_agent::transport::Transport;
use hull_protocol::*;

const NET: Duration = Duration::from_secs(60);

/// How the test backend's inner agent behaves.
#[derive(Clone, Copy, PartialEq)]
enum Inner {
    /// The real exec server.
    Real,
    /// Says hello, then hangs up on the first frame after it.
    DiesOnExec,
}

struct TestBackend {
    inner: Inner,
    fail: Option<&'static str>,
    configured: AtomicBool,
    connects: AtomicUsize,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl TestBackend {
    fn new(inner: Inner, fail: Option<&'static str>) -> Arc<TestBackend> {
        Arc::new(TestBackend {
            inner,
            fail,
            configured: AtomicBool::new(false),
            connects: AtomicUsize::new(0),
            threads: Mutex::new(Vec::new()),
        })
    }

    fn spawn_inner(&self) -> UnixStream {
        let (ours, theirs) = UnixStream::pair().unwrap();
        self.connects.fetch_add(1, Ordering::SeqCst);
        let mode = self.inner;
        let t = thread::spawn(move || match mode {
            Inner::Real => {
                let opts = ServeOptions::new(Role::InnerAgent);
                let end =
                    serve::serve_session(Transport::from_unix(theirs, "inner").unwrap(), &opts)
                        .unwrap();
                assert_ne!(end, SessionEnd::Shutdown);
            }
            Inner::DiesOnExec => {
                let mut c = Connection::new(theirs);
                let hello = c.hello(Role::InnerAgent, "fake inner").unwrap();
                assert_eq!(hello.role, Role::OuterAgent);
                let _ = c.recv();
            }
        });
        self.threads.lock().unwrap().push(t);
        ours
    }
}

impl Backend for TestBackend {
    fn configure(&self, spec: &ConfigureSpec) -> Result<(String, UnixStream), SetupError> {
        if let Some(why) = self.fail {
            return Err(SetupError::Verify {
                name: spec.container.name.clone(),
                why: why.into(),
            });
        }
        self.configured.store(true, Ordering::SeqCst);
        Ok((spec.container.name.clone(), self.spawn_inner()))
    }

    fn reconnect(&self) -> Option<Result<UnixStream, SetupError>> {
        self.configured
            .load(Ordering::SeqCst)
            .then(|| Ok(self.spawn_inner()))
    }
}

struct Host {
    conn: Connection<UnixStream>,
    session: JoinHandle<SessionEnd>,
}

fn connect(backend: &Arc<TestBackend>) -> Host {
    let (host, guest) = UnixStream::pair().unwrap();
    let b: Arc<dyn Backend> = backend.clone();
    let session = thread::spawn(move || {
        outer::serve_session(Transport::from_unix(guest, "host").unwrap(), &b)
    });
    host.set_read_timeout(Some(NET)).unwrap();
    let mut conn = Connection::new(host);
    let hello = conn.hello(Role::Host, "outer-test").unwrap();
    assert_eq!(hello.role, Role::OuterAgent);
    Host { conn, session }
}

fn spec() -> ConfigureSpec {
    ConfigureSpec {
        shares: vec![],
        container: ContainerSpec {
            name: "hull-run".into(),
            base: "hull-base".into(),
            uid: 1000,
            gid: 1000,
            memory_bytes: None,
            cpus: None,
            processes: None,
        },
        clock_unix_ns: 0,
        prepare: false,
        network: None,
        overlay: None,
    }
}

fn configure(h: &mut Host) -> Message {
    h.conn.send(&Message::Configure(spec()), 0).unwrap();
    let (id, m) = h.conn.recv().unwrap();
    assert_eq!(id, 0);
    m
}

fn sh(script: &str, stdin: bool) -> Exec {
    Exec {
        argv: vec![Bytes::from("sh"), Bytes::from("-c"), Bytes::from(script)],
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        cwd: Bytes::from("/"),
        timeout_ms: None,
        stdin,
        uid: None,
        gid: None,
        scrub: vec![],
        keep_leftovers: false,
        user: None,
    }
}

/// Frames of `id` until its terminal frame: (stdout, terminal).
fn finish(h: &mut Host, id: u32) -> (Vec<u8>, Message) {
    let mut out = Vec::new();
    loop {
        let (fid, m) = h.conn.recv().unwrap();
        assert_eq!(fid, id, "unexpected frame {m:?}");
        match m {
            Message::Started { .. } | Message::StdinAck { .. } | Message::Stderr(_) => {}
            Message::Stdout(b) => out.extend(b),
            m @ (Message::Exit(_) | Message::Error { .. }) => return (out, m),
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[test]
fn exec_before_configure_is_refused_and_nothing_runs_in_the_guest() {
    let b = TestBackend::new(Inner::Real, None);
    let mut h = connect(&b);
    let marker = std::env::temp_dir().join(format!("hull-outer-test-{}", std::process::id()));
    let script = format!("touch {}", marker.display());
    h.conn.send(&Message::Exec(sh(&script, false)), 1).unwrap();
    let (out, end) = finish(&mut h, 1);
    assert!(out.is_empty());
    match end {
        Message::Error { code, message } => {
            assert_eq!(code, ErrorCode::BadRequest);
            assert!(message.contains("not configured"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert!(!marker.exists(), "the command ran in the outer guest");
    assert_eq!(b.connects.load(Ordering::SeqCst), 0);
    drop(h.conn);
    assert_eq!(h.session.join().unwrap(), SessionEnd::Closed);
}

#[test]
fn configure_then_exec_is_relayed_to_the_inner_agent() {
    let b = TestBackend::new(Inner::Real, None);
    let mut h = connect(&b);
    match configure(&mut h) {
        Message::Configured(c) => {
            assert_eq!(c.container, "hull-run");
            assert!(
                c.inner_software.starts_with("hull-agent"),
                "{}",
                c.inner_software
            );
        }
        other => panic!("{other:?}"),
    }
    h.conn
        .send(&Message::Exec(sh("echo hi; exit 7", false)), 5)
        .unwrap();
    let (out, end) = finish(&mut h, 5);
    assert_eq!(out, b"hi\n");
    assert_eq!(end, Message::Exit(ExitStatus::Code(7)));

    // Stdin goes through the relay and back.
    h.conn.send(&Message::Exec(sh("cat", true)), 6).unwrap();
    h.conn
        .send(&Message::Stdin(b"through the relay".to_vec()), 6)
        .unwrap();
    h.conn.send(&Message::StdinEof, 6).unwrap();
    let (out, end) = finish(&mut h, 6);
    assert_eq!(out, b"through the relay");
    assert_eq!(end, Message::Exit(ExitStatus::Code(0)));

    // Frames for an id that is not running are answered, not relayed.
    h.conn.send(&Message::Kill, 99).unwrap();
    let (_, end) = finish(&mut h, 99);
    assert!(
        matches!(
            end,
            Message::Error {
                code: ErrorCode::UnknownId,
                ..
            }
        ),
        "{end:?}"
    );

    // Ping is answered by the outer agent itself.
    h.conn.send(&Message::Ping { nonce: 42 }, 0).unwrap();
    assert_eq!(h.conn.recv().unwrap(), (0, Message::Pong { nonce: 42 }));
}

#[test]
fn a_failed_configure_names_the_step_and_execs_stay_refused() {
    let b = TestBackend::new(
        Inner::Real,
        Some("uid_map: a range maps guest id 0 into the container"),
    );
    let mut h = connect(&b);
    match configure(&mut h) {
        Message::Error { code, message } => {
            assert_eq!(code, ErrorCode::SetupFailed);
            assert!(
                message.starts_with("step verify: container hull-run"),
                "{message}"
            );
            assert!(message.contains("guest id 0"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    h.conn.send(&Message::Exec(sh("true", false)), 1).unwrap();
    let (_, end) = finish(&mut h, 1);
    assert!(
        matches!(
            end,
            Message::Error {
                code: ErrorCode::BadRequest,
                ..
            }
        ),
        "{end:?}"
    );
}

#[test]
fn a_later_host_session_reconnects_without_configure() {
    let b = TestBackend::new(Inner::Real, None);
    let mut h = connect(&b);
    assert!(matches!(configure(&mut h), Message::Configured(_)));
    drop(h.conn);
    assert_eq!(h.session.join().unwrap(), SessionEnd::Closed);

    let mut h = connect(&b);
    h.conn
        .send(&Message::Exec(sh("echo again", false)), 1)
        .unwrap();
    let (out, end) = finish(&mut h, 1);
    assert_eq!(out, b"again\n");
    assert_eq!(end, Message::Exit(ExitStatus::Code(0)));
    assert_eq!(b.connects.load(Ordering::SeqCst), 2);
    h.conn.send(&Message::Shutdown, 0).unwrap();
    assert_eq!(h.session.join().unwrap(), SessionEnd::Shutdown);
}

#[test]
fn a_dying_inner_agent_fails_the_running_exec() {
    let b = TestBackend::new(Inner::DiesOnExec, None);
    let mut h = connect(&b);
    assert!(matches!(configure(&mut h), Message::Configured(_)));
    h.conn
        .send(&Message::Exec(sh("sleep 100", false)), 3)
        .unwrap();
    let (_, end) = finish(&mut h, 3);
    match end {
        Message::Error { code, message } => {
            assert_eq!(code, ErrorCode::Internal);
            assert!(message.contains("inner agent"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    // The next exec is refused with the reason.
    h.conn.send(&Message::Exec(sh("true", false)), 4).unwrap();
    let (_, end) = finish(&mut h, 4);
    match end {
        Message::Error { message, .. } => {
            assert!(message.contains("inner agent is gone"), "{message}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn agent_only_frames_from_the_host_end_the_session() {
    let b = TestBackend::new(Inner::Real, None);
    let mut h = connect(&b);
    h.conn.send(&Message::Stdout(b"spoof".to_vec()), 1).unwrap();
    let (id, m) = h.conn.recv().unwrap();
    assert_eq!(id, 0);
    assert!(
        matches!(
            m,
            Message::Error {
                code: ErrorCode::BadRequest,
                ..
            }
        ),
        "{m:?}"
    );
    assert!(matches!(
        h.session.join().unwrap(),
        SessionEnd::ProtocolError(_)
    ));
}
