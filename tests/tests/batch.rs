#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]
// The escape matrix and the end-to-end tests drive the Linux tiers (bubblewrap,
// Landlock, tier 3 on QEMU): off Linux this crate is empty, and type-checks.
#![cfg(target_os = "linux")]
// Test code: a failed expectation is a failed test.
//! `hull batch` with JSON jobs on the process tiers, end to end with the
//! real `hull`: a pristine workspace per job (bwrap, `workspace = "cow"`),
//! results appended per job and tier, bad lines named by number, exact
//! resume after `kill -9`, shards merged.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use hull_tests::{require_tier, show, World};

fn batch(w: &World, args: &[&str]) -> Output {
    w.hull()
        .arg("batch")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("hull batch")
}

/// `hull batch JOBS --tier T... --project (the world's) --out OUT EXTRA...`.
fn batch_jobs(w: &World, jobs: &Path, tiers: &[&str], out: &Path, extra: &[&str]) -> Output {
    let mut a = vec![jobs.to_str().unwrap()];
    for t in tiers {
        a.extend(["--tier", t]);
    }
    a.extend([
        "--project",
        w.project.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    a.extend(extra);
    batch(w, &a)
}

/// The whole lines of `out/results.jsonl` (a line being written is not
/// one yet).
fn results(out: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(out.join("results.jsonl")).unwrap_or_default();
    let whole = text.rfind('\n').map_or(0, |i| i + 1);
    text[..whole]
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn ids(rs: &[serde_json::Value]) -> Vec<String> {
    let mut v: Vec<String> = rs
        .iter()
        .map(|r| {
            format!(
                "{}@{}",
                r["id"].as_str().unwrap(),
                r["tier"].as_str().unwrap()
            )
        })
        .collect();
    v.sort();
    v
}

/// Three jobs each write into their workspace on bwrap: none sees another's
/// write, each keeps its own change set, the project is untouched; the
/// same jobs with `workspace = "shared"` on landlock write into the project
/// and their writes land. One result line per job and tier.
#[cfg(all(feature = "bwrap", feature = "landlock"))]
#[test]
fn json_jobs_run_on_each_tier_with_a_pristine_workspace_each() {
    require_tier("bwrap");
    require_tier("landlock");
    let w = World::new();
    std::fs::write(w.project.join("base.txt"), "base\n").unwrap();
    let listing = |p: &Path| {
        let o = Command::new("ls").current_dir(p).output().unwrap();
        String::from_utf8(o.stdout).unwrap()
    };
    let before = listing(&w.project);
    let jobs = w.root.path().join("jobs.jsonl");
    let mut text = String::from("# three jobs\n");
    for i in 1..=3 {
        text.push_str(&format!(
            "{{\"id\": \"j{i}\", \"sh\": \"ls; echo $N > mark-$N\", \"env\": {{\"N\": \"{i}\"}}}}\n"
        ));
    }
    std::fs::write(&jobs, &text).unwrap();
    let out = w.root.path().join("out");
    let o = batch_jobs(&w, &jobs, &["bwrap"], &out, &["--parallel", "2"]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let rs = results(&out);
    assert_eq!(ids(&rs), ["j1@bwrap", "j2@bwrap", "j3@bwrap"]);
    for r in &rs {
        assert_eq!(r["status"], "exit", "{r}");
        assert_eq!(r["exit_code"], 0, "{r}");
        assert_eq!(r["counts"]["added"], 1, "{r}");
        assert_eq!(r["receipt"]["tier"], "bwrap", "{r}");
        assert!(
            r["receipt"]["components"]["bwrap"]
                .as_str()
                .is_some_and(|v| v.starts_with("bubblewrap ")),
            "{r}"
        );
        assert!(r["receipt"]["components"]["kernel"].is_string(), "{r}");
        assert!(r["policy_sha256"].as_str().unwrap().len() == 64, "{r}");
        // Each saw the project as it was: no other job's mark.
        let seen = std::fs::read_to_string(r["stdout"].as_str().unwrap()).unwrap();
        assert_eq!(seen, before, "{r}");
    }
    assert_eq!(
        listing(&w.project),
        before,
        "a cow job wrote into the project"
    );

    // On landlock the same jobs may share the project.
    let shared = w.root.path().join("shared.jsonl");
    std::fs::write(
        &shared,
        text.replace("\"env\"", "\"workspace\": \"shared\", \"env\""),
    )
    .unwrap();
    let out2 = w.root.path().join("out2");
    let o = batch_jobs(&w, &shared, &["landlock"], &out2, &["--parallel", "1"]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(
        ids(&results(&out2)),
        ["j1@landlock", "j2@landlock", "j3@landlock"]
    );
    for i in 1..=3 {
        assert_eq!(
            std::fs::read_to_string(w.project.join(format!("mark-{i}"))).unwrap(),
            format!("{i}\n")
        );
    }
}

/// The same cow jobs on landlock (its overlay mounted in the command's own
/// mount namespace): each sees the project as it was, keeps its own change
/// set, and the project is untouched.
#[cfg(feature = "landlock")]
#[test]
fn cow_jobs_on_landlock_get_a_pristine_workspace_each() {
    require_tier("landlock");
    let w = World::new();
    std::fs::write(w.project.join("base.txt"), "base\n").unwrap();
    let jobs = w.root.path().join("jobs.jsonl");
    let text: String = (1..=3)
        .map(|i| format!("{{\"id\": \"j{i}\", \"sh\": \"ls; echo {i} > mark-{i}\"}}\n"))
        .collect();
    std::fs::write(&jobs, text).unwrap();
    let out = w.root.path().join("out");
    let o = batch_jobs(&w, &jobs, &["landlock"], &out, &["--parallel", "2"]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let rs = results(&out);
    assert_eq!(ids(&rs), ["j1@landlock", "j2@landlock", "j3@landlock"]);
    let mut sets = Vec::new();
    for r in &rs {
        assert_eq!(r["exit_code"], 0, "{r}");
        assert_eq!(r["counts"]["added"], 1, "{r}");
        let seen = std::fs::read_to_string(r["stdout"].as_str().unwrap()).unwrap();
        assert_eq!(seen, "base.txt\nsrc\n", "another job's write was seen: {r}");
        sets.push(r["changes"].as_str().unwrap().to_owned());
    }
    sets.sort();
    sets.dedup();
    assert_eq!(sets.len(), 3);
    for i in 1..=3 {
        assert!(!w.project.join(format!("mark-{i}")).exists());
    }
}

/// Each result tells the peak resident set of the job's largest process
/// on the process tiers: a job that fills 96 MiB shows at least that, a
/// `true` job far less.
#[cfg(all(feature = "bwrap", feature = "landlock"))]
#[test]
fn results_tell_the_peak_memory_of_each_job() {
    require_tier("bwrap");
    require_tier("landlock");
    let w = World::new();
    let jobs = w.root.path().join("jobs.jsonl");
    std::fs::write(
        &jobs,
        "{\"id\": \"small\", \"argv\": [\"true\"], \"workspace\": \"shared\"}\n\
         {\"id\": \"hog\", \"argv\": [\"python3\", \"-c\", \"b = bytearray(96 << 20); print(len(b))\"], \"workspace\": \"shared\"}\n",
    )
    .unwrap();
    let out = w.root.path().join("out");
    let o = batch_jobs(&w, &jobs, &["bwrap", "landlock"], &out, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let rs = results(&out);
    assert_eq!(rs.len(), 4, "{rs:?}");
    for r in &rs {
        assert_eq!(r["exit_code"], 0, "{r}");
        let peak = r["peak_rss_bytes"]
            .as_u64()
            .expect("a peak on a process tier");
        if r["id"] == "hog" {
            assert!(peak >= 96 << 20, "{r}");
        } else {
            assert!(peak > 0 && peak < 48 << 20, "{r}");
        }
    }
}

/// A batch on two tiers compares them in its summary: each tier's p50
/// against the fastest's, and the jobs whose exit code or stdout differed
/// from the first tier's (`/proc/1/comm` is bwrap's own init and the
/// host's on landlock; the shell's pid is small only in bwrap's pid
/// namespace).
#[cfg(all(feature = "bwrap", feature = "landlock"))]
#[test]
fn a_batch_on_two_tiers_says_which_jobs_differed() {
    require_tier("bwrap");
    require_tier("landlock");
    let w = World::new();
    let jobs = w.root.path().join("jobs.jsonl");
    std::fs::write(
        &jobs,
        "{\"id\": \"same\", \"sh\": \"echo same\", \"workspace\": \"shared\"}\n\
         {\"id\": \"comm\", \"argv\": [\"cat\", \"/proc/1/comm\"], \"workspace\": \"shared\"}\n\
         {\"id\": \"pid\", \"sh\": \"test $$ -lt 10\", \"workspace\": \"shared\"}\n",
    )
    .unwrap();
    let out = w.root.path().join("out");
    let o = batch_jobs(&w, &jobs, &["bwrap", "landlock"], &out, &[]);
    // `pid` exits 0 in bwrap's pid namespace only: the batch has a failure.
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    for want in [
        "x fastest",
        "exit codes: differ on 1 of 3 jobs: pid (bwrap 0, landlock 1)",
        "stdout: differs from bwrap's on 1 of 3 jobs: comm (landlock)",
    ] {
        assert!(err.contains(want), "{want}: {}", show(&o));
    }
}

/// Malformed lines and unknown keys are named by line number (fatal by
/// default, skipped on request); duplicate ids refuse the batch before
/// anything runs.
#[cfg(feature = "bwrap")]
#[test]
fn bad_lines_and_duplicate_ids_are_named_before_anything_runs() {
    require_tier("bwrap");
    let w = World::new();
    let jobs = w.root.path().join("jobs.jsonl");
    std::fs::write(
        &jobs,
        "{\"id\": \"a\", \"sh\": \"echo a > ran-a\"}\n{\"id\": \"b\", \"sh\": \"true\", \"colour\": 1}\n{oops\n",
    )
    .unwrap();
    let out = w.root.path().join("out");
    let args = |file: &Path, extra: &[&str]| -> Vec<String> {
        let mut v = vec![
            file.to_str().unwrap().to_string(),
            "--tier".into(),
            "bwrap".into(),
            "--project".into(),
            w.project.to_str().unwrap().into(),
            "--out".into(),
            out.to_str().unwrap().into(),
        ];
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let run = |v: Vec<String>| batch(&w, &v.iter().map(String::as_str).collect::<Vec<_>>());
    let o = run(args(&jobs, &[]));
    assert_eq!(o.status.code(), Some(125), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("2 bad lines, the first: line 2"), "{err}");
    assert!(err.contains("unknown field `colour`"), "{err}");
    assert!(!out.exists() && !w.project.join("ran-a").exists());
    let o = run(args(&jobs, &["--on-bad-line", "skip", "--json"]));
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("skipped line 2: not a job: unknown field `colour`"),
        "{err}"
    );
    assert!(err.contains("skipped line 3: not a job"), "{err}");
    assert_eq!(ids(&results(&out)), ["a@bwrap"]);
    let dup = w.root.path().join("dup.jsonl");
    std::fs::write(
        &dup,
        "{\"id\": \"x\", \"sh\": \"true\"}\n\n{\"id\": \"x\", \"sh\": \"true\"}\n",
    )
    .unwrap();
    let out = w.root.path().join("out-dup");
    let o = batch(
        &w,
        &[
            dup.to_str().unwrap(),
            "--tier",
            "bwrap",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(125), "{}", show(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr)
            .contains("line 3: the id \"x\" is also the id of line 1"),
        "{}",
        show(&o)
    );
    assert!(!out.exists());
}

/// What a killed batch may have left of its runs: a process whose command
/// line names the world's directory (`hull run`, bwrap, QEMU, virtiofsd),
/// an instance still locked, or anything in an instance directory but
/// what every run keeps (its lock file, spill and logs).
fn leftovers(w: &World) -> Vec<String> {
    let mut left = Vec::new();
    let p = Command::new("pgrep")
        .args(["-a", "-f", w.root.path().to_str().unwrap()])
        .output()
        .unwrap();
    left.extend(
        String::from_utf8_lossy(&p.stdout)
            .lines()
            .map(|l| format!("process {l}")),
    );
    let o = w.hull().args(["runs", "list", "--json"]).output().unwrap();
    let runs: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for r in runs.as_array().unwrap() {
        if r["state"] != "idle" {
            left.push(format!("instance {} {}", r["id"], r["state"]));
        }
        // A run dir removed since the listing (its run ended with nothing
        // to keep) left nothing.
        let Ok(entries) = std::fs::read_dir(r["dir"].as_str().unwrap()) else {
            continue;
        };
        for e in entries {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            if ![".active", "spill", "logs"].contains(&name.as_str()) {
                left.push(format!("{}/{name}", r["dir"].as_str().unwrap()));
            }
        }
    }
    left
}

/// `kill -9` of hull in the middle of a batch of `n` jobs on `tier`, then
/// `--resume`: every job has exactly one result line, the ones in flight
/// ran again, and nothing of the killed batch is left ([`leftovers`]).
///
/// The first job ends at once; the others sleep as long as the project's
/// `delay` file says: a minute while the batch is killed (so that a job
/// that outlived its batch is still there to be found), nothing once it is
/// resumed.
fn a_killed_batch_resumes(tier: &str, workspace: &str, n: usize, parallel: &str) {
    require_tier(tier);
    let w = World::new();
    std::fs::write(w.project.join("delay"), "60\n").unwrap();
    let jobs = w.root.path().join("jobs.jsonl");
    let text: String = (0..n)
        .map(|i| {
            let sleep = if i == 0 { "0" } else { "$(cat delay)" };
            format!(
                "{{\"id\": \"k{i}\", \"sh\": \"sleep {sleep}; echo {i}\", \"workspace\": \"{workspace}\"}}\n"
            )
        })
        .collect();
    std::fs::write(&jobs, text).unwrap();
    let out = w.root.path().join("out");
    let args = [
        jobs.to_str().unwrap(),
        "--tier",
        tier,
        "--project",
        w.project.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--parallel",
        parallel,
    ];
    let mut child = w
        .hull()
        .arg("batch")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while results(&out).is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "no results after 120 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Killed while the next jobs run.
    std::thread::sleep(Duration::from_millis(500));
    child.kill().unwrap();
    child.wait().unwrap();
    let before = results(&out).len();
    assert!(before < n, "the batch ended before it was killed");
    // The jobs in flight got SIGTERM with their parent and end as after an
    // interrupt (a VM is shut down, its helpers with it).
    let t0 = Instant::now();
    let mut left = leftovers(&w);
    while !left.is_empty() && t0.elapsed() < Duration::from_secs(15) {
        std::thread::sleep(Duration::from_millis(200));
        left = leftovers(&w);
    }
    assert!(left.is_empty(), "left by the killed batch: {left:#?}");
    let o = batch(&w, &args);
    assert_eq!(
        o.status.code(),
        Some(125),
        "a second batch into one --out: {}",
        show(&o)
    );
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--resume"),
        "{}",
        show(&o)
    );
    std::fs::write(w.project.join("delay"), "0\n").unwrap();
    let mut resumed: Vec<&str> = args.to_vec();
    resumed.push("--resume");
    let o = batch(&w, &resumed);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let rs = results(&out);
    let want: Vec<String> = (0..n).map(|i| format!("k{i}@{tier}")).collect();
    assert_eq!(ids(&rs), want, "not exactly one result per job");
    for r in &rs {
        let i = r["id"].as_str().unwrap().trim_start_matches('k');
        let got = std::fs::read_to_string(r["stdout"].as_str().unwrap()).unwrap();
        assert_eq!(got, format!("{i}\n"), "{r}");
    }
    assert!(leftovers(&w).is_empty(), "{:#?}", leftovers(&w));
}

#[cfg(feature = "bwrap")]
#[test]
fn a_killed_batch_resumes_with_exactly_one_result_per_job() {
    a_killed_batch_resumes("bwrap", "cow", 6, "2");
}

#[cfg(feature = "landlock")]
#[test]
fn a_killed_batch_on_landlock_resumes_with_exactly_one_result_per_job() {
    a_killed_batch_resumes("landlock", "cow", 6, "2");
}

/// Two shards run apart and merged hold the same jobs as one unsharded
/// run; a merge that misses a job, or has one twice, says which.
#[cfg(feature = "bwrap")]
#[test]
fn two_shards_merged_equal_one_unsharded_run() {
    require_tier("bwrap");
    let w = World::new();
    let jobs = w.root.path().join("jobs.jsonl");
    let text: String = (0..5)
        .map(|i| format!("{{\"id\": \"s{i}\", \"sh\": \"echo {i}\"}}\n"))
        .collect();
    std::fs::write(&jobs, text).unwrap();
    let dir = |n: &str| w.root.path().join(n);
    let run = |out: &Path, shard: Option<&str>| {
        let mut a = vec![
            jobs.to_str().unwrap(),
            "--tier",
            "bwrap",
            "--project",
            w.project.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ];
        if let Some(s) = shard {
            a.extend(["--shard", s]);
        }
        let o = batch(&w, &a);
        assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    };
    run(&dir("all"), None);
    run(&dir("s0"), Some("0/2"));
    run(&dir("s1"), Some("1/2"));
    assert_eq!(
        ids(&results(&dir("s0"))),
        ["s0@bwrap", "s2@bwrap", "s4@bwrap"]
    );
    let merged = dir("merged");
    let o = batch(
        &w,
        &[
            "merge",
            dir("s0").to_str().unwrap(),
            dir("s1").to_str().unwrap(),
            "--jobs",
            jobs.to_str().unwrap(),
            "--out",
            merged.to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(ids(&results(&merged)), ids(&results(&dir("all"))));
    let o = batch(
        &w,
        &[
            "merge",
            dir("s0").to_str().unwrap(),
            "--jobs",
            jobs.to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(125), "{}", show(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("job s1 has no result on tier bwrap"),
        "{}",
        show(&o)
    );
    let o = batch(
        &w,
        &[
            "merge",
            dir("s0").to_str().unwrap(),
            dir("all").to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(125), "{}", show(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("job s0 on tier bwrap has two results"),
        "{}",
        show(&o)
    );
}

/// A Slurm array job of two tasks, on slurmctld and slurmd started here
/// (`hull_tests::slurm`), runs `hull batch --shard $SLURM_ARRAY_TASK_ID/2`
/// in each task; `hull batch merge` of the two shards' directories finds
/// every job exactly once, each with its own change set.
/// Two jobs on bwrap, each on a container image of its own, and one on
/// the host's userland: each sees its own `/etc/os-release`, and its
/// receipt names its image.
#[cfg(feature = "bwrap")]
#[test]
fn each_job_runs_on_its_own_container_image_on_bwrap() {
    require_tier("bwrap");
    let w = World::new();
    let dir = w.root.path();
    let make = hull_tests::make_image;
    for (id, kind, name) in [
        ("image-a", "oci-archive", "a.oci.tar"),
        ("image-b", "docker-archive", "b.docker.tar"),
    ] {
        let layer = dir.join(format!("{id}.layer.tar"));
        make(&["busybox-layer", layer.to_str().unwrap(), id]);
        make(&[
            kind,
            dir.join(name).to_str().unwrap(),
            layer.to_str().unwrap(),
        ]);
    }
    let jobs = dir.join("jobs.jsonl");
    let script = "cat /etc/os-release | grep ^ID=";
    std::fs::write(
        &jobs,
        format!(
            "{{\"id\": \"a\", \"sh\": \"{script}\", \"image\": \"oci-archive:a.oci.tar\"}}\n\
             {{\"id\": \"b\", \"sh\": \"{script}\", \"image\": \"docker-archive:b.docker.tar\"}}\n\
             {{\"id\": \"host\", \"sh\": \"{script}\"}}\n"
        ),
    )
    .unwrap();
    let out = dir.join("out");
    let o = batch_jobs(&w, &jobs, &["bwrap"], &out, &["--parallel", "2"]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let rs = results(&out);
    assert_eq!(ids(&rs), ["a@bwrap", "b@bwrap", "host@bwrap"]);
    let host_id = std::fs::read_to_string("/etc/os-release")
        .unwrap()
        .lines()
        .find(|l| l.starts_with("ID="))
        .unwrap()
        .to_string();
    for r in &rs {
        assert_eq!(r["exit_code"], 0, "{r}");
        let seen = std::fs::read_to_string(r["stdout"].as_str().unwrap()).unwrap();
        let want = match r["id"].as_str().unwrap() {
            "a" => "ID=image-a".to_string(),
            "b" => "ID=image-b".to_string(),
            _ => host_id.clone(),
        };
        assert_eq!(seen.trim_end(), want, "{r}");
    }
}

#[cfg(feature = "bwrap")]
#[test]
#[ignore = "needs root: slurmd runs each job as its user"]
fn a_slurm_array_job_runs_two_shards_that_merge() {
    require_tier("bwrap");
    let w = World::new();
    let cluster = hull_tests::slurm::Cluster::start(&w.root.path().join("slurm"));
    let jobs = w.root.path().join("jobs.jsonl");
    let text: String = (0..4)
        .map(|i| format!("{{\"id\": \"t{i}\", \"sh\": \"echo {i} > out.txt; echo {i}\"}}\n"))
        .collect();
    std::fs::write(&jobs, text).unwrap();
    let out = w.root.path().join("shards");
    let script = w.root.path().join("task.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n\
             echo \"array task $SLURM_ARRAY_TASK_ID of $SLURM_ARRAY_TASK_COUNT\"\n\
             exec '{hull}' batch '{jobs}' --tier bwrap --project '{project}' \\\n\
               --shard \"$SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT\" \\\n\
               --out '{out}'/shard-\"$SLURM_ARRAY_TASK_ID\"\n",
            hull = hull_tests::hull_bin().display(),
            jobs = jobs.display(),
            project = w.project.display(),
            out = out.display(),
        ),
    )
    .unwrap();
    std::fs::create_dir(&out).unwrap();
    let mut sbatch = cluster.client("timeout");
    sbatch.args(["40", "sbatch", "--wait", "--array=0-1", "--chdir"]);
    sbatch.arg(w.root.path());
    sbatch.arg("--output").arg(out.join("task-%a.log"));
    sbatch.arg(&script).stdin(Stdio::null());
    w.hull_env(&mut sbatch);
    let o = sbatch.output().expect("sbatch");
    let logs = || {
        let mut s = String::new();
        for a in 0..2 {
            let f = out.join(format!("task-{a}.log"));
            s.push_str(&format!(
                "--- {}\n{}",
                f.display(),
                std::fs::read_to_string(&f).unwrap_or_default()
            ));
        }
        format!("{}\n{s}\n{}", show(&o), cluster.logs())
    };
    assert_eq!(o.status.code(), Some(0), "{}", logs());
    for a in 0..2 {
        let log = std::fs::read_to_string(out.join(format!("task-{a}.log"))).unwrap();
        assert!(log.contains(&format!("array task {a} of 2")), "{}", logs());
    }
    let shard = |a: u32| out.join(format!("shard-{a}"));
    assert_eq!(
        ids(&results(&shard(0))),
        ["t0@bwrap", "t2@bwrap"],
        "{}",
        logs()
    );
    assert_eq!(
        ids(&results(&shard(1))),
        ["t1@bwrap", "t3@bwrap"],
        "{}",
        logs()
    );
    let merged = w.root.path().join("merged");
    let o = batch(
        &w,
        &[
            "merge",
            shard(0).to_str().unwrap(),
            shard(1).to_str().unwrap(),
            "--jobs",
            jobs.to_str().unwrap(),
            "--out",
            merged.to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let rs = results(&merged);
    assert_eq!(ids(&rs), ["t0@bwrap", "t1@bwrap", "t2@bwrap", "t3@bwrap"]);
    let mut sets = Vec::new();
    for r in &rs {
        assert_eq!(r["status"], "exit", "{r}");
        assert_eq!(r["exit_code"], 0, "{r}");
        let n = &r["id"].as_str().unwrap()[1..];
        let got = std::fs::read_to_string(r["stdout"].as_str().unwrap()).unwrap();
        assert_eq!(got, format!("{n}\n"), "{r}");
        sets.push(
            r["changes"]
                .as_str()
                .expect("a cow job's change set")
                .to_owned(),
        );
    }
    sets.sort();
    sets.dedup();
    assert_eq!(sets.len(), 4, "one change set per job: {sets:?}");
    assert!(
        !w.project.join("out.txt").exists(),
        "a cow job wrote into the project"
    );
    // A merge without one shard names what is missing.
    let o = batch(
        &w,
        &[
            "merge",
            shard(0).to_str().unwrap(),
            "--jobs",
            jobs.to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(125), "{}", show(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("job t1 has no result on tier bwrap"),
        "{}",
        show(&o)
    );
}

/// Tier 3: each job in a VM of its own, its writes kept apart as its change
/// set; one result line per job with the tier-3 receipt.
#[cfg(feature = "tier3")]
mod vm {
    use super::*;

    #[test]
    fn json_jobs_run_on_vm_with_a_pristine_workspace_each() {
        require_tier("vm");
        let w = World::new();
        std::fs::write(w.project.join("base.txt"), "base\n").unwrap();
        let jobs = w.root.path().join("jobs.jsonl");
        std::fs::write(
            &jobs,
            "{\"id\": \"v1\", \"sh\": \"cat base.txt; ls mark-* 2>/dev/null; echo 1 > mark-1\"}\n\
             {\"id\": \"v2\", \"sh\": \"cat base.txt; ls mark-* 2>/dev/null; echo 2 > mark-2\", \"stdin\": \"x\"}\n\
             {\"id\": \"v3\", \"sh\": \"cat base.txt; dd if=/dev/zero of=/dev/null bs=96M count=1 2>/dev/null; echo 3 > mark-3\"}\n",
        )
        .unwrap();
        let out = w.root.path().join("out");
        let o = batch_jobs(&w, &jobs, &["vm"], &out, &["--parallel", "1"]);
        assert_eq!(o.status.code(), Some(0), "{}", show(&o));
        let rs = results(&out);
        assert_eq!(ids(&rs), ["v1@vm", "v2@vm", "v3@vm"]);
        for r in &rs {
            assert_eq!(r["exit_code"], 0, "{r}");
            assert_eq!(r["counts"]["added"], 1, "{r}");
            let seen = std::fs::read_to_string(r["stdout"].as_str().unwrap()).unwrap();
            assert_eq!(seen, "base\n", "another job's write was seen: {r}");
            let receipt = &r["receipt"];
            for c in ["qemu", "virtiofsd", "kernel", "guest_kernel", "incus"] {
                assert!(receipt["components"][c].is_string(), "{c}: {r}");
            }
            assert!(
                r["restore_s"]
                    .as_f64()
                    .is_some_and(|s| s > 0.0 && s < r["wall_s"].as_f64().unwrap()),
                "{r}"
            );
            assert!(
                r.get("peak_rss_bytes").is_none(),
                "QEMU's is not the job's: {r}"
            );
            // The container's peak, told by the guest: dd's 96 MiB buffer
            // shows, the others hold far less.
            let peak = r["peak_memory_bytes"].as_u64().expect("a peak on vm");
            if r["id"] == "v3" {
                assert!(peak >= 96 << 20, "{r}");
            } else {
                assert!(peak < 48 << 20, "{r}");
            }
            assert!(
                matches!(receipt["accelerator"].as_str(), Some("kvm" | "tcg")),
                "{r}"
            );
            assert_eq!(receipt["image_id"].as_str().map(str::len), Some(16), "{r}");
        }
        assert!(["mark-1", "mark-2", "mark-3"]
            .iter()
            .all(|m| !w.project.join(m).exists()));
    }

    /// Jobs of one batch on different userlands: one in an OCI archive's
    /// image, one in a docker archive's (both the tests' minbase with
    /// `hello`, so they share its prepared snapshot), one on the policy's
    /// default userland; each sees its own programs, and the receipt of an
    /// image's job names its image.
    #[test]
    fn each_job_runs_in_its_own_container_image() {
        require_tier("vm");
        let w = World::new();
        let rootfs = std::env::var_os("HULL_TEST_ROOTFS")
            .map(std::path::PathBuf::from)
            .unwrap_or_default();
        assert!(
            rootfs.is_file(),
            "HULL_TEST_ROOTFS names no file: scripts/test.sh makes it"
        );
        let dir = w.root.path();
        for (kind, name) in [
            ("oci-archive", "a.oci.tar"),
            ("docker-archive", "b.docker.tar"),
        ] {
            hull_tests::make_image(&[
                kind,
                dir.join(name).to_str().unwrap(),
                rootfs.to_str().unwrap(),
            ]);
        }
        let jobs = dir.join("jobs.jsonl");
        let script = "hello 2>/dev/null || echo no hello; command -v python3 || echo no python3";
        std::fs::write(
            &jobs,
            format!(
                "{{\"id\": \"oci\", \"sh\": \"{script}\", \"image\": \"oci-archive:a.oci.tar\"}}\n\
                 {{\"id\": \"docker\", \"sh\": \"{script}\", \"image\": \"docker-archive:b.docker.tar\"}}\n\
                 {{\"id\": \"default\", \"sh\": \"{script}\"}}\n"
            ),
        )
        .unwrap();
        let out = dir.join("out");
        let o = batch_jobs(&w, &jobs, &["vm"], &out, &["--parallel", "1"]);
        assert_eq!(o.status.code(), Some(0), "{}", show(&o));
        let rs = results(&out);
        assert_eq!(ids(&rs), ["default@vm", "docker@vm", "oci@vm"]);
        for r in &rs {
            assert_eq!(r["exit_code"], 0, "{r}");
            let seen = std::fs::read_to_string(r["stdout"].as_str().unwrap()).unwrap();
            let image = &r["receipt"]["components"]["container_image"];
            match r["id"].as_str().unwrap() {
                "default" => {
                    assert_eq!(seen, "no hello\n/usr/bin/python3\n", "{r}");
                    assert!(image.is_null(), "{r}");
                }
                id => {
                    assert_eq!(seen, "Hello, world!\nno python3\n", "{r}");
                    let want = if id == "oci" {
                        "a.oci.tar"
                    } else {
                        "b.docker.tar"
                    };
                    assert!(image.as_str().is_some_and(|s| s.ends_with(want)), "{r}");
                }
            }
        }
    }

    /// The same on tier 3: the VMs of the jobs in flight are shut down
    /// with them, no QEMU, virtiofsd or instance of theirs is left.
    #[test]
    fn a_killed_batch_resumes_with_exactly_one_result_per_job() {
        a_killed_batch_resumes("vm", "cow", 3, "1");
    }
}
