//! Tier 3 end to end with the real guest image: `hull run --tier3` and the
//! VMs `hull vm up` keeps. They need QEMU, virtiofsd and a built image
//! (`hull image build`), and are built with the `tier3` feature only (the
//! machine declares it has them); a missing piece fails the test with
//! `hull probe`'s reason.
#![cfg(all(target_os = "linux", feature = "tier3"))]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::process::Stdio;

use common::*;

#[test]
fn run_tier3_streams_output_keeps_exit_codes_and_enforces_the_policy() {
    let w = world();
    let out = w.run(
        &[],
        "cat input.txt; id -u; echo made > made.txt; \
         (echo evil >> .git/config) 2>/dev/null && echo GIT-WRITTEN; \
         (touch .git/hooks/pre-commit) 2>/dev/null && echo HOOK-WRITTEN; \
         (echo x > \"$HULL_SPILL/x\") 2>/dev/null && echo SPILL-WRITTEN; \
         ls /sys/class/net | grep -vx lo | grep . && echo HAS-NIC; \
         ls /dev/kvm 2>/dev/null && echo HAS-KVM; \
         echo to-stderr >&2; exit 7",
    );
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(7),
        "stdout {stdout} stderr {}",
        text(&out.stderr)
    );
    assert!(stdout.starts_with("from the host\n1000\n"), "{stdout}");
    for bad in [
        "GIT-WRITTEN",
        "HOOK-WRITTEN",
        "SPILL-WRITTEN",
        "HAS-NIC",
        "HAS-KVM",
    ] {
        assert!(!stdout.contains(bad), "{bad}: {stdout}");
    }
    assert!(text(&out.stderr).contains("to-stderr"));
    assert_eq!(
        std::fs::read_to_string(w.project.join("made.txt")).unwrap(),
        "made\n"
    );
    assert_eq!(
        std::fs::read_to_string(w.project.join(".git/config")).unwrap(),
        "[core]\n"
    );
    assert!(!w.project.join(".git/hooks/pre-commit").exists());
    // The placeholder of the hidden .hull went with the run; a guest
    // write into it would have kept it (non-empty directories stay).
    assert!(
        !w.project.join(".hull").exists(),
        "the placeholder .hull is left behind (or the guest wrote into it)"
    );
}

#[test]
fn a_warm_vm_serves_runs_until_it_is_taken_down() {
    let w = world();
    let name = format!("t{}", std::process::id());
    let up = w
        .cmd(&[
            "vm",
            "up",
            "--name",
            &name,
            "--idle",
            "10m",
            "--timeout",
            UP_TIMEOUT,
        ])
        .output()
        .unwrap();
    assert!(
        up.status.success(),
        "vm up: {} {}",
        text(&up.stdout),
        text(&up.stderr)
    );

    // Two runs in the same container: the same VM (its boot), the project
    // shared, and nothing of the first run's scratch for the second.
    let a = w.run(
        &["--vm", &name],
        "echo first > /var/tmp/marker; cat /proc/sys/kernel/random/boot_id",
    );
    assert_eq!(a.status.code(), Some(0), "{}", text(&a.stderr));
    let b = w.run(
        &["--vm", &name],
        "cat /proc/sys/kernel/random/boot_id; cat /var/tmp/marker 2>/dev/null || echo none; \
         cat input.txt",
    );
    assert_eq!(
        text(&b.stdout),
        format!("{}none\nfrom the host\n", text(&a.stdout)),
        "{}",
        text(&b.stderr)
    );

    // Another policy means other shares: refused, nothing run.
    let c = w.run(&["--vm", &name, "--policy", "readonly"], "echo RAN");
    assert_eq!(c.status.code(), Some(125));
    assert!(!text(&c.stdout).contains("RAN"));
    assert!(
        text(&c.stderr).contains("other shares"),
        "{}",
        text(&c.stderr)
    );

    let me = vm_status(&w, &name);
    assert_eq!(me["up"], true);
    let pid = me["state"]["pid"].as_u64().unwrap();

    let down = w
        .cmd(&["vm", "down", "--name", &name, "--timeout", DOWN_TIMEOUT])
        .output()
        .unwrap();
    assert!(down.status.success(), "{}", text(&down.stderr));
    assert!(!running(pid), "supervisor {pid} still runs");
    let d = w.run(&["--vm", &name], "echo RAN");
    assert_eq!(d.status.code(), Some(125));
    assert!(
        text(&d.stderr).contains("no VM named"),
        "{}",
        text(&d.stderr)
    );
}

/// The console logs of the runs, kept in each instance's `logs/`. Asserts
/// none is in a spill, which the guest can read.
fn console_logs(w: &World) -> Vec<String> {
    let mut out = Vec::new();
    let runs = w.root.path().join("r");
    for inst in std::fs::read_dir(&runs).into_iter().flatten().flatten() {
        let spill = inst.path().join("spill");
        for e in std::fs::read_dir(&spill).into_iter().flatten().flatten() {
            assert!(
                !e.path().join("console.log").exists() && e.file_name() != "console.log",
                "a console log in the guest-visible spill: {}",
                e.path().display()
            );
        }
        let logs = inst.path().join("logs");
        for vm in std::fs::read_dir(&logs).into_iter().flatten().flatten() {
            if let Ok(t) = std::fs::read_to_string(vm.path().join("console.log")) {
                out.push(t);
            }
        }
    }
    out
}

/// Whether every run of `w` so far was restored from a snapshot (no boot
/// milestone on any console, no "booting instead" from hull).
fn all_restored(w: &World, outs: &[&std::process::Output]) {
    for out in outs {
        assert!(
            !text(&out.stderr).contains("booting the guest instead"),
            "{}",
            text(&out.stderr)
        );
    }
    let logs = console_logs(w);
    assert_eq!(logs.len(), outs.len(), "one console log per run");
    for l in &logs {
        assert!(l.contains("host handshake done"), "{l}");
        assert!(!l.contains("mounts done"), "the VM booted:\n{l}");
    }
}

#[test]
fn every_run_restores_the_snapshot_into_a_fresh_container() {
    let w = world();
    let script = "cat /var/tmp/marker 2>/dev/null && echo STALE; echo seen > /var/tmp/marker; \
                  date +%s; head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo; \
                  echo $$ >> runs.txt";
    let a = w.run(&[], script);
    let b = w.run(&[], script);
    let (sa, sb) = (text(&a.stdout), text(&b.stdout));
    assert_eq!(a.status.code(), Some(0), "{sa} {}", text(&a.stderr));
    assert_eq!(b.status.code(), Some(0), "{sb} {}", text(&b.stderr));
    // Nothing of run a reaches run b: a new container, a new disk overlay.
    assert!(!sb.contains("STALE"), "{sb}");
    // Both wrote to the project, and it landed.
    let runs = std::fs::read_to_string(w.project.join("runs.txt")).unwrap();
    assert_eq!(runs.lines().count(), 2, "{runs}");
    // The guest clock was set after the restore (it is frozen in the snapshot).
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    for s in [&sa, &sb] {
        let t: i64 = s.lines().next().unwrap().trim().parse().unwrap();
        assert!((now - t).abs() < 60, "guest clock {t}, host {now}");
    }
    // Two restores of one snapshot do not share random state.
    let ra = sa.lines().nth(1).unwrap();
    let rb = sb.lines().nth(1).unwrap();
    assert_eq!(ra.len(), 32, "{sa}");
    assert_ne!(ra, rb);
    // They were restored, not booted: no boot milestone on their consoles.
    all_restored(&w, &[&a, &b]);
}

#[test]
fn the_boot_path_still_works_when_snapshots_are_off() {
    let w = world();
    // Limits reach the container one way on both paths: the same cgroup
    // values after a boot as after a restore (once, a boot gave Incus a
    // CPU count to pin, a restore a CPU-time quota).
    let policy = w.root.path().join("limits.toml");
    std::fs::write(
        &policy,
        "version = 1\n[fs]\nread_exec = [\"/usr\", \"/bin\", \"/lib\", \"/lib64\"]\nread = [\"/etc\"]\n\
         read_write = [\"${PROJECT}\"]\n[limits]\nmemory = \"256MiB\"\npids = 48\ncpus = 1\n",
    )
    .unwrap();
    let script = "cat input.txt; echo b > boot.txt; \
                  cd /sys/fs/cgroup && cat cpu.max pids.max memory.max memory.swap.max";
    let run = |snapshot: &str| {
        w.cmd(&[
            "run",
            "--tier3",
            "--timeout",
            RUN_TIMEOUT,
            "--policy",
            policy.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            script,
        ])
        .env("HULL_VM_SNAPSHOT", snapshot)
        // The boot and setup deadlines (300 s each under TCG by default)
        // end inside the test's 5 minutes: a wedged boot is hull's error.
        .env("HULL_VM_BOOT_TIMEOUT", "130")
        .output()
        .unwrap()
    };
    let limits = "100000 100000\n48\n268435456\n0\n";
    let out = run("off");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), format!("from the host\n{limits}"));
    assert_eq!(
        std::fs::read_to_string(w.project.join("boot.txt")).unwrap(),
        "b\n"
    );
    let logs = console_logs(&w);
    assert!(
        logs.iter().any(|l| l.contains("mounts done")),
        "not booted: {logs:?}"
    );
    let restored = run("on");
    assert_eq!(
        restored.status.code(),
        Some(0),
        "{}",
        text(&restored.stderr)
    );
    assert_eq!(text(&restored.stdout), format!("from the host\n{limits}"));
}

#[test]
fn batch_runs_each_job_in_its_own_restored_vm() {
    let w = world();
    let jobs = w.root.path().join("jobs.txt");
    std::fs::write(
        &jobs,
        "# three jobs, each must see a pristine container\n\
         test -e /var/tmp/m && echo STALE; touch /var/tmp/m; echo one > j1.txt; echo out-1\n\
         \n\
         test -e /var/tmp/m && echo STALE; touch /var/tmp/m; echo two > j2.txt; echo out-2; exit 3\n\
         test -e /var/tmp/m && echo STALE; touch /var/tmp/m; (echo x >> .git/config) 2>/dev/null && echo GIT; echo out-3\n",
    )
    .unwrap();
    let out_dir = w.root.path().join("out");
    let out = w
        .batch(&jobs, &out_dir, &["--pool", "2", "--json"])
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    // One job exited 3: the batch says so.
    assert_eq!(out.status.code(), Some(1), "{stdout} {}", text(&out.stderr));
    let reports = batch_reports(&stdout);
    assert_eq!(reports.len(), 3, "{stdout}");
    let by_line = |n: u64| reports.iter().find(|r| r["line"] == n).unwrap();
    assert_eq!(by_line(2)["exit_code"], 0, "{stdout}");
    assert_eq!(by_line(4)["exit_code"], 3, "{stdout}");
    assert_eq!(by_line(5)["exit_code"], 0, "{stdout}");
    let instances: std::collections::HashSet<String> = reports
        .iter()
        .map(|r| r["instance"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(instances.len(), 3, "one instance per job: {stdout}");
    for (line, want) in [(2, "out-1\n"), (4, "out-2\n"), (5, "out-3\n")] {
        let got = std::fs::read_to_string(out_dir.join(format!("job-{line}.stdout"))).unwrap();
        assert_eq!(got, want, "job {line}");
    }
    assert_eq!(
        std::fs::read_to_string(w.project.join("j1.txt")).unwrap(),
        "one\n"
    );
    assert_eq!(
        std::fs::read_to_string(w.project.join("j2.txt")).unwrap(),
        "two\n"
    );
    assert_eq!(
        std::fs::read_to_string(w.project.join(".git/config")).unwrap(),
        "[core]\n"
    );
}

/// `hull vm status --json`'s entry for VM `name`.
fn vm_status(w: &World, name: &str) -> serde_json::Value {
    let st = w.cmd(&["vm", "status", "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .find(|x| x["name"] == name)
        .unwrap_or_else(|| panic!("no VM {name} in {v}"))
        .clone()
}

/// A loopback origin answering `hello` and reporting each request's path.
struct Origin {
    child: std::process::Child,
    seen: std::io::BufReader<std::process::ChildStdout>,
    port: u16,
}

impl Origin {
    fn start() -> Origin {
        use std::io::BufRead;
        let mut child = std::process::Command::new("python3")
            .arg("-uc")
            .arg(
                "import http.server\n\
                 class H(http.server.BaseHTTPRequestHandler):\n\
                 \x20   def do_GET(self):\n\
                 \x20       print(self.path, flush=True)\n\
                 \x20       b = b'hello\\n'; self.send_response(200); self.send_header('content-length', str(len(b))); self.end_headers(); self.wfile.write(b)\n\
                 \x20   def log_message(self, *a): pass\n\
                 s = http.server.ThreadingHTTPServer(('127.0.0.1', 0), H)\n\
                 print(s.server_address[1], flush=True)\n\
                 s.serve_forever()\n",
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut seen = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        seen.read_line(&mut line).unwrap();
        let port = line.trim().parse().unwrap();
        Origin { child, seen, port }
    }

    /// Ends the origin and returns the paths it was asked for.
    fn seen(mut self) -> String {
        use std::io::Read;
        let _ = self.child.kill();
        let _ = self.child.wait();
        let mut rest = String::new();
        let _ = self.seen.read_to_string(&mut rest);
        rest
    }
}

/// A policy file in the world's root: the system, the project writable,
/// and `net` (a `[net]` section, or nothing).
fn net_policy(w: &World, file: &str, net: &str) -> std::path::PathBuf {
    let p = w.root.path().join(file);
    std::fs::write(
        &p,
        format!(
            "version = 1\n[fs]\nread_exec = [\"/usr\", \"/bin\", \"/lib\", \"/lib64\", \"/etc\"]\n\
             read_write = [\"${{PROJECT}}\"]\n{net}"
        ),
    )
    .unwrap();
    p
}

/// `[net]` allowing `name` on `port`, with pkgs.test and other.test fixed
/// to 127.0.0.1 (reachable through allow_private).
fn allow_only(name: &str, port: u16) -> String {
    format!(
        "[net]\nmode = \"allowlist\"\nallow = [\"{name}\"]\nports = [{port}]\n\
         hosts = {{ \"pkgs.test\" = \"127.0.0.1\", \"other.test\" = \"127.0.0.1\" }}\n\
         allow_private = [\"127.0.0.1/32\"]\n"
    )
}

/// `allowed.py` and `refused.py` in the project: each fetches a path of the
/// origin's through the proxy and prints the body, or the refusal's code
/// and whether hull's header is there.
fn fetch_scripts(w: &World, port: u16) {
    let fetch = |host: &str, path: &str| {
        format!(
            "import urllib.request as u, urllib.error as e\n\
             try:\n\
             \x20   print(u.urlopen('http://{host}:{port}/{path}').read().decode(), end='')\n\
             except e.HTTPError as x:\n\
             \x20   print(x.code, x.headers.get('X-Hull-Refused') is not None)\n"
        )
    };
    std::fs::write(w.project.join("allowed.py"), fetch("pkgs.test", "a")).unwrap();
    std::fs::write(w.project.join("refused.py"), fetch("other.test", "b")).unwrap();
}

/// `hull batch` with an allow list: each job's VM gets a proxy of its own
/// for the policy. An allowed name is reached from a job, a name not
/// allowed gets the proxy's 403 in another, the origin sees only the
/// allowed request, and hull names the refused host.
#[test]
fn batch_jobs_reach_allowed_names_through_a_proxy_each() {
    let w = world();
    let origin = Origin::start();
    let port = origin.port;
    let policy = net_policy(&w, "net.toml", &allow_only("pkgs.test", port));
    fetch_scripts(&w, port);
    let jobs = w.root.path().join("jobs.txt");
    std::fs::write(&jobs, "python3 allowed.py\npython3 refused.py\n").unwrap();
    let out_dir = w.root.path().join("out");
    let out = w
        .batch(
            &jobs,
            &out_dir,
            &[
                "--pool",
                "2",
                "--json",
                "--policy",
                policy.to_str().unwrap(),
            ],
        )
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout} {}", text(&out.stderr));
    let reports = batch_reports(&stdout);
    assert_eq!(reports.len(), 2, "{stdout}");
    for (line, want) in [(1, "hello\n"), (2, "403 True\n")] {
        let got = std::fs::read_to_string(out_dir.join(format!("job-{line}.stdout"))).unwrap();
        assert_eq!(got, want, "job {line}: {stdout} {}", text(&out.stderr));
    }
    assert!(
        text(&out.stderr).contains(&format!("network: refused other.test:{port} (1 time)")),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(origin.seen(), "/a\n", "what the origin saw");
}

/// A VM kept up with an allow list: its proxy (the VM's, for its policy)
/// serves the runs that join it with the same policy: an allowed name is
/// reached, another refused, both in the audit of the VM's spill. A run
/// whose policy allows another name, or has no network, is refused before
/// it runs. The proxy ends with the VM.
#[test]
fn a_kept_vm_with_an_allow_list_serves_runs_with_that_allow_list_only() {
    let w = world();
    let origin = Origin::start();
    let port = origin.port;
    let pol = net_policy(&w, "net.toml", &allow_only("pkgs.test", port));
    let other = net_policy(&w, "other.toml", &allow_only("other.test", port));
    let none = net_policy(&w, "none.toml", "");
    fetch_scripts(&w, port);
    let name = format!("n{}", std::process::id());
    let pol_s = pol.to_str().unwrap();
    let vm = KeptVm::up(&w, &name, &["--policy", pol_s]);
    let a = w.run(
        &["--vm", &name, "--policy", pol_s],
        "python3 allowed.py; python3 refused.py",
    );
    assert_eq!(
        (a.status.code(), text(&a.stdout)),
        (Some(0), "hello\n403 True\n".to_string()),
        "{}",
        text(&a.stderr)
    );
    assert!(
        text(&a.stderr).contains(&format!(
            "tier vm (VM {name}): network: refused other.test:{port} (1 time)"
        )),
        "{}",
        text(&a.stderr)
    );
    for p in [&other, &none] {
        let r = w.run(
            &["--vm", &name, "--policy", p.to_str().unwrap()],
            "echo RAN",
        );
        assert_eq!(r.status.code(), Some(125), "{}", text(&r.stderr));
        assert!(!text(&r.stdout).contains("RAN"));
        assert!(
            text(&r.stderr).contains("another network"),
            "{}",
            text(&r.stderr)
        );
    }
    let me = vm_status(&w, &name);
    let spill = std::path::PathBuf::from(me["state"]["spill"].as_str().unwrap());
    let audit = std::fs::read_to_string(spill.join("net-audit.jsonl")).unwrap();
    assert!(
        audit.contains("\"host\":\"pkgs.test\"") && audit.contains("\"allowed\":true"),
        "{audit}"
    );
    assert!(
        audit.contains("\"host\":\"other.test\"") && audit.contains("\"allowed\":false"),
        "{audit}"
    );
    let label = format!("hull vm {name}");
    let proxies = || -> Vec<String> {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
            .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
            .filter(|c| c.contains("__net-proxy") && c.contains(&label))
            .collect()
    };
    assert_eq!(proxies().len(), 1, "the VM's proxy: {:?}", proxies());
    drop(vm);
    assert!(proxies().is_empty(), "the proxy outlived its VM");
    assert_eq!(origin.seen(), "/a\n", "what the origin saw");
}

#[test]
fn limits_stop_a_fork_flood_and_a_memory_hog_and_the_vm_serves_on() {
    let w = world();
    let policy = w.root.path().join("limits.toml");
    std::fs::write(
        &policy,
        "version = 1\n[fs]\nread_exec = [\"/usr\", \"/bin\", \"/lib\", \"/lib64\"]\nread = [\"/etc\"]\n\
         read_write = [\"${PROJECT}\"]\n[limits]\nmemory = \"256MiB\"\npids = 48\n",
    )
    .unwrap();
    let policy = policy.to_str().unwrap().to_string();
    let name = format!("l{}", std::process::id());
    let up = w
        .cmd(&[
            "vm",
            "up",
            "--name",
            &name,
            "--idle",
            "10m",
            "--policy",
            &policy,
            "--timeout",
            UP_TIMEOUT,
        ])
        .output()
        .unwrap();
    assert!(up.status.success(), "vm up: {}", text(&up.stderr));
    let run = |script: &str| w.run(&["--vm", &name, "--policy", &policy], script);

    // Container root is not guest root: uid 0 maps to a non-zero guest id.
    let m = run("cat /proc/self/uid_map");
    let root_line = text(&m.stdout)
        .lines()
        .find(|l| l.split_whitespace().next() == Some("0"))
        .map(str::to_string)
        .unwrap_or_default();
    let host: u64 = root_line
        .split_whitespace()
        .nth(1)
        .and_then(|x| x.parse().ok())
        .unwrap_or(0);
    assert!(
        host > 0,
        "container root is guest root: {:?}",
        text(&m.stdout)
    );

    // 200 forks against pids = 48: they fail early, the count stays bounded.
    std::fs::write(
        w.project.join("fork.py"),
        r#"import os, signal, time
kids = []
try:
    while len(kids) < 200:
        pid = os.fork()
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        kids.append(pid)
except OSError as e:
    print("FORK-FAILED", len(kids), e.errno)
for k in kids:
    os.kill(k, signal.SIGKILL)
    os.waitpid(k, 0)
"#,
    )
    .unwrap();
    let f = run("python3 fork.py");
    let out = text(&f.stdout);
    let mut words = out.split_whitespace();
    assert_eq!(
        words.next(),
        Some("FORK-FAILED"),
        "{out} {}",
        text(&f.stderr)
    );
    let n: u32 = words
        .next()
        .and_then(|x| x.parse().ok())
        .unwrap_or(u32::MAX);
    assert!(n < 48, "{n} forks succeeded under pids = 48");
    assert_eq!(words.next(), Some("11"), "EAGAIN expected: {out}");

    // 512 MiB against memory = 256MiB: the hog dies, nothing is printed after.
    let h = run("python3 -c 'a = bytearray(512 << 20); print(\"ALLOCATED\")'");
    assert_ne!(h.status.code(), Some(0), "{}", text(&h.stdout));
    assert!(!text(&h.stdout).contains("ALLOCATED"));

    // And the VM still serves the next command.
    let ok = run("echo alive; cat input.txt");
    assert_eq!(
        (ok.status.code(), text(&ok.stdout)),
        (Some(0), "alive\nfrom the host\n".to_string()),
        "{}",
        text(&ok.stderr)
    );
    let down = w
        .cmd(&["vm", "down", "--name", &name, "--timeout", DOWN_TIMEOUT])
        .output()
        .unwrap();
    assert!(down.status.success(), "{}", text(&down.stderr));
}

#[test]
fn a_write_through_mmap_lands_on_the_host() {
    let w = world();
    std::fs::write(w.project.join("mapped.bin"), vec![b'.'; 8192]).unwrap();
    std::fs::write(
        w.project.join("mm.py"),
        "import mmap, os\n\
         f = open('mapped.bin', 'r+b')\n\
         m = mmap.mmap(f.fileno(), 8192)\n\
         m[0:9] = b'MMAPWRITE'\n\
         m[4096:4100] = b'PAGE'\n\
         os._exit(0)\n",
    )
    .unwrap();
    let out = w.run(&[], "python3 mm.py");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let got = std::fs::read(w.project.join("mapped.bin")).unwrap();
    assert_eq!(&got[..9], b"MMAPWRITE");
    assert_eq!(&got[4096..4100], b"PAGE");
    assert_eq!(got.len(), 8192);
}

/// When hull runs as root, QEMU runs the guest as the unprivileged
/// `hull-sandbox`: a guest that escapes into QEMU is not root on the host.
#[test]
fn qemu_runs_the_guest_as_the_sandbox_user() {
    use std::io::BufRead;
    let w = world();
    let mut child = w
        .cmd(&[
            "run",
            "--tier3",
            "--timeout",
            RUN_TIMEOUT,
            "--",
            "sh",
            "-c",
            "echo started; sleep 30",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "started\n");
    // The run's QEMU: its sockets live under this world's runs dir.
    let marker = w.root.path().to_string_lossy().into_owned();
    let uids: Vec<(u64, u32)> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u64>().ok())
        .filter(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd);
            cmd.starts_with(|c: char| c != '\0')
                && cmd
                    .split('\0')
                    .next()
                    .is_some_and(|a| a.contains("qemu-system"))
                && cmd.contains(&marker)
        })
        .map(|pid| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
            let uid = status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|u| u.parse().ok())
                .unwrap();
            (pid, uid)
        })
        .collect();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(uids.len(), 1, "one QEMU for the run: {uids:?}");
    // SAFETY: geteuid takes no arguments and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
        let sandbox: u32 = passwd
            .lines()
            .find(|l| l.starts_with("hull-sandbox:"))
            .and_then(|l| l.split(':').nth(2))
            .and_then(|u| u.parse().ok())
            .expect("hull-sandbox in /etc/passwd (scripts/setup.sh)");
        assert_eq!(uids[0].1, sandbox, "QEMU's effective uid");
    } else {
        // SAFETY: as above.
        assert_eq!(uids[0].1, unsafe { libc::geteuid() });
    }
}

/// `hull batch` never writes its output where a job could plant a link:
/// an output directory inside the project is refused before any job runs;
/// a used one too.
#[test]
fn batch_output_stays_out_of_the_project() {
    let w = world();
    let jobs = w.root.path().join("jobs.txt");
    std::fs::write(&jobs, "echo ran > ran.txt\n").unwrap();
    for out in [w.project.join("out"), w.project.clone()] {
        let o = w.batch(&jobs, &out, &[]).output().unwrap();
        assert_eq!(o.status.code(), Some(125), "{}", text(&o.stderr));
        assert!(
            text(&o.stderr).contains("which the jobs may write"),
            "{}",
            text(&o.stderr)
        );
    }
    assert!(!w.project.join("out").exists());
    assert!(!w.project.join("ran.txt").exists(), "a job ran");
    let used = w.root.path().join("used");
    std::fs::create_dir_all(&used).unwrap();
    std::fs::write(used.join("job-1.stdout"), "earlier").unwrap();
    let o = w.batch(&jobs, &used, &[]).output().unwrap();
    assert_eq!(o.status.code(), Some(125), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("not an empty directory"),
        "{}",
        text(&o.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(used.join("job-1.stdout")).unwrap(),
        "earlier"
    );
}

/// `hull image build` of a cached image builds nothing and says so, with
/// when the image was built, instead of the old build's step times.
#[test]
fn a_cached_image_build_says_nothing_was_built() {
    let w = world();
    let out = w
        .cmd(&["image", "build", "--no-snapshot"])
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("is cached"), "{err}");
    assert!(
        err.contains("nothing built now: this image was built "),
        "{err}"
    );
    // No step's time is printed as if it ran now.
    assert!(!err.contains(" s  packages"), "{err}");
}

/// A new hull-agent build reuses the Debian image: the run makes the new
/// agent's disk and snapshot beside the image (no image build, the cache
/// holds the same images), the container's init is that agent, read-only,
/// and the run works; the disk and snapshot are removed afterwards.
#[test]
fn a_new_agent_reuses_the_image_and_gets_a_snapshot_of_its_own() {
    use hull::vm::image::{self, Cache};
    use sha2::{Digest, Sha256};
    let w = world();
    let cache = Cache::default_location().unwrap();
    let img = image::find(&cache, &image::recipe::Recipe::base()).unwrap_or_else(|e| panic!("{e}"));
    let ids = |c: &Cache| -> Vec<String> {
        let mut v: Vec<String> = c
            .entries()
            .unwrap()
            .into_iter()
            .filter_map(|e| match e {
                image::Entry::Built(b) => Some(b.id),
                _ => None,
            })
            .collect();
        v.sort();
        v
    };
    let before = ids(&cache);
    // The same program with bytes after its end: another agent to hull.
    let mut bytes = std::fs::read(agent_path()).unwrap();
    bytes.extend_from_slice(format!("hull-test-agent-{}", std::process::id()).as_bytes());
    let sha: String = Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let agent = w.root.path().join("hull-agent");
    std::fs::write(&agent, &bytes).unwrap();
    std::fs::set_permissions(&agent, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let disk = img.dir.join(format!("agent-{}.ext4", &sha[..16]));
    let snap = img.dir.join(format!("snapshot-{}", &sha[..16]));
    assert!(!disk.exists() && !snap.exists(), "left from an earlier run");
    let cleanup = || {
        let _ = std::fs::remove_dir_all(&snap);
        let _ = std::fs::remove_file(snap.with_file_name(format!("snapshot-{}.lock", &sha[..16])));
        let _ = std::fs::remove_file(&disk);
    };

    let out = w
        .cmd(&[
            "run",
            "--tier3",
            "--timeout",
            RUN_TIMEOUT,
            "--",
            "sh",
            "-c",
            "sha256sum /opt/hull/hull-agent; id -u; \
             (echo x > /opt/hull/hull-agent) 2>/dev/null && echo AGENT-WRITTEN; \
             (touch /opt/hull/new) 2>/dev/null && echo AGENT-DIR-WRITTEN; echo done",
        ])
        .env("HULL_AGENT", &agent)
        .output()
        .unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    let made_disk = disk.is_file();
    let made_snap = snap.join("manifest.json").is_file();
    cleanup();
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert_eq!(
        stdout,
        format!("{sha}  /opt/hull/hull-agent\n1000\ndone\n"),
        "{stderr}"
    );
    assert!(
        stderr.contains("preparing the image's snapshot"),
        "{stderr}"
    );
    assert!(!stderr.contains("building image"), "{stderr}");
    assert!(made_disk, "no agent disk {}", disk.display());
    assert!(made_snap, "no snapshot {}", snap.display());
    assert_eq!(ids(&cache), before, "the image cache changed");
}

/// An image file changed after the build (here the initrd, one byte, same
/// size) is refused before any VM starts, with the file named; the
/// untouched image still serves runs.
#[test]
fn a_changed_image_file_is_refused() {
    use hull::vm::image::{self, Cache};
    let w = world();
    let cache = Cache::default_location().unwrap();
    let img = image::find(&cache, &image::recipe::Recipe::base()).unwrap_or_else(|e| panic!("{e}"));
    // A second cache with a copy of the image's manifest, kernel and initrd
    // (the check stops at the first file that differs; the disk is not
    // reached, so an empty stand-in will do).
    let copy = w.root.path().join("images");
    let dir = copy.join(&img.id);
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["manifest.json", "vmlinux", "initrd.cpio"] {
        std::fs::copy(img.dir.join(name), dir.join(name)).unwrap();
    }
    std::fs::write(dir.join("disk.raw"), b"").unwrap();
    let mut initrd = std::fs::read(dir.join("initrd.cpio")).unwrap();
    let last = initrd.len() - 1;
    initrd[last] ^= 0x01;
    std::fs::write(dir.join("initrd.cpio"), &initrd).unwrap();

    let out = w
        .cmd(&[
            "run",
            "--tier3",
            "--timeout",
            RUN_TIMEOUT,
            "--",
            "echo",
            "ran",
        ])
        .env("HULL_IMAGE_CACHE", &copy)
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(
        err.contains("initrd.cpio does not match the digest in the manifest"),
        "{err}"
    );
    assert!(!text(&out.stdout).contains("ran"), "the command ran: {err}");
    // No VM of this run was started: no QEMU log in the run dirs.
    let logs = console_logs(&w);
    assert!(logs.is_empty(), "a VM was started: {logs:?}");

    // The image in the real cache is untouched and serves.
    let ok = w.run(&[], "echo ran");
    assert_eq!(ok.status.code(), Some(0), "{}", text(&ok.stderr));
    assert_eq!(text(&ok.stdout), "ran\n");
}

/// A project under the caller's home (as root: `/root`, 0700 in the
/// container too) runs on tier 3: the command, as the container's user,
/// creates, reads back and removes files at the project's top and below,
/// and what it leaves lands on the host. Before, `chdir` into the project
/// failed with a bare "Permission denied".
#[test]
fn a_project_under_the_home_directory_runs() {
    let w = world();
    let home = std::env::var_os("HOME")
        .map(std::path::PathBuf::from)
        .unwrap();
    let dir = tempfile::Builder::new()
        .prefix("hull-t3-home-")
        .tempdir_in(&home)
        .unwrap();
    let project = dir.path().join("my pröj");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(project.join("input.txt"), "from home\n").unwrap();
    let out = w
        .cmd(&[
            "run",
            "--tier3",
            "--timeout",
            RUN_TIMEOUT,
            "--project",
            project.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            "pwd; cat input.txt; echo top > top.txt; mkdir -p sub/deep; echo deep > sub/deep/f; \
             cat top.txt sub/deep/f; rm sub/deep/f; rmdir sub/deep; echo kept > sub/kept.txt",
        ])
        .current_dir(&project)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        format!("{}\nfrom home\ntop\ndeep\n", project.display())
    );
    assert_eq!(
        std::fs::read_to_string(project.join("top.txt")).unwrap(),
        "top\n"
    );
    assert_eq!(
        std::fs::read_to_string(project.join("sub/kept.txt")).unwrap(),
        "kept\n"
    );
    assert!(!project.join("sub/deep").exists());
    // The files are the caller's on the host.
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    for f in ["top.txt", "sub", "sub/kept.txt"] {
        assert_eq!(std::fs::metadata(project.join(f)).unwrap().uid(), me, "{f}");
    }
}

/// A policy with many read-only grants and an 8 GiB memory limit restores
/// (11 shares: its 8 read-only grants share one virtiofs device over a view
/// of read-only binds; the limit gets a snapshot of its own size), and the
/// host's Rust toolchain it grants runs in the container: `cargo --version`,
/// and `rustc` compiling a program into the project, run there. A packed
/// grant stays read-only: a write fails and the host file is unchanged.
/// Then `--policy build` itself restores and runs the same toolchain.
#[test]
fn a_policy_beyond_the_slots_and_the_build_profile_restore_and_run_the_hosts_toolchain() {
    let w = world();
    let (rustup, cargo) = hull_tests::host_rust();
    let tools = w.root.path().join("tools");
    let mut grants = Vec::new();
    for i in 0..6 {
        let d = tools.join(format!("t{i}"));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("f"), format!("tool {i}\n")).unwrap();
        grants.push(format!("{:?}", d.to_str().unwrap()));
    }
    let policy = w.root.path().join("many.toml");
    std::fs::write(
        &policy,
        format!(
            "version = 1\n[fs]\nread_exec = [\"/usr\", \"/bin\", \"/lib\", \"/lib64\", {:?}, {:?}]\n\
             read = [\"/etc\", {}]\nread_write = [\"${{PROJECT}}\"]\n[limits]\nmemory = \"8GiB\"\n\
             [env]\npass = [\"PATH\", \"RUSTUP_TOOLCHAIN\"]\n[env.set]\nHOME = \"${{TMP}}\"\n\
             RUSTUP_HOME = {:?}\nCARGO_HOME = {:?}\n",
            rustup.to_str().unwrap(),
            cargo.join("bin").to_str().unwrap(),
            grants.join(", "),
            rustup.to_str().unwrap(),
            cargo.to_str().unwrap(),
        ),
    )
    .unwrap();
    std::fs::write(
        w.project.join("hello.rs"),
        "fn main() { println!(\"hello from rustc\"); }\n",
    )
    .unwrap();
    let t = tools.to_str().unwrap();
    let script = format!(
        "cat {t}/t0/f {t}/t5/f; echo evil > {t}/t0/f || echo REFUSED; \
         \"$CARGO_HOME/bin/cargo\" --version | cut -d' ' -f1; \
         \"$CARGO_HOME/bin/rustc\" -o hello hello.rs && ./hello"
    );
    let many = w.run(&["--policy", policy.to_str().unwrap()], &script);
    assert_eq!(many.status.code(), Some(0), "{}", text(&many.stderr));
    assert_eq!(
        text(&many.stdout),
        "tool 0\ntool 5\nREFUSED\ncargo\nhello from rustc\n",
        "{}",
        text(&many.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(tools.join("t0/f")).unwrap(),
        "tool 0\n"
    );
    assert!(w.project.join("hello").is_file(), "the program landed");
    let build = w.run(
        &["--policy", "build"],
        "\"$CARGO_HOME/bin/cargo\" --version | cut -d' ' -f1; ./hello",
    );
    assert_eq!(build.status.code(), Some(0), "{}", text(&build.stderr));
    assert_eq!(text(&build.stdout), "cargo\nhello from rustc\n");
    all_restored(&w, &[&many, &build]);
}

/// `[vm] rootfs`: the container's whole userland from a tarball (a Debian
/// minbase with `hello`, made once by scripts/test.sh from the host's
/// mirror and cached; its image is built by the same setup). Its programs
/// run and the default image's do not exist; the command runs as `hull`
/// (uid 1000, the account hull added to the tarball's) with no set-id
/// file left; a write lands in the project as the caller's; the run
/// restores a snapshot. The default policy's run beside it still has
/// python3.
#[test]
fn a_rootfs_tarball_is_the_containers_whole_userland() {
    let w = world();
    let tar = std::env::var_os("HULL_TEST_ROOTFS")
        .map(std::path::PathBuf::from)
        .unwrap_or_default();
    assert!(
        tar.is_file(),
        "HULL_TEST_ROOTFS ({}) names no file: scripts/test.sh makes it (a Debian minbase with \
         `hello`, by mmdebstrap, made hostile by tests/fixtures/hostile-rootfs)",
        tar.display()
    );
    let policy = w.root.path().join("rootfs.toml");
    std::fs::write(
        &policy,
        format!(
            "version = 1\n[fs]\nread_write = [\"${{PROJECT}}\"]\n[vm]\nrootfs = {:?}\n",
            tar.to_str().unwrap()
        ),
    )
    .unwrap();
    let o = w.run(
        &["--policy", policy.to_str().unwrap()],
        "hello; id -un; id -u; command -v python3 || echo no python3; \
         find / -xdev -perm /6000 -type f 2>/dev/null | wc -l; \
         getent passwd hull | cut -d: -f3; getent group hull | cut -d: -f3; \
         getent passwd 1000 | cut -d: -f1; \
         test -e /tmp/preloaded-as-1000 && echo the preload loads; \
         ls /preloaded-as-root /tmp/preloaded-as-0 2>/dev/null | wc -l; \
         echo made > made.txt",
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    // The tarball is hostile: a library preloaded into every program, and
    // account lines glibc reads as `hull` or id 1000. The command (uid
    // 1000) loads the preload (so it works), nothing ever loaded it as
    // root (the agent, the container's init, is static), and `hull` and
    // 1000 are hull's account alone.
    assert_eq!(
        text(&o.stdout),
        "Hello, world!\nhull\n1000\nno python3\n0\n1000\n1000\nhull\nthe preload loads\n0\n",
        "{}",
        text(&o.stderr)
    );
    let made = project_file(&w, "made.txt");
    assert_eq!(made.0, "made\n");
    // SAFETY: geteuid has no preconditions.
    assert_eq!(made.1, unsafe { libc::geteuid() });
    let default = w.run(&[], "command -v python3; command -v hello || echo no hello");
    assert_eq!(default.status.code(), Some(0), "{}", text(&default.stderr));
    assert_eq!(text(&default.stdout), "/usr/bin/python3\nno hello\n");
    all_restored(&w, &[&o, &default]);
}

/// `tests/fixtures/container-image/make.py KIND OUT LAYERS...`: a
/// container image as buildah and docker write them.
fn make_image(kind: &str, out: &std::path::Path, layers: &[&std::path::Path]) {
    let o = std::process::Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/container-image/make.py"
        ))
        .arg(kind)
        .arg(out)
        .args(layers)
        .output()
        .unwrap();
    assert!(o.status.success(), "make.py {kind}: {}", text(&o.stderr));
}

/// `--image REF`: a container image is the container's whole userland, in
/// each form hull reads (an OCI archive with a gzip'd layer, a docker
/// archive, an OCI layout by tag). The image here is one layer, the same
/// minbase-with-`hello` tarball the `[vm] rootfs` test uses, so its
/// flattened userland is that tarball and its prepared snapshot is the
/// one setup made: `hello` runs and the default image's python3 does not
/// exist; each run restores a snapshot. An image whose second layer
/// writes through the first one's link to `/etc` is refused before any VM
/// starts, naming the entry.
#[test]
fn a_container_image_is_the_containers_whole_userland() {
    let w = world();
    let tar = std::env::var_os("HULL_TEST_ROOTFS")
        .map(std::path::PathBuf::from)
        .unwrap_or_default();
    assert!(
        tar.is_file(),
        "HULL_TEST_ROOTFS ({}) names no file: scripts/test.sh makes it",
        tar.display()
    );
    let dir = w.root.path();
    let (oci, docker, layout) = (
        dir.join("image.oci.tar"),
        dir.join("image.docker.tar"),
        dir.join("image-layout"),
    );
    make_image("oci-archive", &oci, &[&tar]);
    make_image("docker-archive", &docker, &[&tar]);
    make_image("oci-layout", &layout, &[&tar]);
    let mut runs = Vec::new();
    for reference in [
        format!("oci-archive:{}", oci.display()),
        format!("docker-archive:{}", docker.display()),
        format!("oci:{}:latest", layout.display()),
    ] {
        let _ = std::fs::remove_file(w.project.join("made-in-image"));
        let o = w.run(
            &["--image", &reference],
            "hello; command -v python3 || echo no python3; echo \"$FROM_IMAGE $PATH\"; id -un; \
             pwd; echo from-the-image > made-in-image",
        );
        assert_eq!(o.status.code(), Some(0), "{reference}: {}", text(&o.stderr));
        // The image's Env is the command's (its PATH over the host's), and
        // the project is at its WorkingDir, where the command starts.
        assert_eq!(
            text(&o.stdout),
            "Hello, world!\nno python3\nyes /usr/bin:/bin\nhull\n/work\n",
            "{reference}: {}",
            text(&o.stderr)
        );
        // What it wrote there is the host's project's.
        assert_eq!(
            std::fs::read_to_string(w.project.join("made-in-image")).unwrap(),
            "from-the-image\n",
            "{reference}"
        );
        runs.push(o);
    }
    // From a registry (Debian's docker-registry on loopback), pulled
    // through the policy's allowlist: the same manifest as the archive's,
    // so the pull reads it and builds nothing again.
    let reg = hull_tests::registry::Registry::start(dir, None);
    let pushed = std::process::Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/container-image/make.py"
        ))
        .args(["push", &reg.host, "team/userland"])
        .arg(&tar)
        .output()
        .unwrap();
    assert!(pushed.status.success(), "push: {}", text(&pushed.stderr));
    let pulling = dir.join("pulling.toml");
    std::fs::write(
        &pulling,
        format!(
            "version = 1\n[fs]\nread_write = [\"${{PROJECT}}\"]\n[net]\nmode = \"allowlist\"\n\
             allow = [\"127.0.0.1\"]\nports = [{}]\nallow_private = [\"127.0.0.1/32\"]\n",
            reg.port
        ),
    )
    .unwrap();
    let reference = format!("docker://{}/team/userland:multi", reg.host);
    let o = w.run(
        &["--image", &reference, "--policy", pulling.to_str().unwrap()],
        "hello; echo \"$FROM_IMAGE\"; pwd",
    );
    assert_eq!(o.status.code(), Some(0), "{reference}: {}", text(&o.stderr));
    assert_eq!(
        text(&o.stdout),
        "Hello, world!\nyes\n/work\n",
        "{reference}: {}",
        text(&o.stderr)
    );
    assert!(
        !text(&o.stderr).contains("flattening"),
        "{reference} was read again: {}",
        text(&o.stderr)
    );
    runs.push(o);
    drop(reg);
    // The policy may keep the project at the host's path instead.
    let policy = dir.join("host-path.toml");
    std::fs::write(
        &policy,
        "version = 1\n[fs]\nread_write = [\"${PROJECT}\"]\n[vm]\nproject_at = \"host\"\n",
    )
    .unwrap();
    let o = w.run(
        &[
            "--image",
            &format!("docker-archive:{}", docker.display()),
            "--policy",
            policy.to_str().unwrap(),
        ],
        "pwd; test -e /work || echo no /work",
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(
        text(&o.stdout),
        format!("{}\nno /work\n", w.project.display()),
        "{}",
        text(&o.stderr)
    );
    runs.push(o);
    // No command given: the image's own (its Cmd).
    let o = w
        .cmd(&[
            "run",
            "--tier3",
            "--timeout",
            RUN_TIMEOUT,
            "--image",
            &format!("oci-archive:{}", oci.display()),
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(
        text(&o.stdout),
        "the image says hello\n",
        "{}",
        text(&o.stderr)
    );
    runs.push(o);
    all_restored(&w, &runs.iter().collect::<Vec<_>>());
    let bad = dir.join("link-then-file.tar");
    make_image("layer-link-then-file", &bad, &[]);
    let t0 = std::time::Instant::now();
    let o = w.run(
        &["--image", &format!("oci-archive:{}", bad.display())],
        "true",
    );
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(125), "{err}");
    assert!(
        err.contains("etc-link/cron-evil") && err.contains("lies under \"etc-link\""),
        "{err}"
    );
    assert!(t0.elapsed() < std::time::Duration::from_secs(20), "{err}");
}

/// A file of `w`'s project: its text and owner.
fn project_file(w: &World, name: &str) -> (String, u32) {
    use std::os::unix::fs::MetadataExt;
    let p = w.project.join(name);
    (
        std::fs::read_to_string(&p).unwrap(),
        std::fs::metadata(&p).unwrap().uid(),
    )
}
