//! The proxy against loopback servers: what is allowed arrives, what is
//! refused never reaches the destination.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::Duration;

use crate::policy::net::{HostPattern, NetMode, NetPolicy};
use crate::sni::tests::client_hello;
use crate::{Audit, Listener, Proxy, Shared};

/// A loopback server that answers every connection with `reply` after
/// reading what the client sent first, and reports what it read.
struct Origin {
    port: u16,
    seen: mpsc::Receiver<Vec<u8>>,
}

impl Origin {
    fn start(reply: &'static [u8]) -> Origin {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let (tx, seen) = mpsc::channel();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { break };
                s.set_read_timeout(Some(Duration::from_millis(500)))
                    .unwrap();
                let mut buf = vec![0u8; 64 * 1024];
                let n = s.read(&mut buf).unwrap_or(0);
                buf.truncate(n);
                let _ = s.write_all(reply);
                let _ = tx.send(buf);
            }
        });
        Origin { port, seen }
    }

    /// What the next connection sent, or None when none came.
    fn next(&self) -> Option<Vec<u8>> {
        self.seen.recv_timeout(Duration::from_millis(700)).ok()
    }
}

fn policy(allow: &[&str], private: &[&str]) -> NetPolicy {
    NetPolicy {
        mode: NetMode::Allowlist,
        allow: allow
            .iter()
            .map(|a| HostPattern::parse(a).unwrap())
            .collect(),
        deny: vec![HostPattern::parse("denied.test").unwrap()],
        ports: vec![],
        hosts: [
            ("pkgs.test", "127.0.0.1"),
            ("other.test", "127.0.0.1"),
            ("denied.test", "127.0.0.1"),
            ("inside.test", "127.0.0.1"),
        ]
        .into_iter()
        .map(|(n, a)| (n.to_string(), a.parse().unwrap()))
        .collect(),
        allow_private: private.iter().map(|p| p.parse().unwrap()).collect(),
        registries: Vec::new(),
    }
}

fn proxy(mut p: NetPolicy, origin: &Origin) -> (Proxy, u16) {
    p.ports = vec![origin.port];
    proxy_with(p)
}

/// A proxy for `p` as it is.
fn proxy_with(p: NetPolicy) -> (Proxy, u16) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let proxy = Proxy::start(
        Listener::Tcp(l),
        Shared {
            policy: p,
            audit: Audit::in_memory(),
            key: None,
        },
    )
    .unwrap();
    (proxy, port)
}

/// Sends `request` to the proxy and reads until it closes (or 2 s).
fn ask(port: u16, request: &[u8]) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    s.write_all(request).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

fn get(host: &str, port: u16, header_host: &str) -> Vec<u8> {
    format!(
        "GET http://{host}:{port}/simple/ HTTP/1.1\r\nHost: {header_host}\r\nProxy-Connection: close\r\nConnection: close\r\n\r\n"
    )
    .into_bytes()
}

const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: close\r\n\r\nhello";

#[test]
fn an_allowed_plain_request_arrives_in_origin_form() {
    let origin = Origin::start(OK);
    let (p, port) = proxy(policy(&["pkgs.test"], &["127.0.0.1/32"]), &origin);
    let host = format!("pkgs.test:{}", origin.port);
    let r = ask(port, &get("pkgs.test", origin.port, &host));
    assert!(r.starts_with("HTTP/1.1 200") && r.ends_with("hello"), "{r}");
    let seen = String::from_utf8(origin.next().expect("the origin saw nothing")).unwrap();
    assert!(seen.starts_with("GET /simple/ HTTP/1.1\r\n"), "{seen}");
    assert!(
        !seen.to_ascii_lowercase().contains("proxy-connection"),
        "{seen}"
    );
    assert!(p.audit().refused().is_empty());
}

/// A keyed proxy (hull's own pull, on a port any local process may reach)
/// serves only requests carrying its key, and passes the key on to no
/// origin; SOCKS, which carries none, is closed at once.
#[test]
fn a_keyed_proxy_serves_only_requests_carrying_its_key() {
    let origin = Origin::start(OK);
    let mut p = policy(&["pkgs.test"], &["127.0.0.1/32"]);
    p.ports = vec![origin.port];
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let _proxy = Proxy::start(
        Listener::Tcp(l),
        Shared {
            policy: p,
            audit: Audit::in_memory(),
            key: Some("k3y".into()),
        },
    )
    .unwrap();
    let host = format!("pkgs.test:{}", origin.port);
    let with = |auth: Option<&str>| {
        let mut req = String::from_utf8(get("pkgs.test", origin.port, &host)).unwrap();
        if let Some(a) = auth {
            req = req.replacen("\r\n", &format!("\r\nProxy-Authorization: {a}\r\n"), 1);
        }
        ask(port, req.as_bytes())
    };
    for wrong in [None, Some("Basic aHVsbDp3cm9uZw=="), Some("k3y")] {
        let r = with(wrong);
        assert!(r.starts_with("HTTP/1.1 407"), "{wrong:?}: {r}");
        assert!(origin.next().is_none(), "{wrong:?} reached the origin");
    }
    let r = with(Some(&Shared::authorization("k3y")));
    assert!(r.starts_with("HTTP/1.1 200") && r.ends_with("hello"), "{r}");
    let seen = String::from_utf8(origin.next().expect("the origin saw nothing")).unwrap();
    assert!(
        !seen.to_ascii_lowercase().contains("proxy-authorization"),
        "{seen}"
    );
    // SOCKS5's greeting: closed without an answer.
    let r = ask(port, &[5, 1, 0]);
    assert_eq!(r, "");
}

#[test]
fn refused_requests_never_reach_the_origin() {
    let origin = Origin::start(OK);
    // 127.0.0.1 is not covered: a name that resolves inside is refused.
    let (p, port) = proxy(
        policy(
            &["pkgs.test", "inside.test", "*.denied.test", "denied.test"],
            &[],
        ),
        &origin,
    );
    let o = origin.port;
    for (req, says) in [
        (
            get("other.test", o, &format!("other.test:{o}")),
            "not in the policy's allow list",
        ),
        (
            get("denied.test", o, &format!("denied.test:{o}")),
            "denied by the policy",
        ),
        (
            get("inside.test", o, &format!("inside.test:{o}")),
            "loopback",
        ),
        (
            get("127.0.0.1", o, &format!("127.0.0.1:{o}")),
            "not in the policy's allow list",
        ),
        (
            get("0x7f.1", o, &format!("0x7f.1:{o}")),
            "not a host name hull accepts",
        ),
    ] {
        let r = ask(port, &req);
        assert!(r.starts_with("HTTP/1.1 403"), "{r}");
        assert!(
            r.to_ascii_lowercase().contains("x-hull-refused: hull:"),
            "{r}"
        );
        assert!(r.contains(says), "{says}: {r}");
        assert_eq!(origin.next(), None, "the origin was reached: {r}");
    }
    let refused = p.audit().refused();
    assert_eq!(refused.len(), 5, "{refused:?}");
}

#[test]
fn a_host_header_that_disagrees_is_refused() {
    let origin = Origin::start(OK);
    let (_p, port) = proxy(policy(&["pkgs.test"], &["127.0.0.1/32"]), &origin);
    let o = origin.port;
    let r = ask(port, &get("pkgs.test", o, &format!("other.test:{o}")));
    assert!(
        r.starts_with("HTTP/1.1 403") && r.contains("Host header"),
        "{r}"
    );
    assert_eq!(origin.next(), None);
    // Control: the same request with its own host goes through.
    let r = ask(port, &get("pkgs.test", o, &format!("PKGS.test:{o}")));
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    assert!(origin.next().is_some());
}

#[test]
fn connect_passes_the_hello_only_when_it_names_the_connect_host() {
    let origin = Origin::start(b"server bytes");
    let (p, port) = proxy(
        policy(&["pkgs.test", "other.test"], &["127.0.0.1/32"]),
        &origin,
    );
    let o = origin.port;
    let connect = |host: &str, sni: Option<&str>| {
        let mut req =
            format!("CONNECT {host}:{o} HTTP/1.1\r\nHost: {host}:{o}\r\n\r\n").into_bytes();
        req.extend(client_hello(sni, 16));
        ask(port, &req)
    };
    let r = connect("pkgs.test", Some("pkgs.test"));
    assert!(
        r.starts_with("HTTP/1.1 200") && r.ends_with("server bytes"),
        "{r}"
    );
    assert_eq!(origin.next(), Some(client_hello(Some("pkgs.test"), 16)));
    // Allowed both, but the hello names the other: nothing is connected.
    for sni in [Some("other.test"), None] {
        let r = connect("pkgs.test", sni);
        assert!(
            r.starts_with("HTTP/1.1 200") && !r.contains("server bytes"),
            "{r}"
        );
        assert_eq!(origin.next(), None, "{sni:?} reached the origin");
    }
    // Not allowed at all: 403 before the tunnel.
    let r = connect("denied.test", Some("denied.test"));
    assert!(r.starts_with("HTTP/1.1 403"), "{r}");
    assert_eq!(origin.next(), None);
    std::thread::sleep(Duration::from_millis(100));
    let refused = p.audit().refused();
    assert_eq!(
        refused,
        vec![
            (format!("denied.test:{o}"), 1),
            (format!("pkgs.test:{o}"), 2)
        ]
    );
}

#[test]
fn mode_none_refuses_everything() {
    let origin = Origin::start(OK);
    let (_p, port) = proxy(
        NetPolicy {
            mode: NetMode::None,
            ..policy(&["pkgs.test"], &["127.0.0.1/32"])
        },
        &origin,
    );
    let o = origin.port;
    let r = ask(port, &get("pkgs.test", o, &format!("pkgs.test:{o}")));
    assert!(
        r.starts_with("HTTP/1.1 403") && r.contains("mode is none"),
        "{r}"
    );
    assert_eq!(origin.next(), None);
}

/// A SOCKS5 CONNECT for `host:port` as a name (ATYP 3), then `then`; returns
/// the request's reply code and whatever came after it until the close
/// (or 2 s).
fn socks(port: u16, host: &str, to: u16, then: &[u8]) -> (u8, Vec<u8>) {
    let mut req = vec![5, 1, 0];
    req.extend([5, 1, 0, 3, host.len() as u8]);
    req.extend(host.as_bytes());
    req.extend(to.to_be_bytes());
    socks_raw(port, &req, then)
}

fn socks_raw(port: u16, req: &[u8], then: &[u8]) -> (u8, Vec<u8>) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    s.write_all(req).unwrap();
    let mut method = [0u8; 2];
    s.read_exact(&mut method).unwrap();
    assert_eq!(method, [5, 0], "no authentication chosen");
    let mut reply = [0u8; 10];
    s.read_exact(&mut reply).unwrap();
    if reply[1] == 0 {
        s.write_all(then).unwrap();
    }
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    (reply[1], out)
}

#[test]
fn socks5_reaches_allowed_names_only_with_their_own_hello() {
    let origin = Origin::start(b"server bytes");
    let (p, port) = proxy(
        policy(&["pkgs.test", "other.test"], &["127.0.0.1/32"]),
        &origin,
    );
    let o = origin.port;
    // Raw TCP (an SSH banner) to an allowed name arrives as sent.
    let (code, out) = socks(port, "PKGS.test", o, b"SSH-2.0-client\r\n");
    assert_eq!((code, out.as_slice()), (0, &b"server bytes"[..]));
    assert_eq!(origin.next(), Some(b"SSH-2.0-client\r\n".to_vec()));
    // A ClientHello naming the host arrives whole.
    let (code, out) = socks(port, "pkgs.test", o, &client_hello(Some("pkgs.test"), 16));
    assert_eq!((code, out.as_slice()), (0, &b"server bytes"[..]));
    assert_eq!(origin.next(), Some(client_hello(Some("pkgs.test"), 16)));
    // Naming another (allowed) host, or none: closed, nothing connected.
    for sni in [Some("other.test"), None] {
        let (code, out) = socks(port, "pkgs.test", o, &client_hello(sni, 16));
        assert_eq!((code, out.len()), (0, 0), "{sni:?}");
        assert_eq!(origin.next(), None, "{sni:?} reached the origin");
    }
    // Not allowed, denied, an address literal, another port: reply 2.
    let mut literal = vec![5, 1, 0, 5, 1, 0, 1, 127, 0, 0, 1];
    literal.extend(o.to_be_bytes());
    for (code, out) in [
        socks(port, "nope.test", o, b"x"),
        socks(port, "denied.test", o, b"x"),
        socks(port, "pkgs.test", o.wrapping_add(1), b"x"),
        socks_raw(port, &literal, b"x"),
    ] {
        assert_eq!((code, out.len()), (2, 0));
        assert_eq!(origin.next(), None);
    }
    std::thread::sleep(Duration::from_millis(100));
    let refused = p.audit().refused();
    assert_eq!(refused.len(), 5, "{refused:?}");
}

#[test]
fn socks5_carries_a_server_that_speaks_first_and_refuses_other_commands() {
    // An origin that greets first, as SMTP or MySQL do.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let o = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { break };
            let _ = s.write_all(b"220 hello\r\n");
        }
    });
    let (_p, port) = proxy_with(NetPolicy {
        ports: vec![o],
        ..policy(&["pkgs.test"], &["127.0.0.1/32"])
    });
    let (code, out) = socks(port, "pkgs.test", o, b"");
    assert_eq!((code, out.as_slice()), (0, &b"220 hello\r\n"[..]));
    // BIND (2) and UDP ASSOCIATE (3): reply 7, nothing served.
    for cmd in [2u8, 3] {
        let mut req = vec![5, 1, 0, 5, cmd, 0, 3, 9];
        req.extend(b"pkgs.test");
        req.extend(o.to_be_bytes());
        let (code, _) = socks_raw(port, &req, b"");
        assert_eq!(code, 7, "command {cmd}");
    }
}
