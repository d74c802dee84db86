//! The jobs file of `hull batch`: one job per line, either a JSON object
//! (`{"id": "task-17", "argv": ["pytest", "-x"], ...}`) or, as before, a
//! shell line. Blank lines and `#` comments are skipped.
//!
//! Guards against: a malformed line or an unknown key taken for something
//! else (each is reported with its line number, then skipped or fatal as
//! the caller chose), two jobs with one id (refused before anything runs,
//! naming both lines), ids that would escape the output directory (they
//! name files: letters, digits, `.`, `_` and `-`, not starting with `.`),
//! and unbounded input (line, stdin, environment and job count caps).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// Longest line of a jobs file.
pub const MAX_LINE: usize = 1 << 20;
/// Most jobs in one file.
pub const MAX_JOBS: usize = 1_000_000;
/// Longest id.
pub const MAX_ID: usize = 128;
/// Most bytes of one job's `stdin`.
pub const MAX_STDIN: usize = 1 << 20;
/// Most entries in one job's `env`.
pub const MAX_ENV: usize = 1024;

/// What a job runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `argv` as given.
    Argv(Vec<String>),
    /// `sh -c LINE` (a text line, or `"sh"` in a JSON one).
    Sh(String),
}

impl Command {
    /// The argv hull runs.
    pub fn argv(&self) -> Vec<String> {
        match self {
            Command::Argv(a) => a.clone(),
            Command::Sh(s) => vec!["sh".into(), "-c".into(), s.clone()],
        }
    }
}

/// What the job's project is to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Workspace {
    /// A pristine project: its writes are kept as its change set.
    #[default]
    Cow,
    /// Writes go into the project, as a plain `hull run`.
    Shared,
}

/// One job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// 0-based among the job lines of the file (bad ones too): what
    /// `--shard K/N` selects on, the same whatever is skipped.
    pub index: usize,
    /// 1-based line number.
    pub line: usize,
    /// `line-N` when the line names none.
    pub id: String,
    pub command: Command,
    /// Relative paths are the jobs file's directory's; `None`: the batch's.
    pub project: Option<PathBuf>,
    pub workspace: Workspace,
    pub env: BTreeMap<String, String>,
    pub timeout: Option<Duration>,
    pub policy: Option<String>,
    pub stdin: Option<String>,
    /// The container image whose layers are the job's userland (tier vm):
    /// a reference, an archive's or layout's relative path made the jobs
    /// file's.
    pub image: Option<String>,
}

/// A JSON job line, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JobLine {
    id: Option<String>,
    argv: Option<Vec<String>>,
    sh: Option<String>,
    project: Option<PathBuf>,
    #[serde(default)]
    workspace: Workspace,
    #[serde(default)]
    env: BTreeMap<String, String>,
    timeout: Option<String>,
    policy: Option<String>,
    stdin: Option<String>,
    image: Option<String>,
}

/// What to do with a line that is not a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum OnBadLine {
    /// Report it and run the others.
    Skip,
    /// Report it and run nothing.
    #[default]
    Fail,
}

/// A line that is not a job, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {why}")]
pub struct BadLine {
    pub line: usize,
    pub why: String,
}

#[derive(Debug, thiserror::Error)]
pub enum JobsError {
    #[error("{file}: {bad}")]
    Bad { file: String, bad: BadLine },
    #[error("{file}: {} bad lines, the first: {}; nothing was run", bad.len(), bad[0])]
    BadLines { file: String, bad: Vec<BadLine> },
    #[error("{file}: line {line}: the id {id:?} is also the id of line {first}; nothing was run")]
    Duplicate {
        file: String,
        id: String,
        first: usize,
        line: usize,
    },
    #[error("{file}: more than {MAX_JOBS} jobs")]
    TooMany { file: String },
    #[error("{file}: no jobs")]
    Empty { file: String },
}

/// The jobs of a file and the lines skipped.
#[derive(Debug, Default)]
pub struct Parsed {
    pub jobs: Vec<Job>,
    pub skipped: Vec<BadLine>,
}

/// Parses `text` (the file `file`, whose directory is `base` for relative
/// projects). With [`OnBadLine::Fail`] any bad line is an error naming
/// it (all are listed); with `Skip` they are returned in `skipped`. Two
/// jobs with one id are always an error.
pub fn parse(text: &str, file: &str, base: &Path, on_bad: OnBadLine) -> Result<Parsed, JobsError> {
    let mut out = Parsed::default();
    let mut index = 0;
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let t = raw.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        if index >= MAX_JOBS {
            return Err(JobsError::TooMany { file: file.into() });
        }
        match parse_line(t, line, index, base) {
            Ok(job) => out.jobs.push(job),
            // Collected either way: a fatal error lists them all.
            Err(why) => out.skipped.push(BadLine { line, why }),
        }
        index += 1;
    }
    if on_bad == OnBadLine::Fail && !out.skipped.is_empty() {
        let mut bad = std::mem::take(&mut out.skipped);
        if bad.len() == 1 {
            return Err(JobsError::Bad {
                file: file.into(),
                bad: bad.remove(0),
            });
        }
        return Err(JobsError::BadLines {
            file: file.into(),
            bad,
        });
    }
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for j in &out.jobs {
        if let Some(first) = seen.insert(&j.id, j.line) {
            return Err(JobsError::Duplicate {
                file: file.into(),
                id: j.id.clone(),
                first,
                line: j.line,
            });
        }
    }
    if out.jobs.is_empty() {
        return Err(JobsError::Empty { file: file.into() });
    }
    Ok(out)
}

fn parse_line(t: &str, line: usize, index: usize, base: &Path) -> Result<Job, String> {
    if t.len() > MAX_LINE {
        return Err(format!("longer than {MAX_LINE} bytes"));
    }
    let default_id = format!("line-{line}");
    if !t.starts_with('{') {
        return Ok(Job {
            index,
            line,
            id: default_id,
            command: Command::Sh(t.to_string()),
            project: None,
            workspace: Workspace::default(),
            env: BTreeMap::new(),
            timeout: None,
            policy: None,
            stdin: None,
            image: None,
        });
    }
    let j: JobLine = serde_json::from_str(t).map_err(|e| format!("not a job: {e}"))?;
    let command = match (j.argv, j.sh) {
        (Some(a), None) if !a.is_empty() => Command::Argv(a),
        (Some(_), None) => return Err("argv is empty".into()),
        (None, Some(s)) => Command::Sh(s),
        (Some(_), Some(_)) => return Err("both argv and sh: give one".into()),
        (None, None) => return Err("neither argv nor sh: give one".into()),
    };
    let id = j.id.unwrap_or(default_id);
    check_id(&id)?;
    if j.env.len() > MAX_ENV {
        return Err(format!("env has more than {MAX_ENV} entries"));
    }
    for k in j.env.keys() {
        let ok = !k.is_empty()
            && !k.starts_with(|c: char| c.is_ascii_digit())
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ok {
            return Err(format!("env: {k:?} is not a variable name"));
        }
    }
    if j.stdin.as_ref().is_some_and(|s| s.len() > MAX_STDIN) {
        return Err(format!("stdin is longer than {MAX_STDIN} bytes"));
    }
    let timeout = j
        .timeout
        .map(|t| crate::policy::resolve::parse_duration(&t).map_err(|e| format!("timeout: {e}")))
        .transpose()?;
    Ok(Job {
        index,
        line,
        id,
        command,
        project: j.project.map(|p| base.join(p)),
        workspace: j.workspace,
        env: j.env,
        timeout,
        // A policy file's relative path is the jobs file's, as a project's.
        policy: j.policy.map(|p| {
            let is_file = p.contains('/') || p.ends_with(".toml");
            if is_file && Path::new(&p).is_relative() {
                base.join(p).to_string_lossy().into_owned()
            } else {
                p
            }
        }),
        stdin: j.stdin,
        image: j.image.map(|r| image_of(&r, base)).transpose()?,
    })
}

/// A job's image reference, checked, with a relative archive or layout
/// path made the jobs file's.
fn image_of(r: &str, base: &Path) -> Result<String, String> {
    use hull_oci::Reference;
    let parsed: Reference = r.parse().map_err(|e| format!("image: {e}"))?;
    let rebased = |p: PathBuf| match p.is_relative() {
        true => base.join(p),
        false => p,
    };
    Ok(match parsed {
        Reference::OciArchive(p) => Reference::OciArchive(rebased(p)),
        Reference::DockerArchive(p) => Reference::DockerArchive(rebased(p)),
        Reference::OciLayout { dir, tag } => Reference::OciLayout {
            dir: rebased(dir),
            tag,
        },
        other => other,
    }
    .to_string())
}

/// Ids name files in the output directory: letters, digits, `.`, `_`, `-`,
/// at most [`MAX_ID`] bytes, not starting with `.`.
pub fn check_id(id: &str) -> Result<(), String> {
    let ok = !id.is_empty()
        && id.len() <= MAX_ID
        && !id.starts_with('.')
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "id {id:?}: 1 to {MAX_ID} letters, digits, '.', '_' or '-', not starting with '.'"
        ))
    }
}

/// `--shard K/N`: the jobs whose index modulo N is K.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    pub k: usize,
    pub n: usize,
}

impl std::str::FromStr for Shard {
    type Err = String;
    fn from_str(s: &str) -> Result<Shard, String> {
        let (k, n) = s
            .split_once('/')
            .ok_or_else(|| format!("{s:?} is not K/N (for example 0/4)"))?;
        let k: usize = k.parse().map_err(|_| format!("{s:?}: K is not a number"))?;
        let n: usize = n.parse().map_err(|_| format!("{s:?}: N is not a number"))?;
        if n == 0 || k >= n {
            return Err(format!(
                "{s:?}: K must be below N (0/{n} to {}/{n})",
                n.max(1) - 1
            ));
        }
        Ok(Shard { k, n })
    }
}

impl Shard {
    pub fn has(&self, job: &Job) -> bool {
        job.index % self.n == self.k
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str, on: OnBadLine) -> Result<Parsed, JobsError> {
        parse(text, "jobs.jsonl", Path::new("/base"), on)
    }

    #[test]
    fn a_job_s_image_is_a_reference_its_relative_path_the_jobs_file_s() {
        let text = "{\"id\": \"a\", \"sh\": \"x\", \"image\": \"oci-archive:img/a.tar\"}\n\
            {\"id\": \"b\", \"sh\": \"x\", \"image\": \"oci:/l:v2\"}\n\
            {\"id\": \"c\", \"sh\": \"x\"}\n";
        let jobs = p(text, OnBadLine::Fail).unwrap().jobs;
        assert_eq!(
            jobs[0].image.as_deref(),
            Some("oci-archive:/base/img/a.tar")
        );
        assert_eq!(jobs[1].image.as_deref(), Some("oci:/l:v2"));
        assert_eq!(jobs[2].image, None);
        let e = p(
            "{\"id\": \"a\", \"sh\": \"x\", \"image\": \"ubuntu:24.04\"}\n",
            OnBadLine::Fail,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("line 1") && e.contains("image:") && e.contains("ubuntu:24.04"),
            "{e}"
        );
    }

    #[test]
    fn json_and_text_lines_make_jobs() {
        let text = "# a comment\n\
            {\"id\": \"task-17\", \"argv\": [\"pytest\", \"-x\"], \"project\": \"repos/t17\", \
             \"workspace\": \"shared\", \"env\": {\"SEED\": \"3\"}, \"timeout\": \"10m\", \
             \"policy\": \"build\", \"stdin\": \"in\"}\n\
            \n\
            make test\n\
            {\"sh\": \"echo hi\"}\n";
        let jobs = p(text, OnBadLine::Fail).unwrap().jobs;
        assert_eq!(jobs.len(), 3);
        let j = &jobs[0];
        assert_eq!((j.index, j.line, j.id.as_str()), (0, 2, "task-17"));
        assert_eq!(j.command.argv(), ["pytest", "-x"]);
        assert_eq!(j.project.as_deref(), Some(Path::new("/base/repos/t17")));
        assert_eq!(j.workspace, Workspace::Shared);
        assert_eq!(j.env["SEED"], "3");
        assert_eq!(j.timeout, Some(Duration::from_secs(600)));
        assert_eq!(j.policy.as_deref(), Some("build"));
        let f = p(
            "{\"sh\": \"x\", \"policy\": \"pol/p.toml\"}\n",
            OnBadLine::Fail,
        )
        .unwrap();
        assert_eq!(f.jobs[0].policy.as_deref(), Some("/base/pol/p.toml"));
        assert_eq!(j.stdin.as_deref(), Some("in"));
        let t = &jobs[1];
        assert_eq!((t.index, t.line, t.id.as_str()), (1, 4, "line-4"));
        assert_eq!(t.command.argv(), ["sh", "-c", "make test"]);
        assert_eq!(t.workspace, Workspace::Cow);
        assert_eq!(jobs[2].id, "line-5");
    }

    #[test]
    fn bad_lines_are_named_by_number_and_skipped_or_fatal() {
        let text = "{\"id\": \"a\", \"sh\": \"true\"}\n\
            {\"id\": \"b\", \"sh\": \"true\", \"colour\": \"red\"}\n\
            {not json\n\
            {\"id\": \"c\", \"argv\": [\"x\"], \"sh\": \"y\"}\n\
            {\"id\": \"../etc\", \"sh\": \"true\"}\n\
            {\"id\": \"d\", \"sh\": \"true\", \"timeout\": \"soon\"}\n\
            {\"id\": \"e\", \"argv\": []}\n\
            {\"id\": \"f\", \"sh\": \"true\", \"env\": {\"A=B\": \"1\"}}\n\
            {\"id\": \"g\", \"sh\": \"true\"}\n";
        let e = p(text, OnBadLine::Fail).unwrap_err().to_string();
        assert!(e.contains("7 bad lines, the first: line 2"), "{e}");
        assert!(e.contains("unknown field `colour`"), "{e}");
        let got = p(text, OnBadLine::Skip).unwrap();
        let ids: Vec<&str> = got.jobs.iter().map(|j| j.id.as_str()).collect();
        assert_eq!(ids, ["a", "g"]);
        let lines: Vec<usize> = got.skipped.iter().map(|b| b.line).collect();
        assert_eq!(lines, [2, 3, 4, 5, 6, 7, 8]);
        // The shard index counts the bad lines too.
        assert_eq!(got.jobs[1].index, 8);
        let one = p("{\"sh\": 1}\n", OnBadLine::Fail).unwrap_err().to_string();
        assert!(one.starts_with("jobs.jsonl: line 1: not a job"), "{one}");
    }

    #[test]
    fn duplicate_ids_are_refused_naming_both_lines() {
        let text = "{\"id\": \"x\", \"sh\": \"true\"}\ntrue\n{\"id\": \"x\", \"sh\": \"false\"}\n";
        let e = p(text, OnBadLine::Skip).unwrap_err().to_string();
        assert_eq!(
            e,
            "jobs.jsonl: line 3: the id \"x\" is also the id of line 1; nothing was run"
        );
        // A named id may not take a text line's default either.
        let e = p(
            "true\n{\"id\": \"line-1\", \"sh\": \"x\"}\n",
            OnBadLine::Fail,
        )
        .unwrap_err();
        assert!(matches!(e, JobsError::Duplicate { .. }), "{e}");
        assert!(matches!(
            p("# only\n\n", OnBadLine::Fail),
            Err(JobsError::Empty { .. })
        ));
    }

    #[test]
    fn shards_split_by_index_and_cover_every_job_once() {
        let text: String = (0..10).map(|i| format!("echo {i}\n")).collect();
        let jobs = p(&text, OnBadLine::Fail).unwrap().jobs;
        let mut seen = vec![0; jobs.len()];
        for k in 0..3 {
            let s: Shard = format!("{k}/3").parse().unwrap();
            for j in jobs.iter().filter(|j| s.has(j)) {
                seen[j.index] += 1;
                assert_eq!(j.index % 3, k);
            }
        }
        assert!(seen.iter().all(|n| *n == 1));
        for bad in ["3/3", "0/0", "1", "a/2", "-1/2"] {
            assert!(bad.parse::<Shard>().is_err(), "{bad}");
        }
    }
}
