//! `hull run --json-result FILE`: the run's result as one JSON document,
//! for harnesses that should not parse stderr.
//!
//! What this protects against: the command forging its own result, or
//! planting a link where hull (maybe root) writes it. The file must lie
//! outside every writable root of the run's policy (checked before the
//! command starts); its directory is opened once, before the run, and held
//! (a rename of it afterwards changes nothing); the document is written to
//! a new temporary name beneath that descriptor (`O_CREAT | O_EXCL |
//! O_NOFOLLOW`) and renamed over FILE, which replaces a link there rather
//! than writing through it.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::exec::ExitStatus;
use crate::tier::Tier;

#[derive(Debug, thiserror::Error)]
pub enum ResultFileError {
    #[error("--json-result {path}: {what}: {source}")]
    Io {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("--json-result {path} has no file name")]
    NoName { path: PathBuf },
    #[error("--json-result {path} is inside {root}, which the command may write: it could forge the result or plant a link there; choose a path outside it")]
    InsideWritableRoot { path: PathBuf, root: PathBuf },
}

/// How the run ended, as the document says it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    /// The command exited with `code`.
    Exited { code: i32 },
    /// The command was killed by `signal`.
    Signaled { signal: i32 },
    /// hull killed the command's tree after its wall time.
    TimedOut,
    /// hull was interrupted by `signal` and ended the command's tree.
    Interrupted { signal: i32 },
    /// The program is not there (exit 127) or cannot be executed (126)
    /// in the sandbox: nothing ran.
    NotRunnable { message: String },
    /// hull itself failed: the command did not run, or its result is
    /// unknown.
    HullError { message: String },
}

impl From<ExitStatus> for Outcome {
    fn from(s: ExitStatus) -> Outcome {
        match s {
            ExitStatus::Code(code) => Outcome::Exited { code },
            ExitStatus::Signal(signal) => Outcome::Signaled { signal },
            ExitStatus::TimedOut => Outcome::TimedOut,
            ExitStatus::Interrupted(signal) => Outcome::Interrupted { signal },
        }
    }
}

/// The document.
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    /// The format's version: fields are only added within one version.
    pub version: u32,
    /// What hull exits with.
    pub exit_code: i32,
    #[serde(flatten)]
    pub outcome: Outcome,
    /// The tier the command ran on (absent when hull failed before one was
    /// chosen).
    pub tier: Option<Tier>,
    /// The instance's id and spill directory (`hull read`).
    pub instance: Option<String>,
    pub spill: Option<PathBuf>,
    /// Wall-clock start, seconds since the Unix epoch, and duration.
    pub started: f64,
    pub seconds: f64,
    /// `--cow`: the change set the command's writes were kept as.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changes: Option<String>,
    #[serde(flatten)]
    pub usage: Usage,
}

/// How a run ended, read back from its document by whoever started `hull
/// run --json-result` (the batch runner, the session server).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Ended {
    /// What `hull run` exited with (126 or 127 when nothing could run).
    pub exit_code: i32,
    #[serde(flatten)]
    pub outcome: Outcome,
    #[serde(default)]
    pub changes: Option<String>,
    #[serde(flatten)]
    pub usage: Usage,
}

impl Ended {
    /// The document at `path` (at most [`MAX_DOCUMENT`] bytes), or None
    /// when there is none or it is not one.
    #[cfg(target_os = "linux")]
    pub fn read(path: &Path) -> Option<Ended> {
        Ended::parse(&crate::out_dir::read_named(path, MAX_DOCUMENT).ok()?)
    }

    /// The document in `text`, or None when it is not one.
    pub fn parse(text: &[u8]) -> Option<Ended> {
        serde_json::from_slice(text).ok()
    }
}

/// The most bytes of a result document read back.
#[cfg(target_os = "linux")]
pub const MAX_DOCUMENT: u64 = 1 << 20;

/// What a run took, where its tier can tell (each field absent otherwise);
/// also a part of each `hull batch` result line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// Tier 3: seconds from starting the VM to its agent's hello.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_s: Option<f64>,
    /// The process tiers: the largest resident set any of the command's
    /// processes had (`getrusage` over the reaped tree), in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_rss_bytes: Option<u64>,
    /// Tier 3: the container's peak memory while the command ran (its
    /// cgroup's `memory.peak`, as the guest told it), in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_memory_bytes: Option<u64>,
}

/// The result file's directory, held open from before the run.
#[derive(Debug)]
pub struct ResultFile {
    path: PathBuf,
    /// The file's directory as the kernel resolved it when opened.
    dir_real: PathBuf,
    name: std::ffi::OsString,
    #[cfg(unix)]
    dir: std::os::fd::OwnedFd,
}

impl ResultFile {
    /// Opens FILE's directory (which must exist).
    pub fn open(path: &Path) -> Result<ResultFile, ResultFileError> {
        let io = |what| {
            let path = path.to_path_buf();
            move |source| ResultFileError::Io { path, what, source }
        };
        let abs = std::path::absolute(path).map_err(io("resolve"))?;
        let name = abs
            .file_name()
            .ok_or_else(|| ResultFileError::NoName { path: abs.clone() })?
            .to_os_string();
        let parent = abs.parent().unwrap_or(Path::new("/"));
        // Opened once; where it is comes from the open descriptor, never
        // from resolving the path a second time.
        #[cfg(unix)]
        let dir = {
            use rustix::fs::{openat, Mode, OFlags, CWD};
            openat(
                CWD,
                parent,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| io("open its directory")(e.into()))?
        };
        #[cfg(target_os = "linux")]
        let dir_real = {
            use std::os::fd::AsRawFd;
            std::fs::read_link(format!("/proc/self/fd/{}", dir.as_raw_fd()))
                .map_err(io("open its directory"))?
        };
        #[cfg(not(target_os = "linux"))]
        let dir_real = std::fs::canonicalize(parent).map_err(io("open its directory"))?;
        Ok(ResultFile {
            path: abs,
            dir_real,
            name,
            #[cfg(unix)]
            dir,
        })
    }

    /// Refuses a file inside any of `roots` (the policy's writable roots).
    pub fn check_outside<'a>(
        &self,
        roots: impl IntoIterator<Item = &'a Path>,
    ) -> Result<(), ResultFileError> {
        let file = self.dir_real.join(&self.name);
        for root in roots {
            let real = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
            if file.starts_with(&real) {
                return Err(ResultFileError::InsideWritableRoot {
                    path: self.path.clone(),
                    root: root.to_path_buf(),
                });
            }
        }
        Ok(())
    }

    /// Writes `result`, replacing what FILE was (never through a link).
    pub fn write(&self, result: &RunResult) -> Result<(), ResultFileError> {
        let io = |what| {
            let path = self.path.clone();
            move |source| ResultFileError::Io { path, what, source }
        };
        let mut text = serde_json::to_vec_pretty(result).map_err(|e| io("encode")(e.into()))?;
        text.push(b'\n');
        #[cfg(unix)]
        crate::out_dir::replace_at(std::os::fd::AsFd::as_fd(&self.dir), &self.name, &text)
            .map_err(io("write"))?;
        #[cfg(not(unix))]
        {
            use std::io::Write;
            let tmp = self.dir_real.join(format!(
                ".{}.{}.tmp",
                self.name.to_string_lossy(),
                uuid::Uuid::new_v4().simple()
            ));
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)
                .map_err(io("create a temporary file beside it"))?;
            let written = f.write_all(&text).and_then(|()| f.sync_all());
            drop(f);
            if let Err(e) =
                written.and_then(|()| std::fs::rename(&tmp, self.dir_real.join(&self.name)))
            {
                let _ = std::fs::remove_file(&tmp);
                return Err(io("write")(e));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result() -> RunResult {
        RunResult {
            version: 1,
            exit_code: 3,
            outcome: ExitStatus::Code(3).into(),
            tier: Some(Tier::AppContainer),
            instance: Some("i".into()),
            spill: None,
            started: 1.5,
            seconds: 0.25,
            changes: None,
            usage: Usage::default(),
        }
    }

    #[test]
    fn the_document_names_the_outcome_and_the_tier_as_the_cli_does() {
        let v: serde_json::Value =
            serde_json::from_slice(&serde_json::to_vec(&result()).expect("json")).expect("parse");
        assert_eq!(v["outcome"], "exited");
        assert_eq!(v["code"], 3);
        assert_eq!(v["exit_code"], 3);
        assert_eq!(v["tier"], "appcontainer");
        let t: serde_json::Value =
            serde_json::to_value(Outcome::from(ExitStatus::TimedOut)).expect("json");
        assert_eq!(t["outcome"], "timed_out");
    }

    #[cfg(unix)]
    #[test]
    fn a_link_at_the_name_is_replaced_not_followed() {
        let d = tempfile::tempdir().expect("tempdir");
        let victim = d.path().join("victim");
        std::fs::write(&victim, "victim\n").expect("write");
        let file = d.path().join("result.json");
        std::os::unix::fs::symlink(&victim, &file).expect("symlink");
        let r = ResultFile::open(&file).expect("open");
        r.write(&result()).expect("write");
        assert_eq!(std::fs::read_to_string(&victim).expect("read"), "victim\n");
        assert!(!std::fs::symlink_metadata(&file)
            .expect("meta")
            .file_type()
            .is_symlink());
        assert!(std::fs::read_to_string(&file)
            .expect("read")
            .contains("\"exit_code\": 3"));
        let left: Vec<_> = std::fs::read_dir(d.path())
            .expect("ls")
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(left.len(), 2, "{left:?}");
    }

    #[test]
    fn a_file_inside_a_writable_root_is_refused() {
        let d = tempfile::tempdir().expect("tempdir");
        let project = d.path().join("p");
        std::fs::create_dir(&project).expect("mkdir");
        let r = ResultFile::open(&project.join("r.json")).expect("open");
        assert!(matches!(
            r.check_outside([project.as_path()]),
            Err(ResultFileError::InsideWritableRoot { .. })
        ));
        let r = ResultFile::open(&d.path().join("r.json")).expect("open");
        r.check_outside([project.as_path()]).expect("outside");
    }
}
