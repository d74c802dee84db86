//! The project's state around a copy-on-write run, so that applying a
//! change set can tell a path the project changed since the run started (a
//! conflict, left alone) from one it did not.
//!
//! Cheap before the run, exact after it: [`Baseline::capture`] lists the
//! project's names (directory reads, no `stat` per entry) and reads the
//! kernel's coarse clock, the one file change times come from; when the run
//! ends, [`Baseline::settle`] stamps only the changed paths (and what is
//! below a deleted or replaced directory). A path whose change time is not
//! before the start, that is there now but was not listed, or was listed
//! and is gone, changed while the run went on; any other's stamp is what
//! `apply` compares with later.

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{at, is_protected, ChangesError, MAX_BASELINE, MAX_DEPTH};

/// What identifies one state of one entry. Any write, chmod, rename over
/// or replacement changes one of these (the change time at least).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stamp {
    /// `st_mode`: the type and the permission bits.
    pub mode: u32,
    pub size: u64,
    pub ino: u64,
    pub mtime: i64,
    pub mtime_ns: i64,
    pub ctime: i64,
    pub ctime_ns: i64,
}

impl Stamp {
    pub fn of(m: &std::fs::Metadata) -> Stamp {
        Stamp {
            mode: m.mode(),
            size: if m.is_dir() { 0 } else { m.size() },
            ino: m.ino(),
            mtime: m.mtime(),
            mtime_ns: m.mtime_nsec(),
            ctime: m.ctime(),
            ctime_ns: m.ctime_nsec(),
        }
    }

    /// From an `fstatat` of the entry (not followed).
    pub fn of_stat(s: &rustix::fs::Stat) -> Stamp {
        let is_dir =
            rustix::fs::FileType::from_raw_mode(s.st_mode) == rustix::fs::FileType::Directory;
        Stamp {
            mode: s.st_mode,
            size: if is_dir { 0 } else { s.st_size as u64 },
            ino: s.st_ino,
            mtime: s.st_mtime,
            mtime_ns: s.st_mtime_nsec as i64,
            ctime: s.st_ctime,
            ctime_ns: s.st_ctime_nsec as i64,
        }
    }
}

/// The time a change made now would get: the change time of a new
/// unnamed file in the temporary directory (the kernel's clock for file
/// times, which is coarse, and with multigrain timestamps never behind one
/// it has handed out); the coarse clock itself where that file cannot be
/// made.
fn fs_now() -> (i64, i64) {
    use rustix::fs::{fstat, openat, Mode, OFlags, CWD};
    let tmp = std::env::temp_dir();
    if let Ok(fd) = openat(
        CWD,
        &tmp,
        OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC,
        Mode::RUSR,
    ) {
        if let Ok(st) = fstat(&fd) {
            return (st.st_ctime, st.st_ctime_nsec as i64);
        }
    }
    let now = rustix::time::clock_gettime(rustix::time::ClockId::RealtimeCoarse);
    (now.tv_sec, now.tv_nsec)
}

/// The project around a run, by relative path (`/`-separated), `.git` and
/// `.hull` left out (a change set never touches them).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Baseline {
    /// The changed paths' stamps when the run ended.
    pub entries: BTreeMap<String, Stamp>,
    /// The changed paths (or entries below a deleted directory) the project
    /// itself made, removed or changed while the run went on.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub during: BTreeSet<String>,
    /// Before the run: every name in the project (not kept in the set).
    #[serde(skip)]
    names: BTreeSet<String>,
    /// Before the run: the coarse real-time clock, seconds and nanoseconds.
    #[serde(skip)]
    started: (i64, i64),
}

impl Baseline {
    /// Before the run: the clock, then every name of `project` (directory
    /// reads, no link followed, at most [`MAX_BASELINE`] entries,
    /// [`MAX_DEPTH`] levels). Names that are not UTF-8 are left out: a
    /// change to one is refused anyway.
    pub fn capture(project: &Path) -> Result<Baseline, ChangesError> {
        let mut b = Baseline {
            started: fs_now(),
            ..Baseline::default()
        };
        let root = at::open_root(project).map_err(|source| ChangesError::Io {
            what: "cannot open the project",
            path: project.to_path_buf(),
            source,
        })?;
        b.list(root.as_fd(), project, "", 0)?;
        Ok(b)
    }

    fn list(
        &mut self,
        dir: std::os::fd::BorrowedFd<'_>,
        project: &Path,
        rel: &str,
        depth: usize,
    ) -> Result<(), ChangesError> {
        let io = |what: &'static str, source| ChangesError::Io {
            what,
            path: project.join(rel),
            source,
        };
        if depth > MAX_DEPTH {
            return Err(ChangesError::TooDeep {
                path: project.join(rel),
            });
        }
        for (name, is_dir) in at::list_types(dir).map_err(|e| io("cannot read", e))? {
            let Some(name) = name.to_str() else { continue };
            let path = if rel.is_empty() {
                name.to_string()
            } else {
                format!("{rel}/{name}")
            };
            if is_protected(&path) {
                continue;
            }
            if self.names.len() >= MAX_BASELINE {
                return Err(ChangesError::TooMany {
                    path: project.join(rel),
                    what: "entries in the project",
                    limit: MAX_BASELINE,
                });
            }
            self.names.insert(path.clone());
            if is_dir {
                let sub = at::open_dir(dir, name).map_err(|e| io("cannot open", e))?;
                self.list(sub.as_fd(), project, &path, depth + 1)?;
            }
        }
        Ok(())
    }

    /// After the run: the stamps of `paths` in `project` now (with, for a
    /// path marked `true`, a deleted or replaced directory, everything
    /// below it), and which of them the project changed during the run.
    pub fn settle(&self, project: &Path, paths: &[(&str, bool)]) -> Result<Baseline, ChangesError> {
        let mut out = Baseline::default();
        let root = at::open_root(project).map_err(|source| ChangesError::Io {
            what: "cannot open the project",
            path: project.to_path_buf(),
            source,
        })?;
        for (p, subtree) in paths {
            let (parent_rel, name) = match p.rsplit_once('/') {
                Some((a, b)) => (a, b),
                None => ("", *p),
            };
            let now = match at::open_dir_path(root.as_fd(), parent_rel) {
                Ok(parent) => at::stat(parent.as_fd(), name)
                    .ok()
                    .flatten()
                    .map(|s| (Stamp::of_stat(&s), parent)),
                Err(_) => None,
            };
            match now {
                Some((stamp, parent)) => {
                    self.note(&mut out, p, Some(stamp));
                    let is_dir = rustix::fs::FileType::from_raw_mode(stamp.mode)
                        == rustix::fs::FileType::Directory;
                    if *subtree && is_dir {
                        let mut found = BTreeMap::new();
                        if let Ok(d) = at::open_dir(parent.as_fd(), name) {
                            let _ = super::apply::stamps_below(d.as_fd(), p, 0, &mut found);
                        }
                        for (k, s) in &found {
                            self.note(&mut out, k, Some(*s));
                        }
                        let prefix = format!("{p}/");
                        for gone in self
                            .names
                            .range(prefix.clone()..)
                            .take_while(|k| k.starts_with(&prefix))
                            .filter(|k| !found.contains_key(*k))
                        {
                            out.during.insert(gone.clone());
                        }
                    }
                }
                None => self.note(&mut out, p, None),
            }
        }
        Ok(out)
    }

    /// Records `path` as it is now: a stamp to compare with later, or a
    /// change the project made during the run (a change time not before
    /// the start: one in the very tick of the start counts as during, the
    /// safe side).
    fn note(&self, out: &mut Baseline, path: &str, now: Option<Stamp>) {
        let listed = self.names.contains(path);
        match now {
            Some(s) if listed && (s.ctime, s.ctime_ns) < self.started => {
                out.entries.insert(path.to_string(), s);
            }
            Some(_) => {
                out.during.insert(path.to_string());
            }
            None if listed => {
                out.during.insert(path.to_string());
            }
            None => {}
        }
    }

    pub fn get(&self, path: &str) -> Option<&Stamp> {
        self.entries.get(path)
    }

    /// Whether the project changed `path`, or anything below it, while the
    /// run went on.
    pub fn changed_during(&self, path: &str) -> bool {
        let prefix = format!("{path}/");
        self.during.contains(path)
            || self
                .during
                .range(prefix.clone()..)
                .next()
                .is_some_and(|k| k.starts_with(&prefix))
    }

    /// The entries strictly below `dir`.
    pub fn below<'a>(&'a self, dir: &str) -> impl Iterator<Item = (&'a String, &'a Stamp)> + 'a {
        let prefix = format!("{dir}/");
        self.entries
            .range(prefix.clone()..)
            .take_while(move |(k, _)| k.starts_with(&prefix))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_during_the_run_is_told_from_one_before_it() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("a/b")).unwrap();
        std::fs::create_dir_all(d.path().join(".git/hooks")).unwrap();
        std::fs::write(d.path().join("a/b/f"), "x").unwrap();
        std::fs::write(d.path().join("a/g"), "x").unwrap();
        std::fs::write(d.path().join("gone"), "x").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", d.path().join("l")).unwrap();
        // The coarse clock ticks every few ms: what was written a tick
        // before the capture is from before the run.
        std::thread::sleep(std::time::Duration::from_millis(30));
        let b = Baseline::capture(d.path()).unwrap();
        let names: Vec<_> = b.names.iter().cloned().collect();
        assert_eq!(names, ["a", "a/b", "a/b/f", "a/g", "gone", "l"]);
        std::thread::sleep(std::time::Duration::from_millis(30));
        // During the run: one file changed, one removed, one made.
        std::fs::write(d.path().join("a/b/f"), "y").unwrap();
        std::fs::remove_file(d.path().join("gone")).unwrap();
        std::fs::write(d.path().join("new"), "n").unwrap();
        let s = b
            .settle(
                d.path(),
                &[
                    ("a", true),
                    ("l", false),
                    ("gone", false),
                    ("new", false),
                    ("none", false),
                ],
            )
            .unwrap();
        let during: Vec<_> = s.during.iter().cloned().collect();
        assert_eq!(during, ["a/b/f", "gone", "new"]);
        assert!(s.get("l").is_some() && s.get("a/g").is_some() && s.get("a").is_some());
        assert!(s.changed_during("a") && s.changed_during("a/b") && !s.changed_during("l"));
        assert!(s.get("none").is_none() && !s.changed_during("none"));
        // Kept in the set: the stamps and the changes during the run only.
        let text = serde_json::to_string(&s).unwrap();
        assert!(!text.contains("names") && text.contains("during"), "{text}");
    }
}
