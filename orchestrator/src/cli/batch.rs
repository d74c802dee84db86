//! `hull batch`: argument parsing and output only (see [`crate::vm::pool`]).
use std::path::PathBuf;

use clap::Args;

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct BatchArgs {
    #[command(subcommand)]
    pub cmd: Option<BatchCommand>,
    /// Jobs file (`-` reads stdin): one job per line, a JSON object
    /// (`{"id": "t1", "argv": ["make", "test"], "project": "repos/t1",
    /// "workspace": "cow", "env": {"K": "V"}, "timeout": "10m", "policy":
    /// "build", "stdin": "..."}`; `sh` instead of `argv` runs a shell line)
    /// or a shell command (`sh -c LINE`); blank lines and `#` comments are
    /// skipped. Without --tier, --resume or --shard and without JSON lines,
    /// each job runs in its own fresh tier-3 VM from a warm pool.
    #[arg(required = true)]
    pub jobs: Option<PathBuf>,
    /// Run every job on this tier (repeatable: landlock, bwrap, vm), one
    /// `hull run` per job and tier, each job's result appended to
    /// `DIR/results.jsonl` as it ends.
    #[arg(long = "tier", value_name = "TIER")]
    pub tiers: Vec<String>,
    /// Jobs at once with --tier (default: the number of cores).
    #[arg(long)]
    pub parallel: Option<usize>,
    /// Go on with the batch in --out: jobs with a result there are not run
    /// again, those that were in flight when it stopped are.
    #[arg(long)]
    pub resume: bool,
    /// Run only the jobs whose index (their order among the file's job
    /// lines) modulo N is K.
    #[arg(long, value_name = "K/N")]
    pub shard: Option<crate::batch::Shard>,
    /// A line that is not a job: report it and run the rest (`skip`), or
    /// run nothing (`fail`).
    #[arg(long, value_enum, default_value = "fail")]
    pub on_bad_line: crate::batch::OnBadLine,
    /// Tier 3 (the only tier `hull batch` runs; accepted for symmetry with `hull run`).
    #[arg(long)]
    pub tier3: bool,
    /// Restored VMs kept ready (bounded by the host's available memory).
    #[arg(long, default_value_t = 2)]
    pub pool: usize,
    /// A shipped profile name (default, readonly, build) or a policy file.
    #[arg(long, default_value = "default")]
    pub policy: String,
    /// The project directory (default: the current directory).
    #[arg(long)]
    pub project: Option<PathBuf>,
    /// Start every job from the template NAME (made from a `hull serve`
    /// session): each its own copy-on-write layer over the template's
    /// workspace, on the template's tier, under its policy (landlock,
    /// bwrap; `hull run --from`).
    #[arg(long, value_name = "NAME", conflicts_with_all = ["project", "tier3"])]
    pub from: Option<String>,
    /// Kill a job's process tree after this long (e.g. 90s, 10m).
    #[arg(long, value_parser = parse_timeout)]
    pub timeout: Option<std::time::Duration>,
    /// A new or empty directory for `job-<line>.stdout` and
    /// `job-<line>.stderr`, outside every writable root of the policy
    /// (default: a new one under `~/.local/state/hull/batches`).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Most bytes kept per stream and job; the rest is counted and dropped.
    #[arg(long, value_name = "BYTES", default_value_t = 64 << 20)]
    pub max_output: u64,
    /// One JSON object per job on stdout instead of a line of text.
    #[arg(long)]
    pub json: bool,
}

fn parse_timeout(s: &str) -> Result<std::time::Duration, String> {
    crate::policy::resolve::parse_duration(s)
}

#[derive(Debug, clap::Subcommand)]
pub enum BatchCommand {
    /// Merge the result directories of a batch's shards and check that
    /// every job has exactly one result on each tier.
    Merge(MergeArgs),
}

#[derive(Debug, Args)]
pub struct MergeArgs {
    /// The shards' output directories.
    #[arg(required = true)]
    pub dirs: Vec<PathBuf>,
    /// The jobs file: every job of it must have a result (on each tier
    /// found in the results, or each --tier).
    #[arg(long)]
    pub jobs: Option<PathBuf>,
    #[arg(long = "tier", value_name = "TIER")]
    pub tiers: Vec<String>,
    /// Write the merged `results.jsonl` into this new directory.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// The most bytes of a jobs file.
#[cfg(target_os = "linux")]
const MAX_JOBS_FILE: u64 = 64 << 20;

/// A jobs file's text (`-`: stdin), at most [`MAX_JOBS_FILE`] bytes.
#[cfg(target_os = "linux")]
fn read_jobs(path: &std::path::Path) -> anyhow::Result<String> {
    use anyhow::Context;
    use std::io::Read;
    let mut s = String::new();
    if path.as_os_str() == "-" {
        std::io::stdin()
            .take(MAX_JOBS_FILE + 1)
            .read_to_string(&mut s)
            .context("read the jobs from stdin")?;
    } else {
        std::fs::File::open(path)
            .with_context(|| format!("jobs file {}", path.display()))?
            .take(MAX_JOBS_FILE + 1)
            .read_to_string(&mut s)
            .with_context(|| format!("read {}", path.display()))?;
    }
    anyhow::ensure!(
        s.len() as u64 <= MAX_JOBS_FILE,
        "jobs file {} is larger than {} MiB",
        path.display(),
        MAX_JOBS_FILE >> 20
    );
    Ok(s)
}

#[cfg(target_os = "linux")]
pub fn batch(a: BatchArgs) -> anyhow::Result<i32> {
    use std::sync::atomic::AtomicI32;
    use std::sync::Arc;

    use anyhow::Context;

    use crate::vm::pool;

    if let Some(BatchCommand::Merge(m)) = a.cmd {
        return merge(m);
    }
    let jobs_path = a.jobs.clone().context("a jobs file is needed")?;
    let text = read_jobs(&jobs_path)?;
    let json_lines = text.lines().any(|l| l.trim_start().starts_with('{'));
    if !a.tiers.is_empty() || a.resume || a.shard.is_some() || json_lines {
        return super::batch_jobs::run(a, &jobs_path, &text);
    }
    // `--tier3` changes nothing: every job runs on tier 3.
    let _ = a.tier3;
    let jobs = pool::parse_jobs(&text);
    anyhow::ensure!(!jobs.is_empty(), "{}: no jobs", jobs_path.display());
    let project = match a.project {
        Some(p) => p,
        None => super::default_project()?,
    };
    let recipe =
        crate::vm::assemble::recipe_for(&crate::policy::profiles::load(&a.policy)?.vm_policy()?)?;
    {
        let mut progress = crate::vm::image::progress::BuildProgress::new("hull batch: ");
        crate::vm::assemble::ensure_userland(&recipe, &mut |ev| progress.on(ev))?;
    }
    let host = pool::Host::prepare(&recipe, &mut |step| {
        eprintln!("hull batch: preparing the image's snapshot (once): {step}")
    })?;
    let bound = pool::mem_available()
        .map(|m| pool::pool_bound(m, host.state_bytes))
        .unwrap_or(1);
    let size = if a.pool > bound {
        eprintln!(
            "hull batch: a pool of {} would not fit in the available memory; using {bound}",
            a.pool
        );
        bound
    } else {
        a.pool.max(1)
    };
    let irq = Arc::new(AtomicI32::new(0));
    let watch = watch_signals(&irq)?;
    let opts = pool::BatchOptions {
        pool: size,
        policy: a.policy,
        project,
        timeout: a.timeout,
        out: a.out.unwrap_or_else(crate::vm::batch_out::default_dir),
        max_output: a.max_output,
    };
    let total = jobs.len();
    eprintln!(
        "hull batch: {total} jobs, pool of {size} restored VMs, output in {}",
        opts.out.display()
    );
    let t0 = std::time::Instant::now();
    let json = a.json;
    let reports = pool::run_batch(host, jobs, &opts, irq.clone(), &mut |r| {
        if json {
            println!("{}", serde_json::to_string(r).unwrap_or_default());
        } else {
            let cut = if r.truncated > 0 {
                format!(" ({} bytes of output cut)", r.truncated)
            } else {
                String::new()
            };
            println!(
                "job {} [{}]: {} in {:.2} s{cut}  {}",
                r.line,
                r.command,
                r.status,
                r.job_s,
                r.stdout.display()
            );
        }
    })?;
    watch.close();
    let ok = reports.iter().filter(|r| r.ok()).count();
    let mut times: Vec<f64> = reports.iter().map(|r| r.job_s).collect();
    times.sort_by(|a, b| a.total_cmp(b));
    let p50 = times.get(times.len() / 2).copied().unwrap_or(0.0);
    eprintln!(
        "hull batch: {} of {total} jobs ran, {ok} exited 0; job p50 {p50:.2} s; wall {:.1} s",
        reports.len(),
        t0.elapsed().as_secs_f64()
    );
    let errors = reports.iter().any(|r| r.status.starts_with("error"));
    Ok(if errors || reports.len() < total {
        125
    } else if ok == total {
        0
    } else {
        1
    })
}

/// Sets `irq` to the signal when SIGINT, SIGTERM or SIGHUP arrives (the
/// batch stops handing out jobs and its runs end theirs); close the handle
/// when the batch is over.
#[cfg(target_os = "linux")]
pub(super) fn watch_signals(
    irq: &std::sync::Arc<std::sync::atomic::AtomicI32>,
) -> anyhow::Result<signal_hook::iterator::Handle> {
    use anyhow::Context;
    let flag = irq.clone();
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ])
    .context("install signal handlers")?;
    let handle = signals.handle();
    std::thread::spawn(move || {
        for s in signals.forever() {
            flag.store(s, std::sync::atomic::Ordering::SeqCst);
        }
    });
    Ok(handle)
}

/// `hull batch merge`.
#[cfg(target_os = "linux")]
fn merge(m: MergeArgs) -> anyhow::Result<i32> {
    let merged = crate::batch::results::merge(&m.dirs, None)?;
    let expected: Option<Vec<(String, String)>> = match &m.jobs {
        Some(path) => {
            let text = read_jobs(path)?;
            let base = path.parent().unwrap_or(std::path::Path::new("."));
            let parsed = crate::batch::jobs::parse(
                &text,
                &path.display().to_string(),
                base,
                crate::batch::OnBadLine::Skip,
            )?;
            let mut tiers = m.tiers.clone();
            if tiers.is_empty() {
                tiers = merged.iter().map(|r| r.tier.clone()).collect();
                tiers.sort();
                tiers.dedup();
            }
            Some(
                parsed
                    .jobs
                    .iter()
                    .flat_map(|j| tiers.iter().map(|t| (j.id.clone(), t.clone())))
                    .collect(),
            )
        }
        None => None,
    };
    if let Some(expected) = &expected {
        crate::batch::results::check_present(&merged, expected)?;
    }
    if let Some(out) = &m.out {
        // A new directory of hull's (one that exists is refused: merged
        // results never mix with others).
        let out = crate::out_dir::OutDir::make_new(out)?;
        let (mut log, _) = crate::batch::ResultsLog::open(&out)?;
        for r in &merged {
            log.append(r)?;
        }
    }
    eprintln!(
        "hull batch merge: {} results from {} directories, each job once per tier{}",
        merged.len(),
        m.dirs.len(),
        if expected.is_some() {
            ", every job of the jobs file present"
        } else {
            ""
        }
    );
    Ok(0)
}

#[cfg(not(target_os = "linux"))]
pub fn batch(_a: BatchArgs) -> anyhow::Result<i32> {
    anyhow::bail!("hull batch runs tier-3 VMs, which need a Linux host for now")
}
