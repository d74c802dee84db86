#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]
// The escape matrix and the end-to-end tests drive the Linux tiers (bubblewrap,
// Landlock, tier 3 on QEMU): off Linux this crate is empty, and type-checks.
#![cfg(target_os = "linux")]
// Test code: a failed expectation is a failed test.
//! `hull serve` end to end, with the real `hull` and curl as the client:
//! sessions that run commands and read and write files with the
//! boundary of a run, streamed and collected output, and requests refused
//! with a clear 4xx that change nothing. Every answer's status is checked
//! against `docs/openapi.json` for its operation.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hull_tests::{require_tier, show, World};

/// A `hull serve` of the world's, stopped (SIGTERM) when dropped.
struct Server {
    child: Child,
    socket: PathBuf,
}

impl Server {
    fn start(w: &World) -> Server {
        let socket = w.root.path().join("serve").join("s.sock");
        let mut c = w.hull();
        c.args(["serve", "--socket"])
            .arg(&socket)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        Server::wait(c.spawn().expect("spawn hull serve"), socket)
    }

    /// A `hull serve` run by the user nobody, in `w`.
    fn start_as_nobody(w: &hull_tests::nobody::AsNobody) -> Server {
        let socket = w.u.join("serve").join("s.sock");
        let child = w
            .command(&["serve", "--socket", socket.to_str().unwrap()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Server::wait(child, socket)
    }

    fn wait(child: Child, socket: PathBuf) -> Server {
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            assert!(Instant::now() < deadline, "hull serve did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
        Server { child, socket }
    }

    /// `METHOD path` with `body` (JSON text, or a file's bytes with
    /// `@FILE`), as curl sends it; the status and the body. The status is
    /// one `docs/openapi.json` lists for the operation.
    fn call(&self, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
        self.call_as(None, method, path, body)
    }

    fn call_as(
        &self,
        user: Option<&str>,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> (u16, String) {
        let mut c = match user {
            Some(u) => {
                let mut c = Command::new("setpriv");
                c.args([
                    &format!("--reuid={u}"),
                    "--regid=nogroup",
                    "--clear-groups",
                    "--",
                    "curl",
                ]);
                c
            }
            None => Command::new("curl"),
        };
        c.args(["-sS", "--max-time", "120", "-X", method, "--unix-socket"])
            .arg(&self.socket)
            .args(["-w", "\n%{http_code}"]);
        if let Some(b) = body {
            c.args(["--data-binary", b]);
        }
        let o = c
            .arg(format!("http://hull{path}"))
            .stdin(Stdio::null())
            .output()
            .expect("curl");
        assert!(o.status.success(), "{}", show(&o));
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap();
        let code: u16 = code.parse().unwrap();
        documented(method, path, code);
        (code, body.to_string())
    }
}

impl Server {
    /// `GET path`, its body as bytes (into `scratch/got` first).
    fn get_bytes(&self, path: &str, scratch: &Path) -> (u16, Vec<u8>) {
        let out = scratch.join("got");
        let o = Command::new("curl")
            .args(["-sS", "--max-time", "120", "--unix-socket"])
            .arg(&self.socket)
            .args(["-w", "%{http_code}", "-o"])
            .arg(&out)
            .arg(format!("http://hull{path}"))
            .stdin(Stdio::null())
            .output()
            .expect("curl");
        assert!(o.status.success(), "{}", show(&o));
        let code: u16 = String::from_utf8_lossy(&o.stdout).parse().unwrap();
        documented("GET", path, code);
        (code, std::fs::read(&out).unwrap_or_default())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(90);
        while self.child.try_wait().ok().flatten().is_none() {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `status` is among the responses `docs/openapi.json` lists for the
/// operation `method path` (a 404 or 405 for a path it does not name).
fn documented(method: &str, path: &str, status: u16) {
    let doc: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/openapi.json"))
            .unwrap(),
    )
    .unwrap();
    let path = path.split('?').next().unwrap();
    let parts: Vec<&str> = path.split('/').collect();
    let op = doc["paths"].as_object().unwrap().iter().find(|(p, _)| {
        let q: Vec<&str> = p.split('/').collect();
        q.len() == parts.len()
            && q.iter()
                .zip(&parts)
                .all(|(a, b)| a.starts_with('{') || a == b)
    });
    let Some((_, ops)) = op else {
        assert_eq!(status, 404, "{method} {path}: not documented");
        return;
    };
    let Some(op) = ops.get(method.to_lowercase()) else {
        assert_eq!(status, 405, "{method} {path}: not documented");
        return;
    };
    assert!(
        op["responses"].get(status.to_string()).is_some(),
        "{method} {path} answered {status}, which docs/openapi.json does not list"
    );
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// Opens a session; its id.
fn open(s: &Server, tier: &str, project: &Path) -> String {
    let (code, body) = s.call(
        "POST",
        "/v1/sessions",
        Some(&format!(
            "{{\"tier\": \"{tier}\", \"project\": \"{}\"}}",
            project.display()
        )),
    );
    assert_eq!(code, 201, "{body}");
    json(&body)["id"].as_str().unwrap().to_string()
}

/// The process tiers run every command as the session's own user: an
/// exec naming a user is refused, naming the tier, and runs nothing; so
/// is `hull run --user`.
#[test]
fn a_native_session_refuses_another_user() {
    require_tier("bwrap");
    let w = World::new();
    let s = Server::start(&w);
    let id = open(&s, "bwrap", &w.project);
    let body = r#"{"argv": ["touch", "ran"], "user": "root"}"#;
    let (code, text) = s.call("POST", &format!("/v1/sessions/{id}/exec"), Some(body));
    assert_eq!(code, 400, "{text}");
    assert!(
        text.contains("tier bwrap runs every command as the session's own user"),
        "{text}"
    );
    assert!(!w.project.join("ran").exists());
    let (code, text) = s.call(
        "POST",
        &format!("/v1/sessions/{id}/exec"),
        Some(r#"{"argv": ["touch", "ran"]}"#),
    );
    assert_eq!(code, 200, "control: {text}");
    assert!(w.project.join("ran").exists(), "control");
    for tier in ["bwrap", "landlock"] {
        let o = w
            .hull()
            .args(["run", "--tier", tier, "--user", "root", "--project"])
            .arg(&w.project)
            .args(["--", "touch", "ran-as-root"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success() && err.contains(&format!("tier {tier}: --user root is refused")),
            "{err}"
        );
        assert!(!w.project.join("ran-as-root").exists());
    }
}

/// One session on `tier`: commands run with their exit codes, output,
/// cwd, env, stdin and timeout; output streams as it comes; files are
/// written and read through the sandbox (a write the sandbox refuses, to
/// `.git`, is a 403 and the file is unchanged); closed, it is gone.
fn a_session_runs_commands_and_its_files(tier: &str) {
    require_tier(tier);
    let w = World::new();
    w.git_init();
    std::fs::create_dir(w.project.join("sub")).unwrap();
    let s = Server::start(&w);
    let id = open(&s, tier, &w.project);
    let exec = |body: &str| s.call("POST", &format!("/v1/sessions/{id}/exec"), Some(body));
    let (code, body) = exec(
        r#"{"argv": ["sh", "-c", "pwd; echo $K; cat; echo oops >&2; exit 3"],
            "cwd": "sub", "env": {"K": "v"}, "stdin": "from stdin\n"}"#,
    );
    assert_eq!(code, 200, "{body}");
    let r = json(&body);
    assert_eq!(r["status"], "exit", "{r}");
    assert_eq!(r["exit_code"], 3, "{r}");
    assert_eq!(
        r["stdout"],
        format!("{}/sub\nv\nfrom stdin\n", w.project.display()),
        "{r}"
    );
    assert_eq!(r["stderr"], "oops\n", "{r}");
    let (_, body) = exec(r#"{"argv": ["sleep", "30"], "timeout": "1s"}"#);
    assert_eq!(json(&body)["status"], "timeout", "{body}");
    let (_, body) = exec(r#"{"argv": ["head", "-c", "5000", "/dev/zero"], "max_output": 100}"#);
    let r = json(&body);
    assert_eq!(r["truncated"], true, "{r}");
    assert_eq!(r["stdout_bytes"], 5000, "{r}");
    assert_eq!(r["stdout"].as_str().unwrap().len(), 100, "{r}");
    // Streamed: one line per piece, the exit last.
    let (code, body) = exec(r#"{"argv": ["sh", "-c", "echo a; echo b >&2"], "stream": true}"#);
    assert_eq!(code, 200);
    let events: Vec<serde_json::Value> = body.lines().map(json).collect();
    let last = events.last().unwrap();
    assert_eq!(last["event"], "exit", "{body}");
    assert_eq!(last["exit_code"], 0, "{body}");
    assert!(
        events
            .iter()
            .any(|e| e["event"] == "stdout" && e["data"] == "YQo="),
        "{body}"
    );
    assert!(events.iter().any(|e| e["event"] == "stderr"), "{body}");
    // Files, through the sandbox.
    let file = w.root.path().join("content.bin");
    std::fs::write(&file, b"\x00bytes\xff\n").unwrap();
    let (code, body) = s.call(
        "PUT",
        &format!("/v1/sessions/{id}/files?path=new/dir/f.bin"),
        Some(&format!("@{}", file.display())),
    );
    assert_eq!(code, 204, "{body}");
    assert_eq!(
        std::fs::read(w.project.join("new/dir/f.bin")).unwrap(),
        b"\x00bytes\xff\n"
    );
    let got = s.get_bytes(
        &format!("/v1/sessions/{id}/files?path=new%2Fdir%2Ff.bin"),
        w.root.path(),
    );
    assert_eq!(got, (200, b"\x00bytes\xff\n".to_vec()));
    let (code, _) = s.call(
        "GET",
        &format!("/v1/sessions/{id}/files?path=new/dir/f.bin&max_bytes=3"),
        None,
    );
    assert_eq!(code, 413);
    let (code, _) = s.call("GET", &format!("/v1/sessions/{id}/files?path=nope"), None);
    assert_eq!(code, 404);
    let config = std::fs::read(w.project.join(".git/config")).unwrap();
    std::fs::write(&file, "[core]\n\thooksPath = /tmp\n").unwrap();
    let (code, body) = s.call(
        "PUT",
        &format!("/v1/sessions/{id}/files?path=.git/config"),
        Some(&format!("@{}", file.display())),
    );
    assert_eq!(code, 403, "{body}");
    assert_eq!(
        std::fs::read(w.project.join(".git/config")).unwrap(),
        config
    );
    let (code, _) = s.call("GET", &format!("/v1/sessions/{id}"), None);
    assert_eq!(code, 200);
    let (code, _) = s.call("DELETE", &format!("/v1/sessions/{id}"), None);
    assert_eq!(code, 204);
    let (code, _) = s.call("GET", &format!("/v1/sessions/{id}"), None);
    assert_eq!(code, 404);
}

#[cfg(feature = "bwrap")]
#[test]
fn bwrap_a_session_runs_commands_and_its_files() {
    a_session_runs_commands_and_its_files("bwrap");
}

/// A bwrap session of a container image: its one sandbox has the image
/// as `/` for every exec (the image's `os-release`, read through the
/// files API too), its own `/tmp` kept between execs, the project bound
/// on top and written through; the image is read-only. The same session
/// without the image sees the host's.
#[cfg(feature = "bwrap")]
#[test]
fn bwrap_a_session_of_a_container_image_has_it_as_its_root() {
    require_tier("bwrap");
    let w = World::new();
    let dir = w.root.path();
    let make = hull_tests::make_image;
    let layer = dir.join("bb.layer.tar");
    make(&["busybox-layer", layer.to_str().unwrap(), "session-image"]);
    let archive = dir.join("bb.oci.tar");
    make(&[
        "oci-archive",
        archive.to_str().unwrap(),
        layer.to_str().unwrap(),
    ]);
    let image = format!("oci-archive:{}", archive.display());
    let s = Server::start(&w);
    let (code, body) = s.call(
        "POST",
        "/v1/sessions",
        Some(
            &serde_json::json!({"tier": "bwrap", "project": w.project, "image": image}).to_string(),
        ),
    );
    assert_eq!(code, 201, "{body}");
    assert_eq!(json(&body)["image"], image.as_str(), "{body}");
    let id = json(&body)["id"].as_str().unwrap().to_string();
    let exec = |script: &str| {
        let (code, body) = s.call(
            "POST",
            &format!("/v1/sessions/{id}/exec"),
            Some(&serde_json::json!({"argv": ["sh", "-c", script]}).to_string()),
        );
        assert_eq!(code, 200, "{body}");
        json(&body)["stdout"].as_str().unwrap().to_string()
    };
    assert_eq!(
        exec("cat /etc/os-release; echo kept > /tmp/t; echo mine > in-project"),
        "ID=session-image\n"
    );
    assert_eq!(
        exec("cat /tmp/t; touch /usr/share/x 2>/dev/null || echo read-only"),
        "kept\nread-only\n"
    );
    assert_eq!(
        std::fs::read_to_string(w.project.join("in-project")).unwrap(),
        "mine\n"
    );
    let got = s.get_bytes(
        &format!("/v1/sessions/{id}/files?path=%2Fetc%2Fos-release"),
        w.root.path(),
    );
    assert_eq!(got, (200, b"ID=session-image\n".to_vec()));
    let (code, _) = s.call("DELETE", &format!("/v1/sessions/{id}"), None);
    assert_eq!(code, 204);
    // The control: the same session without the image, the host's.
    let id2 = open(&s, "bwrap", &w.project);
    let (code, body) = s.call(
        "POST",
        &format!("/v1/sessions/{id2}/exec"),
        Some(r#"{"argv": ["cat", "/etc/os-release"]}"#),
    );
    assert_eq!(code, 200, "{body}");
    assert!(!body.contains("session-image"), "{body}");
}

#[cfg(feature = "landlock")]
#[test]
fn landlock_a_session_runs_commands_and_its_files() {
    a_session_runs_commands_and_its_files("landlock");
}

/// Host processes that are `sleep <mark>`.
fn sleeping(mark: &str) -> usize {
    let want = format!("sleep\0{mark}\0");
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.parse::<u32>().is_ok())
        })
        .filter(|e| std::fs::read(e.path().join("cmdline")).is_ok_and(|c| c == want.as_bytes()))
        .count()
}

/// Starts an exec in session `id` that leaves a `setsid` survivor
/// (`sleep <mark>`) and sleeps on itself (`sleep <mark>` too), by curl in
/// the background (`max_time` seconds at most); returns once both run.
fn start_tree(s: &Server, id: &str, mark: &str, max_time: u32) -> Child {
    let body = format!(
        r#"{{"argv": ["sh", "-c", "setsid sleep {mark} </dev/null >/dev/null 2>&1 & sleep {mark}"]}}"#
    );
    let curl = Command::new("curl")
        .args(["-sS", "--max-time", &max_time.to_string(), "--unix-socket"])
        .arg(&s.socket)
        .args(["--data-binary", &body])
        .arg(format!("http://hull/v1/sessions/{id}/exec"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("curl");
    let deadline = Instant::now() + Duration::from_secs(60);
    while sleeping(mark) < 2 {
        assert!(Instant::now() < deadline, "the exec's tree did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    curl
}

/// An exec ends with its whole tree (a `setsid` survivor included) when
/// its client goes away, when its session is closed (the DELETE answers
/// once the tree is gone), and when `hull serve` stops (before it exits).
/// (Against the code before, on landlock, the tree ran on in all three.)
fn an_exec_ends_with_its_tree(tier: &str) {
    require_tier(tier);
    let w = World::new();
    let s = Server::start(&w);
    let id = open(&s, tier, &w.project);
    let mark = |n: u32| format!("{}{n}.5", std::process::id() % 10000 + 10000);

    // The client goes away.
    let m = mark(1);
    let mut curl = start_tree(&s, &id, &m, 3);
    curl.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while sleeping(&m) > 0 {
        assert!(
            Instant::now() < deadline,
            "{tier}: the exec's tree outlived its client by 30 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // The session is closed.
    let m = mark(2);
    let mut curl = start_tree(&s, &id, &m, 120);
    let (code, body) = s.call("DELETE", &format!("/v1/sessions/{id}"), None);
    assert_eq!(code, 204, "{body}");
    assert_eq!(
        sleeping(&m),
        0,
        "{tier}: the DELETE answered before the tree was gone"
    );
    curl.wait().unwrap();

    // The server stops.
    let id = open(&s, tier, &w.project);
    let m = mark(3);
    let mut curl = start_tree(&s, &id, &m, 120);
    drop(s);
    assert_eq!(
        sleeping(&m),
        0,
        "{tier}: hull serve exited before the tree was gone"
    );
    curl.wait().unwrap();
}

#[cfg(feature = "bwrap")]
#[test]
fn bwrap_an_exec_ends_with_its_tree() {
    an_exec_ends_with_its_tree("bwrap");
}

#[cfg(feature = "landlock")]
#[test]
fn landlock_an_exec_ends_with_its_tree() {
    an_exec_ends_with_its_tree("landlock");
}

/// A session on `tier` is one sandbox for its life: a process an exec left
/// running is still there at the next exec, which sees it in the same pid
/// namespace and the file it wrote to its `TMPDIR`; a timed-out exec's
/// tree ends with it while the leftover lives on; closing the session ends
/// the leftover (the DELETE answers once it is gone). Under the code
/// before, where every exec was a `hull run` of its own, the leftover died
/// with the first exec.
fn a_session_is_one_living_sandbox(tier: &str) {
    require_tier(tier);
    let w = World::new();
    let bare = w.root.path().join("bare");
    std::fs::create_dir(&bare).unwrap();
    w.git_init();
    let s = Server::start(&w);
    let id = open(&s, tier, &w.project);
    let exec = |body: &str| {
        let (code, body) = s.call("POST", &format!("/v1/sessions/{id}/exec"), Some(body));
        assert_eq!(code, 200, "{body}");
        json(&body)
    };
    let mark = |n: u32| format!("{}{n}.25", std::process::id() % 10000 + 20000);
    let (kept, timed) = (mark(1), mark(2));
    let r = exec(&format!(
        r#"{{"argv": ["sh", "-c", "sleep {kept} </dev/null >/dev/null 2>&1 & echo $! > \"$TMPDIR/pid\"; echo note > \"$TMPDIR/note\""]}}"#
    ));
    assert_eq!(r["exit_code"], 0, "{r}");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        sleeping(&kept),
        1,
        "{tier}: the exec's leftover did not outlive it"
    );
    let r = exec(&format!(
        r#"{{"argv": ["sh", "-c", "setsid sleep {timed} </dev/null >/dev/null 2>&1 & sleep {timed}"], "timeout": "1s"}}"#
    ));
    assert_eq!(r["status"], "timeout", "{r}");
    assert_eq!(
        sleeping(&timed),
        0,
        "{tier}: the timed-out exec's tree outlived it"
    );
    assert_eq!(
        sleeping(&kept),
        1,
        "{tier}: the timeout ended another exec's leftover"
    );
    // The next exec is in the same sandbox: it reads the note and can
    // signal the leftover by the pid the first one saw.
    let r = exec(
        r#"{"argv": ["sh", "-c", "cat \"$TMPDIR/note\" && kill -0 \"$(cat \"$TMPDIR/pid\")\" && echo alive"]}"#,
    );
    assert_eq!(r["stdout"], "note\nalive\n", "{r}");
    // /tmp and /var/tmp are the session's own, kept between its execs;
    // the host's get nothing (on landlock, when hull is root: as a user
    // a landlock session's /tmp is still the host's).
    let name = format!("hull-session-{kept}");
    let r = exec(&format!(
        r#"{{"argv": ["sh", "-c", "echo a > /tmp/{name} && echo b > /var/tmp/{name}"]}}"#
    ));
    let r2 = exec(&format!(
        r#"{{"argv": ["cat", "/tmp/{name}", "/var/tmp/{name}"]}}"#
    ));
    assert_eq!(r["exit_code"], 0, "{tier}: {r}");
    assert_eq!(r2["stdout"], "a\nb\n", "{tier}: {r2}");
    // What lies below the session's /tmp keeps its protection (the
    // project and the run's dirs are in the host's /tmp): .git and the
    // spill stay read-only, the project writable.
    assert!(
        w.project.starts_with("/tmp"),
        "the world is in the host's /tmp"
    );
    let config = std::fs::read(w.project.join(".git/config")).unwrap();
    for (what, script) in [
        (".git/config", "echo x >> .git/config"),
        ("the spill", r#"echo x > \"$HULL_SPILL/f\""#),
        (".git/hooks", "echo x > .git/hooks/pre-commit"),
    ] {
        let r = exec(&format!(r#"{{"argv": ["sh", "-c", "{script}"]}}"#));
        assert_ne!(r["exit_code"], 0, "{tier}: {what} was written: {r}");
    }
    assert_eq!(
        std::fs::read(w.project.join(".git/config")).unwrap(),
        config
    );
    assert!(!w.project.join(".git/hooks/pre-commit").exists());
    let r = exec(r#"{"argv": ["sh", "-c", "echo ok > written"]}"#);
    assert_eq!(r["exit_code"], 0, "{tier}: {r}");
    assert_eq!(
        std::fs::read_to_string(w.project.join("written")).unwrap(),
        "ok\n"
    );
    // A project with no .git yet: the session cannot make one (its hooks
    // would run on the host's next git command there).
    let other = open(&s, tier, &bare);
    let (code, body) = s.call(
        "POST",
        &format!("/v1/sessions/{other}/exec"),
        Some(
            r#"{"argv": ["sh", "-c", "mkdir -p .git/hooks && echo x > .git/hooks/post-checkout"]}"#,
        ),
    );
    assert_eq!(code, 200, "{body}");
    assert_ne!(
        json(&body)["exit_code"],
        0,
        "{tier}: a .git was made: {body}"
    );
    let (code, _) = s.call("DELETE", &format!("/v1/sessions/{other}"), None);
    assert_eq!(code, 204);
    assert!(
        !bare.join(".git").exists(),
        "{tier}: a .git is left in the project"
    );
    for dir in ["/tmp", "/var/tmp"] {
        assert!(
            !Path::new(dir).join(&name).exists(),
            "{tier}: {dir}/{name} on the host"
        );
    }
    let (code, body) = s.call("DELETE", &format!("/v1/sessions/{id}"), None);
    assert_eq!(code, 204, "{body}");
    assert_eq!(
        sleeping(&kept),
        0,
        "{tier}: the leftover outlived its session's DELETE"
    );
    let (code, _) = s.call(
        "POST",
        &format!("/v1/sessions/{id}/exec"),
        Some(r#"{"argv": ["true"]}"#),
    );
    assert_eq!(code, 404);
}

#[cfg(feature = "bwrap")]
#[test]
fn bwrap_a_session_is_one_living_sandbox() {
    a_session_is_one_living_sandbox("bwrap");
}

#[cfg(feature = "landlock")]
#[test]
fn landlock_a_session_is_one_living_sandbox() {
    a_session_is_one_living_sandbox("landlock");
}

/// A stand-in for hull's agent, as a command that took the session's
/// sandbox over would be: it says hello, then answers each exec as the
/// project's `mode` file says: `flood` (48 MiB of stdout in 1 MiB frames,
/// then exit 0) or `forge` (a second hello, which an agent may not send).
const FAKE_AGENT: &str = r#"#!/usr/bin/python3
import json, os, struct, sys
out, inp = sys.stdout.buffer, sys.stdin.buffer
def frame(kind, id, payload):
    out.write(b"HULL" + struct.pack("<HHII", kind, 0, id, len(payload)) + payload)
    out.flush()
hello = json.dumps({"version": 1, "min_version": 1, "role": "inner_agent", "software": "fake"}).encode()
frame(1, 0, hello)
mode = open("mode").read().strip()
while True:
    head = inp.read(16)
    if len(head) < 16:
        break
    kind, _, id, n = struct.unpack("<HHII", head[4:])
    inp.read(n)
    if kind != 16:
        continue
    if mode == "forge":
        frame(1, 0, hello)
        continue
    frame(17, id, b'{"pid": 1}')
    for _ in range(48):
        frame(21, id, b"x" * (1 << 20))
    frame(23, id, b'{"code": 0}')
"#;

/// The server's peak resident memory (kB).
fn peak_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// A session's agent is as sandboxed as its commands, so it is not
/// trusted: one that floods output costs the server what the exec keeps
/// (the rest is counted while the agent waits), and one that sends what
/// an agent may not ends its own session with an error naming it, while
/// the server and another session go on.
#[cfg(feature = "bwrap")]
#[test]
fn a_hostile_session_agent_ends_only_its_own_session() {
    require_tier("bwrap");
    let w = World::new();
    let agent = w.root.path().join("fake-agent");
    std::fs::write(&agent, FAKE_AGENT).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let (flood, forge) = (w.root.path().join("flood"), w.root.path().join("forge"));
    for (dir, mode) in [(&flood, "flood"), (&forge, "forge")] {
        std::fs::create_dir(dir).unwrap();
        std::fs::write(dir.join("mode"), mode).unwrap();
    }
    let socket = w.root.path().join("serve").join("s.sock");
    let mut c = w.hull();
    c.args(["serve", "--socket"])
        .arg(&socket)
        .env("HULL_AGENT", &agent)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let s = Server::wait(c.spawn().expect("spawn hull serve"), socket);
    let a = open(&s, "bwrap", &flood);
    let b = open(&s, "bwrap", &forge);
    let exec = |id: &str| {
        let (code, body) = s.call(
            "POST",
            &format!("/v1/sessions/{id}/exec"),
            Some(r#"{"argv": ["true"], "max_output": 1000}"#),
        );
        assert_eq!(code, 200, "{body}");
        json(&body)
    };
    let before = peak_kb(s.child.id());
    let r = exec(&a);
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(r["stdout_bytes"], 48u64 << 20, "{r}");
    assert_eq!(r["stdout"].as_str().unwrap().len(), 1000);
    let grew = peak_kb(s.child.id()).saturating_sub(before);
    assert!(
        grew < 40 << 10,
        "the server's peak memory grew {grew} kB for a 48 MiB flood"
    );
    let r = exec(&b);
    assert_eq!(r["status"], "hull_error", "{r}");
    let e = r["error"].as_str().unwrap();
    assert!(e.contains("sent a hello frame"), "{e}");
    let r = exec(&b);
    assert!(r["error"].as_str().unwrap().contains("has ended"), "{r}");
    assert_eq!(exec(&a)["exit_code"], 0);
    let (code, _) = s.call("DELETE", &format!("/v1/sessions/{b}"), None);
    assert_eq!(code, 204);
    let (code, _) = s.call("DELETE", &format!("/v1/sessions/{a}"), None);
    assert_eq!(code, 204);
}

/// Connections of the flood: 19,000, or as many as this process may open
/// (less a margin).
fn flood_size() -> usize {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills the struct we pass.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) }, 0);
    usize::try_from(l.rlim_cur)
        .unwrap_or(usize::MAX)
        .saturating_sub(500)
        .min(19_000)
}

/// Another uid flooding `hull serve` (root, who can reach any user's
/// socket, holding up to 19,000 idle connections) does not starve its
/// owner: the owner's requests are answered at once, the flood's
/// connections beyond its share are closed, and an idle one that sends no
/// request is closed after the header timeout. (Against the code before,
/// every flood connection was held open, idle, for good: a larger flood
/// ran the server out of descriptors.)
#[cfg(feature = "bwrap")]
#[test]
#[ignore = "needs root: runs hull serve as the user nobody"]
fn a_flood_from_another_uid_does_not_starve_the_owner() {
    let w = hull_tests::nobody::AsNobody::new();
    let s = Server::start_as_nobody(&w);
    let mut flood = Vec::new();
    for _ in 0..flood_size() {
        match std::os::unix::net::UnixStream::connect(&s.socket) {
            Ok(c) => flood.push(c),
            Err(e) => panic!("connect {}: {e}", flood.len()),
        }
    }
    let t0 = Instant::now();
    for _ in 0..5 {
        let (code, body) = s.call_as(Some("nobody"), "GET", "/v1/sessions", None);
        assert_eq!(code, 200, "{body}");
    }
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "the owner waited {:?} for five answers",
        t0.elapsed()
    );
    // Every flood connection is closed: at once beyond the share, after
    // the header timeout within it.
    let deadline = Instant::now() + Duration::from_secs(40);
    for c in &flood {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "a flood connection still open after 40 s");
        c.set_read_timeout(Some(left)).unwrap();
        let mut b = [0u8; 1];
        let n = std::io::Read::read(&mut &*c, &mut b);
        assert!(
            matches!(n, Ok(0))
                || n.as_ref()
                    .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
            "{n:?}"
        );
    }
}

/// An exec's environment reaches the command and no command line on the
/// host (`/proc/PID/cmdline` is any local user's to read): it goes to
/// `hull run` through a descriptor. (Against the code before, it was
/// `hull run --env K=V`.)
#[cfg(feature = "bwrap")]
#[test]
fn an_exec_s_environment_shows_on_no_command_line() {
    require_tier("bwrap");
    let w = World::new();
    let s = Server::start(&w);
    let id = open(&s, "bwrap", &w.project);
    let secret = format!("secret-{}", std::process::id());
    let body = format!(
        r#"{{"argv": ["sh", "-c", "echo $TOKEN; sleep 3"], "env": {{"TOKEN": "{secret}"}}}}"#
    );
    let curl = Command::new("curl")
        .args(["-sS", "--max-time", "60", "--unix-socket"])
        .arg(&s.socket)
        .args(["--data-binary", &body])
        .arg(format!("http://hull/v1/sessions/{id}/exec"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("curl");
    let mut seen = 0;
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(2500) {
        // curl's own command line holds the body: not a host process of
        // hull's, so it is skipped by looking for the variable's form.
        if !hull_tests::pids_with(&format!("TOKEN={secret}")).is_empty() {
            seen += 1;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = curl.wait_with_output().unwrap();
    let r = json(&String::from_utf8_lossy(&o.stdout));
    assert_eq!(r["stdout"], format!("{secret}\n"), "{r}");
    assert_eq!(seen, 0, "the value showed on a command line");
}

/// Bad JSON, unknown fields, an oversize body, a path outside the
/// session's roots, a tier that does not exist: each a 4xx naming what is
/// wrong, and nothing is changed on the host.
#[cfg(feature = "bwrap")]
#[test]
fn bad_requests_are_refused_with_a_clear_4xx_and_change_nothing() {
    require_tier("bwrap");
    let w = World::new();
    let s = Server::start(&w);
    let before = std::fs::read_dir(&w.project).unwrap().count();
    let refused = |method: &str, path: &str, body: Option<&str>, want: u16, says: &str| {
        let (code, text) = s.call(method, path, body);
        assert_eq!(code, want, "{method} {path}: {text}");
        let e = json(&text)["error"].as_str().unwrap().to_string();
        assert!(e.contains(says), "{method} {path}: {e}");
    };
    refused("POST", "/v1/sessions", Some("{\"tier\": "), 400, "EOF");
    refused(
        "POST",
        "/v1/sessions",
        Some(r#"{"tier": "bwrap", "project": "/", "colour": 1}"#),
        400,
        "unknown field `colour`",
    );
    refused(
        "POST",
        "/v1/sessions",
        Some(r#"{"tier": "warp", "project": "/"}"#),
        400,
        "no such tier",
    );
    refused(
        "POST",
        "/v1/sessions",
        Some(r#"{"tier": "seatbelt", "project": "/"}"#),
        400,
        "sessions run on landlock, bwrap and vm",
    );
    refused(
        "POST",
        "/v1/sessions",
        Some(r#"{"tier": "bwrap", "project": "relative"}"#),
        400,
        "absolute",
    );
    let id = open(&s, "bwrap", &w.project);
    let exec = format!("/v1/sessions/{id}/exec");
    refused("POST", &exec, Some(r#"{"argv": []}"#), 400, "argv");
    refused(
        "POST",
        &exec,
        Some(r#"{"argv": ["true"], "timeout": "soon"}"#),
        400,
        "timeout",
    );
    // A cwd out of the project is the sandbox's to decide: the world is
    // in the host's /tmp, so beside the project and in /tmp the session's
    // writes land in its own /tmp, and the host's has nothing.
    let escaped = format!("escaped-{}", std::process::id());
    let (code, body) = s.call(
        "POST",
        &exec,
        Some(&format!(
            r#"{{"argv": ["touch", "{escaped}"], "cwd": ".."}}"#
        )),
    );
    assert_eq!(code, 200, "{body}");
    assert_eq!(json(&body)["exit_code"], 0, "{body}");
    assert!(!w.root.path().join(&escaped).exists());
    assert!(
        w.root.path().starts_with("/tmp"),
        "the world is in the host's /tmp"
    );
    let (code, body) = s.call(
        "POST",
        &exec,
        Some(&format!(
            r#"{{"argv": ["sh", "-c", "touch {escaped} && ls /tmp"], "cwd": "../.."}}"#
        )),
    );
    assert_eq!(code, 200, "{body}");
    assert_eq!(json(&body)["exit_code"], 0, "{body}");
    assert!(
        json(&body)["stdout"].as_str().unwrap().contains(&escaped),
        "{body}"
    );
    assert!(!Path::new("/tmp").join(&escaped).exists());
    refused(
        "POST",
        &exec,
        Some(r#"{"argv": ["true"], "stdin": "a", "stdin_base64": "YQ=="}"#),
        400,
        "give one",
    );
    let big = w.root.path().join("big");
    std::fs::write(&big, vec![b'a'; (64 << 20) + 1]).unwrap();
    refused(
        "PUT",
        &format!("/v1/sessions/{id}/files?path=big"),
        Some(&format!("@{}", big.display())),
        413,
        "larger than",
    );
    let victim = w.outside.join("victim");
    std::fs::write(&victim, "v\n").unwrap();
    // Paths are the sandbox's to resolve: a file beside the project is
    // not there for it, nor is the home's key; /etc is granted.
    let beside = format!(
        "/v1/sessions/{id}/files?path=../{}/victim",
        w.outside.file_name().unwrap().to_str().unwrap()
    );
    let (code, body) = s.call("PUT", &beside, Some("overwritten"));
    assert_eq!(code, 204, "{body}");
    assert_eq!(s.call("GET", &beside, None), (200, "overwritten".into()));
    refused(
        "PUT",
        &format!("/v1/sessions/{id}/files?path=/etc/hostname"),
        Some("overwritten"),
        403,
        "the session may not write it",
    );
    let key = w.home.join(".ssh/id_ed25519");
    refused(
        "GET",
        &format!("/v1/sessions/{id}/files?path={}", key.display()),
        None,
        404,
        "No such file",
    );
    let (code, body) = s.call(
        "GET",
        &format!("/v1/sessions/{id}/files?path=/etc/passwd"),
        None,
    );
    assert_eq!(code, 200);
    assert!(body.starts_with("root:"), "{body}");
    refused("GET", "/v1/sessions/0000/exec", None, 405, "not allowed");
    refused("GET", "/v1/nothing", None, 404, "no such resource");
    refused("DELETE", "/v1/sessions/nope", None, 404, "no session nope");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "v\n");
    // The session's placeholders for `.git` and `.hull` live as long as
    // its sandbox.
    let (code, _) = s.call("DELETE", &format!("/v1/sessions/{id}"), None);
    assert_eq!(code, 204);
    assert_eq!(std::fs::read_dir(&w.project).unwrap().count(), before);
    let (code, doc) = s.call("GET", "/v1/openapi.json", None);
    assert_eq!(code, 200);
    assert_eq!(json(&doc)["openapi"], "3.1.0");
}

/// A copy-on-write session: each exec sees the project as it was plus the
/// session's own earlier writes, the project stays untouched, and the
/// session's change set lists them (a shared session has none: 409).
fn a_cow_session_keeps_its_writes_apart(tier: &str) {
    require_tier(tier);
    let w = World::new();
    std::fs::write(w.project.join("a.txt"), "base\n").unwrap();
    let s = Server::start(&w);
    let (code, body) = s.call(
        "POST",
        "/v1/sessions",
        Some(&format!(
            "{{\"tier\": \"{tier}\", \"project\": \"{}\", \"workspace\": \"cow\"}}",
            w.project.display()
        )),
    );
    assert_eq!(code, 201, "{body}");
    let id = json(&body)["id"].as_str().unwrap().to_string();
    // Nothing written yet: on landlock and bwrap the session's one run has
    // its set already, empty; on vm the first exec makes it.
    let (_, none) = s.call("GET", &format!("/v1/sessions/{id}/changes"), None);
    let none = json(&none);
    assert_eq!(none["changes"], serde_json::json!([]), "{none}");
    assert_eq!(none["id"].is_null(), tier == "vm", "{none}");
    let exec = |script: &str| {
        let (code, body) = s.call(
            "POST",
            &format!("/v1/sessions/{id}/exec"),
            Some(&serde_json::json!({"argv": ["sh", "-c", script]}).to_string()),
        );
        assert_eq!(code, 200, "{body}");
        let r = json(&body);
        assert_eq!(r["exit_code"], 0, "{r}");
        r["stdout"].as_str().unwrap().to_string()
    };
    exec("echo more >> a.txt && echo one > one.txt");
    assert_eq!(exec("cat a.txt one.txt"), "base\nmore\none\n");
    let (code, _) = s.call(
        "PUT",
        &format!("/v1/sessions/{id}/files?path=two.txt"),
        Some("two"),
    );
    assert_eq!(code, 204);
    assert_eq!(
        exec("cat two.txt; rm one.txt; ls"),
        "twoa.txt\nsrc\ntwo.txt\n"
    );
    // The project is as it was.
    assert_eq!(
        std::fs::read_to_string(w.project.join("a.txt")).unwrap(),
        "base\n"
    );
    assert!(!w.project.join("two.txt").exists() && !w.project.join("one.txt").exists());
    let (code, body) = s.call("GET", &format!("/v1/sessions/{id}/changes"), None);
    assert_eq!(code, 200, "{body}");
    let v = json(&body);
    let mut got: Vec<(String, String)> = v["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["path"].as_str().unwrap().to_string(),
                c["op"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            ("a.txt".to_string(), "modified".to_string()),
            ("two.txt".to_string(), "added".to_string())
        ],
        "{v:#}"
    );
    let shared = open(&s, tier, &w.project);
    let (code, _) = s.call("GET", &format!("/v1/sessions/{shared}/changes"), None);
    assert_eq!(code, 409);
    if tier == "vm" {
        return;
    }
    // On landlock and bwrap the session is one sandbox: what one exec left
    // running, and wrote to its TMPDIR, is there at the next.
    let pid = exec("sleep 300 >/dev/null 2>&1 & echo $!; echo kept > \"$TMPDIR/mark\"");
    assert_eq!(
        exec(&format!("kill -0 {} && cat \"$TMPDIR/mark\"", pid.trim())),
        "kept\n"
    );
    // Its /tmp is its own (the host's has no such file), and so are its
    // terminals.
    let mark = format!("hull-cow-session-{}", std::process::id());
    exec(&format!("echo own > /tmp/{mark}"));
    assert_eq!(exec(&format!("cat /tmp/{mark}")), "own\n");
    assert!(
        !Path::new("/tmp").join(&mark).exists(),
        "the session wrote the host's /tmp"
    );
    assert!(
        exec("python3 -c 'import os; m, s = os.openpty(); print(os.ttyname(s))'")
            .starts_with("/dev/pts/")
    );
    // Closed, its run ends and records the set, which outlives it.
    let set = v["id"].as_str().unwrap().to_string();
    let (code, text) = s.call("DELETE", &format!("/v1/sessions/{id}"), None);
    assert_eq!(code, 204, "{text}");
    let o = w
        .hull()
        .args(["changes", "show", "--json", &set])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", show(&o));
    let shown: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(shown["counts"]["added"], 1, "{shown:#}");
    assert_eq!(shown["counts"]["modified"], 1, "{shown:#}");
    assert_eq!(
        shown["argv"],
        serde_json::json!(["(a hull serve session)"]),
        "{shown:#}"
    );
}

#[cfg(feature = "bwrap")]
#[test]
fn bwrap_a_cow_session_keeps_its_writes_apart() {
    a_cow_session_keeps_its_writes_apart("bwrap");
}

#[cfg(feature = "landlock")]
#[test]
fn landlock_a_cow_session_keeps_its_writes_apart() {
    a_cow_session_keeps_its_writes_apart("landlock");
}

/// A session's terminals are its own: it opens a pseudo-terminal (the
/// shell tools' need) on a devpts of its own, and a terminal of the host's
/// is not in its view: the bytes it writes to the host terminal's path
/// never reach that terminal. Under tier none the same write lands.
fn a_session_has_terminals_of_its_own(tier: &str) {
    require_tier(tier);
    let w = World::new();
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty writes two descriptors; the rest may be null.
    let r = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(r, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: the descriptors just made, ours alone.
    let (master, slave) = unsafe {
        use std::os::fd::FromRawFd;
        (
            std::fs::File::from_raw_fd(master),
            std::fs::File::from_raw_fd(slave),
        )
    };
    let host_tty = std::fs::read_link(format!("/proc/self/fd/{}", {
        use std::os::fd::AsRawFd;
        slave.as_raw_fd()
    }))
    .unwrap();
    {
        use std::os::fd::AsRawFd;
        // SAFETY: fcntl with integer arguments on our own descriptor.
        let r = unsafe { libc::fcntl(master.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
        assert_eq!(r, 0);
    }
    let arrived = || {
        let mut buf = [0u8; 256];
        let mut got = Vec::new();
        std::thread::sleep(Duration::from_millis(300));
        while let Ok(n) = std::io::Read::read(&mut &master, &mut buf) {
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&got).into_owned()
    };
    let attack = format!("printf pwned > {} 2>/dev/null; true", host_tty.display());
    // The control: without a sandbox the write reaches the host's terminal.
    let control = Command::new("sh").args(["-c", &attack]).status().unwrap();
    assert!(control.success());
    assert!(
        arrived().contains("pwned"),
        "control: nothing reached {}",
        host_tty.display()
    );
    let s = Server::start(&w);
    let id = open(&s, tier, &w.project);
    let exec = |script: &str| {
        let (code, body) = s.call(
            "POST",
            &format!("/v1/sessions/{id}/exec"),
            Some(&serde_json::json!({"argv": ["sh", "-c", script], "timeout": "60s"}).to_string()),
        );
        assert_eq!(code, 200, "{body}");
        json(&body)
    };
    let r = exec(
        "python3 -c 'import os; m, s = os.openpty(); os.write(m, b\"hi\\n\"); \
         print(os.ttyname(s), os.read(s, 3))'",
    );
    assert_eq!(r["exit_code"], 0, "{r}");
    assert!(r["stdout"].as_str().unwrap().contains("/dev/pts/"), "{r}");
    let r = exec(&attack);
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(arrived(), "", "the session wrote to the host's terminal");
}

#[cfg(feature = "bwrap")]
#[test]
fn bwrap_a_session_has_terminals_of_its_own() {
    a_session_has_terminals_of_its_own("bwrap");
}

#[cfg(feature = "landlock")]
#[test]
fn landlock_a_session_has_terminals_of_its_own() {
    a_session_has_terminals_of_its_own("landlock");
}

/// Every file of `dir` (no link followed) with its bytes: what a test
/// compares before and after to see that nothing changed.
fn tree_of(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                stack.push(e.path());
            } else if ft.is_file() {
                out.push((e.path(), std::fs::read(e.path()).unwrap()));
            } else {
                out.push((e.path(), Vec::new()));
            }
        }
    }
    out.sort();
    out
}

/// git as a harness's agent uses it, in a session: identity from the
/// exec's environment.
fn git_exec(s: &Server, id: &str, script: &str) -> serde_json::Value {
    let body = serde_json::json!({
        "argv": ["sh", "-c", script],
        "env": {
            "GIT_AUTHOR_NAME": "agent", "GIT_AUTHOR_EMAIL": "agent@example.invalid",
            "GIT_COMMITTER_NAME": "agent", "GIT_COMMITTER_EMAIL": "agent@example.invalid",
        },
        "timeout": "60s",
    });
    let (code, text) = s.call(
        "POST",
        &format!("/v1/sessions/{id}/exec"),
        Some(&body.to_string()),
    );
    assert_eq!(code, 200, "{text}");
    json(&text)
}

/// A `copy` session works on hull's own copy of the project, where git
/// works (init, add, commit, diff, stash); the project, its `.git`
/// included, is unchanged, and the copy is gone with the session. The
/// same commit in a `cow` session on the project is refused (`.git` stays
/// protected there) and the result's hint names the policy key.
fn a_copy_session_is_a_git_workspace(tier: &str) {
    a_copy_session_is_a_git_workspace_and_cow_is_not(tier, true);
}

/// [`a_copy_session_is_a_git_workspace`]; the `cow` part only when
/// `cow` (on vm each of its execs restores a VM).
fn a_copy_session_is_a_git_workspace_and_cow_is_not(tier: &str, cow: bool) {
    require_tier(tier);
    let w = World::new();
    std::fs::write(w.project.join("a.txt"), "base\n").unwrap();
    w.git_init();
    let git = |args: &[&str]| {
        let o = Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid"])
            .args(args)
            .current_dir(&w.project)
            .output()
            .unwrap();
        assert!(o.status.success(), "{o:?}");
    };
    git(&["add", "a.txt"]);
    git(&["commit", "-q", "-m", "base"]);
    let before = tree_of(&w.project);
    let s = Server::start(&w);
    let create = |workspace: &str, project: Option<&Path>| {
        let mut body = serde_json::json!({"tier": tier, "workspace": workspace});
        if let Some(p) = project {
            body["project"] = p.display().to_string().into();
        }
        let (code, text) = s.call("POST", "/v1/sessions", Some(&body.to_string()));
        assert_eq!(code, 201, "{text}");
        json(&text)
    };
    let info = create("copy", Some(&w.project));
    let id = info["id"].as_str().unwrap().to_string();
    let copy = PathBuf::from(info["project"].as_str().unwrap());
    assert_eq!(info["workspace"], "copy", "{info}");
    assert_eq!(info["source"], w.project.display().to_string(), "{info}");
    assert_ne!(copy, w.project, "{info}");
    let r = git_exec(
        &s,
        &id,
        "set -e; echo more >> a.txt; git add a.txt; git commit -q -m more; \
         git diff --stat HEAD~1 | tail -1; echo wip > b.txt; git stash -q -u; \
         test ! -e b.txt; git stash pop -q >/dev/null; cat b.txt; git log --oneline | wc -l",
    );
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(
        r["stdout"], " 1 file changed, 1 insertion(+)\nwip\n2\n",
        "{r}"
    );
    // The commit landed in the copy, and nothing reached the project.
    assert_eq!(
        std::fs::read_to_string(copy.join("a.txt")).unwrap(),
        "base\nmore\n"
    );
    assert_eq!(tree_of(&w.project), before, "the project changed");
    // A copy of nothing: a fresh repository.
    let empty = create("copy", None);
    let eid = empty["id"].as_str().unwrap().to_string();
    let r = git_exec(
        &s,
        &eid,
        "set -e; ls -A | wc -l; git init -q; echo x > x; git add x; git commit -q -m x; git log --format=%s",
    );
    assert_eq!(
        (r["exit_code"].clone(), r["stdout"].clone()),
        (0.into(), "0\nx\n".into()),
        "{r}"
    );
    // Closed, each copy is gone.
    let ecopy = PathBuf::from(empty["project"].as_str().unwrap());
    assert!(copy.exists() && ecopy.exists());
    for sid in [&id, &eid] {
        let (code, text) = s.call("DELETE", &format!("/v1/sessions/{sid}"), None);
        assert_eq!(code, 204, "{text}");
    }
    assert!(!copy.exists(), "{} is left", copy.display());
    assert!(!ecopy.exists(), "{} is left", ecopy.display());
    if !cow {
        return;
    }
    // On the project itself (cow), `.git` is protected: the commit fails,
    // the hint says which key allows it, and the project is unchanged.
    let cow = create("cow", Some(&w.project));
    let cid = cow["id"].as_str().unwrap().to_string();
    let r = git_exec(
        &s,
        &cid,
        "echo more >> a.txt; git add -A && git commit -q -m more",
    );
    assert_ne!(r["exit_code"], 0, "{r}");
    let hint = r["hint"].as_str().unwrap_or_else(|| panic!("no hint: {r}"));
    assert!(
        hint.contains(&format!("{}/.git is read-only", w.project.display()))
            && hint.contains("fs.git = \"writable\"")
            && hint.contains("workspace \"copy\""),
        "{hint}"
    );
    assert_eq!(tree_of(&w.project), before, "the project changed");
    // An exec that fails for another reason gets no hint.
    let r = git_exec(&s, &cid, "cat /nonexistent");
    assert!(r["exit_code"] != 0 && r.get("hint").is_none(), "{r}");
}

#[cfg(feature = "bwrap")]
#[test]
fn bwrap_a_copy_session_is_a_git_workspace() {
    a_copy_session_is_a_git_workspace("bwrap");
}

#[cfg(feature = "landlock")]
#[test]
fn landlock_a_copy_session_is_a_git_workspace() {
    a_copy_session_is_a_git_workspace("landlock");
}

/// A session is its maker's: with `hull serve` run by the user nobody,
/// root (who can reach nobody's socket) is told nobody's session does not
/// exist, cannot run in it or close it; nobody still can.
#[cfg(feature = "bwrap")]
#[test]
#[ignore = "needs root: runs hull serve as the user nobody"]
fn another_callers_session_does_not_exist_for_them() {
    require_tier("bwrap");
    let w = hull_tests::nobody::AsNobody::new();
    let s = Server::start_as_nobody(&w);
    let (code, body) = s.call_as(
        Some("nobody"),
        "POST",
        "/v1/sessions",
        Some(&format!(
            "{{\"tier\": \"bwrap\", \"project\": \"{}\"}}",
            w.project.display()
        )),
    );
    assert_eq!(code, 201, "{body}");
    let id = json(&body)["id"].as_str().unwrap().to_string();
    for (method, path, body) in [
        ("GET", format!("/v1/sessions/{id}"), None),
        (
            "POST",
            format!("/v1/sessions/{id}/exec"),
            Some(r#"{"argv": ["touch", "by-root"]}"#),
        ),
        ("DELETE", format!("/v1/sessions/{id}"), None),
    ] {
        let (code, text) = s.call(method, &path, body);
        assert_eq!(code, 404, "{method} {path}: {text}");
    }
    let (_, list) = s.call("GET", "/v1/sessions", None);
    assert_eq!(json(&list), serde_json::json!([]));
    assert!(!w.project.join("by-root").exists());
    let (code, body) = s.call_as(
        Some("nobody"),
        "POST",
        &format!("/v1/sessions/{id}/exec"),
        Some(r#"{"argv": ["id", "-un"]}"#),
    );
    assert_eq!(code, 200, "{body}");
    assert_eq!(json(&body)["stdout"], "nobody\n");
}

/// Tier 3: one VM for the session, restored once and kept for every exec
/// (the same boot id twice); closed, its VM is gone. A copy-on-write
/// session restores one for each exec, its writes carried by its set.
#[cfg(feature = "tier3")]
mod vm {
    use super::*;

    /// A vm session of a container image: its execs run the image's
    /// programs (the tests' minbase with `hello`, as an OCI archive), the
    /// session shows its image, and its own policy file is gone with it.
    /// A session of an image on landlock is refused, naming the tier.
    #[test]
    fn a_session_of_a_container_image_runs_the_image_s_programs() {
        require_tier("vm");
        let w = World::new();
        let rootfs = std::env::var_os("HULL_TEST_ROOTFS")
            .map(PathBuf::from)
            .unwrap_or_default();
        assert!(
            rootfs.is_file(),
            "HULL_TEST_ROOTFS names no file: scripts/test.sh makes it"
        );
        let archive = w.root.path().join("image.oci.tar");
        hull_tests::make_image(&[
            "oci-archive",
            archive.to_str().unwrap(),
            rootfs.to_str().unwrap(),
        ]);
        let image = format!("oci-archive:{}", archive.display());
        let s = Server::start(&w);
        let create = |tier: &str| {
            s.call(
                "POST",
                "/v1/sessions",
                Some(
                    &serde_json::json!({"tier": tier, "project": w.project, "image": image})
                        .to_string(),
                ),
            )
        };
        let (code, body) = create("landlock");
        assert_eq!(code, 400, "{body}");
        assert!(
            body.contains("tier landlock") && body.contains("image"),
            "{body}"
        );
        let (code, body) = create("vm");
        assert_eq!(code, 201, "{body}");
        let info = json(&body);
        assert_eq!(info["image"], image.as_str(), "{info}");
        let id = info["id"].as_str().unwrap().to_string();
        let (code, body) = s.call(
            "POST",
            &format!("/v1/sessions/{id}/exec"),
            Some(r#"{"argv": ["sh", "-c", "hello; command -v python3 || echo no python3"]}"#),
        );
        assert_eq!(code, 200, "{body}");
        assert_eq!(
            json(&body)["stdout"],
            "Hello, world!\nno python3\n",
            "{body}"
        );
        // The session's own policy, in the server's work directory.
        let own_policy = || -> Vec<PathBuf> {
            std::fs::read_dir(w.root.path().join("serve"))
                .unwrap()
                .flatten()
                .map(|e| e.path().join(format!("policy-{id}/policy.toml")))
                .filter(|p| p.is_file())
                .collect()
        };
        let policies = own_policy();
        assert_eq!(policies.len(), 1, "{policies:?}");
        let text = std::fs::read_to_string(&policies[0]).unwrap();
        assert!(text.contains(&image), "{text}");
        let (code, _) = s.call("DELETE", &format!("/v1/sessions/{id}"), None);
        assert_eq!(code, 204);
        assert!(own_policy().is_empty(), "the session's policy outlived it");
    }

    /// git in a vm session's copy: the same as on bwrap and landlock.
    #[test]
    fn a_copy_session_is_a_git_workspace() {
        a_copy_session_is_a_git_workspace_and_cow_is_not("vm", false);
    }

    #[test]
    fn a_cow_session_keeps_its_writes_apart() {
        super::a_cow_session_keeps_its_writes_apart("vm");
    }

    /// In a session's kept VM, an exec whose client went away ends with
    /// its tree (a `setsid` survivor included), as a later exec in the same
    /// VM sees; a closed session's VM is gone with everything in it
    /// (`a_session_on_vm_keeps_one_vm_for_its_execs`).
    #[test]
    fn an_exec_ends_with_its_tree_when_its_client_goes() {
        require_tier("vm");
        let w = World::new();
        let s = Server::start(&w);
        let id = open(&s, "vm", &w.project);
        let mark = format!("{}1.5", std::process::id() % 10000 + 10000);
        let count = || -> u32 {
            let script = format!(
                "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done 2>/dev/null \
                 | grep -c '^sleep {mark} $' || true"
            );
            let body = serde_json::json!({"argv": ["sh", "-c", script]}).to_string();
            let (code, body) = s.call("POST", &format!("/v1/sessions/{id}/exec"), Some(&body));
            assert_eq!(code, 200, "{body}");
            let r = json(&body);
            r["stdout"].as_str().unwrap().trim().parse().unwrap()
        };
        let body = format!(
            r#"{{"argv": ["sh", "-c", "setsid sleep {mark} </dev/null >/dev/null 2>&1 & sleep {mark}"]}}"#
        );
        let mut curl = Command::new("curl")
            .args(["-sS", "--max-time", "60", "--unix-socket"])
            .arg(&s.socket)
            .args(["--data-binary", &body])
            .arg(format!("http://hull/v1/sessions/{id}/exec"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("curl");
        let deadline = Instant::now() + Duration::from_secs(60);
        while count() < 2 {
            assert!(Instant::now() < deadline, "the exec's tree did not start");
        }
        let _ = curl.kill();
        curl.wait().unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while count() > 0 {
            assert!(
                Instant::now() < deadline,
                "the exec's tree outlived its client by 60 s in the session's VM"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    #[test]
    fn a_session_on_vm_keeps_one_vm_for_its_execs() {
        require_tier("vm");
        let w = World::new();
        let s = Server::start(&w);
        let id = open(&s, "vm", &w.project);
        let boot = || {
            let (code, body) = s.call(
                "POST",
                &format!("/v1/sessions/{id}/exec"),
                Some(r#"{"argv": ["cat", "/proc/sys/kernel/random/boot_id"]}"#),
            );
            assert_eq!(code, 200, "{body}");
            let r = json(&body);
            assert_eq!(r["exit_code"], 0, "{r}");
            r["stdout"].as_str().unwrap().to_string()
        };
        let first = boot();
        assert_eq!(first, boot(), "the session's execs ran in two VMs");
        let (code, body) = s.call(
            "PUT",
            &format!("/v1/sessions/{id}/files?path=from-api.txt"),
            Some("hello"),
        );
        assert_eq!(code, 204, "{body}");
        assert_eq!(
            std::fs::read_to_string(w.project.join("from-api.txt")).unwrap(),
            "hello"
        );
        let name = format!("session-{}", &id[..12]);
        let kept = |w: &World| -> Option<serde_json::Value> {
            let o = w
                .hull()
                .args(["vm", "status", "--json"])
                .stdin(Stdio::null())
                .output()
                .unwrap();
            let all = json(&String::from_utf8_lossy(&o.stdout));
            all.as_array()
                .unwrap()
                .iter()
                .find(|v| v["name"] == name.as_str() && v["up"] == true)
                .cloned()
        };
        let up = kept(&w).expect("the session's VM is up");
        let pid = up["state"]["pid"].as_i64().expect("its supervisor's pid");
        // The session's execs share its tmp (their HOME), on the host in
        // its VM's directory, until the session is deleted.
        let tmp = PathBuf::from(up["state"]["tmp"].as_str().expect("its tmp"));
        let (code, body) = s.call(
            "POST",
            &format!("/v1/sessions/{id}/exec"),
            Some(r#"{"argv": ["sh", "-c", "echo session-secret > \"$HOME/s.txt\""]}"#),
        );
        assert_eq!(code, 200, "{body}");
        let (code, body) = s.call(
            "POST",
            &format!("/v1/sessions/{id}/exec"),
            Some(r#"{"argv": ["sh", "-c", "cat \"$HOME/s.txt\""]}"#),
        );
        assert_eq!(code, 200, "{body}");
        assert_eq!(json(&body)["stdout"], "session-secret\n", "{body}");
        assert!(tmp.join("s.txt").exists(), "control: {}", tmp.display());
        // One container for the session: what an exec left running is
        // there at the next (the container's own /tmp too); a timed-out
        // exec's tree is gone.
        let exec = |body: &str| {
            let (code, text) = s.call("POST", &format!("/v1/sessions/{id}/exec"), Some(body));
            assert_eq!(code, 200, "{text}");
            json(&text)
        };
        let r = exec(
            r#"{"argv": ["sh", "-c", "sleep 300 </dev/null >/dev/null 2>&1 & echo $! > /tmp/kept.pid"]}"#,
        );
        assert_eq!(r["exit_code"], 0, "{r}");
        let r = exec(
            r#"{"argv": ["sh", "-c", "setsid sleep 301 </dev/null >/dev/null 2>&1 & echo $! > /tmp/timed.pid; sleep 301"], "timeout": "2s"}"#,
        );
        assert_eq!(r["status"], "timeout", "{r}");
        let r = exec(
            r#"{"argv": ["sh", "-c", "kill -0 $(cat /tmp/kept.pid) && echo kept; kill -0 $(cat /tmp/timed.pid) 2>/dev/null || echo timed-gone"]}"#,
        );
        assert_eq!(r["stdout"], "kept\ntimed-gone\n", "{r}");
        let (code, _) = s.call("DELETE", &format!("/v1/sessions/{id}"), None);
        assert_eq!(code, 204);
        assert!(kept(&w).is_none(), "the session's VM is still up");
        assert!(!tmp.exists(), "the session's tmp {} is left", tmp.display());
        // Gone, or a zombie its parent has yet to reap.
        let alive = || {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|st| {
                st.rsplit_once(") ")
                    .is_some_and(|(_, r)| !r.starts_with('Z'))
            })
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while alive() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(!alive(), "its supervisor {pid} is left");
    }

    /// A vm session runs an exec as any user of its container (docker
    /// exec's `-u`): root adds a user, which the next exec runs as; the
    /// default stays uid 1000. What root writes to the project, and even
    /// gives to another user of the container, is the host owner's on the
    /// host, never the container root's host uid. An unknown user starts
    /// nothing and says so; a plain `hull run` into the session's VM (a
    /// kept VM whose turn it does not hold) is refused `--user`.
    #[test]
    fn a_session_on_vm_runs_as_any_user_of_its_container() {
        require_tier("vm");
        let w = World::new();
        let s = Server::start(&w);
        let id = open(&s, "vm", &w.project);
        let exec = |v: serde_json::Value| {
            let (code, text) = s.call(
                "POST",
                &format!("/v1/sessions/{id}/exec"),
                Some(&v.to_string()),
            );
            assert_eq!(code, 200, "{text}");
            json(&text)
        };
        let who = "id -un; id -u; echo \"$HOME\"";
        let r = exec(serde_json::json!({"argv": ["sh", "-c", who]}));
        assert_eq!(
            r["stdout"].as_str().unwrap().lines().nth(1),
            Some("1000"),
            "{r}"
        );
        let r = exec(serde_json::json!({"argv": ["sh", "-c", who], "user": "root"}));
        assert_eq!(r["stdout"], "root\n0\n/root\n", "{r}");
        let r = exec(serde_json::json!({
            "argv": ["adduser", "--comment", "hull test", "--disabled-password", "tester"],
            "user": "root",
            "timeout": "120s"
        }));
        assert_eq!(r["exit_code"], 0, "adduser as root: {r}");
        let r = exec(serde_json::json!({"argv": ["sh", "-c", who], "user": "tester"}));
        let out = r["stdout"].as_str().unwrap().to_string();
        assert!(
            out.starts_with("tester\n") && out.ends_with("\n/home/tester\n"),
            "{r}"
        );
        assert_ne!(out.lines().nth(1), Some("1000"), "{r}");
        // Root's writes to the project land, as the host owner's.
        let r = exec(serde_json::json!({
            "argv": ["sh", "-c", "echo by-root > root-made.txt && chown tester: root-made.txt && mkdir root-dir"],
            "user": "root"
        }));
        assert_eq!(r["exit_code"], 0, "{r}");
        use std::os::unix::fs::MetadataExt;
        // The test made the project: its owner is hull's user.
        let owner = std::fs::metadata(&w.project).unwrap();
        for name in ["root-made.txt", "root-dir"] {
            let m = std::fs::symlink_metadata(w.project.join(name)).unwrap();
            assert_eq!(
                (m.uid(), m.gid()),
                (owner.uid(), owner.gid()),
                "{name}: the host owner's"
            );
        }
        assert_eq!(
            std::fs::read_to_string(w.project.join("root-made.txt")).unwrap(),
            "by-root\n"
        );
        let r = exec(serde_json::json!({"argv": ["true"], "user": "no-such-user"}));
        // 126, as docker's: nothing ran.
        assert_eq!(
            (&r["status"], &r["exit_code"]),
            (&"exit".into(), &126.into()),
            "{r}"
        );
        assert!(
            r["error"]
                .as_str()
                .unwrap_or_default()
                .contains("no user no-such-user"),
            "{r}"
        );
        let name = format!("session-{}", &id[..12]);
        let o = w
            .hull()
            .args(["run", "--vm", &name, "--user", "root", "--project"])
            .arg(&w.project)
            .args(["--", "true"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success() && err.contains("--user root is refused in a kept VM"),
            "{err}"
        );
        let (code, _) = s.call("DELETE", &format!("/v1/sessions/{id}"), None);
        assert_eq!(code, 204);
    }
}

/// A landlock session of `hull serve` run by a user (nobody, not root) is
/// one sandbox with a `/tmp`, a `/var/tmp` and terminals of its own, as it
/// is when hull is root: what one exec writes to `/tmp` the next reads,
/// the host's `/tmp` gets nothing, the project (in the host's `/tmp`) is
/// there and writable, its `.git` read-only and no `.git` can be made in a
/// project that has none; a terminal opened in the session is one of its
/// own devpts. The control: a user's landlock run without a session writes
/// the host's `/tmp` (granted there) and the same file is there after.
/// (Against the code before, a user's session had the host's `/tmp`, no
/// terminal, and the file was on the host.)
#[cfg(feature = "landlock")]
#[test]
#[ignore = "needs root: runs hull serve as the user nobody"]
fn landlock_a_session_as_a_user_has_its_own_tmp_and_terminals() {
    require_tier("landlock");
    let w = hull_tests::nobody::AsNobody::new();
    assert!(
        w.project.starts_with("/tmp"),
        "the project is in the host's /tmp"
    );
    let name = format!("hull-user-session-{}", std::process::id());
    let host_file = Path::new("/tmp").join(&name);
    let _ = std::fs::remove_file(&host_file);
    let git = |args: &[&str]| {
        let st = Command::new("git")
            .arg("-C")
            .arg(&w.project)
            .args(args)
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(st.success(), "git {args:?}");
    };
    git(&["init", "-q"]);
    let bare = w.u.join("bare");
    std::fs::create_dir_all(&bare).unwrap();
    w.give_to_nobody();
    let s = Server::start_as_nobody(&w);
    let open_as = |project: &Path| {
        let (code, body) = s.call_as(
            Some("nobody"),
            "POST",
            "/v1/sessions",
            Some(&format!(
                "{{\"tier\": \"landlock\", \"project\": \"{}\"}}",
                project.display()
            )),
        );
        assert_eq!(code, 201, "{body}");
        json(&body)["id"].as_str().unwrap().to_string()
    };
    let id = open_as(&w.project);
    let exec_in = |id: &str, script: &str| {
        let (code, body) = s.call_as(
            Some("nobody"),
            "POST",
            &format!("/v1/sessions/{id}/exec"),
            Some(&serde_json::json!({"argv": ["sh", "-c", script], "timeout": "60s"}).to_string()),
        );
        assert_eq!(code, 200, "{body}");
        json(&body)
    };
    let exec = |script: &str| exec_in(&id, script);
    let r = exec(&format!("echo a > /tmp/{name} && echo b > /var/tmp/{name}"));
    assert_eq!(r["exit_code"], 0, "{r}");
    let r = exec(&format!("cat /tmp/{name} /var/tmp/{name}"));
    assert_eq!(r["stdout"], "a\nb\n", "{r}");
    for dir in ["/tmp", "/var/tmp"] {
        assert!(
            !Path::new(dir).join(&name).exists(),
            "{dir}/{name} is on the host"
        );
    }
    // The session's mounts are not the command's to undo: it has no
    // capability left in the session's user namespace.
    let r = exec("umount -l /tmp || umount -l /dev/pts || unshare -Urm true");
    assert_ne!(r["exit_code"], 0, "a mount was undone: {r}");
    // The host's /tmp is not there: only the way to the grants below it.
    let r = exec("ls -a /tmp");
    assert_eq!(r["exit_code"], 0, "{r}");
    let listed = r["stdout"].as_str().unwrap();
    assert!(listed.contains(&name), "{r}");
    assert!(
        !listed.contains(".X11-unix") && !listed.contains("hull-runs"),
        "{r}"
    );
    // The project is there, writable; its .git is not.
    let config = std::fs::read(w.project.join(".git/config")).unwrap();
    let r = exec("echo ok > written && echo x >> .git/config");
    assert_ne!(r["exit_code"], 0, ".git/config was written: {r}");
    assert_eq!(
        std::fs::read_to_string(w.project.join("written")).unwrap(),
        "ok\n"
    );
    assert_eq!(
        std::fs::read(w.project.join(".git/config")).unwrap(),
        config
    );
    let r = exec("echo x > .git/hooks/pre-commit");
    assert_ne!(r["exit_code"], 0, "a hook was written: {r}");
    assert!(!w.project.join(".git/hooks/pre-commit").exists());
    // A terminal of its own.
    let r = exec(
        "python3 -c 'import os; m, s = os.openpty(); os.write(m, b\"hi\\n\"); \
         print(os.ttyname(s), os.read(s, 3))'",
    );
    assert_eq!(r["exit_code"], 0, "{r}");
    assert!(r["stdout"].as_str().unwrap().contains("/dev/pts/"), "{r}");
    // No .git can be made where there is none.
    let other = open_as(&bare);
    let r = exec_in(
        &other,
        "mkdir -p .git/hooks && echo x > .git/hooks/post-checkout",
    );
    assert_ne!(r["exit_code"], 0, "a .git was made: {r}");
    let (code, _) = s.call_as(
        Some("nobody"),
        "DELETE",
        &format!("/v1/sessions/{other}"),
        None,
    );
    assert_eq!(code, 204);
    assert!(!bare.join(".git").exists(), "a .git is left in the project");
    let (code, _) = s.call_as(
        Some("nobody"),
        "DELETE",
        &format!("/v1/sessions/{id}"),
        None,
    );
    assert_eq!(code, 204);
    // The control: a user's run that is no session has the host's /tmp
    // (granted there by this policy).
    let pol = w.top.path().join("tmp-granted.toml");
    std::fs::write(
        &pol,
        std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../policies/default.toml"
        ))
        .unwrap()
        .replace("read_write = [", "read_write = [\"/tmp\", "),
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&pol, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let o = w.run("landlock", &pol, &format!("echo c > /tmp/{name}"));
    assert!(o.status.success(), "{}", show(&o));
    assert_eq!(std::fs::read_to_string(&host_file).unwrap(), "c\n");
    let _ = std::fs::remove_file(&host_file);
}

/// A template of a session's workspace (issue 58, the process tiers):
/// made while the session runs, then forked into four sessions at once,
/// each copy-on-write over it: each sees what was prepared, not what the
/// session wrote after, and its own writes only; the template is
/// unchanged after. A fork under another policy or tier, or naming a
/// project, is refused (another caller's template is not found:
/// `templates::tests`); the template cannot be removed while a fork runs,
/// and can once none does.
fn a_template_is_forked_into_sessions_that_keep_their_writes_apart(tier: &str) {
    require_tier(tier);
    let w = World::new();
    std::fs::write(w.project.join("a.txt"), "base\n").unwrap();
    let images = w.root.path().join("images");
    let socket = w.root.path().join("serve").join("s.sock");
    let mut c = w.hull();
    c.env("HULL_IMAGE_CACHE", &images)
        .args(["serve", "--socket"])
        .arg(&socket)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let s = Server::wait(c.spawn().expect("spawn hull serve"), socket);
    let exec = |id: &str, script: &str| {
        let (code, body) = s.call(
            "POST",
            &format!("/v1/sessions/{id}/exec"),
            Some(&serde_json::json!({"argv": ["sh", "-c", script]}).to_string()),
        );
        assert_eq!(code, 200, "{body}");
        let r = json(&body);
        assert_eq!(r["exit_code"], 0, "{r}");
        r["stdout"].as_str().unwrap().to_string()
    };
    let prep = open(&s, tier, &w.project);
    exec(
        &prep,
        "mkdir -p lib && echo v1 > lib/mod.py && echo installed > pkg.txt",
    );
    let make = |name: &str| {
        s.call(
            "POST",
            &format!("/v1/sessions/{prep}/template"),
            Some(&format!("{{\"name\": \"{name}\"}}")),
        )
    };
    let (code, body) = make("prepared");
    assert_eq!(code, 201, "{body}");
    let t = json(&body);
    assert_eq!(
        (t["name"].as_str(), t["tier"].as_str(), t["policy"].as_str()),
        (Some("prepared"), Some(tier), Some("default")),
        "{t}"
    );
    let (code, body) = make("prepared");
    assert_eq!(code, 409, "{body}");
    let (code, body) = make("../escape");
    assert_eq!(code, 400, "{body}");
    // Written after: not in the template.
    exec(&prep, "echo later > later.txt");
    let forks: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                scope.spawn(|| {
                    let (code, body) = s.call(
                        "POST",
                        "/v1/sessions",
                        Some(&format!("{{\"tier\": \"{tier}\", \"from\": \"prepared\"}}")),
                    );
                    assert_eq!(code, 201, "{body}");
                    let v = json(&body);
                    assert_eq!(v["workspace"], "cow", "{v}");
                    v["id"].as_str().unwrap().to_string()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, f) in forks.iter().enumerate() {
        assert_eq!(
            exec(f, &format!("cat a.txt pkg.txt lib/mod.py; test -e later.txt || echo no later; echo fork{i} > mine.txt")),
            "base\ninstalled\nv1\nno later\n"
        );
    }
    for (i, f) in forks.iter().enumerate() {
        assert_eq!(exec(f, "cat mine.txt"), format!("fork{i}\n"));
    }
    let kept = images.join("templates/prepared/workspace");
    assert_eq!(
        std::fs::read_to_string(kept.join("pkg.txt")).unwrap(),
        "installed\n"
    );
    assert!(!kept.join("mine.txt").exists() && !kept.join("later.txt").exists());
    // Refused: another policy, another tier, a project of its own, a
    // template that is not there.
    let other_tier = if tier == "bwrap" { "landlock" } else { "bwrap" };
    for (body, want) in [
        (
            format!("{{\"tier\": \"{tier}\", \"from\": \"prepared\", \"policy\": \"readonly\"}}"),
            409,
        ),
        (
            format!("{{\"tier\": \"{other_tier}\", \"from\": \"prepared\"}}"),
            409,
        ),
        (
            format!(
                "{{\"tier\": \"{tier}\", \"from\": \"prepared\", \"project\": \"{}\"}}",
                w.project.display()
            ),
            400,
        ),
        (
            format!("{{\"tier\": \"{tier}\", \"from\": \"nothing\"}}"),
            404,
        ),
    ] {
        let (code, got) = s.call("POST", "/v1/sessions", Some(&body));
        assert_eq!(code, want, "{body}: {got}");
    }
    // `hull run --from`: the same, as one run; its change set is never
    // applied to the template.
    let run_from = |extra: &[&str], script: &str| {
        let mut c = w.hull();
        c.env("HULL_IMAGE_CACHE", &images)
            .args([
                "run",
                "--tier",
                tier,
                "--timeout",
                "60s",
                "--from",
                "prepared",
            ])
            .args(extra)
            .args(["--", "sh", "-c", script])
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let o = run_from(&[], "cat pkg.txt; echo run > from-run.txt");
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "installed\n");
    assert!(!kept.join("from-run.txt").exists());
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    let set = err
        .split("changes kept as ")
        .nth(1)
        .and_then(|r| r.split(';').next())
        .unwrap_or_else(|| panic!("no change set: {err}"))
        .to_string();
    let mut c = w.hull();
    let o = c
        .env("HULL_IMAGE_CACHE", &images)
        .args(["changes", "apply", &set])
        .output()
        .unwrap();
    assert!(!o.status.success(), "{}", show(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("template prepared"),
        "{}",
        show(&o)
    );
    assert!(!kept.join("from-run.txt").exists());
    // `hull batch --from`: every job on a layer of its own over it.
    let jobs = w.root.path().join("jobs.jsonl");
    std::fs::write(
        &jobs,
        (0..3)
            .map(|i| {
                format!(
                    "{{\"id\": \"j{i}\", \"sh\": \"cat pkg.txt; ls; echo {i} > job.txt; cat job.txt\"}}\n"
                )
            })
            .collect::<String>(),
    )
    .unwrap();
    let out = w.root.path().join("batch-out");
    let o = w
        .hull()
        .env("HULL_IMAGE_CACHE", &images)
        .args(["batch", "--tier", tier, "--from", "prepared", "--out"])
        .arg(&out)
        .arg(&jobs)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", show(&o));
    for i in 0..3 {
        let got = std::fs::read_to_string(out.join(format!("jobs/j{i}.{tier}.stdout")))
            .unwrap_or_else(|e| panic!("j{i}: {e}"));
        assert_eq!(
            got,
            format!("installed\na.txt\nlib\npkg.txt\nsrc\n{i}\n"),
            "j{i}"
        );
    }
    assert!(!kept.join("job.txt").exists());
    let o = run_from(&["--policy", "readonly"], "true");
    assert!(!o.status.success(), "{}", show(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("made under policy default"),
        "{}",
        show(&o)
    );
    // In use: not removed; once no fork runs, removed.
    let rm = || {
        let mut c = w.hull();
        c.env("HULL_IMAGE_CACHE", &images)
            .args(["templates", "rm", "prepared"])
            .output()
            .unwrap()
    };
    let o = rm();
    assert!(!o.status.success(), "{}", show(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("in use"),
        "{}",
        show(&o)
    );
    assert!(kept.join("pkg.txt").exists());
    for f in &forks {
        let (code, _) = s.call("DELETE", &format!("/v1/sessions/{f}"), None);
        assert_eq!(code, 204);
    }
    let o = rm();
    assert!(o.status.success(), "{}", show(&o));
    assert!(!images.join("templates/prepared").exists());
}

#[cfg(feature = "bwrap")]
#[test]
fn bwrap_a_template_is_forked_into_sessions_that_keep_their_writes_apart() {
    a_template_is_forked_into_sessions_that_keep_their_writes_apart("bwrap");
}

#[cfg(feature = "landlock")]
#[test]
fn landlock_a_template_is_forked_into_sessions_that_keep_their_writes_apart() {
    a_template_is_forked_into_sessions_that_keep_their_writes_apart("landlock");
}
