//! A registry's side of a pull that the distribution project's own registry
//! (the end-to-end tests' `docker-registry`) never plays: a token service
//! behind a Bearer challenge, a blob served by a redirect, and a hostile
//! registry answering with content that is not the digest asked for. A
//! small HTTP server of the test's own on loopback, spoken to by hull's
//! real client.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

use hull_oci::registry::{self, Access, Pulled};
use hull_oci::Reference;
use sha2::{Digest, Sha256};

fn digest(b: &[u8]) -> String {
    format!(
        "sha256:{}",
        Sha256::digest(b)
            .iter()
            .map(|x| format!("{x:02x}"))
            .collect::<String>()
    )
}

/// One answer: status, headers, body.
type Answer = (u16, Vec<(String, String)>, Vec<u8>);
/// The requests served: path and `Authorization`.
type Seen = Arc<Mutex<Vec<(String, Option<String>)>>>;

/// Serves `route(path, authorization)` on loopback, one request per
/// connection; records each request's path and `Authorization`.
struct Server {
    port: u16,
    seen: Seen,
}

impl Server {
    fn start(route: impl Fn(&str, Option<&str>, u16) -> Answer + Send + 'static) -> Server {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { break };
                let mut r = BufReader::new(s.try_clone().unwrap());
                let mut line = String::new();
                r.read_line(&mut line).unwrap();
                let path = line.split(' ').nth(1).unwrap_or("").to_string();
                let mut auth = None;
                loop {
                    let mut h = String::new();
                    if r.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                        break;
                    }
                    if let Some((k, v)) = h.split_once(':') {
                        if k.eq_ignore_ascii_case("authorization") {
                            auth = Some(v.trim().to_string());
                        }
                    }
                }
                log.lock().unwrap().push((path.clone(), auth.clone()));
                let (status, headers, body) = route(&path, auth.as_deref(), port);
                let mut out = format!(
                    "HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n",
                    body.len()
                );
                for (k, v) in headers {
                    out.push_str(&format!("{k}: {v}\r\n"));
                }
                out.push_str("\r\n");
                let _ = s.write_all(out.as_bytes());
                let _ = s.write_all(&body);
            }
        });
        Server { port, seen }
    }
}

struct Image {
    manifest: Vec<u8>,
    blobs: HashMap<String, Vec<u8>>,
    layer: String,
}

fn image() -> Image {
    let layer = b"not a tarball: a pull stores blobs, it does not read them".to_vec();
    let config = format!(
        r#"{{"architecture":"amd64","os":"linux","config":{{"Env":["A=1"]}},
            "rootfs":{{"type":"layers","diff_ids":["{}"]}}}}"#,
        digest(b"the layer's uncompressed bytes")
    )
    .into_bytes();
    let manifest = format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json",
            "config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{}","size":{}}},
            "layers":[{{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"{}","size":{}}}]}}"#,
        digest(&config),
        config.len(),
        digest(&layer),
        layer.len()
    )
    .into_bytes();
    Image {
        manifest,
        layer: digest(&layer),
        blobs: [(digest(&config), config), (digest(&layer), layer)]
            .into_iter()
            .collect(),
    }
}

fn store() -> (tempfile::TempDir, OwnedFd) {
    let t = tempfile::tempdir().unwrap();
    let fd = rustix::fs::open(
        t.path(),
        rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::RDONLY,
        rustix::fs::Mode::empty(),
    )
    .unwrap();
    (t, fd)
}

const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";

/// A token service behind a Bearer challenge (the login sent to it, the
/// token to the registry), and the layer served by a redirect: pulled,
/// every blob stored under its digest.
#[test]
fn a_bearer_token_is_fetched_with_the_login_and_a_redirected_blob_is_taken() {
    let img = image();
    let manifest = img.manifest.clone();
    let blobs = img.blobs.clone();
    let login = "Basic YW5uOnB3"; // ann:pw
    let srv = Server::start(move |path, auth, port| {
        let challenge = (
            "www-authenticate".to_string(),
            format!(
                "Bearer realm=\"http://127.0.0.1:{port}/token\",service=\"reg\",\
                 scope=\"repository:team/app:pull\""
            ),
        );
        if let Some(q) = path.strip_prefix("/token?") {
            return match (
                auth,
                q.contains("service=reg"),
                q.contains("scope=repository"),
            ) {
                (Some(a), true, true) if a == login => {
                    (200, vec![], br#"{"token":"tok-123"}"#.to_vec())
                }
                _ => (401, vec![], vec![]),
            };
        }
        if let Some(d) = path.strip_prefix("/elsewhere/") {
            return match blobs.get(d) {
                Some(b) => (200, vec![], b.clone()),
                None => (404, vec![], vec![]),
            };
        }
        if auth != Some("Bearer tok-123") {
            return (401, vec![challenge], vec![]);
        }
        if path == "/v2/team/app/manifests/1" {
            return (
                200,
                vec![("content-type".into(), MANIFEST.into())],
                manifest.clone(),
            );
        }
        if let Some(d) = path.strip_prefix("/v2/team/app/blobs/") {
            return (
                307,
                vec![(
                    "location".into(),
                    format!("http://127.0.0.1:{port}/elsewhere/{d}"),
                )],
                vec![],
            );
        }
        (404, vec![], vec![])
    });
    let reference: Reference = format!("docker://127.0.0.1:{}/team/app:1", srv.port)
        .parse()
        .unwrap();
    let (dir, fd) = store();
    let creds = {
        let f = dir.path().join("auth.json");
        std::fs::write(
            &f,
            format!(
                r#"{{"auths":{{"127.0.0.1:{}":{{"auth":"YW5uOnB3"}}}}}}"#,
                srv.port
            ),
        )
        .unwrap();
        let host = format!("127.0.0.1:{}", srv.port);
        let f2 = f.clone();
        registry::credentials(&host, &move |k| {
            (k == "REGISTRY_AUTH_FILE").then(|| f2.clone().into_os_string())
        })
        .unwrap()
    };
    assert!(creds.is_some());
    let access = Access {
        proxy: None,
        proxy_key: None,
        credentials: creds,
    };
    let pulled = registry::pull(&reference, dir.path(), &fd, 1 << 20, &access, &|_| false)
        .unwrap_or_else(|e| panic!("{e}"));
    let Pulled::Read(image) = pulled else {
        panic!("nothing read")
    };
    assert_eq!(image.digest, digest(&img.manifest));
    assert_eq!(image.config.env, Some(vec!["A=1".to_string()]));
    assert_eq!(image.layers.len(), 1);
    assert_eq!(
        std::fs::read(&image.layers[0].blob).unwrap(),
        img.blobs[&img.layer]
    );
    let seen = srv.seen.lock().unwrap().clone();
    // The login went to the token service only; the redirect target got
    // no authorization at all (reqwest drops it on a redirect elsewhere
    // only, so here it is the same host: what matters is that the token,
    // not the login, went to the registry).
    for (path, auth) in &seen {
        if path.starts_with("/v2/") {
            assert_ne!(auth.as_deref(), Some(login), "{path}");
        }
    }
    assert!(
        seen.iter()
            .any(|(p, a)| p.starts_with("/token?") && a.as_deref() == Some(login)),
        "{seen:?}"
    );
    // Had already: nothing but the manifest is asked for.
    let before = srv.seen.lock().unwrap().len();
    let (dir2, fd2) = store();
    let d = digest(&img.manifest);
    let again = registry::pull(&reference, dir2.path(), &fd2, 1 << 20, &access, &|x| x == d)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(again, Pulled::Have(ref x) if *x == d), "{again:?}");
    let asked: Vec<_> = srv.seen.lock().unwrap()[before..]
        .iter()
        .map(|(p, _)| p.clone())
        .collect();
    assert!(asked.iter().all(|p| !p.contains("/blobs/")), "{asked:?}");
}

/// A hostile registry: a manifest that is not the digest pinned, and a
/// layer that is not the digest its manifest names, are refused by name;
/// an answer larger than a manifest may be is cut and refused.
#[test]
fn a_registry_answering_other_content_than_its_digest_is_refused() {
    let img = image();
    let manifest = img.manifest.clone();
    let layer = img.layer.clone();
    let blobs = img.blobs.clone();
    let srv = Server::start(move |path, _, _| {
        if path == "/v2/team/app/manifests/huge" {
            return (
                200,
                vec![("content-type".into(), MANIFEST.into())],
                vec![b' '; 5 << 20],
            );
        }
        if path.starts_with("/v2/team/app/manifests/") {
            return (
                200,
                vec![("content-type".into(), MANIFEST.into())],
                manifest.clone(),
            );
        }
        match path.strip_prefix("/v2/team/app/blobs/") {
            Some(d) if d == layer => (200, vec![], b"something else entirely".to_vec()),
            Some(d) => match blobs.get(d) {
                Some(b) => (200, vec![], b.clone()),
                None => (404, vec![], vec![]),
            },
            None => (404, vec![], vec![]),
        }
    });
    let pull = |r: &str| {
        let reference: Reference = r.parse().unwrap();
        let (dir, fd) = store();
        registry::pull(
            &reference,
            dir.path(),
            &fd,
            1 << 30,
            &Access::default(),
            &|_| false,
        )
        .map(|_| ())
        .map_err(|e| e.to_string())
    };
    let other = format!("sha256:{}", "1".repeat(64));
    let e = pull(&format!("docker://127.0.0.1:{}/team/app@{other}", srv.port)).unwrap_err();
    assert!(e.contains(&format!("not the {other} asked for")), "{e}");
    let e = pull(&format!("docker://127.0.0.1:{}/team/app:1", srv.port)).unwrap_err();
    assert!(
        e.contains(&format!("for {}: not the blob asked for", img.layer)),
        "{e}"
    );
    let e = pull(&format!("docker://127.0.0.1:{}/team/app:huge", srv.port)).unwrap_err();
    assert!(e.contains("larger than"), "{e}");
}
