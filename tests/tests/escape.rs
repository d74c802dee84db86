#![allow(clippy::expect_used, clippy::unwrap_used)]
// The escape matrix and the end-to-end tests drive the Linux tiers (bubblewrap,
// Landlock, tier 3 on QEMU): off Linux this crate is empty, and type-checks.
#![cfg(target_os = "linux")]
//! The escape matrix: one suite, every tier. Each case runs real commands
//! under `hull run --tier T` and asserts both the exit status and the state
//! of the files afterwards (a denied write fails AND the file is unchanged;
//! an allowed write succeeds AND lands).

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use hull_tests::{feed, marked_sleep, pids_with, require_tier, show, started, Tree, World};

fn hull_policy_default() -> String {
    std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../policies/default.toml"
    ))
    .expect("policies/default.toml")
}

/// A policy file in `w`'s root: the default profile with `path` added to
/// its `read` grants. Returns its path, for `--policy`.
fn default_policy_reading(w: &World, file: &str, path: &Path) -> String {
    let pol = w.root.path().join(file);
    let text = hull_policy_default().replace(
        "read = [",
        &format!("read = [{:?}, ", path.to_str().expect("utf8")),
    );
    std::fs::write(&pol, text).expect("write policy");
    pol.to_str().expect("utf8").to_string()
}

/// The command ran (hull did not fail: not 125) and failed.
fn failed(o: &std::process::Output) -> bool {
    assert_ne!(
        o.status.code(),
        Some(125),
        "hull itself failed: {}",
        show(o)
    );
    o.status.code().is_some_and(|c| c != 0)
}

// ---- negative cases ---------------------------------------------------

/// Creates an instance with a spill file; returns (instance id, spill file path).
fn instance_with_spill(w: &World, t: &str) -> (String, std::path::PathBuf) {
    let o = w.run(t, &["--spill=200"], "seq 1 2000");
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let text = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    let path = text
        .split_whitespace()
        .find(|s| s.contains("/spill/"))
        .map(|s| s.trim_end_matches([']', '.', ',', ';']).to_string())
        .unwrap_or_else(|| panic!("no spill path in output: {}", show(&o)));
    let path = std::path::PathBuf::from(path);
    assert!(path.exists(), "spill file {} missing", path.display());
    let id = path
        .strip_prefix(&w.runs)
        .ok()
        .and_then(|r| r.components().next())
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .unwrap_or_else(|| {
            panic!(
                "spill {} not in runs dir {}",
                path.display(),
                w.runs.display()
            )
        });
    (id, path)
}

fn spill_is_readable_not_writable(t: &str) {
    require_tier(t);
    let w = World::new();
    let (id, spill) = instance_with_spill(&w, t);
    let before = std::fs::read(&spill).expect("spill");
    assert!(String::from_utf8_lossy(&before).contains("\n1999\n"));
    // positive: a later command of the same instance reads it
    let o = w.run(
        t,
        &["--instance", &id],
        &format!("grep -c . '{}'", spill.display()),
    );
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "2000",
        "{}",
        show(&o)
    );
    // negative: it cannot write, replace or remove it, nor add files
    let dir = spill.parent().expect("spill dir");
    let o = w.run(
        t,
        &["--instance", &id],
        &format!("echo x >> '{0}' || true; rm -f '{0}' || true; echo y > '{1}/new' || true; mv '{0}' '{1}/moved' 2>/dev/null; test ! -e '{1}/new'", spill.display(), dir.display()),
    );
    assert_eq!(
        std::fs::read(&spill).expect("spill still there"),
        before,
        "{}",
        show(&o)
    );
    assert!(!dir.join("new").exists());
    assert!(!dir.join("moved").exists());
    let o = w.run(t, &["--instance", &id], "echo x > \"$HULL_SPILL/direct\"");
    assert!(failed(&o), "{}", show(&o));
    assert!(!dir.join("direct").exists());
}

fn other_instance_is_invisible(t: &str) {
    require_tier(t);
    let w = World::new();
    // Instance B: alive, with a secret in its tmp and a file in its spill.
    let mut b = w
        .cmd(t, &[], "echo \"$TMPDIR $HULL_SPILL\"; echo b-secret > \"$TMPDIR/secret\"; echo ready; exec sleep 60")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn B");
    let mut lines = BufReader::new(b.stdout.take().expect("stdout")).lines();
    let paths = lines.next().expect("B paths").expect("read");
    assert_eq!(lines.next().expect("B ready").expect("read"), "ready");
    let mut it = paths.split_whitespace();
    let (btmp, bspill) = (
        it.next().expect("tmp").to_string(),
        it.next().expect("spill").to_string(),
    );
    std::fs::write(format!("{bspill}/out.txt"), "b-spill").expect("host writes B's spill");
    // What the host holds of B's tmp and spill, names and contents.
    let b_dir = Path::new(&bspill)
        .parent()
        .expect("B's instance dir")
        .to_path_buf();
    let held = || -> Vec<(String, Vec<u8>)> {
        let mut all = Vec::new();
        let mut stack = vec![b_dir.join("tmp"), b_dir.join("spill")];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p.clone());
                }
                all.push((
                    p.display().to_string(),
                    std::fs::read(&p).unwrap_or_default(),
                ));
            }
        }
        all.sort();
        all
    };
    let before = held();
    assert!(
        before
            .iter()
            .any(|(p, c)| p.ends_with("/spill/out.txt") && c == b"b-spill"),
        "{before:?}"
    );
    // Instance A tries everything on B's dirs, by their real paths.
    let o = w.run(t, &[], &format!("cat '{btmp}/secret'"));
    assert!(failed(&o), "{}", show(&o));
    assert!(!String::from_utf8_lossy(&o.stdout).contains("b-secret"));
    let o = w.run(t, &[], &format!("cat '{bspill}/out.txt'"));
    assert!(failed(&o), "{}", show(&o));
    let o = w.run(
        t,
        &[],
        &format!(
            "echo evil > '{btmp}/secret'; echo evil > '{btmp}/new'; echo evil > '{bspill}/out.txt'"
        ),
    );
    assert!(failed(&o), "{}", show(&o));
    // Nothing of B's changed, and nothing new appeared there.
    assert_eq!(held(), before, "{}", show(&o));
    let _ = b.kill();
    let _ = b.wait();
}

/// A writable home: the shell startup files that do not exist stay
/// uncreatable during the run (a ~/.bashrc written by the command runs in
/// the user's next shell), and nothing is left for them afterwards (an empty
/// ~/.bash_profile left behind stops bash from reading ~/.profile).
fn shell_rc_files_in_a_writable_home(t: &str) {
    require_tier(t);
    let w = World::new();
    std::fs::write(w.home.join(".profile"), "# the user's profile\n").expect("write");
    let pol = w.root.path().join("home-rw.toml");
    let text = hull_policy_default().replace(
        "read_write = [\"${PROJECT}\"]",
        "read_write = [\"${PROJECT}\", \"${HOME}\"]",
    );
    assert!(text.contains("${HOME}\"]"), "policy edit");
    std::fs::write(&pol, text).expect("write policy");
    let pol = pol.to_str().expect("utf8");
    // The policy sets HOME to the run's tmp: name the home by its path.
    let attacks: Vec<String> = [
        "echo 'echo pwned' > H/.bash_profile",
        "echo 'echo pwned' >> H/.profile",
        "mkdir -p H/.config/fish && echo 'echo pwned' > H/.config/fish/config.fish",
        "mv H/.config H/.config-moved; mkdir -p H/.config/fish && \
         echo 'echo pwned' > H/.config/fish/config.fish",
    ]
    .iter()
    .map(|a| a.replace('H', &w.home.display().to_string()))
    .collect();
    for a in &attacks {
        let control = w.run("none", &["--policy", pol], a);
        assert_eq!(
            control.status.code(),
            Some(0),
            "control {a}: {}",
            show(&control)
        );
        let landed = [".bash_profile", ".profile", ".config/fish/config.fish"]
            .iter()
            .any(|f| std::fs::read_to_string(w.home.join(f)).is_ok_and(|x| x.contains("pwned")));
        assert!(landed, "control {a}: {}", show(&control));
        // Back to the user's own home.
        for n in [".bash_profile", ".config", ".config-moved"] {
            let _ = std::fs::remove_dir_all(w.home.join(n));
            let _ = std::fs::remove_file(w.home.join(n));
        }
        std::fs::write(w.home.join(".profile"), "# the user's profile\n").expect("write");
    }
    for a in &attacks {
        let o = w.run(t, &["--policy", pol], a);
        assert!(failed(&o), "{a}: {}", show(&o));
        assert_eq!(
            w.read(&w.home.join(".profile")),
            "# the user's profile\n",
            "{a}"
        );
    }
    // An allowed write in the home lands (in a directory of it: Landlock
    // creates nothing directly in a directory it splits around protections).
    std::fs::create_dir(w.home.join("work")).expect("mkdir");
    let o = w.run(
        t,
        &["--policy", pol],
        &format!("echo kept > {}/work/notes.txt", w.home.display()),
    );
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(w.read(&w.home.join("work/notes.txt")), "kept\n");
    // Nothing of the placeholders is left: the home holds what it held.
    let mut names: Vec<String> = std::fs::read_dir(&w.home)
        .expect("home")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, [".profile", ".ssh", "work"]);
}

/// inotify inside the grants: a watch in the project works, and a
/// directory inside a read grant that the command's uid cannot read stays
/// unwatchable (hull, root, answers the watch with the command's
/// credentials, never its own). The canary's `inotify_outside` probe covers
/// a watch outside every grant.
fn inotify_in_the_grants_follows_the_command_uid(t: &str) {
    use std::os::unix::fs::PermissionsExt;
    require_tier(t);
    let w = World::new();
    std::fs::write(
        w.project.join("watch.py"),
        "import ctypes, os, select, sys\n\
         libc = ctypes.CDLL(None, use_errno=True)\n\
         def watch(path):\n\
         \x20   fd = libc.inotify_init1(0)\n\
         \x20   return fd, libc.inotify_add_watch(fd, path.encode(), 0x100), ctypes.get_errno()\n\
         def name(fd):\n\
         \x20   r, _, _ = select.select([fd], [], [], 10)\n\
         \x20   return os.read(fd, 4096)[16:].split(b'\\0')[0].decode() if r else 'nothing'\n\
         fd, wd, e = watch(sys.argv[1])\n\
         print('locked', 'refused' if wd < 0 else 'watching', flush=True)\n\
         fd, wd, e = watch('src')\n\
         open('src/own-file', 'w').close()\n\
         print('own', name(fd) if wd >= 0 else 'refused %d' % e, flush=True)\n",
    )
    .expect("write watch.py");
    let granted = tempfile::Builder::new()
        .prefix("hull-granted-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    std::fs::set_permissions(granted.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
    let locked = granted.path().join("locked");
    std::fs::create_dir(&locked).expect("mkdir");
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let pol = default_policy_reading(&w, "watch.toml", granted.path());
    let script = format!("python3 watch.py '{}'", locked.display());
    let control = w.run("none", &["--policy", &pol], &script);
    let out = String::from_utf8_lossy(&control.stdout);
    assert!(
        out.contains("locked watching"),
        "control: {}",
        show(&control)
    );
    let _ = std::fs::remove_file(w.project.join("src/own-file"));
    let o = w.run(t, &["--policy", &pol], &script);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        assert!(out.contains("locked refused"), "{}", show(&o));
    }
    assert!(
        out.contains("own own-file"),
        "a watch in the project: {}",
        show(&o)
    );
}

/// Unix sockets of the command's own, in the writable roots, still talk
/// on bwrap and on landlock (through hull's connect broker where Landlock
/// cannot mediate them), which refuse a host service's under a grant (the
/// canary's `host_unix_socket` probe). Bound below the project's top: on
/// landlock a directory split around protected names (the top, beside
/// `.git`) takes new entries through hull's create broker, which makes
/// files and directories, not sockets.
fn the_command_s_own_unix_sockets_talk(t: &str) {
    require_tier(t);
    let w = World::new();
    std::fs::write(
        w.project.join("own.py"),
        "import socket, os, threading\n\
         srv = socket.socket(socket.AF_UNIX); srv.bind('src/own.sock'); srv.listen(1)\n\
         def serve():\n    a, _ = srv.accept(); a.sendall(b'hello ' + a.recv(16))\n\
         threading.Thread(target=serve).start()\n\
         up = '../' + os.path.basename(os.getcwd()) + '/src/own.sock'\n\
         c = socket.socket(socket.AF_UNIX); c.connect(up); c.sendall(b'own')\n\
         print('own:', c.recv(32).decode())\n",
    )
    .expect("write own.py");
    let o = w.run(t, &[], "python3 own.py");
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("own: hello own"),
        "{}",
        show(&o)
    );
}

/// TIOCSETD (N_NULL left on the caller's terminal fails every later read
/// and write on it) is refused on any terminal; shown on a pty of the
/// command's own, which is all a test has (on landlock the command cannot
/// open /dev/ptmx: the seccomp crate's own test covers the filter there).
fn line_discipline_is_not_settable(t: &str) {
    require_tier(t);
    let w = World::new();
    let py = "python3 -c 'import os, fcntl, struct; m, s = os.openpty(); \
              fcntl.ioctl(s, 0x5423, struct.pack(\"i\", 0)); print(\"set\")'";
    let control = w.run("none", &[], py);
    assert_eq!(
        control.status.code(),
        Some(0),
        "control: {}",
        show(&control)
    );
    let o = w.run(t, &[], py);
    assert!(failed(&o), "{}", show(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("Operation not permitted"),
        "{}",
        show(&o)
    );
}

/// `stty -echo` on the caller's terminal: after the run the terminal is
/// as before (on a pty of `script`'s, the caller's terminal here).
fn terminal_settings_are_restored(t: &str) {
    require_tier(t);
    let w = World::new();
    let echo_after = |inner: &str| -> Option<bool> {
        let o = std::process::Command::new("script")
            .args(["-qec", &format!("{inner}; stty -a"), "/dev/null"])
            .current_dir(&w.project)
            .env("HOME", &w.home)
            .env("HULL_RUNS_DIR", &w.runs)
            .stdin(Stdio::null())
            .output()
            .expect("script");
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        text.split_whitespace().find_map(|tok| match tok {
            "echo" => Some(true),
            "-echo" => Some(false),
            _ => None,
        })
    };
    // Control: the change outlives the command that made it.
    assert_eq!(echo_after("stty -echo"), Some(false), "control");
    let hull = hull_tests::hull_bin();
    let run = format!(
        "'{}' run --tier {t} --timeout {} -- stty -echo -isig",
        hull.display(),
        hull_tests::RUN_TIMEOUT
    );
    assert_eq!(echo_after(&run), Some(true), "{run}");
}

fn host_env_secret_not_visible(t: &str) {
    require_tier(t);
    let w = World::new();
    // Positive side: a policy that passes the variable makes it visible.
    let pol = w.root.path().join("pass.toml");
    let text = hull_policy_default().replace("pass = [", "pass = [\"HULL_TEST_SECRET\", ");
    std::fs::write(&pol, text).expect("write policy");
    let control = w.run(t, &["--policy", pol.to_str().expect("utf8")], "env");
    assert!(
        String::from_utf8_lossy(&control.stdout).contains("s3cr3t-host-env-value"),
        "control: {}",
        show(&control)
    );
    let o = w.run(t, &[], "env; cat /proc/self/environ");
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert!(
        !String::from_utf8_lossy(&o.stdout).contains("s3cr3t-host-env-value"),
        "{}",
        show(&o)
    );
}

/// On tier 3 the tree runs in a kept VM's container and is looked for
/// there ([`Tree`]): a one-shot VM would take it along whatever the agent
/// did.
fn setsid_grandchild_dies_on_timeout(t: &str) {
    require_tier(t);
    let w = World::new();
    let tree = Tree::new(&w, t);
    let marker = format!("hull-escape-marker-{}", std::process::id());
    let (a, b) = (format!("{marker}-a"), format!("{marker}-b"));
    let script = format!(
        "setsid {} & (setsid {} &); {}; sleep 300",
        marked_sleep(&a, 300),
        marked_sleep(&b, 300),
        tree.announce(&[&a, &b])
    );
    let mut extra = tree.extra();
    extra.extend(["--timeout", "5s"]);
    let mut c = started(w.cmd(t, &extra, &script));
    // The control: both escaped the session and run.
    assert!(!tree.appears(&a).is_empty(), "{a} does not run");
    assert!(!tree.appears(&b).is_empty(), "{b} does not run");
    let st = c.wait().expect("wait");
    assert_eq!(st.code(), Some(124));
    let left = tree.left(&marker);
    assert!(left.is_empty(), "left running: {left:?}");
    drop(tree);
    no_helper_left(&w);
}

/// A background process whose main thread exited while another thread
/// runs: its leader shows as a zombie in /proc, which a sweep that skips
/// zombies never kills (hull then waited for it forever, deaf to SIGTERM).
/// The control, without hull, shows it outliving the shell that started it.
fn a_process_with_an_exited_main_thread_dies_with_the_run(t: &str) {
    require_tier(t);
    let w = World::new();
    let marker = format!("hull-zleader-marker-{}", std::process::id());
    std::fs::write(
        w.project.join("zl.py"),
        "import os, sys, time, threading, ctypes\n\
         if os.fork(): sys.exit(0)\n\
         os.setsid()\n\
         def spin():\n    while True: time.sleep(0.05)\n\
         threading.Thread(target=spin).start()\n\
         ctypes.CDLL(None).pthread_exit(None)\n",
    )
    .expect("write zl.py");
    let script = format!("python3 zl.py {marker} & sleep 1; echo started");
    let kill_left = |marker: &str| {
        for _ in 0..50 {
            let pids = zombie_leaders(marker);
            if pids.is_empty() {
                return;
            }
            for p in pids {
                // SAFETY: kill(2) on a pid just read from /proc.
                unsafe { libc::kill(p, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let control = std::process::Command::new("sh")
        .args(["-c", &script])
        .current_dir(&w.project)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("sh");
    assert!(control.success());
    let survived = eventually(|| !zombie_leaders(&marker).is_empty());
    kill_left(&marker);
    assert!(
        survived,
        "control: no process with an exited main thread outlived sh"
    );

    let tree = Tree::new(&w, t);
    let mut extra = tree.extra();
    extra.extend(["--timeout", "20s"]);
    let started = Instant::now();
    let o = w.run(t, &extra, &script);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "hull waited {:?}",
        started.elapsed()
    );
    let left = if t == "vm" {
        // In the container: the thread that runs on holds the marker in
        // its command line (the leader's is gone).
        tree.left(&marker)
    } else {
        eventually(|| zombie_leaders(&marker).is_empty());
        zombie_leaders(&marker)
            .iter()
            .map(|p| p.to_string())
            .collect()
    };
    kill_left(&marker);
    assert!(left.is_empty(), "left running after the run: {left:?}");
    drop(tree);
    no_helper_left(&w);
}

/// bwrap killed on the host mid-command: the command dies with it
/// (`--die-with-parent`), and hull says that bwrap died, exit 125, instead
/// of passing the kill off as the command's own exit status.
fn a_killed_bwrap_is_named_and_takes_the_command_along(t: &str) {
    require_tier(t);
    let w = World::new();
    let marker = format!("hull-bwrap-victim-{}", std::process::id());
    let mut cmd = w.cmd(
        t,
        &[],
        &format!("echo started; exec {}", marked_sleep(&marker, 60)),
    );
    cmd.stderr(Stdio::piped());
    let mut c = started(cmd);
    assert!(
        eventually(|| !pids_with(&marker).is_empty()),
        "the command runs"
    );
    let bwrap = children_with("--json-status-fd", c.id());
    assert_eq!(bwrap.len(), 1, "hull's bwrap: {bwrap:?}");
    let (st, err) = kill_and_wait(&mut c, bwrap[0]);
    assert_eq!(st.code(), Some(125), "{err}");
    assert!(
        err.contains("bubblewrap itself was killed by signal 9"),
        "{err}"
    );
    let left = left_after_10s(&marker);
    assert!(left.is_empty(), "the command outlived bwrap: {left:?}");
}

/// The processes holding `marker` whose parent is `parent` (a run's own
/// helpers, not another test's).
fn children_with(marker: &str, parent: u32) -> Vec<i32> {
    pids_with(marker)
        .into_iter()
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|s| {
                    s.rsplit_once(')')
                        .and_then(|(_, r)| r.split_whitespace().nth(1)?.parse::<u32>().ok())
                })
                == Some(parent)
        })
        .collect()
}

/// SIGKILLs `pid`, a helper of the run `c` (started with stderr piped),
/// and returns how the run ended and what it said on stderr.
fn kill_and_wait(c: &mut std::process::Child, pid: i32) -> (std::process::ExitStatus, String) {
    // SAFETY: kill(2) on the pid of the run's child, just read from /proc.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let st = c.wait().expect("wait");
    let mut err = String::new();
    c.stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err)
        .expect("read");
    (st, err)
}

/// Processes holding `marker` whose leader is a zombie with live threads.
fn zombie_leaders(marker: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        if stat
            .rsplit_once(')')
            .map(|(_, r)| r.trim_start().starts_with('Z'))
            != Some(true)
        {
            continue;
        }
        // The exited leader has no memory to show a command line from;
        // its live threads do.
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        let live = tasks.flatten().any(|t| {
            t.file_name() != pid.to_string().as_str()
                && std::fs::read(t.path().join("cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker))
        });
        if live {
            out.push(pid);
        }
    }
    out
}

/// Whether `cond` holds within 10 s (polled every 50 ms).
fn eventually(cond: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    true
}

/// The processes whose command line holds `marker`, once none is left or
/// after 10 s.
fn left_after_10s(marker: &str) -> Vec<i32> {
    eventually(|| pids_with(marker).is_empty());
    pids_with(marker)
}

/// Nothing started for the world's runs (on tier 3: QEMU and virtiofsd,
/// whose sockets live in the runs dir; the command's tree was in the VM)
/// outlives the run.
fn no_helper_left(w: &World) {
    let left = left_after_10s(&w.runs.to_string_lossy());
    assert!(
        left.is_empty(),
        "helpers of the run still running: {left:?}"
    );
}

/// A process that forks whenever a pid slot frees (a loop of background
/// subshells against the policy's `pids` limit) is ended with the run: in
/// a kept VM the next run sees none of it. Against a `/proc` walk that
/// kills what it lists, such a holder refills each slot it frees.
fn a_fork_holder_ends_with_the_run(t: &str) {
    require_tier(t);
    let w = World::new();
    let tree = Tree::new(&w, t);
    let marker = format!("hull-forks-marker-{}", std::process::id());
    let (a, b) = marker.split_at(marker.len() / 2);
    let script = format!(
        "sh -c 'while :; do (sleep 60; :) & done' \"{a}\"\"{b}\" >/dev/null 2>&1 & \
         {}; sleep 300",
        tree.announce(&[&marker])
    );
    let mut extra = tree.extra();
    extra.extend(["--timeout", "8s"]);
    let mut c = started(w.cmd(t, &extra, &script));
    assert!(!tree.appears(&marker).is_empty(), "{marker} does not run");
    let st = c.wait().expect("wait");
    assert_eq!(st.code(), Some(124));
    let left = tree.left(&marker);
    assert!(left.is_empty(), "left running: {} processes", left.len());
    drop(tree);
    no_helper_left(&w);
}

fn interrupt_kills_the_tree(t: &str) {
    require_tier(t);
    let w = World::new();
    let tree = Tree::new(&w, t);
    let marker = format!("hull-int-marker-{}", std::process::id());
    let mut cmd = w.cmd(
        t,
        &tree.extra(),
        &format!(
            "(setsid {} &); {}; sleep 300",
            marked_sleep(&marker, 300),
            tree.announce(&[&marker])
        ),
    );
    cmd.stderr(std::process::Stdio::piped());
    let mut c = started(cmd);
    // The control: the marked process runs.
    assert!(!tree.appears(&marker).is_empty(), "{marker} does not run");
    // SAFETY: sending SIGINT to the hull child we spawned.
    unsafe {
        libc::kill(c.id() as i32, libc::SIGINT);
    }
    let st = c.wait().expect("wait");
    assert_eq!(st.code(), Some(130));
    // hull says once what ended the run.
    let mut err = String::new();
    std::io::Read::read_to_string(&mut c.stderr.take().expect("stderr"), &mut err).expect("stderr");
    let said = format!("hull: tier {t}: hull received SIGINT (Ctrl-C), and ended the command");
    assert_eq!(err.matches(&said).count(), 1, "{err}");
    let left = tree.left(&marker);
    assert!(left.is_empty(), "left running: {left:?}");
    drop(tree);
    no_helper_left(&w);
}

/// The caller's stdout is a log file: the command's output lands after
/// what the log held (the canary's `stdout_file_reopened` probe shows the
/// command cannot read or truncate it through `/proc/self/fd/1`).
fn a_stdout_file_gets_the_output_after_what_it_held(t: &str) {
    require_tier(t);
    let w = World::new();
    let log = w.root.path().join("caller.log");
    std::fs::write(&log, "earlier\n").expect("log");
    let f = std::fs::OpenOptions::new()
        .append(true)
        .open(&log)
        .expect("open log");
    let o = w
        .cmd(t, &[], "echo one; echo two >&2; echo three")
        .stdin(Stdio::null())
        .stdout(f)
        .output()
        .expect("hull");
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(w.read(&log), "earlier\none\nthree\n", "{}", show(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("two"),
        "{}",
        show(&o)
    );
}

/// A project with its own `.hull` keeps landlock's spare pool for the next
/// run. A command that writes into every spare it can reach (files
/// appended to, an entry made in each directory) gets that far (the
/// attack's control: the spares are reachable by path and writable), and
/// the next run's new file and directory, which are spares of that pool,
/// come to it empty: the changed spares were made anew.
#[cfg(feature = "landlock")]
#[test]
fn a_spare_written_by_one_run_reaches_no_later_run() {
    require_tier("landlock");
    let w = World::new();
    w.git_init();
    std::fs::create_dir(w.project.join(".hull")).expect("mkdir .hull");
    plant_every_spare(&w, "");
    let pools = || {
        std::fs::read_dir(w.project.join(".hull"))
            .expect(".hull")
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("spares-"))
            .count()
    };
    assert_eq!(pools(), 1, "the pool is kept");
    let o = w.run(
        "landlock",
        &[],
        "echo mine >> new.txt && mkdir newdir && cat new.txt && ls -A newdir && echo end",
    );
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "mine\nend\n",
        "{}",
        show(&o)
    );
    assert_eq!(w.read(&w.project.join("new.txt")), "mine\n");
    assert_eq!(
        std::fs::read_dir(w.project.join("newdir"))
            .expect("newdir")
            .count(),
        0
    );
    assert_eq!(pools(), 1, "the next run adopted the pool");
}

/// A landlock run that writes into every spare of the project's pool it
/// reaches by path (files appended to, an entry made in each directory),
/// then runs `also`; asserts it got that far (the attack's control: the
/// spares are reachable and writable).
fn plant_every_spare(w: &World, also: &str) {
    let plant = format!(
        "n=0; for f in .hull/spares-*/c*/*; do \
         if [ -d \"$f\" ]; then echo planted > \"$f/inside\" && n=$((n+1)); \
         else echo planted >> \"$f\" && n=$((n+1)); fi; done 2>/dev/null; {also} echo $n"
    );
    let o = w.run("landlock", &[], &plant);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let planted: u32 = String::from_utf8_lossy(&o.stdout)
        .trim()
        .parse()
        .expect("a count");
    assert!(
        planted >= 300,
        "control: only {planted} spares were written"
    );
}

/// The spare pool kept in a project's `.hull` trusts nothing the command
/// can change: one run writes into every spare it reaches by path and then
/// tries to move its pool's seal forward (chmod, touch, an xattr), which
/// used to make the planted spares look sealed; the next run's new
/// directories and files, spares of that pool, come to it empty.
#[cfg(feature = "landlock")]
#[test]
fn a_planted_spare_and_a_touched_seal_reach_no_later_run() {
    require_tier("landlock");
    let w = World::new();
    w.git_init();
    std::fs::create_dir(w.project.join(".hull")).expect("mkdir .hull");
    plant_every_spare(
        &w,
        "for s in .hull/spares-*/seal; do chmod 0644 \"$s\"; touch \"$s\"; \
         /usr/bin/python3 -c 'import os,sys; os.setxattr(sys.argv[1], \"user.x\", b\"1\")' \"$s\"; \
         done 2>/dev/null;",
    );
    new_entries_come_empty(&w);
}

/// A landlock run makes eight directories and files at the project's top
/// (spares of its pool): each comes to it, and lands, empty.
fn new_entries_come_empty(w: &World) {
    let o = w.run(
        "landlock",
        &[],
        "for i in 1 2 3 4 5 6 7 8; do mkdir d$i && ls -A d$i; touch f$i && cat f$i; done; echo end",
    );
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "end\n", "{}", show(&o));
    for i in 1..=8 {
        let d = w.project.join(format!("d{i}"));
        assert_eq!(
            std::fs::read_dir(&d).expect("dir").count(),
            0,
            "{}",
            d.display()
        );
        let f = w.project.join(format!("f{i}"));
        assert_eq!(
            std::fs::metadata(&f).expect("file").len(),
            0,
            "{}",
            f.display()
        );
    }
}

/// The spare pools hull keeps in its runs root (`spares/`), by name.
fn shared_pools(w: &World) -> Vec<String> {
    std::fs::read_dir(w.runs.join("spares"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("spares-"))
                .collect()
        })
        .unwrap_or_default()
}

/// A project with no `.hull` of its own (as harnesses make them) gets its
/// new top-level entries from a pool hull keeps in its runs root: they
/// land, nothing is made in the project (no `.hull`), and the next run
/// adopts the same pool instead of making one.
#[cfg(feature = "landlock")]
#[test]
fn a_project_without_hull_takes_a_pool_kept_in_the_runs_root() {
    require_tier("landlock");
    let w = World::new();
    w.git_init();
    let mut first = None;
    for round in 0..2 {
        let o = w.run(
            "landlock",
            &[],
            &format!("echo {round} > new{round}.txt && mkdir dir{round} && cat new{round}.txt"),
        );
        assert_eq!(o.status.code(), Some(0), "{}", show(&o));
        assert_eq!(String::from_utf8_lossy(&o.stdout), format!("{round}\n"));
        assert_eq!(
            w.read(&w.project.join(format!("new{round}.txt"))),
            format!("{round}\n")
        );
        assert!(w.project.join(format!("dir{round}")).is_dir());
        assert!(
            !w.project.join(".hull").exists(),
            "the run made a .hull in the project"
        );
        let pools = shared_pools(&w);
        assert_eq!(pools.len(), 1, "{pools:?}");
        match &first {
            None => first = Some(pools[0].clone()),
            Some(f) => assert_eq!(&pools[0], f, "the next run adopted the pool"),
        }
    }
}

/// The pool in hull's runs root trusts nothing a command could do to it:
/// every spare is written to by path (the control, under tier none, shows
/// they are there and writable); a landlock command that tries the same
/// reaches none of them when hull is root (its sandbox user cannot enter
/// the runs root) and, as an ordinary user, writes only spares that the
/// next run then makes anew; that run's new files and directories, spares
/// of the same pool, come to it empty.
#[cfg(feature = "landlock")]
#[test]
fn a_planted_spare_of_the_runs_root_pool_reaches_no_later_run() {
    require_tier("landlock");
    let w = World::new();
    w.git_init();
    let o = w.run("landlock", &[], "true");
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(shared_pools(&w).len(), 1);
    let plant = format!(
        "n=0; for f in {}/spares/spares-*/c*/*; do \
         if [ -d \"$f\" ]; then echo planted > \"$f/inside\" && n=$((n+1)); \
         else echo planted >> \"$f\" && n=$((n+1)); fi; done 2>/dev/null; echo $n",
        w.runs.display()
    );
    let planted = |o: &std::process::Output| -> u32 {
        assert_eq!(o.status.code(), Some(0), "{}", show(o));
        String::from_utf8_lossy(&o.stdout)
            .trim()
            .parse()
            .expect("a count")
    };
    let control = planted(&w.run("none", &[], &plant));
    assert!(
        control >= 300,
        "control: only {control} spares were written"
    );
    let o = w.run("landlock", &[], &plant);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        assert_eq!(
            planted(&o),
            0,
            "the sandbox user wrote a spare of the runs root"
        );
    } else {
        assert!(planted(&o) >= 300, "{}", show(&o));
    }
    new_entries_come_empty(&w);
    assert_eq!(shared_pools(&w).len(), 1, "the pool was adopted");
}

/// Runs on a project without `.hull` at the same time: each takes a pool
/// of its own from hull's runs root (a pool serves one run at a time), and
/// nothing is made in the project; a `.hull` the project has keeps its
/// pool (above).
#[cfg(feature = "landlock")]
#[test]
fn concurrent_runs_leave_no_hull_directory_of_theirs() {
    require_tier("landlock");
    let w = World::new();
    w.git_init();
    let runs: Vec<std::process::Child> = (0..2)
        .map(|_| {
            w.hull()
                .args([
                    "run",
                    "-q",
                    "--tier",
                    "landlock",
                    "--timeout",
                    hull_tests::RUN_TIMEOUT,
                ])
                .args([
                    "--",
                    "sh",
                    "-c",
                    "for i in 1 2 3 4 5 6 7 8; do sleep 0.05; done",
                ])
                .current_dir(&w.project)
                .stdin(Stdio::null())
                .spawn()
                .expect("spawn hull run")
        })
        .collect();
    // A third starts while the two hold the `.hull` one of them made.
    std::thread::sleep(std::time::Duration::from_millis(150));
    let o = w.run("landlock", &[], "ls -A .hull | wc -l");
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    for mut r in runs {
        assert!(r.wait().expect("wait").success());
    }
    let pools = shared_pools(&w);
    assert!(pools.len() >= 2, "one pool each at once: {pools:?}");
    assert!(
        !w.project.join(".hull").exists(),
        "left: {:?}",
        std::fs::read_dir(w.project.join(".hull")).map(|d| d.count())
    );
}

/// The landlock tier run by an ordinary user: the command is that user and
/// owns the user's files everywhere, and Landlock does not mediate
/// metadata, so hull's broker must refuse changes outside the writable
/// roots (and a symlink inside pointing out, and a descriptor of a file the
/// policy grants read-only) while those inside land.
#[cfg(feature = "landlock")]
#[test]
#[ignore = "needs root: runs hull as the user nobody"]
fn landlock_as_a_user_changes_no_metadata_outside() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    require_tier("landlock");
    let w = hull_tests::nobody::AsNobody::new();
    let (u, project) = (&w.u, &w.project);
    let (outside, ro) = (u.join("outside"), u.join("ro"));
    for d in [&project.join("sub"), &outside, &ro] {
        std::fs::create_dir_all(d).expect("mkdir");
    }
    let key = outside.join("key");
    let granted = ro.join("tool");
    let inside = project.join("sub/f");
    let set = |p: &std::path::Path, mode| {
        let _ = std::fs::remove_file(p);
        std::fs::write(p, "x").expect("write");
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
    };
    let reset = || {
        set(&key, 0o600);
        set(&granted, 0o600);
        set(&inside, 0o600);
        let _ = std::fs::remove_file(project.join("sub/lnk"));
        w.give_to_nobody();
        std::fs::metadata(&key).expect("key").mtime()
    };
    let pol = w.top.path().join("p.toml");
    std::fs::write(
        &pol,
        hull_policy_default().replace("read = [", &format!("read = [\"{}\", ", ro.display())),
    )
    .expect("policy");
    std::fs::set_permissions(&pol, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let script = format!(
        "f=0; chmod 0644 '{k}' && f=1; touch -c -m -d 2001-01-01 '{k}' && f=1; \
         python3 -c 'import os; os.setxattr(\"{k}\", \"user.hull\", b\"x\")' && f=1; \
         ln -s '{k}' sub/lnk; chmod 0644 sub/lnk && f=1; \
         python3 -c 'import os; os.fchmod(os.open(\"{g}\", os.O_RDONLY), 0o644)' && f=1; \
         python3 -c 'import os, threading; t = threading.Thread(target=os.chmod, \
         args=(\"sub/f\", 0o640)); t.start(); t.join()' || f=1; exit $f",
        k = key.display(),
        g = granted.display()
    );
    let run_script = |tier: &str, script: &str| w.run(tier, &pol, script);
    let run = |tier: &str| run_script(tier, &script);
    let mode = |p: &std::path::Path| std::fs::metadata(p).expect("stat").mode() & 0o7777;
    let mtime = reset();
    let control = run("none");
    assert_eq!(
        control.status.code(),
        Some(1),
        "control: {}",
        show(&control)
    );
    assert_eq!(mode(&key), 0o644, "control: {}", show(&control));
    assert_eq!(mode(&granted), 0o644, "control: {}", show(&control));
    assert_ne!(
        std::fs::metadata(&key).expect("key").mtime(),
        mtime,
        "control"
    );

    let mtime = reset();
    let o = run("landlock");
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(mode(&key), 0o600, "{}", show(&o));
    assert_eq!(mode(&granted), 0o600, "{}", show(&o));
    assert_eq!(std::fs::metadata(&key).expect("key").mtime(), mtime);
    assert!(xattr_absent(&key), "{}", show(&o));
    // Inside the project the change landed (made by a thread other than
    // the process's first: the broker finds its process).
    assert_eq!(mode(&inside), 0o640, "{}", show(&o));

    // As the user too, new entries land at the top of the split project,
    // the user's, with the modes asked for; nothing of hull's is left.
    let o = run_script(
        "landlock",
        "echo x > top.txt && chmod 0600 top.txt && mkdir made && echo y > made/f && \
         ln -s t2.txt lnk && mv top.txt t2.txt && cat lnk",
    );
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "x\n");
    let nobody = std::fs::metadata(u).expect("stat").uid();
    for f in ["t2.txt", "made", "made/f", "lnk"] {
        let m = std::fs::symlink_metadata(project.join(f)).expect(f);
        assert_eq!(m.uid(), nobody, "{f}");
    }
    assert_eq!(mode(&project.join("t2.txt")), 0o600);
    assert!(!project.join("top.txt").exists());
    assert!(std::fs::symlink_metadata(project.join(".hull")).is_err());
}

/// The allow list when hull is not root, on landlock and bwrap: the
/// command's network namespace is made inside a user namespace of its own;
/// an allowed name is reached through the proxy, a name not allowed gets
/// the proxy's 403, a direct connection fails and the server sees only the
/// allowed request. The control under tier none, as the same user, shows
/// the direct connection lands.
#[cfg(all(feature = "landlock", feature = "bwrap"))]
#[test]
#[ignore = "needs root: runs hull as the user nobody"]
fn the_allow_list_as_a_user() {
    use std::os::unix::fs::PermissionsExt;
    require_tier("landlock");
    require_tier("bwrap");
    let w = hull_tests::nobody::AsNobody::new();
    let (port, seen) = origin();
    let pol = w.top.path().join("net.toml");
    std::fs::write(&pol, allowlist_policy_text(port, "", "")).expect("policy");
    std::fs::set_permissions(&pol, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let script = format!(
        "curl -sS http://pkgs.test:{port}/a; \
         curl -s -o /dev/null -w ' %{{http_code}} ' http://other.test:{port}/b; \
         curl -sS --noproxy '*' http://127.0.0.1:{port}/c 2>/dev/null || echo direct-refused"
    );
    let drain = || {
        std::thread::sleep(Duration::from_millis(200));
        seen.try_iter().collect::<Vec<_>>()
    };
    let control = w.run("none", &pol, &script);
    assert!(
        String::from_utf8_lossy(&control.stdout).ends_with("hello"),
        "control: {}",
        show(&control)
    );
    assert!(
        drain().contains(&"GET /c HTTP/1.1".to_string()),
        "control: the direct request did not land"
    );
    for tier in ["landlock", "bwrap"] {
        let o = w.run(tier, &pol, &script);
        assert_eq!(o.status.code(), Some(0), "{tier}: {}", show(&o));
        assert_eq!(
            String::from_utf8_lossy(&o.stdout),
            "hello 403 direct-refused\n",
            "{tier}: {}",
            show(&o)
        );
        assert_eq!(
            drain(),
            vec!["GET /a HTTP/1.1".to_string()],
            "{tier}: what the server saw: {}",
            show(&o)
        );
        assert!(
            String::from_utf8_lossy(&o.stderr)
                .contains(&format!("network: refused other.test:{port} (1 time)")),
            "{tier}: {}",
            show(&o)
        );
    }
}

/// On landlock the run's tree lives in a cgroup of its own, which is gone
/// after the run.
fn the_tree_lives_in_a_cgroup_of_its_own(t: &str) {
    require_tier(t);
    let w = World::new();
    let o = w.run(t, &[], "cat /proc/self/cgroup");
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let path = out
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .expect("a cgroup v2 line");
    assert!(path.contains("/hull-"), "not in a cgroup of its own: {out}");
    let dir = hull_tests::nobody::cgroup2_mount().join(path.trim_start_matches('/'));
    assert!(!dir.exists(), "{} is left after the run", dir.display());
}

/// No `user.hull` extended attribute on `p`.
fn xattr_absent(p: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).expect("path");
    // SAFETY: getxattr with a NUL-terminated path and name, no buffer.
    let r = unsafe { libc::getxattr(c.as_ptr(), c"user.hull".as_ptr(), std::ptr::null_mut(), 0) };
    r < 0
}

/// The `build` profile's package caches: readable, never writable (an
/// unpacked crate's build.rs runs at the next host build of any project).
fn toolchain_caches_are_read_only(t: &str) {
    require_tier(t);
    let w = World::new();
    let krate = w.home.join(".cargo/registry/src/index-x/dep-1.0.0");
    std::fs::create_dir_all(&krate).expect("mkdir");
    std::fs::write(krate.join("lib.rs"), "pub fn f() {}\n").expect("write");
    let attack = format!(
        "cat '{0}/lib.rs' && f=0; (echo 'fn main() {{}}' > '{0}/build.rs') || f=1; \
         (echo evil >> '{0}/lib.rs') || f=1; exit $f",
        krate.display()
    );
    // The shipped profile, with a memory limit tier 3 restores a snapshot
    // for (above 4 GiB it boots: a minute and a half under TCG).
    let build = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../policies/build.toml"
    ))
    .expect("policies/build.toml");
    let pol = w.root.path().join("build.toml");
    std::fs::write(
        &pol,
        build.replace("memory = \"8GiB\"", "memory = \"2GiB\""),
    )
    .expect("write");
    let pol = pol.to_str().expect("utf8");
    let control = w.run("none", &["--policy", pol], &attack);
    assert_eq!(
        control.status.code(),
        Some(0),
        "control: {}",
        show(&control)
    );
    assert!(
        krate.join("build.rs").exists(),
        "control: {}",
        show(&control)
    );
    std::fs::remove_file(krate.join("build.rs")).expect("rm");
    std::fs::write(krate.join("lib.rs"), "pub fn f() {}\n").expect("write");
    let o = w.run(t, &["--policy", pol], &attack);
    assert!(failed(&o), "{}", show(&o));
    // Readable: the cat ran first and printed the source.
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("pub fn f()"),
        "{}",
        show(&o)
    );
    assert!(!krate.join("build.rs").exists());
    assert_eq!(w.read(&krate.join("lib.rs")), "pub fn f() {}\n");
}

/// A policy grant inside the project that crosses a link the project
/// planted (`sub -> outside`): refused before anything is created, on
/// every tier; nothing appears in the directory the link points to.
fn grant_through_a_planted_link_is_refused(t: &str) {
    require_tier(t);
    let w = World::new();
    std::fs::create_dir_all(w.outside.join("cache")).expect("mkdir");
    std::os::unix::fs::symlink(&w.outside, w.project.join("sub")).expect("symlink");
    let pol = w.root.path().join("link.toml");
    let text = hull_policy_default().replace(
        "read_write = [\"${PROJECT}\"]",
        "read_write = [\"${PROJECT}\", \"sub/cache\"]",
    );
    assert!(text.contains("sub/cache"), "the default profile changed");
    std::fs::write(&pol, text).expect("write policy");
    let pol = pol.to_str().expect("utf8");
    let control = w.run("none", &["--policy", pol], "echo x > sub/cache/planted");
    assert!(
        w.outside.join("cache/planted").exists(),
        "control: {}",
        show(&control)
    );
    std::fs::remove_file(w.outside.join("cache/planted")).expect("rm");
    let o = w.run(t, &["--policy", pol], "echo x > sub/cache/planted");
    assert_eq!(o.status.code(), Some(125), "{}", show(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("a symlink"),
        "{}",
        show(&o)
    );
    let left: Vec<_> = std::fs::read_dir(w.outside.join("cache"))
        .expect("cache")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "created outside the project: {left:?}");
}

/// hull's own state inside a writable root (here the VMs of `hull vm up`,
/// with their QMP sockets) is hidden from the command.
fn hull_state_is_hidden(t: &str) {
    require_tier(t);
    let w = World::new();
    let vms = w.project.join("src/vms");
    std::fs::create_dir_all(vms.join("dev")).expect("mkdir");
    std::fs::write(vms.join("dev/vm.json"), "{\"secret-state\": 1}").expect("write");
    let vms_env = vms.to_str().expect("utf8").to_string();
    let run = |tier: &str, script: &str| {
        w.cmd(tier, &[], script)
            .env("HULL_VMS_DIR", &vms_env)
            .stdin(Stdio::null())
            .output()
            .expect("hull")
    };
    let script = "cat src/vms/dev/vm.json; echo x > src/vms/dev/planted";
    let control = run("none", script);
    assert!(
        String::from_utf8_lossy(&control.stdout).contains("secret-state"),
        "control: {}",
        show(&control)
    );
    std::fs::remove_file(vms.join("dev/planted")).expect("rm");
    let o = run(t, script);
    assert!(failed(&o), "{}", show(&o));
    assert!(
        !String::from_utf8_lossy(&o.stdout).contains("secret-state"),
        "{}",
        show(&o)
    );
    assert!(!vms.join("dev/planted").exists());
}

/// A denied path fails as denied on every tier ("Permission denied", a
/// failing exit), never reads as an empty file or an empty directory. On
/// landlock a denied directory's names still list when its parent is
/// granted (Landlock's `read_dir` reaches every directory below; its files
/// cannot be read: docs/tiers.md).
fn a_denied_path_fails_as_denied(t: &str) {
    require_tier(t);
    let w = World::new();
    let secrets = w.root.path().join("secrets");
    let pol = w.root.path().join("denying.toml");
    denied_paths_fail_as_denied(t, &secrets, &pol, &|tier, script| {
        w.run(tier, &["--policy", pol.to_str().expect("utf8")], script)
    });
}

/// The same with hull run by an ordinary user, who owns the files bwrap
/// masks a denied path with: they read as denied too, not as empty.
#[test]
#[ignore = "needs root: runs hull as the user nobody"]
fn a_denied_path_fails_as_denied_as_a_user() {
    use std::os::unix::fs::PermissionsExt;
    let w = hull_tests::nobody::AsNobody::new();
    let secrets = w.u.join("secrets");
    let pol = w.top.path().join("denying.toml");
    let mut tiers = Vec::new();
    #[cfg(feature = "landlock")]
    tiers.push("landlock");
    #[cfg(feature = "bwrap")]
    tiers.push("bwrap");
    for t in tiers {
        require_tier(t);
        denied_paths_fail_as_denied(t, &secrets, &pol, &|tier, script| {
            std::fs::set_permissions(&pol, std::fs::Permissions::from_mode(0o644)).expect("chmod");
            w.give_to_nobody();
            w.run(tier, &pol, script)
        });
    }
}

/// `secrets/key.txt` and `secrets/dir/inner` denied, `secrets` granted
/// read, by the default profile written to `pol`; each read of them works
/// under the control (`none`) and fails as denied under `t`.
fn denied_paths_fail_as_denied(
    t: &str,
    secrets: &Path,
    pol: &Path,
    run: &dyn Fn(&str, &str) -> std::process::Output,
) {
    std::fs::create_dir_all(secrets.join("dir")).expect("mkdir");
    std::fs::write(secrets.join("key.txt"), "secret-key\n").expect("write");
    std::fs::write(secrets.join("dir/inner"), "secret-inner\n").expect("write");
    let (key, dir) = (secrets.join("key.txt"), secrets.join("dir"));
    let text = hull_policy_default()
        .replace("read = [", &format!("read = [{secrets:?}, "))
        .replace("deny = [", &format!("deny = [{key:?}, {dir:?}, "));
    std::fs::write(pol, text).expect("write policy");
    let (key, dir) = (key.display(), dir.display());
    let mut scripts = vec![
        (format!("cat '{key}'"), "secret-key"),
        (format!("cat '{dir}/inner'"), "secret-inner"),
    ];
    if t != "landlock" {
        scripts.push((format!("ls '{dir}'"), "inner"));
    }
    for (script, secret) in scripts {
        let control = run("none", &script);
        assert!(
            control.status.success() && String::from_utf8_lossy(&control.stdout).contains(secret),
            "control: {}",
            show(&control)
        );
        let o = run(t, &script);
        assert!(failed(&o), "{t}: {script}: {}", show(&o));
        assert!(o.stdout.is_empty(), "{t}: {script}: {}", show(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("Permission denied"),
            "{t}: {script}: {}",
            show(&o)
        );
    }
}

/// A repository the command creates anywhere in a writable root is named
/// after the run (its `.git` is read-only from the next run on; the canary's
/// `nested_repository` probe shows an existing one is read-only now).
fn a_repository_made_in_the_run_is_named(t: &str) {
    require_tier(t);
    let w = World::new();
    w.git_init();
    // In a directory the landlock tier has not split around a protection.
    std::fs::create_dir_all(w.project.join("src/other")).expect("mkdir");
    let o = w.run(
        t,
        &[],
        "mkdir -p src/other/made && cd src/other/made && git init -q .",
    );
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("created the git repository"),
        "{}",
        show(&o)
    );
    assert!(w.project.join("src/other/made/.git/HEAD").exists());
}

/// A project inside a mode-0700 directory of the caller's (the World's
/// root is one): the command works there, and what it creates belongs to
/// the caller on the host, whatever uid the command ran as.
fn new_files_belong_to_the_caller(t: &str) {
    use std::os::unix::fs::MetadataExt;
    require_tier(t);
    let w = World::new();
    let top = std::fs::metadata(w.root.path()).expect("root");
    assert_eq!(top.mode() & 0o777, 0o700, "the test needs a 0700 parent");
    let o = w.run(
        t,
        &[],
        "mkdir -p src/build/out && echo built > src/build/out/artifact && echo more >> src/main.txt && cat src/build/out/artifact",
    );
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "built\n");
    // SAFETY: geteuid/getegid take no arguments and cannot fail.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    for p in [
        "src/build",
        "src/build/out",
        "src/build/out/artifact",
        "src/main.txt",
    ] {
        let m = std::fs::symlink_metadata(w.project.join(p)).expect("created");
        assert_eq!((m.uid(), m.gid()), (uid, gid), "{p}");
    }
    assert_eq!(
        w.read(&w.project.join("src/main.txt")),
        "project-file\nmore\n"
    );
}

// ---- positive cases ----------------------------------------------------

/// What a build does at the top of a git project: create, read back and
/// remove files and directories there (`target/`, `out.txt`), then append,
/// create below and rename in a later run; what is left lands on the host.
/// bwrap and tier 3 protect `.git` and `.hull` with mounts; landlock splits
/// the project around them and its broker places spare entries
/// (`tier::spares`), told nothing.
fn top_level_entries_of_the_project(t: &str) {
    require_tier(t);
    let w = World::new();
    w.git_init();
    let script = "echo top > top.txt && mkdir -p target/deep && echo deep > target/deep/f && \
                  cat top.txt target/deep/f && rm top.txt target/deep/f && rmdir target/deep && \
                  echo kept > out.txt";
    let o = w.run(t, &[], script);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "top\ndeep\n");
    assert!(!String::from_utf8_lossy(&o.stderr).contains("cannot create"));
    assert_eq!(w.read(&w.project.join("out.txt")), "kept\n");
    assert!(!w.project.join("top.txt").exists(), "the removal landed");
    assert!(w.project.join("target").is_dir() && !w.project.join("target/deep").exists());
    // Written where it was created, afterwards, by path and in place.
    let o = w.run(
        t,
        &[],
        "echo again >> out.txt && mkdir -p target/x && echo y > target/x/y && mv out.txt moved.txt",
    );
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(w.read(&w.project.join("moved.txt")), "kept\nagain\n");
    assert_eq!(w.read(&w.project.join("target/x/y")), "y\n");
    assert!(!w.project.join("out.txt").exists());
    // Nothing of hull's is left in the project.
    assert!(
        std::fs::symlink_metadata(w.project.join(".hull")).is_err(),
        "{:?}",
        std::fs::read_dir(w.project.join(".hull")).map(|d| d.count())
    );
}

/// Landlock's create broker (`tier::broker::create`) performs creates,
/// renames and removals directly in the split project itself: it keeps
/// `.git` and `.hull` out of reach under every spelling (a missing `.git`
/// stays missing, even as `.GIT` on a case-folding filesystem), moves
/// nothing into or out of the project's top (EXDEV: tools copy), takes
/// removed files back for later creates unless a process holds them open,
/// and says once, naming the project, when the run's spares are used up.
/// Under tier `none` the same script plants `.git` as a link first.
fn the_create_broker_keeps_the_protections(t: &str) {
    require_tier(t);
    let w = World::new(); // no .git
    std::fs::create_dir_all(w.project.join("sub")).expect("mkdir");
    std::fs::write(w.project.join("sub/f"), "f\n").expect("write");
    let plant = "ln -s /tmp .git";
    let control = w.run("none", &[], plant);
    assert_eq!(
        control.status.code(),
        Some(0),
        "control: {}",
        show(&control)
    );
    std::fs::remove_file(w.project.join(".git")).expect("rm the control's link");
    for a in [
        plant,
        "echo x > x && mv x .git",
        "mkdir .GIT",
        "mkdir .Hull",
        "echo x > .hull",
        "ln sub/f hard",
        "python3 -c 'import os; os.rename(\"sub/f\", \"moved\")'",
        "python3 -c 'import os; os.open(\".\", os.O_TMPFILE | os.O_WRONLY)'",
    ] {
        let o = w.run(t, &[], a);
        assert!(failed(&o), "{a}: {}", show(&o));
    }
    for name in [".git", ".GIT", ".Hull", "hard", "moved"] {
        assert!(
            std::fs::symlink_metadata(w.project.join(name)).is_err(),
            "{name} was created"
        );
    }
    assert_eq!(w.read(&w.project.join("sub/f")), "f\n");
    // mv falls back to a copy across the EXDEV, which lands.
    let o = w.run(t, &[], "rm x && mv sub/f moved && cat moved");
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(w.read(&w.project.join("moved")), "f\n");
    assert!(!w.project.join("sub/f").exists());
    // Files removed again go back to the pool (a configure script's
    // conftest files): many more creates than spares, one after the other.
    let o = w.run(
        t,
        &[],
        "i=0; while [ $i -lt 400 ]; do echo x > c$i && rm c$i || break; i=$((i+1)); done; echo $i",
    );
    assert_eq!(String::from_utf8_lossy(&o.stdout), "400\n", "{}", show(&o));
    // But not while a process holds one open: its contents stay.
    let o = w.run(
        t,
        &[],
        "python3 -c 'import os\n\
         fd = os.open(\"keep\", os.O_CREAT | os.O_RDWR, 0o644)\n\
         os.write(fd, b\"precious\"); os.unlink(\"keep\")\n\
         for i in range(300):\n    open(f\"z{i}\", \"w\").close(); os.unlink(f\"z{i}\")\n\
         os.lseek(fd, 0, 0); print(os.read(fd, 100).decode())'",
    );
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "precious\n",
        "{}",
        show(&o)
    );
    // The pool runs out: the creates it covers land, the next one fails
    // with EDQUOT, and hull says why once.
    let o = w.run(
        t,
        &[],
        "i=0; while [ $i -lt 300 ]; do true > n$i || break; i=$((i+1)); done; echo $i",
    );
    assert_eq!(String::from_utf8_lossy(&o.stdout), "256\n", "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    let told = format!("directly in {}", w.project.display());
    assert_eq!(err.matches(&told).count(), 1, "{err}");
    assert!(err.contains("Disk quota exceeded"), "{err}");
    assert!(w.project.join("n255").is_file() && !w.project.join("n256").exists());
}

/// Tier 3 runs host programs granted by the policy on the image's C
/// library: one built for a newer glibc is refused before anything starts,
/// naming the program and both versions, instead of the guest loader's
/// message after a boot. Shown first under `none`, where the host's loader
/// refuses the same file (a copy of `/bin/true` whose newest GLIBC need is
/// renamed `GLIBC_2.99`); the unpatched copy runs, and the guest's glibc is
/// the one hull assumes (2.36, Debian bookworm).
fn a_host_program_for_a_newer_glibc_is_refused_by_name(t: &str) {
    use std::os::unix::fs::PermissionsExt;
    require_tier(t);
    let w = World::new();
    let mut b = std::fs::read("/bin/true").expect("read /bin/true");
    std::fs::write(w.project.join("plain"), &b).expect("write");
    let newest = b
        .windows(10)
        .filter(|x| x.starts_with(b"GLIBC_2.") && x[8..].iter().all(u8::is_ascii_digit))
        .max()
        .expect("a GLIBC_2.NN need in /bin/true")
        .to_vec();
    let at = b.windows(10).position(|x| x == newest).expect("found");
    b[at..at + 10].copy_from_slice(b"GLIBC_2.99");
    std::fs::write(w.project.join("tool"), &b).expect("write");
    for f in ["plain", "tool"] {
        std::fs::set_permissions(w.project.join(f), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
    }
    let run = |tier: &str, program: &str| run_at(&w, tier, &w.project, &[program]);
    let control = run("none", "./tool");
    assert!(
        failed(&control) && String::from_utf8_lossy(&control.stderr).contains("GLIBC_2.99"),
        "control: {}",
        show(&control)
    );
    let o = run(t, "./tool");
    assert_eq!(o.status.code(), Some(125), "refused by hull: {}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    let named = format!("{} needs glibc 2.99", w.project.join("tool").display());
    assert!(
        err.contains(&named) && err.contains("has glibc 2.36"),
        "{err}"
    );
    let o = run(t, "./plain");
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let o = w.run(t, &[], "ldd --version | head -n 1");
    assert!(
        String::from_utf8_lossy(&o.stdout)
            .trim_end()
            .ends_with(" 2.36"),
        "the guest's glibc is not the one hull assumes: {}",
        show(&o)
    );
}

/// `hull run` on `tier` with `project` as the project and the working
/// directory, running `argv` itself (not through `sh -c`).
fn run_at(w: &World, tier: &str, project: &Path, argv: &[&str]) -> std::process::Output {
    let mut c = w.hull();
    c.arg("run");
    if tier == "vm" {
        c.arg("--tier3");
    } else {
        c.args(["--tier", tier]);
    }
    c.arg("--project")
        .arg(project)
        .args(["--timeout", hull_tests::RUN_TIMEOUT, "--"])
        .args(argv)
        .current_dir(project)
        .stdin(Stdio::null())
        .output()
        .expect("spawn hull")
}

/// A project under the caller's real home (as root `/root`, 0700), with a
/// space and a non-ASCII name: the command creates, reads back and removes
/// files at its top and below, and what it leaves lands as the caller's.
/// (Tier 3 has the same case in tier3_vm.rs,
/// `a_project_under_the_home_directory_runs`.)
fn a_project_under_the_real_home(t: &str) {
    use std::os::unix::fs::MetadataExt;
    require_tier(t);
    let w = World::new();
    let home = std::env::var_os("HOME")
        .map(std::path::PathBuf::from)
        .expect("HOME");
    let dir = tempfile::Builder::new()
        .prefix("hull-home-")
        .tempdir_in(&home)
        .expect("tempdir in HOME");
    let project = dir.path().join("my pröj");
    std::fs::create_dir_all(project.join("src")).expect("mkdir");
    std::fs::write(project.join("input.txt"), "from home\n").expect("write");
    let o = run_at(
        &w,
        t,
        &project,
        &[
            "sh",
            "-c",
            "pwd; cat input.txt; echo top > top.txt; mkdir -p sub/deep; \
             echo deep > sub/deep/f; cat top.txt sub/deep/f; rm sub/deep/f; rmdir sub/deep; \
             echo kept > sub/kept.txt; echo s > src/s.txt",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        format!("{}\nfrom home\ntop\ndeep\n", project.display())
    );
    assert_eq!(w.read(&project.join("top.txt")), "top\n");
    assert_eq!(w.read(&project.join("sub/kept.txt")), "kept\n");
    assert!(!project.join("sub/deep").exists());
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    for f in ["top.txt", "sub", "sub/kept.txt", "src/s.txt"] {
        let m = std::fs::metadata(project.join(f)).expect(f);
        assert_eq!(m.uid(), me, "{f}");
    }
}

/// The escape probes, written once in `hull canary` (orchestrator/src/
/// canary/probes.rs) and asserted here on every tier: `hull canary --tier
/// T --json` on this machine, where every attack lands under its control
/// (tier `none`) and is denied on T, and every allowed read and write lands
/// on both. A probe is n/a only for a reason this host declares (hull not
/// root, no vsock transport here, tier 3 for the host's vsock space or a
/// concurrent run's renames, a spare pool outside landlock). Nothing
/// of the decoy is left in the temp directory.
fn the_canary_reports_no_leak(t: &str) {
    require_tier(t);
    let w = World::new();
    let tmp = w.root.path().join("tmp");
    std::fs::create_dir(&tmp).expect("mkdir");
    let page = w.root.path().join("canary.html");
    let o = w
        .hull()
        .args(["canary", "--json", "--tier", t, "--html"])
        .arg(&page)
        .env("TMPDIR", &tmp)
        .stdin(Stdio::null())
        .output()
        .expect("spawn hull canary");
    let cells: Vec<serde_json::Value> =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", show(&o)));
    let bad: Vec<&serde_json::Value> = cells
        .iter()
        .filter(|c| !matches!(c["verdict"].as_str(), Some("allowed" | "denied")))
        .filter(|c| c["verdict"] != "not_applicable")
        .collect();
    assert!(bad.is_empty(), "{bad:#?}");
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let html = w.read(&page);
    assert!(
        html.contains("<table id=\"matrix\">") && html.contains(&format!("<th>{t}</th>")),
        "{html}"
    );
    let of = |tier: &str| -> Vec<&serde_json::Value> {
        cells.iter().filter(|c| c["tier"] == tier).collect()
    };
    let (control, tier) = (of("none"), of(t));
    assert_eq!(control.len(), tier.len(), "{cells:#?}");
    // Every attack the escape matrix had, by the probe that now holds it.
    let ids: Vec<&str> = control.iter().filter_map(|c| c["probe"].as_str()).collect();
    for id in [
        "read_outside_file",
        "read_home_key",
        "list_home",
        "proc_root",
        "write_outside",
        "overwrite_outside",
        "remove_outside",
        "metadata_outside",
        "git_hook",
        "git_config",
        "move_git",
        "hull_state",
        "protected_before_they_exist",
        "nested_repository",
        "git_config_targets",
        "nested_read_only_grant",
        "rename_an_ancestor",
        "symlink_made_inside",
        "symlink_planted",
        "hardlink_out",
        "root_only_file",
        "setid_bits",
        "kernel_knob",
        "device_node_mode",
        "signal_host_process",
        "prlimit_host_process",
        "host_process_environ",
        "ptrace_host_process",
        "host_sysv_shm",
        "host_unix_socket",
        "tcp_host_loopback",
        "vsock_bind",
        "vsock_host",
        "inotify_outside",
        "outlive_the_run",
        "outlive_hull",
        "mkdir_rmdir_loop",
        "other_run_cwd",
        "swap_a_rule_target",
        "planted_spare",
        "helper_environment",
        "protected_metadata",
        "inherited_descriptor",
        "stdout_file_reopened",
        "write_project",
        "read_grants",
    ] {
        assert!(ids.contains(&id), "no probe {id}: {ids:?}");
    }
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let declared = |c: &serde_json::Value| {
        let why = c["evidence"].as_str().unwrap_or("");
        (!root && why.contains("hull is not root"))
            || (c["probe"] == "vsock_host" && why.contains("no vsock_loopback"))
            || (c["probe"] == "vsock_bind" && c["tier"] == "vm")
            || (c["probe"] == "swap_a_rule_target" && c["tier"] == "vm")
            || (c["probe"] == "planted_spare" && c["tier"] != "landlock")
    };
    for (c, on) in control.iter().zip(&tier) {
        assert_eq!(c["probe"], on["probe"]);
        if on["verdict"] == "not_applicable" {
            assert!(declared(on), "n/a for no declared reason: {on}");
            continue;
        }
        // A probe whose control is its first step on the tier itself.
        if c["probe"] == "planted_spare" {
            assert!(declared(c), "{c}");
        } else {
            assert_eq!(c["verdict"], "allowed", "the control must land: {c}");
        }
        let positive = on["class"]
            .as_str()
            .is_some_and(|k| k.starts_with("allowed"));
        let want = if positive { "allowed" } else { "denied" };
        assert_eq!(on["verdict"], want, "{on}");
    }
    assert_eq!(canary_dirs(&tmp), 0, "the decoy was left behind");
}

/// The canary's HTML page, rendered by headless Chromium (Debian's
/// `chromium`, installed by `scripts/setup.sh --test`): the matrix is in
/// the rendered document, with a row per probe and the control's column.
fn the_canary_page_renders_in_chromium(t: &str) {
    require_tier(t);
    let w = World::new();
    let page = w.root.path().join("canary.html");
    let o = w
        .hull()
        .args([
            "canary",
            "--tier",
            t,
            "--probe",
            "read_outside_file",
            "--probe",
        ])
        .args(["write_project", "--html"])
        .arg(&page)
        .env("TMPDIR", w.root.path())
        .stdin(Stdio::null())
        .output()
        .expect("spawn hull canary");
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let dom = hull_tests::chromium_dom(&page, w.root.path());
    assert!(dom.contains("<table id=\"matrix\">"), "{dom}");
    for want in [
        "<th>none (control)</th>",
        &format!("<th>{t}</th>"),
        "<td>read_outside_file</td>",
        "<td>write_project</td>",
        "class=\"denied\"",
        "allowed (expected)",
    ] {
        assert!(dom.contains(want), "{want}: {dom}");
    }
}

/// Interrupted (SIGINT as soon as its decoy exists), the canary stops after
/// the run in progress, removes its decoy, ends its victim processes and
/// exits 130.
fn the_canary_removes_its_decoy_when_interrupted(t: &str) {
    require_tier(t);
    let w = World::new();
    let tmp = w.root.path().join("tmp");
    std::fs::create_dir(&tmp).expect("mkdir");
    let child = w
        .hull()
        .args(["canary", "--json", "--tier", t])
        .env("TMPDIR", &tmp)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn hull canary");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while canary_dirs(&tmp) == 0 {
        assert!(std::time::Instant::now() < deadline, "no decoy appeared");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // The decoy's secret (world-readable, as everything in the decoy): the
    // victim processes carry it in their environment.
    let secret = loop {
        let found = std::fs::read_dir(&tmp)
            .expect("temp dir")
            .flatten()
            .find_map(|e| std::fs::read_to_string(e.path().join("outside/secret.txt")).ok())
            .filter(|s| s.ends_with('\n'));
        if let Some(s) = found {
            break s.trim().to_string();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no decoy secret appeared"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    // SAFETY: kill with a pid we spawned and a signal number.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let o = child.wait_with_output().expect("wait");
    assert_eq!(o.status.code(), Some(130), "{}", show(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("the decoy was removed"));
    assert_eq!(canary_dirs(&tmp), 0, "the decoy was left behind");
    let victim = format!("HULL_CANARY_VICTIM={secret}");
    let left: Vec<String> = std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter(|e| {
            std::fs::read(e.path().join("environ"))
                .is_ok_and(|env| String::from_utf8_lossy(&env).contains(&victim))
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(left.is_empty(), "victim processes left: {left:?}");
}

/// How many canary decoys are in `tmp`.
fn canary_dirs(tmp: &Path) -> usize {
    std::fs::read_dir(tmp)
        .expect("temp dir")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("hull-canary-"))
        .count()
}

/// A flat C project's own make: objects, the program and `make clean` at
/// the top of the project, with modes as the compiler and make set them.
fn a_flat_c_project_makes_at_the_top(t: &str) {
    require_tier(t);
    let w = World::new();
    w.git_init();
    std::fs::write(
        w.project.join("hello.c"),
        "#include <stdio.h>\nint twice(int);\nint main(void) { printf(\"made %d\\n\", twice(21)); return 0; }\n",
    )
    .expect("write");
    std::fs::write(
        w.project.join("twice.c"),
        "int twice(int x) { return 2 * x; }\n",
    )
    .expect("write");
    std::fs::write(
        w.project.join("Makefile"),
        "hello: hello.o twice.o\n\tcc -o $@ hello.o twice.o\n\
         %.o: %.c\n\tcc -c -o $@ $<\n\
         clean:\n\trm -f hello *.o\n",
    )
    .expect("write");
    let o = w.run(t, &[], "make -s && ./hello && ls");
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.starts_with("made 42\n"), "{out}");
    for f in ["hello", "hello.o", "twice.o"] {
        assert!(w.project.join(f).is_file(), "{f} did not land");
    }
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(w.project.join("hello"))
        .expect("stat")
        .permissions()
        .mode();
    assert_eq!(mode & 0o111, 0o111, "the program is executable: {mode:o}");
    let o = w.run(t, &[], "make -s clean && ls");
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    for f in ["hello", "hello.o", "twice.o"] {
        assert!(!w.project.join(f).exists(), "{f} was not removed");
    }
}

/// `read` is not `read_exec`: a program in a `read` grant does not run
/// (execve refused), the same program in a `read_exec` grant does. First
/// shown to run under tier `none`. (Its bytes stay readable: a copy into
/// a writable place runs; the grant only stops running it in place.)
fn read_grant_is_not_executable(t: &str) {
    require_tier(t);
    let w = World::new();
    let (ro, rx) = (w.outside.join("tools-read"), w.outside.join("tools-exec"));
    for d in [&ro, &rx] {
        std::fs::create_dir_all(d).expect("mkdir");
        std::fs::copy("/bin/true", d.join("prog")).expect("copy /bin/true");
    }
    let pol = w.root.path().join("exec.toml");
    let text = hull_policy_default()
        .replace(
            "read = [",
            &format!("read = [{:?}, ", ro.to_str().expect("utf8")),
        )
        .replace(
            "read_exec = [",
            &format!("read_exec = [{:?}, ", rx.to_str().expect("utf8")),
        );
    assert!(
        text.contains("tools-read") && text.contains("tools-exec"),
        "{text}"
    );
    std::fs::write(&pol, text).expect("write policy");
    let pol = pol.to_str().expect("utf8");
    let script = format!(
        "{0}/prog && echo EXEC-RAN; {1}/prog && echo READ-RAN; cmp -s {1}/prog /bin/true && echo READABLE",
        rx.display(),
        ro.display()
    );
    let control = w.run("none", &["--policy", pol], &script);
    assert_eq!(
        String::from_utf8_lossy(&control.stdout),
        "EXEC-RAN\nREAD-RAN\nREADABLE\n",
        "control: {}",
        show(&control)
    );
    let o = w.run(t, &["--policy", pol], &script);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "EXEC-RAN\nREADABLE\n",
        "{}",
        show(&o)
    );
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("Permission denied"),
        "{}",
        show(&o)
    );
}

fn tmp_works_and_tmpdir_is_honoured(t: &str) {
    require_tier(t);
    let w = World::new();
    let o = w.run(t, &[], "f=$(mktemp) && echo data > \"$f\" && cat \"$f\" && case \"$f\" in \"$TMPDIR\"/*) echo in-tmpdir;; esac && test \"$TMP\" = \"$TMPDIR\" && test \"$TEMP\" = \"$TMPDIR\"");
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "data\nin-tmpdir\n");
}

fn exit_codes_and_signals(t: &str) {
    require_tier(t);
    let w = World::new();
    assert_eq!(w.run(t, &[], "exit 42").status.code(), Some(42));
    assert_eq!(w.run(t, &[], "exit 0").status.code(), Some(0));
    assert_eq!(w.run(t, &[], "kill -TERM $$").status.code(), Some(143));
    assert_eq!(w.run(t, &[], "kill -KILL $$").status.code(), Some(137));
}

/// A command line as long as Linux takes runs on every tier: 16
/// arguments of 64 KiB (1 MiB; one argument is held to 128 KiB by the
/// kernel, the whole to `ARG_MAX`, 2 MiB), each reaching the command
/// whole (tier 3 refused more than 256 KiB before).
fn a_command_line_of_a_mebibyte_runs(t: &str) {
    require_tier(t);
    let w = World::new();
    let chunks: Vec<String> = (0..16u8)
        .map(|i| char::from(b'a' + i).to_string().repeat(64 * 1024))
        .collect();
    let o = w
        .cmd(t, &[], "printf %s \"$@\"")
        .arg("sh")
        .args(&chunks)
        .stdin(Stdio::null())
        .output()
        .expect("spawn hull");
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(o.stdout.len(), 16 * 64 * 1024);
    assert!(
        o.stdout == chunks.concat().into_bytes(),
        "the arguments did not arrive whole"
    );
}

/// A program that is not there exits 127 and one that cannot be executed
/// 126, with hull's one-line message naming the program and the tier, as a
/// shell does (shown first for `sh` itself); the command's own exit 1 stays
/// 1, and the same program made executable runs.
fn a_missing_or_unrunnable_program_exits_127_or_126(t: &str) {
    use std::os::unix::fs::PermissionsExt;
    require_tier(t);
    let w = World::new();
    let script = w.project.join("src/plain.sh");
    std::fs::write(&script, "#!/bin/sh\necho ran\n").expect("write");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let shell = |cmd: &str| {
        std::process::Command::new("sh")
            .args(["-c", cmd])
            .current_dir(&w.project)
            .output()
            .expect("sh")
            .status
            .code()
    };
    let interp = w.project.join("src/interp.sh");
    std::fs::write(&interp, "#!/no/such/interp -x\necho ran\n").expect("write");
    std::fs::set_permissions(&interp, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    assert_eq!(shell("no-such-command-hull"), Some(127), "control");
    assert_eq!(shell("./src/plain.sh"), Some(126), "control");
    assert_eq!(shell("./src/interp.sh"), Some(127), "control");
    for (argv0, code, says) in [
        ("no-such-command-hull", 127, "command not found"),
        ("./src/none", 127, "no such file"),
        ("./src/plain.sh", 126, "cannot be executed"),
        ("./src", 126, "cannot be executed"),
        // The interpreter is named, not the script "not found".
        ("./src/interp.sh", 127, "its interpreter /no/such/interp"),
    ] {
        let o = run_at(&w, t, &w.project, &[argv0]);
        // Lower case: tier 3 adds the guest's own reason ("No such file").
        let err = String::from_utf8_lossy(&o.stderr).to_lowercase();
        assert_eq!(o.status.code(), Some(code), "{argv0}: {}", show(&o));
        assert!(
            err.contains(argv0) && err.contains(says) && err.contains(&format!("tier {t}")),
            "{argv0}: {}",
            show(&o)
        );
        // One line, besides the progress of a tier-3 snapshot the first
        // run of a new agent prepares.
        let said = err
            .lines()
            .filter(|l| !l.starts_with("hull: tier vm: preparing the image's snapshot"))
            .count();
        assert_eq!(said, 1, "one line: {}", show(&o));
    }
    let o = run_at(&w, t, &w.project, &["sh", "-c", "exit 1"]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let o = run_at(&w, t, &w.project, &["./src/plain.sh"]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "ran\n");
}

/// A program the host has but the policy hides is named with where the
/// host has it, why the sandbox does not show it, and what would grant
/// it: on PATH (127), through a link in the project (a venv's `python`
/// into a toolchain dir; 127, not the tier's own failure), and shadowed by
/// another of the same name that the sandbox runs instead (said once).
/// Each first shown running the host's program under `none`.
fn a_program_the_policy_hides_is_named_with_what_grants_it(t: &str) {
    use std::os::unix::fs::PermissionsExt;
    require_tier(t);
    let w = World::new();
    let tools = w.outside.join("toolchain/bin");
    std::fs::create_dir_all(&tools).expect("mkdir");
    for name in ["hulltool", "true"] {
        let p = tools.join(name);
        std::fs::write(&p, "#!/bin/sh\necho from-the-toolchain\n").expect("write");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    std::fs::create_dir_all(w.project.join("venv/bin")).expect("mkdir");
    std::os::unix::fs::symlink(tools.join("hulltool"), w.project.join("venv/bin/tool"))
        .expect("symlink");
    let path = format!("{}:/usr/bin:/bin", tools.display());
    let run = |tier: &str, argv: &str| {
        let mut c = w.hull();
        c.args(["run", "--tier", tier, "--project"])
            .arg(&w.project)
            .args(["--timeout", hull_tests::RUN_TIMEOUT, "--", argv])
            .current_dir(&w.project)
            .env("PATH", &path)
            .stdin(Stdio::null());
        c.output().expect("spawn hull")
    };
    let dir = format!("add \"{}\" to", tools.display());
    for (argv, code, says) in [
        (
            "hulltool",
            127,
            format!("on the host it is {}", tools.join("hulltool").display()),
        ),
        (
            "./venv/bin/tool",
            127,
            format!("leads to {}", tools.join("hulltool").display()),
        ),
        (
            "true",
            0,
            format!(
                "on the host PATH finds {} first",
                tools.join("true").display()
            ),
        ),
    ] {
        let control = run("none", argv);
        assert_eq!(
            String::from_utf8_lossy(&control.stdout),
            "from-the-toolchain\n",
            "control: {}",
            show(&control)
        );
        let o = run(t, argv);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(code), "{argv}: {}", show(&o));
        assert!(o.stdout.is_empty(), "{argv}: {}", show(&o));
        assert_eq!(
            err.matches(&says).count(),
            1,
            "{argv}: {says}: {}",
            show(&o)
        );
        assert!(err.contains(&dir), "{argv}: {dir}: {}", show(&o));
        assert!(err.contains(&format!("tier {t}")), "{argv}: {}", show(&o));
    }
}

/// `--json-result FILE`: the run's outcome, exit code, tier and instance,
/// as one document, written also when the command fails and when hull
/// does; a FILE inside the project (which the command could forge or plant
/// a link at) is refused before anything runs, and nothing is written.
fn the_json_result_says_how_the_run_ended(t: &str) {
    require_tier(t);
    let w = World::new();
    let file = w.root.path().join("result.json");
    let f = file.to_str().expect("utf8");
    let read = || -> serde_json::Value {
        serde_json::from_str(&w.read(&file)).expect("the result is JSON")
    };
    let o = w.run(t, &["--json-result", f], "echo out; exit 3");
    assert_eq!(o.status.code(), Some(3), "{}", show(&o));
    let r = read();
    assert_eq!(r["outcome"], "exited", "{r}");
    assert_eq!(r["code"], 3, "{r}");
    assert_eq!(r["exit_code"], 3, "{r}");
    assert_eq!(r["tier"], t, "{r}");
    assert!(r["instance"].as_str().is_some_and(|i| i.len() == 36), "{r}");
    assert!(r["seconds"].as_f64().is_some_and(|s| s > 0.0), "{r}");
    let o = w.run(t, &["--json-result", f], "kill -KILL $$");
    assert_eq!(o.status.code(), Some(137), "{}", show(&o));
    let r = read();
    assert_eq!(r["exit_code"], 137, "{r}");
    if t == "bwrap" {
        // bwrap's init reports a killed command as exit 128+N; hull sees
        // no more than that (docs/tiers.md).
        assert_eq!((&r["outcome"], &r["code"]), (&"exited".into(), &137.into()));
    } else {
        assert_eq!(
            (&r["outcome"], &r["signal"]),
            (&"signaled".into(), &9.into())
        );
    }
    let o = w.run(t, &["--json-result", f, "--timeout", "1s"], "sleep 30");
    assert_eq!(o.status.code(), Some(124), "{}", show(&o));
    // hull says once that it ended the run, and why.
    let said = format!("hull: tier {t}: the command ran past its time limit (1s)");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.matches(&said).count(), 1, "{}", show(&o));
    assert_eq!(read()["outcome"], "timed_out");
    // hull's own failure is a result too.
    let o = w.run(
        t,
        &["--json-result", f, "--policy", "no-such-profile"],
        "true",
    );
    assert_eq!(o.status.code(), Some(125), "{}", show(&o));
    let r = read();
    assert_eq!(r["outcome"], "hull_error", "{r}");
    assert!(
        r["message"]
            .as_str()
            .is_some_and(|m| m.contains("no-such-profile")),
        "{r}"
    );
    // Inside the project: refused, nothing runs, nothing is written.
    let inside = w.project.join("result.json");
    let o = w.run(
        t,
        &["--json-result", inside.to_str().expect("utf8")],
        "echo ran > ran.txt",
    );
    assert_eq!(o.status.code(), Some(125), "{}", show(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("which the command may write"),
        "{}",
        show(&o)
    );
    assert!(!inside.exists() && !w.project.join("ran.txt").exists());
}

fn streams_are_live_and_stdin_passes(t: &str) {
    require_tier(t);
    let w = World::new();
    // The command prints, then waits for a line on stdin: a hull that
    // buffered output until exit would never show "first" and deadlock.
    // `-q`: only the command's own stderr (landlock warns before it runs).
    let mut c = w
        .cmd(
            t,
            &["-q"],
            "echo first; echo err-first >&2; read x; echo \"got $x\"; echo done",
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut out = BufReader::new(c.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("read");
    assert_eq!(line, "first\n");
    let mut err = BufReader::new(c.stderr.take().expect("stderr"));
    let mut eline = String::new();
    err.read_line(&mut eline).expect("read");
    assert_eq!(eline, "err-first\n");
    feed(&mut c, b"ping\n");
    let mut rest = String::new();
    out.read_to_string(&mut rest).expect("read");
    assert_eq!(rest, "got ping\ndone\n");
    assert_eq!(c.wait().expect("wait").code(), Some(0));
}

fn output_is_byte_exact(t: &str) {
    require_tier(t);
    let w = World::new();
    let data: Vec<u8> = (0..300_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    std::fs::write(w.project.join("src/big.bin"), &data).expect("write");
    let o = w.run(t, &[], "cat src/big.bin");
    assert_eq!(o.status.code(), Some(0));
    assert!(
        o.stdout == data,
        "stdout differs from the file ({} vs {} bytes)",
        o.stdout.len(),
        data.len()
    );
}

/// A policy file for the network cases: the system read+exec (and the
/// quoted paths in `more_read_exec`, each after ", "), the project
/// writable, `pkgs.test` allowed on `port`, `pkgs.test` and `other.test`
/// fixed to 127.0.0.1 (reachable through `allow_private`), then `tail`.
/// Returns its path.
fn allowlist_policy(w: &World, port: u16, more_read_exec: &str, tail: &str) -> String {
    let pol = w.root.path().join("net.toml");
    std::fs::write(&pol, allowlist_policy_text(port, more_read_exec, tail)).expect("write policy");
    pol.to_string_lossy().into_owned()
}

/// The `[vm]` section of `tests/fixtures/vm-userland.toml`: tier 3's
/// container with the registries' clients (curl, pip in a venv, npm), for
/// the cases that run them there (the other tiers run the host's own and
/// ignore it). scripts/test.sh builds its image before the tests.
const VM_USERLAND: &str = {
    const FIXTURE: &str = include_str!("../fixtures/vm-userland.toml");
    const START: usize = match find(FIXTURE.as_bytes(), b"\n[vm]\n") {
        Some(i) => i + 1,
        None => panic!("tests/fixtures/vm-userland.toml has no [vm] section"),
    };
    FIXTURE.split_at(START).1
};

/// Where `needle` first starts in `hay` (const: [`VM_USERLAND`] is one).
const fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    let mut i = 0;
    while i + needle.len() <= hay.len() {
        let mut j = 0;
        while j < needle.len() && hay[i + j] == needle[j] {
            j += 1;
        }
        if j == needle.len() {
            return Some(i);
        }
        i += 1;
    }
    None
}

/// The text of [`allowlist_policy`].
fn allowlist_policy_text(port: u16, more_read_exec: &str, tail: &str) -> String {
    format!(
            "version = 1\n[fs]\nread_exec = [\"/usr\", \"/bin\", \"/lib\", \"/lib64\", \"/etc\"{more_read_exec}]\n\
             read_write = [\"${{PROJECT}}\"]\n[net]\nmode = \"allowlist\"\nallow = [\"pkgs.test\"]\n\
             ports = [{port}]\nhosts = {{ \"pkgs.test\" = \"127.0.0.1\", \"other.test\" = \"127.0.0.1\" }}\n\
             allow_private = [\"127.0.0.1/32\"]\n{tail}"
    )
}

/// The network audits in the spills of `w`'s instances.
fn net_audits(w: &World) -> Vec<String> {
    std::fs::read_dir(&w.runs)
        .expect("runs")
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("spill/net-audit.jsonl")).ok())
        .collect()
}

/// A loopback HTTP server standing in for a registry: answers every
/// request with `hello` and reports each request's first line.
fn origin() -> (u16, std::sync::mpsc::Receiver<String>) {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { break };
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let mut buf = vec![0u8; 16 * 1024];
            let n = s.read(&mut buf).unwrap_or(0);
            let text = String::from_utf8_lossy(&buf[..n]).into_owned();
            let _ = tx.send(text.lines().next().unwrap_or("").to_string());
            let _ = s.write_all(
                b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: close\r\n\r\nhello",
            );
        }
    });
    (port, rx)
}

/// `net.mode = "allowlist"` on a tier with the proxy: an allowed name is
/// reached through `HTTP_PROXY` (python's urllib), a name not allowed gets
/// a 403 from hull and the server sees nothing, a direct connection that
/// ignores the proxy fails at once and the server sees nothing, a DNS
/// lookup fails within a second; the audit in the spill has both
/// decisions and hull names the refused host on stderr; the command's
/// network has no interface but loopback. The control under tier none
/// shows the direct connection lands.
fn only_allowed_names_are_reached_through_the_proxy(t: &str) {
    require_tier(t);
    let w = World::new();
    let (port, seen) = origin();
    let pol = allowlist_policy(&w, port, "", "");
    std::fs::write(
        w.project.join("net.py"),
        format!(
            "import socket, sys, time, urllib.request, urllib.error\n\
             what = sys.argv[1]\n\
             if what in ('all', 'allowed'):\n\
             \x20   print('allowed', urllib.request.urlopen('http://pkgs.test:{port}/simple/').read().decode(), flush=True)\n\
             if what == 'all':\n\
             \x20   try:\n\
             \x20       urllib.request.urlopen('http://other.test:{port}/x'); print('other reached')\n\
             \x20   except urllib.error.HTTPError as e:\n\
             \x20       print('other', e.code, e.headers.get('X-Hull-Refused') is not None, flush=True)\n\
             t = time.time()\n\
             try:\n\
             \x20   socket.create_connection(('127.0.0.1', {port}), timeout=5).sendall(b'GET /direct HTTP/1.0\\r\\n\\r\\n'); print('direct connected', flush=True)\n\
             except OSError as e:\n\
             \x20   print('direct refused', time.time() - t < 1.0, flush=True)\n\
             if what == 'all':\n\
             \x20   t = time.time()\n\
             \x20   try:\n\
             \x20       socket.getaddrinfo('pkgs.test', 443); print('dns answered')\n\
             \x20   except OSError:\n\
             \x20       print('dns failed', time.time() - t < 1.0, flush=True)\n\
             \x20   print('interfaces', [n for _, n in socket.if_nameindex()], flush=True)\n"
        ),
    )
    .expect("write net.py");
    let drain = || seen.try_iter().collect::<Vec<_>>();
    // Control: without a sandbox the direct connection lands.
    let c = w.run("none", &[], "python3 net.py direct");
    assert!(
        String::from_utf8_lossy(&c.stdout).contains("direct connected"),
        "control: {}",
        show(&c)
    );
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(drain(), vec!["GET /direct HTTP/1.0".to_string()], "control");

    let o = w.run(t, &["--policy", &pol], "python3 net.py all");
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    for want in [
        "allowed hello",
        "other 403 True",
        "direct refused True",
        "dns failed True",
        "interfaces ['lo']",
    ] {
        assert!(out.contains(want), "{want}: {}", show(&o));
    }
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        drain(),
        vec!["GET /simple/ HTTP/1.1".to_string()],
        "what the server saw: {}",
        show(&o)
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!(
            "network: refused other.test:{port} (1 time): other.test is not in the policy's \
             allow list; to allow it: [net] allow = [..., \"other.test\"]"
        )),
        "{}",
        show(&o)
    );
    let audits = net_audits(&w);
    assert_eq!(audits.len(), 1, "{audits:?}");
    assert_eq!(audits[0].lines().count(), 2, "{audits:?}");
    assert_audited(&audits[0], "http", "pkgs.test", true);
    assert_audited(&audits[0], "http", "other.test", false);
}

/// A shell command that prints the body of `url` fetched through the
/// proxy's variables: curl, or Python's urllib in tier 3's container (which
/// has Python and git, not curl); `cacert` is a CA file in the project.
fn fetch(t: &str, url: &str, cacert: Option<&str>) -> String {
    match (t, cacert) {
        ("vm", None) => format!(
            "python3 -c \"import urllib.request as u; print(u.urlopen('{url}').read().decode(), end='')\""
        ),
        ("vm", Some(ca)) => format!(
            "python3 -c \"import ssl, urllib.request as u; print(u.urlopen('{url}', context=ssl.create_default_context(cafile='{ca}')).read().decode(), end='')\""
        ),
        (_, None) => format!("curl -sS {url}"),
        (_, Some(ca)) => format!("curl -sS --cacert {ca} {url}"),
    }
}

/// `audit` (a `net-audit.jsonl`) has a decision of `kind` for `host`,
/// allowed or refused.
fn assert_audited(audit: &str, kind: &str, host: &str, allowed: bool) {
    assert!(
        audit
            .lines()
            .any(|l| l.contains(&format!("\"kind\":\"{kind}\""))
                && l.contains(&format!("\"host\":\"{host}\""))
                && l.contains(&format!("\"allowed\":{allowed}"))),
        "{kind} {host} allowed={allowed}: {audit}"
    );
}

/// SOCKS5 on the proxy's port (curl told `socks5h://`, as a client that
/// needs other TCP than HTTP(S) would be): an allowed name is reached, a
/// name not allowed is refused by the proxy (curl fails, the server sees
/// nothing), and the audit has both as `socks` entries.
fn socks5_reaches_allowed_names_only(t: &str) {
    require_tier(t);
    let w = World::new();
    let (port, seen) = origin();
    let pol = allowlist_policy(&w, port, "", VM_USERLAND);
    let o = w.run(
        t,
        &["--policy", &pol],
        &format!(
            "curl -sS --proxy socks5h://127.0.0.1:3128 http://pkgs.test:{port}/a; \
             curl -s --proxy socks5h://127.0.0.1:3128 http://other.test:{port}/b; echo \" $?\""
        ),
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert!(out.starts_with("hello "), "{}", show(&o));
    assert_ne!(out.trim_start_matches("hello ").trim(), "0", "{}", show(&o));
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        seen.try_iter().collect::<Vec<_>>(),
        vec!["GET /a HTTP/1.1".to_string()],
        "what the server saw: {}",
        show(&o)
    );
    let audits = net_audits(&w);
    assert_eq!(audits.len(), 1, "{audits:?}");
    assert_audited(&audits[0], "socks", "pkgs.test", true);
    assert_audited(&audits[0], "socks", "other.test", false);
}

/// The proxy is a process of its own, owned by the run: as root it runs as
/// the sandbox user with no capability; when it is killed while the
/// command runs, hull ends the command and the run fails (exit 125) naming
/// the proxy, its pid and the tier, within seconds, and nothing of the
/// command is left.
fn a_killed_proxy_ends_the_run_naming_it(t: &str) {
    require_tier(t);
    let w = World::new();
    let (port, _seen) = origin();
    let pol = allowlist_policy(&w, port, "", "");
    let marker = format!("hull-proxy-victim-{}-{t}", std::process::id());
    let mut cmd = w.cmd(
        t,
        &["--policy", &pol],
        &format!("echo started; exec {}", marked_sleep(&marker, 60)),
    );
    cmd.stderr(Stdio::piped());
    let mut c = started(cmd);
    // On tier 3 the command runs in the guest: "started" says it runs.
    if t != "vm" {
        assert!(
            eventually(|| !pids_with(&marker).is_empty()),
            "the command runs"
        );
    }
    let proxy = children_with("__net-proxy", c.id());
    assert_eq!(proxy.len(), 1, "hull's proxy: {proxy:?}");
    // The proxy confines itself before it accepts a connection (the
    // command's wait in the listener's backlog until then), which can be
    // after the command started: its state is read once it has.
    let read = || std::fs::read_to_string(format!("/proc/{}/status", proxy[0])).expect("status");
    eventually(|| {
        read()
            .lines()
            .any(|l| l.split_whitespace().eq(["Seccomp:", "2"]))
    });
    let status = read();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.split_whitespace().collect::<Vec<_>>())
            .unwrap_or_default()
    };
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let uid = field("Uid:");
        assert!(
            uid.iter().all(|u| *u != "0") && uid.len() == 4,
            "the proxy runs as root: {uid:?}"
        );
    }
    assert_eq!(field("CapEff:"), vec!["0000000000000000"], "{status}");
    assert_eq!(field("NoNewPrivs:"), vec!["1"], "{status}");
    assert_eq!(field("Seccomp:"), vec!["2"], "a seccomp filter: {status}");
    let killed = Instant::now();
    let (st, err) = kill_and_wait(&mut c, proxy[0]);
    let took = killed.elapsed();
    assert_eq!(st.code(), Some(125), "{err}");
    assert!(
        err.contains(&format!(
            "tier {t}: the network proxy (pid {}) ended while the command ran (killed by signal 9)",
            proxy[0]
        )),
        "{err}"
    );
    assert!(
        took < Duration::from_secs(10),
        "the run ended {took:?} after the proxy"
    );
    if t == "vm" {
        assert!(err.contains("the VM was killed"), "{err}");
        no_helper_left(&w);
    } else {
        let left = left_after_10s(&marker);
        assert!(left.is_empty(), "the command outlived the proxy: {left:?}");
    }
}

/// A static file server on loopback (`python3 -m http.server`) serving
/// `dir`, killed when dropped.
struct StaticServer {
    child: std::process::Child,
    port: u16,
}

impl StaticServer {
    fn start(dir: &Path) -> StaticServer {
        use std::io::BufRead;
        let mut child = std::process::Command::new("python3")
            .args([
                "-u",
                "-m",
                "http.server",
                "0",
                "--bind",
                "127.0.0.1",
                "--directory",
            ])
            .arg(dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 -m http.server");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("read the server's first line");
        // "Serving HTTP on 127.0.0.1 port 41234 (http://127.0.0.1:41234/) ..."
        let port = line
            .split_whitespace()
            .skip_while(|w| *w != "port")
            .nth(1)
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in {line:?}"));
        StaticServer { child, port }
    }
}

impl Drop for StaticServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Real clients through the proxy: `git clone` over HTTP and curl from an
/// allowed name on a loopback server; the same clone from a name not
/// allowed fails with the proxy's 403 and clones nothing.
fn git_and_curl_fetch_through_the_proxy(t: &str) {
    require_tier(t);
    let w = World::new();
    let served = w.root.path().join("served");
    std::fs::create_dir(&served).expect("mkdir");
    let git = |args: &[&str], dir: &Path| {
        let o = std::process::Command::new("git")
            .args(args)
            .current_dir(dir)
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@t")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@t")
            .output()
            .expect("git");
        assert!(o.status.success(), "git {args:?}: {}", show(&o));
    };
    let work = w.root.path().join("work");
    std::fs::create_dir(&work).expect("mkdir");
    std::fs::write(work.join("README"), "hello from git\n").expect("write");
    git(&["init", "-q", "-b", "trunk"], &work);
    git(&["add", "README"], &work);
    git(&["commit", "-qm", "one"], &work);
    git(
        &[
            "clone",
            "-q",
            "--bare",
            ".",
            served.join("repo.git").to_str().expect("utf8"),
        ],
        &work,
    );
    git(&["update-server-info"], &served.join("repo.git"));
    let server = StaticServer::start(&served);
    let port = server.port;
    let pol = allowlist_policy(&w, port, "", "");
    let o = w.run(
        t,
        &["--policy", &pol],
        &format!(
            "git clone -q http://pkgs.test:{port}/repo.git cloned && cat cloned/README && \
             {} && \
             if git clone -q http://other.test:{port}/repo.git other 2>err.txt; then echo other cloned; \
             else grep -o 'returned error: 403' err.txt; fi; ls -d other 2>/dev/null; true",
            fetch(t, &format!("http://pkgs.test:{port}/repo.git/HEAD"), None)
        ),
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(
        out,
        "hello from git\nref: refs/heads/trunk\nreturned error: 403\n",
        "{}",
        show(&o)
    );
    assert!(w.project.join("cloned/.git").is_dir());
    assert!(!w.project.join("other").exists());
}

/// `pip download` from a loopback simple index and `npm install` of a
/// tarball URL, through the proxy to an allowed name; the same pip download
/// from a name not allowed fetches nothing.
fn pip_and_npm_fetch_through_the_proxy(t: &str) {
    require_tier(t);
    let w = World::new();
    let served = w.root.path().join("served");
    // A wheel, its simple-index page, and an npm tarball, made on the host.
    let make = std::process::Command::new("python3")
        .arg("-c")
        .arg(
            "import os, sys, tarfile, io, zipfile\n\
             d = sys.argv[1]\n\
             os.makedirs(d + '/simple/leftpad'); os.makedirs(d + '/files')\n\
             w = 'leftpad-1.0-py3-none-any.whl'\n\
             with zipfile.ZipFile(d + '/files/' + w, 'w') as z:\n\
             \x20   z.writestr('leftpad/__init__.py', 'def pad(s): return \" \" + s\\n')\n\
             \x20   z.writestr('leftpad-1.0.dist-info/METADATA', 'Metadata-Version: 2.1\\nName: leftpad\\nVersion: 1.0\\n')\n\
             \x20   z.writestr('leftpad-1.0.dist-info/WHEEL', 'Wheel-Version: 1.0\\nGenerator: hand\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n')\n\
             \x20   z.writestr('leftpad-1.0.dist-info/RECORD', '')\n\
             open(d + '/simple/leftpad/index.html', 'w').write('<a href=\"../../files/%s\">%s</a>' % (w, w))\n\
             with tarfile.open(d + '/files/left-pad-1.0.0.tgz', 'w:gz') as t:\n\
             \x20   for name, text in [('package/package.json', '{\"name\": \"left-pad\", \"version\": \"1.0.0\"}'), ('package/index.js', 'module.exports = 1;')]:\n\
             \x20       b = text.encode(); i = tarfile.TarInfo(name); i.size = len(b); t.addfile(i, io.BytesIO(b))\n",
        )
        .arg(&served)
        .output()
        .expect("python3");
    assert!(make.status.success(), "{}", show(&make));
    let server = StaticServer::start(&served);
    let port = server.port;
    let pol = allowlist_policy(&w, port, "", VM_USERLAND);
    let pip = |host: &str, dir: &str| {
        format!(
            "python3 -m pip download --no-deps --no-cache-dir --disable-pip-version-check -q \
             --retries 0 --timeout 5 -d {dir} --trusted-host {host} --index-url http://{host}:{port}/simple/ leftpad"
        )
    };
    // Three Python and Node start-ups: seconds natively, tens of seconds
    // under TCG on a loaded machine (tier 3 here).
    let o = w.run(
        t,
        &["--policy", &pol, "--timeout", "200s"],
        &format!(
            "{} && ls dl && npm install --no-audit --no-fund --no-save --no-update-notifier \
             --cache \"$TMPDIR/npm\" --prefix np http://pkgs.test:{port}/files/left-pad-1.0.0.tgz \
             >/dev/null && ls np/node_modules && {} 2>/dev/null; ls other 2>/dev/null; true",
            pip("pkgs.test", "dl"),
            pip("other.test", "other")
        ),
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(
        out,
        "leftpad-1.0-py3-none-any.whl\nleft-pad\n",
        "{}",
        show(&o)
    );
    assert!(
        w.project
            .join("np/node_modules/left-pad/package.json")
            .is_file(),
        "{}",
        show(&o)
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!("network: refused other.test:{port}")),
        "{}",
        show(&o)
    );
}

/// `cargo fetch` from a loopback sparse registry through the proxy to an
/// allowed name: the index and the crate arrive, checksum verified.
fn cargo_fetches_from_a_sparse_registry_through_the_proxy(t: &str) {
    require_tier(t);
    let w = World::new();
    let served = w.root.path().join("served");
    let mut make = std::process::Command::new("python3");
    make.arg("-c").arg(
            "import hashlib, io, json, os, sys, tarfile\n\
             d, port = sys.argv[1], sys.argv[2]\n\
             os.makedirs(d + '/index/lp/ad'); os.makedirs(d + '/crates')\n\
             buf = io.BytesIO()\n\
             with tarfile.open(fileobj=buf, mode='w:gz') as t:\n\
             \x20   for name, text in [('lpad-1.0.0/Cargo.toml', '[package]\\nname = \"lpad\"\\nversion = \"1.0.0\"\\nedition = \"2021\"\\n'), ('lpad-1.0.0/src/lib.rs', 'pub fn pad() {}\\n')]:\n\
             \x20       b = text.encode(); i = tarfile.TarInfo(name); i.size = len(b); t.addfile(i, io.BytesIO(b))\n\
             crate = buf.getvalue()\n\
             open(d + '/crates/lpad-1.0.0.crate', 'wb').write(crate)\n\
             entry = {'name': 'lpad', 'vers': '1.0.0', 'deps': [], 'cksum': hashlib.sha256(crate).hexdigest(), 'features': {}, 'yanked': False}\n\
             open(d + '/index/lp/ad/lpad', 'w').write(json.dumps(entry) + '\\n')\n\
             open(d + '/index/config.json', 'w').write(json.dumps({'dl': 'http://pkgs.test:%s/crates/{crate}-{version}.crate' % port}))\n",
        );
    // The server's port goes into the index: start it first, on an empty
    // directory the files are then made in.
    std::fs::create_dir(&served).expect("mkdir");
    let server = StaticServer::start(&served);
    let port = server.port;
    let made = { make }
        .arg(&served)
        .arg(port.to_string())
        .output()
        .expect("python3");
    assert!(made.status.success(), "{}", show(&made));
    std::fs::create_dir_all(w.project.join("src")).expect("mkdir");
    std::fs::create_dir_all(w.project.join(".cargo")).expect("mkdir");
    std::fs::write(
        w.project.join("Cargo.toml"),
        "[package]\nname = \"app\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n\
         [dependencies]\nlpad = { version = \"1\", registry = \"loop\" }\n",
    )
    .expect("write");
    std::fs::write(w.project.join("src/main.rs"), "fn main() {}\n").expect("write");
    std::fs::write(
        w.project.join(".cargo/config.toml"),
        format!("[registries.loop]\nindex = \"sparse+http://pkgs.test:{port}/index/\"\n"),
    )
    .expect("write");
    let (rustup, cargo) = hull_tests::host_rust();
    let bin = cargo.join("bin");
    let pol = allowlist_policy(
        &w,
        port,
        &format!(", {rustup:?}, {bin:?}"),
        &format!(
            "[env]\npass = [\"RUSTUP_TOOLCHAIN\"]\n[env.set]\nRUSTUP_HOME = {rustup:?}\n\
             CARGO_HOME = \"${{TMP}}/cargo\"\nPATH = \"{}:/usr/bin:/bin\"\n",
            bin.display()
        ),
    );
    let o = w.run(
        t,
        &["--policy", &pol, "--timeout", "120s"],
        "cargo fetch -q && ls \"$CARGO_HOME\"/registry/cache/*/",
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(out, "lpad-1.0.0.crate\n", "{}", show(&o));
    assert!(w.project.join("Cargo.lock").is_file(), "{}", show(&o));
}

/// `registry:pip`, `registry:npm` and `registry:cargo`, resolved from this
/// host's own clients (`hull policy explain` shows what each said), serve
/// real installs from the registries this machine reaches: `pip install`
/// of a small pure-Python package into a venv in the project (made
/// without pip: the venv's own pip bootstrap is a minute under TCG, and
/// the system's pip installs into it), `npm install` of a project whose
/// own postinstall script runs, `cargo fetch` of a crate
/// with a few dependencies. The audit names only the registries' hosts,
/// all allowed, and each client's among them. The one case that uses the
/// network beyond loopback: it fails with a message, not a hang, when a
/// registry cannot be reached.
fn registries_the_host_uses_serve_real_installs(t: &str) {
    require_tier(t);
    let w = World::new();
    let (rustup, cargo) = hull_tests::host_rust();
    let bin = cargo.join("bin");
    // The shipped build-net profile as it is, with what this machine needs
    // besides: the host's rustup toolchain (the test's HOME is a fake one)
    // and the addresses its registries resolve to (below). The host's
    // certificate authorities (this host reaches its registries through a
    // TLS-inspecting gateway only its store trusts) and, on tier 3, the
    // container's pip and npm come from the profile itself.
    let build_net = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../policies/build-net.toml"
    ))
    .expect("policies/build-net.toml");
    let policy = |private: &str| {
        let text = build_net
            .replace(
                "read_exec = [",
                &format!("read_exec = [{rustup:?}, {bin:?}, "),
            )
            .replace(
                "allow = [\"registry:pip\", \"registry:npm\", \"registry:cargo\"]",
                &format!(
                    "allow = [\"registry:pip\", \"registry:npm\", \"registry:cargo\"]\n{private}"
                ),
            )
            // The default snapshot's memory: 8 GiB would prepare a
            // snapshot of its own on tier 3 (once per agent), which is
            // not this case's subject.
            .replace("memory = \"8GiB\"", "memory = \"4GiB\"")
            .replace(
                "RUSTUP_HOME = \"${HOME}/.rustup\"",
                &format!(
                    "RUSTUP_HOME = {rustup:?}\nPATH = \"{}:/usr/bin:/bin\"",
                    bin.display()
                ),
            );
        assert!(
            text.contains(&format!("{rustup:?}, {bin:?}"))
                && text.contains("PATH = ")
                && text.contains("memory = \"4GiB\"")
                && text.contains("[vm]"),
            "{text}"
        );
        text
    };
    let pol = w.root.path().join("registries.toml");
    std::fs::write(&pol, policy("")).expect("write policy");
    // What each client said, as hull resolved it.
    let o = w
        .hull()
        .args(["policy", "explain", "--tier", t])
        .arg(&pol)
        .arg("--project")
        .arg(&w.project)
        .output()
        .expect("hull policy explain");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", show(&o));
    let mut by_client: Vec<(String, Vec<String>)> = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("registry:") {
            let mut words = rest.split_whitespace();
            let client = words.next().expect("a client").to_string();
            let hosts: Vec<String> = words
                .take_while(|w| !w.starts_with('('))
                .map(str::to_string)
                .collect();
            by_client.push((client, hosts));
        }
    }
    let clients: Vec<&str> = by_client.iter().map(|(c, _)| c.as_str()).collect();
    assert_eq!(clients, ["pip", "npm", "cargo"], "{text}");
    // Each host must answer here, or the case says so and stops.
    let mut addresses = Vec::new();
    for (client, hosts) in &by_client {
        assert!(!hosts.is_empty(), "{client}: no host: {text}");
        for hp in hosts {
            use std::net::ToSocketAddrs;
            let addrs: Vec<std::net::SocketAddr> = hp
                .to_socket_addrs()
                .unwrap_or_else(|e| panic!("{client}'s registry {hp} does not resolve on this machine: {e}; this case needs the registries this machine's clients use"))
                .collect();
            let reached = addrs
                .iter()
                .any(|a| std::net::TcpStream::connect_timeout(a, Duration::from_secs(10)).is_ok());
            assert!(reached, "{client}'s registry {hp} ({addrs:?}) cannot be reached from this machine within 10 s; this case needs the registries this machine's clients use");
            addresses.extend(addrs.iter().map(|a| a.ip()));
        }
    }
    // A machine may reach its registries through addresses hull refuses
    // unless listed (this one: a documentation range); the policy lists
    // exactly the addresses the registries' hosts resolve to.
    addresses.sort();
    addresses.dedup();
    let listed: Vec<String> = addresses.iter().map(|a| format!("\"{a}\"")).collect();
    std::fs::write(
        &pol,
        policy(&format!("allow_private = [{}]\n", listed.join(", "))),
    )
    .expect("write policy");
    std::fs::write(
        w.project.join("package.json"),
        "{\"name\": \"app\", \"version\": \"1.0.0\", \"private\": true,\n\
         \"dependencies\": {\"left-pad\": \"1.3.0\"},\n\
         \"scripts\": {\"postinstall\": \"node -e \\\"require('fs').writeFileSync('postinstall.txt', 'postinstall ran\\\\n')\\\"\"}}\n",
    )
    .expect("write");
    std::fs::create_dir_all(w.project.join("src")).expect("mkdir");
    std::fs::write(
        w.project.join("Cargo.toml"),
        "[package]\nname = \"app\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n\
         [dependencies]\nitoa = \"=1.0.11\"\nryu = \"=1.0.18\"\nmemchr = { version = \"=2.7.4\", default-features = false }\n",
    )
    .expect("write");
    std::fs::write(w.project.join("src/main.rs"), "fn main() {}\n").expect("write");
    let pol = pol.to_string_lossy().into_owned();
    let o = w.run(
        t,
        &["--policy", &pol, "--timeout", "600s"],
        "set -e\n\
         python3 -m venv --without-pip venv\n\
         python3 -m pip --python venv/bin/python install -q --no-cache-dir --disable-pip-version-check six\n\
         venv/bin/python -c 'import six; print(\"six\", six.PY3)'\n\
         npm install --no-audit --no-fund --cache \"$TMPDIR/npm\" >/dev/null\n\
         cat postinstall.txt; ls node_modules\n\
         cargo fetch -q\n\
         ls \"$CARGO_HOME\"/registry/cache/*/ | sort\n",
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(
        out,
        "six True\npostinstall ran\nleft-pad\nitoa-1.0.11.crate\nmemchr-2.7.4.crate\nryu-1.0.18.crate\n",
        "{}",
        show(&o)
    );
    assert!(w.project.join("package-lock.json").is_file());
    assert!(w.project.join("Cargo.lock").is_file());
    let audits = net_audits(&w);
    assert_eq!(audits.len(), 1, "{audits:?}");
    let hosts_of = |line: &str| -> String {
        let v: serde_json::Value = serde_json::from_str(line).expect("an audit line is JSON");
        v["host"].as_str().unwrap_or_default().to_string()
    };
    for line in audits[0].lines() {
        let host = hosts_of(line);
        assert!(
            line.contains("\"allowed\":true")
                && by_client.iter().any(|(_, hs)| hs
                    .iter()
                    .any(|hp| hp.split(':').next() == Some(host.as_str()))),
            "not a registry's host, or refused: {line}"
        );
    }
    for (client, hosts) in &by_client {
        assert!(
            audits[0].lines().any(|l| hosts
                .iter()
                .any(|hp| hp.split(':').next() == Some(hosts_of(l).as_str()))),
            "nothing went to {client}'s registry: {}",
            audits[0]
        );
    }
}

/// HTTPS through `CONNECT`: curl verifies a loopback TLS server's
/// certificate for the allowed name through the proxy (the tunnel carries
/// the handshake untouched); a ClientHello naming another host inside a
/// `CONNECT` to the allowed one gets no tunnel.
fn https_goes_through_connect_with_its_own_name(t: &str) {
    require_tier(t);
    let w = World::new();
    let tls = w.root.path().join("tls");
    std::fs::create_dir(&tls).expect("mkdir");
    std::fs::write(tls.join("hello.txt"), "hello over tls\n").expect("write");
    let cert = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=pkgs.test",
        ])
        .args([
            "-addext",
            "subjectAltName=DNS:pkgs.test",
            "-keyout",
            "key.pem",
            "-out",
            "cert.pem",
        ])
        .current_dir(&tls)
        .output()
        .expect("openssl (scripts/setup.sh --test installs it)");
    assert!(cert.status.success(), "{}", show(&cert));
    std::fs::copy(tls.join("cert.pem"), w.project.join("cert.pem")).expect("copy");
    let mut server = std::process::Command::new("python3")
        .arg("-uc")
        .arg(
            "import http.server, ssl, functools\n\
             h = functools.partial(http.server.SimpleHTTPRequestHandler, directory='.')\n\
             s = http.server.HTTPServer(('127.0.0.1', 0), h)\n\
             c = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER); c.load_cert_chain('cert.pem', 'key.pem')\n\
             s.socket = c.wrap_socket(s.socket, server_side=True)\n\
             print(s.server_address[1], flush=True)\n\
             s.serve_forever()\n",
        )
        .current_dir(&tls)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("python3");
    let port: u16 = {
        use std::io::BufRead;
        let mut line = String::new();
        std::io::BufReader::new(server.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("port");
        line.trim().parse().expect("a port")
    };
    let pol = allowlist_policy(&w, port, "", "");
    std::fs::write(
        w.project.join("sni.py"),
        format!(
            "import socket, ssl\n\
             s = socket.create_connection(('127.0.0.1', 3128))\n\
             s.sendall(b'CONNECT pkgs.test:{port} HTTP/1.1\\r\\nHost: pkgs.test:{port}\\r\\n\\r\\n')\n\
             print(s.recv(100).split(b'\\r\\n')[0].decode(), flush=True)\n\
             c = ssl.create_default_context(); c.check_hostname = False; c.verify_mode = ssl.CERT_NONE\n\
             try:\n\
             \x20   c.wrap_socket(s, server_hostname='other.test'); print('tunnel to other.test')\n\
             except (OSError, ssl.SSLError):\n\
             \x20   print('no tunnel for other.test')\n"
        ),
    )
    .expect("write sni.py");
    let o = w.run(
        t,
        &["--policy", &pol],
        &format!(
            "{} && python3 sni.py",
            fetch(
                t,
                &format!("https://pkgs.test:{port}/hello.txt"),
                Some("cert.pem")
            )
        ),
    );
    let _ = server.kill();
    let _ = server.wait();
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "hello over tls\nHTTP/1.1 200 OK\nno tunnel for other.test\n",
        "{}",
        show(&o)
    );
    let audits = net_audits(&w);
    assert!(
        audits
            .iter()
            .any(|a| a.contains("names \\\"other.test\\\", not the CONNECT host")),
        "{audits:?}"
    );
}

/// The matrix: the common cases on every tier compiled in, then the cases
/// each tier has so far (issue 20 lands tier by tier; a case is listed for a
/// tier once that tier refuses it).
macro_rules! matrix {
    (
        common: [$($case:ident),* $(,)?],
        landlock: [$($l:ident),* $(,)?],
        bwrap: [$($b:ident),* $(,)?],
        vm: [$($v:ident),* $(,)?] $(,)?
    ) => {
        #[cfg(feature = "landlock")]
        mod landlock { $( #[test] fn $case() { super::$case("landlock") } )* $( #[test] fn $l() { super::$l("landlock") } )* }
        #[cfg(feature = "bwrap")]
        mod bwrap { $( #[test] fn $case() { super::$case("bwrap") } )* $( #[test] fn $b() { super::$b("bwrap") } )* }
        // Tier 3 runs the whole matrix: a run restores a VM in seconds. On
        // tier 3 the command's processes live in the guest, so the process
        // cases also check that no QEMU or virtiofsd of the run outlives it.
        #[cfg(feature = "tier3")]
        mod vm { $( #[test] fn $case() { super::$case("vm") } )* $( #[test] fn $v() { super::$v("vm") } )* }
    };
}

matrix!(
    common: [
        spill_is_readable_not_writable,
        other_instance_is_invisible,
        shell_rc_files_in_a_writable_home,
        host_env_secret_not_visible,
        setsid_grandchild_dies_on_timeout,
        interrupt_kills_the_tree,
        a_stdout_file_gets_the_output_after_what_it_held,
        top_level_entries_of_the_project,
        a_flat_c_project_makes_at_the_top,
        tmp_works_and_tmpdir_is_honoured,
        exit_codes_and_signals,
        a_command_line_of_a_mebibyte_runs,
        the_json_result_says_how_the_run_ended,
        a_missing_or_unrunnable_program_exits_127_or_126,
        streams_are_live_and_stdin_passes,
        output_is_byte_exact,
        new_files_belong_to_the_caller,
        toolchain_caches_are_read_only,
        grant_through_a_planted_link_is_refused,
        hull_state_is_hidden,
        a_denied_path_fails_as_denied,
        a_repository_made_in_the_run_is_named,
        a_process_with_an_exited_main_thread_dies_with_the_run,
    ],
    landlock: [
        a_program_the_policy_hides_is_named_with_what_grants_it,
        the_canary_reports_no_leak,
        the_canary_page_renders_in_chromium,
        the_canary_removes_its_decoy_when_interrupted,
        the_create_broker_keeps_the_protections,
        a_project_under_the_real_home,
        read_grant_is_not_executable,
        inotify_in_the_grants_follows_the_command_uid,
        the_tree_lives_in_a_cgroup_of_its_own,
        terminal_settings_are_restored,
        only_allowed_names_are_reached_through_the_proxy,
        git_and_curl_fetch_through_the_proxy,
        pip_and_npm_fetch_through_the_proxy,
        cargo_fetches_from_a_sparse_registry_through_the_proxy,
        https_goes_through_connect_with_its_own_name,
        a_killed_proxy_ends_the_run_naming_it,
        socks5_reaches_allowed_names_only,
        registries_the_host_uses_serve_real_installs,
        the_command_s_own_unix_sockets_talk,
    ],
    bwrap: [
        a_program_the_policy_hides_is_named_with_what_grants_it,
        only_allowed_names_are_reached_through_the_proxy,
        git_and_curl_fetch_through_the_proxy,
        pip_and_npm_fetch_through_the_proxy,
        cargo_fetches_from_a_sparse_registry_through_the_proxy,
        https_goes_through_connect_with_its_own_name,
        a_killed_proxy_ends_the_run_naming_it,
        socks5_reaches_allowed_names_only,
        registries_the_host_uses_serve_real_installs,
        the_canary_reports_no_leak,
        a_project_under_the_real_home,
        a_killed_bwrap_is_named_and_takes_the_command_along,
        inotify_in_the_grants_follows_the_command_uid,
        the_command_s_own_unix_sockets_talk,
        terminal_settings_are_restored,
        line_discipline_is_not_settable,
    ],
    vm: [
        the_canary_reports_no_leak,
        a_fork_holder_ends_with_the_run,
        a_host_program_for_a_newer_glibc_is_refused_by_name,
        read_grant_is_not_executable,
        only_allowed_names_are_reached_through_the_proxy,
        git_and_curl_fetch_through_the_proxy,
        https_goes_through_connect_with_its_own_name,
        a_killed_proxy_ends_the_run_naming_it,
        socks5_reaches_allowed_names_only,
        pip_and_npm_fetch_through_the_proxy,
        cargo_fetches_from_a_sparse_registry_through_the_proxy,
        registries_the_host_uses_serve_real_installs,
    ],
);
