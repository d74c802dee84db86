//! `hull batch`: many jobs, each in a fresh tier-3 VM restored from the
//! image's snapshot, with a warm pool so a job never waits for a restore.
//!
//! Each of the pool's workers is a thread that owns one VM at a time (the
//! VM's helpers die with the thread that started them): it makes a fresh
//! instance (tmp and spill), restores a VM with that instance's shares,
//! waits for the agent's hello, and only then takes the next job. The job
//! configures the pristine container (mounts, shares, limits), runs
//! `sh -c LINE` in the project as the unprivileged uid, and the VM is shut
//! down; the worker then restores the next one. No VM, container, tmp or
//! overlay serves two jobs.
//!
//! Protects against: state crossing jobs (one VM, one container, one
//! instance per job), a job's output filling the disk (each stream is cut
//! at `max_output` bytes, and the cut is reported), and a pool larger than
//! the memory the host has (the size is bounded by the available memory
//! over what one restored VM takes). Does not: order the output of
//! concurrent jobs (each job has its own files), or retry a job.

use std::collections::VecDeque;
use std::fs;
use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::agent::ExecOptions;
use crate::exec::{CommandSpec, ExitStatus, OutputSink};
use crate::image::GuestImage;
use crate::machine::Tools;
use crate::policy::lower::vm as lower_vm;
use crate::session::{StartOptions, VmSession};

/// One line of the jobs file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// 1-based line number in the jobs file.
    pub line: usize,
    pub command: String,
}

/// Lines of a jobs file: one shell command per line; blank lines and lines
/// starting with `#` are skipped.
pub fn parse_jobs(text: &str) -> Vec<Job> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| {
            let t = l.trim();
            !t.is_empty() && !t.starts_with('#')
        })
        .map(|(i, l)| Job {
            line: i + 1,
            command: l.trim().to_owned(),
        })
        .collect()
}

#[derive(Debug, Clone)]
pub struct BatchOptions {
    pub pool: usize,
    pub policy: String,
    pub project: PathBuf,
    pub timeout: Option<Duration>,
    /// Where each job's `job-<line>.stdout` and `.stderr` go.
    pub out: PathBuf,
    /// Per stream and job.
    pub max_output: u64,
}

/// How one job went.
#[derive(Debug, Clone, Serialize)]
pub struct JobReport {
    pub line: usize,
    pub command: String,
    /// `exit N`, `signal N`, `timeout`, `interrupted`, or `error: ...`.
    pub status: String,
    pub exit_code: Option<i32>,
    /// Seconds from taking the job (VM already restored) to its VM's end.
    pub job_s: f64,
    /// Seconds the worker spent restoring the VM before it took the job.
    pub restore_s: f64,
    pub instance: String,
    pub stdout: PathBuf,
    pub stderr: PathBuf,
    /// Bytes cut from stdout and stderr beyond `max_output`.
    pub truncated: u64,
}

impl JobReport {
    pub fn ok(&self) -> bool {
        self.exit_code == Some(0)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    #[error("hull batch: the project: {0}")]
    Project(#[source] crate::prepare::ProjectError),
    #[error("hull batch: the policy: {0}")]
    Policy(#[from] crate::policy::PolicyError),
    #[error("hull batch: cannot start a pool worker: {0}")]
    Worker(#[source] io::Error),
    #[error("hull batch: {0}")]
    Machine(#[from] crate::machine::MachineError),
    #[error("hull batch: {0}")]
    Image(#[from] crate::assemble::AssembleError),
    #[error("hull batch: {0}")]
    Snapshot(#[from] crate::snapshot::SnapshotError),
    #[error("hull batch: {path}: cannot {what}: {source}")]
    Io {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("hull batch: after the jobs: {0}")]
    SetId(#[from] crate::runtime::setid::SweepError),
    #[error(transparent)]
    Out(#[from] crate::batch_out::OutError),
}

/// How many restored VMs fit in memory: what the host has available (80%)
/// over what one VM takes (its snapshot's state plus room for what the job
/// touches).
pub fn pool_bound(mem_available: u64, state_bytes: u64) -> usize {
    let per_vm = state_bytes + (512 << 20);
    ((mem_available / 5 * 4) / per_vm.max(1)).max(1) as usize
}

/// `MemAvailable` from `/proc/meminfo`, in bytes.
pub fn mem_available() -> Option<u64> {
    let text = fs::read_to_string("/proc/meminfo").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|k| k.parse::<u64>().ok())
        .map(|k| k * 1024)
}

/// A file sink that keeps at most `max` bytes per stream.
struct FileSink {
    out: fs::File,
    err: fs::File,
    max: u64,
    written: [u64; 2],
    cut: u64,
}

impl FileSink {
    fn put(&mut self, which: usize, data: &[u8]) -> io::Result<()> {
        let room = self.max.saturating_sub(self.written[which]) as usize;
        let keep = room.min(data.len());
        let f = if which == 0 {
            &mut self.out
        } else {
            &mut self.err
        };
        f.write_all(&data[..keep])?;
        self.written[which] += keep as u64;
        self.cut += (data.len() - keep) as u64;
        Ok(())
    }
}

impl OutputSink for FileSink {
    fn stdout(&mut self, d: &[u8]) -> io::Result<()> {
        self.put(0, d)
    }
    fn stderr(&mut self, d: &[u8]) -> io::Result<()> {
        self.put(1, d)
    }
    fn finish(&mut self) -> io::Result<()> {
        self.out.flush()?;
        self.err.flush()
    }
}

/// What every worker shares.
struct Ctx {
    o: BatchOptions,
    project: PathBuf,
    runs: PathBuf,
    policy_file: crate::policy::PolicyFile,
    tools: Tools,
    image: GuestImage,
    accel: crate::qemu::Accel,
    queue: Mutex<VecDeque<Job>>,
    irq: Arc<AtomicI32>,
    /// The output directory, held open.
    out: crate::batch_out::OutDir,
}

/// Why one job did not run (it is reported; the batch goes on).
#[derive(Debug, thiserror::Error)]
enum JobError {
    #[error("instance: {0}")]
    Instance(#[from] crate::runtime::InstanceError),
    #[error(transparent)]
    Policy(#[from] crate::prepare::PrepareError),
    #[error(transparent)]
    Lower(#[from] lower_vm::VmLowerError),
    #[error("{path}: cannot {what}")]
    Io {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Session(#[from] crate::session::SessionError),
}

/// A restored VM waiting for a job, with its own instance.
struct Warm {
    instance: crate::runtime::Instance,
    session: VmSession,
    env: Vec<(String, String)>,
    /// The project as the container sees it (`[vm] project_at`).
    cwd: PathBuf,
    restore_s: f64,
}

fn warm_up(ctx: &Ctx, worker: usize) -> Result<Warm, JobError> {
    let t0 = Instant::now();
    let instance = crate::runtime::Instance::create(&ctx.runs)?;
    let vars = instance.vars(&ctx.project, &crate::prepare::home_dir());
    let (pol, _) = crate::prepare::resolve_policy(&ctx.policy_file, &vars)?;
    let env = crate::prepare::command_env(&pol, &[], instance.child_env());
    let plan = lower_vm::lower(&pol, &crate::policy::RealFs)?;
    let run_name = format!("vm-{}-{worker}", std::process::id());
    let dir = instance.dir().join(&run_name);
    let log_dir = instance
        .dir()
        .join(crate::runtime::LOGS_DIR)
        .join(&run_name);
    fs::create_dir_all(&dir).map_err(|source| JobError::Io {
        path: dir.clone(),
        what: "create",
        source,
    })?;
    let start = StartOptions {
        plan: &plan,
        tools: &ctx.tools,
        image: &ctx.image,
        accel: ctx.accel,
        vm_name: format!("hull-{}", instance.id()),
        dir: &dir,
        log_dir: &log_dir,
    };
    let mut session = VmSession::start(start, &|| ctx.irq.load(Ordering::SeqCst) != 0)?;
    // The allow list: each job's VM gets a proxy of its own, auditing
    // into its own instance's spill.
    let env = if pol.net.mode == crate::policy::NetMode::Allowlist {
        let label = format!("tier vm (instance {})", instance.id());
        session.start_network(&label, &pol.net, instance.spill())?;
        crate::net::with_proxy_env(&env)
    } else {
        env
    };
    Ok(Warm {
        instance,
        session,
        env,
        cwd: plan.container_path_of(&ctx.project),
        restore_s: t0.elapsed().as_secs_f64(),
    })
}

fn status_text(st: &ExitStatus) -> (String, Option<i32>) {
    match st {
        ExitStatus::Code(c) => (format!("exit {c}"), Some(*c)),
        ExitStatus::Signal(s) => (format!("signal {s}"), None),
        ExitStatus::TimedOut => ("timeout".into(), None),
        ExitStatus::Interrupted(s) => (format!("interrupted (signal {s})"), None),
    }
}

fn run_job(ctx: &Ctx, mut w: Warm, job: &Job) -> JobReport {
    let t0 = Instant::now();
    let (out_name, err_name) = (
        format!("job-{}.stdout", job.line),
        format!("job-{}.stderr", job.line),
    );
    let stdout = ctx.out.path.join(&out_name);
    let stderr = ctx.out.path.join(&err_name);
    let mut report = JobReport {
        line: job.line,
        command: job.command.clone(),
        status: String::new(),
        exit_code: None,
        job_s: 0.0,
        restore_s: w.restore_s,
        instance: w.instance.id().to_string(),
        stdout: stdout.clone(),
        stderr: stderr.clone(),
        truncated: 0,
    };
    let create = |name: &str, path: &PathBuf| {
        ctx.out.create(name).map_err(|source| JobError::Io {
            path: path.clone(),
            what: "create",
            source,
        })
    };
    let result = (|| -> Result<ExitStatus, JobError> {
        w.session.configure(lower_vm::RUN_CONTAINER, &|| {
            ctx.irq.load(Ordering::SeqCst) != 0
        })?;
        let mut sink = FileSink {
            out: create(&out_name, &stdout)?,
            err: create(&err_name, &stderr)?,
            max: ctx.o.max_output,
            written: [0, 0],
            cut: 0,
        };
        let spec = CommandSpec {
            argv: vec!["sh".into(), "-c".into(), job.command.clone().into()],
            cwd: w.cwd.clone(),
            env: w.env.clone(),
            timeout: ctx.o.timeout,
            user: None,
        };
        let opts = ExecOptions {
            interrupt: Some(ctx.irq.clone()),
            ..ExecOptions::default()
        };
        let r = w.session.exec(&spec, &mut sink, opts);
        let _ = sink.finish();
        report.truncated = sink.cut;
        Ok(r?)
    })();
    let Warm {
        instance, session, ..
    } = w;
    session.finish(Duration::from_secs(10), &|| {
        ctx.irq.load(Ordering::SeqCst) != 0
    });
    if let Err(e) = instance.finish() {
        tracing::warn!("hull batch: cleaning up the instance: {e}");
    }
    match result {
        Ok(st) => {
            let (s, c) = status_text(&st);
            report.status = s;
            report.exit_code = c;
        }
        Err(e) => report.status = format!("error: {}", hull_protocol::error_chain(&e)),
    }
    report.job_s = t0.elapsed().as_secs_f64();
    report
}

/// Ends a warm VM no job used.
fn discard(w: Warm) {
    let Warm {
        instance, session, ..
    } = w;
    session.kill();
    if let Err(e) = instance.finish() {
        tracing::warn!("hull batch: cleaning up the instance: {e}");
    }
}

fn worker(ctx: Arc<Ctx>, n: usize, tx: mpsc::Sender<JobReport>) {
    loop {
        if ctx.irq.load(Ordering::SeqCst) != 0
            || ctx.queue.lock().map(|q| q.is_empty()).unwrap_or(true)
        {
            return;
        }
        let warm = warm_up(&ctx, n);
        let Some(job) = ctx.queue.lock().ok().and_then(|mut q| q.pop_front()) else {
            // Nothing left: the warm VM goes unused.
            if let Ok(w) = warm {
                discard(w);
            }
            return;
        };
        let report = match warm {
            Ok(w) => run_job(&ctx, w, &job),
            // A VM that cannot be restored fails its job (never run elsewhere).
            Err(e) => JobReport {
                line: job.line,
                command: job.command.clone(),
                status: format!("error: {}", hull_protocol::error_chain(&e)),
                exit_code: None,
                job_s: 0.0,
                restore_s: 0.0,
                instance: String::new(),
                stdout: PathBuf::new(),
                stderr: PathBuf::new(),
                truncated: 0,
            },
        };
        if tx.send(report).is_err() {
            return;
        }
    }
}

/// Runs `jobs` on `host` with a pool of `o.pool` workers; `on_report` hears each job
/// as it ends. Returns the reports in the order the jobs ended.
pub fn run_batch(
    host: Host,
    jobs: Vec<Job>,
    o: &BatchOptions,
    irq: Arc<AtomicI32>,
    on_report: &mut dyn FnMut(&JobReport),
) -> Result<Vec<JobReport>, BatchError> {
    let started = std::time::SystemTime::now();
    let runs = crate::runtime::runs_root();
    let project = crate::prepare::project_path(&o.project, &runs).map_err(BatchError::Project)?;
    let policy_file = crate::policy::profiles::load(&o.policy)?;
    // The writable roots every job shares (each job's own tmp goes with it).
    let shared_roots: Vec<PathBuf> = {
        let none = runs.join("-");
        let vars = crate::prepare::vars_for(project.clone(), none.clone(), none, runs.clone());
        crate::policy::resolve(&policy_file, &vars)?
            .writable_roots()
            .map(|g| g.path.clone())
            .collect()
    };
    let out = crate::batch_out::OutDir::open(&o.out, &shared_roots)?;
    let total = jobs.len();
    let ctx = Arc::new(Ctx {
        o: o.clone(),
        project,
        runs,
        policy_file,
        tools: host.tools,
        image: host.image,
        accel: host.accel,
        queue: Mutex::new(jobs.into()),
        irq,
        out,
    });
    let (tx, rx) = mpsc::channel();
    let mut handles = Vec::new();
    for n in 0..o.pool.max(1).min(total.max(1)) {
        let (ctx, tx) = (ctx.clone(), tx.clone());
        let h = std::thread::Builder::new()
            .name(format!("pool-{n}"))
            .spawn(move || worker(ctx, n, tx))
            .map_err(BatchError::Worker)?;
        handles.push(h);
    }
    drop(tx);
    let mut reports = Vec::new();
    for r in rx {
        on_report(&r);
        reports.push(r);
    }
    for h in handles {
        let _ = h.join();
    }
    // Second layer behind the guest's seccomp filter: no set-id file of a
    // job's is left for the host (crate::runtime::setid).
    if crate::runtime::setid::needed() {
        let roots = shared_roots.iter().map(PathBuf::as_path);
        let cleared = crate::runtime::setid::sweep_roots(roots, started)?;
        for (path, mode) in cleared {
            eprintln!(
                "hull batch: cleared the set-id bits of {} (mode {mode:o}) a job left",
                path.display()
            );
        }
    }
    Ok(reports)
}

/// What every job of a batch uses from the host, found once: QEMU and
/// virtiofsd, the image, the accelerator, and the image's snapshot (built
/// here when missing, so the workers do not race to build it).
#[derive(Debug)]
pub struct Host {
    tools: Tools,
    image: GuestImage,
    accel: crate::qemu::Accel,
    /// Bytes of the snapshot's saved guest memory (what one idle VM holds).
    pub state_bytes: u64,
}

impl Host {
    /// `recipe`: the userland of the batch's policy, built by then
    /// ([`crate::assemble::ensure_userland`]).
    pub fn prepare(
        recipe: &crate::image::recipe::Recipe,
        progress: &mut dyn FnMut(&str),
    ) -> Result<Host, BatchError> {
        let tools = Tools::find()?;
        let image = crate::assemble::find_image(recipe)?;
        let accel = crate::accel::probe_accel().accel;
        let hold = crate::snapshot::ensure_for(&image, &tools, accel, progress)?;
        Ok(Host {
            state_bytes: hold.snapshot.manifest.state_bytes,
            tools,
            image,
            accel,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_skip_blanks_and_comments_and_keep_line_numbers() {
        let j = parse_jobs("echo a\n\n# note\n  make test  \n");
        assert_eq!(
            j,
            [
                Job {
                    line: 1,
                    command: "echo a".into()
                },
                Job {
                    line: 4,
                    command: "make test".into()
                }
            ]
        );
    }

    #[test]
    fn pool_is_bounded_by_memory() {
        // 24 GiB available, 400 MiB of state: 80% / 912 MiB = 21.
        assert_eq!(pool_bound(24 << 30, 400 << 20), 21);
        // Never zero.
        assert_eq!(pool_bound(100 << 20, 400 << 20), 1);
    }

    #[test]
    fn file_sink_cuts_at_the_bound_and_counts_the_rest() {
        let t = tempfile::tempdir().unwrap();
        let mut s = FileSink {
            out: fs::File::create(t.path().join("o")).unwrap(),
            err: fs::File::create(t.path().join("e")).unwrap(),
            max: 5,
            written: [0, 0],
            cut: 0,
        };
        s.stdout(b"abc").unwrap();
        s.stdout(b"defg").unwrap();
        s.stderr(b"xy").unwrap();
        s.finish().unwrap();
        assert_eq!(fs::read(t.path().join("o")).unwrap(), b"abcde");
        assert_eq!(fs::read(t.path().join("e")).unwrap(), b"xy");
        assert_eq!(s.cut, 2);
    }
}
