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

mod decoy;
mod probes;
mod render;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};

use serde::Serialize;

use crate::tier::Tier;
use decoy::Decoy;
pub use probes::{probes, Caller, Control, Kind, Others, Probe, When};
pub use render::{matrix_html, render, render_html, STYLE};

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
    #[error("canary: no probe is named {0:?} (`hull canary --list` names them)")]
    UnknownProbe(String),
    #[error("canary: interrupted; the decoy was removed")]
    Interrupted,
}

/// Refuses a probe id no probe has (before anything runs).
pub fn check_probe_ids(ids: &[String]) -> Result<(), CanaryError> {
    let known = probes();
    match ids
        .iter()
        .find(|id| !known.iter().any(|p| p.id == id.as_str()))
    {
        Some(unknown) => Err(CanaryError::UnknownProbe(unknown.clone())),
        None => Ok(()),
    }
}

/// Runs every probe under the control and on each of `tiers`, calling
/// `progress(i, n, probe, tier)` before each run. `stop` ends it early
/// (the decoy is removed either way).
pub fn run(
    tiers: &[Tier],
    only: &[String],
    stop: &AtomicBool,
    mut progress: impl FnMut(usize, usize, &str, &str),
) -> Result<Vec<Cell>, CanaryError> {
    check_probe_ids(only)?;
    let mut probes = probes();
    if !only.is_empty() {
        probes.retain(|p| only.iter().any(|o| o == p.id));
    }
    let exe = std::env::current_exe().map_err(|source| CanaryError::Spawn {
        exe: PathBuf::from("/proc/self/exe"),
        source,
    })?;
    let decoy = Decoy::new().map_err(|source| CanaryError::Decoy {
        path: std::env::temp_dir(),
        source,
    })?;
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
        // Held across the probe's runs: another canary's control changes
        // the same host setting.
        let _lock = p.host_lock.and_then(|path| {
            let f = std::fs::File::open(path).ok()?;
            rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive).ok()?;
            decoy.remember_host(path);
            Some(f)
        });
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
            if let Some(why) = (p.unavailable)(&decoy, tier) {
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
            if let (Tier::None, Control::FirstStep { why, .. }) = (tier, p.control) {
                cells.push(cell(p, &name, Verdict::NotApplicable, why.into()));
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
            decoy.reset(p.setup).map_err(|source| CanaryError::Decoy {
                path: decoy.root.clone(),
                source,
            })?;
            let script = (p.script)(&decoy, tier);
            let env = (p.env)(&decoy);
            let out = if tier == Tier::None && p.control_without_hull {
                run_bare(&decoy, p.caller, &script, &env)
            } else if let Some(others) = p.others {
                run_beside(&exe, &decoy, others, tier, &script, &env)
            } else {
                run_one(&exe, &decoy, p.caller, tier, &script, &env, &mut |_| {})
            };
            // Give the listeners' threads a moment to count a connection
            // (and a process that outlived the run, to act).
            std::thread::sleep(std::time::Duration::from_millis(20) + p.settle);
            let landed = out.as_ref().ok().and_then(|o| (p.landed)(&decoy, o));
            // Put back under the lock, also when the run could not start.
            decoy.restore_host();
            let out = out?;
            let hull_failed = out.status.code() == Some(crate::EXIT_HULL_FAILED);
            let first_step = p.first_step.map(|f| f(&out));
            let verdict = match (tier, p.kind, &landed) {
                (_, _, None) if hull_failed => Verdict::Error,
                (_, Kind::Attack, None) if first_step == Some(None) => Verdict::Inconclusive,
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
            let evidence = landed.unwrap_or_else(|| match first_step {
                Some(Some(did)) => format!("{did}; {}", summary(&out)),
                Some(None) => format!("the attack's first step did not work: {}", summary(&out)),
                None => summary(&out),
            });
            cells.push(cell(p, &name, verdict, evidence));
        }
        // The lock goes next: what another canary does to the setting from
        // now on is its own to put back.
        decoy.forget_host();
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

/// What tier 3 puts below a runs dir up to its agent socket:
/// `/<36-char run id>/vm-<pid up to 7 digits>/agent.sock`.
const RUN_SOCKET_TAIL: usize = 1 + 36 + 1 + 10 + 1 + 10;

/// A probe's control without hull: `sh -c script` in the decoy project.
fn run_bare(
    d: &Decoy,
    caller: Caller,
    script: &str,
    env: &[(String, String)],
) -> Result<Output, CanaryError> {
    let mut c = as_called(d, caller, Path::new("sh"));
    c.args(["-c", script])
        .current_dir(&d.project)
        .env("HOME", &d.home)
        .envs(env.iter().map(|(k, v)| (k, v)));
    collect(c, d, caller, Path::new("sh"), &mut |_| {})
}

/// `program`, started as `caller` says: with the decoy home as descriptor 3
/// (by a shell's redirection: `exec "$@" 3<"$0"`), or plainly.
fn as_called(d: &Decoy, caller: Caller, program: &Path) -> Command {
    match caller {
        Caller::Fd3Home => {
            let mut c = Command::new("sh");
            c.args(["-c", "exec \"$@\" 3<\"$0\""])
                .arg(&d.home)
                .arg(program);
            c
        }
        Caller::Plain | Caller::StdoutLog | Caller::KillsHull => Command::new(program),
    }
}

/// The probe's run, with the other runs it attacks (their own output is
/// not looked at: what they left on the host is).
fn run_beside(
    exe: &Path,
    d: &Decoy,
    others: Others,
    tier: Tier,
    script: &str,
    env: &[(String, String)],
) -> Result<Output, CanaryError> {
    let mut failed = None;
    let mut run_others = || {
        for i in 0..others.runs {
            let script = (others.script)(d, i);
            if let Err(e) = run_one(exe, d, Caller::Plain, tier, &script, &[], &mut |_| {}) {
                failed.get_or_insert(e);
            }
        }
    };
    let out = match others.when {
        When::Started => run_one(exe, d, Caller::Plain, tier, script, env, &mut |_| {
            run_others()
        })?,
        When::Ended => {
            let out = run_one(exe, d, Caller::Plain, tier, script, env, &mut |_| {})?;
            run_others();
            out
        }
    };
    failed.map_or(Ok(out), Err)
}

/// `hull run` of `script` on `tier` in the decoy; `at_start(pid)` is
/// called once the command printed [`probes::STARTED`].
fn run_one(
    exe: &Path,
    d: &Decoy,
    caller: Caller,
    tier: Tier,
    script: &str,
    env: &[(String, String)],
    at_start: &mut dyn FnMut(u32),
) -> Result<Output, CanaryError> {
    let mut c = as_called(d, caller, exe);
    c.args(["-q", "run"]);
    for (k, v) in env {
        c.arg("--env").arg(format!("{k}={v}"));
    }
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
        .current_dir(&d.project);
    // The decoy home; hull's own caches (the tier-3 image) stay where
    // they are.
    if let Some(cache) = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
    {
        c.env("XDG_CACHE_HOME", cache);
    }
    c.env("HOME", &d.home).env_remove("HULL_INSTANCE");
    // The runs go in the decoy (removed with it), unless its path leaves
    // too little of a unix socket path's 107 bytes for tier 3's sockets
    // below it (`<run id>/vm-<pid>/agent.sock`): then where hull's runs
    // go anyway.
    let runs = d.root.join("r");
    if runs.as_os_str().len() <= 107 - RUN_SOCKET_TAIL {
        c.env("HULL_RUNS_DIR", runs);
    }
    collect(c, d, caller, exe, at_start)
}

/// Reads `out` (the first 64 KiB kept) and calls `at_start(pid)` once
/// child `pid` has printed [`probes::STARTED`]; its output to the end.
fn watch_start(pid: u32, out: Option<impl Read>, at_start: &mut dyn FnMut(u32)) -> Vec<u8> {
    use std::io::BufRead;
    let mut kept = Vec::new();
    let Some(mut out) = out else {
        return kept;
    };
    let mut lines = std::io::BufReader::new(out.by_ref().take(64 * 1024));
    let mut line = Vec::new();
    let mut started = false;
    while lines.read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
        if !started && line.trim_ascii_end() == probes::STARTED.as_bytes() {
            at_start(pid);
            started = true;
        }
        kept.append(&mut line);
    }
    drop(lines);
    let _ = std::io::copy(&mut out, &mut std::io::sink());
    kept
}

/// Runs `c` and keeps the first 64 KiB of each of its streams (a probe's
/// output is small; the rest is read and dropped, so the command never
/// blocks on a full pipe). Its standard output is the caller's log when
/// `caller` says so, and what the log holds afterwards is its output.
fn collect(
    mut c: Command,
    d: &Decoy,
    caller: Caller,
    exe: &Path,
    at_start: &mut dyn FnMut(u32),
) -> Result<Output, CanaryError> {
    let spawn_err = |source| CanaryError::Spawn {
        exe: exe.to_path_buf(),
        source,
    };
    let log = d.root.join("caller.log");
    if caller == Caller::StdoutLog {
        let decoy_err = |source| CanaryError::Decoy {
            path: log.clone(),
            source,
        };
        std::fs::write(&log, probes::earlier_log(d)).map_err(decoy_err)?;
        let f = std::fs::OpenOptions::new()
            .append(true)
            .open(&log)
            .map_err(decoy_err)?;
        c.stdout(f);
    } else {
        c.stdout(Stdio::piped());
    }
    let mut child = c
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn_err)?;
    fn keep(s: Option<impl Read>) -> Vec<u8> {
        let mut v = Vec::new();
        if let Some(mut s) = s {
            let _ = s.by_ref().take(64 * 1024).read_to_end(&mut v);
            let _ = std::io::copy(&mut s, &mut std::io::sink());
        }
        v
    }
    let err = child.stderr.take();
    let err = std::thread::spawn(move || keep(err));
    let pid = child.id();
    let mut stdout = match caller {
        // SAFETY: kill(2) on our own child, not yet waited for (the pid
        // cannot have been reused).
        Caller::KillsHull => watch_start(pid, child.stdout.take(), &mut |pid| unsafe {
            libc::kill(pid as i32, libc::SIGKILL);
        }),
        _ => watch_start(pid, child.stdout.take(), at_start),
    };
    let stderr = err.join().unwrap_or_default();
    let status = child.wait().map_err(spawn_err)?;
    if caller == Caller::StdoutLog {
        stdout = std::fs::read(&log).unwrap_or_default();
        stdout.truncate(64 * 1024);
    }
    Ok(Output {
        status,
        stdout,
        stderr,
    })
}
