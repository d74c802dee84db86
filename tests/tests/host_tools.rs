#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]
// The escape matrix and the end-to-end tests drive the Linux tiers (bubblewrap,
// Landlock, tier 3 on QEMU): off Linux this crate is empty, and type-checks.
#![cfg(target_os = "linux")]
// Test code: a failed expectation is a failed test.
//! hull's host-side tools on what another local user or a run left
//! (`hull batch --out`, `hull batch merge`), with hull as root: what the
//! host holds afterwards. Another user's planting is made as root and then
//! given to `nobody` (`lchown`): the tree is what `nobody` would have left.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use hull_tests::{require_tier, show, World};

const NOBODY: u32 = 65534;

fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "these tests are about hull running as root (as CI and evaluation farms run it): \
         run them as root"
    );
}

fn give_to_nobody(p: &Path) {
    std::os::unix::fs::lchown(p, Some(NOBODY), Some(NOBODY)).unwrap();
}

/// `hull batch JOBS --tier bwrap` on the world's project into `out`.
fn batch_cmd(w: &World, jobs: &Path, out: &Path) -> Command {
    let mut c = w.hull();
    c.arg("batch")
        .arg(jobs)
        .args(["--tier", "bwrap", "--project"])
        .arg(&w.project)
        .arg("--out")
        .arg(out)
        .args(["--timeout", "60s"])
        .stdin(Stdio::null());
    c
}

fn batch(w: &World, jobs: &Path, out: &Path) -> Output {
    batch_cmd(w, jobs, out).output().expect("hull batch")
}

/// `o` failed, its stderr saying `want`.
fn refused(o: &Output, want: &str) {
    assert_ne!(o.status.code(), Some(0), "{}", show(o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains(want),
        "{}",
        show(o)
    );
}

fn one_job(w: &World) -> std::path::PathBuf {
    let jobs = w.root.path().join("jobs.jsonl");
    std::fs::write(&jobs, "{\"id\": \"j1\", \"sh\": \"echo job-output\"}\n").unwrap();
    jobs
}

/// A directory `nobody` made first, with links where hull writes
/// (`results.jsonl` to a root file, `jobs` to a root directory), is
/// refused by name, owner and mode, and nothing is written through the
/// links; so are a link as DIR and a directory anyone may write in. A
/// directory hull makes gets the results. (Against the code before, the
/// batch cut root's file to nothing through the link, taking its text for
/// a torn last line, and `--resume` then appended to it.)
#[cfg(feature = "bwrap")]
#[test]
#[ignore = "needs root: plants as the user nobody what root's batch meets"]
fn batch_out_refuses_what_another_user_planted() {
    require_root();
    require_tier("bwrap");
    let w = World::new();
    let jobs = one_job(&w);
    let victim = w.root.path().join("victim.txt");
    // No newline: what hull takes for a torn last line and cuts.
    std::fs::write(&victim, "root's file").unwrap();
    let victim_dir = w.root.path().join("victim-dir");
    std::fs::create_dir(&victim_dir).unwrap();

    let planted = w.root.path().join("planted");
    std::fs::create_dir(&planted).unwrap();
    std::os::unix::fs::symlink(&victim, planted.join("results.jsonl")).unwrap();
    std::os::unix::fs::symlink(&victim_dir, planted.join("jobs")).unwrap();
    for p in [
        &planted,
        &planted.join("results.jsonl"),
        &planted.join("jobs"),
    ] {
        give_to_nobody(p);
    }
    let o = batch(&w, &jobs, &planted);
    assert_eq!(
        std::fs::read_to_string(&victim).unwrap(),
        "root's file",
        "{}",
        show(&o)
    );
    assert_eq!(std::fs::read_dir(&victim_dir).unwrap().count(), 0);
    assert_ne!(o.status.code(), Some(0), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&planted.display().to_string())
            && err.contains(&format!("uid {NOBODY}"))
            && err.contains("mode 0755"),
        "{}",
        show(&o)
    );

    // DIR itself a link (to a directory of root's): refused as a link.
    let link = w.root.path().join("link-out");
    std::os::unix::fs::symlink(&victim_dir, &link).unwrap();
    give_to_nobody(&link);
    refused(&batch(&w, &jobs, &link), "symbolic link");
    assert_eq!(std::fs::read_dir(&victim_dir).unwrap().count(), 0);

    // Root's own, but anyone may write in it: refused.
    let open = w.root.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    refused(&batch(&w, &jobs, &open), "mode 0777");
    assert_eq!(std::fs::read_dir(&open).unwrap().count(), 0);

    // One hull makes: the batch runs and its files land.
    let fresh = w.root.path().join("fresh/out");
    let o = batch(&w, &jobs, &fresh);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let results = std::fs::read_to_string(fresh.join("results.jsonl")).unwrap();
    assert_eq!(results.lines().count(), 1, "{results}");
    assert_eq!(
        std::fs::read_to_string(fresh.join("jobs/j1.bwrap.stdout")).unwrap(),
        "job-output\n"
    );
    let m = std::fs::metadata(&fresh).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o022), (0, 0));
}

/// `hull batch merge` reads a shard's `results.jsonl` only when it is a
/// regular file, bounded by the bytes read: one that is a link to
/// `/dev/zero` or a FIFO is refused at once, by name (against the code
/// before, `/dev/zero` grew hull's memory until it was killed, and a FIFO
/// blocked it).
#[test]
fn batch_merge_refuses_what_is_not_a_regular_file() {
    let w = World::new();
    let shard = w.root.path().join("shard");
    std::fs::create_dir(&shard).unwrap();
    for (what, make) in [
        (
            "link",
            Box::new(|p: &Path| std::os::unix::fs::symlink("/dev/zero", p).unwrap())
                as Box<dyn Fn(&Path)>,
        ),
        (
            "fifo",
            Box::new(|p: &Path| {
                let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
                // SAFETY: mkfifo with a valid NUL-terminated path.
                assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
            }),
        ),
    ] {
        let file = shard.join("results.jsonl");
        let _ = std::fs::remove_file(&file);
        make(&file);
        let t0 = Instant::now();
        let mut child = w
            .hull()
            .args(["batch", "merge"])
            .arg(&shard)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("hull batch merge");
        while child.try_wait().unwrap().is_none() {
            if t0.elapsed() > Duration::from_secs(20) {
                let _ = child.kill();
                panic!("{what}: hull batch merge still reading after 20 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let o = child.wait_with_output().unwrap();
        assert_ne!(o.status.code(), Some(0), "{what}: {}", show(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("not a regular file"),
            "{what}: {}",
            show(&o)
        );
    }
}

/// A batch job's environment reaches its command and no command line on
/// the host (`/proc/PID/cmdline` is any local user's to read): it goes to
/// `hull run` through a descriptor. (Against the code before, it was
/// `hull run --env K=V`.)
#[cfg(feature = "bwrap")]
#[test]
fn a_job_s_environment_shows_on_no_command_line() {
    require_tier("bwrap");
    let w = World::new();
    let secret = format!("job-secret-{}", std::process::id());
    let jobs = w.root.path().join("jobs.jsonl");
    std::fs::write(
        &jobs,
        format!(
            "{{\"id\": \"e\", \"sh\": \"echo $TOKEN; sleep 3\", \"env\": {{\"TOKEN\": \"{secret}\"}}}}\n"
        ),
    )
    .unwrap();
    let out = w.root.path().join("out");
    let mut child = batch_cmd(&w, &jobs, &out)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("hull batch");
    let needle = format!("TOKEN={secret}");
    let mut seen = 0;
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the batch did not end"
        );
        seen += usize::from(!hull_tests::pids_with(&needle).is_empty());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(child.wait().unwrap().code(), Some(0));
    assert_eq!(
        std::fs::read_to_string(out.join("jobs/e.bwrap.stdout")).unwrap(),
        format!("{secret}\n")
    );
    assert_eq!(seen, 0, "the value showed on a command line");
}
