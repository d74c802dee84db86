//! Cross-process tests of the lock protocol: real concurrent processes (this
//! test binary re-run as a helper, `sh` with `flock(1)`, `sleep`), real
//! locks, real cleanup.
//!
//! The helper is the ignored test [`helper_process`]; the tests start it
//! with `--ignored --exact` and a mode in the environment, and talk to it
//! over its stdin and stdout (lines starting with `HELPER `).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::Once;
use std::time::Duration;

use super::gc::{gc, list, GcOutcome, RunState, SPILL_MAX_AGE};
use super::{Instance, InstanceId, LOCK_FILE};

const MODE: &str = "HULL_RT_HELPER_MODE";
const ROOT: &str = "HULL_RT_HELPER_ROOT";
const ID: &str = "HULL_RT_HELPER_ID";

/// Orphans (the helper's `sleep` after the helper was killed) become our
/// children, so they can be killed and reaped by pid, deterministically.
fn become_subreaper() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        rustix::process::set_child_subreaper(Some(rustix::process::getpid()))
            .expect("PR_SET_CHILD_SUBREAPER");
    });
}

struct Helper {
    child: Child,
    out: BufReader<ChildStdout>,
}

impl Helper {
    fn start(mode: &str, root: &Path, id: Option<InstanceId>) -> Helper {
        let exe = std::env::current_exe().unwrap();
        let mut c = Command::new(exe);
        c.args([
            "--ignored",
            "--exact",
            "runtime::tests::helper_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(MODE, mode)
        .env(ROOT, root)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
        if let Some(id) = id {
            c.env(ID, id.to_string());
        }
        let mut child = c.spawn().unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        Helper { child, out }
    }

    /// The next `HELPER ` line (libtest's own lines are skipped).
    fn line(&mut self) -> String {
        loop {
            let mut l = String::new();
            let n = self.out.read_line(&mut l).unwrap();
            assert!(n > 0, "helper ended without answering");
            // libtest prints "test NAME ... " without a newline first.
            if let Some(at) = l.find("HELPER ") {
                return l[at + "HELPER ".len()..].trim_end().to_string();
            }
        }
    }

    fn say(&mut self, s: &str) {
        let stdin = self.child.stdin.as_mut().unwrap();
        writeln!(stdin, "{s}").unwrap();
        stdin.flush().unwrap();
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A process we adopted (an orphan of a killed helper), killed and reaped
/// by pid on drop.
struct Adopted(i32);

impl Adopted {
    fn kill(&mut self) {
        if self.0 == 0 {
            return;
        }
        let pid = rustix::process::Pid::from_raw(self.0).unwrap();
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        let _ = rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty());
        self.0 = 0;
    }
}

impl Drop for Adopted {
    fn drop(&mut self) {
        self.kill();
    }
}

fn age(p: &Path, by: Duration) {
    let f = std::fs::File::options().write(true).open(p).unwrap();
    f.set_modified(std::time::SystemTime::now() - by).unwrap();
}

fn outcome_for(root: &Path, id: InstanceId) -> GcOutcome {
    let r = gc(root, &|_| {}).unwrap();
    r.entries
        .into_iter()
        .find(|e| e.name == id.to_string())
        .map(|e| e.outcome)
        .unwrap_or_else(|| panic!("{id} not in gc report"))
}

/// Fills a run dir: a file in tmp, a fresh and a 25-hour-old spill file.
fn populate(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let t = dir.join("tmp/work.o");
    let fresh = dir.join("spill/fresh-stdout.txt");
    let old = dir.join("spill/old-stdout.txt");
    std::fs::write(&t, b"object").unwrap();
    std::fs::write(&fresh, b"fresh").unwrap();
    std::fs::write(&old, b"old").unwrap();
    age(&old, SPILL_MAX_AGE + Duration::from_secs(3600));
    (t, fresh, old)
}

#[test]
fn dead_hull_with_living_child_is_never_cleaned() {
    let _serial = super::serial();
    become_subreaper();
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("runs");
    std::fs::create_dir(&root).unwrap();

    // A real hull-like process: creates an instance, starts a child that
    // carries the lock, then dies by SIGKILL (no cleanup of any kind).
    let mut h = Helper::start("spawn-child-then-hang", &root, None);
    let info = h.line();
    let (id, pid) = info.split_once(' ').unwrap();
    let id: InstanceId = id.parse().unwrap();
    let mut child = Adopted(pid.parse().unwrap());
    let dir = root.join(id.to_string());
    let (t, fresh, old) = populate(&dir);
    let lock = std::fs::canonicalize(dir.join(LOCK_FILE)).unwrap();
    assert!(super::instance::tests::has_open(child.0 as u32, &lock));

    h.child.kill().unwrap();
    h.child.wait().unwrap();
    drop(h);

    // hull is gone, its child is not: nothing is touched, however old.
    assert_eq!(outcome_for(&root, id), GcOutcome::InUse);
    assert!(t.is_file() && fresh.is_file() && old.is_file());
    let l = list(&root).unwrap();
    assert_eq!(
        l.iter().find(|i| i.id == id).unwrap().state,
        RunState::Active
    );
    // A new hull cannot finish it either (joining takes a shared hold).
    let joined = Instance::join(&root, id).unwrap();
    assert!(!joined.finish().unwrap().tmp_removed);
    assert!(t.is_file());

    // The child ends: the next pass cleans by the rules.
    child.kill();
    assert_eq!(
        outcome_for(&root, id),
        GcOutcome::Cleaned {
            tmp_removed: true,
            spill_removed: 1,
            spill_kept: 1,
            bytes_freed: 6 + 3,
            dir_removed: false,
        }
    );
    assert!(!dir.join("tmp").exists());
    assert!(fresh.is_file(), "fresh spill kept");
    assert!(!old.exists(), "spill older than 24 h removed");
    assert_eq!(list(&root).unwrap()[0].state, RunState::Idle);

    // Once the last spill file is old, the run dir goes entirely.
    age(&fresh, SPILL_MAX_AGE + Duration::from_secs(1));
    assert!(matches!(
        outcome_for(&root, id),
        GcOutcome::Cleaned {
            dir_removed: true,
            ..
        }
    ));
    assert!(!dir.exists());
    assert!(matches!(
        Instance::join(&root, id),
        Err(super::InstanceError::NotFound { .. })
    ));
}

#[test]
fn external_flock_holder_is_respected() {
    let _serial = super::serial();
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("runs");
    let i = Instance::create(&root).unwrap();
    let (id, dir) = (i.id(), i.dir().to_path_buf());
    let (t, fresh, old) = populate(&dir);
    drop(i); // released: from here only the shell below holds it

    let mut sh = Command::new("sh")
        .arg("-c")
        .arg(r#"exec 9<"$1" && flock -s 9 && echo locked && exec sleep 600"#)
        .arg("sh")
        .arg(dir.join(LOCK_FILE))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(sh.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "locked\n", "flock(1) from util-linux is needed");

    assert_eq!(outcome_for(&root, id), GcOutcome::InUse);
    assert!(t.is_file() && fresh.is_file() && old.is_file());

    sh.kill().unwrap();
    sh.wait().unwrap();
    assert!(matches!(
        outcome_for(&root, id),
        GcOutcome::Cleaned {
            tmp_removed: true,
            spill_removed: 1,
            spill_kept: 1,
            dir_removed: false,
            ..
        }
    ));
    assert!(!t.exists() && fresh.is_file() && !old.exists());
}

#[test]
fn concurrent_joiners_do_not_remove_each_others_tmp() {
    let _serial = super::serial();
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("runs");
    let mine = Instance::create(&root).unwrap();
    let tmp = mine.tmp().to_path_buf();
    std::fs::write(tmp.join("mine"), b"1").unwrap();

    // Another process joins the same instance (`hull run --instance ID`).
    let mut h = Helper::start("join-then-finish", &root, Some(mine.id()));
    assert_eq!(h.line(), "joined");
    std::fs::write(tmp.join("theirs"), b"2").unwrap();

    // We finish first: the other process still uses tmp.
    assert!(!mine.finish().unwrap().tmp_removed);
    assert!(tmp.join("mine").is_file() && tmp.join("theirs").is_file());
    let id = super::InstanceId::from_dir_name(
        tmp.parent().unwrap().file_name().unwrap().to_str().unwrap(),
    )
    .unwrap();
    assert_eq!(outcome_for(&root, id), GcOutcome::InUse);
    assert!(tmp.join("mine").is_file() && tmp.join("theirs").is_file());

    // The other finishes last: it removes tmp.
    h.say("finish");
    assert_eq!(h.line(), "tmp_removed=true");
    assert!(h.child.wait().unwrap().success());
    assert!(!tmp.exists());
}

#[test]
fn removal_as_unprivileged_user_handles_read_only_dirs() {
    let _serial = super::serial();
    let d = tempfile::tempdir().unwrap();
    let work = d.path().join("work");
    std::fs::create_dir(&work).unwrap();
    // The helper drops to uid/gid 65534, builds a tree with read-only and
    // unreadable directories (as Go's module cache and a hostile command
    // leave them), and removes it with the runtime's remove_tree.
    rustix::fs::chown(
        &work,
        Some(rustix::process::Uid::from_raw(65534)),
        Some(rustix::process::Gid::from_raw(65534)),
    )
    .expect("chown to 65534 (tests run as root here)");
    let mut h = Helper::start("remove-as-nobody", &work, None);
    assert_eq!(h.line(), "built");
    assert!(work.join("tree/ro/deep/f").exists(), "tree was built");
    h.say("go");
    assert_eq!(h.line(), "removed");
    assert!(!work.join("tree").exists());
}

/// Not a test: the helper process the tests above start.
#[test]
#[ignore = "helper process, started by the cross-process tests"]
fn helper_process() {
    let mode = std::env::var(MODE).expect("started by a cross-process test (HULL_RT_HELPER_MODE)");
    let root = PathBuf::from(std::env::var_os(ROOT).unwrap());
    let say = |s: &str| {
        let mut o = std::io::stdout().lock();
        writeln!(o, "HELPER {s}").unwrap();
        o.flush().unwrap();
    };
    let wait_line = || {
        let mut l = String::new();
        std::io::stdin().read_line(&mut l).unwrap();
        l
    };
    match mode.as_str() {
        "spawn-child-then-hang" => {
            let i = Instance::create(&root).unwrap();
            let mut c = Command::new("sleep");
            c.arg("600")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            i.pass_lock_to(&mut c);
            let child = c.spawn().unwrap();
            say(&format!("{} {}", i.id(), child.id()));
            wait_line(); // until killed
            std::process::exit(3);
        }
        "join-then-finish" => {
            let id: InstanceId = std::env::var(ID).unwrap().parse().unwrap();
            let i = Instance::join(&root, id).unwrap();
            say("joined");
            assert_eq!(wait_line().trim(), "finish");
            let o = i.finish().unwrap();
            say(&format!("tmp_removed={}", o.tmp_removed));
        }
        "remove-as-nobody" => {
            rustix::thread::set_thread_gid(rustix::process::Gid::from_raw(65534)).unwrap();
            rustix::thread::set_thread_uid(rustix::process::Uid::from_raw(65534)).unwrap();
            use std::os::unix::fs::PermissionsExt;
            let t = root.join("tree");
            std::fs::create_dir_all(t.join("ro/deep")).unwrap();
            std::fs::create_dir_all(t.join("closed/inner")).unwrap();
            std::fs::write(t.join("ro/deep/f"), b"x").unwrap();
            std::fs::write(t.join("closed/inner/g"), b"y").unwrap();
            let set = |p: &Path, m: u32| {
                std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
            };
            set(&t.join("ro/deep"), 0o555);
            set(&t.join("ro"), 0o555);
            set(&t.join("closed/inner"), 0o000);
            set(&t.join("closed"), 0o000);
            // Plain removal fails as this user.
            assert!(std::fs::remove_dir_all(&t).is_err());
            say("built");
            wait_line();
            super::fsx::remove_tree(&t).unwrap();
            say("removed");
        }
        m => panic!("unknown helper mode {m}"),
    }
}

/// A run that made its instance and ends with nothing to keep (no spill,
/// no logs) leaves no run dir; one with a spill file keeps it (without its
/// tmp); one that joined an instance (`--instance`) leaves it in place.
#[test]
fn a_run_with_nothing_to_keep_leaves_no_run_dir() {
    let _serial = super::serial();
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("runs");
    let i = Instance::create(&root).unwrap();
    let dir = i.dir().to_path_buf();
    std::fs::write(dir.join("tmp/work.o"), b"x").unwrap();
    let out = i.finish().unwrap();
    assert!(out.tmp_removed && out.dir_removed, "{out:?}");
    assert!(!dir.exists());

    let i = Instance::create(&root).unwrap();
    let (id, dir) = (i.id(), i.dir().to_path_buf());
    std::fs::write(dir.join("spill/out.txt"), b"x").unwrap();
    let out = i.finish().unwrap();
    assert!(out.tmp_removed && !out.dir_removed, "{out:?}");
    assert!(dir.join("spill/out.txt").is_file());
    assert!(!dir.join("tmp").exists());

    std::fs::remove_file(dir.join("spill/out.txt")).unwrap();
    let joined = Instance::join(&root, id).unwrap();
    assert!(!joined.finish().unwrap().dir_removed);
    assert!(dir.is_dir());
}

/// Beyond the bound, the oldest idle run dirs go whole, spill and all; one
/// in use is neither touched nor counted.
#[test]
fn idle_run_dirs_beyond_the_bound_go_oldest_first() {
    let _serial = super::serial();
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("runs");
    let mut made = Vec::new();
    for n in 0..5u64 {
        let i = Instance::create(&root).unwrap();
        let (id, dir) = (i.id(), i.dir().to_path_buf());
        std::fs::write(dir.join("spill/out.txt"), b"kept").unwrap();
        assert!(!i.finish().unwrap().dir_removed);
        // The first made is the oldest.
        age(&dir.join(LOCK_FILE), Duration::from_secs(3600 * (10 - n)));
        made.push((id, dir));
    }
    let held = Instance::join(&root, made[0].0).unwrap();
    let report = super::gc::gc_with(&root, &|_| {}, SPILL_MAX_AGE, 2).unwrap();
    let removed: Vec<bool> = made.iter().map(|(_, dir)| !dir.exists()).collect();
    assert_eq!(removed, [false, true, true, false, false], "{report:?}");
    assert!(made[0].1.join("spill/out.txt").is_file());
    for (id, dir) in &made[3..] {
        assert!(dir.join("spill/out.txt").is_file(), "{id}");
    }
    let outcome = |id: InstanceId| {
        report
            .entries
            .iter()
            .find(|e| e.name == id.to_string())
            .map(|e| e.outcome.clone())
            .unwrap()
    };
    assert_eq!(outcome(made[0].0), GcOutcome::InUse);
    assert!(matches!(
        outcome(made[1].0),
        GcOutcome::Cleaned {
            dir_removed: true,
            spill_kept: 0,
            ..
        }
    ));
    drop(held);
}
