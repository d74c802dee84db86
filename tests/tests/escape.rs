#![allow(clippy::expect_used, clippy::unwrap_used)]
//! The escape matrix: one suite, every tier. Each case runs real commands
//! under `hull run --tier T` and asserts both the exit status and the state
//! of the files afterwards (a denied write fails AND the file is unchanged;
//! an allowed write succeeds AND lands).

use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use hull_tests::{
    feed, marked_sleep, pids_with, require_tier, show, started, HostLock, Restore, Tree, World,
    CANARY, VICTIM,
};

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

fn read_canary_outside(t: &str) {
    require_tier(t);
    let w = World::new();
    let key = w.home.join(".ssh/id_ed25519");
    let control = w.run("none", &[], &format!("cat '{}'", key.display()));
    assert!(
        String::from_utf8_lossy(&control.stdout).contains(CANARY),
        "control: {}",
        show(&control)
    );
    let o = w.run(t, &[], &format!("cat '{}'", key.display()));
    assert!(failed(&o), "{}", show(&o));
    assert!(
        !String::from_utf8_lossy(&o.stdout).contains(CANARY),
        "{}",
        show(&o)
    );
    // and the home dir itself is not listable
    let o = w.run(t, &[], &format!("ls '{}'", w.home.display()));
    assert!(failed(&o), "{}", show(&o));
}

fn write_outside(t: &str) {
    require_tier(t);
    let w = World::new();
    let victim = w.outside.join("victim");
    let o = w.run(t, &[], &format!("echo changed > '{}'", victim.display()));
    assert!(failed(&o), "{}", show(&o));
    assert_eq!(w.read(&victim), VICTIM);
    let o = w.run(t, &[], &format!("touch '{}/new'", w.outside.display()));
    assert!(failed(&o), "{}", show(&o));
    assert!(!w.outside.join("new").exists());
    let o = w.run(t, &[], &format!("rm -f '{}'", victim.display()));
    assert!(failed(&o) || victim.exists(), "{}", show(&o));
    assert_eq!(w.read(&victim), VICTIM);
}

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
    let _ = b.kill();
    let _ = b.wait();
    assert_eq!(
        std::fs::read_to_string(format!("{bspill}/out.txt")).expect("b spill"),
        "b-spill"
    );
}

fn protected_names_in_project(t: &str) {
    require_tier(t);
    let w = World::new();
    w.git_init();
    let cfg = w.project.join(".git/config");
    let before = w.read(&cfg);
    let attempts = [
        "mkdir -p .hull/x",
        "echo x > .hull/settings.toml",
        "mkdir -p .git/hooks && echo 'echo pwned' > .git/hooks/pre-commit",
        "echo '[core] hooksPath = /tmp' >> .git/config",
        "mv .git .git-moved",
        "rm -rf .git",
    ];
    for a in attempts {
        let o = w.run(t, &[], a);
        assert!(failed(&o), "{a}: {}", show(&o));
    }
    assert_eq!(w.read(&cfg), before);
    assert!(!w.project.join(".hull/x").exists());
    assert!(!w.project.join(".hull/settings.toml").exists());
    assert!(!w.project.join(".git/hooks/pre-commit").exists());
    assert!(!w.project.join(".git-moved").exists());
    // .git stays readable (git status works read-only)
    let o = w.run(t, &[], "cat .git/HEAD");
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
}

fn protected_names_before_they_exist(t: &str) {
    require_tier(t);
    let w = World::new(); // no .git, no .hull
    for a in [
        "mkdir -p .git/hooks && touch .git/hooks/x",
        "git init -q .",
        "mkdir .hull && touch .hull/x",
    ] {
        let o = w.run(t, &[], a);
        assert!(failed(&o), "{a}: {}", show(&o));
    }
    assert!(!w.project.join(".git/hooks").exists());
    assert!(!w.project.join(".git/HEAD").exists());
    assert!(!w.project.join(".hull/x").exists());
    // The placeholders the masks were mounted on went with each run.
    for name in [".git", ".hull"] {
        assert!(
            std::fs::symlink_metadata(w.project.join(name)).is_err(),
            "{name} is left in the project after the runs"
        );
    }
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

fn symlink_out_of_project(t: &str) {
    require_tier(t);
    let w = World::new();
    let victim = w.outside.join("victim");
    std::os::unix::fs::symlink(&victim, w.project.join("src/link")).expect("symlink");
    std::os::unix::fs::symlink(&w.outside, w.project.join("src/dirlink")).expect("symlink");
    let o = w.run(t, &[], "cat src/link");
    assert!(failed(&o), "{}", show(&o));
    assert!(!String::from_utf8_lossy(&o.stdout).contains(VICTIM));
    let o = w.run(t, &[], "echo changed > src/link");
    assert!(failed(&o), "{}", show(&o));
    let o = w.run(t, &[], "echo new > src/dirlink/planted");
    assert!(failed(&o), "{}", show(&o));
    assert_eq!(w.read(&victim), VICTIM);
    assert!(!w.outside.join("planted").exists());
    // a symlink made inside the sandbox does not help either
    let o = w.run(
        t,
        &[],
        &format!("ln -s '{}' src/l2 && cat src/l2", victim.display()),
    );
    assert!(
        !String::from_utf8_lossy(&o.stdout).contains(VICTIM),
        "{}",
        show(&o)
    );
}

fn hardlink_to_outside(t: &str) {
    require_tier(t);
    let w = World::new();
    let victim = w.outside.join("victim");
    let control = w.run(
        "none",
        &[],
        &format!(
            "ln '{}' src/hl0 && cat src/hl0 && rm src/hl0",
            victim.display()
        ),
    );
    assert!(
        String::from_utf8_lossy(&control.stdout).contains(VICTIM),
        "control: {}",
        show(&control)
    );
    let o = w.run(
        t,
        &[],
        &format!("ln '{}' src/hl && echo changed > src/hl", victim.display()),
    );
    assert!(failed(&o), "{}", show(&o));
    assert_eq!(w.read(&victim), VICTIM);
    assert!(!w.project.join("src/hl").exists());
}

fn proc_root_traversal(t: &str) {
    require_tier(t);
    let w = World::new();
    let key = w.home.join(".ssh/id_ed25519");
    let control = w.run(
        "none",
        &[],
        &format!("cat /proc/self/root'{}'", key.display()),
    );
    assert!(
        String::from_utf8_lossy(&control.stdout).contains(CANARY),
        "control: {}",
        show(&control)
    );
    for p in ["1", "self", "$PPID"] {
        let o = w.run(t, &[], &format!("cat /proc/{p}/root'{}'", key.display()));
        assert!(failed(&o), "/proc/{p}/root: {}", show(&o));
        assert!(!String::from_utf8_lossy(&o.stdout).contains(CANARY));
    }
}

fn tcp_to_host_loopback(t: &str) {
    require_tier(t);
    let w = World::new();
    let l = TcpListener::bind("127.0.0.1:0").expect("listen");
    l.set_nonblocking(true).expect("nonblocking");
    let port = l.local_addr().expect("addr").port();
    let py = format!(
        "python3 -c 'import socket,sys; s=socket.create_connection((\"127.0.0.1\",{port}),timeout=5); s.sendall(b\"hi\"); print(\"connected\")'"
    );
    let control = w.run("none", &[], &py);
    assert!(
        String::from_utf8_lossy(&control.stdout).contains("connected"),
        "control: {}",
        show(&control)
    );
    let _ = l.accept().expect("control connection arrived");
    let o = w.run(t, &[], &py);
    assert!(failed(&o), "{}", show(&o));
    assert!(!String::from_utf8_lossy(&o.stdout).contains("connected"));
    assert!(
        l.accept().is_err(),
        "the listener saw a connection from the sandbox"
    );
}

fn ptrace_host_process(t: &str) {
    require_tier(t);
    let w = World::new();
    // The victim: an ordinary host process of the same user without
    // capabilities (started through tier none, which drops them).
    let mut victim = w
        .cmd(
            "none",
            &["--env", "VICTIM_SECRET=victim-env-secret"],
            "echo $$; exec sleep 1800",
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn victim");
    let mut line = String::new();
    BufReader::new(victim.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("victim pid");
    let pid: u32 = line.trim().parse().expect("pid");
    let py = format!(
        "python3 -c 'import ctypes,sys; libc=ctypes.CDLL(None,use_errno=True); r=libc.ptrace(16,{pid},0,0); print(\"attach\",r); sys.exit(0 if r==0 else 1)'"
    );
    let o = w.run(t, &[], &py);
    assert!(failed(&o), "{}", show(&o));
    let control = w.run("none", &[], &format!("cat /proc/{pid}/environ"));
    assert!(
        String::from_utf8_lossy(&control.stdout).contains("victim-env-secret"),
        "control: {}",
        show(&control)
    );
    let o = w.run(t, &[], &format!("cat /proc/{pid}/environ"));
    assert!(
        !String::from_utf8_lossy(&o.stdout).contains("victim-env-secret"),
        "{}",
        show(&o)
    );
    let o = w.run(t, &[], &format!("kill -STOP {pid}"));
    assert!(failed(&o), "{}", show(&o));
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("victim alive");
    assert!(!state.contains(") T "), "victim was stopped: {state}");
    let _ = victim.kill();
    let _ = victim.wait();
}

/// A host SysV shared memory segment (mode 0666, so only the tier stops
/// it): the command must not attach to it and write it.
fn host_sysv_ipc_is_unreachable(t: &str) {
    require_tier(t);
    let w = World::new();
    let key: i32 = 0x4855_4c00 | (std::process::id() as i32 & 0xff);
    // SAFETY: plain SysV calls; the segment is ours and removed below.
    let id = unsafe { libc::shmget(key, 4096, libc::IPC_CREAT | libc::IPC_EXCL | 0o666) };
    assert!(id >= 0, "shmget: {}", std::io::Error::last_os_error());
    // SAFETY: attach the segment we made; checked against (void*)-1.
    let mem = unsafe { libc::shmat(id, std::ptr::null(), 0) };
    assert_ne!(mem as isize, -1, "shmat");
    let read = || {
        // SAFETY: the segment is 4096 bytes and attached for the whole test.
        let b = unsafe { std::slice::from_raw_parts(mem as *const u8, 9) };
        String::from_utf8_lossy(b).into_owned()
    };
    let write = |v: &[u8; 9]| {
        // SAFETY: as above, 9 bytes within the segment.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), mem as *mut u8, 9) };
    };
    write(b"host-data");
    let py = format!(
        "python3 -c 'import ctypes,sys; l=ctypes.CDLL(None, use_errno=True); \
         l.shmat.restype=ctypes.c_void_p; i=l.shmget({key}, 0, 0); \
         sys.exit(\"shmget failed\") if i < 0 else None; p=l.shmat(i, None, 0); \
         sys.exit(\"shmat failed\") if p in (None, 2**64-1) else None; \
         ctypes.memmove(p, b\"PWNED-IPC\", 9)'"
    );
    let control = w.run("none", &[], &py);
    let after = read();
    write(b"host-data");
    let o = w.run(t, &[], &py);
    let now = read();
    // SAFETY: detach and remove our own segment.
    unsafe {
        libc::shmdt(mem);
        libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut());
    }
    assert_eq!(
        control.status.code(),
        Some(0),
        "control: {}",
        show(&control)
    );
    assert_eq!(after, "PWNED-IPC", "control: {}", show(&control));
    assert!(failed(&o), "{}", show(&o));
    assert_eq!(now, "host-data", "{}", show(&o));
}

/// A `sleep` on the host as the uid a command of the tier acts as (the
/// sandbox user when the tests run as root).
fn sleeper_like_the_command() -> std::process::Child {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let mut c = std::process::Command::new(if root { "setpriv" } else { "sleep" });
    if root {
        c.args([
            "--reuid=hull-sandbox",
            "--regid=hull-sandbox",
            "--clear-groups",
            "sleep",
        ]);
    }
    c.arg("600")
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn victim")
}

/// The victim's open-files limit, as /proc shows it.
fn nofile_limit(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/limits"))
        .expect("limits")
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .map(str::to_string)
        .expect("Max open files")
}

/// Resource limits of a host process of the same uid as the command:
/// prlimit64 on it must fail and leave its limit as it was.
fn prlimit_of_a_host_process(t: &str) {
    require_tier(t);
    let w = World::new();
    let py = |pid: u32| {
        format!(
            "python3 -c 'import resource; resource.prlimit({pid}, resource.RLIMIT_NOFILE, (7, 7))'"
        )
    };
    for tier in ["none", t] {
        // Each time a process of the command's own uid: the caller's under
        // tier none (which runs it without capabilities).
        let mut victim = if tier == "none" {
            std::process::Command::new("sleep")
                .arg("600")
                .stdin(Stdio::null())
                .spawn()
                .expect("spawn victim")
        } else {
            sleeper_like_the_command()
        };
        let pid = victim.id();
        let before = nofile_limit(pid);
        let o = w.run(tier, &[], &py(pid));
        let after = nofile_limit(pid);
        let _ = victim.kill();
        let _ = victim.wait();
        if tier == "none" {
            assert_eq!(o.status.code(), Some(0), "control: {}", show(&o));
            assert_ne!(after, before, "control: {}", show(&o));
        } else {
            assert!(failed(&o), "{}", show(&o));
            assert_eq!(after, before, "{}", show(&o));
        }
    }
    // Its own limits the command still sets.
    let o = w.run(t, &[], "ulimit -n 64 && test \"$(ulimit -n)\" = 64");
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
}

/// An inotify watch on a directory the policy does not grant: Landlock
/// does not mediate watches, and the events carry the names created there
/// (a directory the command cannot list). The directory is world-readable
/// and outside the test's private root, so only hull stands in the way even
/// when the command runs as the sandbox user. The control shows the name
/// arriving under tier `none`; on the tier the watch is refused and nothing
/// arrives, while a watch in the project still works. Inside a grant, a
/// directory the command's uid cannot read stays unwatchable (hull, root,
/// answers with the command's credentials).
fn inotify_outside_the_grants_is_refused(t: &str) {
    use std::os::unix::fs::PermissionsExt;
    require_tier(t);
    let w = World::new();
    let host = tempfile::Builder::new()
        .prefix("hull-watched-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    std::fs::set_permissions(host.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::write(
        w.project.join("watch.py"),
        "import ctypes, os, select, sys\n\
         libc = ctypes.CDLL(None, use_errno=True)\n\
         def watch(path):\n\
         \x20   fd = libc.inotify_init1(0)\n\
         \x20   wd = libc.inotify_add_watch(fd, path.encode(), 0x100)\n\
         \x20   return fd, wd, ctypes.get_errno()\n\
         def name(fd):\n\
         \x20   r, _, _ = select.select([fd], [], [], 10)\n\
         \x20   return os.read(fd, 4096)[16:].split(b'\\0')[0].decode() if r else 'nothing'\n\
         fd, wd, e = watch(sys.argv[1])\n\
         if wd < 0: print('refused', e, flush=True)\n\
         else:\n\
         \x20   print('watching', flush=True); print('saw', name(fd), flush=True)\n\
         fd, wd, e = watch(sys.argv[2])\n\
         print('locked', 'refused' if wd < 0 else 'watching', flush=True)\n\
         fd, wd, e = watch('src')\n\
         open('src/own-file', 'w').close()\n\
         print('own', name(fd) if wd >= 0 else 'refused %d' % e, flush=True)\n",
    )
    .expect("write watch.py");
    // A directory inside a read grant that the command's uid cannot read
    // (the sandbox user's, when hull is root): hull answers the watch with
    // the command's credentials, never its own.
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
    let pol = pol.as_str();
    let secret = "secret-name-4d1c";
    let attempt = |tier: &str| -> String {
        let _ = std::fs::remove_file(w.project.join("src/own-file"));
        let _ = std::fs::remove_file(host.path().join(secret));
        let script = format!(
            "python3 watch.py '{}' '{}'",
            host.path().display(),
            locked.display()
        );
        let mut c = w
            .cmd(tier, &["--policy", pol], &script)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn hull");
        let mut out = String::new();
        let mut lines = BufReader::new(c.stdout.take().expect("stdout")).lines();
        if let Some(Ok(first)) = lines.next() {
            if first == "watching" {
                std::fs::write(host.path().join(secret), "x").expect("create");
            }
            out.push_str(&first);
            out.push('\n');
        }
        for l in lines.map_while(Result::ok) {
            out.push_str(&l);
            out.push('\n');
        }
        let mut err = String::new();
        let _ = c.stderr.take().expect("stderr").read_to_string(&mut err);
        let st = c.wait().expect("wait");
        assert_eq!(st.code(), Some(0), "{out}{err}");
        out
    };
    let control = attempt("none");
    assert!(
        control.contains(&format!("saw {secret}")),
        "control: {control}"
    );
    let out = attempt(t);
    assert!(out.starts_with("refused "), "{out}");
    assert!(!out.contains(secret), "{out}");
    assert!(control.contains("locked watching"), "control: {control}");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        assert!(out.contains("locked refused"), "{out}");
    }
    assert!(
        out.contains("own own-file"),
        "a watch in the project: {out}"
    );
}

/// A host service's unix socket under a read-only grant: a read-only bind
/// does not stop `connect()`, nor a datagram sent to it, and the network
/// namespace does not cover pathname sockets (a `docker.sock` under a grant
/// would be host root), nor a symlink the command plants to it. The control
/// shows each reaching the host under tier `none`; on the tier none arrives.
/// On bwrap a server and client in the project still talk (sockets in the
/// writable roots are the command's own); landlock refuses unix sockets
/// outright on kernels whose Landlock cannot mediate them (ABI < 9).
fn host_unix_sockets_under_a_grant_are_unreachable(t: &str) {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::net::{UnixDatagram, UnixListener};
    require_tier(t);
    let w = World::new();
    let svc = w.outside.join("svc");
    std::fs::create_dir_all(&svc).expect("mkdir svc");
    let (stream_path, dgram_path) = (svc.join("stream.sock"), svc.join("dgram.sock"));
    let listener = UnixListener::bind(&stream_path).expect("bind stream");
    listener.set_nonblocking(true).expect("nonblocking");
    let dgram = UnixDatagram::bind(&dgram_path).expect("bind dgram");
    dgram.set_nonblocking(true).expect("nonblocking");
    for p in [&stream_path, &dgram_path] {
        // Writable by anyone: what stops the command must be hull.
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    }
    std::fs::write(
        w.project.join("socks.py"),
        format!(
            "import socket, os, threading, sys\n\
             def attempt(name, f):\n    try:\n        f(); print(name, 'sent')\n    except OSError as e:\n        print(name, 'refused', e.errno)\n\
             def stream():\n    c = socket.socket(socket.AF_UNIX); c.connect({s:?}); c.sendall(b'escape-stream')\n\
             def pair():\n    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM); a.sendto(b'escape-pair', {d:?})\n\
             def dgram():\n    u = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); u.sendto(b'escape-dgram', {d:?})\n\
             def link():\n    os.symlink({s:?}, 'link.sock'); c = socket.socket(socket.AF_UNIX); c.connect('link.sock'); c.sendall(b'escape-link')\n\
             attempt('stream', stream); attempt('pair', pair); attempt('dgram', dgram); attempt('link', link)\n\
             if len(sys.argv) > 1:\n\
             \x20   srv = socket.socket(socket.AF_UNIX); srv.bind('own.sock'); srv.listen(1)\n\
             \x20   def serve():\n        a, _ = srv.accept(); a.sendall(b'hello ' + a.recv(16))\n\
             \x20   threading.Thread(target=serve).start()\n\
             \x20   up = '../' + os.path.basename(os.getcwd()) + '/own.sock'\n\
             \x20   c = socket.socket(socket.AF_UNIX); c.connect(up); c.sendall(b'own')\n\
             \x20   print('own:', c.recv(32).decode())\n",
            s = stream_path.to_str().expect("utf8"),
            d = dgram_path.to_str().expect("utf8"),
        ),
    )
    .expect("write socks.py");
    let pol = default_policy_reading(&w, "svc.toml", &svc);
    let pol = pol.as_str();
    let arrived = || {
        let mut got = Vec::new();
        while let Ok((mut c, _)) = listener.accept() {
            let mut b = Vec::new();
            c.set_nonblocking(false).expect("blocking");
            c.set_read_timeout(Some(Duration::from_secs(2)))
                .expect("timeout");
            let _ = c.read_to_end(&mut b);
            got.push(String::from_utf8_lossy(&b).into_owned());
        }
        let mut buf = [0u8; 64];
        while let Ok(n) = dgram.recv(&mut buf) {
            got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        got.sort();
        got
    };
    let control = w.run("none", &["--policy", pol], "python3 socks.py");
    assert_eq!(
        control.status.code(),
        Some(0),
        "control: {}",
        show(&control)
    );
    assert_eq!(
        arrived(),
        [
            "escape-dgram",
            "escape-link",
            "escape-pair",
            "escape-stream"
        ],
        "control: {}",
        show(&control)
    );
    let _ = std::fs::remove_file(w.project.join("link.sock"));
    let own = if t == "bwrap" { " own" } else { "" };
    let o = w.run(t, &["--policy", pol], &format!("python3 socks.py{own}"));
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    for name in ["stream", "pair", "dgram"] {
        assert!(
            out.contains(&format!("{name} refused")),
            "{name}: {}",
            show(&o)
        );
    }
    assert!(
        arrived().is_empty(),
        "the host service received: {:?}\n{}",
        arrived(),
        show(&o)
    );
    if t == "bwrap" {
        assert!(out.contains("own: hello own"), "{}", show(&o));
    }
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
        "setsid {} & (setsid {} &); echo started; sleep 300",
        marked_sleep(&a, 300),
        marked_sleep(&b, 300)
    );
    let mut extra = tree.extra();
    extra.extend(["--timeout", "5s"]);
    let mut c = started(w.cmd(t, &extra, &script));
    // The control: both escaped the session and run.
    std::thread::sleep(Duration::from_millis(300));
    assert!(!tree.now(&a).is_empty(), "{a} does not run");
    assert!(!tree.now(&b).is_empty(), "{b} does not run");
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
    std::thread::sleep(Duration::from_millis(300));
    let survived = !zombie_leaders(&marker).is_empty();
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
    std::thread::sleep(Duration::from_millis(300));
    let left = if t == "vm" {
        // In the container: the thread that runs on holds the marker in
        // its command line (the leader's is gone).
        tree.left(&marker)
    } else {
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
    let end = Instant::now() + Duration::from_secs(10);
    while pids_with(&marker).is_empty() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!pids_with(&marker).is_empty(), "the command runs");
    let bwrap: Vec<i32> = pids_with("--json-status-fd")
        .into_iter()
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|s| {
                    s.rsplit_once(')')
                        .and_then(|(_, r)| r.split_whitespace().nth(1)?.parse::<u32>().ok())
                })
                == Some(c.id())
        })
        .collect();
    assert_eq!(bwrap.len(), 1, "hull's bwrap: {bwrap:?}");
    // SAFETY: kill(2) on the pid of hull's child, just read from /proc.
    assert_eq!(unsafe { libc::kill(bwrap[0], libc::SIGKILL) }, 0);
    let st = c.wait().expect("wait");
    let mut err = String::new();
    c.stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err)
        .expect("read");
    assert_eq!(st.code(), Some(125), "{err}");
    assert!(
        err.contains("bubblewrap itself was killed by signal 9"),
        "{err}"
    );
    let left = left_after_10s(&marker);
    assert!(left.is_empty(), "the command outlived bwrap: {left:?}");
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

/// The processes whose command line holds `marker`, once none is left or
/// after 10 s.
fn left_after_10s(marker: &str) -> Vec<i32> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !pids_with(marker).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
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

fn interrupt_kills_the_tree(t: &str) {
    require_tier(t);
    let w = World::new();
    let tree = Tree::new(&w, t);
    let marker = format!("hull-int-marker-{}", std::process::id());
    let mut c = started(w.cmd(
        t,
        &tree.extra(),
        &format!(
            "(setsid {} &); echo started; sleep 300",
            marked_sleep(&marker, 300)
        ),
    ));
    // The control: the marked process runs.
    std::thread::sleep(Duration::from_millis(300));
    assert!(!tree.now(&marker).is_empty(), "{marker} does not run");
    // SAFETY: sending SIGINT to the hull child we spawned.
    unsafe {
        libc::kill(c.id() as i32, libc::SIGINT);
    }
    let st = c.wait().expect("wait");
    assert_eq!(st.code(), Some(130));
    std::thread::sleep(Duration::from_millis(200));
    let left = tree.left(&marker);
    assert!(left.is_empty(), "left running: {left:?}");
    drop(tree);
    no_helper_left(&w);
}

/// A global sysctl (no namespace has its own) that nothing here depends on.
const SYSCTL: &str = "/proc/sys/kernel/printk_ratelimit_burst";

/// The kernel's knobs: a command that is host uid 0 passes the owner check
/// on a 0644 sysctl without any capability (`kernel.core_pattern` set to a
/// pipe runs a program as host root).
fn kernel_knobs_are_read_only(t: &str) {
    require_tier(t);
    let _lock = HostLock::take("sysctl");
    let w = World::new();
    let before = std::fs::read_to_string(SYSCTL).expect("read the sysctl");
    let n: u64 = before.trim().parse().expect("a number");
    let write = format!("echo {} > {SYSCTL}", n + 1);
    // core_pattern written back with its own value: harmless if it lands.
    // (An actual write: Landlock does not answer access(2) checks.)
    let writable = "f=/proc/sys/kernel/core_pattern; v=$(cat $f); \
                    (printf '%s\\n' \"$v\" > $f) 2>/dev/null && echo \"writable $f\"; true";
    {
        let _restore = Restore {
            path: SYSCTL.into(),
            value: before.clone().into_bytes(),
        };
        let control = w.run("none", &[], &format!("{write} && {writable}"));
        assert_eq!(
            control.status.code(),
            Some(0),
            "control: {}",
            show(&control)
        );
        assert_eq!(
            std::fs::read_to_string(SYSCTL).expect("sysctl").trim(),
            (n + 1).to_string(),
            "control: the write did not land"
        );
        assert!(
            String::from_utf8_lossy(&control.stdout)
                .contains("writable /proc/sys/kernel/core_pattern"),
            "control: {}",
            show(&control)
        );
    }
    assert_eq!(std::fs::read_to_string(SYSCTL).expect("sysctl"), before);
    let o = w.run(t, &[], &write);
    let after = std::fs::read_to_string(SYSCTL).expect("sysctl");
    if after != before {
        let _ = std::fs::write(SYSCTL, &before);
    }
    assert!(failed(&o), "{}", show(&o));
    assert_eq!(after, before, "tier {t} changed the host's {SYSCTL}");
    let o = w.run(t, &[], writable);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert!(
        !String::from_utf8_lossy(&o.stdout).contains("writable"),
        "{}",
        show(&o)
    );
}

/// The host's device nodes: usable, but their mode is the host's.
fn host_device_nodes_keep_their_mode(t: &str) {
    use std::os::unix::fs::PermissionsExt;
    require_tier(t);
    let _lock = HostLock::take("dev-full");
    let w = World::new();
    let node = std::path::Path::new("/dev/full");
    let mode = || {
        std::fs::metadata(node)
            .expect("/dev/full")
            .permissions()
            .mode()
            & 0o7777
    };
    let before = mode();
    struct Back(u32);
    impl Drop for Back {
        fn drop(&mut self) {
            let _ = std::fs::set_permissions("/dev/full", std::fs::Permissions::from_mode(self.0));
        }
    }
    {
        let _back = Back(before);
        let control = w.run("none", &[], "chmod 0600 /dev/full");
        assert_eq!(
            control.status.code(),
            Some(0),
            "control: {}",
            show(&control)
        );
        assert_eq!(mode(), 0o600, "control: the chmod did not land");
    }
    assert_eq!(mode(), before);
    let o = w.run(t, &[], "chmod 0600 /dev/full");
    let after = mode();
    if after != before {
        let _ = std::fs::set_permissions(node, std::fs::Permissions::from_mode(before));
    }
    assert!(failed(&o), "{}", show(&o));
    assert_eq!(after, before, "tier {t} changed the host's /dev/full");
    // And the nodes still work as devices.
    let o = w.run(
        t,
        &[],
        "echo x > /dev/null && head -c 4 /dev/zero | od -An -tx1 && head -c 4 /dev/urandom | wc -c",
    );
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .collect::<Vec<_>>(),
        ["00", "00", "00", "00", "4"],
        "{}",
        show(&o)
    );
}

/// Set-id bits: a set-id copy of a shell left in the project runs as its
/// owner (root, when hull runs as root) for any local user who finds it.
fn setid_bits_are_refused(t: &str) {
    use std::os::unix::fs::PermissionsExt;
    require_tier(t);
    let w = World::new();
    let sh = w.project.join("src/sh");
    std::fs::copy("/bin/sh", &sh).expect("copy /bin/sh");
    std::fs::set_permissions(&sh, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let setid =
        |p: &std::path::Path| std::fs::symlink_metadata(p).map(|m| m.permissions().mode() & 0o6000);
    let control = w.run("none", &[], "chmod 4755 src/sh");
    assert_eq!(
        control.status.code(),
        Some(0),
        "control: {}",
        show(&control)
    );
    assert_eq!(
        setid(&sh).expect("sh"),
        0o4000,
        "control: the chmod did not land"
    );
    std::fs::set_permissions(&sh, std::fs::Permissions::from_mode(0o755)).expect("chmod back");
    let attempts = [
        ("chmod 4755 src/sh", "src/sh"),
        ("chmod 2755 src/sh", "src/sh"),
        ("chmod u+s,g+s src/sh", "src/sh"),
        (
            "python3 -c 'import os; os.close(os.open(\"src/new\", os.O_CREAT | os.O_WRONLY, 0o4755))'",
            "src/new",
        ),
        (
            "python3 -c 'import os; os.mkdir(\"src/dir\", 0o2755)'",
            "src/dir",
        ),
        ("mknod src/fifo p && chmod 4644 src/fifo", "src/fifo"),
    ];
    for (a, path) in attempts {
        let o = w.run(t, &[], a);
        assert!(failed(&o), "{a}: {}", show(&o));
        let p = w.project.join(path);
        if let Ok(bits) = setid(&p) {
            assert_eq!(bits, 0, "{a}: {} has mode bits {bits:o}", p.display());
        }
    }
    // Positive: ordinary modes still work.
    let o = w.run(
        t,
        &[],
        "chmod 0700 src/sh && mkdir -m 0750 src/ok && touch src/ok/f",
    );
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(
        std::fs::metadata(&sh).expect("sh").permissions().mode() & 0o7777,
        0o700
    );
    assert!(w.project.join("src/ok/f").exists());
}

/// A secret directory outside every grant, and a command line that hands
/// its descriptor to a child as fd 3 (as `3</dir` or `flock DIR cmd` do).
fn with_fd3(cmd: &mut std::process::Command, dir: &std::path::Path) -> std::fs::File {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let d = std::fs::File::open(dir).expect("open the secret dir");
    let fd = d.as_raw_fd();
    // SAFETY: dup2 or fcntl in the child before exec, on descriptors it has.
    unsafe {
        cmd.pre_exec(move || {
            // dup2 onto itself would keep close-on-exec.
            let r = if fd == 3 {
                libc::fcntl(3, libc::F_SETFD, 0)
            } else {
                libc::dup2(fd, 3)
            };
            if r < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    d
}

/// A descriptor hull's caller left open: its magic link leads out of every
/// mount namespace and past Landlock's paths.
fn inherited_descriptors_are_closed(t: &str) {
    require_tier(t);
    let w = World::new();
    let key = ".ssh/id_ed25519";
    let script = format!(
        "cat /proc/self/fd/3/{key}; ls /proc/self/fd/3/ >/dev/null && echo LISTED; \
         echo planted > /proc/self/fd/3/planted && echo WROTE"
    );
    let mut control = std::process::Command::new("sh");
    control.args(["-c", &script]);
    let _d = with_fd3(&mut control, &w.home);
    let control = control.output().expect("sh");
    assert!(
        String::from_utf8_lossy(&control.stdout).contains(CANARY),
        "control: {}",
        show(&control)
    );
    std::fs::remove_file(w.home.join("planted")).expect("the control planted a file");
    let mut c = w.cmd(t, &[], &script);
    let _d = with_fd3(&mut c, &w.home);
    let o = c.stdin(Stdio::null()).output().expect("hull");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(failed(&o), "{}", show(&o));
    for bad in [CANARY, "LISTED", "WROTE"] {
        assert!(!out.contains(bad), "{bad}: {}", show(&o));
    }
    assert!(!w.home.join("planted").exists());
}

/// The caller's stdout is a log file: the command must not reopen it
/// through `/proc/self/fd/1` and read what the caller wrote before the run.
fn stdout_file_is_not_reopened(t: &str) {
    require_tier(t);
    let w = World::new();
    let log = w.root.path().join("caller.log");
    let earlier = "EARLIER-LOG-SECRET-51c2";
    let open_log = || {
        std::fs::write(&log, format!("{earlier}\n")).expect("log");
        std::fs::OpenOptions::new()
            .append(true)
            .open(&log)
            .expect("open log")
    };
    // Reopens its own fd 1 for reading (a relay pipe's write end reopens
    // as its read end, which blocks: hence the timeout), and for writing.
    let script = "timeout 3 python3 -c 'import sys; sys.stderr.write(open(\"/proc/self/fd/1\").read(200))'; \
                  (echo overwritten > /proc/self/fd/1) 2>/dev/null; echo appended";
    let control = std::process::Command::new("sh")
        .args(["-c", script])
        .stdout(open_log())
        .output()
        .expect("sh");
    assert!(
        String::from_utf8_lossy(&control.stderr).contains(earlier),
        "control: {}",
        show(&control)
    );
    let o = w
        .cmd(t, &[], script)
        .stdin(Stdio::null())
        .stdout(open_log())
        .output()
        .expect("hull");
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains(earlier),
        "{}",
        show(&o)
    );
    // The log kept its earlier line and got the command's output after it.
    let text = std::fs::read_to_string(&log).expect("log");
    assert!(text.starts_with(&format!("{earlier}\n")), "{text:?}");
    assert!(text.ends_with("appended\n"), "{text:?}");
}

/// A 0600 root-owned file inside a directory the policy grants read-only
/// (as `/etc/shadow`-like files under a granted `/etc`): a command that
/// runs as host uid 0 passes the owner check without any capability.
fn root_only_files_stay_unreadable(t: &str) {
    use std::os::unix::fs::PermissionsExt;
    require_tier(t);
    let w = World::new();
    let secret = w.outside.join("root-only");
    std::fs::write(&secret, CANARY).expect("write");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let open = w.outside.join("public");
    std::fs::write(&open, "public-data").expect("write");
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let pol = default_policy_reading(&w, "read-outside.toml", &w.outside);
    let pol = pol.as_str();
    let script = format!("cat '{}'; cat '{}'", open.display(), secret.display());
    let control = w.run("none", &["--policy", pol], &script);
    assert!(
        String::from_utf8_lossy(&control.stdout).contains(CANARY),
        "control: {}",
        show(&control)
    );
    let o = w.run(t, &["--policy", pol], &script);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(failed(&o), "{}", show(&o));
    assert!(out.contains("public-data"), "the grant works: {}", show(&o));
    assert!(!out.contains(CANARY), "{}", show(&o));
}

/// Metadata of a file outside every grant (Landlock does not mediate
/// chmod, chown, utimes or xattrs): the command may not change it.
fn metadata_outside_the_grants_is_unchangeable(t: &str) {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    require_tier(t);
    let w = World::new();
    let key = w.outside.join("key");
    let reset = || {
        // A new file: no xattr, mode or time left from the control run.
        let _ = std::fs::remove_file(&key);
        std::fs::write(&key, "private").expect("write");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let m = std::fs::metadata(&key).expect("key");
        (m.mode(), m.mtime())
    };
    let script = format!(
        "chmod 0644 '{0}'; touch -m -d 2001-01-01 '{0}'; chown 0:0 '{0}'; \
         python3 -c 'import os; os.setxattr(\"{0}\", \"user.hull\", b\"x\")'",
        key.display()
    );
    let before = reset();
    let control = w.run("none", &[], &script);
    let m = std::fs::metadata(&key).expect("key");
    assert_ne!((m.mode(), m.mtime()), before, "control: {}", show(&control));
    let before = reset();
    let o = w.run(t, &[], &script);
    assert!(failed(&o), "{}", show(&o));
    let m = std::fs::metadata(&key).expect("key");
    assert_eq!((m.mode(), m.mtime()), before, "{}", show(&o));
    assert!(
        xattr_absent(&key),
        "the command set an xattr on {}: {}",
        key.display(),
        show(&o)
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
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "this test runs hull as the user nobody and needs root to do so"
    );
    // A world the user owns, and a copy of hull the user can execute (the
    // checkout may be in a 0700 directory).
    let top = tempfile::Builder::new()
        .prefix("hull-user-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    std::fs::set_permissions(top.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let hull = top.path().join("hull");
    std::fs::copy(hull_tests::hull_bin(), &hull).expect("copy hull");
    let u = top.path().join("u");
    let (project, outside, ro) = (u.join("project"), u.join("outside"), u.join("ro"));
    for d in [&project.join("sub"), &outside, &ro, &u.join("runs")] {
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
        std::process::Command::new("chown")
            .args(["-R", "nobody:nogroup"])
            .arg(&u)
            .status()
            .expect("chown");
        std::fs::set_permissions(&u, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        std::fs::metadata(&key).expect("key").mtime()
    };
    let pol = top.path().join("p.toml");
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
    // A cgroup delegated to the user, as systemd gives one: the landlock
    // tier puts the run's tree in a cgroup below the caller's own.
    let cg = cgroup2_mount().join(format!("hull-test-user-{}", std::process::id()));
    std::fs::create_dir(&cg).expect("mkdir the delegated cgroup");
    for f in [
        "",
        "cgroup.procs",
        "cgroup.subtree_control",
        "cgroup.threads",
    ] {
        std::process::Command::new("chown")
            .args(["nobody:nogroup"])
            .arg(cg.join(f))
            .status()
            .expect("chown");
    }
    let enter = format!("echo $$ > '{}/cgroup.procs' && exec \"$@\"", cg.display());
    let run_script = |tier: &str, script: &str| {
        std::process::Command::new("sh")
            .args(["-c", &enter, "sh", "setpriv"])
            .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
            .arg(&hull)
            .args([
                "run",
                "--tier",
                tier,
                "--timeout",
                hull_tests::RUN_TIMEOUT,
                "--policy",
            ])
            .arg(&pol)
            .args(["--", "sh", "-c", script])
            .current_dir(&project)
            .env("HOME", &u)
            .env("HULL_RUNS_DIR", u.join("runs"))
            .env_remove("HULL_INSTANCE")
            .stdin(Stdio::null())
            .output()
            .expect("setpriv hull")
    };
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
    let nobody = std::fs::metadata(&u).expect("stat").uid();
    for f in ["t2.txt", "made", "made/f", "lnk"] {
        let m = std::fs::symlink_metadata(project.join(f)).expect(f);
        assert_eq!(m.uid(), nobody, "{f}");
    }
    assert_eq!(mode(&project.join("t2.txt")), 0o600);
    assert!(!project.join("top.txt").exists());
    assert!(std::fs::symlink_metadata(project.join(".hull")).is_err());
    std::fs::remove_dir(&cg).expect("rmdir the delegated cgroup");
}

/// The cgroup2 hierarchy's mount point.
fn cgroup2_mount() -> std::path::PathBuf {
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
    let dir = cgroup2_mount().join(path.trim_start_matches('/'));
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

/// A read-only grant nested in the writable project stays read-only
/// (Landlock adds rights up: the project must be split around it).
fn read_only_grant_nested_in_the_project(t: &str) {
    require_tier(t);
    let w = World::new();
    let lib = w.project.join("src/vendor/lib");
    std::fs::create_dir_all(&lib).expect("mkdir");
    std::fs::write(lib.join("code.rs"), "vendored\n").expect("write");
    let pol = w.root.path().join("nested.toml");
    let text = hull_policy_default().replace("read = [", "read = [\"src/vendor/lib\", ");
    std::fs::write(&pol, text).expect("write policy");
    let pol = pol.to_str().expect("utf8");
    let attack = "f=0; (echo changed > src/vendor/lib/code.rs) || f=1; \
                  (echo new > src/vendor/lib/new.rs) || f=1; exit $f";
    let control = w.run("none", &["--policy", pol], attack);
    assert!(
        w.project.join("src/vendor/lib/new.rs").exists(),
        "control: {}",
        show(&control)
    );
    std::fs::remove_file(lib.join("new.rs")).expect("rm");
    std::fs::write(lib.join("code.rs"), "vendored\n").expect("write");
    let o = w.run(t, &["--policy", pol], attack);
    assert!(failed(&o), "{}", show(&o));
    assert_eq!(w.read(&lib.join("code.rs")), "vendored\n");
    assert!(!lib.join("new.rs").exists());
    // It stays readable, and the rest of the project writable (on
    // landlock the directories around it are split: existing files only).
    let o = w.run(
        t,
        &["--policy", pol],
        "cat src/vendor/lib/code.rs && echo ok >> src/main.txt",
    );
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "vendored\n");
    assert_eq!(
        w.read(&w.project.join("src/main.txt")),
        "project-file\nok\n"
    );
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

/// A protection two levels deep (a read-only grant nested in the project)
/// cannot be removed by renaming an ancestor and recreating the path.
fn renaming_an_ancestor_keeps_the_protection(t: &str) {
    require_tier(t);
    let w = World::new();
    let lib = w.project.join("src/vendor/lib");
    std::fs::create_dir_all(&lib).expect("mkdir");
    std::fs::write(lib.join("code.rs"), "vendored\n").expect("write");
    let pol = w.root.path().join("nested.toml");
    let text = hull_policy_default().replace("read = [", "read = [\"src/vendor/lib\", ");
    std::fs::write(&pol, text).expect("write policy");
    let pol = pol.to_str().expect("utf8");
    let attack = "mv src/vendor src/moved && mkdir -p src/vendor/lib && \
                  echo evil > src/vendor/lib/code.rs";
    let control = w.run("none", &["--policy", pol], attack);
    assert_eq!(
        control.status.code(),
        Some(0),
        "control: {}",
        show(&control)
    );
    assert_eq!(w.read(&lib.join("code.rs")), "evil\n", "control");
    std::fs::remove_dir_all(w.project.join("src/vendor")).expect("rm");
    std::fs::rename(w.project.join("src/moved"), w.project.join("src/vendor")).expect("mv back");
    let o = w.run(t, &["--policy", pol], attack);
    assert!(failed(&o), "{}", show(&o));
    assert_eq!(w.read(&lib.join("code.rs")), "vendored\n", "{}", show(&o));
    assert!(!w.project.join("src/moved").exists(), "{}", show(&o));
}

/// `git -C DIR ...` on the host, as a user would run it after the run.
fn host_git(dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", dir)
        .stdin(Stdio::null())
        .output()
        .expect("git")
}

/// A nested repository (a vendored checkout, a submodule) has a `.git`
/// whose config git obeys: an fsmonitor there runs at the next host
/// `git status`. Every `.git` at any depth is read-only, and a repository
/// the command creates is reported.
fn nested_repositories_are_protected(t: &str) {
    require_tier(t);
    let w = World::new();
    w.git_init();
    let nested = w.project.join("src/lib");
    std::fs::create_dir_all(&nested).expect("mkdir");
    assert!(host_git(&nested, &["init", "-q"]).status.success());
    let config = nested.join(".git/config");
    let before = w.read(&config);
    let marker = w.root.path().join("fsmonitor-ran");
    let attack = format!(
        "printf '[core]\\n\\tfsmonitor = touch {}\\n' >> src/lib/.git/config",
        marker.display()
    );
    let control = w.run("none", &[], &attack);
    assert_eq!(
        control.status.code(),
        Some(0),
        "control: {}",
        show(&control)
    );
    let _ = host_git(&nested, &["status", "--short"]);
    assert!(marker.exists(), "control: host git status ran no fsmonitor");
    std::fs::remove_file(&marker).expect("rm");
    std::fs::write(&config, &before).expect("restore config");
    let o = w.run(t, &[], &attack);
    assert!(failed(&o), "{}", show(&o));
    assert_eq!(w.read(&config), before);
    let _ = host_git(&nested, &["status", "--short"]);
    assert!(
        !marker.exists(),
        "host git status ran the command's fsmonitor"
    );
    // A repository made during the run is named afterwards (in a directory
    // the landlock tier has not split around a protection).
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
}

/// Repository config that names files in the worktree (shared hooks under
/// `core.hooksPath`, an `include.path`): those files are read-only too.
fn git_config_targets_in_the_worktree_are_protected(t: &str) {
    require_tier(t);
    let w = World::new();
    w.git_init();
    std::fs::create_dir_all(w.project.join("src/githooks")).expect("mkdir");
    std::fs::write(
        w.project.join("src/githooks/pre-commit"),
        "#!/bin/sh\nexit 0\n",
    )
    .expect("write");
    std::fs::write(
        w.project.join("src/shared.gitconfig"),
        "[user]\n\tname = x\n",
    )
    .expect("write");
    assert!(
        host_git(&w.project, &["config", "core.hooksPath", "src/githooks"])
            .status
            .success()
    );
    assert!(host_git(
        &w.project,
        &["config", "include.path", "../src/shared.gitconfig"]
    )
    .status
    .success());
    let hook = w.project.join("src/githooks/pre-commit");
    let shared = w.project.join("src/shared.gitconfig");
    let (hook_before, shared_before) = (w.read(&hook), w.read(&shared));
    let attack = "f=0; (echo 'touch /tmp/hull-hook-ran' >> src/githooks/pre-commit) || f=1; \
                  (printf '[core]\\n\\tfsmonitor = true\\n' >> src/shared.gitconfig) || f=1; exit $f";
    let control = w.run("none", &[], attack);
    assert_eq!(
        control.status.code(),
        Some(0),
        "control: {}",
        show(&control)
    );
    assert_ne!(w.read(&hook), hook_before, "control");
    std::fs::write(&hook, &hook_before).expect("restore");
    std::fs::write(&shared, &shared_before).expect("restore");
    let o = w.run(t, &[], attack);
    assert!(failed(&o), "{}", show(&o));
    assert_eq!(w.read(&hook), hook_before);
    assert_eq!(w.read(&shared), shared_before);
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

fn project_read_and_write(t: &str) {
    require_tier(t);
    let w = World::new();
    let o = w.run(t, &[], "cat src/main.txt && echo more >> src/main.txt && mkdir -p src/new/deep && echo created > src/new/deep/f");
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "project-file\n");
    assert_eq!(
        w.read(&w.project.join("src/main.txt")),
        "project-file\nmore\n"
    );
    assert_eq!(w.read(&w.project.join("src/new/deep/f")), "created\n");
}

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

/// `hull canary --tier T --json` on this machine: every attack probe lands
/// under its control (tier `none`) and is denied on T, every positive probe
/// lands on both; nothing of the decoy is left in the temp directory.
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
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let html = w.read(&page);
    assert!(
        html.contains("<table id=\"matrix\">") && html.contains(&format!("<th>{t}</th>")),
        "{html}"
    );
    let cells: Vec<serde_json::Value> =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", show(&o)));
    let of = |tier: &str| -> Vec<&serde_json::Value> {
        cells.iter().filter(|c| c["tier"] == tier).collect()
    };
    let (control, tier) = (of("none"), of(t));
    assert!(
        control.len() >= 10 && control.len() == tier.len(),
        "{cells:?}"
    );
    for (c, on) in control.iter().zip(&tier) {
        assert_eq!(c["probe"], on["probe"]);
        if c["verdict"] == "not_applicable" {
            // Only the probes about hull running as root, when it is not.
            assert_eq!(on["verdict"], "not_applicable", "{on}");
            continue;
        }
        assert_eq!(c["verdict"], "allowed", "the control must land: {c}");
        let positive = on["class"]
            .as_str()
            .is_some_and(|k| k.starts_with("allowed"));
        let want = if positive { "allowed" } else { "denied" };
        assert_eq!(on["verdict"], want, "{on}");
    }
    assert_eq!(canary_dirs(&tmp), 0, "the decoy was left behind");
}

/// Interrupted (SIGINT as soon as its decoy exists), the canary stops after
/// the run in progress, removes its decoy and exits 130.
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
    // SAFETY: kill with a pid we spawned and a signal number.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let o = child.wait_with_output().expect("wait");
    assert_eq!(o.status.code(), Some(130), "{}", show(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("the decoy was removed"));
    assert_eq!(canary_dirs(&tmp), 0, "the decoy was left behind");
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

/// A real build: a crate whose build script compiles C (the compiler and
/// `ar` as grandchildren; a vendored dependency) builds offline with the
/// host's Rust toolchain, granted
/// read+exec as the build profile grants it, and the program runs; the
/// outputs land in the project, `target/` created at its top.
fn a_crate_with_a_c_build_script_builds_offline(t: &str) {
    require_tier(t);
    let w = World::new();
    w.git_init();
    hull_tests::c_build_crate(Path::new(env!("CARGO_TARGET_TMPDIR")), &w.project);
    let (rustup, cargo) = hull_tests::host_rust();
    let bin = cargo.join("bin");
    let pol = w.root.path().join("rust.toml");
    std::fs::write(
        &pol,
        format!(
            "version = 1\n[fs]\nread_exec = [\"/usr\", \"/bin\", \"/lib\", \"/lib64\", {rustup:?}, {bin:?}]\n\
             read = [\"/etc\"]\nread_write = [\"${{PROJECT}}\"]\n[limits]\nmemory = \"2GiB\"\n\
             [env]\npass = [\"RUSTUP_TOOLCHAIN\"]\n[env.set]\nRUSTUP_HOME = {rustup:?}\n\
             CARGO_HOME = \"${{TMP}}/cargo\"\nPATH = \"{}:/usr/bin:/bin\"\n",
            bin.display()
        ),
    )
    .expect("write policy");
    // Under TCG the build takes about 100 s in tier 3 (rustc emulated):
    // the run's deadline stays inside the test runner's 5 minutes.
    let o = w.run(
        t,
        &["--policy", pol.to_str().expect("utf8"), "--timeout", "260s"],
        "cargo build --offline -q && ./target/debug/cbuild",
    );
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "hello from C: 42\n");
    assert!(w.project.join("target/debug/cbuild").is_file());
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
        read_canary_outside,
        write_outside,
        spill_is_readable_not_writable,
        other_instance_is_invisible,
        protected_names_in_project,
        protected_names_before_they_exist,
        shell_rc_files_in_a_writable_home,
        symlink_out_of_project,
        hardlink_to_outside,
        proc_root_traversal,
        tcp_to_host_loopback,
        ptrace_host_process,
        host_sysv_ipc_is_unreachable,
        prlimit_of_a_host_process,
        host_env_secret_not_visible,
        setsid_grandchild_dies_on_timeout,
        interrupt_kills_the_tree,
        kernel_knobs_are_read_only,
        inherited_descriptors_are_closed,
        stdout_file_is_not_reopened,
        project_read_and_write,
        top_level_entries_of_the_project,
        a_flat_c_project_makes_at_the_top,
        a_crate_with_a_c_build_script_builds_offline,
        tmp_works_and_tmpdir_is_honoured,
        exit_codes_and_signals,
        streams_are_live_and_stdin_passes,
        output_is_byte_exact,
        new_files_belong_to_the_caller,
        metadata_outside_the_grants_is_unchangeable,
        read_only_grant_nested_in_the_project,
        toolchain_caches_are_read_only,
        grant_through_a_planted_link_is_refused,
        hull_state_is_hidden,
        renaming_an_ancestor_keeps_the_protection,
        nested_repositories_are_protected,
        git_config_targets_in_the_worktree_are_protected,
        a_process_with_an_exited_main_thread_dies_with_the_run,
    ],
    landlock: [
        the_canary_reports_no_leak,
        the_canary_removes_its_decoy_when_interrupted,
        the_create_broker_keeps_the_protections,
        a_project_under_the_real_home,
        read_grant_is_not_executable,
        inotify_outside_the_grants_is_refused,
        host_unix_sockets_under_a_grant_are_unreachable,
        the_tree_lives_in_a_cgroup_of_its_own,
        terminal_settings_are_restored,
        setid_bits_are_refused,
        host_device_nodes_keep_their_mode,
        root_only_files_stay_unreadable,
    ],
    bwrap: [
        the_canary_reports_no_leak,
        a_project_under_the_real_home,
        a_killed_bwrap_is_named_and_takes_the_command_along,
        inotify_outside_the_grants_is_refused,
        host_unix_sockets_under_a_grant_are_unreachable,
        terminal_settings_are_restored,
        line_discipline_is_not_settable,
        setid_bits_are_refused,
        host_device_nodes_keep_their_mode,
        root_only_files_stay_unreadable,
    ],
    vm: [
        a_host_program_for_a_newer_glibc_is_refused_by_name,
        read_grant_is_not_executable,
        setid_bits_are_refused,
        host_device_nodes_keep_their_mode,
        root_only_files_stay_unreadable,
    ],
);
