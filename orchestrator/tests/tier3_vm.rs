//! Tier 3 end to end with the real guest image: `hull run --tier3` and the
//! VMs `hull vm up` keeps. They need QEMU, virtiofsd and a built image
//! (`hull image build`); a missing piece fails the test with `hull probe`'s
//! reason, unless `HULL_TEST_TIER3=0` declares that this machine lacks tier 3.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

fn hull() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_hull"))
}

/// None when tier 3 is declared absent; panics when it should be there but is not.
fn world() -> Option<World> {
    if std::env::var("HULL_TEST_TIER3").as_deref() == Ok("0") {
        eprintln!("HULL_TEST_TIER3=0: this machine is declared to lack tier 3; not run");
        return None;
    }
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
        "tier 3 is unavailable here: {}. Build the image (hull image build), or set \
         HULL_TEST_TIER3=0 to declare that this machine lacks tier 3",
        p["reason"]
    );
    Some(World::new())
}

struct World {
    root: tempfile::TempDir,
    project: PathBuf,
}

impl World {
    fn new() -> World {
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

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(hull());
        c.args(args)
            .current_dir(&self.project)
            .env("HULL_RUNS_DIR", self.root.path().join("r"))
            .env("HULL_VMS_DIR", self.root.path().join("v"))
            .stdin(Stdio::null());
        c
    }

    fn run(&self, extra: &[&str], script: &str) -> Output {
        let mut args = vec!["run", "--tier3"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "sh", "-c", script]);
        self.cmd(&args).output().unwrap()
    }
}

/// True while `pid` runs (a zombie has ended; it only waits to be reaped).
fn running(pid: u64) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !matches!(
            s.rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().next()),
            Some("Z") | Some("X")
        ),
        Err(_) => false,
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn run_tier3_streams_output_keeps_exit_codes_and_enforces_the_policy() {
    let Some(w) = world() else { return };
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
    assert!(!w.project.join(".hull").exists(), "placeholder left behind");
}

#[test]
fn a_warm_vm_serves_runs_until_it_is_taken_down() {
    let Some(w) = world() else { return };
    let name = format!("t{}", std::process::id());
    let up = w
        .cmd(&["vm", "up", "--name", &name, "--idle", "10m"])
        .output()
        .unwrap();
    assert!(
        up.status.success(),
        "vm up: {} {}",
        text(&up.stdout),
        text(&up.stderr)
    );

    // Two runs in the same container: state in the container persists.
    let a = w.run(&["--vm", &name], "echo first > /var/tmp/marker; echo one");
    assert_eq!(
        (a.status.code(), text(&a.stdout)),
        (Some(0), "one\n".to_string()),
        "{}",
        text(&a.stderr)
    );
    let b = w.run(&["--vm", &name], "cat /var/tmp/marker; cat input.txt");
    assert_eq!(
        text(&b.stdout),
        "first\nfrom the host\n",
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

    let st = w.cmd(&["vm", "status", "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
    let me = v
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["name"] == name.as_str())
        .unwrap();
    assert_eq!(me["up"], true);
    let pid = me["state"]["pid"].as_u64().unwrap();

    let down = w.cmd(&["vm", "down", "--name", &name]).output().unwrap();
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
