//! End-to-end: the real `hull` binary's `read` and `runs` subcommands against
//! real run dirs (created through the library, as `hull run` does).
#![cfg(unix)]

use std::path::Path;
use std::process::{Command, Output};

use hull::runtime::{Instance, ReadAnswer};

/// The tests here run one at a time: `runs_list_and_gc` checks that an
/// instance is idle, and a child of this process between fork and exec
/// (another test's `hull`) briefly holds copies of every lock descriptor.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static M: std::sync::Mutex<()> = std::sync::Mutex::new(());
    M.lock().unwrap_or_else(|e| e.into_inner())
}

// A test helper outside a #[test] fn: clippy's allow-unwrap-in-tests does not reach it.
#[allow(clippy::unwrap_used)]
fn hull(runs: &Path, args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_hull"));
    c.args(args)
        .env("HULL_RUNS_DIR", runs)
        .env_remove("HULL_INSTANCE");
    for (k, v) in envs {
        c.env(k, v);
    }
    c.output().unwrap()
}

#[derive(serde::Deserialize)]
struct Json {
    text: String,
    next_cursor: Option<String>,
    truncated: bool,
    start_line: u64,
    end_line: u64,
}

#[test]
fn read_follows_cursors_and_refuses_escapes() {
    let _serial = serial();
    let d = tempfile::tempdir().unwrap();
    let project = d.path().join("p");
    std::fs::create_dir(&project).unwrap();
    let runs = d.path().join("runs");
    let me = Instance::create(&runs).unwrap();
    let other = Instance::create(&runs).unwrap();
    let body: String = (0..3000).map(|i| format!("{i}: ünïcödé ✓\n")).collect();
    std::fs::write(me.spill().join("big-stdout.txt"), &body).unwrap();
    std::fs::write(other.spill().join("x.txt"), "theirs\n").unwrap();
    std::fs::write(project.join("small.txt"), "a\nb\nc\n").unwrap();
    let p = project.to_str().unwrap();
    let id = me.id().to_string();

    // Plain text: a line range.
    let o = hull(
        &runs,
        &[
            "read",
            "--project",
            p,
            "small.txt",
            "--start-line",
            "2",
            "--max-lines",
            "1",
        ],
        &[],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.stdout, b"b\n");

    // JSON over a spill file of this instance (HULL_INSTANCE from the env),
    // following cursors until the whole file is back.
    let spill_file = me.spill().join("big-stdout.txt");
    let mut args: Vec<String> = vec![
        "read".into(),
        "--json".into(),
        "--project".into(),
        p.into(),
        spill_file.to_str().unwrap().into(),
    ];
    let mut got = String::new();
    let mut answers = 0;
    loop {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = hull(&runs, &a, &[("HULL_INSTANCE", &id)]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let j: Json = serde_json::from_slice(&o.stdout).unwrap();
        assert!(j.text.len() <= 10_000);
        assert_eq!(j.truncated, j.next_cursor.is_some());
        assert!(j.start_line <= j.end_line);
        got.push_str(&j.text);
        answers += 1;
        match j.next_cursor {
            Some(c) => {
                args = vec![
                    "read".into(),
                    "--json".into(),
                    "--project".into(),
                    p.into(),
                    "--cursor".into(),
                    c,
                ]
            }
            None => break,
        }
    }
    assert_eq!(got, body);
    assert!(answers >= 6, "{answers}");

    // Plain text of a truncated answer: at most 10,000 bytes, notice last.
    let o = hull(
        &runs,
        &[
            "read",
            "--project",
            p,
            spill_file.to_str().unwrap(),
            "--instance",
            &id,
        ],
        &[],
    );
    assert!(o.status.success());
    assert!(o.stdout.len() <= 10_000, "{}", o.stdout.len());
    let text = String::from_utf8(o.stdout).unwrap();
    let last = text.lines().last().unwrap();
    assert!(
        last.starts_with("[hull: answer truncated") && last.contains("--cursor "),
        "{last}"
    );

    // Refusals: exit 125 (hull failed), a message naming the path, no text.
    let other_file = other.spill().join("x.txt");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["read", "--project", p, "../runs"],
            "`..` is not allowed",
        ),
        (
            vec![
                "read",
                "--project",
                p,
                other_file.to_str().unwrap(),
                "--instance",
                &id,
            ],
            "not in this instance's spill",
        ),
        (
            vec!["read", "--project", p, spill_file.to_str().unwrap()],
            "no instance was given",
        ),
        (
            vec!["read", "--project", p, "/etc/hostname"],
            "outside the project",
        ),
        (
            vec!["read", "--project", p, "small.txt", "--instance", "nope"],
            "not a hull instance id",
        ),
    ];
    for (args, want) in cases {
        let o = hull(&runs, &args, &[]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(125), "{args:?}: {err}");
        assert!(o.stdout.is_empty(), "{args:?}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
    // A cursor from this instance, used for the other: refused.
    let first: ReadAnswer = hull::runtime::ReadScope::new(&project, &runs, Some(me.id()))
        .unwrap()
        .read(&hull::runtime::ReadRequest::Range {
            path: spill_file.clone(),
            start_line: None,
            max_lines: None,
        })
        .unwrap();
    let c = first.next_cursor.unwrap();
    let other_id = other.id().to_string();
    let o = hull(
        &runs,
        &[
            "read",
            "--project",
            p,
            "--cursor",
            &c,
            "--instance",
            &other_id,
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&o.stderr).contains("another hull instance"));
}

#[test]
fn runs_list_and_gc() {
    let _serial = serial();
    let d = tempfile::tempdir().unwrap();
    let runs = d.path().join("runs");
    let busy = Instance::create(&runs).unwrap();
    let idle = Instance::create(&runs).unwrap();
    std::fs::write(idle.tmp().join("t"), "x").unwrap();
    std::fs::write(idle.spill().join("s.txt"), "y").unwrap();
    let (idle_id, idle_tmp) = (idle.id().to_string(), idle.tmp().to_path_buf());
    drop(idle);

    let o = hull(&runs, &["runs", "list", "--json"], &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let state = |id: &str| {
        v.as_array()
            .unwrap()
            .iter()
            .find(|e| e["id"] == id)
            .map(|e| e["state"].as_str().unwrap().to_string())
            .unwrap()
    };
    assert_eq!(state(&busy.id().to_string()), "active");
    assert_eq!(state(&idle_id), "idle");

    let o = hull(&runs, &["runs", "gc"], &[]);
    assert!(o.status.success());
    let text = String::from_utf8(o.stdout).unwrap();
    assert!(
        text.contains(&format!("{}: in use, not touched", busy.id())),
        "{text}"
    );
    assert!(
        text.contains(&format!("{idle_id}: idle: tmp removed")),
        "{text}"
    );
    assert!(!idle_tmp.exists());
    assert!(idle_tmp.with_file_name("spill").join("s.txt").is_file());
    assert!(busy.tmp().is_dir());
}

/// A VMs directory another user made first (or could write): `hull vm`
/// refuses it instead of acting on what may be planted there (a pid file
/// naming a victim, which `hull vm status` would otherwise kill).
#[test]
fn a_vms_directory_of_another_user_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let _g = serial();
    let t = tempfile::tempdir().unwrap();
    let vms = t.path().join("vms");
    std::fs::create_dir_all(vms.join("victim/m")).unwrap();
    let mut victim = Command::new("sleep").arg("60").spawn().unwrap();
    // A planted record of a "stale" VM whose helper is the victim: its
    // pid, start time and program, as hull writes them.
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", victim.id())).unwrap();
    let start: u64 = stat[stat.rfind(')').unwrap() + 1..]
        .split_whitespace()
        .nth(19)
        .unwrap()
        .parse()
        .unwrap();
    let exe = std::fs::read_link(format!("/proc/{}/exe", victim.id())).unwrap();
    std::fs::write(
        vms.join("victim/m/qemu.pid"),
        format!("{}\n{start}\n{}\n", victim.id(), exe.display()),
    )
    .unwrap();
    // SAFETY: geteuid takes no arguments and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        std::os::unix::fs::chown(&vms, Some(65534), Some(65534)).unwrap();
    } else {
        std::fs::set_permissions(&vms, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let o = hull(
        t.path(),
        &["vm", "status"],
        &[("HULL_VMS_DIR", vms.to_str().unwrap())],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(125), "{err}");
    assert!(err.contains("not safe to use"), "{err}");
    assert!(
        victim.try_wait().unwrap().is_none(),
        "the planted pid's process was killed"
    );
    let _ = victim.kill();
    let _ = victim.wait();
}

/// What a command wrote, read back on the user's terminal: its escape
/// sequences are shown escaped, never sent to the terminal; piped, the text
/// is exact.
#[test]
fn read_on_a_terminal_escapes_control_characters() {
    let _serial = serial();
    let d = tempfile::tempdir().unwrap();
    let runs = d.path().join("runs");
    let proj = d.path().join("proj");
    std::fs::create_dir_all(&proj).unwrap();
    let evil = "title\x1b]0;pwned\x07\x1b[2Jrest\n";
    std::fs::write(proj.join("evil.txt"), evil).unwrap();
    let p = proj.to_str().unwrap();
    let piped = hull(&runs, &["read", "--project", p, "evil.txt"], &[]);
    assert!(
        piped.status.success(),
        "{}",
        String::from_utf8_lossy(&piped.stderr)
    );
    assert_eq!(piped.stdout, evil.as_bytes());
    // On a pseudo-terminal of its own (python's pty relays what it gets).
    let o = Command::new("python3")
        .args([
            "-c",
            "import pty, sys; pty.spawn(sys.argv[1:])",
            env!("CARGO_BIN_EXE_hull"),
            "read",
            "--project",
            p,
            "evil.txt",
        ])
        .env("HULL_RUNS_DIR", &runs)
        .env_remove("HULL_INSTANCE")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("python3 is needed for this test");
    let shown = String::from_utf8_lossy(&o.stdout);
    assert!(
        shown.contains("title\\x1b]0;pwned\\x07\\x1b[2Jrest"),
        "{shown:?}"
    );
    assert!(!o.stdout.contains(&0x1b), "{shown:?}");
}

/// A tmpfs of `size` (with `opts`) mounted over a fresh dir; unmounted
/// (lazily) when dropped.
#[cfg(target_os = "linux")]
struct Tmpfs {
    dir: tempfile::TempDir,
}

#[cfg(target_os = "linux")]
impl Tmpfs {
    #[allow(clippy::unwrap_used, clippy::expect_used)]
    fn mount(opts: &str) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", opts, "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("mount(8)");
        assert!(st.success(), "mount -t tmpfs -o {opts} (needs root)");
        Tmpfs { dir }
    }
}

#[cfg(target_os = "linux")]
impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// Output that fills the disk of the spill ends the run with an error that
/// names the spill file and the bytes it kept, and the file holds exactly
/// them; a read-only runs root is refused by name, with the way out.
#[cfg(target_os = "linux")]
#[test]
#[ignore = "needs root (mounts a tmpfs); run with --ignored as root"]
fn a_full_spill_and_a_read_only_runs_root_are_named() {
    let _serial = serial();
    let project = tempfile::tempdir().unwrap();
    let p = project.path().to_str().unwrap();
    let full = Tmpfs::mount("size=64k,mode=0700");
    let runs = full.dir.path().join("runs");
    let o = hull(
        &runs,
        &[
            "run",
            "--tier",
            "none",
            "--project",
            p,
            "--spill",
            "1000",
            "--timeout",
            "30s",
            "--",
            "sh",
            "-c",
            "head -c 200000 /dev/zero | tr '\\0' x",
        ],
        &[],
    );
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(125), "{err}");
    assert!(err.contains("No space left on device"), "{err}");
    // "spill file PATH: ...; it keeps the first N of the M bytes ..."
    let path = err
        .split("spill file ")
        .nth(1)
        .and_then(|r| r.split(':').next())
        .unwrap_or_else(|| panic!("no spill file named: {err}"));
    let kept: u64 = err
        .split("it keeps the first ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no byte count: {err}"));
    assert!(kept > 0, "{err}");
    assert_eq!(std::fs::metadata(path).unwrap().len(), kept, "{err}");
    assert!(std::fs::read(path).unwrap().iter().all(|b| *b == b'x'));

    let ro = Tmpfs::mount("ro,size=64k");
    let runs = ro.dir.path().join("runs");
    let o = hull(
        &runs,
        &[
            "run",
            "--tier",
            "none",
            "--project",
            p,
            "--timeout",
            "30s",
            "--",
            "echo",
            "RAN",
        ],
        &[],
    );
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(125), "{err}");
    assert!(!String::from_utf8_lossy(&o.stdout).contains("RAN"));
    assert!(
        err.contains(&format!("the runs root {runs:?}: Read-only file system"))
            && err.contains("set HULL_RUNS_DIR to a writable directory"),
        "{err}"
    );
}

/// A listing whose reader went away (`hull runs list | head -0`) ends
/// quietly, by SIGPIPE as `ls` does, instead of panicking in `println!`.
#[cfg(unix)]
#[test]
fn a_closed_stdout_ends_a_listing_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let _serial = serial();
    let d = tempfile::tempdir().unwrap();
    let (r, w) = std::io::pipe().unwrap();
    drop(r);
    let bin = std::env::var_os("HULL_BIN")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_hull").into());
    let o = Command::new(bin)
        .args(["runs", "list"])
        .env("HULL_RUNS_DIR", d.path().join("runs"))
        .env_remove("HULL_INSTANCE")
        .stdout(w)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(
        o.status.signal(),
        Some(libc::SIGPIPE),
        "{:?} {err}",
        o.status
    );
}

/// `hull completions bash` is a script bash loads, completing hull's
/// subcommands; zsh and fish get theirs too.
#[test]
fn completions_load_in_bash_and_name_the_subcommands() {
    let d = tempfile::tempdir().unwrap();
    let o = hull(d.path(), &["completions", "bash"], &[]);
    assert!(o.status.success(), "{o:?}");
    let script = d.path().join("hull.bash");
    std::fs::write(&script, &o.stdout).unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    for sub in ["run", "canary", "probe", "batch", "completions"] {
        assert!(text.contains(sub), "{sub}");
    }
    let b = Command::new("bash")
        .arg("-c")
        .arg(format!(". '{}' && complete -p hull", script.display()))
        .output()
        .unwrap();
    assert!(b.status.success(), "{b:?}");
    assert!(
        String::from_utf8_lossy(&b.stdout).contains("-F _hull"),
        "{b:?}"
    );
    for shell in ["zsh", "fish"] {
        let o = hull(d.path(), &["completions", shell], &[]);
        assert!(o.status.success() && !o.stdout.is_empty(), "{shell}: {o:?}");
    }
    let o = hull(d.path(), &["completions", "tcsh"], &[]);
    assert!(!o.status.success(), "an unknown shell is refused");
}

/// `hull man` prints a man page that man renders; `--dir` writes a page
/// for each subcommand.
#[test]
fn the_man_page_renders_and_has_a_page_per_subcommand() {
    let d = tempfile::tempdir().unwrap();
    let o = hull(d.path(), &["man"], &[]);
    assert!(o.status.success(), "{o:?}");
    let page = d.path().join("hull.1");
    std::fs::write(&page, &o.stdout).unwrap();
    let r = Command::new("man")
        .arg("-l")
        .arg(&page)
        .env("MANPAGER", "cat")
        .env("MANWIDTH", "100")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&r.stdout);
    assert!(r.status.success(), "{r:?}");
    assert!(text.contains("OS-enforced boundary"), "{text}");
    assert!(text.contains("canary"), "{text}");
    let dir = d.path().join("pages");
    let o = hull(d.path(), &["man", "--dir", dir.to_str().unwrap()], &[]);
    assert!(o.status.success(), "{o:?}");
    for p in ["hull.1", "hull-run.1", "hull-canary.1"] {
        assert!(dir.join(p).exists(), "{p}");
    }
}

/// `hull run` with nothing to keep leaves no instance directory; a run
/// whose output spilled keeps its own; beyond `HULL_RUNS_KEEP` the oldest
/// idle ones go at the next pass, spill and all.
#[test]
fn runs_with_nothing_to_keep_leave_nothing() {
    let _serial = serial();
    let d = tempfile::tempdir().unwrap();
    let project = d.path().join("p");
    std::fs::create_dir(&project).unwrap();
    let runs = d.path().join("runs");
    let p = project.to_str().unwrap();
    let list = |envs: &[(&str, &str)]| -> Vec<serde_json::Value> {
        let o = hull(&runs, &["runs", "list", "--json"], envs);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice::<serde_json::Value>(&o.stdout)
            .unwrap()
            .as_array()
            .unwrap()
            .clone()
    };
    for _ in 0..5 {
        let o = hull(
            &runs,
            &[
                "run",
                "--tier",
                "none",
                "--project",
                p,
                "--",
                "sh",
                "-c",
                "echo x > \"$TMPDIR/t\"",
            ],
            &[],
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    assert_eq!(list(&[]), Vec::<serde_json::Value>::new());
    let mut spilled = Vec::new();
    for _ in 0..3 {
        let o = hull(
            &runs,
            &[
                "run",
                "--tier",
                "none",
                "--project",
                p,
                "--spill=64",
                "--",
                "seq",
                "1",
                "1000",
            ],
            &[],
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let now = list(&[]);
        let new: Vec<String> = now
            .iter()
            .map(|r| r["id"].as_str().unwrap().to_string())
            .filter(|id| !spilled.contains(id))
            .collect();
        assert_eq!(new.len(), 1, "{now:?}");
        spilled.extend(new);
    }
    let o = hull(&runs, &["runs", "gc"], &[("HULL_RUNS_KEEP", "1")]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let left: Vec<String> = list(&[])
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(left, spilled[2..].to_vec(), "the newest is kept");
}
