//! `hull batch`: argument parsing and output only (see [`crate::vm::pool`]).
use std::path::PathBuf;

use clap::Args;

#[derive(Debug, Args)]
pub struct BatchArgs {
    /// Jobs file: one shell command per line (`-` reads stdin); blank lines
    /// and `#` comments are skipped. Each job runs as `sh -c LINE` in the
    /// project, in its own fresh tier-3 VM and container.
    pub jobs: PathBuf,
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

#[cfg(target_os = "linux")]
pub fn batch(a: BatchArgs) -> anyhow::Result<i32> {
    use std::io::Read;
    use std::sync::atomic::AtomicI32;
    use std::sync::Arc;

    use anyhow::Context;

    use crate::vm::pool;

    // `--tier3` changes nothing: every job runs on tier 3.
    let _ = a.tier3;
    let text = if a.jobs.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin()
            .take(16 << 20)
            .read_to_string(&mut s)
            .context("read the jobs from stdin")?;
        s
    } else {
        let meta = std::fs::metadata(&a.jobs)
            .with_context(|| format!("jobs file {}", a.jobs.display()))?;
        anyhow::ensure!(
            meta.len() <= 16 << 20,
            "jobs file {} is larger than 16 MiB",
            a.jobs.display()
        );
        std::fs::read_to_string(&a.jobs).with_context(|| format!("read {}", a.jobs.display()))?
    };
    let jobs = pool::parse_jobs(&text);
    anyhow::ensure!(!jobs.is_empty(), "{}: no jobs", a.jobs.display());
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
    let watch = {
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
        handle
    };
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

#[cfg(not(target_os = "linux"))]
pub fn batch(_a: BatchArgs) -> anyhow::Result<i32> {
    anyhow::bail!("hull batch runs tier-3 VMs, which need a Linux host for now")
}
