//! The project's state at the start of a copy-on-write run: one stamp per
//! entry (type, mode, size, inode, modification and change times), so that
//! applying a change set can tell a path the project changed since (a
//! conflict, left alone) from one it did not.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{is_protected, ChangesError, MAX_BASELINE, MAX_DEPTH};

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

/// Stamps of a project's entries by relative path (`/`-separated), `.git`
/// and `.hull` left out (a change set never touches them).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Baseline {
    pub entries: BTreeMap<String, Stamp>,
}

impl Baseline {
    /// Walks `project` without following links (at most [`MAX_BASELINE`]
    /// entries, [`MAX_DEPTH`] levels). Names that are not UTF-8 are left
    /// out: a change to one is refused anyway.
    pub fn capture(project: &Path) -> Result<Baseline, ChangesError> {
        let mut b = Baseline::default();
        b.walk(project, "", 0)?;
        Ok(b)
    }

    fn walk(&mut self, dir: &Path, rel: &str, depth: usize) -> Result<(), ChangesError> {
        if depth > MAX_DEPTH {
            return Err(ChangesError::TooDeep {
                path: dir.to_path_buf(),
            });
        }
        let io = |source| ChangesError::Io {
            what: "cannot read the project directory",
            path: dir.to_path_buf(),
            source,
        };
        let mut names: Vec<_> = std::fs::read_dir(dir)
            .map_err(io)?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()
            .map_err(io)?;
        names.sort();
        for name in names {
            let Some(name) = name.to_str() else { continue };
            let path = if rel.is_empty() {
                name.to_string()
            } else {
                format!("{rel}/{name}")
            };
            if is_protected(&path) {
                continue;
            }
            let full = dir.join(name);
            let m = std::fs::symlink_metadata(&full).map_err(|source| ChangesError::Io {
                what: "cannot stat",
                path: full.clone(),
                source,
            })?;
            if self.entries.len() >= MAX_BASELINE {
                return Err(ChangesError::TooMany {
                    path: dir.to_path_buf(),
                    what: "entries in the project",
                    limit: MAX_BASELINE,
                });
            }
            self.entries.insert(path.clone(), Stamp::of(&m));
            if m.is_dir() {
                self.walk(&full, &path, depth + 1)?;
            }
        }
        Ok(())
    }

    pub fn get(&self, path: &str) -> Option<&Stamp> {
        self.entries.get(path)
    }

    /// The entries strictly below `dir`.
    pub fn below<'a>(&'a self, dir: &str) -> impl Iterator<Item = (&'a String, &'a Stamp)> + 'a {
        let prefix = format!("{dir}/");
        self.entries
            .range(prefix.clone()..)
            .take_while(move |(k, _)| k.starts_with(&prefix))
    }

    /// Only what the paths of `changes` need: each path, and for a deleted
    /// or replaced directory everything below it.
    pub fn restrict(&self, paths: &[(&str, bool)]) -> Baseline {
        let mut out = Baseline::default();
        for (p, subtree) in paths {
            if let Some(s) = self.entries.get(*p) {
                out.entries.insert((*p).to_string(), *s);
            }
            if *subtree {
                for (k, s) in self.below(p) {
                    out.entries.insert(k.clone(), *s);
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_skips_protected_and_sees_changes() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("a/b")).unwrap();
        std::fs::create_dir_all(d.path().join(".git/hooks")).unwrap();
        std::fs::write(d.path().join("a/b/f"), "x").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", d.path().join("l")).unwrap();
        let b = Baseline::capture(d.path()).unwrap();
        let keys: Vec<_> = b.entries.keys().cloned().collect();
        assert_eq!(keys, ["a", "a/b", "a/b/f", "l"]);
        assert_eq!(b.below("a").count(), 2);
        std::fs::write(d.path().join("a/b/f"), "y").unwrap();
        let again = Baseline::capture(d.path()).unwrap();
        assert_ne!(b.get("a/b/f"), again.get("a/b/f"));
        assert_eq!(b.get("l"), again.get("l"));
        let r = b.restrict(&[("a", true), ("l", false)]);
        assert_eq!(r.entries.len(), 4);
    }
}
