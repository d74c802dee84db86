//! `hull compare --tier T... [-n RUNS] [--warmup K] [--json] [--html FILE]
//! -- CMD`: argument parsing and output only (see [`crate::compare`]).

use std::path::PathBuf;

use clap::Args;

#[derive(Debug, Args)]
pub struct CompareArgs {
    /// A tier to run the command on (repeatable): landlock, bwrap, vm, ...
    /// A tier this host cannot run is listed with the reason.
    #[arg(long = "tier", value_name = "TIER", required = true)]
    pub tiers: Vec<String>,
    /// Measured runs on each tier.
    #[arg(short = 'n', long = "runs", value_name = "RUNS", default_value_t = 5)]
    pub runs: usize,
    /// Runs on each tier before the measured ones, not counted.
    #[arg(long, value_name = "K", default_value_t = 1)]
    pub warmup: usize,
    /// Print one JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Also write one self-contained HTML page: a chart of the times, the
    /// table, `hull canary`'s matrix for the same tiers, the receipts.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// With `--html`: only this probe in the page's canary matrix
    /// (repeatable; `hull canary --list` names them). Default: every probe,
    /// each a run on every tier (minutes on tier 3).
    #[arg(long = "canary-probe", value_name = "ID", requires = "html")]
    pub canary_probes: Vec<String>,
    /// A shipped profile name (default, readonly, build) or a policy file.
    #[arg(long, default_value = "default")]
    pub policy: String,
    /// The project directory (default: the current directory).
    #[arg(long)]
    pub project: Option<PathBuf>,
    /// Each tier's run sees a pristine copy-on-write view of the project
    /// (its writes kept as a change set); without it they write into it.
    #[arg(long)]
    pub cow: bool,
    /// Wall-time limit of each run (`30s`, `10m`).
    #[arg(long, value_parser = parse_timeout)]
    pub timeout: Option<std::time::Duration>,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

fn parse_timeout(s: &str) -> Result<std::time::Duration, String> {
    crate::policy::resolve::parse_duration(s)
}

#[cfg(target_os = "linux")]
pub fn compare(a: CompareArgs, quiet: bool) -> anyhow::Result<i32> {
    use std::io::IsTerminal;
    use std::sync::atomic::AtomicI32;
    use std::sync::Arc;

    use anyhow::Context;

    let project = match &a.project {
        Some(p) => p.clone(),
        None => std::env::current_dir().context("the current directory")?,
    };
    // Before any run: a probe that does not exist would fail the page last.
    crate::canary::check_probe_ids(&a.canary_probes)?;
    let project = std::fs::canonicalize(&project)
        .with_context(|| format!("hull compare: the project {}", project.display()))?;
    let opts = crate::compare::run::Options {
        tiers: a.tiers.clone(),
        runs: a.runs,
        warmup: a.warmup,
        policy: a.policy.clone(),
        project,
        timeout: a.timeout,
        cow: a.cow,
        argv: a.command.clone(),
    };
    let irq = Arc::new(AtomicI32::new(0));
    let handle = super::batch::watch_signals(&irq)?;
    let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
        let b = indicatif::ProgressBar::new(0);
        b.set_style(
            indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} runs, {msg}, ETA {eta}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    });
    let mut last_line = std::time::Instant::now();
    let report = crate::compare::run::compare(&opts, &irq, &mut |done, total, what| match &bar {
        Some(b) => {
            b.set_length(total as u64);
            b.set_position(done as u64);
            b.set_message(what.to_string());
        }
        None if !quiet && (last_line.elapsed().as_secs() >= 10 || done == total) => {
            eprintln!("hull compare: {done}/{total} runs, {what}");
            last_line = std::time::Instant::now();
        }
        None => {}
    });
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    handle.close();
    let report = match report {
        Ok(r) => r,
        Err(crate::compare::run::CompareError::Interrupted) => {
            eprintln!("hull compare: interrupted");
            return Ok(130);
        }
        Err(e) => return Err(e.into()),
    };
    if let Some(file) = &a.html {
        let matrix = canary_matrix(&report, &a.canary_probes, quiet)?;
        let page = crate::compare::render::html(&report, matrix.as_deref(), crate::canary::STYLE);
        crate::out_dir::write_file(file, page.as_bytes())
            .with_context(|| format!("hull compare: cannot write {}", file.display()))?;
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", crate::compare::render::text(&report));
    }
    // A run hull could not make is hull's failure; a command that failed
    // on every tier alike is the command's.
    let hull_failed = report
        .tiers
        .iter()
        .flat_map(|t| &t.samples)
        .any(|s| s.status == "hull_error");
    Ok(if hull_failed {
        crate::EXIT_HULL_FAILED
    } else {
        0
    })
}

/// `hull canary`'s matrix for the tiers that ran, as HTML.
#[cfg(target_os = "linux")]
fn canary_matrix(
    report: &crate::compare::Report,
    probes: &[String],
    quiet: bool,
) -> anyhow::Result<Option<String>> {
    let tiers: Vec<crate::tier::Tier> = report
        .tiers
        .iter()
        .filter(|t| t.available)
        .filter_map(|t| crate::tier::Tier::from_name(&t.tier))
        .filter(|t| *t != crate::tier::Tier::None)
        .collect();
    if tiers.is_empty() {
        return Ok(None);
    }
    if !quiet {
        eprintln!("hull compare: running hull canary on the same tiers for the page");
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let cells = crate::canary::run(&tiers, probes, &stop, |_, _, _, _| {})?;
    Ok(Some(crate::canary::matrix_html(&cells)))
}

#[cfg(not(target_os = "linux"))]
pub fn compare(_a: CompareArgs, _quiet: bool) -> anyhow::Result<i32> {
    anyhow::bail!("hull compare runs on Linux for now (its runs go through hull batch's runner)")
}
