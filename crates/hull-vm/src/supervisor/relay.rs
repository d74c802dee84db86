//! The supervisor's relay: clients' sessions on `ctl.sock` multiplexed onto
//! the agent's one connection (each client's ids mapped to ids of its own),
//! the VM watched (a helper that dies or stops, a guest that answers no
//! ping), and a faulted VM killed with its clients told why.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hull_protocol::client::{check_peer_hello, hello_message};
use hull_protocol::{ErrorCode, FrameReader, FrameWriter, Message, Role};

use crate::heartbeat::{Beat, Heartbeat, SILENCE_LIMIT};
use crate::machine::Machine;

use super::{io_err, SupervisorError, UpOptions, MAX_CLIENTS, MAX_EXECS};

/// Waits until `fd` is readable (a pending connection) or `d` passes.
fn wait_readable(fd: &impl std::os::fd::AsRawFd, d: Duration) {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = d.as_millis().min(i32::MAX as u128) as libc::c_int;
    // SAFETY: `p` is one valid pollfd on the stack for the duration of the
    // call, and the count passed is 1.
    if unsafe { libc::poll(&mut p, 1, ms) } < 0 {
        std::thread::sleep(d);
    }
}

type ClientWriter = Arc<Mutex<FrameWriter<UnixStream>>>;

#[derive(Default)]
struct Routes {
    /// Supervisor id -> (client, the client's id).
    by_global: HashMap<u32, (u64, u32)>,
    /// Each client's writer, and its socket (to close it when the VM ends).
    clients: HashMap<u64, (ClientWriter, UnixStream)>,
    next_global: u32,
    next_client: u64,
}

impl Routes {
    fn global_of(&self, client: u64, local: u32) -> Option<u32> {
        self.by_global
            .iter()
            .find(|(_, (c, l))| *c == client && *l == local)
            .map(|(g, _)| *g)
    }

    fn fresh_global(&mut self) -> u32 {
        loop {
            self.next_global = self.next_global.wrapping_add(1);
            if self.next_global != 0 && !self.by_global.contains_key(&self.next_global) {
                return self.next_global;
            }
        }
    }
}

struct Hub {
    name: String,
    agent: Arc<Mutex<FrameWriter<UnixStream>>>,
    routes: Mutex<Routes>,
    activity: Mutex<Instant>,
    stop: AtomicBool,
    why: Mutex<Option<String>>,
    /// The stop is a fault (the VM is killed, clients told why).
    fault: AtomicBool,
    /// Whether the guest still answers ([`crate::heartbeat`]).
    beat: Mutex<Heartbeat>,
}

/// How the relay ended.
#[derive(Debug)]
pub(super) enum End {
    /// On request (`hull vm down`, a signal) or idle.
    Stopped,
    /// A helper died or stalled, or the guest went silent: the VM was killed.
    Fault(String),
}

impl Hub {
    fn new(name: String, agent: Arc<Mutex<FrameWriter<UnixStream>>>) -> Hub {
        Hub {
            name,
            agent,
            routes: Mutex::new(Routes::default()),
            activity: Mutex::new(Instant::now()),
            stop: AtomicBool::new(false),
            why: Mutex::new(None),
            fault: AtomicBool::new(false),
            beat: Mutex::new(Heartbeat::new(SILENCE_LIMIT, Instant::now())),
        }
    }

    fn heard(&self) {
        if let Ok(mut b) = self.beat.lock() {
            b.heard(Instant::now());
        }
    }

    fn fault_because(&self, why: String) {
        self.fault.store(true, Ordering::SeqCst);
        self.stop_because(why);
    }

    /// Every client is told why the VM ends, and its connection closed
    /// (its running commands end with that error).
    fn close_clients(&self, why: &str) {
        let clients: Vec<(ClientWriter, UnixStream)> = match self.routes.lock() {
            Ok(mut r) => {
                r.by_global.clear();
                r.clients.drain().map(|(_, c)| c).collect()
            }
            Err(_) => Vec::new(),
        };
        let msg = Message::error(
            ErrorCode::Internal,
            format!("hull vm {}: the VM ended: {why}", self.name),
        );
        for (w, s) in clients {
            if let Ok(mut w) = w.lock() {
                let _ = w.send(&msg, 0);
            }
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    fn touch(&self) {
        if let Ok(mut a) = self.activity.lock() {
            *a = Instant::now();
        }
    }

    fn stop_because(&self, why: String) {
        if let Ok(mut w) = self.why.lock() {
            w.get_or_insert(why);
        }
        self.stop.store(true, Ordering::SeqCst);
    }

    fn to_agent(&self, msg: &Message, id: u32) -> bool {
        match self.agent.lock() {
            Ok(mut w) => w.send(msg, id).is_ok(),
            Err(_) => false,
        }
    }
}

pub(super) fn relay(
    o: &UpOptions,
    dir: &Path,
    mut machine: Machine,
    raw: crate::agent::RawSession,
    net: Option<crate::net_channel::NetChannel>,
    term: &AtomicBool,
) -> Result<End, SupervisorError> {
    let ctl = dir.join("ctl.sock");
    let _ = fs::remove_file(&ctl);
    let listener = UnixListener::bind(&ctl).map_err(io_err("listen on", &ctl))?;
    listener
        .set_nonblocking(true)
        .map_err(io_err("listen on", &ctl))?;
    let hub = Arc::new(Hub::new(o.name.clone(), raw.writer.clone()));
    {
        let hub = hub.clone();
        let rx = raw.rx;
        std::thread::spawn(move || agent_reader(&hub, rx));
    }
    loop {
        if term.load(Ordering::SeqCst) {
            hub.stop_because("stopped by signal (hull vm down)".into());
        }
        if let Some((name, how)) = net.as_ref().and_then(|n| n.ended()) {
            hub.fault_because(format!("{name} ended ({how})"));
        }
        if let Some(f) = machine.failed_helper() {
            hub.fault_because(format!(
                "{} {}; its log: {}",
                f.name,
                f.fault,
                f.log.display()
            ));
        }
        let beat = hub.beat.lock().map(|mut b| b.poll(Instant::now()));
        match beat {
            Ok(Beat::Ping(nonce)) => {
                hub.to_agent(&Message::Ping { nonce }, 0);
            }
            Ok(Beat::Silent(d)) => hub.fault_because(format!(
                "the guest has not answered for {} s (its agent wedged, its kernel hung, or its vCPUs stopped)",
                d.as_secs()
            )),
            Ok(Beat::Quiet) | Err(_) => {}
        }
        let idle = {
            let r = hub
                .routes
                .lock()
                .map(|r| r.by_global.is_empty() && r.clients.is_empty());
            let since = hub.activity.lock().map(|a| a.elapsed()).unwrap_or_default();
            r.unwrap_or(false) && since >= o.idle
        };
        if idle {
            hub.stop_because(format!("idle for {}s", o.idle.as_secs()));
        }
        if hub.stop.load(Ordering::SeqCst) {
            break;
        }
        match listener.accept() {
            Ok((s, _)) => {
                let hub = hub.clone();
                std::thread::spawn(move || client(&hub, s));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // Wake as soon as a client connects (a warm run waits for
                // this), else every 100 ms to check the VM and the flags.
                wait_readable(&listener, Duration::from_millis(100));
            }
            Err(e) => {
                hub.stop_because(format!("accept failed: {e}"));
            }
        }
    }
    let why = hub
        .why
        .lock()
        .ok()
        .and_then(|w| w.clone())
        .unwrap_or_default();
    drop(listener);
    let _ = fs::remove_file(&ctl);
    if hub.fault.load(Ordering::SeqCst) {
        eprintln!("hull vm {}: killed: {why}", o.name);
        machine.kill();
        hub.close_clients(&why);
        let _ = raw.stream.shutdown(std::net::Shutdown::Both);
        if let Some(n) = net {
            n.finish(Duration::from_secs(2));
        }
        return Ok(End::Fault(why));
    }
    eprintln!("hull vm {}: shutting down: {why}", o.name);
    hub.close_clients(&why);
    let _ = hub.to_agent(&Message::Shutdown, 0);
    let _ = raw.stream.shutdown(std::net::Shutdown::Both);
    machine.shutdown(None, Duration::from_secs(20));
    if let Some(n) = net {
        // It prints its refused hosts into the supervisor's log.
        n.finish(Duration::from_secs(2));
    }
    Ok(End::Stopped)
}

/// Frames from the guest: relayed to the client owning the id.
fn agent_reader(
    hub: &Hub,
    rx: std::sync::mpsc::Receiver<Result<hull_protocol::Frame, hull_protocol::ConnError>>,
) {
    for f in rx {
        let f = match f {
            Ok(f) => f,
            Err(e) => {
                hub.fault_because(format!("agent connection: {e}"));
                return;
            }
        };
        hub.heard();
        if f.id == 0 {
            match f.message {
                Message::Ping { nonce } => {
                    hub.to_agent(&Message::Pong { nonce }, 0);
                }
                Message::Pong { .. } => {}
                other => {
                    hub.fault_because(format!(
                        "the guest sent {} on the control channel",
                        other.kind().name()
                    ));
                    return;
                }
            }
            continue;
        }
        let terminal = matches!(f.message, Message::Exit(_) | Message::Error { .. });
        // A command whose processes outlived their kill, or a container
        // whose scratch could not be emptied before a run: the VM must not
        // serve another run (the client is told first, below).
        let survived = match &f.message {
            Message::Error {
                code: ErrorCode::TreeSurvived,
                message,
            } => Some(format!(
                "a run's processes could not be ended: {}",
                crate::proc::guest_text(message)
            )),
            Message::Error {
                code: ErrorCode::ScrubFailed,
                message,
            } => Some(format!(
                "the container's scratch could not be emptied before a run: {}",
                crate::proc::guest_text(message)
            )),
            _ => None,
        };
        let relayable = matches!(
            f.message,
            Message::Started { .. }
                | Message::Stdout(_)
                | Message::Stderr(_)
                | Message::StdinAck { .. }
                | Message::Usage { .. }
                | Message::Exit(_)
                | Message::Error { .. }
        );
        if !relayable {
            hub.fault_because(format!(
                "the guest sent a {} frame for exec {}",
                f.message.kind().name(),
                f.id
            ));
            return;
        }
        let target = {
            let Ok(mut r) = hub.routes.lock() else { return };
            let t = r.by_global.get(&f.id).copied();
            if terminal {
                r.by_global.remove(&f.id);
            }
            t.and_then(|(c, l)| r.clients.get(&c).map(|(w, _)| (w.clone(), l)))
        };
        if terminal {
            hub.touch();
        }
        if let Some((w, local)) = target {
            if let Ok(mut w) = w.lock() {
                let _ = w.send(&f.message, local);
            }
        }
        if let Some(why) = survived {
            hub.fault_because(why);
            return;
        }
    }
    hub.fault_because("agent connection closed".into());
}

/// One client session on ctl.sock.
fn client(hub: &Hub, s: UnixStream) {
    let _ = s.set_write_timeout(Some(Duration::from_secs(30)));
    let (Ok(r), Ok(w)) = (s.try_clone(), s.try_clone()) else {
        return;
    };
    let writer: ClientWriter = Arc::new(Mutex::new(FrameWriter::new(w)));
    let mut reader = FrameReader::new(r);
    let send = |m: &Message, id: u32| {
        if let Ok(mut w) = writer.lock() {
            let _ = w.send(m, id);
        }
    };
    send(
        &hello_message(Role::OuterAgent, &format!("hull vm {}", hub.name)),
        0,
    );
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let hello = reader.recv().map_err(|e| e.to_string()).and_then(|f| {
        check_peer_hello(f)
            .map_err(|e| e.to_string())
            .and_then(|(h, _)| {
                if h.role == Role::Host {
                    Ok(())
                } else {
                    Err(format!("a {:?} is not a host", h.role))
                }
            })
    });
    if let Err(e) = hello {
        send(&Message::error(ErrorCode::BadRequest, e), 0);
        return;
    }
    let _ = s.set_read_timeout(None);
    let cid = {
        let Ok(mut r) = hub.routes.lock() else { return };
        if r.clients.len() >= MAX_CLIENTS {
            drop(r);
            send(&Message::error(ErrorCode::Busy, "too many clients"), 0);
            return;
        }
        r.next_client += 1;
        let c = r.next_client;
        let Ok(sock) = s.try_clone() else { return };
        r.clients.insert(c, (writer.clone(), sock));
        c
    };
    hub.touch();
    while let Ok(f) = reader.recv() {
        match (f.id, f.message) {
            (0, Message::Ping { nonce }) => send(&Message::Pong { nonce }, 0),
            (0, Message::Shutdown) => break,
            (local, Message::Exec(e)) if local != 0 => {
                let g = {
                    let Ok(mut r) = hub.routes.lock() else { break };
                    if r.global_of(cid, local).is_some() {
                        Err(Message::error(
                            ErrorCode::BadRequest,
                            format!("exec id {local} is in use"),
                        ))
                    } else if r.by_global.len() >= MAX_EXECS {
                        Err(Message::error(
                            ErrorCode::Busy,
                            "too many commands running in this VM",
                        ))
                    } else {
                        let g = r.fresh_global();
                        r.by_global.insert(g, (cid, local));
                        Ok(g)
                    }
                };
                match g {
                    Ok(g) => {
                        if !hub.to_agent(&Message::Exec(e), g) {
                            send(
                                &Message::error(ErrorCode::Internal, "the VM's agent is gone"),
                                local,
                            );
                            break;
                        }
                    }
                    Err(m) => send(&m, local),
                }
            }
            (
                local,
                m
                @ (Message::Stdin(_) | Message::StdinEof | Message::Signal { .. } | Message::Kill),
            ) if local != 0 => {
                let g = hub.routes.lock().ok().and_then(|r| r.global_of(cid, local));
                match g {
                    Some(g) => {
                        hub.to_agent(&m, g);
                    }
                    None => send(
                        &Message::error(
                            ErrorCode::UnknownId,
                            format!("exec id {local} is not running"),
                        ),
                        local,
                    ),
                }
            }
            (id, m) => {
                send(
                    &Message::error(
                        ErrorCode::BadRequest,
                        format!("a client may not send {} (id {id}) here", m.kind().name()),
                    ),
                    0,
                );
                break;
            }
        }
    }
    // The client is gone: its commands are killed.
    let mine: Vec<u32> = match hub.routes.lock() {
        Ok(mut r) => {
            r.clients.remove(&cid);
            r.by_global
                .iter()
                .filter(|(_, (c, _))| *c == cid)
                .map(|(g, _)| *g)
                .collect()
        }
        Err(_) => Vec::new(),
    };
    for g in mine {
        hub.to_agent(&Message::Kill, g);
    }
    hub.touch();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::{AgentSession, ExecOptions};
    use crate::exec::{CommandSpec, ExitStatus, OutputSink};

    /// The relay against a scripted guest and two real clients over real
    /// sockets: ids are remapped per client, each sees only its own frames,
    /// a client's disconnect kills its command, bad client frames end it.
    #[test]
    fn relay_keeps_clients_apart() {
        use hull_protocol::Connection;
        let (host_end, guest_end) = UnixStream::pair().unwrap();
        // The scripted guest: echoes argv[0] back on stdout, exits 0; on Kill exits 137.
        let guest = std::thread::spawn(move || {
            let mut c = Connection::new(guest_end);
            let mut seen = Vec::new();
            while let Ok((id, m)) = c.recv() {
                match m {
                    Message::Exec(e) => {
                        seen.push(id);
                        let a0 = e.argv[0].as_slice().to_vec();
                        if a0 == b"hang" {
                            c.send(&Message::Started { pid: 5 }, id).unwrap();
                            continue;
                        }
                        if a0 == b"stuck" {
                            let m = Message::error(
                                ErrorCode::TreeSurvived,
                                "1 process(es) of the command outlived SIGKILL",
                            );
                            c.send(&m, id).unwrap();
                            continue;
                        }
                        c.send(&Message::Stdout(a0), id).unwrap();
                        c.send(&Message::Exit(hull_protocol::ExitStatus::Code(0)), id)
                            .unwrap();
                    }
                    Message::Kill => {
                        c.send(&Message::Exit(hull_protocol::ExitStatus::Signal(9)), id)
                            .unwrap();
                    }
                    Message::Shutdown => break,
                    _ => {}
                }
            }
            seen
        });
        let (tx, rx) = std::sync::mpsc::sync_channel(16);
        let reader_half = host_end.try_clone().unwrap();
        std::thread::spawn(move || {
            let mut r = FrameReader::new(reader_half);
            loop {
                let f = r.recv();
                let end = f.is_err();
                if tx.send(f).is_err() || end {
                    break;
                }
            }
        });
        let hub = Arc::new(Hub::new(
            "t".into(),
            Arc::new(Mutex::new(FrameWriter::new(host_end))),
        ));
        {
            let hub = hub.clone();
            std::thread::spawn(move || agent_reader(&hub, rx));
        }
        let connect = |hub: &Arc<Hub>| {
            let (c, s) = UnixStream::pair().unwrap();
            let hub = hub.clone();
            std::thread::spawn(move || client(&hub, s));
            let mut a = AgentSession::new(c).unwrap();
            a.hello(Duration::from_secs(5), &mut || true).unwrap();
            a
        };
        #[derive(Default)]
        struct Out(Vec<u8>);
        impl OutputSink for Out {
            fn stdout(&mut self, d: &[u8]) -> io::Result<()> {
                self.0.extend_from_slice(d);
                Ok(())
            }
            fn stderr(&mut self, _: &[u8]) -> io::Result<()> {
                Ok(())
            }
        }
        let spec = |a0: &str| CommandSpec {
            argv: vec![a0.into()],
            cwd: "/".into(),
            env: vec![],
            timeout: None,
            user: None,
        };
        let mut a = connect(&hub);
        let mut b = connect(&hub);
        // Both clients use exec id 1; the guest sees two different ids.
        let mut oa = Out::default();
        let mut ob = Out::default();
        assert_eq!(
            a.exec(&spec("alpha"), &mut oa, ExecOptions::default())
                .unwrap(),
            ExitStatus::Code(0)
        );
        assert_eq!(
            b.exec(&spec("beta"), &mut ob, ExecOptions::default())
                .unwrap(),
            ExitStatus::Code(0)
        );
        assert_eq!(oa.0, b"alpha");
        assert_eq!(ob.0, b"beta");

        // A client that disconnects mid-command gets its command killed.
        let (c, s) = UnixStream::pair().unwrap();
        {
            let hub = hub.clone();
            std::thread::spawn(move || client(&hub, s));
        }
        let mut conn = Connection::new(c);
        conn.hello(Role::Host, "test").unwrap();
        let e = crate::agent::build_exec(&spec("hang"), &ExecOptions::default()).unwrap();
        conn.send(&Message::Exec(e), 7).unwrap();
        assert_eq!(conn.recv().unwrap(), (7, Message::Started { pid: 5 }));
        drop(conn);
        let end = Instant::now() + Duration::from_secs(5);
        while !hub.routes.lock().unwrap().by_global.is_empty() {
            assert!(
                Instant::now() < end,
                "the dropped client's command was not killed"
            );
            std::thread::sleep(Duration::from_millis(20));
        }

        // A client may not send agent-side frames.
        let (c, s) = UnixStream::pair().unwrap();
        {
            let hub = hub.clone();
            std::thread::spawn(move || client(&hub, s));
        }
        let mut conn = Connection::new(c);
        conn.hello(Role::Host, "test").unwrap();
        conn.send(&Message::Stdout(b"x".to_vec()), 3).unwrap();
        match conn.recv().unwrap() {
            (0, Message::Error { code, .. }) => assert_eq!(code, ErrorCode::BadRequest),
            other => panic!("{other:?}"),
        }
        assert!(
            conn.recv().is_err(),
            "the session is closed after a bad frame"
        );
        assert!(!hub.stop.load(Ordering::SeqCst));

        // A command whose processes outlived their kill: its client is
        // told, and the VM is faulted (it serves no other run).
        let mut oc = Out::default();
        let r = a.exec(&spec("stuck"), &mut oc, ExecOptions::default());
        let err = format!("{:?}", r.expect_err("the stuck command's exec succeeded"));
        assert!(err.contains("outlived"), "{err}");
        let end = Instant::now() + Duration::from_secs(5);
        while !hub.fault.load(Ordering::SeqCst) {
            assert!(Instant::now() < end, "the VM was not faulted");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(hub.stop.load(Ordering::SeqCst));

        drop(a);
        drop(b);
        hub.to_agent(&Message::Shutdown, 0);
        let seen = guest.join().unwrap();
        assert_eq!(seen.len(), 4);
        let mut uniq = seen.clone();
        uniq.sort();
        uniq.dedup();
        assert_eq!(uniq.len(), 4, "guest ids are distinct: {seen:?}");
    }
}
