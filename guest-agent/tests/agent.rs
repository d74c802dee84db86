//! The exec server end to end, in one test process: a real session over a
//! socketpair (or a real unix listener), real processes, and the protocol
//! crate's blocking client as the host.

#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used)] // test-only crate: helpers outside #[test] fns unwrap too

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use hull_agent::serve::{self, ServeOptions, SessionEnd};
use hull_agent::transport::Transport;
use hull_protocol::limits::STDIN_WINDOW;
use hull_protocol::*;

/// A safety net so a broken agent fails the test instead of hanging it.
const NET: Duration = Duration::from_secs(120);

struct Agent {
    conn: Connection<UnixStream>,
    thread: JoinHandle<SessionEnd>,
}

fn agent_with(opts: ServeOptions) -> Agent {
    let (host, guest) = UnixStream::pair().unwrap();
    let thread = thread::spawn(move || {
        serve::serve_session(Transport::from_unix(guest, "test").unwrap(), &opts).unwrap()
    });
    host.set_read_timeout(Some(NET)).unwrap();
    let mut conn = Connection::new(host);
    let hello = conn.hello(Role::Host, "agent-test").unwrap();
    assert_eq!(hello.role, Role::InnerAgent);
    Agent { conn, thread }
}

fn agent() -> Agent {
    agent_with(ServeOptions::new(Role::InnerAgent))
}

fn exec(argv: &[&[u8]]) -> Exec {
    Exec {
        argv: argv.iter().map(|a| Bytes(a.to_vec())).collect(),
        env: vec![("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into())],
        cwd: Bytes::from("/"),
        timeout_ms: None,
        stdin: false,
        uid: None,
        gid: None,
        scrub: vec![],
        keep_leftovers: false,
        user: None,
    }
}

fn sh(script: &str) -> Exec {
    exec(&[b"sh", b"-c", script.as_bytes()])
}

#[derive(Debug, Default)]
struct Outcome {
    started: Option<u32>,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    end: Option<Message>,
}

/// Collect frames of `id` until its terminal frame. Frames of other ids
/// are not expected here.
fn finish(conn: &mut Connection<UnixStream>, id: u32, o: &mut Outcome) {
    while o.end.is_none() {
        let (fid, msg) = conn.recv().unwrap();
        assert_eq!(fid, id, "unexpected frame {msg:?}");
        take(o, msg);
    }
}

fn take(o: &mut Outcome, msg: Message) {
    assert!(o.end.is_none(), "frame after the terminal frame: {msg:?}");
    match msg {
        Message::Started { pid } => {
            assert!(o.started.is_none(), "started twice");
            o.started = Some(pid);
        }
        Message::Stdout(b) => {
            assert!(o.started.is_some(), "stdout before started");
            o.stdout.extend(b);
        }
        Message::Stderr(b) => {
            assert!(o.started.is_some(), "stderr before started");
            o.stderr.extend(b);
        }
        Message::StdinAck { .. } => {}
        m @ (Message::Exit(_) | Message::Error { .. }) => o.end = Some(m),
        other => panic!("unexpected {other:?}"),
    }
}

fn run(a: &mut Agent, id: u32, req: Exec) -> Outcome {
    a.conn.send(&Message::Exec(req), id).unwrap();
    let mut o = Outcome::default();
    finish(&mut a.conn, id, &mut o);
    o
}

/// Read stdout of `id` until it holds a full line; returns that line.
fn read_line(conn: &mut Connection<UnixStream>, id: u32, o: &mut Outcome) -> String {
    loop {
        if let Some(i) = o.stdout.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = o.stdout.drain(..=i).collect();
            return String::from_utf8(line).unwrap().trim_end().to_owned();
        }
        let (fid, msg) = conn.recv().unwrap();
        assert_eq!(fid, id);
        take(o, msg);
        assert!(o.end.is_none(), "exec ended early: {o:?}");
    }
}

fn stat(pid: u32) -> Option<(String, i32)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some((f[0].to_owned(), f[3].parse().ok()?))
}

/// Whether `pid` is a live process running `sleep`.
fn sleep_alive(pid: u32) -> bool {
    let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    cmd.starts_with(b"sleep\0") && stat(pid).is_some_and(|(state, _)| state != "Z")
}

fn end_session(a: Agent) -> SessionEnd {
    drop(a.conn);
    a.thread.join().unwrap()
}

#[test]
fn exit_code_and_both_streams() {
    let mut a = agent();
    let o = run(&mut a, 1, sh("echo out; echo err >&2; exit 3"));
    assert!(o.started.is_some());
    assert_eq!(o.stdout, b"out\n");
    assert_eq!(o.stderr, b"err\n");
    assert_eq!(o.end, Some(Message::Exit(ExitStatus::Code(3))));
    assert_eq!(end_session(a), SessionEnd::Closed);
}

#[test]
fn signal_exit_is_reported() {
    let mut a = agent();
    let o = run(&mut a, 1, sh("kill -9 $$"));
    assert_eq!(o.end, Some(Message::Exit(ExitStatus::Signal(9))));
}

#[test]
fn non_utf8_argv_reaches_the_command() {
    let mut a = agent();
    let weird: &[u8] = &[0xff, 0xfe, b'x', 0x80, b' ', 0xc3];
    let o = run(
        &mut a,
        1,
        exec(&[b"sh", b"-c", b"printf %s \"$1\"", b"sh", weird]),
    );
    assert_eq!(o.stdout, weird);
    assert_eq!(o.end, Some(Message::Exit(ExitStatus::Code(0))));
}

#[test]
fn env_and_cwd_are_exactly_the_requested_ones() {
    let mut a = agent();
    let mut req = sh("echo $FOO; pwd; echo ${HOME-unset}");
    req.env.push(("FOO".into(), "bar".into()));
    req.cwd = Bytes::from("/tmp");
    let o = run(&mut a, 1, req);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "bar\n/tmp\nunset\n");
}

#[test]
fn stdin_round_trip_with_flow_control() {
    let mut a = agent();
    let mut req = exec(&[b"cat"]);
    req.stdin = true;
    a.conn.send(&Message::Exec(req), 1).unwrap();
    // 3 windows' worth, so the host must wait for acknowledgements.
    let total = 3 * STDIN_WINDOW as usize + 12345;
    let data: Vec<u8> = (0..total).map(|i| (i * 7 % 251) as u8).collect();
    let mut o = Outcome::default();
    let (mut sent, mut in_flight, mut acked) = (0usize, 0u64, 0u64);
    while sent < total {
        let n = (total - sent).min(STDIN_WINDOW as usize / 4);
        if in_flight + n as u64 <= STDIN_WINDOW {
            a.conn
                .send(&Message::Stdin(data[sent..sent + n].to_vec()), 1)
                .unwrap();
            sent += n;
            in_flight += n as u64;
            continue;
        }
        let (id, msg) = a.conn.recv().unwrap();
        assert_eq!(id, 1);
        if let Message::StdinAck { bytes } = msg {
            in_flight -= bytes;
            acked += bytes;
        }
        take(&mut o, msg);
    }
    a.conn.send(&Message::StdinEof, 1).unwrap();
    while o.end.is_none() {
        let (_, msg) = a.conn.recv().unwrap();
        if let Message::StdinAck { bytes } = msg {
            acked += bytes;
        }
        take(&mut o, msg);
    }
    assert_eq!(o.end, Some(Message::Exit(ExitStatus::Code(0))));
    assert_eq!(o.stdout.len(), total);
    assert!(o.stdout == data, "stdout differs from stdin");
    assert!(acked <= total as u64);
}

#[test]
fn output_streams_before_exit() {
    let mut a = agent();
    let mut req = sh("echo first; read x; echo \"second $x\"");
    req.stdin = true;
    a.conn.send(&Message::Exec(req), 4).unwrap();
    let mut o = Outcome::default();
    // The command is blocked on `read`: "first" can only arrive if output
    // is streamed while it runs.
    assert_eq!(read_line(&mut a.conn, 4, &mut o), "first");
    a.conn.send(&Message::Stdin(b"go\n".to_vec()), 4).unwrap();
    assert_eq!(read_line(&mut a.conn, 4, &mut o), "second go");
    finish(&mut a.conn, 4, &mut o);
    assert_eq!(o.end, Some(Message::Exit(ExitStatus::Code(0))));
}

#[test]
fn large_output_all_arrives_before_exit() {
    let mut a = agent();
    let o = run(&mut a, 1, sh("head -c 5000000 /dev/zero; echo done >&2"));
    assert_eq!(o.stdout.len(), 5_000_000);
    assert!(o.stdout.iter().all(|b| *b == 0));
    assert_eq!(o.stderr, b"done\n");
    assert_eq!(o.end, Some(Message::Exit(ExitStatus::Code(0))));
}

#[test]
fn timeout_kills_a_tree_with_a_setsid_grandchild() {
    let mut a = agent();
    let mut req = sh("setsid sh -c 'echo $$; exec sleep 1000' & wait");
    req.timeout_ms = Some(3000);
    a.conn.send(&Message::Exec(req), 9).unwrap();
    let mut o = Outcome::default();
    let grandchild: u32 = read_line(&mut a.conn, 9, &mut o).parse().unwrap();
    finish(&mut a.conn, 9, &mut o);
    assert_eq!(o.end, Some(Message::Exit(ExitStatus::TimedOut)));
    assert!(
        !sleep_alive(grandchild),
        "setsid grandchild {grandchild} survived the timeout"
    );
}

#[test]
fn kill_frame_kills_the_whole_tree() {
    let mut a = agent();
    // A setsid grandchild and a double-forked one.
    let script = "setsid sh -c 'echo s $$; exec sleep 1000' & \
                  (sh -c 'echo d $$; exec sleep 1000' &) ; wait";
    a.conn.send(&Message::Exec(sh(script)), 2).unwrap();
    let mut o = Outcome::default();
    let (mut g1, mut g2) = (0u32, 0u32);
    for _ in 0..2 {
        let line = read_line(&mut a.conn, 2, &mut o);
        let (kind, pid) = line.split_once(' ').unwrap();
        match kind {
            "s" => g1 = pid.parse().unwrap(),
            _ => g2 = pid.parse().unwrap(),
        }
    }
    let pid = o.started.unwrap();
    // Make sure the test really exercises escapes: g1 left the session.
    let (_, cmd_sid) = stat(pid).unwrap();
    let (_, g1_sid) = stat(g1).unwrap();
    assert_ne!(g1_sid, cmd_sid, "grandchild did not leave the session");
    for g in [g1, g2] {
        // exec sleep may not have happened yet; wait for it without a clock.
        while !sleep_alive(g) {
            assert!(stat(g).is_some(), "grandchild {g} vanished before the kill");
            thread::yield_now();
        }
    }
    a.conn.send(&Message::Kill, 2).unwrap();
    finish(&mut a.conn, 2, &mut o);
    assert_eq!(o.end, Some(Message::Exit(ExitStatus::Signal(9))));
    assert!(!sleep_alive(g1), "setsid grandchild {g1} survived Kill");
    assert!(
        !sleep_alive(g2),
        "double-forked grandchild {g2} survived Kill"
    );
    assert!(stat(pid).is_none(), "command {pid} still exists after Exit");
}

#[test]
fn leftovers_die_when_the_command_exits() {
    let mut a = agent();
    let o = run(&mut a, 1, sh("sleep 1000 & echo $!"));
    assert_eq!(o.end, Some(Message::Exit(ExitStatus::Code(0))));
    let bg: u32 = String::from_utf8_lossy(&o.stdout).trim().parse().unwrap();
    assert!(!sleep_alive(bg), "background sleep {bg} outlived its exec");
}

/// An exec that asks to keep its leftovers (a session's) ends when its
/// command exits and its output closes, the leftover running on (and
/// holding its output: the exec ends 100 ms after the command); a timed
/// out one still loses its whole tree.
#[test]
fn an_exec_that_keeps_its_leftovers_ends_without_them() {
    let mut a = agent();
    let mut req = sh("sleep 1000 </dev/null >/dev/null 2>&1 & echo $!");
    req.keep_leftovers = true;
    let o = run(&mut a, 1, req);
    assert_eq!(o.end, Some(Message::Exit(ExitStatus::Code(0))));
    let bg: u32 = String::from_utf8_lossy(&o.stdout).trim().parse().unwrap();
    assert!(sleep_alive(bg), "the kept sleep {bg} died with its exec");
    // One that holds the exec's output: the exec still ends.
    let mut req = sh("sleep 1001 & echo $!");
    req.keep_leftovers = true;
    let t = std::time::Instant::now();
    let o = run(&mut a, 2, req);
    assert_eq!(o.end, Some(Message::Exit(ExitStatus::Code(0))));
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let holder: u32 = String::from_utf8_lossy(&o.stdout).trim().parse().unwrap();
    assert!(sleep_alive(holder));
    let mut req = sh("sleep 1002 & echo $! ; sleep 1002");
    req.keep_leftovers = true;
    req.timeout_ms = Some(300);
    let o = run(&mut a, 3, req);
    assert_eq!(o.end, Some(Message::Exit(ExitStatus::TimedOut)));
    let timed: u32 = String::from_utf8_lossy(&o.stdout).trim().parse().unwrap();
    assert!(
        !sleep_alive(timed),
        "the timed-out exec's sleep {timed} lives"
    );
    for pid in [bg, holder] {
        // SAFETY: kill(2) on a pid this test's agent started.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
}

#[test]
fn a_killed_shepherd_ends_the_exec_and_its_orphans_are_swept() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    // The command kills its own shepherd (its parent), so its tree is
    // adopted by the agent, which must find and kill it.
    let script = format!(
        "echo $$ > {}; kill -9 $PPID; exec sleep 1000",
        pidfile.display()
    );
    let o = run(&mut agent(), 1, sh(&script));
    match o.end {
        Some(Message::Error { code, message }) => {
            assert_eq!(code, ErrorCode::Internal);
            assert!(message.contains("shepherd"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    let pid: u32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(stat(pid).is_none(), "orphaned command {pid} was not swept");
}

#[test]
fn signal_frame_reaches_the_process_group() {
    let mut a = agent();
    let req = sh("trap 'echo got-term; exit 7' TERM; echo ready; while :; do sleep 0.01; done");
    a.conn.send(&Message::Exec(req), 3).unwrap();
    let mut o = Outcome::default();
    assert_eq!(read_line(&mut a.conn, 3, &mut o), "ready");
    a.conn.send(&Message::Signal { signo: 15 }, 3).unwrap();
    finish(&mut a.conn, 3, &mut o);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "got-term\n");
    assert_eq!(o.end, Some(Message::Exit(ExitStatus::Code(7))));
}

#[test]
fn two_concurrent_execs_interleave_without_mixing() {
    let mut a = agent();
    for id in [10, 20] {
        let mut req = exec(&[b"cat"]);
        req.stdin = true;
        a.conn.send(&Message::Exec(req), id).unwrap();
    }
    let mut out10 = Outcome::default();
    let mut out20 = Outcome::default();
    // Lock-step: each exec must answer while the other is still running.
    for round in 0..5 {
        for (id, tag) in [(10u32, "a"), (20u32, "b")] {
            let line = format!("{tag}{round}\n");
            a.conn
                .send(&Message::Stdin(line.clone().into_bytes()), id)
                .unwrap();
            loop {
                let (fid, msg) = a.conn.recv().unwrap();
                let o = if fid == 10 { &mut out10 } else { &mut out20 };
                assert!(fid == 10 || fid == 20, "frame for id {fid}");
                take(o, msg);
                let mine = if id == 10 { &out10 } else { &out20 };
                if mine.stdout.ends_with(line.as_bytes()) {
                    break;
                }
            }
        }
    }
    for id in [10, 20] {
        a.conn.send(&Message::StdinEof, id).unwrap();
    }
    while out10.end.is_none() || out20.end.is_none() {
        let (fid, msg) = a.conn.recv().unwrap();
        take(if fid == 10 { &mut out10 } else { &mut out20 }, msg);
    }
    assert_eq!(
        String::from_utf8_lossy(&out10.stdout),
        "a0\na1\na2\na3\na4\n"
    );
    assert_eq!(
        String::from_utf8_lossy(&out20.stdout),
        "b0\nb1\nb2\nb3\nb4\n"
    );
    assert_eq!(out10.end, Some(Message::Exit(ExitStatus::Code(0))));
    assert_eq!(out20.end, Some(Message::Exit(ExitStatus::Code(0))));
    assert_ne!(out10.started, out20.started);
}

#[test]
fn exec_failures_are_error_frames() {
    let mut a = agent();
    let o = run(&mut a, 1, exec(&[b"no-such-program-hull-test"]));
    match o.end {
        Some(Message::Error { code, message }) => {
            assert_eq!(code, ErrorCode::CommandNotFound);
            assert!(message.contains("not found in PATH"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert!(o.started.is_none());
    let mut req = exec(&[b"/bin/sh", b"-c", b"true"]);
    req.cwd = Bytes::from("/nonexistent-dir-hull-test");
    let o = run(&mut a, 2, req);
    match o.end {
        Some(Message::Error { code, message }) => {
            assert_eq!(code, ErrorCode::ExecFailed);
            assert!(
                message.contains("chdir to the working directory \"/nonexistent-dir-hull-test\""),
                "{message}"
            );
        }
        other => panic!("{other:?}"),
    }
    // /etc/hostname exists but is not executable.
    let o = run(&mut a, 3, exec(&[b"/etc/passwd"]));
    match o.end {
        Some(Message::Error { code, message }) => {
            assert_eq!(code, ErrorCode::CommandNotExecutable);
            assert!(message.contains("execve"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    // A path that is not there: found by execve, not by the PATH search.
    let o = run(&mut a, 5, exec(&[b"./no-such-file-hull-test"]));
    match o.end {
        Some(Message::Error { code, message }) => {
            assert_eq!(code, ErrorCode::CommandNotFound);
            assert!(message.contains("execve"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    // The session still works.
    let o = run(&mut a, 4, sh("echo ok"));
    assert_eq!(o.stdout, b"ok\n");
}

fn require_root() {
    assert!(
        rustix::process::geteuid().is_root(),
        "this test switches uid and needs root; run the suite as root (CI and the dev VMs do)"
    );
}

#[test]
fn uid_gid_switch_and_no_new_privs() {
    require_root();
    let mut a = agent();
    let mut req = sh("id -u; id -g; id -G; grep NoNewPrivs /proc/self/status");
    req.uid = Some(65534);
    req.gid = Some(65534);
    let o = run(&mut a, 1, req);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "65534\n65534\n65534\nNoNewPrivs:\t1\n"
    );
    // Without ids the command keeps the agent's uid, still with no_new_privs.
    let o = run(&mut a, 2, sh("id -u; grep NoNewPrivs /proc/self/status"));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "0\nNoNewPrivs:\t1\n");
}

#[test]
fn session_policy_forces_the_uid() {
    require_root();
    let mut opts = ServeOptions::new(Role::InnerAgent);
    opts.run_as = Some((65534, 65534));
    let mut a = agent_with(opts);
    let mut req = sh("id -u");
    req.uid = Some(0);
    req.gid = Some(0);
    let o = run(&mut a, 1, req);
    assert!(
        matches!(
            o.end,
            Some(Message::Error {
                code: ErrorCode::PolicyDenied,
                ..
            })
        ),
        "{o:?}"
    );
    assert!(o.started.is_none());
    let o = run(&mut a, 2, sh("id -u"));
    assert_eq!(o.stdout, b"65534\n");
}

/// An exec may name its user: it runs as that user's uid and gid from the
/// agent's `/etc/passwd` (this host's here), with that user's HOME, USER
/// and LOGNAME over the exec's own. An unknown user starts nothing; a
/// forced uid refuses any user; where ids are required (the inner agent),
/// an exec naming neither is refused.
#[test]
fn an_exec_runs_as_the_user_it_names() {
    require_root();
    let mut opts = ServeOptions::new(Role::InnerAgent);
    opts.ids_required = true;
    let mut a = agent_with(opts);
    let mut req = sh("id -un; id -u; id -G; echo \"$HOME $USER $LOGNAME\"");
    req.env.push(("HOME".into(), "/elsewhere".into()));
    req.user = Some("nobody".into());
    let o = run(&mut a, 1, req.clone());
    let nobody_home = std::fs::read_to_string("/etc/passwd")
        .unwrap()
        .lines()
        .find_map(|l| {
            l.strip_prefix("nobody:")
                .map(|r| r.split(':').nth(4).unwrap().to_string())
        })
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        format!("nobody\n65534\n65534\n{nobody_home} nobody nobody\n"),
        "{o:?}"
    );
    req.user = Some("root".into());
    let o = run(&mut a, 2, req.clone());
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "root\n0\n0\n/root root root\n",
        "{o:?}"
    );
    req.user = Some("no-such-user-here".into());
    let o = run(&mut a, 3, req.clone());
    match &o.end {
        Some(Message::Error {
            code: ErrorCode::UnknownUser,
            message,
        }) => assert!(
            message.contains("no user no-such-user-here in /etc/passwd"),
            "{message}"
        ),
        other => panic!("{other:?}"),
    }
    assert!(o.started.is_none());
    let o = run(&mut a, 4, sh("id -u"));
    assert!(
        matches!(
            &o.end,
            Some(Message::Error { code: ErrorCode::PolicyDenied, message })
                if message.contains("without the user, or the uid and gid")
        ),
        "{o:?}"
    );
    assert!(o.started.is_none());
    let mut opts = ServeOptions::new(Role::InnerAgent);
    opts.run_as = Some((65534, 65534));
    let mut a = agent_with(opts);
    req.user = Some("root".into());
    let o = run(&mut a, 1, req);
    assert!(
        matches!(
            &o.end,
            Some(Message::Error { code: ErrorCode::PolicyDenied, message })
                if message.contains("not as user root")
        ),
        "{o:?}"
    );
}

/// An exec's `scrub` empties the directories as the exec's user before
/// the command starts: that user's entries go (a file, a tree, a
/// directory of its own made unreadable, a link, not followed), another
/// user's stay, and the command sees the result. The agent itself stays
/// root (the next exec without ids runs as root). A directory the user
/// cannot empty ends the exec with `ScrubFailed` naming it, the command
/// never started, and nothing there changed.
#[test]
fn a_scrub_empties_the_users_scratch_as_that_user_before_the_command() {
    use std::os::unix::fs::{lchown, symlink, PermissionsExt};
    require_root();
    let d = tempfile::tempdir().unwrap();
    let perm = |p: &std::path::Path, mode: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    perm(d.path(), 0o711);
    let (top, outside) = (d.path().join("scratch"), d.path().join("outside"));
    std::fs::create_dir_all(top.join("dir/sub")).unwrap();
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("keep"), "keep").unwrap();
    std::fs::write(top.join("left"), "x").unwrap();
    std::fs::write(top.join("dir/sub/f"), "x").unwrap();
    symlink(&outside, top.join("link")).unwrap();
    for p in ["left", "dir", "dir/sub", "dir/sub/f", "link"] {
        lchown(top.join(p), Some(65534), Some(65534)).unwrap();
    }
    perm(&top.join("dir"), 0o000);
    std::fs::write(top.join("roots"), "root's").unwrap();
    perm(&top, 0o1777);
    // Control: the user's entries are there before.
    assert_eq!(std::fs::read_dir(&top).unwrap().count(), 4);

    let mut a = agent();
    let mut req = sh(&format!("id -u; ls -A {}", top.display()));
    (req.uid, req.gid) = (Some(65534), Some(65534));
    req.scrub = vec![Bytes::from(top.to_str().unwrap())];
    let o = run(&mut a, 1, req);
    assert_eq!(
        o.end,
        Some(Message::Exit(ExitStatus::Code(0))),
        "{:?}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&o.stdout), "65534\nroots\n");
    assert_eq!(
        std::fs::read_to_string(top.join("roots")).unwrap(),
        "root's"
    );
    assert_eq!(
        std::fs::read_to_string(outside.join("keep")).unwrap(),
        "keep"
    );
    let o = run(&mut a, 2, sh("id -u"));
    assert_eq!(o.stdout, b"0\n", "the agent is no longer root");

    let private = d.path().join("private");
    std::fs::create_dir(&private).unwrap();
    std::fs::write(private.join("f"), "x").unwrap();
    perm(&private, 0o700);
    let mut req = sh("echo RAN");
    (req.uid, req.gid) = (Some(65534), Some(65534));
    req.scrub = vec![
        Bytes::from(top.to_str().unwrap()),
        Bytes::from(private.to_str().unwrap()),
    ];
    let o = run(&mut a, 3, req);
    match &o.end {
        Some(Message::Error {
            code: ErrorCode::ScrubFailed,
            message,
        }) => assert!(
            message.contains(private.to_str().unwrap()) && message.contains("did not start"),
            "{message}"
        ),
        other => panic!("{other:?}"),
    }
    assert!(o.started.is_none() && o.stdout.is_empty(), "{o:?}");
    assert!(private.join("f").exists());
    // Never as root.
    let mut req = sh("echo RAN");
    (req.uid, req.gid) = (Some(0), Some(0));
    req.scrub = vec![Bytes::from(top.to_str().unwrap())];
    let o = run(&mut a, 4, req);
    assert!(
        matches!(&o.end, Some(Message::Error { code: ErrorCode::ScrubFailed, message }) if message.contains("root")),
        "{o:?}"
    );
    assert!(std::fs::read_to_string(top.join("roots")).is_ok());
}

#[test]
fn too_many_execs_is_busy() {
    let mut opts = ServeOptions::new(Role::InnerAgent);
    opts.max_execs = 1;
    let mut a = agent_with(opts);
    let mut req = exec(&[b"cat"]);
    req.stdin = true;
    a.conn.send(&Message::Exec(req), 1).unwrap();
    // The first exec's `Started` comes first: until it has, its frames
    // could interleave with the second's answer.
    let mut o1 = Outcome::default();
    let (fid, m) = a.conn.recv().unwrap();
    assert_eq!(fid, 1, "unexpected frame {m:?}");
    take(&mut o1, m);
    assert!(o1.started.is_some(), "{o1:?}");
    let o = run(&mut a, 2, sh("echo no"));
    assert!(
        matches!(
            o.end,
            Some(Message::Error {
                code: ErrorCode::Busy,
                ..
            })
        ),
        "{o:?}"
    );
    a.conn.send(&Message::StdinEof, 1).unwrap();
    finish(&mut a.conn, 1, &mut o1);
    assert_eq!(o1.end, Some(Message::Exit(ExitStatus::Code(0))));
}

#[test]
fn stdin_for_an_exec_without_stdin_aborts_it() {
    let mut a = agent();
    a.conn
        .send(&Message::Exec(sh("exec sleep 1000")), 1)
        .unwrap();
    let (_, m) = a.conn.recv().unwrap();
    let Message::Started { pid } = m else {
        panic!("{m:?}")
    };
    a.conn.send(&Message::Stdin(b"x".to_vec()), 1).unwrap();
    let mut o = Outcome {
        started: Some(pid),
        ..Default::default()
    };
    finish(&mut a.conn, 1, &mut o);
    assert!(
        matches!(
            o.end,
            Some(Message::Error {
                code: ErrorCode::BadRequest,
                ..
            })
        ),
        "{o:?}"
    );
    assert!(!sleep_alive(pid));
}

/// Stdin for an exec that has just ended (the host sent it before the
/// exit reached it) is dropped: the exec's terminal frame is the only
/// answer, and nothing follows it.
#[test]
fn stdin_after_an_exec_ended_gets_no_unknown_id() {
    let mut a = agent();
    let o = run(&mut a, 3, sh("exit 4"));
    assert_eq!(o.end, Some(Message::Exit(ExitStatus::Code(4))));
    a.conn.send(&Message::Stdin(b"late".to_vec()), 3).unwrap();
    a.conn.send(&Message::StdinEof, 3).unwrap();
    a.conn.send(&Message::Ping { nonce: 9 }, 0).unwrap();
    // The pong is the next frame: no UnknownId came before it.
    assert_eq!(a.conn.recv().unwrap(), (0, Message::Pong { nonce: 9 }));
    // An id never used is still answered.
    a.conn.send(&Message::StdinEof, 8).unwrap();
    assert!(matches!(
        a.conn.recv().unwrap(),
        (
            8,
            Message::Error {
                code: ErrorCode::UnknownId,
                ..
            }
        )
    ));
}

#[test]
fn unknown_id_is_answered() {
    let mut a = agent();
    a.conn.send(&Message::Kill, 77).unwrap();
    let (id, m) = a.conn.recv().unwrap();
    assert_eq!(id, 77);
    assert!(
        matches!(
            m,
            Message::Error {
                code: ErrorCode::UnknownId,
                ..
            }
        ),
        "{m:?}"
    );
    a.conn.send(&Message::Ping { nonce: 5 }, 0).unwrap();
    assert_eq!(a.conn.recv().unwrap(), (0, Message::Pong { nonce: 5 }));
}

#[test]
fn garbage_gets_an_error_frame_and_running_execs_die() {
    let mut a = agent();
    a.conn
        .send(&Message::Exec(sh("echo $$; exec sleep 1000")), 1)
        .unwrap();
    let mut o = Outcome::default();
    let pid: u32 = read_line(&mut a.conn, 1, &mut o).parse().unwrap();
    a.conn
        .get_mut()
        .write_all(b"this is not a frame at all")
        .unwrap();
    let (id, m) = a.conn.recv().unwrap();
    assert_eq!(id, 0);
    assert!(
        matches!(
            m,
            Message::Error {
                code: ErrorCode::BadFrame,
                ..
            }
        ),
        "{m:?}"
    );
    assert!(matches!(a.conn.recv(), Err(ConnError::Closed)));
    assert!(matches!(
        a.thread.join().unwrap(),
        SessionEnd::ProtocolError(_)
    ));
    assert!(!sleep_alive(pid), "exec {pid} survived the session");
}

#[test]
fn oversized_and_unknown_frames_get_error_frames() {
    for (bytes, want) in [
        (
            {
                let mut h = b"HULL".to_vec();
                h.extend_from_slice(&(Kind::Stdin as u16).to_le_bytes());
                h.extend_from_slice(&0u16.to_le_bytes());
                h.extend_from_slice(&1u32.to_le_bytes());
                h.extend_from_slice(&u32::MAX.to_le_bytes());
                h
            },
            ErrorCode::Oversized,
        ),
        (
            {
                let mut h = b"HULL".to_vec();
                h.extend_from_slice(&999u16.to_le_bytes());
                h.extend_from_slice(&[0; 10]);
                h
            },
            ErrorCode::UnknownKind,
        ),
        (
            encode(&Message::Stdout(b"x".to_vec()), 5).unwrap(),
            ErrorCode::BadRequest,
        ),
        (
            encode(
                &Message::Hello(Hello {
                    version: 1,
                    min_version: 1,
                    role: Role::Host,
                    software: String::new(),
                }),
                0,
            )
            .unwrap(),
            ErrorCode::BadRequest,
        ),
    ] {
        let mut a = agent();
        a.conn.get_mut().write_all(&bytes).unwrap();
        let (id, m) = a.conn.recv().unwrap();
        assert_eq!(id, 0);
        match m {
            Message::Error { code, .. } => assert_eq!(code, want),
            other => panic!("{other:?}"),
        }
        assert!(matches!(a.conn.recv(), Err(ConnError::Closed)));
        assert!(matches!(
            a.thread.join().unwrap(),
            SessionEnd::ProtocolError(_)
        ));
    }
}

#[test]
fn duplicate_running_id_is_fatal() {
    let mut a = agent();
    let mut req = exec(&[b"cat"]);
    req.stdin = true;
    a.conn.send(&Message::Exec(req.clone()), 1).unwrap();
    let (_, m) = a.conn.recv().unwrap();
    assert!(matches!(m, Message::Started { .. }));
    a.conn.send(&Message::Exec(req), 1).unwrap();
    let (id, m) = a.conn.recv().unwrap();
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
}

#[test]
fn connection_loss_kills_running_execs() {
    let mut a = agent();
    a.conn
        .send(&Message::Exec(sh("echo $$; exec sleep 1000")), 1)
        .unwrap();
    let mut o = Outcome::default();
    let pid: u32 = read_line(&mut a.conn, 1, &mut o).parse().unwrap();
    assert!(sleep_alive(pid) || stat(pid).is_some());
    assert_eq!(end_session(a), SessionEnd::Closed);
    assert!(!sleep_alive(pid), "exec {pid} survived the lost connection");
}

#[test]
fn shutdown_ends_the_session_and_its_execs() {
    let mut a = agent();
    a.conn
        .send(&Message::Exec(sh("echo $$; exec sleep 1000")), 1)
        .unwrap();
    let mut o = Outcome::default();
    let pid: u32 = read_line(&mut a.conn, 1, &mut o).parse().unwrap();
    a.conn.send(&Message::Shutdown, 0).unwrap();
    assert_eq!(a.thread.join().unwrap(), SessionEnd::Shutdown);
    assert!(!sleep_alive(pid));
}

#[test]
fn configure_is_unsupported_without_a_configurator() {
    let mut a = agent();
    let spec = ConfigureSpec {
        shares: vec![],
        container: ContainerSpec {
            name: "hull-x".into(),
            base: "base".into(),
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
    };
    a.conn.send(&Message::Configure(spec), 0).unwrap();
    let (id, m) = a.conn.recv().unwrap();
    assert_eq!(id, 0);
    assert!(
        matches!(
            m,
            Message::Error {
                code: ErrorCode::Unsupported,
                ..
            }
        ),
        "{m:?}"
    );
    // Not fatal: the session goes on.
    let o = run(&mut a, 1, sh("echo still"));
    assert_eq!(o.stdout, b"still\n");
}

#[test]
fn unix_listener_survives_a_bad_client_and_stops_on_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.sock");
    let p = path.clone();
    let server = thread::spawn(move || serve::serve_unix(&p, &ServeOptions::new(Role::InnerAgent)));
    let connect = || loop {
        match UnixStream::connect(&path) {
            Ok(s) => {
                s.set_read_timeout(Some(NET)).unwrap();
                return s;
            }
            Err(_) => thread::yield_now(),
        }
    };
    // A bad client: hello, then garbage.
    let mut bad = Connection::new(connect());
    bad.hello(Role::Host, "bad").unwrap();
    bad.get_mut().write_all(&[0u8; 64]).unwrap();
    assert!(matches!(
        bad.recv().unwrap().1,
        Message::Error {
            code: ErrorCode::BadFrame,
            ..
        }
    ));
    assert!(matches!(bad.recv(), Err(ConnError::Closed)));
    // A good client afterwards.
    let mut good = Connection::new(connect());
    good.hello(Role::Host, "good").unwrap();
    good.send(&Message::Exec(sh("echo hi")), 1).unwrap();
    let mut o = Outcome::default();
    finish(&mut good, 1, &mut o);
    assert_eq!(o.stdout, b"hi\n");
    good.send(&Message::Shutdown, 0).unwrap();
    server.join().unwrap().unwrap();
}
