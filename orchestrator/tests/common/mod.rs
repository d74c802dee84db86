//! What the tier-3 test binaries share: a world (project, runs and VMs
//! dirs) that fails with `hull probe`'s reason when tier 3 is unavailable,
//! and lookups of the helpers a run started.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The hull under test: this build's, or `$HULL_BIN` (to show that a test
/// fails on an older build).
pub fn hull() -> PathBuf {
    std::env::var_os("HULL_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_hull")))
}

/// A world for one test; fails with the probe's reason when tier 3 is not
/// available here.
pub fn world() -> World {
    let out = Command::new(hull())
        .args(["probe", "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let p = v
        .as_array()
        .and_then(|a| a.iter().find(|p| p["tier"] == "vm"))
        .expect("hull probe lists tier vm");
    assert!(
        p["available"].as_bool() == Some(true),
        "tier 3 is unavailable here: {}. Build the image (hull image build), or build \
         the tests without the `tier3` feature to declare that this machine lacks tier 3",
        p["reason"]
    );
    World::new()
}

pub struct World {
    pub root: tempfile::TempDir,
    pub project: PathBuf,
}

impl World {
    pub fn new() -> World {
        // Short paths: unix sockets live under the runs and VMs dirs.
        let root = tempfile::Builder::new()
            .prefix("h3-")
            .tempdir_in("/tmp")
            .unwrap();
        let project = root.path().join("p");
        std::fs::create_dir_all(project.join(".git/hooks")).unwrap();
        std::fs::write(project.join(".git/config"), "[core]\n").unwrap();
        std::fs::write(project.join("input.txt"), "from the host\n").unwrap();
        World { root, project }
    }

    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(hull());
        c.args(args)
            .current_dir(&self.project)
            .env("HULL_RUNS_DIR", self.root.path().join("r"))
            .env("HULL_VMS_DIR", self.root.path().join("v"))
            .stdin(Stdio::null());
        c
    }

    /// `hull batch --tier3` of the `jobs` file into `out`, with `extra`
    /// options (`--pool`, `--json`).
    pub fn batch(&self, jobs: &Path, out: &Path, extra: &[&str]) -> Command {
        let mut args = vec!["batch", "--tier3", "--timeout", RUN_TIMEOUT];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--out", out.to_str().unwrap(), jobs.to_str().unwrap()]);
        self.cmd(&args)
    }

    pub fn run(&self, extra: &[&str], script: &str) -> Output {
        let mut args = vec!["run", "--tier3", "--timeout", RUN_TIMEOUT];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "sh", "-c", script]);
        self.cmd(&args).output().unwrap()
    }
}

/// True while `pid` runs (a zombie has ended; it only waits to be reaped).
pub fn running(pid: u64) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !matches!(
            s.rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().next()),
            Some("Z") | Some("X")
        ),
        Err(_) => false,
    }
}

/// Every `hull` call below carries a `--timeout` well inside the test
/// runner's 5 minutes for a tier-3 test (`.config/nextest.toml`), so a hang
/// ends as hull's error with its message, not as a kill without one.
/// A command's wall time:
pub const RUN_TIMEOUT: &str = "60s";
/// `hull vm up` until the VM is ready (a restore takes seconds):
pub const UP_TIMEOUT: &str = "150s";
/// `hull vm down` until it stopped cleanly:
pub const DOWN_TIMEOUT: &str = "30s";

/// The running processes of `w`'s runs (QEMU, virtiofsd: their sockets and
/// dirs lie under its root) whose command line holds `what`.
pub fn run_helpers(w: &World, what: &str) -> Vec<u64> {
    let marker = w.root.path().to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u64>().ok())
        .filter(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd);
            cmd.contains(&marker) && cmd.contains(what) && running(*pid)
        })
        .collect()
}

/// The reports `hull batch --json` printed, one JSON object a line.
pub fn batch_reports(stdout: &str) -> Vec<serde_json::Value> {
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The agent the runs use: `$HULL_AGENT`, else the one beside the binaries.
pub fn agent_path() -> PathBuf {
    std::env::var_os("HULL_AGENT")
        .map(PathBuf::from)
        .unwrap_or_else(|| hull().with_file_name("hull-agent"))
}

/// A `hull vm up` VM that is taken down when dropped, also when the test
/// fails half-way (else it would idle on for its `--idle` time).
pub struct KeptVm<'a> {
    w: &'a World,
    pub name: String,
}

impl<'a> KeptVm<'a> {
    /// `hull vm up --name NAME` with `extra` arguments; fails the test when
    /// it does not come up.
    pub fn up(w: &'a World, name: &str, extra: &[&str]) -> KeptVm<'a> {
        let mut args = vec!["vm", "up", "--name", name, "--idle", "10m"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--timeout", UP_TIMEOUT]);
        let up = w.cmd(&args).output().unwrap();
        let vm = KeptVm {
            w,
            name: name.to_string(),
        };
        assert!(
            up.status.success(),
            "vm up: {} {}",
            text(&up.stdout),
            text(&up.stderr)
        );
        vm
    }
}

impl Drop for KeptVm<'_> {
    fn drop(&mut self) {
        let _ = self
            .w
            .cmd(&[
                "vm",
                "down",
                "--name",
                &self.name,
                "--timeout",
                DOWN_TIMEOUT,
            ])
            .output();
    }
}
