//! `hull canary`: hull's escape probes, run on this machine against its
//! tiers, so a user sees what each tier enforces here (a kernel without
//! Landlock scoping, a setuid bubblewrap, no `/dev/kvm` all change it).
//!
//! Every probe runs the real `hull run` (this executable) in a decoy made
//! for the canary and removed after it: a home with a key, a project with
//! `.git` and `.hull`, a directory outside every grant with a secret, and a
//! TCP listener on the host's loopback. An attack probe runs first under
//! tier `none`, its control: when the attack does not land there, the probe
//! proves nothing and is `inconclusive` on every tier, never `denied`. A
//! positive probe (a write the policy allows) must land, or the canary
//! proves nothing either. The verdict is what the host saw afterwards, not
//! what the command said.

use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use serde::Serialize;

use crate::tier::Tier;

/// What a cell says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The attack did not land.
    Denied,
    /// A positive probe landed, as it must; or, under the control, the
    /// attack landed (which makes the probe meaningful).
    Allowed,
    /// The attack landed.
    Leak,
    /// A positive probe did not land: the tier refused what the policy
    /// allows, so its denials prove nothing.
    Failed,
    /// The attack did not land under tier `none` either.
    Inconclusive,
    /// The tier is not available here.
    NotApplicable,
    /// hull itself failed on the tier (exit 125): the command did not run,
    /// so nothing was shown either way.
    Error,
}

impl Verdict {
    pub fn label(self) -> &'static str {
        match self {
            Verdict::Denied => "denied",
            Verdict::Allowed => "allowed (expected)",
            Verdict::Leak => "LEAK",
            Verdict::Failed => "FAILED",
            Verdict::Inconclusive => "inconclusive",
            Verdict::NotApplicable => "n/a",
            Verdict::Error => "ERROR",
        }
    }

    /// Whether the canary fails on it.
    pub fn is_bad(self) -> bool {
        matches!(self, Verdict::Leak | Verdict::Failed | Verdict::Error)
    }
}

/// One cell of the matrix.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    pub probe: &'static str,
    pub class: &'static str,
    /// The tier's name; `none` is the control.
    pub tier: String,
    pub verdict: Verdict,
    /// What the host saw (or why not applicable).
    pub evidence: String,
}

#[derive(Debug, thiserror::Error)]
pub enum CanaryError {
    #[error("canary: cannot make the decoy in {path}: {source}")]
    Decoy {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("canary: cannot start hull ({exe}): {source}")]
    Spawn {
        exe: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("canary: interrupted; the decoy was removed")]
    Interrupted,
}

/// Attack or positive check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Attack,
    Positive,
}

/// One probe: a shell script the sandboxed command runs, and what the host
/// sees when it landed (None: it did not).
#[derive(Debug)]
pub struct Probe {
    pub id: &'static str,
    pub class: &'static str,
    pub kind: Kind,
    /// The class is about hull running as root (the command would own
    /// the decoy otherwise): n/a when hull is not root.
    pub needs_root: bool,
    script: fn(&Decoy) -> String,
    landed: fn(&Decoy, &Output) -> Option<String>,
}

/// The decoy world: made once, each area reset before every run.
#[derive(Debug)]
pub struct Decoy {
    root: PathBuf,
    home: PathBuf,
    project: PathBuf,
    outside: PathBuf,
    /// Granted read-only by the canary's policy.
    shared: PathBuf,
    policy: PathBuf,
    secret: String,
    listener_port: u16,
    connections: Arc<AtomicUsize>,
    unix_connections: Arc<AtomicUsize>,
    /// A host process the probes try to signal (restarted by reset).
    victim: std::sync::Mutex<Option<std::process::Child>>,
}

fn stdout_has(o: &Output, needle: &str) -> Option<String> {
    String::from_utf8_lossy(&o.stdout)
        .contains(needle)
        .then(|| "the secret was in the command's output".to_string())
}

fn exists(p: &Path) -> Option<String> {
    std::fs::symlink_metadata(p)
        .is_ok()
        .then(|| format!("{} exists on the host", p.display()))
}

/// The probes, in the order they run.
pub fn probes() -> Vec<Probe> {
    vec![
        Probe {
            id: "read_outside_file",
            class: "read outside the grants",
            kind: Kind::Attack,
            needs_root: false,
            script: |d| format!("cat '{}/secret.txt'", d.outside.display()),
            landed: |d, o| stdout_has(o, &d.secret),
        },
        Probe {
            id: "read_home_key",
            class: "read outside the grants",
            kind: Kind::Attack,
            needs_root: false,
            script: |d| format!("cat '{}/.ssh/id_canary'", d.home.display()),
            landed: |d, o| stdout_has(o, &d.secret),
        },
        Probe {
            id: "write_outside",
            class: "write outside the grants",
            kind: Kind::Attack,
            needs_root: false,
            script: |d| format!("echo canary > '{}/written'", d.outside.display()),
            landed: |d, _| exists(&d.outside.join("written")),
        },
        Probe {
            id: "git_hook",
            class: "protected paths",
            kind: Kind::Attack,
            needs_root: false,
            script: |_| "mkdir -p .git/hooks; echo 'echo pwned' > .git/hooks/pre-commit".into(),
            landed: |d, _| exists(&d.project.join(".git/hooks/pre-commit")),
        },
        Probe {
            id: "hull_state",
            class: "protected paths",
            kind: Kind::Attack,
            needs_root: false,
            script: |_| "echo planted > .hull/planted".into(),
            landed: |d, _| exists(&d.project.join(".hull/planted")),
        },
        Probe {
            id: "symlink_out",
            class: "links out of the project",
            kind: Kind::Attack,
            needs_root: false,
            script: |d| format!("ln -s '{}/secret.txt' lnk; cat lnk", d.outside.display()),
            landed: |d, o| stdout_has(o, &d.secret),
        },
        Probe {
            id: "hardlink_out",
            class: "links out of the project",
            kind: Kind::Attack,
            needs_root: false,
            script: |d| format!("ln '{}/secret.txt' hl && cat hl", d.outside.display()),
            landed: |d, o| stdout_has(o, &d.secret),
        },
        Probe {
            id: "chmod_outside",
            class: "metadata outside the grants",
            kind: Kind::Attack,
            needs_root: false,
            script: |d| format!("chmod 0666 '{}/secret.txt'", d.outside.display()),
            landed: |d, _| {
                use std::os::unix::fs::PermissionsExt;
                let mode = std::fs::metadata(d.outside.join("secret.txt"))
                    .map(|m| m.permissions().mode() & 0o777)
                    .unwrap_or(0);
                (mode != 0o600).then(|| format!("its mode is now {mode:o} on the host"))
            },
        },
        Probe {
            id: "tcp_host_loopback",
            class: "network",
            kind: Kind::Attack,
            needs_root: false,
            script: |d| {
                format!(
                    "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {}), 3)'",
                    d.listener_port
                )
            },
            landed: |d, _| {
                (d.connections.swap(0, Ordering::AcqRel) > 0)
                    .then(|| "the host's listener accepted a connection".to_string())
            },
        },
        Probe {
            id: "root_only_file",
            class: "root-only files in a grant",
            kind: Kind::Attack,
            needs_root: true,
            script: |d| format!("cat '{}/root-only.txt'", d.shared.display()),
            landed: |d, o| stdout_has(o, &d.secret),
        },
        Probe {
            id: "host_unix_socket",
            class: "host sockets under a grant",
            kind: Kind::Attack,
            needs_root: false,
            script: |d| {
                format!(
                    "python3 -c 'import socket; s = socket.socket(socket.AF_UNIX); \
                     s.settimeout(3); s.connect(\"{}/host.sock\")'",
                    d.shared.display()
                )
            },
            landed: |d, _| {
                (d.unix_connections.swap(0, Ordering::AcqRel) > 0)
                    .then(|| "the host's unix listener accepted a connection".to_string())
            },
        },
        Probe {
            id: "signal_host_process",
            class: "host processes",
            kind: Kind::Attack,
            needs_root: false,
            script: |d| format!("kill -TERM {}", d.victim_pid()),
            landed: |d, _| {
                d.victim_gone()
                    .then(|| "a host process of the canary's was killed".to_string())
            },
        },
        Probe {
            id: "setuid_bit",
            class: "set-id bits",
            kind: Kind::Attack,
            needs_root: false,
            script: |_| "cp /bin/true suid && chmod u+s suid".into(),
            landed: |d, _| {
                use std::os::unix::fs::PermissionsExt;
                let mode = std::fs::metadata(d.project.join("suid"))
                    .map(|m| m.permissions().mode())
                    .unwrap_or(0);
                (mode & 0o4000 != 0).then(|| "a set-uid file is in the project".to_string())
            },
        },
        Probe {
            id: "write_project",
            class: "allowed writes",
            kind: Kind::Positive,
            needs_root: false,
            script: |_| "echo ok > top.txt && mkdir -p sub && echo ok > sub/f.txt".into(),
            landed: |d, _| {
                let top = std::fs::read_to_string(d.project.join("top.txt")).ok()?;
                let sub = std::fs::read_to_string(d.project.join("sub/f.txt")).ok()?;
                (top == "ok\n" && sub == "ok\n")
                    .then(|| "both files landed in the project".to_string())
            },
        },
        Probe {
            id: "read_project",
            class: "allowed reads",
            kind: Kind::Positive,
            needs_root: false,
            script: |_| "cat input.txt".into(),
            landed: |d, o| stdout_has(o, &d.secret),
        },
    ]
}

impl Decoy {
    fn new() -> Result<Decoy, CanaryError> {
        // Short: tier 3's sockets live in the runs dir below it, and a unix
        // socket path has 107 bytes.
        let id = uuid::Uuid::new_v4().simple().to_string();
        let root = std::env::temp_dir().join(format!("hull-canary-{}", &id[..12]));
        let err = |source| CanaryError::Decoy {
            path: root.clone(),
            source,
        };
        std::fs::create_dir(&root).map_err(err)?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700)).map_err(err)?;
        let listener = TcpListener::bind("127.0.0.1:0").map_err(err)?;
        let port = listener.local_addr().map_err(err)?.port();
        let connections = Arc::new(AtomicUsize::new(0));
        let seen = Arc::clone(&connections);
        std::thread::spawn(move || {
            for s in listener.incoming().flatten() {
                seen.fetch_add(1, Ordering::AcqRel);
                drop(s);
            }
        });
        let shared = root.join("shared");
        std::fs::create_dir(&shared).map_err(err)?;
        let unix = std::os::unix::net::UnixListener::bind(shared.join("host.sock")).map_err(err)?;
        let unix_connections = Arc::new(AtomicUsize::new(0));
        let seen = Arc::clone(&unix_connections);
        std::thread::spawn(move || {
            for s in unix.incoming().flatten() {
                seen.fetch_add(1, Ordering::AcqRel);
                drop(s);
            }
        });
        let policy = root.join("canary.toml");
        let text = crate::policy::profiles::PROFILES
            .iter()
            .find(|(n, _)| *n == "default")
            .map(|(_, t)| *t)
            .unwrap_or_default()
            .replacen(
                "read = [",
                &format!("read = [\"{}\", ", shared.display()),
                1,
            );
        std::fs::write(&policy, text).map_err(err)?;
        let d = Decoy {
            home: root.join("home"),
            project: root.join("project"),
            outside: root.join("outside"),
            shared,
            policy,
            secret: format!("canary-secret-{}", uuid::Uuid::new_v4().simple()),
            root: root.clone(),
            listener_port: port,
            connections,
            unix_connections,
            victim: std::sync::Mutex::new(None),
        };
        d.reset().map_err(err)?;
        Ok(d)
    }

    fn victim_pid(&self) -> u32 {
        self.victim
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map_or(0, |c| c.id())
    }

    /// Whether the victim process died (it only ends when signalled).
    fn victim_gone(&self) -> bool {
        let mut v = self.victim.lock().unwrap_or_else(|e| e.into_inner());
        match v.as_mut().map(|c| c.try_wait()) {
            Some(Ok(Some(_))) => true,
            Some(Ok(None)) => false,
            _ => false,
        }
    }

    /// Puts every area back as it was made.
    fn reset(&self) -> std::io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        for dir in [&self.home, &self.project, &self.outside] {
            crate::runtime::remove_tree(dir)?;
        }
        std::fs::create_dir_all(self.home.join(".ssh"))?;
        std::fs::create_dir_all(self.project.join(".git"))?;
        std::fs::create_dir_all(self.project.join(".hull"))?;
        std::fs::create_dir_all(&self.outside)?;
        std::fs::write(self.project.join(".git/HEAD"), "ref: refs/heads/main\n")?;
        std::fs::write(self.project.join("input.txt"), format!("{}\n", self.secret))?;
        for f in [
            self.outside.join("secret.txt"),
            self.home.join(".ssh/id_canary"),
            self.shared.join("root-only.txt"),
        ] {
            std::fs::write(&f, format!("{}\n", self.secret))?;
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600))?;
        }
        // The granted directory itself is readable by anyone; the file in
        // it is the owner's alone.
        std::fs::set_permissions(&self.shared, std::fs::Permissions::from_mode(0o755))?;
        self.connections.store(0, Ordering::Release);
        self.unix_connections.store(0, Ordering::Release);
        let mut v = self.victim.lock().unwrap_or_else(|e| e.into_inner());
        if !matches!(v.as_mut().map(|c| c.try_wait()), Some(Ok(None))) {
            *v = Some(
                Command::new("sleep")
                    .arg("600")
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()?,
            );
        }
        Ok(())
    }
}

impl Drop for Decoy {
    fn drop(&mut self) {
        if let Some(mut c) = self.victim.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = crate::runtime::remove_tree(&self.root);
    }
}

/// Runs every probe under the control and on each of `tiers`, calling
/// `progress(i, n, probe, tier)` before each run. `stop` ends it early
/// (the decoy is removed either way).
pub fn run(
    tiers: &[Tier],
    stop: &AtomicBool,
    mut progress: impl FnMut(usize, usize, &str, &str),
) -> Result<Vec<Cell>, CanaryError> {
    let exe = std::env::current_exe().map_err(|source| CanaryError::Spawn {
        exe: PathBuf::from("/proc/self/exe"),
        source,
    })?;
    let decoy = Decoy::new()?;
    let probes = probes();
    let available: Vec<(Tier, Option<String>)> = tiers
        .iter()
        .map(|t| {
            let p = crate::tier::ready(*t);
            (*t, (!p.available).then_some(p.reason))
        })
        .collect();
    let total = probes.len() * (1 + tiers.len());
    let mut step = 0;
    let mut cells = Vec::new();
    for p in &probes {
        let mut control_landed = None;
        for (tier, why_not) in std::iter::once((Tier::None, None)).chain(available.clone()) {
            if stop.load(Ordering::Relaxed) {
                return Err(CanaryError::Interrupted);
            }
            step += 1;
            let name = tier.name().to_string();
            if let Some(why) = why_not {
                cells.push(cell(p, &name, Verdict::NotApplicable, why));
                continue;
            }
            if p.needs_root && !crate::sandbox_user::hull_is_root() {
                cells.push(cell(
                    p,
                    &name,
                    Verdict::NotApplicable,
                    "about hull running as root; hull is not root".into(),
                ));
                continue;
            }
            if tier != Tier::None && p.kind == Kind::Attack && control_landed == Some(false) {
                cells.push(cell(
                    p,
                    &name,
                    Verdict::Inconclusive,
                    "the attack did not land under tier none either".into(),
                ));
                continue;
            }
            progress(step, total, p.id, &name);
            decoy.reset().map_err(|source| CanaryError::Decoy {
                path: decoy.root.clone(),
                source,
            })?;
            let out = run_one(&exe, &decoy, tier, &(p.script)(&decoy))?;
            // Give the listener's thread a moment to count a connection.
            std::thread::sleep(std::time::Duration::from_millis(20));
            let landed = (p.landed)(&decoy, &out);
            let hull_failed = out.status.code() == Some(crate::EXIT_HULL_FAILED);
            let verdict = match (tier, p.kind, &landed) {
                (_, _, None) if hull_failed => Verdict::Error,
                (Tier::None, Kind::Attack, Some(_)) => Verdict::Allowed,
                (Tier::None, Kind::Attack, None) => Verdict::Inconclusive,
                (_, Kind::Attack, Some(_)) => Verdict::Leak,
                (_, Kind::Attack, None) => Verdict::Denied,
                (_, Kind::Positive, Some(_)) => Verdict::Allowed,
                (_, Kind::Positive, None) => Verdict::Failed,
            };
            if tier == Tier::None {
                control_landed = Some(landed.is_some());
            }
            let evidence = landed.unwrap_or_else(|| summary(&out));
            cells.push(cell(p, &name, verdict, evidence));
        }
    }
    Ok(cells)
}

fn cell(p: &Probe, tier: &str, verdict: Verdict, evidence: String) -> Cell {
    Cell {
        probe: p.id,
        class: p.class,
        tier: tier.to_string(),
        verdict,
        evidence,
    }
}

/// The end of the command's stderr and its status, as evidence of a refusal.
fn summary(o: &Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr);
    let last = err
        .lines()
        .rfind(|l| !l.trim().is_empty() && !l.contains("UNSANDBOXED"))
        .unwrap_or("");
    // The command's own words: shown on the user's terminal.
    let last = crate::text::printable(&last.chars().take(300).collect::<String>());
    format!("exit {:?}: {last}", o.status.code())
}

fn run_one(exe: &Path, d: &Decoy, tier: Tier, script: &str) -> Result<Output, CanaryError> {
    let mut c = Command::new(exe);
    c.args(["-q", "run"]);
    if tier == Tier::Vm {
        c.arg("--tier3");
    } else {
        c.args(["--tier", tier.name()]);
    }
    c.arg("--project")
        .arg(&d.project)
        .arg("--policy")
        .arg(&d.policy)
        .args(["--timeout", "60s", "--", "sh", "-c", script])
        .current_dir(&d.project)
        .stdin(Stdio::null());
    // The decoy home; hull's own caches (the tier-3 image) stay where
    // they are.
    if let Some(cache) = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
    {
        c.env("XDG_CACHE_HOME", cache);
    }
    c.env("HOME", &d.home)
        .env("HULL_RUNS_DIR", d.root.join("r"))
        .env_remove("HULL_INSTANCE");
    let mut child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| CanaryError::Spawn {
            exe: exe.to_path_buf(),
            source,
        })?;
    // Bounded: a probe's output is small; more is not read.
    let mut out = Vec::new();
    let mut err = Vec::new();
    if let Some(s) = child.stdout.take() {
        let _ = s.take(64 * 1024).read_to_end(&mut out);
    }
    if let Some(s) = child.stderr.take() {
        let _ = s.take(64 * 1024).read_to_end(&mut err);
    }
    let status = child.wait().map_err(|source| CanaryError::Spawn {
        exe: exe.to_path_buf(),
        source,
    })?;
    Ok(Output {
        status,
        stdout: out,
        stderr: err,
    })
}

/// The matrix's columns (tiers, the control first) and rows (probe, class),
/// in the order the cells came.
fn layout(cells: &[Cell]) -> (Vec<&str>, Vec<(&'static str, &'static str)>) {
    let mut tiers: Vec<&str> = Vec::new();
    let mut rows: Vec<(&'static str, &'static str)> = Vec::new();
    for c in cells {
        if !tiers.contains(&c.tier.as_str()) {
            tiers.push(&c.tier);
        }
        if !rows.iter().any(|(p, _)| *p == c.probe) {
            rows.push((c.probe, c.class));
        }
    }
    (tiers, rows)
}

/// A column's heading.
fn column(tier: &str) -> &str {
    if tier == "none" {
        "none (control)"
    } else {
        tier
    }
}

/// What a cell shows: under the control, an attack that landed "lands".
fn shown(c: &Cell) -> &'static str {
    match (c.tier.as_str(), c.verdict) {
        ("none", Verdict::Allowed) => "lands",
        (_, v) => v.label(),
    }
}

/// The matrix as text: one row per probe, one column per tier (the control
/// first), and the evidence of every cell that is not as it should be.
pub fn render(cells: &[Cell]) -> String {
    let (tiers, rows) = layout(cells);
    let mut line = format!("{:<20} {:<28}", "probe", "class");
    for t in &tiers {
        line.push_str(&format!(" {:<19}", column(t)));
    }
    let mut out = format!("{}\n", line.trim_end());
    for (probe, class) in &rows {
        let mut line = format!("{probe:<20} {class:<28}");
        for t in &tiers {
            let v = cells
                .iter()
                .find(|c| c.probe == *probe && c.tier == *t)
                .map_or("", shown);
            line.push_str(&format!(" {v:<19}"));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    let notes: Vec<&Cell> = cells
        .iter()
        .filter(|c| {
            c.verdict.is_bad()
                || c.verdict == Verdict::NotApplicable
                || (c.verdict == Verdict::Inconclusive && c.tier == "none")
        })
        .collect();
    let mut said: Vec<(&str, &str)> = Vec::new();
    for c in notes {
        if c.verdict == Verdict::NotApplicable {
            let key = (c.tier.as_str(), c.evidence.as_str());
            if said.contains(&key) {
                continue;
            }
            said.push(key);
            out.push_str(&format!("  {}: n/a: {}\n", c.tier, c.evidence));
            continue;
        }
        out.push_str(&format!(
            "  {} on {}: {}: {}\n",
            c.probe,
            c.tier,
            c.verdict.label(),
            c.evidence
        ));
    }
    out
}

/// The matrix as one self-contained HTML page (no external assets): cells
/// coloured by verdict, each cell's evidence in its tooltip and in a
/// `<details>` under the table. Every text from a probe's run (evidence is
/// the command's own output) is escaped.
pub fn render_html(cells: &[Cell]) -> String {
    let (tiers, rows) = layout(cells);
    let mut out = String::from(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>hull canary</title><style>\
         body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}\
         td,th{border:1px solid #999;padding:.3em .6em;text-align:left}\
         .denied{background:#c8f0c8}.allowed{background:#d8e8ff}.leak,.failed,.error{background:#f4a0a0;font-weight:bold}\
         .inconclusive{background:#fff0a0}.not_applicable{background:#eee;color:#666}\
         </style></head><body><h1>hull canary</h1>\n<table id=\"matrix\"><tr><th>probe</th><th>class</th>",
    );
    for t in &tiers {
        out.push_str(&format!("<th>{}</th>", escape(column(t))));
    }
    out.push_str("</tr>\n");
    for (probe, class) in &rows {
        out.push_str(&format!(
            "<tr><td>{}</td><td>{}</td>",
            escape(probe),
            escape(class)
        ));
        for t in &tiers {
            match cells.iter().find(|c| c.probe == *probe && c.tier == *t) {
                Some(c) => {
                    let class = serde_json::to_value(c.verdict)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_default();
                    let label = shown(c);
                    out.push_str(&format!(
                        "<td class=\"{class}\" title=\"{}\">{}</td>",
                        escape(&c.evidence),
                        escape(label)
                    ));
                }
                None => out.push_str("<td></td>"),
            }
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</table>\n<details><summary>evidence</summary><ul>\n");
    for c in cells {
        out.push_str(&format!(
            "<li>{} on {}: {}: {}</li>\n",
            escape(c.probe),
            escape(&c.tier),
            escape(c.verdict.label()),
            escape(&c.evidence)
        ));
    }
    out.push_str("</ul></details></body></html>\n");
    out
}

fn escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c if c.is_control() && c != '\n' => o.push('\u{fffd}'),
            c => o.push(c),
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(probe: &'static str, tier: &str, verdict: Verdict, evidence: &str) -> Cell {
        Cell {
            probe,
            class: "k",
            tier: tier.into(),
            verdict,
            evidence: evidence.into(),
        }
    }

    #[test]
    fn the_matrix_has_a_row_per_probe_and_says_what_went_wrong() {
        let cells = vec![
            c("a", "none", Verdict::Allowed, "landed"),
            c("a", "landlock", Verdict::Leak, "x exists on the host"),
            c("a", "vm", Verdict::NotApplicable, "no image"),
            c("b", "none", Verdict::Inconclusive, "exit 1: nope"),
            c("b", "landlock", Verdict::Inconclusive, "control"),
            c("b", "vm", Verdict::NotApplicable, "no image"),
        ];
        let text = render(&cells);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].contains("none (control)") && lines[0].contains("landlock"));
        assert!(
            lines[1].starts_with("a ") && lines[1].contains("lands") && lines[1].contains("LEAK")
        );
        assert!(lines[2].starts_with("b ") && lines[2].contains("inconclusive"));
        assert!(
            text.contains("a on landlock: LEAK: x exists on the host"),
            "{text}"
        );
        assert!(
            text.contains("b on none: inconclusive: exit 1: nope"),
            "{text}"
        );
        assert_eq!(text.matches("vm: n/a: no image").count(), 1, "{text}");
        assert!(Verdict::Leak.is_bad() && Verdict::Failed.is_bad() && Verdict::Error.is_bad());
        assert!(!Verdict::Inconclusive.is_bad() && !Verdict::NotApplicable.is_bad());
    }

    #[test]
    fn the_html_page_is_self_contained_and_escapes_the_evidence() {
        let cells = vec![
            c("a", "none", Verdict::Allowed, "landed"),
            c(
                "a",
                "bwrap",
                Verdict::Denied,
                "<script>alert(1)</script> \"x\" & 'y'\u{1b}[2J",
            ),
        ];
        let page = render_html(&cells);
        assert!(page.starts_with("<!DOCTYPE html>") && page.ends_with("</html>\n"));
        assert!(
            page.contains("<th>none (control)</th><th>bwrap</th>"),
            "{page}"
        );
        assert!(page.contains("class=\"denied\""), "{page}");
        assert!(
            !page.contains("<script>") && !page.contains('\u{1b}'),
            "{page}"
        );
        assert!(
            page.contains("&lt;script&gt;alert(1)&lt;/script&gt; &quot;x&quot; &amp; &#39;y&#39;")
        );
        for external in ["src=", "href=", "http:", "https:", "@import", "url("] {
            assert!(!page.contains(external), "{external}: {page}");
        }
    }

    #[test]
    fn every_probe_has_a_distinct_id_and_both_kinds_exist() {
        let p = probes();
        let mut ids: Vec<&str> = p.iter().map(|p| p.id).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), p.len());
        assert!(p.iter().any(|p| p.kind == Kind::Positive));
        assert!(p.iter().filter(|p| p.kind == Kind::Attack).count() >= 8);
    }
}
