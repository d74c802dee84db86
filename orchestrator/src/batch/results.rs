//! `DIR/results.jsonl`: one line per job and tier, appended and synced to
//! disk when the job ends, so that a batch killed at any moment loses at
//! most the jobs in flight and `--resume` knows exactly which ran.
//!
//! Guards against: a line torn by a crash mid-write (a last line without
//! its newline is cut off when the log is opened again, and the job runs
//! again), a line counted twice (the log refuses a second line for one id
//! and tier), and unbounded reads (lines and file size capped).

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;

use crate::out_dir::OutDir;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The log's file name in the output directory.
pub const RESULTS: &str = "results.jsonl";
/// Longest result line read back.
const MAX_LINE: usize = 1 << 20;
/// Largest results file read back (a line is well under 4 KiB: a million
/// results).
const MAX_FILE: u64 = 256 << 20;

/// How a job ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// The command exited (see `exit_code`).
    Exit,
    /// The command was killed by a signal.
    Signal,
    /// It ran past its timeout and its tree was killed.
    Timeout,
    /// hull failed to run it (see `error`); the command's result is unknown.
    HullError,
    /// The batch was interrupted while it ran.
    Interrupted,
}

/// How a `hull run` ended, from its `--json-result` document: a batch
/// result's and a session exec's status, exit code, signal and error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ending {
    pub status: Status,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub error: Option<String>,
}

impl From<&crate::result_file::Ended> for Ending {
    fn from(ended: &crate::result_file::Ended) -> Ending {
        use crate::result_file::Outcome;
        let (status, exit_code, signal, error) = match &ended.outcome {
            Outcome::Exited { code } => (Status::Exit, Some(*code), None, None),
            // 127 or 126, as `hull run` exits: nothing could run.
            Outcome::NotRunnable { message } => (
                Status::Exit,
                Some(ended.exit_code),
                None,
                Some(message.clone()),
            ),
            Outcome::Signaled { signal } => (Status::Signal, None, Some(*signal), None),
            Outcome::TimedOut => (Status::Timeout, None, None, None),
            Outcome::Interrupted { signal } => (Status::Interrupted, None, Some(*signal), None),
            Outcome::HullError { message } => {
                (Status::HullError, None, None, Some(message.clone()))
            }
        };
        Ending {
            status,
            exit_code,
            signal,
            error,
        }
    }
}

/// What isolated a job: enough to tell two runs' boundaries apart.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    pub tier: String,
    pub hull_version: String,
    /// `kvm`, `tcg` (tier 3), or absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accelerator: Option<String>,
    /// Versions of what enforced it (`bwrap`, `qemu`, `virtiofsd`, ...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub components: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_kernel: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_id: Option<String>,
}

/// One job's result on one tier.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResultLine {
    pub id: String,
    pub tier: String,
    pub status: Status,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Seconds the job ran, from its start to its end.
    pub wall_s: f64,
    /// Seconds it waited for a worker after the batch started.
    pub queue_s: f64,
    /// What the job's `hull run` told it took.
    #[serde(flatten)]
    pub usage: crate::result_file::Usage,
    pub stdout: PathBuf,
    pub stderr: PathBuf,
    /// `workspace = "cow"`: the change set the job's writes were kept as.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changes: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counts: Option<crate::changes::Counts>,
    /// sha256 of the policy file's text (or the profile's name).
    pub policy_sha256: String,
    pub receipt: Receipt,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ResultsError {
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}: line {line}: not a result line: {why}")]
    Bad {
        path: PathBuf,
        line: usize,
        why: String,
    },
    #[error("{path}: larger than {MAX_FILE} bytes")]
    TooLarge { path: PathBuf },
    #[error("job {id} on tier {tier} has two results: {first} and {second}")]
    Twice {
        id: String,
        tier: String,
        first: String,
        second: String,
    },
    #[error(
        "another hull batch is writing its results to {path}: one batch at a time \
         per --out directory"
    )]
    Busy { path: PathBuf },
    #[error(transparent)]
    Read(crate::out_dir::ReadError),
    #[error("job {id} has no result on tier {tier} in any of the directories")]
    Missing { id: String, tier: String },
}

/// The results log of one batch directory, open for appending.
#[derive(Debug)]
pub struct ResultsLog {
    path: PathBuf,
    file: File,
    done: BTreeSet<(String, String)>,
}

impl ResultsLog {
    /// Opens (or creates) `results.jsonl` in `dir`: a torn last line is
    /// cut off, the lines before it read back as the jobs already done.
    pub fn open(dir: &OutDir) -> Result<(ResultsLog, Vec<ResultLine>), ResultsError> {
        let path = dir.shown(RESULTS);
        let io_err = |what: &'static str| {
            let path = path.clone();
            move |source| ResultsError::Io { what, path, source }
        };
        let mut file = dir.open_append(RESULTS).map_err(io_err("cannot open"))?;
        // Held while this batch appends (the kernel drops it when the batch
        // dies, killed or not): two batches on one log would run the same
        // jobs and write two lines for each.
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => return Err(ResultsError::Busy { path }),
            Err(e) => return Err(io_err("cannot lock")(e.into())),
        }
        let mut bytes = Vec::new();
        file.seek(SeekFrom::Start(0))
            .and_then(|_| (&mut file).take(MAX_FILE + 1).read_to_end(&mut bytes))
            .map_err(io_err("cannot read"))?;
        if bytes.len() as u64 > MAX_FILE {
            return Err(ResultsError::TooLarge { path });
        }
        let whole = whole_lines(&bytes);
        if whole < bytes.len() {
            // The crash tore the last line: that job runs again.
            file.set_len(whole as u64)
                .map_err(io_err("cannot cut the torn line of"))?;
            file.sync_all().map_err(io_err("cannot sync"))?;
        }
        let lines = parse_lines(&path, &bytes[..whole])?;
        let mut done = BTreeSet::new();
        for l in &lines {
            done.insert((l.id.clone(), l.tier.clone()));
        }
        Ok((ResultsLog { path, file, done }, lines))
    }

    /// Whether `id` already has a result on `tier`.
    pub fn has(&self, id: &str, tier: &str) -> bool {
        self.done.contains(&(id.to_string(), tier.to_string()))
    }

    /// Appends one line and syncs it to disk before returning.
    pub fn append(&mut self, r: &ResultLine) -> Result<(), ResultsError> {
        if !self.done.insert((r.id.clone(), r.tier.clone())) {
            return Err(ResultsError::Twice {
                id: r.id.clone(),
                tier: r.tier.clone(),
                first: self.path.display().to_string(),
                second: "this batch".into(),
            });
        }
        let mut line = serde_json::to_vec(r).map_err(|e| ResultsError::Io {
            what: "cannot encode a result for",
            path: self.path.clone(),
            source: io::Error::other(e),
        })?;
        line.push(b'\n');
        // One write of the whole line (O_APPEND): a crash leaves it whole
        // or torn at the end, never interleaved.
        self.file
            .write_all(&line)
            .and_then(|_| self.file.sync_data())
            .map_err(|source| ResultsError::Io {
                what: "cannot append to",
                path: self.path.clone(),
                source,
            })
    }
}

/// How many bytes of `bytes` are whole lines (up to the last newline).
fn whole_lines(bytes: &[u8]) -> usize {
    bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1)
}

fn parse_lines(path: &Path, bytes: &[u8]) -> Result<Vec<ResultLine>, ResultsError> {
    let mut out = Vec::new();
    for (i, l) in bytes.split(|b| *b == b'\n').enumerate() {
        if l.is_empty() {
            continue;
        }
        let bad = |why: String| ResultsError::Bad {
            path: path.to_path_buf(),
            line: i + 1,
            why,
        };
        if l.len() > MAX_LINE {
            return Err(bad(format!("longer than {MAX_LINE} bytes")));
        }
        out.push(serde_json::from_slice(l).map_err(|e| bad(e.to_string()))?);
    }
    Ok(out)
}

/// Reads the results of each shard's directory: every (id, tier) once
/// across them all (a second is an error naming both directories), and,
/// when `expected` is given, every expected (id, tier) present.
pub fn merge(
    dirs: &[PathBuf],
    expected: Option<&[(String, String)]>,
) -> Result<Vec<ResultLine>, ResultsError> {
    let mut seen: BTreeMap<(String, String), PathBuf> = BTreeMap::new();
    let mut out = Vec::new();
    for d in dirs {
        let path = d.join(RESULTS);
        let bytes = crate::out_dir::read_named(&path, MAX_FILE).map_err(|e| match e {
            crate::out_dir::ReadError::TooLarge { path, .. } => ResultsError::TooLarge { path },
            e => ResultsError::Read(e),
        })?;
        // A torn last line is not a result: its job did not finish.
        let whole = whole_lines(&bytes);
        for l in parse_lines(&path, &bytes[..whole])? {
            let key = (l.id.clone(), l.tier.clone());
            if let Some(first) = seen.insert(key, d.clone()) {
                return Err(ResultsError::Twice {
                    id: l.id,
                    tier: l.tier,
                    first: first.display().to_string(),
                    second: d.display().to_string(),
                });
            }
            out.push(l);
        }
    }
    if let Some(expected) = expected {
        check_present(&out, expected)?;
    }
    Ok(out)
}

/// Every (id, tier) of `expected` has a line in `lines`, or the first
/// that has none is named.
pub fn check_present(
    lines: &[ResultLine],
    expected: &[(String, String)],
) -> Result<(), ResultsError> {
    let have: BTreeSet<(&str, &str)> = lines
        .iter()
        .map(|l| (l.id.as_str(), l.tier.as_str()))
        .collect();
    match expected
        .iter()
        .find(|(id, tier)| !have.contains(&(id.as_str(), tier.as_str())))
    {
        Some((id, tier)) => Err(ResultsError::Missing {
            id: id.clone(),
            tier: tier.clone(),
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(id: &str, tier: &str) -> ResultLine {
        ResultLine {
            id: id.into(),
            tier: tier.into(),
            status: Status::Exit,
            exit_code: Some(0),
            signal: None,
            wall_s: 0.5,
            queue_s: 0.0,
            usage: Default::default(),
            stdout: "jobs/x.stdout".into(),
            stderr: "jobs/x.stderr".into(),
            changes: None,
            counts: None,
            policy_sha256: "00".into(),
            receipt: Receipt {
                tier: tier.into(),
                hull_version: "0".into(),
                ..Receipt::default()
            },
            error: None,
        }
    }

    #[test]
    fn a_torn_last_line_is_cut_and_the_rest_read_back() {
        let d = tempfile::tempdir().unwrap();
        {
            let (mut log, done) =
                ResultsLog::open(&OutDir::open_or_make(d.path()).unwrap()).unwrap();
            assert!(done.is_empty());
            log.append(&line("a", "bwrap")).unwrap();
            log.append(&line("b", "bwrap")).unwrap();
            assert!(log.append(&line("a", "bwrap")).is_err(), "a second result");
        }
        // What a crash in the middle of a write leaves.
        let path = d.path().join(RESULTS);
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        f.write_all(b"{\"id\":\"c\",\"tier\":\"bw").unwrap();
        drop(f);
        let (mut log, done) = ResultsLog::open(&OutDir::open_or_make(d.path()).unwrap()).unwrap();
        let ids: Vec<&str> = done.iter().map(|l| l.id.as_str()).collect();
        assert_eq!(ids, ["a", "b"]);
        assert!(log.has("a", "bwrap") && !log.has("a", "vm") && !log.has("c", "bwrap"));
        log.append(&line("c", "bwrap")).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 3);
        assert!(text
            .lines()
            .all(|l| serde_json::from_str::<ResultLine>(l).is_ok()));
    }

    #[test]
    fn a_second_batch_on_one_log_is_refused_while_the_first_holds_it() {
        let d = tempfile::tempdir().unwrap();
        let (mut first, _) = ResultsLog::open(&OutDir::open_or_make(d.path()).unwrap()).unwrap();
        // flock locks belong to the open file: a second open is another
        // batch, as a second process would be.
        let second = ResultsLog::open(&OutDir::open_or_make(d.path()).unwrap()).unwrap_err();
        assert!(
            matches!(&second, ResultsError::Busy { path } if path == &d.path().join(RESULTS)),
            "{second}"
        );
        first.append(&line("a", "bwrap")).unwrap();
        drop(first);
        let (_, done) = ResultsLog::open(&OutDir::open_or_make(d.path()).unwrap()).unwrap();
        assert_eq!(done.len(), 1);
    }

    #[test]
    fn merge_takes_each_result_once_and_names_what_is_missing_or_twice() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        ResultsLog::open(&OutDir::open_or_make(a.path()).unwrap())
            .unwrap()
            .0
            .append(&line("j1", "vm"))
            .unwrap();
        ResultsLog::open(&OutDir::open_or_make(b.path()).unwrap())
            .unwrap()
            .0
            .append(&line("j2", "vm"))
            .unwrap();
        let dirs = [a.path().to_path_buf(), b.path().to_path_buf()];
        let want = [
            ("j1".to_string(), "vm".to_string()),
            ("j2".into(), "vm".into()),
        ];
        assert_eq!(merge(&dirs, Some(&want)).unwrap().len(), 2);
        let more = [want[0].clone(), want[1].clone(), ("j3".into(), "vm".into())];
        let e = merge(&dirs, Some(&more)).unwrap_err().to_string();
        assert_eq!(
            e,
            "job j3 has no result on tier vm in any of the directories"
        );
        ResultsLog::open(&OutDir::open_or_make(b.path()).unwrap())
            .unwrap()
            .0
            .append(&line("j1", "vm"))
            .unwrap();
        let e = merge(&dirs, None).unwrap_err().to_string();
        assert!(e.starts_with("job j1 on tier vm has two results"), "{e}");
    }
}
