//! Runs a batch's jobs on each tier: every (job, tier) without a result in
//! the log becomes one `hull run` of this executable, `--parallel` at a
//! time, its stdout and stderr in files of the output directory, its end
//! read from its `--json-result` document and appended to the log.
//!
//! One process per job: a job that crashes hull takes no other job with
//! it, and each run keeps the whole boundary and cleanup of `hull run`
//! (its instance, its sandbox, its VM). Each child gets SIGTERM when the
//! batch dies (`PR_SET_PDEATHSIG`), which ends its command's tree and
//! cleans up as an interrupt does; a job the batch did not see end has no
//! line, and `--resume` runs it again.

use std::collections::VecDeque;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use super::jobs::{Job, Workspace};
use super::results::{Receipt, ResultLine, ResultsError, ResultsLog, Status};
use crate::out_dir::{OutDir, OutDirError};

/// What every job of a batch shares.
#[derive(Debug, Clone)]
pub struct RunnerOptions {
    /// Tier names, each job runs on each.
    pub tiers: Vec<String>,
    pub parallel: usize,
    /// The output directory (the log, `jobs/`), opened and checked once.
    pub out: Arc<OutDir>,
    /// A job's project when it names none.
    pub project: PathBuf,
    /// A job's policy when it names none.
    pub policy: String,
    pub timeout: Option<Duration>,
    /// This executable.
    pub hull: PathBuf,
    /// `--from NAME`: every job starts from this template (copy-on-write
    /// over its workspace) instead of a project.
    pub from: Option<String>,
    /// Each tier's receipt ([`receipt`]), taken once for the batch.
    pub receipts: std::collections::BTreeMap<String, Receipt>,
}

/// What isolates a job on `tier` on this host: hull's version, the host
/// kernel, and the tier's own pieces (bwrap's version; QEMU's, virtiofsd's,
/// the accelerator, the guest image's id and its kernel and Incus for
/// `policy` on vm).
pub fn receipt(tier: &str, policy: &str) -> Receipt {
    let mut r = Receipt {
        tier: tier.to_string(),
        hull_version: env!("CARGO_PKG_VERSION").to_string(),
        ..Receipt::default()
    };
    let uname = rustix::system::uname();
    r.components.insert(
        "kernel".into(),
        uname.release().to_string_lossy().into_owned(),
    );
    match crate::tier::Tier::from_name(tier) {
        Some(crate::tier::Tier::Bwrap) => {
            if let Some(bin) = crate::tier::bwrap::binary() {
                r.components
                    .insert("bwrap".into(), crate::tier::bwrap::version(bin));
            }
        }
        Some(crate::tier::Tier::Vm) => {
            if let Some(q) = crate::vm::qemu::find_qemu(crate::vm::qemu::Arch::host()) {
                if let Some(v) = crate::vm::qemu::version(&q) {
                    r.components.insert("qemu".into(), v);
                }
            }
            if let Some(v) = crate::vm::virtiofsd::find_virtiofsd()
                .and_then(|b| crate::vm::virtiofsd::version(&b))
            {
                r.components.insert("virtiofsd".into(), v);
            }
            r.accelerator = Some(crate::vm::accel::probe_accel().accel.to_string());
            let recipe = crate::policy::profiles::load(policy)
                .ok()
                .and_then(|pf| pf.vm_policy().ok())
                .and_then(|vm| crate::vm::assemble::recipe_for(&vm).ok());
            r.image_id = recipe.as_ref().map(|recipe| recipe.id());
            // What the image's build found in the guest: its kernel and
            // Incus (the manifest's facts, read without making anything).
            let manifest = recipe
                .and_then(|recipe| crate::vm::assemble::find_image_with(&recipe, false).ok())
                .and_then(|image| crate::vm::image::BuiltImage::open(&image.dir).ok())
                .map(|built| built.manifest);
            for (fact, component) in [
                ("kernel_version", "guest_kernel"),
                ("incus_version", "incus"),
            ] {
                if let Some(v) = manifest.as_ref().and_then(|m| m.info.get(fact)) {
                    r.components.insert(component.into(), v.clone());
                }
            }
        }
        _ => {}
    }
    r
}

#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    #[error(transparent)]
    Results(#[from] ResultsError),
    #[error(transparent)]
    Dir(#[from] OutDirError),
}

/// Where the batch stands, after each job.
#[derive(Debug, Clone, Copy, Default)]
pub struct Progress {
    pub done: usize,
    pub failed: usize,
    pub running: usize,
    pub total: usize,
}

/// The (job, tier) pairs still to run: those without a line in `log`.
pub fn pending<'a>(jobs: &'a [Job], tiers: &[String], log: &ResultsLog) -> Vec<(&'a Job, String)> {
    let mut out = Vec::new();
    for j in jobs {
        for t in tiers {
            if !log.has(&j.id, t) {
                out.push((j, t.clone()));
            }
        }
    }
    out
}

/// Runs every pending (job, tier), appending each result to `log` as it
/// ends; stops handing out work once `irq` is set. Returns this run's
/// results (an interrupted job has none: it runs again on `--resume`).
pub fn run(
    work: Vec<(&Job, String)>,
    opts: &RunnerOptions,
    log: &mut ResultsLog,
    irq: &Arc<AtomicI32>,
    on_result: &mut dyn FnMut(&ResultLine, Progress),
) -> Result<Vec<ResultLine>, RunnerError> {
    let jobs = opts.out.subdir("jobs")?;
    let total = work.len();
    let queue: Mutex<VecDeque<(Job, String)>> =
        Mutex::new(work.into_iter().map(|(j, t)| (j.clone(), t)).collect());
    let policy_sha = policy_sha256(&opts.policy);
    let started = Instant::now();
    let (tx, rx) = mpsc::channel::<Option<ResultLine>>();
    let running = AtomicI32::new(0);
    let mut out = Vec::new();
    let mut progress = Progress {
        total,
        ..Progress::default()
    };
    std::thread::scope(|s| -> Result<(), RunnerError> {
        for _ in 0..opts.parallel.max(1).min(total.max(1)) {
            let tx = tx.clone();
            let (queue, running, policy_sha, jobs) = (&queue, &running, &policy_sha, &jobs);
            s.spawn(move || loop {
                if irq.load(Ordering::SeqCst) != 0 {
                    return;
                }
                let next = queue.lock().unwrap_or_else(|e| e.into_inner()).pop_front();
                let Some((job, tier)) = next else { return };
                running.fetch_add(1, Ordering::SeqCst);
                let queue_s = started.elapsed().as_secs_f64();
                let r = run_one(&job, &tier, opts, jobs, queue_s, policy_sha);
                running.fetch_sub(1, Ordering::SeqCst);
                let interrupted = r.status == Status::Interrupted;
                if tx.send((!interrupted).then_some(r)).is_err() {
                    return;
                }
            });
        }
        drop(tx);
        for r in rx {
            let Some(r) = r else { continue };
            log.append(&r)?;
            progress.done += 1;
            if !(r.status == Status::Exit && r.exit_code == Some(0)) {
                progress.failed += 1;
            }
            progress.running = running.load(Ordering::SeqCst).max(0) as usize;
            on_result(&r, progress);
            out.push(r);
        }
        Ok(())
    })?;
    Ok(out)
}

/// sha256 of the policy's text: the file's, or the shipped profile's.
pub fn policy_sha256(policy: &str) -> String {
    use sha2::Digest;
    let text =
        crate::policy::profiles::source(policy).unwrap_or_else(|| policy.as_bytes().to_vec());
    crate::text::hex(&sha2::Sha256::digest(&text))
}

fn run_one(
    job: &Job,
    tier: &str,
    opts: &RunnerOptions,
    jobs: &OutDir,
    queue_s: f64,
    policy_sha: &str,
) -> ResultLine {
    let files = JobFiles::of(job, tier);
    let policy = job.policy.clone().unwrap_or_else(|| opts.policy.clone());
    let policy_sha = if job.policy.is_some() {
        policy_sha256(&policy)
    } else {
        policy_sha.to_string()
    };
    let mut line = ResultLine {
        id: job.id.clone(),
        tier: tier.to_string(),
        status: Status::HullError,
        exit_code: None,
        signal: None,
        wall_s: 0.0,
        queue_s,
        usage: Default::default(),
        stdout: jobs.shown(&files.stdout),
        stderr: jobs.shown(&files.stderr),
        changes: None,
        counts: None,
        policy_sha256: policy_sha,
        // A job's own policy may name another guest image.
        receipt: match (&job.policy, &job.image, opts.receipts.get(tier)) {
            (None, None, Some(r)) => r.clone(),
            (_, image, _) => {
                let mut r = receipt(tier, &policy);
                if let Some(image) = image {
                    // The guest image the policy names is not the job's
                    // userland: the container image is.
                    r.image_id = None;
                    r.components.insert("container_image".into(), image.clone());
                }
                r
            }
        },
        error: None,
    };
    let t0 = Instant::now();
    let status = spawn_and_wait(job, tier, opts, &policy, jobs, &files);
    line.wall_s = t0.elapsed().as_secs_f64();
    if let Err(e) = status {
        line.error = Some(e);
        return line;
    }
    read_result(jobs, &files, &mut line);
    line
}

/// The names of one job's files on one tier in `jobs/`.
struct JobFiles {
    stdout: String,
    stderr: String,
    result: String,
}

impl JobFiles {
    fn of(job: &Job, tier: &str) -> JobFiles {
        let base = format!("{}.{tier}", job.id);
        JobFiles {
            stdout: format!("{base}.stdout"),
            stderr: format!("{base}.stderr"),
            result: format!("{base}.result.json"),
        }
    }
}

fn spawn_and_wait(
    job: &Job,
    tier: &str,
    opts: &RunnerOptions,
    policy: &str,
    jobs: &OutDir,
    files: &JobFiles,
) -> Result<std::process::ExitStatus, String> {
    // An earlier attempt's document is not this one's.
    let _ = rustix::fs::unlinkat(
        jobs.fd(),
        files.result.as_str(),
        rustix::fs::AtFlags::empty(),
    );
    let mut cmd = std::process::Command::new(&opts.hull);
    cmd.args(["run", "--tier", tier, "--policy", policy])
        .arg("--json-result")
        // Through the held descriptor: the caller's path is not resolved
        // again by the child.
        .arg(jobs.through_fd(&files.result));
    match &opts.from {
        // The template is the job's workspace, copy-on-write.
        Some(name) => {
            if job.project.is_some() || job.image.is_some() {
                return Err(format!(
                    "the batch starts every job from the template {name}: a job names no \
                     project or image of its own"
                ));
            }
            cmd.args(["--from", name]);
        }
        None => {
            let project = job.project.clone().unwrap_or_else(|| opts.project.clone());
            cmd.arg("--project").arg(&project);
            if job.workspace == Workspace::Cow {
                cmd.arg("--cow");
            }
            if let Some(image) = &job.image {
                cmd.args(["--image", image]);
            }
        }
    }
    if let Some(t) = job.timeout.or(opts.timeout) {
        cmd.args(["--timeout", &format!("{}ms", t.as_millis().max(1))]);
    }
    // The job's environment through a descriptor, never on the command
    // line (any local user reads that).
    let env_fd = match job.env.is_empty() {
        true => None,
        false => Some(
            crate::exec::env_fd::memfd(
                &job.env
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect::<Vec<_>>(),
            )
            .map_err(|e| format!("cannot pass the job's environment: {e}"))?,
        ),
    };
    if let Some(fd) = &env_fd {
        use std::os::fd::AsRawFd;
        let raw = fd.as_raw_fd();
        cmd.arg("--env-fd").arg(raw.to_string());
        // SAFETY: fcntl only, async-signal-safe, on a descriptor number.
        unsafe {
            cmd.pre_exec(move || crate::exec::env_fd::keep_in_child(raw));
        }
    }
    cmd.arg("--").args(job.command.argv());
    let file = |name: &str| {
        jobs.create(name)
            .map_err(|e| format!("cannot create {}: {e}", jobs.shown(name).display()))
    };
    cmd.stdout(file(&files.stdout)?)
        .stderr(file(&files.stderr)?)
        .stdin(if job.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
    // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches no
    // memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", opts.hull.display()))?;
    if let (Some(text), Some(mut stdin)) = (job.stdin.clone(), child.stdin.take()) {
        // A command that does not read its stdin closes the pipe: that is
        // not the job's failure.
        std::thread::spawn(move || {
            let _ = stdin.write_all(text.as_bytes());
        });
    }
    child
        .wait()
        .map_err(|e| format!("cannot wait for hull run: {e}"))
}

/// Fills `line` from the `--json-result` document, or, without one, with
/// the end of hull's stderr as the error.
fn read_result(jobs: &OutDir, files: &JobFiles, line: &mut ResultLine) {
    let ended = jobs
        .read(&files.result, crate::result_file::MAX_DOCUMENT)
        .ok()
        .and_then(|text| crate::result_file::Ended::parse(&text));
    let Some(ended) = ended else {
        line.error = Some(format!(
            "hull run left no result document; its stderr ends: {}",
            tail(jobs, &files.stderr)
        ));
        return;
    };
    let e = super::results::Ending::from(&ended);
    line.status = e.status;
    line.exit_code = e.exit_code;
    line.signal = e.signal;
    line.error = match (e.status, e.error) {
        (Status::HullError, Some(m)) if m.is_empty() => Some(tail(jobs, &files.stderr)),
        (_, error) => error,
    };
    line.usage = ended.usage;
    if let Some(id) = ended.changes {
        let store = crate::changes::Store::open(crate::changes::Store::default_root());
        line.counts = store.get(&id).ok().map(|s| s.meta.counts);
        line.changes = Some(id);
    }
}

/// The last line of hull's stderr (its last 4 KiB), printable.
fn tail(jobs: &OutDir, stderr: &str) -> String {
    let text = jobs.read_tail(stderr, 4096).unwrap_or_default();
    let s = String::from_utf8_lossy(&text);
    crate::text::printable(s.trim_end().lines().last().unwrap_or("(empty)"))
}
