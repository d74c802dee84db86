#![allow(clippy::expect_used, clippy::unwrap_used)]
// The escape matrix and the end-to-end tests drive the Linux tiers (bubblewrap,
// Landlock, tier 3 on QEMU): off Linux this crate is empty, and type-checks.
#![cfg(target_os = "linux")]
//! Nothing of the command runs before its boundary is in place, and no run
//! reaches another (issue "Security 4"): each class is first shown to work
//! under tier `none`, then held on every native tier, asserting what the
//! host sees afterwards.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use hull_tests::{require_tier, show, World};

/// A directory anyone may write, outside every grant: what a helper running
/// the attacker's code before the boundary (as the sandbox user when hull
/// is root) could write, and the command inside it cannot.
fn open_drop() -> PathBuf {
    let d = tempfile::Builder::new()
        .prefix("hull-drop-")
        .tempdir_in("/var/tmp")
        .expect("tempdir")
        .keep();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    d
}

/// Removes the drop directory when the test ends, passed or not.
struct Removed(PathBuf);
impl Drop for Removed {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Builds, in the project, a library whose constructor says on stderr which
/// program loaded it and drops a file naming it in `drop`.
fn preload_library(w: &World, drop: &Path) -> PathBuf {
    let src = w.root.path().join("mark.c");
    std::fs::write(
        &src,
        format!(
            r#"#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
__attribute__((constructor)) static void mark(void) {{
    char exe[512];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n < 0 ? 0 : n] = 0;
    dprintf(2, "preloaded-in:%s\n", exe);
    char path[1024];
    snprintf(path, sizeof path, "{drop}/pid-%d", (int)getpid());
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd >= 0) {{ dprintf(fd, "%s\n", exe); close(fd); }}
}}
"#,
            drop = drop.display()
        ),
    )
    .expect("write mark.c");
    let lib = w.project.join("libmark.so");
    let st = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .status()
        .expect("cc (gcc) builds the test's library");
    assert!(st.success(), "cc failed");
    std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    lib
}

fn dropped(drop: &Path) -> Vec<String> {
    std::fs::read_dir(drop)
        .expect("read drop dir")
        .map(|e| {
            let e = e.expect("entry");
            format!(
                "{}: {}",
                e.file_name().to_string_lossy(),
                std::fs::read_to_string(e.path()).unwrap_or_default().trim()
            )
        })
        .collect()
}

/// `LD_PRELOAD` passed as the command's environment (`--env`, as a batch
/// job's or a session exec's `env` become) loads into the command only:
/// never into hull's Landlock helper or bwrap, which run before the
/// boundary (as the sandbox user when hull is root).
fn the_command_s_environment_reaches_no_helper(t: &str) {
    require_tier(t);
    let w = World::new();
    let drop = open_drop();
    let _gone = Removed(drop.clone());
    let lib = preload_library(&w, &drop);
    let env = format!("LD_PRELOAD={}", lib.display());

    // Control: under none nothing stands between the library and the host.
    let o = w.run("none", &["--env", &env], "true");
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert!(
        !dropped(&drop).is_empty(),
        "control: the library wrote nothing under none: {}",
        show(&o)
    );
    for e in std::fs::read_dir(&drop).expect("read") {
        std::fs::remove_file(e.expect("entry").path()).expect("rm");
    }

    let o = w.run(t, &["--env", &env], "echo \"LD_PRELOAD=$LD_PRELOAD\"");
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let stderr = String::from_utf8_lossy(&o.stderr);
    // The command still gets its variable, and the library acts inside.
    assert!(
        String::from_utf8_lossy(&o.stdout).contains(&env),
        "{}",
        show(&o)
    );
    let loaded: Vec<&str> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("preloaded-in:"))
        .collect();
    assert!(
        !loaded.is_empty(),
        "the command's own LD_PRELOAD did not load in it: {}",
        show(&o)
    );
    for exe in &loaded {
        assert!(
            !exe.ends_with("/hull") && !exe.ends_with("/bwrap"),
            "hull's helper {exe} loaded the command's LD_PRELOAD: {}",
            show(&o)
        );
    }
    assert_eq!(
        dropped(&drop),
        Vec::<String>::new(),
        "code of the command's ran outside its boundary: {}",
        show(&o)
    );
}

/// bwrap itself (which lives as long as the command) starts from hull's
/// environment: the command's variables are not in its `environ`, nor on
/// its command line (which every local user can read).
fn bwrap_holds_none_of_the_command_s_environment(t: &str) {
    require_tier(t);
    let w = World::new();
    let marker = "hull-env-probe-6d1e";
    let mut c = w.cmd(
        t,
        &["--env", &format!("ENV_PROBE_6D1E={marker}")],
        "echo up; exec sleep 30",
    );
    let mut child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.as_mut().expect("stdout")),
        &mut line,
    )
    .expect("read");
    assert_eq!(line.trim(), "up");
    let hull_pid = child.id() as i32;
    let mut seen = Vec::new();
    for e in std::fs::read_dir("/proc").expect("proc").flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let ppid: i32 = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().nth(1))
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        if ppid != hull_pid {
            continue;
        }
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
        if !exe.ends_with("bwrap") {
            continue;
        }
        let environ = std::fs::read(format!("/proc/{pid}/environ")).expect("environ");
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).expect("cmdline");
        seen.push(pid);
        for (what, bytes) in [("environment", &environ), ("command line", &cmdline)] {
            assert!(
                !String::from_utf8_lossy(bytes).contains(marker),
                "bwrap ({pid}) holds the command's variable in its {what}"
            );
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(!seen.is_empty(), "no bwrap found below hull ({hull_pid})");
}

/// The default profile with `deny` and `read` entries inside the project
/// added; returns the policy file's path.
fn policy_with(w: &World, read: &Path, deny: &Path) -> String {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../policies/default.toml"
    ))
    .expect("policies/default.toml")
    .replace(
        "read = [",
        &format!("read = [{:?}, ", read.display().to_string()),
    )
    .replace(
        "deny = [",
        &format!("deny = [{:?}, ", deny.display().to_string()),
    );
    let pol = w.root.path().join("protected.toml");
    std::fs::write(&pol, text).expect("write policy");
    pol.to_str().expect("utf8").to_string()
}

/// Mode, owner, group, mtime and extended attributes (names and values).
type Meta = (u32, u32, u32, i64, Vec<(String, Vec<u8>)>);

fn meta(p: &Path) -> Meta {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let o = Command::new("/usr/bin/python3")
        .arg("-c")
        .arg("import os,sys; p=sys.argv[1]; [print(n, os.getxattr(p, n, follow_symlinks=False).hex()) for n in sorted(os.listxattr(p, follow_symlinks=False))]")
        .arg(p)
        .output()
        .expect("python3");
    let xattrs = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
        .collect();
    (m.mode() & 0o7777, m.uid(), m.gid(), m.mtime(), xattrs)
}

/// What the command tries on each protected path: chmod, a time set back,
/// a user xattr, and a default ACL granting others everything (the
/// `system.posix_acl_default` value of `setfacl -d -m o::rwx`).
fn tamper(paths: &[&str]) -> String {
    const XATTRS: &str = r#"
import os, struct, sys
p = sys.argv[1]
acl = struct.pack('<I', 2) + b''.join(struct.pack('<HHI', t, 7, 0xffffffff) for t in (1, 4, 0x20))
tries = [('user.hull', b'x')] + ([('system.posix_acl_default', acl)] if os.path.isdir(p) else [])
ok = False
for name, value in tries:
    try:
        os.setxattr(p, name, value, follow_symlinks=False)
        ok = True
    except OSError:
        pass
sys.exit(0 if ok else 1)
"#;
    let mut s = String::from("f=0\n");
    for p in paths {
        s.push_str(&format!(
            "chmod 0777 '{p}' 2>/dev/null && f=1\n\
             touch -h -c -m -d 2001-01-01 '{p}' 2>/dev/null && f=1\n\
             /usr/bin/python3 -c \"$XATTRS\" '{p}' && f=1\n"
        ));
    }
    s.push_str("exit $f\n");
    format!("XATTRS='{}'\n{s}", XATTRS.replace('\'', "'\\''"))
}

/// The protected paths' metadata holds whoever hull runs as (as root the
/// idmapped project makes the sandbox user the owner of every path in it,
/// protected ones too): `.git/hooks`, `.git/config`, `.hull`, a `deny`ed
/// secret and a read-only grant inside the project keep mode, owner, times
/// and xattrs; a file of the project's own still changes.
fn protected_metadata_holds(t: &str) {
    require_tier(t);
    let w = World::new();
    w.git_init();
    let p = &w.project;
    std::fs::create_dir_all(p.join(".hull")).expect("mkdir .hull");
    std::fs::create_dir_all(p.join("vendor")).expect("mkdir vendor");
    std::fs::write(p.join("vendor/lib.txt"), "vendored").expect("write");
    std::fs::write(p.join("secret.env"), "TOKEN=1").expect("write");
    std::fs::write(p.join("mine.txt"), "mine").expect("write");
    for (f, mode) in [("secret.env", 0o600), ("mine.txt", 0o600), (".hull", 0o700)] {
        std::fs::set_permissions(p.join(f), std::fs::Permissions::from_mode(mode)).expect("chmod");
    }
    let pol = policy_with(&w, &p.join("vendor"), &p.join("secret.env"));
    let protected = [".git/hooks", ".git/config", ".hull", "secret.env", "vendor"];
    let reset_times = || {
        for f in protected {
            let st = Command::new("touch")
                .args(["-h", "-m", "-d", "2020-02-02"])
                .arg(p.join(f))
                .status()
                .expect("touch");
            assert!(st.success());
        }
    };

    // Control: with no boundary every change lands.
    reset_times();
    let before: Vec<_> = protected.iter().map(|f| meta(&p.join(f))).collect();
    let o = w.run("none", &["--policy", &pol], &tamper(&protected));
    assert_eq!(o.status.code(), Some(1), "control: {}", show(&o));
    for (f, b) in protected.iter().zip(&before) {
        assert_ne!(&meta(&p.join(f)), b, "control: {f} unchanged: {}", show(&o));
    }
    // Put everything back as it was.
    for (f, (mode, ..)) in protected.iter().zip(&before) {
        let path = p.join(f);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(*mode)).expect("chmod");
        let st = Command::new("/usr/bin/python3")
            .arg("-c")
            .arg("import os,sys; p=sys.argv[1]; [os.removexattr(p, n) for n in os.listxattr(p)]")
            .arg(&path)
            .status()
            .expect("python3");
        assert!(st.success());
    }
    reset_times();
    let before: Vec<_> = protected.iter().map(|f| meta(&p.join(f))).collect();

    let o = w.run(t, &["--policy", &pol], &tamper(&protected));
    assert_eq!(o.status.code(), Some(0), "a change landed: {}", show(&o));
    for (f, b) in protected.iter().zip(&before) {
        let now = meta(&p.join(f));
        if *f == ".hull" {
            // hull keeps its spare pool there: its own entries move the
            // time, the command's `touch` must not.
            assert_ne!(now.3, 978307200, "{f}'s time set: {}", show(&o));
            assert_eq!(
                (now.0, now.1, now.2, &now.4),
                (b.0, b.1, b.2, &b.4),
                "{f} changed: {}",
                show(&o)
            );
        } else {
            assert_eq!(&now, b, "{f} changed: {}", show(&o));
        }
    }
    // The project's own file: the same calls land.
    let o = w.run(
        t,
        &["--policy", &pol],
        "chmod 0640 mine.txt && touch -m -d 2001-01-01 mine.txt",
    );
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let (mode, _, _, mtime, _) = meta(&p.join("mine.txt"));
    assert_eq!((mode, mtime), (0o640, 978307200), "{}", show(&o));
}

/// A loop that makes and removes a directory at the top of a split project
/// does not use the run's spare directories up (a removed empty one goes
/// back to the pool); making more directories there than the pool holds
/// fails with the project and the limit named.
#[cfg(feature = "landlock")]
#[test]
fn a_mkdir_rmdir_loop_keeps_the_pool_and_running_out_is_named() {
    require_tier("landlock");
    let w = World::new();
    w.git_init();
    let o = w.run(
        "landlock",
        &[],
        "i=0; while [ $i -lt 200 ]; do mkdir loop && rmdir loop || exit 3; i=$((i+1)); done; \
         mkdir target && echo made",
    );
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert!(w.project.join("target").is_dir());
    assert!(!w.project.join("loop").exists());
    let o = w.run(
        "landlock",
        &[],
        "i=0; while mkdir many$i 2>/dev/null; do i=$((i+1)); done; echo $i",
    );
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let made: u32 = String::from_utf8_lossy(&o.stdout)
        .trim()
        .parse()
        .expect("count");
    assert!((60..=64).contains(&made), "{made}: {}", show(&o));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains(&w.project.display().to_string())
            && stderr.contains("64 new directories")
            && stderr.contains("Disk quota exceeded"),
        "{}",
        show(&o)
    );
}

/// No process of a run survives hull, killed with SIGKILL mid-run (no
/// handler of hull's runs): a grandchild that left the session is gone
/// soon after, and so is the run's cgroup. The control: the grandchild
/// runs while hull does.
fn nothing_of_a_run_outlives_a_killed_hull(t: &str) {
    require_tier(t);
    let w = World::new();
    let marker = format!("hull-orphan-{}-{t}", std::process::id());
    let script = format!(
        "setsid {} & echo started; sleep 300",
        hull_tests::marked_sleep(&marker, 300)
    );
    let mut c = hull_tests::started(w.cmd(t, &[], &script));
    let until = |cond: &dyn Fn() -> bool| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !cond() {
            if std::time::Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        true
    };
    // hull's own command line holds the marker: a process of the run's is
    // one of the others.
    let hull_pid = c.id() as i32;
    assert!(
        until(&|| hull_tests::pids_with(&marker)
            .iter()
            .any(|p| *p != hull_pid)),
        "control: the grandchild does not run"
    );
    let cgroups = || -> Vec<String> {
        let mut out = Vec::new();
        for root in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
            if let Ok(rd) = std::fs::read_dir(root) {
                for e in rd.flatten() {
                    let name = e.file_name().to_string_lossy().into_owned();
                    if name.starts_with("hull-") {
                        let procs = std::fs::read_to_string(e.path().join("cgroup.procs"))
                            .unwrap_or_default();
                        if procs.lines().any(|p| {
                            p.parse::<i32>()
                                .is_ok_and(|p| hull_tests::pids_with(&marker).contains(&p))
                        }) {
                            out.push(e.path().display().to_string());
                        }
                    }
                }
            }
        }
        out
    };
    // The run's processes are moved into its cgroup as they start: wait
    // for it rather than look once.
    if t == "landlock" {
        assert!(
            until(&|| !cgroups().is_empty()),
            "the run has no cgroup of its own"
        );
    }
    let theirs = cgroups();
    // SAFETY: kill(2) on the pid of our own child.
    unsafe {
        libc::kill(c.id() as i32, libc::SIGKILL);
    }
    let _ = c.wait();
    assert!(
        until(&|| hull_tests::pids_with(&marker).is_empty()),
        "left running after hull was killed: {:?}",
        hull_tests::pids_with(&marker)
    );
    assert!(
        until(&|| theirs.iter().all(|d| !Path::new(d).exists())),
        "the run's cgroup is left: {theirs:?}"
    );
}

/// Two concurrent runs (as root: the same sandbox user) cannot reach each
/// other through `/proc`: run B, given run A's host pid, neither lists nor
/// writes A's project through `/proc/PID/cwd`, nor reads A's environment.
/// The control: a command with no boundary does both.
fn concurrent_runs_cannot_reach_each_other(t: &str) {
    require_tier(t);
    let a = World::new();
    let b = World::new();
    std::fs::write(a.project.join("a-secret.txt"), "a-project-secret").expect("write");
    let marker = format!("hull-run-a-{}-{t}", std::process::id());
    let script = format!("echo started; {}", hull_tests::marked_sleep(&marker, 60));
    let _run_a = Killed(hull_tests::started(a.cmd(
        t,
        &["--env", "A_TOKEN=a-env-token-5e1"],
        &script,
    )));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let pid = loop {
        if let Some(p) = hull_tests::pids_with(&marker).first() {
            break *p;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "run A's command not found"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let reach = format!(
        "ls /proc/{pid}/cwd/; cat /proc/{pid}/cwd/a-secret.txt; \
         tr '\\0' '\\n' < /proc/{pid}/environ; echo planted > /proc/{pid}/cwd/planted; \
         ls /proc/{pid}/root/ >/dev/null && echo root-reached; true"
    );
    // The control: the same commands, with no boundary, as the user run
    // A's command is (the sandbox user when hull is root).
    let uid_gid = |field: &str| -> u32 {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .expect("status")
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .expect("ids")
    };
    let control = {
        use std::os::unix::process::CommandExt;
        Command::new("/bin/sh")
            .arg("-c")
            .arg(&reach)
            .current_dir("/")
            .gid(uid_gid("Gid:"))
            .uid(uid_gid("Uid:"))
            .output()
            .expect("sh")
    };
    let text = String::from_utf8_lossy(&control.stdout).to_string();
    assert!(
        text.contains("a-project-secret") && text.contains("a-env-token-5e1"),
        "control: {}",
        show(&control)
    );
    assert!(
        a.project.join("planted").exists(),
        "control: nothing planted"
    );
    std::fs::remove_file(a.project.join("planted")).expect("rm");

    let o = b.run(t, &[], &reach);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    for leaked in [
        "a-secret.txt",
        "a-project-secret",
        "a-env-token-5e1",
        "root-reached",
    ] {
        assert!(
            !text.contains(leaked),
            "run B reached run A ({leaked}): {}",
            show(&o)
        );
    }
    assert!(
        !a.project.join("planted").exists(),
        "run B wrote in run A's project"
    );
}

/// A child killed and reaped when the test ends, passed or not.
struct Killed(std::process::Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Two concurrent landlock runs on one project: run B swaps the project's
/// `src` with a symlink to a directory outside every grant, over and over
/// (`RENAME_EXCHANGE` through its create broker), while run A starts again
/// and again and writes below `src`. A rule of A's never lands on the
/// directory outside: nothing is written there (a run may be refused,
/// naming the link, or find `src` a link it may not follow). The control:
/// with no boundary the same write through the link lands outside.
#[cfg(feature = "landlock")]
#[test]
fn a_concurrent_run_swapping_an_entry_moves_no_rule_outside() {
    require_tier("landlock");
    let w = World::new();
    w.git_init();
    let drop = open_drop();
    let _gone = Removed(drop.clone());
    std::fs::create_dir_all(w.project.join("src")).expect("mkdir");
    std::os::unix::fs::symlink(&drop, w.project.join("lnk")).expect("symlink");

    // Control: through the link, with no boundary, the write lands.
    let o = w.run("none", &[], "echo control > lnk/control");
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert!(drop.join("control").exists(), "control: {}", show(&o));
    std::fs::remove_file(drop.join("control")).expect("rm");

    let swapper = r#"/usr/bin/python3 -c '
import ctypes, time
libc = ctypes.CDLL(None, use_errno=True)
print("started", flush=True)
end = time.time() + 20
n = 0
while time.time() < end:
    libc.renameat2(-100, b"src", -100, b"lnk", 2)
    n += 1
'"#;
    let _b = Killed(hull_tests::started(w.cmd("landlock", &[], swapper)));
    let mut outcomes = std::collections::BTreeMap::new();
    for i in 0..40 {
        let o = w.run("landlock", &[], &format!("echo a > src/f{i}"));
        let code = o.status.code().unwrap_or(-1);
        if code == 125 {
            assert!(
                String::from_utf8_lossy(&o.stderr).contains("symlink"),
                "hull failed otherwise: {}",
                show(&o)
            );
        }
        *outcomes.entry(code).or_insert(0) += 1;
        assert_eq!(
            std::fs::read_dir(&drop).expect("drop").count(),
            0,
            "run {i} wrote outside the project (outcomes so far {outcomes:?}): {}",
            show(&o)
        );
    }
}

macro_rules! tiers {
    (
        common: [$($case:ident),* $(,)?],
        bwrap: [$($b:ident),* $(,)?],
        vm: [$($v:ident),* $(,)?] $(,)?
    ) => {
        #[cfg(feature = "landlock")]
        mod landlock { $( #[test] fn $case() { super::$case("landlock") } )* }
        #[cfg(feature = "bwrap")]
        mod bwrap {
            $( #[test] fn $case() { super::$case("bwrap") } )*
            $( #[test] fn $b() { super::$b("bwrap") } )*
        }
        #[cfg(feature = "tier3")]
        mod vm { $( #[test] fn $v() { super::$v("vm") } )* }
    };
}

/// Files below `dir` named `name`, at any depth (none when it is gone).
fn found(dir: &Path, name: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(e.path());
            } else if e.file_name() == name {
                out.push(e.path());
            }
        }
    }
    out
}

/// Interrupts a `hull run` as a terminal's Ctrl-C does, and waits for it.
fn interrupt(mut c: std::process::Child) -> std::process::ExitStatus {
    // SAFETY: kill(2) on our own child, not yet waited for.
    unsafe { libc::kill(c.id() as i32, libc::SIGINT) };
    c.wait().expect("wait")
}

/// A kept VM's name reused for another project carries nothing of the
/// first one's runs: a run's tmp (its `TMPDIR` and `HOME`) is its own,
/// made in the VM's tmp on the host and removed when the run ends; the
/// VM's tmp and spill are removed from the host when it goes down and
/// start empty when it comes up. (Against the code before, the second
/// project's run read the first's secret from `$HOME`.)
fn a_kept_vm_s_name_carries_nothing_to_another_project(tier: &str) {
    require_tier(tier);
    let w = World::new();
    let other = w.root.path().join("other-project");
    std::fs::create_dir(&other).unwrap();
    let vm = hull_tests::KeptVm::new(&w, "reuse");
    vm.up(&w.project);
    let a = hull_tests::started(vm.cmd(
        &w.project,
        &[],
        "echo first-project-secret > \"$HOME/secret.txt\"; echo started; sleep 50",
    ));
    // The control: the write landed in the VM's tmp on the host.
    let tmp = vm.tmp();
    let control = found(&tmp, "secret.txt");
    let st = interrupt(a);
    assert_eq!(st.code(), Some(130));
    assert!(
        !control.is_empty(),
        "control: the run's HOME is not in the VM's tmp ({})",
        tmp.display()
    );
    assert_eq!(
        std::fs::read_dir(&tmp).unwrap().count(),
        0,
        "the run's tmp is left in {}",
        tmp.display()
    );
    // What a run killed before it could remove its tmp leaves is gone
    // when the VM goes down.
    std::fs::write(tmp.join("left.txt"), "x").unwrap();
    vm.down();
    assert!(!tmp.exists(), "{} is left on the host", tmp.display());
    vm.up(&other);
    let o = vm.run(&other, "cat \"$HOME/secret.txt\" 2>/dev/null || echo none");
    vm.down();
    assert_eq!(String::from_utf8_lossy(&o.stdout), "none\n", "{}", show(&o));
    // What a killed supervisor left: `hull runs gc` removes it.
    std::fs::create_dir_all(&tmp).unwrap();
    std::fs::write(tmp.join("left.txt"), "x").unwrap();
    vm.hull(&["runs", "gc"]);
    assert!(!tmp.exists(), "hull runs gc left {}", tmp.display());
}

/// Two runs in one kept VM at once: the second waits for the first to end
/// (and says so), so it can neither read the first's environment through
/// `/proc` nor signal it, and its `HOME` is a new empty directory, not
/// the first's. The control, two runs under tier `none` as one user:
/// the second reads the first's environment.
fn runs_in_a_kept_vm_take_turns(tier: &str) {
    require_tier(tier);
    let w = World::new();
    let secret = format!("turn-secret-{}", std::process::id());
    let token = format!("TOKEN={secret}");
    let first = "echo mine > \"$HOME/first.txt\"; echo started; sleep 6";
    let second = "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep '^TOKEN=' ; \
                  for p in /proc/[0-9]*; do \
                  [ \"$(tr '\\0' ' ' < $p/cmdline 2>/dev/null)\" = 'sleep 6 ' ] && \
                  kill ${p#/proc/} && echo SIGNALLED; done; ls -A \"$HOME\"; echo end";
    let other = |extra: &[&str]| {
        let mut c = w.hull();
        c.args(["run", "-q", "--tier", "none", "--timeout", "60s"]);
        c.args(extra).args(["--", "sh", "-c"]);
        c.current_dir(&w.project);
        c
    };
    // Control: at once, the second run reads the first's environment.
    let mut c = other(&["--env", &token]);
    let a = hull_tests::started({
        c.arg(first);
        c
    });
    let mut c = other(&[]);
    let o = c
        .arg("cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep '^TOKEN='")
        .stdin(Stdio::null())
        .output()
        .expect("hull");
    let _ = interrupt(a);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains(&secret),
        "control: {}",
        show(&o)
    );

    let vm = hull_tests::KeptVm::new(&w, "turns");
    vm.up(&w.project);
    let mut a = hull_tests::started(vm.cmd(&w.project, &[&token], first));
    let o = vm
        .cmd(&w.project, &[], second)
        .stdin(Stdio::null())
        .output()
        .expect("hull run");
    let first_ended = a.try_wait().expect("try_wait");
    let st = a.wait().expect("wait");
    assert_eq!(st.code(), Some(0), "the first run was disturbed");
    assert!(
        first_ended.is_some(),
        "the second run ended while the first still ran: {}",
        show(&o)
    );
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(!out.contains(&secret), "{}", show(&o));
    assert!(!out.contains("SIGNALLED"), "{}", show(&o));
    assert_eq!(out, "end\n", "{}", show(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("waiting"),
        "the second run did not say it waited: {}",
        show(&o)
    );
}

/// What a run leaves in a kept VM's container outside the shares (in its
/// `/tmp`, `/var/tmp`, `/run/lock` and the runs' user's home there, which
/// the container keeps) is gone for the next run, and the shares below
/// them stay. The control: the first run's files are there at its end.
/// A scratch that cannot be emptied fails the next run before its command
/// starts and takes the VM down; the run after it gets a fresh VM.
fn a_kept_vm_s_container_scratch_is_emptied_between_runs(tier: &str) {
    require_tier(tier);
    let w = World::new();
    let vm = hull_tests::KeptVm::new(&w, "scratch");
    vm.up(&w.project);
    let dirs = "/tmp /var/tmp /run/lock /home/hull";
    let o = vm.run(
        &w.project,
        &format!(
            "for d in {dirs}; do echo planted > $d/left-by-a-run && \
             mkdir -p $d/dir/sub && echo planted > $d/dir/sub/f && chmod 0 $d/dir; done; \
             echo 'echo pwned' >> /home/hull/.bashrc; \
             ls -d {}",
            dirs.split(' ')
                .map(|d| format!("{d}/left-by-a-run {d}/dir"))
                .collect::<Vec<_>>()
                .join(" ")
        ),
    );
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).lines().count(),
        8,
        "control: {}",
        show(&o)
    );
    let o = vm.run(
        &w.project,
        &format!(
            "for d in {dirs}; do ls -d $d/left-by-a-run $d/dir 2>/dev/null; done; \
             grep -s pwned /home/hull/.bashrc; echo mine > $HOME/x && \
             echo project-visible > seen.txt && echo end"
        ),
    );
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "end\n",
        "the last run's files are still there: {}",
        show(&o)
    );
    // The shares below /tmp (the project, the VM's tmp) were left alone.
    assert_eq!(
        std::fs::read_to_string(w.project.join("seen.txt")).unwrap_or_default(),
        "project-visible\n",
        "{}",
        show(&o)
    );
    // What cannot be emptied (a tree deeper than the walk goes) fails the
    // next run before its command starts, naming the scratch, and takes
    // the VM down; the run after that gets a fresh VM, with nothing left.
    let deep = vec!["d"; 600].join("/");
    vm.run(
        &w.project,
        &format!("mkdir -p /var/tmp/{deep} && echo planted > /var/tmp/{deep}/f && echo deep"),
    );
    let o = vm
        .cmd(&w.project, &[], "echo ran > ran.txt")
        .stdin(Stdio::null())
        .output()
        .expect("hull run");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(125), "{}", show(&o));
    assert!(
        err.contains("cannot empty the container's /tmp, /var/tmp")
            && err.contains("did not run")
            && err.contains("fresh one"),
        "{}",
        show(&o)
    );
    assert!(
        !w.project.join("ran.txt").exists(),
        "the command ran: {}",
        show(&o)
    );
    let o = vm
        .cmd(&w.project, &[], "ls -A /var/tmp; echo ran > ran.txt")
        .stdin(Stdio::null())
        .output()
        .expect("hull run");
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "", "{}", show(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("starting a fresh one"),
        "{}",
        show(&o)
    );
    assert!(w.project.join("ran.txt").is_file());
    vm.down();
}

tiers!(
    common: [
        the_command_s_environment_reaches_no_helper,
        protected_metadata_holds,
        nothing_of_a_run_outlives_a_killed_hull,
        concurrent_runs_cannot_reach_each_other,
    ],
    bwrap: [bwrap_holds_none_of_the_command_s_environment],
    vm: [
        protected_metadata_holds,
        a_kept_vm_s_name_carries_nothing_to_another_project,
        runs_in_a_kept_vm_take_turns,
        a_kept_vm_s_container_scratch_is_emptied_between_runs,
    ],
);
