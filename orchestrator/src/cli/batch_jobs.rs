//! `hull batch JOBS --tier T...`: the jobs file parsed (bad lines named by
//! number), sharded, run on each tier through [`crate::batch::runner`]
//! with progress, and summed up. Output only; the work is the library's.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicI32;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;

use super::batch::BatchArgs;
use crate::batch::{jobs, runner, ResultLine, ResultsLog, Status};

pub fn run(a: BatchArgs, jobs_path: &Path, text: &str) -> anyhow::Result<i32> {
    let base = match jobs_path.parent() {
        Some(p) if jobs_path.as_os_str() != "-" && !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => std::env::current_dir().context("the current directory")?,
    };
    let parsed = jobs::parse(text, &jobs_path.display().to_string(), &base, a.on_bad_line)?;
    for bad in &parsed.skipped {
        eprintln!("hull batch: {}: skipped {bad}", jobs_path.display());
    }
    let mut all = parsed.jobs;
    if let Some(s) = a.shard {
        all.retain(|j| s.has(j));
    }
    let tiers = if a.tiers.is_empty() {
        vec!["vm".to_string()]
    } else {
        a.tiers.clone()
    };
    // One name per tier in the results (`tier3` is `vm`).
    let tiers: Vec<String> = tiers
        .iter()
        .map(|t| {
            crate::tier::Tier::from_arg(t)
                .map(|t| t.name().to_string())
                .with_context(|| {
                    format!("--tier {t}: no such tier (auto, landlock, bwrap, vm, ...)")
                })
        })
        .collect::<anyhow::Result<_>>()?;
    // A tier that cannot keep a job's writes apart refuses the batch
    // before anything runs, rather than failing each job.
    if let Some(j) = all.iter().find(|j| j.workspace == jobs::Workspace::Cow) {
        for t in &tiers {
            let tier = crate::tier::Tier::from_name(t).context("tier")?;
            if let Some(why) = crate::run::cow_refused(tier) {
                anyhow::bail!(
                    "tier {t} cannot give job {} (line {}) a pristine workspace of its own \
                     (workspace = \"cow\", the default): {why}. Give its jobs \
                     \"workspace\": \"shared\" to let them write into the project. Nothing \
                     was run",
                    j.id,
                    j.line
                );
            }
        }
    }
    let project = match &a.project {
        Some(p) => p.clone(),
        None => super::default_project()?,
    };
    let out = a
        .out
        .clone()
        .unwrap_or_else(crate::vm::batch_out::default_dir);
    check_out(&out, &project, &all)?;
    // Opened once and checked: hull (maybe root) writes only into a
    // directory no other user can plant a link in.
    let out_dir = std::sync::Arc::new(crate::out_dir::OutDir::open_or_make(&out)?);
    let existed = rustix::fs::statat(
        out_dir.fd(),
        crate::batch::results::RESULTS,
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
    .is_ok();
    // Opened (and locked) first: a batch still writing there is named as such.
    let (mut log, earlier) = ResultsLog::open(&out_dir)?;
    if existed && !a.resume {
        anyhow::bail!(
            "{} holds the results of an earlier batch: --resume to go on with it, or choose \
             another --out",
            out.display()
        );
    }
    let work = runner::pending(&all, &tiers, &log);
    let parallel = a.parallel.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    eprintln!(
        "hull batch: {} jobs x {} tiers ({}), {} to run{}, {parallel} at a time; results in {}",
        all.len(),
        tiers.len(),
        tiers.join(", "),
        work.len(),
        if earlier.is_empty() {
            String::new()
        } else {
            format!(" ({} done before)", earlier.len())
        },
        out.join(crate::batch::results::RESULTS).display()
    );
    let opts = runner::RunnerOptions {
        tiers: tiers.clone(),
        parallel,
        out: std::sync::Arc::clone(&out_dir),
        project,
        policy: a.policy.clone(),
        timeout: a.timeout,
        hull: std::env::current_exe().context("hull's own path")?,
        from: a.from.clone(),
        receipts: tiers
            .iter()
            .map(|t| (t.clone(), runner::receipt(t, &a.policy)))
            .collect(),
    };
    let irq = Arc::new(AtomicI32::new(0));
    let handle = super::batch::watch_signals(&irq)?;
    let t0 = Instant::now();
    let total = work.len();
    let bar = std::io::stderr().is_terminal().then(|| {
        let b = indicatif::ProgressBar::new(total as u64);
        b.set_style(
            indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} jobs, {msg}, ETA {eta}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    });
    let mut last_line = Instant::now();
    let json = a.json;
    let results = runner::run(work, &opts, &mut log, &irq, &mut |r, p| {
        if json {
            println!("{}", serde_json::to_string(r).unwrap_or_default());
        }
        let msg = format!("{} failed, {} running", p.failed, p.running);
        match &bar {
            Some(b) => {
                b.set_position(p.done as u64);
                b.set_message(msg);
            }
            None if last_line.elapsed().as_secs() >= 10 || p.done == p.total => {
                eprintln!("hull batch: {}/{} jobs done, {msg}", p.done, p.total);
                last_line = Instant::now();
            }
            None => {}
        }
    })?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    handle.close();
    let interrupted = irq.load(std::sync::atomic::Ordering::SeqCst) != 0;
    let mut every = earlier;
    every.extend(results);
    eprint!("{}", summary(&every, &tiers));
    eprintln!(
        "hull batch: wall {:.1} s{}",
        t0.elapsed().as_secs_f64(),
        if interrupted {
            "; interrupted: --resume runs what is left"
        } else {
            ""
        }
    );
    let expected = all.len() * tiers.len();
    let ok = every
        .iter()
        .filter(|r| r.status == Status::Exit && r.exit_code == Some(0))
        .count();
    let errors = every.iter().any(|r| r.status == Status::HullError);
    Ok(if interrupted || errors || every.len() < expected {
        125
    } else if ok == expected {
        0
    } else {
        1
    })
}

/// The output directory may not lie inside a job's project: the job could
/// forge its own or another's result.
fn check_out(out: &Path, project: &Path, all: &[jobs::Job]) -> anyhow::Result<()> {
    let real = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    // The deepest existing ancestor of `out` says where it will be.
    let mut at = out.to_path_buf();
    let mut rest = Vec::new();
    while !at.exists() {
        match (at.parent(), at.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                at = parent.to_path_buf();
            }
            _ => break,
        }
    }
    let mut out_real = real(&at);
    for n in rest.iter().rev() {
        out_real.push(n);
    }
    let projects = std::iter::once(project.to_path_buf())
        .chain(all.iter().filter_map(|j| j.project.clone()))
        .collect::<Vec<PathBuf>>();
    for p in projects {
        let p = real(&p);
        anyhow::ensure!(
            !out_real.starts_with(&p),
            "--out {} is inside the project {}, which its jobs may write: choose a directory \
             outside it",
            out.display(),
            p.display()
        );
    }
    Ok(())
}

/// Counts by status and the p50 and p95 of job time, per tier; with more
/// than one tier, each tier's p50 against the fastest's, and the jobs
/// whose exit code or stdout differed between tiers.
pub fn summary(results: &[ResultLine], tiers: &[String]) -> String {
    let p50 = |t: &String| {
        let mut v: Vec<f64> = results
            .iter()
            .filter(|r| &r.tier == t)
            .map(|r| r.wall_s)
            .collect();
        v.sort_by(f64::total_cmp);
        (!v.is_empty()).then(|| v[(v.len() - 1) / 2])
    };
    let fastest = tiers.iter().filter_map(p50).fold(f64::INFINITY, f64::min);
    let several = tiers.len() > 1;
    let mut o =
        String::from("tier        jobs  exit 0  failed  timeout  signal  error   p50 s   p95 s");
    o.push_str(if several { "  x fastest\n" } else { "\n" });
    for t in tiers {
        let mine: Vec<&ResultLine> = results.iter().filter(|r| &r.tier == t).collect();
        let count = |f: &dyn Fn(&ResultLine) -> bool| mine.iter().filter(|r| f(r)).count();
        let mut times: Vec<f64> = mine.iter().map(|r| r.wall_s).collect();
        times.sort_by(|a, b| a.total_cmp(b));
        let pct = |q: f64| {
            if times.is_empty() {
                0.0
            } else {
                times[((times.len() - 1) as f64 * q).round() as usize]
            }
        };
        o.push_str(&format!(
            "{t:<10} {:>5} {:>7} {:>7} {:>8} {:>7} {:>6} {:>7.2} {:>7.2}\n",
            mine.len(),
            count(&|r| r.status == Status::Exit && r.exit_code == Some(0)),
            count(&|r| r.status == Status::Exit && r.exit_code != Some(0)),
            count(&|r| r.status == Status::Timeout),
            count(&|r| r.status == Status::Signal),
            count(&|r| r.status == Status::HullError),
            pct(0.5),
            pct(0.95),
        ));
        if several {
            o.pop();
            match p50(t) {
                Some(m) if fastest > 0.0 => o.push_str(&format!(" {:>9.2}x\n", m / fastest)),
                _ => o.push_str("         -\n"),
            }
        }
    }
    if several {
        let digest = |r: &ResultLine| crate::compare::run::digest(&r.stdout);
        o.push_str(&crate::compare::batch::across(results, tiers, &digest).render(&tiers[0]));
    }
    o
}
