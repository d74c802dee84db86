//! Where `hull batch` writes each job's output, and how.
//!
//! What this protects against: a job planting a link where hull writes the
//! next job's output (`job-2.stdout -> /etc/victim`, which hull running as
//! root would overwrite, or a FIFO that would hang it). The directory is
//! never inside a writable root of the batch's policy, it is a new or empty
//! directory opened and checked as [`crate::out_dir`] does (hull's, or its
//! user's and writable by no one else; held open, never reopened by path,
//! so a rename of it changes nothing), and every file is created beneath
//! that descriptor with `O_CREAT | O_EXCL | O_NOFOLLOW`: a name that exists
//! already is an error, never followed.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use rustix::fs::{openat, Mode, OFlags};

use crate::out_dir::OutDirError;

#[derive(Debug, thiserror::Error)]
pub enum OutError {
    #[error("hull batch: the output directory {out} is inside {root}, which the jobs may write: a job could plant links where hull writes; choose --out outside it")]
    InsideWritableRoot { out: PathBuf, root: PathBuf },
    #[error("hull batch: the output directory {path} exists and is not an empty directory (a symlink or earlier results?); choose a new one")]
    NotEmpty { path: PathBuf },
    #[error("hull batch: {path}: cannot {what}: {source}")]
    Io {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("hull batch: {0}")]
    Dir(OutDirError),
}

/// The default: a new directory under the user's state directory
/// (`$XDG_STATE_HOME/hull/batches`, else `~/.local/state/hull/batches`).
pub fn default_dir() -> PathBuf {
    let base = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .unwrap_or_else(|| crate::prepare::home_dir().join(".local/state"));
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let id = uuid::Uuid::new_v4().simple().to_string();
    base.join("hull/batches")
        .join(format!("batch-{secs}-{}", &id[..8]))
}

/// The open output directory.
#[derive(Debug)]
pub struct OutDir {
    pub path: PathBuf,
    dir: crate::out_dir::OutDir,
}

impl OutDir {
    /// Creates (or takes an empty) `path`, refusing one inside any of
    /// `writable_roots`.
    pub fn open(path: &Path, writable_roots: &[PathBuf]) -> Result<OutDir, OutError> {
        let io_err = |what| {
            let path = path.to_path_buf();
            move |source| OutError::Io { path, what, source }
        };
        let abs = std::path::absolute(path).map_err(io_err("resolve"))?;
        // The path as the kernel will resolve it: its deepest existing
        // ancestor's real path, then the rest.
        let real = real_path(&abs).map_err(io_err("resolve"))?;
        for root in writable_roots {
            let root_real = std::fs::canonicalize(root).unwrap_or_else(|_| root.clone());
            if real.starts_with(&root_real) {
                return Err(OutError::InsideWritableRoot {
                    out: abs,
                    root: root.clone(),
                });
            }
        }
        let dir = crate::out_dir::OutDir::open_or_make(&abs).map_err(|e| match e {
            OutDirError::Link { .. } => OutError::NotEmpty { path: abs.clone() },
            e => OutError::Dir(e),
        })?;
        let empty = rustix::fs::Dir::read_from(dir.fd())
            .map_err(|e| io_err("list")(e.into()))?
            .filter_map(Result::ok)
            .all(|e| matches!(e.file_name().to_bytes(), b"." | b".."));
        if !empty {
            return Err(OutError::NotEmpty { path: abs });
        }
        Ok(OutDir { path: abs, dir })
    }

    /// Creates `name` in the directory: never an existing name, never
    /// through a link.
    pub fn create(&self, name: &str) -> io::Result<File> {
        let fd = openat(
            self.dir.fd(),
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )?;
        Ok(File::from(fd))
    }
}

/// `abs` with its deepest existing ancestor canonicalized.
fn real_path(abs: &Path) -> io::Result<PathBuf> {
    let mut rest = Vec::new();
    let mut cur = abs;
    loop {
        match std::fs::canonicalize(cur) {
            Ok(mut real) => {
                for c in rest.iter().rev() {
                    real.push(c);
                }
                return Ok(real);
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let (Some(parent), Some(name)) = (cur.parent(), cur.file_name()) else {
                    return Err(e);
                };
                rest.push(name.to_os_string());
                cur = parent;
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_writable_roots_links_and_used_dirs() {
        let t = tempfile::tempdir().unwrap();
        let proj = t.path().join("proj");
        std::fs::create_dir_all(&proj).unwrap();
        let roots = vec![proj.clone()];
        let e = OutDir::open(&proj.join("out"), &roots).unwrap_err();
        assert!(matches!(e, OutError::InsideWritableRoot { .. }), "{e}");
        // Also through a symlink that leads into the project.
        std::os::unix::fs::symlink(&proj, t.path().join("link")).unwrap();
        let e = OutDir::open(&t.path().join("link/out"), &roots).unwrap_err();
        assert!(matches!(e, OutError::InsideWritableRoot { .. }), "{e}");
        // A symlink as the directory itself, and a used directory.
        std::os::unix::fs::symlink(t.path(), t.path().join("dirlink")).unwrap();
        let e = OutDir::open(&t.path().join("dirlink"), &[]).unwrap_err();
        assert!(matches!(e, OutError::NotEmpty { .. }), "{e}");
        let used = t.path().join("used");
        std::fs::create_dir(&used).unwrap();
        std::fs::write(used.join("job-1.stdout"), b"old").unwrap();
        let e = OutDir::open(&used, &[]).unwrap_err();
        assert!(matches!(e, OutError::NotEmpty { .. }), "{e}");
        // A new one works; a planted link or an existing name is refused.
        let out = OutDir::open(&t.path().join("new/out"), &roots).unwrap();
        let mut f = out.create("job-1.stdout").unwrap();
        std::io::Write::write_all(&mut f, b"x").unwrap();
        assert!(out.create("job-1.stdout").is_err());
        let victim = t.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        std::os::unix::fs::symlink(&victim, out.path.join("job-2.stdout")).unwrap();
        assert!(out.create("job-2.stdout").is_err());
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
    }
}
