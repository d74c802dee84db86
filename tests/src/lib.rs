#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]
// The escape matrix and the end-to-end tests drive the Linux tiers (bubblewrap,
// Landlock, tier 3 on QEMU): off Linux this crate is empty, and type-checks.
#![cfg(target_os = "linux")]
// Test support code: a failed expectation is a failed test.
//! Helpers for the escape matrix and end-to-end tests: run the real `hull`
//! binary on a tier, in a scratch project with a fake home and canaries.
//!
//! Tiers under test are chosen at compile time by this crate's features
//! (`landlock`, `bwrap` by default; `tier3` adds the VM). A compiled-in tier
//! that this host cannot run fails every test with the probe's reason: a
//! machine without a capability says so by building without the feature,
//! never by a test that passes without running.

pub mod nobody;
pub mod registry;
pub mod slurm;
pub mod workloads;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The `hull` binary of this workspace (built by `cargo build` / `cargo test --workspace`).
pub fn hull_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("HULL_BIN") {
        return PathBuf::from(p);
    }
    // target/<profile>/deps/<test> -> target/<profile>/hull
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test binary lives in target/<profile>/deps");
    let bin = dir.join("hull");
    assert!(
        bin.exists(),
        "{} not found: run `cargo build -p hull` first (or set HULL_BIN)",
        bin.display()
    );
    bin
}

/// Fails with the probe's reason unless `tier` is available on this host.
pub fn require_tier(tier: &str) {
    let out = Command::new(hull_bin())
        .args(["probe", "--json", "--tier", tier])
        .output()
        .expect("run hull probe");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("probe json");
    let p = v
        .as_array()
        .and_then(|a| a.iter().find(|p| p["tier"] == tier))
        .unwrap_or_else(|| panic!("hull probe lists no tier {tier}"));
    assert!(
        p["available"].as_bool() == Some(true),
        "tier {tier} is compiled into this test run but unavailable here: {}. \
         Build the tests without its feature to declare this machine lacks it.",
        p["reason"]
    );
}

/// A scratch world for one test: a project, a fake home with a canary key,
/// an outside directory with a victim file, and a private runs dir.
#[derive(Debug)]
pub struct World {
    pub root: tempfile::TempDir,
    pub project: PathBuf,
    pub home: PathBuf,
    pub outside: PathBuf,
    pub runs: PathBuf,
}

/// The `--timeout` of every `hull run` a test makes: well below the test
/// runner's limit (`.config/nextest.toml`: 60 s a native test, 5 min a
/// tier-3 one), above any command a test runs to completion.
pub const RUN_TIMEOUT: &str = "45s";

pub const CANARY: &str = "CANARY-PRIVATE-KEY-7f3a9c";
pub const VICTIM: &str = "victim-original-contents";

impl World {
    pub fn new() -> World {
        // Not under /tmp/hull-runs; a plain temp dir on the host.
        let root = tempfile::Builder::new()
            .prefix("hull-test-")
            .tempdir_in(std::env::temp_dir())
            .expect("tempdir");
        // A private parent, as a home directory is: the command must work in
        // a project it could not reach by path as an unprivileged uid.
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o700))
                .expect("chmod 0700");
        }
        let project = root.path().join("project");
        let home = root.path().join("home");
        let outside = root.path().join("outside");
        let runs = root.path().join("runs");
        for d in [&project, &home.join(".ssh"), &outside, &runs] {
            std::fs::create_dir_all(d).expect("mkdir");
        }
        std::fs::create_dir_all(project.join("src")).expect("mkdir src");
        std::fs::write(project.join("src/main.txt"), "project-file\n").expect("write");
        std::fs::write(home.join(".ssh/id_ed25519"), CANARY).expect("write canary");
        std::fs::write(outside.join("victim"), VICTIM).expect("write victim");
        World {
            root,
            project,
            home,
            outside,
            runs,
        }
    }

    /// `git init` in the project (on the host, before the sandbox).
    pub fn git_init(&self) {
        let st = Command::new("git")
            .args(["init", "-q"])
            .current_dir(&self.project)
            .status()
            .expect("git");
        assert!(st.success());
    }

    /// A `hull run` command for `tier` running `sh -c script` in the project.
    /// It carries [`RUN_TIMEOUT`] unless `extra` names its own `--timeout`,
    /// so a hung command ends as hull's exit 124 with its message, before
    /// the test runner's own limit kills the test without one.
    pub fn cmd(&self, tier: &str, extra: &[&str], script: &str) -> Command {
        let mut c = self.hull();
        c.arg("run");
        if tier == "vm" {
            c.arg("--tier3");
        } else {
            c.args(["--tier", tier]);
        }
        c.arg("--project").arg(&self.project);
        if !extra.contains(&"--timeout") {
            c.args(["--timeout", RUN_TIMEOUT]);
        }
        c.args(extra);
        c.args(["--", "sh", "-c", script]);
        c
    }

    /// `hull` with this world's environment: its home, runs and VMs dirs.
    pub fn hull(&self) -> Command {
        let mut c = Command::new(hull_bin());
        self.hull_env(&mut c);
        c
    }

    /// Gives `c` (`hull`, or a program that starts it) this world's
    /// environment for hull.
    pub fn hull_env(&self, c: &mut Command) {
        // The fake home must not hide hull's own caches (the tier-3 image).
        let cache = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")));
        if let Some(cache) = cache {
            c.env("XDG_CACHE_HOME", cache);
        }
        c.env("HOME", &self.home)
            .env("HULL_RUNS_DIR", &self.runs)
            .env("HULL_VMS_DIR", self.root.path().join("vms"))
            .env("HULL_CHANGES_DIR", self.root.path().join("changes"))
            .env("HULL_TEST_SECRET", "s3cr3t-host-env-value")
            .env_remove("HULL_INSTANCE");
    }

    /// Runs to completion with empty stdin.
    pub fn run(&self, tier: &str, extra: &[&str], script: &str) -> Output {
        self.cmd(tier, extra, script)
            .stdin(Stdio::null())
            .output()
            .expect("spawn hull")
    }

    pub fn read(&self, p: &Path) -> String {
        std::fs::read_to_string(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
    }
}

impl Default for World {
    fn default() -> Self {
        World::new()
    }
}

/// Output as text, for assertion messages.
/// Runs the fixture that writes container images
/// (`fixtures/container-image/make.py ARGS...`), failing the test with
/// what it said when it fails.
pub fn make_image(args: &[&str]) {
    let o = Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fixtures/container-image/make.py"
        ))
        .args(args)
        .output()
        .expect("python3 fixtures/container-image/make.py");
    assert!(o.status.success(), "make.py {args:?}: {}", show(&o));
}

pub fn show(o: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Writes `data` to a child's stdin and closes it.
pub fn feed(child: &mut std::process::Child, data: &[u8]) {
    let mut s = child.stdin.take().expect("piped stdin");
    s.write_all(data).expect("write stdin");
}

/// Pids whose command line contains `marker`.
pub fn pids_with(marker: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) {
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if cmd.contains(marker) && !cmd.contains("pids_with") {
                if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
                    let state = stat
                        .rsplit_once(')')
                        .map(|(_, r)| r.trim_start().chars().next());
                    if state == Some(Some('Z')) {
                        continue;
                    }
                }
                out.push(pid);
            }
        }
    }
    out
}

/// Spawns `cmd` (a `hull run` whose script prints `started` first) with
/// empty stdin and piped stdout, and returns once that line came; a run that
/// prints anything else first is killed and fails the test.
pub fn started(mut cmd: Command) -> std::process::Child {
    let mut c = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn hull");
    let mut line = String::new();
    let _ = std::io::BufRead::read_line(
        &mut std::io::BufReader::new(c.stdout.take().expect("stdout")),
        &mut line,
    );
    if line != "started\n" {
        let _ = c.kill();
        let _ = c.wait();
        panic!("the run did not start: first line {line:?}");
    }
    c
}

/// A shell command that sleeps `secs` in a process whose command line
/// holds `marker`: `sh -c 'sleep N; :' "MARK""ER"` (the trailing `:` keeps
/// the shell from exec'ing sleep, and dash has no `exec -a`). The marker is
/// written in two quoted halves, so the script that holds this command (and
/// hull's own command line, which holds the script) never contains it.
pub fn marked_sleep(marker: &str, secs: u32) -> String {
    let mid = marker.len() / 2;
    let (a, b) = marker.split_at(mid);
    format!("sh -c 'sleep {secs}; :' \"{a}\"\"{b}\"")
}

/// Where a run's process tree lives, to look for what it left behind: the
/// host, or on tier 3 the container of a VM kept by `hull vm up`. A
/// one-shot tier-3 run's VM dies with the run, taking every process of the
/// guest along, and guest processes never show in the host's `/proc`: only
/// a kept VM's container, which serves the next run, can hold what a run
/// left, and only a command in it can see them. Runs in a kept VM take
/// turns, so on tier 3 a run's own processes are seen by the run itself
/// ([`Tree::announce`]), and what it left by the next run.
#[derive(Debug)]
pub struct Tree<'a> {
    w: &'a World,
    tier: String,
    vm: Option<KeptVm<'a>>,
}

impl<'a> Tree<'a> {
    /// For tier 3, brings a VM up for the world's project and policy, and
    /// shows (the control) that a process in its container is seen.
    pub fn new(w: &'a World, tier: &str) -> Tree<'a> {
        let mut t = Tree {
            w,
            tier: tier.to_string(),
            vm: None,
        };
        if tier != "vm" {
            return t;
        }
        let vm = KeptVm::new(w, "esc");
        vm.up(&w.project);
        t.vm = Some(vm);
        // The control: a marked process a run started is seen by the
        // listing, in the VM's container.
        let marker = format!("hull-tree-probe-{}", std::process::id());
        let o = w.run(
            tier,
            &t.extra(),
            &format!(
                "({} &); sleep 1; {}",
                marked_sleep(&marker, 30),
                Self::list_script(&marker)
            ),
        );
        assert!(
            String::from_utf8_lossy(&o.stdout).contains("sleep"),
            "control: a live process in the VM's container is not seen: {}",
            show(&o)
        );
        t
    }

    /// The line of a run's script that says `started` once its marked
    /// processes run: on the host, where the test then looks
    /// ([`Tree::appears`]); on tier 3, once the run itself lists every
    /// one of `markers` (within 10 s; else it says which it did not see,
    /// and [`started`] fails on that line).
    pub fn announce(&self, markers: &[&str]) -> String {
        if self.vm.is_none() {
            return "echo started".into();
        }
        let mut s = String::new();
        for m in markers {
            s.push_str(&format!(
                "i=0; until [ -n \"$({})\" ]; do i=$((i+1)); \
                 if [ $i -gt 100 ]; then echo 'not seen: {}'; exit 3; fi; sleep 0.1; done; ",
                Self::list_script(m),
                // The marker in halves, as in the command lines.
                m.split_at(m.len() / 2).0
            ));
        }
        s.push_str("echo started");
        s
    }

    /// The live processes whose command line holds `marker`, now: host
    /// pids, or on tier 3 the lines a command in the VM's container printed.
    pub fn now(&self, marker: &str) -> Vec<String> {
        if self.vm.is_none() {
            return pids_with(marker).iter().map(|p| p.to_string()).collect();
        }
        let o = self
            .w
            .run(&self.tier, &self.extra(), &Self::list_script(marker));
        assert_eq!(
            o.status.code(),
            Some(0),
            "listing the container's processes: {}",
            show(&o)
        );
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// The arguments that make a run use this tree's place.
    pub fn extra(&self) -> Vec<&str> {
        match &self.vm {
            Some(vm) => vec!["--vm", vm.name.as_str()],
            None => Vec::new(),
        }
    }

    /// A shell loop printing `PID/task/TID CMDLINE` of each live thread
    /// whose command line holds `marker` (threads, so a process whose main
    /// thread exited is seen through the others); its own command line
    /// holds the marker with its first letter bracketed, which the pattern
    /// does not match.
    fn list_script(marker: &str) -> String {
        let mut c = marker.chars();
        let first = c.next().unwrap_or('x');
        let pattern = format!("*[{first}]{}*", c.as_str());
        format!(
            "for p in /proc/[0-9]*/task/[0-9]*; do read -r s < $p/stat 2>/dev/null || continue; \
             case \"$s\" in *') Z '*) continue;; esac; \
             c=$(tr '\\0' ' ' < $p/cmdline 2>/dev/null); \
             case \"$c\" in {pattern}) echo \"${{p#/proc/}} $c\";; esac; done"
        )
    }

    /// The live processes whose command line holds `marker`, once there is
    /// one or after 10 s (a control: the process to be killed runs). On
    /// tier 3 the run listed them itself before it said `started`
    /// ([`Tree::announce`]): another run would wait for its turn.
    pub fn appears(&self, marker: &str) -> Vec<String> {
        if self.vm.is_some() {
            return vec![format!("{marker}: listed by the run itself")];
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let found = self.now(marker);
            if !found.is_empty() || Instant::now() >= deadline {
                return found;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The live processes whose command line holds `marker`, once none is
    /// left or after 10 s: host pids, or on tier 3 the lines a command in
    /// the VM's container printed.
    pub fn left(&self, marker: &str) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let found = self.now(marker);
            if found.is_empty() || Instant::now() >= deadline {
                return found;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// A VM kept up by `hull vm up` for the test, taken down when it ends.
#[derive(Debug)]
pub struct KeptVm<'a> {
    w: &'a World,
    pub name: String,
}

impl<'a> KeptVm<'a> {
    pub fn new(w: &'a World, prefix: &str) -> KeptVm<'a> {
        KeptVm {
            w,
            name: format!("{prefix}{}", std::process::id()),
        }
    }

    pub fn hull(&self, args: &[&str]) -> std::process::Output {
        let o = self
            .w
            .hull()
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("spawn hull");
        assert_eq!(o.status.code(), Some(0), "hull {args:?}: {}", show(&o));
        o
    }

    pub fn up(&self, project: &Path) {
        self.hull(&[
            "vm",
            "up",
            "--name",
            &self.name,
            "--idle",
            "10m",
            "--project",
            project.to_str().unwrap(),
            "--timeout",
            "150s",
        ]);
    }

    /// `hull run --vm` of `sh -c script` in `project`, with `env`.
    pub fn cmd(&self, project: &Path, env: &[&str], script: &str) -> Command {
        let mut c = self.w.hull();
        c.args(["run", "--vm", &self.name, "--project"])
            .arg(project)
            .args(["--timeout", "60s"]);
        for e in env {
            c.args(["--env", e]);
        }
        c.args(["--", "sh", "-c", script]);
        c
    }

    pub fn run(&self, project: &Path, script: &str) -> std::process::Output {
        let o = self
            .cmd(project, &[], script)
            .stdin(Stdio::null())
            .output()
            .expect("spawn hull run");
        assert_eq!(o.status.code(), Some(0), "{}", show(&o));
        o
    }

    pub fn down(&self) {
        self.hull(&["vm", "down", "--name", &self.name]);
    }

    /// The VM's tmp on the host (its runs' tmps are made in it).
    pub fn tmp(&self) -> PathBuf {
        self.w.root.path().join("vms").join(&self.name).join("tmp")
    }
}

impl Drop for KeptVm<'_> {
    fn drop(&mut self) {
        let _ = self
            .w
            .hull()
            .args(["vm", "down", "--name", &self.name, "--timeout", "30s"])
            .stdin(Stdio::null())
            .output();
    }
}

/// `cp -a from/. to/` (`to` is created).
pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    let st = Command::new("cp")
        .arg("-a")
        .arg(from.join("."))
        .arg(to)
        .status()
        .expect("cp");
    assert!(st.success(), "cp -a {} {}", from.display(), to.display());
}

/// The host's Rust toolchain: rustup's home and cargo's home (with the
/// proxies in `bin/`), from the environment cargo ran the tests in, else
/// below `$HOME`.
pub fn host_rust() -> (PathBuf, PathBuf) {
    let home = PathBuf::from(std::env::var_os("HOME").expect("HOME"));
    let rustup = std::env::var_os("RUSTUP_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| home.join(".rustup"));
    let cargo = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| home.join(".cargo"));
    assert!(
        rustup.join("toolchains").is_dir() && cargo.join("bin/cargo").exists(),
        "no rustup toolchain at {} with proxies in {}/bin (the tests were built with one)",
        rustup.display(),
        cargo.display()
    );
    (rustup, cargo)
}

/// The DOM headless Chromium (Debian's `chromium`, installed by
/// `scripts/setup.sh --test`) renders from the page `page`, its profile
/// and home in `scratch`; a run that fails fails the test, naming why.
pub fn chromium_dom(page: &Path, scratch: &Path) -> String {
    let chromium = ["chromium", "chromium-browser"]
        .into_iter()
        .find(|c| {
            Command::new(c)
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .expect("chromium is not installed: scripts/setup.sh --test installs it");
    let profile = scratch.join("chromium-profile");
    let url = format!("file://{}", page.display());
    let r = Command::new("timeout")
        .arg("60")
        .arg(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(["--dump-dom", &url])
        .env("HOME", scratch)
        .stdin(Stdio::null())
        .output()
        .expect("spawn chromium");
    assert!(r.status.success(), "{}", show(&r));
    String::from_utf8_lossy(&r.stdout).into_owned()
}
