//! Runs the rounds of `hull compare`: every tier's run is one `hull run`
//! of this executable through the batch runner (`batch::runner`, one at a
//! time: the timings must not compete), with its result document, stdout
//! and stderr in a private work directory removed at the end; the direct
//! run is [`super::direct`].

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::{Report, Sample, TierReport, DIRECT};
use crate::batch::jobs::{Command, Job, Workspace};
use crate::batch::runner;

#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    #[error("hull compare: --tier {0}: no such tier (auto, landlock, bwrap, vm, ...)")]
    UnknownTier(String),
    #[error("hull compare: no command to run (hull compare --tier T -- CMD)")]
    NoCommand,
    #[error("hull compare: -n must be at least 1")]
    NoRuns,
    #[error("hull compare: cannot create the work directory {path}: {source}")]
    WorkDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("hull compare: the work directory {work} would be inside the project {project}, which the runs may write; set TMPDIR to a directory outside it")]
    InsideProject { work: PathBuf, project: PathBuf },
    #[error("hull compare: {0}")]
    Results(#[from] crate::batch::results::ResultsError),
    #[error("hull compare: {0}")]
    Runner(#[from] runner::RunnerError),
    #[error(transparent)]
    Out(#[from] crate::out_dir::OutDirError),
    #[error("hull compare: interrupted")]
    Interrupted,
}

/// What to compare.
#[derive(Debug, Clone)]
pub struct Options {
    /// Tier names as asked, in order.
    pub tiers: Vec<String>,
    pub runs: usize,
    pub warmup: usize,
    pub policy: String,
    pub project: PathBuf,
    pub timeout: Option<Duration>,
    /// Each tier's run in a pristine copy-on-write view of the project
    /// (`hull run --cow`); the direct run writes into the project.
    pub cow: bool,
    pub argv: Vec<String>,
}

/// Where the comparison stands: runs done, runs in all, the one starting.
pub type OnProgress<'a> = dyn FnMut(usize, usize, &str) + 'a;

/// Runs the comparison; `irq` set (a signal) stops it after the run in
/// progress.
pub fn compare(
    opts: &Options,
    irq: &Arc<AtomicI32>,
    progress: &mut OnProgress<'_>,
) -> Result<Report, CompareError> {
    if opts.argv.is_empty() {
        return Err(CompareError::NoCommand);
    }
    if opts.runs == 0 {
        return Err(CompareError::NoRuns);
    }
    let mut rows: Vec<TierReport> = Vec::new();
    let mut names = vec![DIRECT.to_string()];
    for t in &opts.tiers {
        let tier =
            crate::tier::Tier::from_arg(t).ok_or_else(|| CompareError::UnknownTier(t.clone()))?;
        let name = tier.name().to_string();
        if names.contains(&name) || rows.iter().any(|r| r.tier == name) {
            continue;
        }
        let probe = crate::tier::ready(tier);
        if probe.available {
            names.push(name);
        } else {
            rows.push(TierReport::unavailable(&name, probe.reason));
        }
    }
    let work = WorkDir::create(&opts.project)?;
    let out = Arc::new(crate::out_dir::OutDir::open_or_make(&work.0)?);
    let (mut log, _) = crate::batch::ResultsLog::open(&out)?;
    let ropts = runner::RunnerOptions {
        tiers: names[1..].to_vec(),
        parallel: 1,
        out: Arc::clone(&out),
        project: opts.project.clone(),
        policy: opts.policy.clone(),
        timeout: opts.timeout,
        hull: std::env::current_exe().map_err(|source| CompareError::WorkDir {
            path: "/proc/self/exe".into(),
            source,
        })?,
        from: None,
        receipts: names[1..]
            .iter()
            .map(|t| (t.clone(), runner::receipt(t, &opts.policy)))
            .collect(),
    };
    let jobs_dir = work.0.join("jobs");
    std::fs::create_dir_all(&jobs_dir).map_err(|source| CompareError::WorkDir {
        path: jobs_dir.clone(),
        source,
    })?;
    let rounds = opts.warmup + opts.runs;
    let total = rounds * names.len();
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); names.len()];
    let mut done = 0;
    for round in 0..rounds {
        let id = if round < opts.warmup {
            format!("warmup-{}", round + 1)
        } else {
            format!("run-{}", round - opts.warmup + 1)
        };
        for name in super::round_order(&names, round) {
            if irq.load(Ordering::SeqCst) != 0 {
                return Err(CompareError::Interrupted);
            }
            progress(done, total, &format!("{id} on {name}"));
            let sample = if name == DIRECT {
                let base = jobs_dir.join(format!("{id}.{DIRECT}"));
                super::direct::run(
                    &opts.argv,
                    &opts.project,
                    &with_ext(&base, ".stdout"),
                    &with_ext(&base, ".stderr"),
                    opts.timeout,
                )
            } else {
                let job = job(&id, opts);
                let lines = runner::run(
                    vec![(&job, name.clone())],
                    &ropts,
                    &mut log,
                    irq,
                    &mut |_, _| {},
                )?;
                match lines.into_iter().next() {
                    Some(line) => sample_of(&line),
                    None => return Err(CompareError::Interrupted),
                }
            };
            done += 1;
            if round >= opts.warmup {
                if let Some(i) = names.iter().position(|n| *n == name) {
                    samples[i].push(sample);
                }
            }
        }
    }
    progress(done, total, "done");
    let mut measured: Vec<TierReport> = names
        .iter()
        .zip(samples)
        .map(|(name, s)| {
            let receipt = ropts
                .receipts
                .get(name)
                .and_then(|r| serde_json::to_value(r).ok());
            TierReport::measured(name, s, receipt)
        })
        .collect();
    // The rows in the order asked, the direct run first.
    let mut ordered = vec![measured.remove(0)];
    for t in &opts.tiers {
        let name = crate::tier::Tier::from_arg(t).map_or(t.as_str(), |t| t.name());
        if ordered.iter().any(|r| r.tier == name) {
            continue;
        }
        if let Some(i) = measured.iter().position(|r| r.tier == name) {
            ordered.push(measured.remove(i));
        } else if let Some(i) = rows.iter().position(|r| r.tier == name) {
            ordered.push(rows.remove(i));
        }
    }
    Ok(super::summarize(
        opts.argv.clone(),
        opts.policy.clone(),
        opts.runs,
        opts.warmup,
        ordered,
    ))
}

/// The job of one round on one tier.
fn job(id: &str, opts: &Options) -> Job {
    Job {
        index: 0,
        line: 0,
        id: id.to_string(),
        command: Command::Argv(opts.argv.clone()),
        project: None,
        workspace: if opts.cow {
            Workspace::Cow
        } else {
            Workspace::Shared
        },
        env: Default::default(),
        timeout: None,
        policy: None,
        stdin: None,
        image: None,
    }
}

/// One tier's run as a sample.
fn sample_of(line: &crate::batch::ResultLine) -> Sample {
    let status = serde_json::to_value(line.status)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    Sample {
        wall_s: line.wall_s,
        status,
        exit_code: line.exit_code,
        peak_memory_bytes: line.usage.peak_rss_bytes.or(line.usage.peak_memory_bytes),
        stdout_sha256: digest(&line.stdout),
        error: line.error.clone(),
    }
}

/// `base` with `ext` appended to its name.
fn with_ext(base: &Path, ext: &str) -> PathBuf {
    let mut p = base.as_os_str().to_owned();
    p.push(ext);
    PathBuf::from(p)
}

/// sha256 of the file `path` (read in pieces), or None when unreadable.
pub fn digest(path: &Path) -> Option<String> {
    let f = std::fs::File::open(path).ok()?;
    crate::changes::file_digest(&f)
        .ok()
        .map(|(sha256, _, _)| sha256)
}

/// The comparison's private work directory (0700, in TMPDIR), removed
/// when dropped.
struct WorkDir(PathBuf);

impl WorkDir {
    fn create(project: &Path) -> Result<WorkDir, CompareError> {
        use std::os::unix::fs::DirBuilderExt;
        let path = std::env::temp_dir().join(format!("hull-compare-{}", uuid::Uuid::new_v4()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(|source| CompareError::WorkDir {
                path: path.clone(),
                source,
            })?;
        let dir = WorkDir(path);
        let real = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        if real(&dir.0).starts_with(real(project)) {
            return Err(CompareError::InsideProject {
                work: dir.0.clone(),
                project: project.to_path_buf(),
            });
        }
        Ok(dir)
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
