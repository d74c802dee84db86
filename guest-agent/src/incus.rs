//! A small client for incusd's REST API on its local unix socket: just what the
//! outer agent needs to clone, configure and start the per-instance container.
//!
//! Requests are built by pure functions ([`Request`]) and sent through a
//! [`Transport`] (reqwest over the unix socket in the guest, a recording fake in
//! tests). Guards against: names and operation paths that would change the request
//! path (only `[A-Za-z0-9-]` names and `/1.0/operations/<uuid>` are accepted),
//! unbounded responses (bodies are capped), and a container that would not be
//! isolated: [`check_isolated`] refuses a privileged instance, any device other than
//! a disk (no NIC, no host devices) and an id map that maps guest root into it.
//! Does not authenticate incusd: whoever owns the socket path is trusted (it is
//! root-only in the guest).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hull_protocol::error_chain;
use serde::Deserialize;
use serde_json::{json, Value};

/// incusd's local socket.
pub const DEFAULT_SOCKET: &str = "/var/lib/incus/unix.socket";
/// Largest response body read from incusd.
const MAX_BODY: u64 = 4 << 20;

#[derive(Debug, thiserror::Error)]
pub enum IncusError {
    #[error("cannot reach incusd at {socket}: {message}")]
    Unreachable { socket: PathBuf, message: String },
    #[error("incusd answered {method} {path} with {status}: {message}")]
    Api {
        method: &'static str,
        path: String,
        status: u16,
        message: String,
    },
    #[error("incusd sent a malformed answer to {method} {path}: {message}")]
    Malformed {
        method: &'static str,
        path: String,
        message: String,
    },
    #[error("incus operation {op} ended with {status}: {message}")]
    OperationFailed {
        op: String,
        status: String,
        message: String,
    },
    #[error("incusd was not ready within {secs} s: {last}")]
    NotReady { secs: u64, last: String },
    #[error("refusing to send a request for {what} {value:?}: {why}")]
    BadName {
        what: &'static str,
        value: String,
        why: &'static str,
    },
    #[error("container {name} is not isolated: {why}")]
    NotIsolated { name: String, why: String },
}

/// HTTP methods incusd is called with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    Post,
    Put,
    Patch,
    Delete,
}

impl Method {
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Patch => "PATCH",
            Method::Delete => "DELETE",
        }
    }
}

/// One REST call, before it is sent.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub method: Method,
    /// Absolute path with query, for example `/1.0/instances/hull-run`.
    pub path: String,
    pub body: Option<Value>,
}

/// An HTTP status and body, as the transport got them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawResponse {
    pub status: u16,
    pub body: Vec<u8>,
}

/// Sends a [`Request`] to incusd.
pub trait Transport: Send + Sync {
    fn send(&self, req: &Request) -> Result<RawResponse, IncusError>;
}

/// reqwest (blocking, no TLS) over incusd's unix socket.
#[derive(Debug)]
pub struct UnixTransport {
    socket: PathBuf,
    client: reqwest::blocking::Client,
}

impl UnixTransport {
    pub fn new(socket: &Path, timeout: Duration) -> Result<UnixTransport, IncusError> {
        let client = reqwest::blocking::Client::builder()
            .unix_socket(socket)
            .timeout(timeout)
            .build()
            .map_err(|e| IncusError::Unreachable {
                socket: socket.to_path_buf(),
                message: format!("cannot build the HTTP client: {e}"),
            })?;
        Ok(UnixTransport {
            socket: socket.to_path_buf(),
            client,
        })
    }
}

impl Transport for UnixTransport {
    fn send(&self, req: &Request) -> Result<RawResponse, IncusError> {
        // The host part is ignored over a unix socket; incusd reads only the path.
        let url = format!("http://incus{}", req.path);
        let method = match req.method {
            Method::Get => reqwest::Method::GET,
            Method::Post => reqwest::Method::POST,
            Method::Put => reqwest::Method::PUT,
            Method::Patch => reqwest::Method::PATCH,
            Method::Delete => reqwest::Method::DELETE,
        };
        let mut rb = self.client.request(method, &url);
        if let Some(b) = &req.body {
            rb = rb.json(b);
        }
        let resp = rb.send().map_err(|e| IncusError::Unreachable {
            socket: self.socket.clone(),
            message: error_chain(&e),
        })?;
        let status = resp.status().as_u16();
        let mut body = Vec::new();
        resp.take(MAX_BODY + 1)
            .read_to_end(&mut body)
            .map_err(|e| IncusError::Unreachable {
                socket: self.socket.clone(),
                message: format!(
                    "reading the answer to {} {}: {e}",
                    req.method.as_str(),
                    req.path
                ),
            })?;
        if body.len() as u64 > MAX_BODY {
            return Err(IncusError::Malformed {
                method: req.method.as_str(),
                path: req.path.clone(),
                message: format!("answer larger than {MAX_BODY} bytes"),
            });
        }
        Ok(RawResponse { status, body })
    }
}

/// Instance and device names this client puts into paths and bodies.
pub fn check_name(what: &'static str, s: &str) -> Result<(), IncusError> {
    let bad = |why| IncusError::BadName {
        what,
        value: s.chars().take(80).collect(),
        why,
    };
    if s.is_empty() || s.len() > 63 {
        return Err(bad("must be 1 to 63 bytes"));
    }
    if !s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        || !s.as_bytes()[0].is_ascii_alphabetic()
    {
        return Err(bad(
            "only ASCII letters, digits and '-', starting with a letter",
        ));
    }
    Ok(())
}

/// Config keys and values of an instance update.
pub type Config = BTreeMap<String, String>;
/// Devices by name, each a map of its keys.
pub type Devices = BTreeMap<String, BTreeMap<String, String>>;

/// `GET /internal/ready`: an error until incusd finished starting.
pub fn ready_request() -> Request {
    Request {
        method: Method::Get,
        path: "/internal/ready".into(),
        body: None,
    }
}

/// `GET /1.0/instances/<name>`.
pub fn get_instance_request(name: &str) -> Result<Request, IncusError> {
    check_name("instance", name)?;
    Ok(Request {
        method: Method::Get,
        path: format!("/1.0/instances/{name}"),
        body: None,
    })
}

/// `GET /1.0/instances/<name>/state`.
pub fn get_state_request(name: &str) -> Result<Request, IncusError> {
    check_name("instance", name)?;
    Ok(Request {
        method: Method::Get,
        path: format!("/1.0/instances/{name}/state"),
        body: None,
    })
}

/// `POST /1.0/instances`: a copy of `source` (`name` or `name/snapshot`), with
/// `config` and `devices` applied on top of the source's.
pub fn copy_request(
    name: &str,
    source: &str,
    config: &Config,
    devices: &Devices,
) -> Result<Request, IncusError> {
    check_name("instance", name)?;
    let (src, snap) = match source.split_once('/') {
        Some((s, snap)) => (s, Some(snap)),
        None => (source, None),
    };
    check_name("source instance", src)?;
    if let Some(s) = snap {
        check_name("source snapshot", s)?;
    }
    Ok(Request {
        method: Method::Post,
        path: "/1.0/instances".into(),
        body: Some(json!({
            "name": name,
            "type": "container",
            "source": { "type": "copy", "source": source },
            "config": config,
            "devices": devices,
        })),
    })
}

/// `PATCH /1.0/instances/<name>`: merge `config` keys and replace the named devices.
pub fn patch_request(
    name: &str,
    config: &Config,
    devices: &Devices,
) -> Result<Request, IncusError> {
    check_name("instance", name)?;
    Ok(Request {
        method: Method::Patch,
        path: format!("/1.0/instances/{name}"),
        body: Some(json!({ "config": config, "devices": devices })),
    })
}

/// `PUT /1.0/instances/<name>/state`.
pub fn state_request(
    name: &str,
    action: &str,
    force: bool,
    timeout_s: u64,
) -> Result<Request, IncusError> {
    check_name("instance", name)?;
    Ok(Request {
        method: Method::Put,
        path: format!("/1.0/instances/{name}/state"),
        body: Some(json!({ "action": action, "force": force, "timeout": timeout_s })),
    })
}

/// `GET <operation>/wait?timeout=N`; `op` must be `/1.0/operations/<uuid>`.
pub fn wait_request(op: &str, timeout_s: u64) -> Result<Request, IncusError> {
    let id = op
        .strip_prefix("/1.0/operations/")
        .ok_or(IncusError::BadName {
            what: "operation",
            value: op.chars().take(80).collect(),
            why: "not under /1.0/operations/",
        })?;
    if id.is_empty() || id.len() > 64 || !id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') {
        return Err(IncusError::BadName {
            what: "operation",
            value: op.chars().take(80).collect(),
            why: "not a uuid",
        });
    }
    Ok(Request {
        method: Method::Get,
        path: format!("/1.0/operations/{id}/wait?timeout={timeout_s}"),
        body: None,
    })
}

/// incusd's answer envelope.
#[derive(Debug, Deserialize)]
struct Envelope {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    error: String,
    #[serde(default)]
    operation: String,
    #[serde(default)]
    metadata: Value,
}

/// An instance as `GET /1.0/instances/<name>` describes it (the fields used here).
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Instance {
    pub name: String,
    pub status: String,
    #[serde(default)]
    pub expanded_config: Config,
    #[serde(default)]
    pub expanded_devices: Devices,
}

impl Instance {
    pub fn is_running(&self) -> bool {
        self.status.eq_ignore_ascii_case("running")
    }
}

/// One `volatile.idmap.*` entry.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "PascalCase")]
pub struct IdmapEntry {
    pub isuid: bool,
    pub isgid: bool,
    pub hostid: i64,
    pub nsid: i64,
    pub maprange: i64,
}

/// The guest uid and gid that are root inside the container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContainerRoot {
    pub uid: u32,
    pub gid: u32,
}

/// Check that `inst` is an unprivileged container with disks only, no id map
/// entry reaching guest uid/gid 0, and `uid`/`gid` mapped through unchanged.
/// Returns the guest ids of the container's root.
pub fn check_isolated(inst: &Instance, uid: u32, gid: u32) -> Result<ContainerRoot, IncusError> {
    let no = |why: String| IncusError::NotIsolated {
        name: inst.name.clone(),
        why,
    };
    let cfg = &inst.expanded_config;
    if cfg
        .get("security.privileged")
        .map(|v| v == "true")
        .unwrap_or(false)
    {
        return Err(no("security.privileged is true".into()));
    }
    for (dname, d) in &inst.expanded_devices {
        let ty = d.get("type").map(String::as_str).unwrap_or("");
        if ty != "disk" {
            return Err(no(format!(
                "device {dname} has type {ty:?}; only disks are allowed (no NIC, no host devices)"
            )));
        }
    }
    let map_text = cfg
        .get("volatile.idmap.next")
        .or_else(|| cfg.get("volatile.last_state.idmap"))
        .ok_or_else(|| no("no volatile.idmap.next (not an unprivileged container?)".into()))?;
    let map: Vec<IdmapEntry> = serde_json::from_str(map_text)
        .map_err(|e| no(format!("volatile.idmap.next is not an id map: {e}")))?;
    let mut root_uid = None;
    let mut root_gid = None;
    let (mut uid_through, mut gid_through) = (false, false);
    for e in &map {
        if e.maprange <= 0 || e.hostid < 0 || e.nsid < 0 {
            return Err(no(format!("malformed id map entry {e:?}")));
        }
        if e.hostid == 0 {
            return Err(no("the id map reaches guest uid/gid 0".into()));
        }
        let covers = |id: i64| e.nsid <= id && id < e.nsid + e.maprange;
        let host_of = |id: i64| e.hostid + (id - e.nsid);
        if e.isuid && covers(0) {
            root_uid = Some(host_of(0));
        }
        if e.isgid && covers(0) {
            root_gid = Some(host_of(0));
        }
        if e.isuid && covers(i64::from(uid)) && host_of(i64::from(uid)) == i64::from(uid) {
            uid_through = true;
        }
        if e.isgid && covers(i64::from(gid)) && host_of(i64::from(gid)) == i64::from(gid) {
            gid_through = true;
        }
    }
    if !uid_through || !gid_through {
        return Err(no(format!(
            "uid {uid} / gid {gid} are not mapped through (raw.idmap \"both {uid} {gid}\")"
        )));
    }
    match (root_uid, root_gid) {
        (Some(u), Some(g)) if u > 0 && g > 0 => Ok(ContainerRoot {
            uid: u32::try_from(u).map_err(|_| no("container root uid out of range".into()))?,
            gid: u32::try_from(g).map_err(|_| no("container root gid out of range".into()))?,
        }),
        _ => Err(no("the id map does not map container root".into())),
    }
}

/// incusd, through a transport.
#[derive(Debug)]
pub struct Incus<T> {
    t: T,
}

impl<T: Transport> Incus<T> {
    pub fn new(t: T) -> Incus<T> {
        Incus { t }
    }

    pub fn transport(&self) -> &T {
        &self.t
    }

    /// Send `req`; wait for its operation when incusd answers asynchronously.
    /// Returns the `metadata` of the (final) answer.
    pub fn call(&self, req: &Request, op_timeout_s: u64) -> Result<Value, IncusError> {
        let env = self.envelope(req)?;
        if env.kind == "async" {
            return self.wait(&env.operation, op_timeout_s);
        }
        Ok(env.metadata)
    }

    fn envelope(&self, req: &Request) -> Result<Envelope, IncusError> {
        let raw = self.t.send(req)?;
        let env: Envelope =
            serde_json::from_slice(&raw.body).map_err(|e| IncusError::Malformed {
                method: req.method.as_str(),
                path: req.path.clone(),
                message: format!("HTTP {}: {e}", raw.status),
            })?;
        if env.kind == "error" || !(200..300).contains(&raw.status) {
            return Err(IncusError::Api {
                method: req.method.as_str(),
                path: req.path.clone(),
                status: raw.status,
                message: if env.error.is_empty() {
                    "(no message)".into()
                } else {
                    env.error
                },
            });
        }
        Ok(env)
    }

    /// Wait for an operation and fail unless it succeeded.
    pub fn wait(&self, op: &str, timeout_s: u64) -> Result<Value, IncusError> {
        let req = wait_request(op, timeout_s)?;
        let env = self.envelope(&req)?;
        let status = env
            .metadata
            .get("status")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        if status != "Success" {
            let err = env
                .metadata
                .get("err")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned();
            return Err(IncusError::OperationFailed {
                op: op.to_owned(),
                status: if status.is_empty() {
                    "no status".into()
                } else {
                    status
                },
                message: if err.is_empty() {
                    "(no message)".into()
                } else {
                    err
                },
            });
        }
        Ok(env.metadata)
    }

    /// Poll `GET /internal/ready` (what `incus admin waitready` asks) until incusd
    /// says it is ready: it answers other requests before its storage is up.
    pub fn wait_ready(&self, timeout: Duration) -> Result<(), IncusError> {
        let start = Instant::now();
        let req = ready_request();
        loop {
            let last = match self.call(&req, 0) {
                Ok(_) => return Ok(()),
                Err(e) => e.to_string(),
            };
            if start.elapsed() >= timeout {
                return Err(IncusError::NotReady {
                    secs: timeout.as_secs(),
                    last,
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The instance `name`, or `None` when it does not exist.
    pub fn instance(&self, name: &str) -> Result<Option<Instance>, IncusError> {
        let req = get_instance_request(name)?;
        match self.call(&req, 0) {
            Ok(meta) => serde_json::from_value(meta)
                .map(Some)
                .map_err(|e| IncusError::Malformed {
                    method: "GET",
                    path: req.path.clone(),
                    message: e.to_string(),
                }),
            Err(IncusError::Api { status: 404, .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The init pid of a running instance.
    pub fn init_pid(&self, name: &str) -> Result<u32, IncusError> {
        let req = get_state_request(name)?;
        let meta = self.call(&req, 0)?;
        meta.get("pid")
            .and_then(Value::as_u64)
            .and_then(|p| u32::try_from(p).ok())
            .filter(|p| *p > 1)
            .ok_or_else(|| IncusError::Malformed {
                method: "GET",
                path: req.path.clone(),
                message: "no init pid in the state".into(),
            })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// Records requests and answers from a script of (status, body) pairs.
    struct Fake {
        seen: Mutex<Vec<Request>>,
        answers: Mutex<Vec<(u16, Value)>>,
    }

    impl Fake {
        fn new(answers: Vec<(u16, Value)>) -> Fake {
            Fake {
                seen: Mutex::new(Vec::new()),
                answers: Mutex::new(answers.into_iter().rev().collect()),
            }
        }
    }

    impl Transport for Fake {
        fn send(&self, req: &Request) -> Result<RawResponse, IncusError> {
            self.seen.lock().unwrap().push(req.clone());
            let (status, body) = self
                .answers
                .lock()
                .unwrap()
                .pop()
                .expect("unexpected request");
            Ok(RawResponse {
                status,
                body: serde_json::to_vec(&body).unwrap(),
            })
        }
    }

    fn sync(meta: Value) -> (u16, Value) {
        (
            200,
            json!({"type": "sync", "status": "Success", "status_code": 200, "metadata": meta}),
        )
    }

    const OP: &str = "/1.0/operations/6916c8a6-9b7d-4abd-90b3-aedfec7ec7da";

    #[test]
    fn copy_request_names_source_config_and_devices() {
        let mut cfg = Config::new();
        cfg.insert("limits.memory".into(), "536870912B".into());
        let mut devs = Devices::new();
        devs.insert(
            "hull-share-project".into(),
            [
                ("type", "disk"),
                ("source", "/mnt/hull/project"),
                ("path", "/home/u/p"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
        );
        let r = copy_request("hull-1", "hull-base/ready", &cfg, &devs).unwrap();
        assert_eq!(r.method, Method::Post);
        assert_eq!(r.path, "/1.0/instances");
        let b = r.body.unwrap();
        assert_eq!(
            b["source"],
            json!({"type": "copy", "source": "hull-base/ready"})
        );
        assert_eq!(b["config"]["limits.memory"], "536870912B");
        assert_eq!(
            b["devices"]["hull-share-project"]["source"],
            "/mnt/hull/project"
        );
        assert_eq!(b["type"], "container");
    }

    #[test]
    fn names_and_operations_cannot_change_the_path() {
        for bad in ["", "a/b", "../x", "a?b", "a b", "1abc", &"a".repeat(64)] {
            assert!(get_instance_request(bad).is_err(), "{bad:?}");
        }
        assert!(copy_request("ok", "base/../x", &Config::new(), &Devices::new()).is_err());
        assert!(wait_request("/1.0/instances/x", 1).is_err());
        assert!(wait_request("/1.0/operations/../../1.0/instances", 1).is_err());
        assert_eq!(
            wait_request(OP, 30).unwrap().path,
            format!("{OP}/wait?timeout=30")
        );
        assert_eq!(
            state_request("hull-run", "start", false, 60)
                .unwrap()
                .body
                .unwrap(),
            json!({"action": "start", "force": false, "timeout": 60})
        );
    }

    #[test]
    fn async_calls_wait_for_their_operation() {
        let fake = Fake::new(vec![
            (
                202,
                json!({"type": "async", "status": "Operation created", "status_code": 100, "operation": OP, "metadata": {}}),
            ),
            sync(json!({"status": "Success", "err": ""})),
        ]);
        let incus = Incus::new(fake);
        incus
            .call(&state_request("c", "start", false, 30).unwrap(), 30)
            .unwrap();
        let seen = incus.transport().seen.lock().unwrap();
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[1].path, format!("{OP}/wait?timeout=30"));
    }

    #[test]
    fn wait_ready_polls_until_incusd_is_ready() {
        let fake = Fake::new(vec![
            (
                503,
                json!({"type": "error", "error": "Daemon not ready yet", "error_code": 503}),
            ),
            (
                503,
                json!({"type": "error", "error": "Daemon not ready yet", "error_code": 503}),
            ),
            sync(json!({})),
        ]);
        let incus = Incus::new(fake);
        incus.wait_ready(Duration::from_secs(30)).unwrap();
        let seen = incus.transport().seen.lock().unwrap();
        assert_eq!(seen.len(), 3);
        assert!(seen.iter().all(|r| r.path == "/internal/ready"));
        drop(seen);
        let fake = Fake::new(vec![
            (
                503,
                json!({"type": "error", "error": "Daemon not ready yet"})
            );
            2
        ]);
        let e = Incus::new(fake).wait_ready(Duration::ZERO).unwrap_err();
        assert!(e.to_string().contains("Daemon not ready yet"), "{e}");
    }

    #[test]
    fn failures_carry_incus_messages() {
        let fake = Fake::new(vec![
            (
                202,
                json!({"type": "async", "operation": OP, "metadata": {}}),
            ),
            sync(json!({"status": "Failure", "err": "Failed to run: newuidmap"})),
            (
                404,
                json!({"type": "error", "error": "Instance not found", "error_code": 404}),
            ),
            (
                500,
                json!({"type": "error", "error": "boom", "error_code": 500}),
            ),
            (200, json!("not an envelope")),
        ]);
        let incus = Incus::new(fake);
        let e = incus
            .call(&state_request("c", "start", false, 30).unwrap(), 30)
            .unwrap_err();
        assert!(e.to_string().contains("newuidmap"), "{e}");
        assert_eq!(incus.instance("missing").unwrap(), None);
        let e = incus.instance("broken").unwrap_err();
        assert!(e.to_string().contains("500: boom"), "{e}");
        assert!(matches!(
            incus.instance("x"),
            Err(IncusError::Malformed { .. })
        ));
    }

    fn inst(cfg: &[(&str, &str)], devs: &[(&str, &str)]) -> Instance {
        Instance {
            name: "c".into(),
            status: "Stopped".into(),
            expanded_config: cfg
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            expanded_devices: devs
                .iter()
                .map(|(n, t)| {
                    (
                        n.to_string(),
                        [("type".to_string(), t.to_string())].into_iter().collect(),
                    )
                })
                .collect(),
        }
    }

    const MAP: &str = r#"[{"Isuid":true,"Isgid":false,"Hostid":1000000,"Nsid":0,"Maprange":1000},{"Isuid":true,"Isgid":false,"Hostid":1000,"Nsid":1000,"Maprange":1},{"Isuid":true,"Isgid":false,"Hostid":1001001,"Nsid":1001,"Maprange":999998999},{"Isuid":false,"Isgid":true,"Hostid":1000000,"Nsid":0,"Maprange":1000},{"Isuid":false,"Isgid":true,"Hostid":1000,"Nsid":1000,"Maprange":1},{"Isuid":false,"Isgid":true,"Hostid":1001001,"Nsid":1001,"Maprange":999998999}]"#;

    #[test]
    fn isolation_check_accepts_the_prepared_container() {
        let i = inst(&[("volatile.idmap.next", MAP)], &[("root", "disk")]);
        assert_eq!(
            check_isolated(&i, 1000, 1000).unwrap(),
            ContainerRoot {
                uid: 1000000,
                gid: 1000000
            }
        );
    }

    #[test]
    fn isolation_check_refuses_privilege_devices_and_root_maps() {
        let cases = [
            inst(
                &[
                    ("volatile.idmap.next", MAP),
                    ("security.privileged", "true"),
                ],
                &[],
            ),
            inst(&[("volatile.idmap.next", MAP)], &[("eth0", "nic")]),
            inst(&[("volatile.idmap.next", MAP)], &[("kvm", "unix-char")]),
            inst(&[], &[]),
            inst(
                &[(
                    "volatile.idmap.next",
                    r#"[{"Isuid":true,"Isgid":true,"Hostid":0,"Nsid":0,"Maprange":65536}]"#,
                )],
                &[],
            ),
            // uid 1000 not mapped through.
            inst(
                &[(
                    "volatile.idmap.next",
                    r#"[{"Isuid":true,"Isgid":true,"Hostid":1000000,"Nsid":0,"Maprange":65536}]"#,
                )],
                &[],
            ),
            inst(&[("volatile.idmap.next", "garbage")], &[]),
        ];
        for (n, i) in cases.iter().enumerate() {
            assert!(
                matches!(
                    check_isolated(i, 1000, 1000),
                    Err(IncusError::NotIsolated { .. })
                ),
                "case {n}"
            );
        }
    }
}
