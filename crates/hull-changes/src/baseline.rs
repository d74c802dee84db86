//! The project's state around a copy-on-write run, so that applying a
//! change set can tell a path the project changed since the run started (a
//! conflict, left alone) from one it did not.
//!
//! Nothing is read before the run but the clock file change times come
//! from ([`Baseline::capture`]); when the run ends, [`Baseline::settle`]
//! stamps only the changed paths (and what is below a deleted or replaced
//! directory). The project's own changes during the run are told by change
//! times, which no one can set: an entry whose change time is not before
//! the start changed (or appeared: a link or a rename changes it too); a
//! path that is not there now was not there at the start either when its
//! directory's change time is before the start (adding, removing or
//! renaming an entry changes the directory's), and is counted as changed
//! during the run otherwise, the safe side: a conflict for a path whose
//! directory the host changed meanwhile, even for another entry. Any other
//! path's stamp is what `apply` compares with later.
//!
//! hull itself adds and removes entries during a run in the directories
//! that hold a protected path (a placeholder for a missing `.git`, or one a
//! concurrent run holds): those few directories' names are read before the
//! run and compared after it, the protected names left out, instead of
//! their change times.

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{at, is_protected, ChangesError};

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
    /// The changed paths (or entries below a deleted directory, or a
    /// directory below one whose entries changed) the project itself made,
    /// removed or changed while the run went on.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub during: BTreeSet<String>,
    /// Before the run: the file clock, seconds and nanoseconds.
    #[serde(skip)]
    started: (i64, i64),
    /// Before the run: the names in each directory holding a protected
    /// path, by the directory's relative path, the protected ones left out.
    #[serde(skip)]
    listed: BTreeMap<String, BTreeSet<String>>,
    /// The protected paths (relative), left out of `listed`.
    #[serde(skip)]
    protected: BTreeSet<String>,
}

impl Baseline {
    /// Before the run: the time a change made now would get, and the
    /// names in the project's top directory and in each directory holding
    /// one of `protected` (relative paths), where hull makes and removes
    /// placeholders.
    pub fn capture(project: &Path, protected: &[String]) -> Result<Baseline, ChangesError> {
        let mut b = Baseline {
            started: fs_now(),
            protected: protected.iter().cloned().collect(),
            ..Baseline::default()
        };
        let root = at::open_root(project).map_err(|source| ChangesError::Io {
            what: "cannot open the project",
            path: project.to_path_buf(),
            source,
        })?;
        let parents: BTreeSet<&str> = std::iter::once("")
            .chain(
                protected
                    .iter()
                    .map(|p| p.rsplit_once('/').map_or("", |(a, _)| a)),
            )
            .collect();
        for dir in parents {
            // A directory that is not there has no names to compare: its
            // change time is read when it is there later.
            if let Some(names) = b.names_in(root.as_fd(), dir) {
                b.listed.insert(dir.to_string(), names);
            }
        }
        Ok(b)
    }

    /// The names in `dir` (relative), protected ones left out; none when
    /// it cannot be read.
    fn names_in(&self, root: BorrowedFd<'_>, dir: &str) -> Option<BTreeSet<String>> {
        let d = at::open_dir_path(root, dir).ok()?;
        let names = at::list(d.as_fd()).ok()?;
        Some(
            names
                .iter()
                .filter_map(|n| n.to_str())
                .filter(|n| {
                    let rel = if dir.is_empty() {
                        n.to_string()
                    } else {
                        format!("{dir}/{n}")
                    };
                    !is_protected(&rel) && !self.protected.contains(&rel)
                })
                .map(str::to_string)
                .collect(),
        )
    }

    /// Whether `dir` (relative, there now, `st` its stat) had no entry
    /// added, removed or renamed since the start: by its names for a
    /// listed directory, by its change time for any other.
    fn dir_unchanged(&self, root: BorrowedFd<'_>, dir: &str, st: &rustix::fs::Stat) -> bool {
        match self.listed.get(dir) {
            Some(before) => self.names_in(root, dir).as_ref() == Some(before),
            None => self.before_start(st),
        }
    }

    /// Whether a change time is before the run's start (one in the very
    /// tick of the start is not: the safe side).
    fn before_start(&self, s: &rustix::fs::Stat) -> bool {
        (s.st_ctime, s.st_ctime_nsec as i64) < self.started
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
            let parent = at::open_dir_path(root.as_fd(), parent_rel).ok();
            let now = parent
                .as_ref()
                .and_then(|d| at::stat(d.as_fd(), name).ok().flatten());
            let Some(st) = now else {
                // Not there now: not there at the start either, unless the
                // nearest directory above it that is there changed.
                if !self.nearest_dir_unchanged(root.as_fd(), parent_rel) {
                    out.during.insert(p.to_string());
                }
                continue;
            };
            let is_dir = at::file_type(&st) == rustix::fs::FileType::Directory;
            if is_dir && self.listed.contains_key(*p) {
                // hull's placeholders change its time: its names tell.
                if self.dir_unchanged(root.as_fd(), p, &st) {
                    out.entries.insert(p.to_string(), Stamp::of_stat(&st));
                } else {
                    out.during.insert(p.to_string());
                }
            } else {
                self.note(&mut out, p, &st);
            }
            if let (true, true, Some(parent)) = (*subtree, is_dir, &parent) {
                if let Ok(d) = at::open_dir(parent.as_fd(), name) {
                    let mut found = BTreeMap::new();
                    let _ = super::apply::stamps_below(d.as_fd(), p, 0, &mut found);
                    // A directory below whose change time is not before
                    // the start may have lost an entry during the run: it
                    // is counted as changed, and with it all below it
                    // (`changed_during`).
                    for (k, s) in found {
                        let unchanged = if self.listed.contains_key(&k) {
                            self.names_in(root.as_fd(), &k).as_ref() == self.listed.get(&k)
                        } else {
                            (s.ctime, s.ctime_ns) < self.started
                        };
                        if unchanged {
                            out.entries.insert(k, s);
                        } else {
                            out.during.insert(k);
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// Whether the nearest directory at or above `rel` that is there now
    /// had no entry added, removed or renamed since the start.
    fn nearest_dir_unchanged(&self, root: BorrowedFd<'_>, rel: &str) -> bool {
        let mut rel = rel;
        loop {
            if let Ok(d) = at::open_dir_path(root, rel) {
                return rustix::fs::fstat(&d).is_ok_and(|s| self.dir_unchanged(root, rel, &s));
            }
            if rel.is_empty() {
                return false;
            }
            rel = rel.rsplit_once('/').map_or("", |(a, _)| a);
        }
    }

    /// Records `path` as it is now: a stamp to compare with later, or a
    /// change the project made during the run.
    fn note(&self, out: &mut Baseline, path: &str, now: &rustix::fs::Stat) {
        if self.before_start(now) {
            out.entries.insert(path.to_string(), Stamp::of_stat(now));
        } else {
            out.during.insert(path.to_string());
        }
    }

    /// This run's stamps and changes over `earlier` runs' of the same set:
    /// a path's earliest stamp stands (a change the project made between
    /// two runs is then a conflict), and whatever the project changed
    /// during any of them stays changed.
    pub fn over(mut self, earlier: &Baseline) -> Baseline {
        for (k, v) in &earlier.entries {
            self.entries.insert(k.clone(), *v);
        }
        self.during.extend(earlier.during.iter().cloned());
        self
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
        std::fs::create_dir_all(d.path().join("c/d")).unwrap();
        std::fs::create_dir_all(d.path().join("p")).unwrap();
        std::fs::create_dir_all(d.path().join(".git/hooks")).unwrap();
        std::fs::write(d.path().join("a/b/f"), "x").unwrap();
        std::fs::write(d.path().join("a/g"), "x").unwrap();
        std::fs::write(d.path().join("c/d/h"), "x").unwrap();
        std::fs::write(d.path().join("gone"), "x").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", d.path().join("l")).unwrap();
        // The coarse clock ticks every few ms: what was written a tick
        // before the capture is from before the run.
        std::thread::sleep(std::time::Duration::from_millis(30));
        let b = Baseline::capture(d.path(), &["p/deny".into()]).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(30));
        // hull's placeholders: one made and removed in p, one made at the
        // top and left (a concurrent run's).
        std::fs::write(d.path().join("p/deny"), "").unwrap();
        std::fs::remove_file(d.path().join("p/deny")).unwrap();
        std::fs::create_dir(d.path().join(".hull")).unwrap();
        // During the run: one file changed, one removed at the top and one
        // below c/d, one made at the top, one renamed onto another's name.
        std::fs::write(d.path().join("a/b/f"), "y").unwrap();
        std::fs::remove_file(d.path().join("gone")).unwrap();
        std::fs::remove_file(d.path().join("c/d/h")).unwrap();
        std::fs::write(d.path().join("new"), "n").unwrap();
        std::fs::write(d.path().join("a/tmp"), "t").unwrap();
        std::fs::rename(d.path().join("a/tmp"), d.path().join("a/g")).unwrap();
        let s = b
            .settle(
                d.path(),
                &[
                    ("a", true),
                    ("c", true),
                    ("l", false),
                    ("gone", false),
                    ("new", false),
                    ("a/b/none", false),
                    ("a/b/x/y/none", false),
                    ("at-the-top", false),
                    ("p/added", false),
                    ("p", false),
                ],
            )
            .unwrap();
        let during: Vec<_> = s.during.iter().cloned().collect();
        // `a` itself: a/tmp was made and renamed in it. `at-the-top` was
        // never there, but the top changed: the safe side.
        assert_eq!(
            during,
            ["a", "a/b/f", "a/g", "at-the-top", "c/d", "gone", "new"]
        );
        assert!(s.get("l").is_some() && s.get("c").is_some() && s.get("a/b").is_some());
        // c/d lost an entry: c's deletion would be a conflict.
        assert!(s.changed_during("c") && s.changed_during("c/d") && !s.changed_during("l"));
        // Never there, in a directory no one touched: no stamp, no change.
        assert!(s.get("a/b/none").is_none() && !s.changed_during("a/b/none"));
        assert!(!s.changed_during("a/b/x/y/none"));
        // p's time changed by a placeholder alone: its names are the same.
        assert!(!s.changed_during("p/added") && s.get("p").is_some());
        // Kept in the set: the stamps and the changes during the run only.
        let text = serde_json::to_string(&s).unwrap();
        assert!(
            !text.contains("started") && text.contains("during"),
            "{text}"
        );
    }
}
