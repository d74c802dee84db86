//! End-to-end: `hull __net-proxy` as a run will own it: it says where it
//! listens, passes what the policy allows to a loopback origin, refuses the
//! rest with a 403 the origin never sees, writes the audit, and ends when
//! its stdin closes, with one line per refused host.
#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

fn ask(proxy: &str, req: &str) -> String {
    let mut s = TcpStream::connect(proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

#[test]
fn the_proxy_helper_serves_audits_and_ends_with_its_owner() {
    let dir = tempfile::tempdir().unwrap();
    let origin = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = origin.local_addr().unwrap().port();
    origin.set_nonblocking(true).unwrap();
    let pol = dir.path().join("net.toml");
    std::fs::write(
        &pol,
        format!(
            "version = 1\n[net]\nmode = \"allowlist\"\nallow = [\"pkgs.test\", \"doc.test\"]\n\
             ports = [{port}]\n\
             hosts = {{ \"pkgs.test\" = \"127.0.0.1\", \"other.test\" = \"127.0.0.1\", \
             \"doc.test\" = \"192.0.2.1\" }}\n\
             allow_private = [\"127.0.0.1/32\"]\n"
        ),
    )
    .unwrap();
    let audit = dir.path().join("net-audit.jsonl");
    let mut child = Command::new(env!("CARGO_BIN_EXE_hull"))
        .args(["__net-proxy", "--policy"])
        .arg(&pol)
        .arg("--audit")
        .arg(&audit)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .strip_prefix("listening ")
        .expect("listening ADDR")
        .trim()
        .to_string();

    // The origin answers one request, in its own thread.
    let served = std::thread::spawn(move || {
        origin.set_nonblocking(false).unwrap();
        let (mut s, _) = origin.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 4096];
        let n = s.read(&mut buf).unwrap();
        s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
            .unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    });
    let refused = ask(
        &addr,
        &format!("GET http://other.test:{port}/x HTTP/1.1\r\nHost: other.test:{port}\r\nConnection: close\r\n\r\n"),
    );
    assert!(refused.starts_with("HTTP/1.1 403"), "{refused}");
    // Allowed by name, refused by the address it resolves to.
    let refused = ask(
        &addr,
        &format!("GET http://doc.test:{port}/x HTTP/1.1\r\nHost: doc.test:{port}\r\nConnection: close\r\n\r\n"),
    );
    assert!(refused.starts_with("HTTP/1.1 403"), "{refused}");
    let ok = ask(
        &addr,
        &format!("GET http://pkgs.test:{port}/x HTTP/1.1\r\nHost: pkgs.test:{port}\r\nConnection: close\r\n\r\n"),
    );
    assert!(ok.starts_with("HTTP/1.1 200") && ok.ends_with("ok"), "{ok}");
    // The origin's one connection was the allowed request.
    let seen = served.join().unwrap();
    assert!(seen.starts_with("GET /x HTTP/1.1"), "{seen}");

    drop(child.stdin.take());
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the proxy outlived its stdin"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success());
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    // Each refusal once, with its reason and the policy line that would
    // allow it.
    assert_eq!(
        err.trim(),
        format!(
            "hull: network: refused doc.test:{port} (1 time): 192.0.2.1 is a documentation \
             address, which allow_private does not cover; to allow it: [net] allow_private = \
             [..., \"192.0.2.1/32\"] (only if that address is meant to be reached)\n\
             hull: network: refused other.test:{port} (1 time): other.test is not in the \
             policy's allow list; to allow it: [net] allow = [..., \"other.test\"]"
        )
    );
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert_eq!(lines[0]["host"], "other.test");
    assert_eq!(lines[0]["allowed"], false);
    assert_eq!(
        lines[0]["allow_with"],
        "[net] allow = [..., \"other.test\"]"
    );
    assert_eq!(lines[1]["host"], "doc.test");
    assert_eq!(lines[1]["allowed"], false);
    assert_eq!(lines[2]["host"], "pkgs.test");
    assert_eq!(lines[2]["allowed"], true);
    assert_eq!(lines[2]["allow_with"], serde_json::Value::Null);
    assert_eq!(lines[2]["addr"], format!("127.0.0.1:{port}"));
}
