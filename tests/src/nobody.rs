//! Running hull as the user nobody from a test that runs as root: what
//! hull does when it is not root (user namespaces of its own, the
//! caller's files, a delegated cgroup) is tested on the same machine.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// A world the user nobody owns, for running hull as that user (the test
/// itself runs as root): a copy of hull it can execute (the checkout may be
/// in a 0700 directory), `u` (its home, 0700) with `project` and `runs`,
/// and a cgroup delegated to it, as systemd gives one (the landlock tier
/// puts the run's tree in a cgroup below the caller's own), removed on drop.
#[derive(Debug)]
pub struct AsNobody {
    /// Holds `hull`, `u` and the policies a test writes (0755).
    pub top: tempfile::TempDir,
    hull: PathBuf,
    pub u: PathBuf,
    pub project: PathBuf,
    cg: PathBuf,
}

impl Default for AsNobody {
    fn default() -> AsNobody {
        AsNobody::new()
    }
}

impl AsNobody {
    pub fn new() -> AsNobody {
        use std::os::unix::fs::PermissionsExt;
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        assert_eq!(
            euid, 0,
            "this test runs hull as the user nobody and needs root to do so"
        );
        let top = tempfile::Builder::new()
            .prefix("hull-user-")
            .tempdir_in("/tmp")
            .expect("tempdir");
        std::fs::set_permissions(top.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let hull = top.path().join("hull");
        std::fs::copy(crate::hull_bin(), &hull).expect("copy hull");
        // hull's agent beside it: a session's leader runs it.
        std::fs::copy(
            crate::hull_bin().with_file_name("hull-agent"),
            top.path().join("hull-agent"),
        )
        .expect("copy hull-agent (cargo build -p hull-agent)");
        let u = top.path().join("u");
        let project = u.join("project");
        for d in [&project, &u.join("runs")] {
            std::fs::create_dir_all(d).expect("mkdir");
        }
        let cg = cgroup2_mount().join(format!("hull-test-user-{}", std::process::id()));
        std::fs::create_dir(&cg).expect("mkdir the delegated cgroup");
        for f in [
            "",
            "cgroup.procs",
            "cgroup.subtree_control",
            "cgroup.threads",
        ] {
            Command::new("chown")
                .args(["nobody:nogroup"])
                .arg(cg.join(f))
                .status()
                .expect("chown");
        }
        let w = AsNobody {
            top,
            hull,
            u,
            project,
            cg,
        };
        w.give_to_nobody();
        w
    }

    /// The copy of hull the user runs.
    pub fn hull_path(&self) -> &Path {
        &self.hull
    }

    /// Makes everything under `u` the user's again, `u` itself 0700.
    pub fn give_to_nobody(&self) {
        use std::os::unix::fs::PermissionsExt;
        Command::new("chown")
            .args(["-R", "nobody:nogroup"])
            .arg(&self.u)
            .status()
            .expect("chown");
        std::fs::set_permissions(&self.u, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    }

    /// `hull run --tier TIER --policy POLICY -- sh -c SCRIPT` as nobody,
    /// in its project, inside its cgroup.
    pub fn run(&self, tier: &str, policy: &Path, script: &str) -> Output {
        let policy = policy.to_str().expect("a UTF-8 policy path");
        self.hull(&[
            "run",
            "--tier",
            tier,
            "--timeout",
            crate::RUN_TIMEOUT,
            "--policy",
            policy,
            "--",
            "sh",
            "-c",
            script,
        ])
    }

    /// `hull ARGS` as nobody, in its project, inside its cgroup (runs and
    /// change sets in its home).
    pub fn hull(&self, args: &[&str]) -> Output {
        self.command(args)
            .stdin(Stdio::null())
            .output()
            .expect("setpriv hull")
    }

    /// The command `hull ARGS` as nobody, in its project, inside its
    /// cgroup (runs and change sets in its home), to spawn as it is.
    pub fn command(&self, args: &[&str]) -> Command {
        let enter = format!(
            "echo $$ > '{}/cgroup.procs' && exec \"$@\"",
            self.cg.display()
        );
        let mut c = Command::new("sh");
        c.args(["-c", &enter, "sh", "setpriv"])
            .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
            .arg(&self.hull)
            .args(args)
            .current_dir(&self.project)
            .env("HOME", &self.u)
            .env("HULL_RUNS_DIR", self.u.join("runs"))
            .env("HULL_CHANGES_DIR", self.u.join("changes"))
            .env_remove("HULL_INSTANCE")
            .env_remove("XDG_STATE_HOME")
            .env_remove("XDG_RUNTIME_DIR");
        c
    }
}

impl Drop for AsNobody {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.cg);
    }
}

/// The cgroup2 hierarchy's mount point.
pub fn cgroup2_mount() -> PathBuf {
    let mi = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    mi.lines()
        .find_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            if right.split_whitespace().next()? != "cgroup2" {
                return None;
            }
            left.split_whitespace().nth(4).map(std::path::PathBuf::from)
        })
        .expect("a cgroup2 hierarchy is mounted")
}
