//! Where change sets are kept: `$HULL_CHANGES_DIR`, else
//! `$XDG_STATE_HOME/hull/changes`, else `~/.local/state/hull/changes`
//! (0700); one directory per set, named by its ID.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{scan, Baseline, Change, ChangesError, Marks, Op};

/// What a change set records about its run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Meta {
    pub id: String,
    /// The project the run saw (the overlay's lower layer).
    pub project: PathBuf,
    pub tier: String,
    pub argv: Vec<String>,
    /// Unix seconds.
    pub created: u64,
    /// When the run ended and the upper layer was scanned.
    #[serde(default)]
    pub finished: Option<u64>,
    #[serde(default)]
    pub counts: Counts,
    /// The project's state at the start of the run, for the changed paths.
    #[serde(default)]
    pub baseline: Baseline,
    /// Where the overlay of the run keeps its marks.
    #[serde(default)]
    pub marks: Marks,
    /// The paths (relative to the project) the run's policy protected
    /// inside it, hidden or read-only: nothing at or below them, and no
    /// deletion or replacement of a directory holding one, is ever
    /// applied. Checked on the host, so a guest or command that got past
    /// the protections in its own view gains nothing by it.
    #[serde(default)]
    pub protected: Vec<String>,
    /// The project directory's identity (device, inode) when the run
    /// started: apply refuses a project that is no longer that directory
    /// (replaced, or swapped for a link, since).
    #[serde(default)]
    pub project_id: Option<(u64, u64)>,
}

/// The protected path `c` would write or remove, if any: one at or above
/// its path, or, for a deletion or a replacement of a directory, one
/// below it.
fn reaches_protected<'a>(c: &Change, protected: &'a [String]) -> Option<&'a str> {
    let removes_dir = matches!(c.op, Op::Deleted | Op::Modified)
        && matches!(c.before, Some(super::Node::Dir { .. }));
    protected
        .iter()
        .find(|p| {
            let (p, path) = (p.as_str(), c.path.as_str());
            let below = |a: &str, b: &str| a.strip_prefix(b).is_some_and(|r| r.starts_with('/'));
            path == p || below(path, p) || (removes_dir && below(p, path))
        })
        .map(String::as_str)
}

/// How many changes of each kind a set holds.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Counts {
    pub added: usize,
    pub modified: usize,
    pub deleted: usize,
    pub mode: usize,
    pub refused: usize,
}

impl Counts {
    pub fn of(changes: &[Change]) -> Counts {
        let mut c = Counts::default();
        for ch in changes {
            match ch.op {
                Op::Added => c.added += 1,
                Op::Modified => c.modified += 1,
                Op::Deleted => c.deleted += 1,
                Op::Mode => c.mode += 1,
                Op::Refused => c.refused += 1,
            }
        }
        c
    }
}

/// One change set: its directory, its record and (once finished) its
/// changes.
#[derive(Debug)]
pub struct ChangeSet {
    pub dir: PathBuf,
    pub meta: Meta,
    pub changes: Vec<Change>,
}

/// A change set's overlay directories, `layers/upper` and `layers/work`:
/// under a directory of their own, the one tier 3 serves to the guest, so
/// that nothing else of the set (its record, its baseline) is in reach of
/// the guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layers {
    pub dir: PathBuf,
    pub upper: PathBuf,
    pub work: PathBuf,
}

impl Layers {
    /// The layers of the change set in `set_dir`.
    pub fn of(set_dir: &Path) -> Layers {
        let dir = set_dir.join("layers");
        Layers {
            upper: dir.join("upper"),
            work: dir.join("work"),
            dir,
        }
    }
}

impl ChangeSet {
    /// The overlay's directories.
    pub fn layers(&self) -> Layers {
        Layers::of(&self.dir)
    }

    /// The overlay's upper layer.
    pub fn upper(&self) -> PathBuf {
        self.layers().upper
    }

    /// The overlay's work directory (same filesystem as the upper).
    pub fn work(&self) -> PathBuf {
        self.layers().work
    }

    /// The changes at or below each path of `only` (all when empty); a
    /// path with none is an error naming it.
    pub fn select(&self, only: &[String]) -> Result<Vec<&Change>, ChangesError> {
        if only.is_empty() {
            return Ok(self.changes.iter().collect());
        }
        let mut keep = vec![false; self.changes.len()];
        for p in only {
            let p = p.trim_start_matches("./").trim_end_matches('/');
            let prefix = format!("{p}/");
            let mut any = false;
            for (i, c) in self.changes.iter().enumerate() {
                if c.path == p || c.path.starts_with(&prefix) {
                    keep[i] = true;
                    any = true;
                }
            }
            if !any {
                return Err(ChangesError::NoSuchPath {
                    id: self.meta.id.clone(),
                    path: p.to_string(),
                });
            }
        }
        Ok(self
            .changes
            .iter()
            .zip(keep)
            .filter(|(_, k)| *k)
            .map(|(c, _)| c)
            .collect())
    }

    /// Records the paths the run's policy protects inside the project
    /// ([`Meta::protected`]), before the run.
    pub fn protect(&mut self, paths: Vec<String>) -> Result<(), ChangesError> {
        self.meta.protected = paths;
        write_json(&self.dir.join("meta.json"), &self.meta)
    }

    /// After the run: reads the upper layer against the project and keeps
    /// the changes and, from `baseline` (captured before the run started),
    /// the stamps of the changed paths. A change that would reach a
    /// protected path is kept as refused.
    /// The set's changes as its upper layer holds them now, nothing
    /// written: what [`ChangeSet::finish`] records, and what a set whose
    /// run is still going (a session's) shows meanwhile. A write the
    /// policy protects is `refused`.
    pub fn changes_now(&self) -> Result<Vec<Change>, ChangesError> {
        let mut changes = scan(&self.upper(), &self.meta.project, self.meta.marks)?;
        for c in &mut changes {
            if let Some(p) = reaches_protected(c, &self.meta.protected) {
                c.op = Op::Refused;
                c.reason = Some(format!(
                    "the run's policy protects {p} (hidden or read-only): the command was not \
                     to write it"
                ));
            }
        }
        Ok(changes)
    }

    pub fn finish(&mut self, baseline: &Baseline) -> Result<(), ChangesError> {
        let changes = self.changes_now()?;
        let paths: Vec<(&str, bool)> = changes
            .iter()
            .map(|c| {
                let subtree = matches!(c.before, Some(super::Node::Dir { .. }));
                (c.path.as_str(), subtree)
            })
            .collect();
        let settled = baseline.settle(&self.meta.project, &paths)?;
        // A continued set (`hull run --cow-continue`): over its earlier
        // runs' baseline.
        self.meta.baseline = match self.meta.finished {
            Some(_) => settled.over(&self.meta.baseline),
            None => settled,
        };
        self.meta.counts = Counts::of(&changes);
        self.meta.finished = Some(now());
        self.changes = changes;
        write_json(&self.dir.join("changes.json"), &self.changes)?;
        write_json(&self.dir.join("meta.json"), &self.meta)
    }
}

/// The change sets of one store.
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
}

impl Store {
    /// The store of this user (see the module's doc).
    pub fn default_root() -> PathBuf {
        if let Some(d) = &hull_exec::settings::get().changes_dir {
            return d.clone();
        }
        let state = std::env::var_os("XDG_STATE_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))
            .unwrap_or_else(std::env::temp_dir);
        state.join("hull/changes")
    }

    pub fn open(root: PathBuf) -> Store {
        Store { root }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// A new, empty change set for a run of `argv` on `project`.
    pub fn create(
        &self,
        project: &Path,
        tier: &str,
        argv: &[String],
        marks: Marks,
    ) -> Result<ChangeSet, ChangesError> {
        let io = |what: &'static str, path: &Path| {
            let path = path.to_path_buf();
            move |source| ChangesError::Io { what, path, source }
        };
        hull_exec::runtime::fsx::make_private_dir_all(&self.root)
            .map_err(io("cannot create the change-set store", &self.root))?;
        let project_id = {
            use std::os::unix::fs::MetadataExt;
            let m = std::fs::metadata(project).map_err(io("cannot stat the project", project))?;
            (m.dev(), m.ino())
        };
        let id = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
        let dir = self.root.join(&id);
        hull_exec::runtime::fsx::make_private_dir(&dir).map_err(io("cannot create", &dir))?;
        let set = ChangeSet {
            dir,
            meta: Meta {
                id,
                project: project.to_path_buf(),
                tier: tier.to_string(),
                argv: argv.to_vec(),
                created: now(),
                finished: None,
                counts: Counts::default(),
                baseline: Baseline::default(),
                marks,
                protected: Vec::new(),
                project_id: Some(project_id),
            },
            changes: Vec::new(),
        };
        let layers = set.layers();
        for d in [layers.dir, layers.upper, layers.work] {
            std::fs::create_dir(&d).map_err(io("cannot create", &d))?;
        }
        write_json(&set.dir.join("meta.json"), &set.meta)?;
        Ok(set)
    }

    fn dir_of(&self, id: &str) -> Result<PathBuf, ChangesError> {
        let ok = !id.is_empty() && id.len() <= 32 && id.bytes().all(|b| b.is_ascii_alphanumeric());
        if !ok {
            return Err(ChangesError::BadId { id: id.to_string() });
        }
        let dir = self.root.join(id);
        if !dir.join("meta.json").is_file() {
            return Err(ChangesError::NotFound {
                id: id.to_string(),
                store: self.root.clone(),
            });
        }
        Ok(dir)
    }

    /// The change set `id`, with its changes.
    pub fn get(&self, id: &str) -> Result<ChangeSet, ChangesError> {
        let dir = self.dir_of(id)?;
        let meta: Meta = read_json(&dir.join("meta.json"), id, "meta.json")?;
        let changes = if dir.join("changes.json").is_file() {
            read_json(&dir.join("changes.json"), id, "changes.json")?
        } else {
            Vec::new()
        };
        Ok(ChangeSet { dir, meta, changes })
    }

    /// The change set `id` to continue with a run on `project` whose
    /// overlay keeps `marks`: the same project, the same kind of marks, a
    /// set that was finished and is not in use by another run (an
    /// exclusive lock, held by the returned file for the run).
    pub fn resume(
        &self,
        id: &str,
        project: &Path,
        marks: Marks,
    ) -> Result<(ChangeSet, std::fs::File), ChangesError> {
        let set = self.get(id)?;
        let refuse = |why: String| ChangesError::Continue {
            id: id.to_string(),
            why,
        };
        if set.meta.project != project {
            return Err(refuse(format!(
                "it is of the project {}, not {}",
                set.meta.project.display(),
                project.display()
            )));
        }
        if set.meta.marks != marks {
            return Err(refuse(format!(
                "its overlay keeps {:?} marks, this run's would keep {:?} (another tier, or hull run as another user)",
                set.meta.marks, marks
            )));
        }
        if set.meta.finished.is_none() {
            return Err(refuse("its first run has not ended".into()));
        }
        let lock_path = set.dir.join("lock");
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|source| ChangesError::Io {
                what: "cannot open",
                path: lock_path.clone(),
                source,
            })?;
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive)
            .map_err(|_| refuse("another run is using it".into()))?;
        Ok((set, lock))
    }

    /// Every change set's record, oldest first (unreadable ones left out).
    pub fn list(&self) -> Result<Vec<Meta>, ChangesError> {
        let rd = match std::fs::read_dir(&self.root) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => {
                return Err(ChangesError::Io {
                    what: "cannot read the change-set store",
                    path: self.root.clone(),
                    source,
                })
            }
        };
        let mut out: Vec<Meta> = rd
            .flatten()
            .filter_map(|e| e.file_name().to_str().map(str::to_string))
            .filter_map(|id| {
                let dir = self.dir_of(&id).ok()?;
                read_json::<Meta>(&dir.join("meta.json"), &id, "meta.json").ok()
            })
            .collect();
        out.sort_by(|a, b| a.created.cmp(&b.created).then(a.id.cmp(&b.id)));
        Ok(out)
    }

    /// Removes the change set `id` and everything in it.
    pub fn discard(&self, id: &str) -> Result<(), ChangesError> {
        let dir = self.dir_of(id)?;
        // The overlay leaves `work/work` mode 0; make it removable. Neither
        // `work` nor `work/work` is followed if a link: on tier 3 the guest
        // could have put one there, and a chmod through it would reach a
        // host path.
        {
            use rustix::fs::{chmodat, open, statat, AtFlags, FileType, Mode, OFlags};
            let work = Layers::of(&dir).work;
            let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
            if let Ok(fd) = open(&work, flags, Mode::empty()) {
                let inner_is_dir = statat(&fd, "work", AtFlags::SYMLINK_NOFOLLOW)
                    .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Directory);
                if inner_is_dir {
                    let _ = chmodat(&fd, "work", Mode::from_raw_mode(0o700), AtFlags::empty());
                }
            }
        }
        // std's remove_dir_all does not follow symlinks (the upper layer
        // holds the command's).
        std::fs::remove_dir_all(&dir).map_err(|source| ChangesError::Io {
            what: "cannot remove",
            path: dir,
            source,
        })
    }
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn write_json<T: Serialize>(path: &Path, v: &T) -> Result<(), ChangesError> {
    let io = |source| ChangesError::Io {
        what: "cannot write",
        path: path.to_path_buf(),
        source,
    };
    let tmp = path.with_extension("json.tmp");
    let text = serde_json::to_vec(v).map_err(|e| io(std::io::Error::other(e)))?;
    std::fs::write(&tmp, text).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

fn read_json<T: serde::de::DeserializeOwned>(
    path: &Path,
    id: &str,
    file: &'static str,
) -> Result<T, ChangesError> {
    let bytes = std::fs::read(path).map_err(|source| ChangesError::Io {
        what: "cannot read",
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_slice(&bytes).map_err(|source| ChangesError::Corrupt {
        id: id.to_string(),
        file,
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A set is continued only on its project, with its kind of marks,
    /// once its first run ended, and by one run at a time.
    #[test]
    fn a_set_is_resumed_on_its_own_terms() {
        let dir = tempfile::tempdir().unwrap();
        let project = dir.path().join("p");
        std::fs::create_dir(&project).unwrap();
        let store = Store::open(dir.path().join("store"));
        let mut set = store
            .create(&project, "bwrap", &["true".into()], Marks::User)
            .unwrap();
        let id = set.meta.id.clone();
        let why = |r: Result<(ChangeSet, std::fs::File), ChangesError>| match r {
            Err(ChangesError::Continue { why, .. }) => why,
            other => panic!("{other:?}"),
        };
        assert!(why(store.resume(&id, &project, Marks::User)).contains("has not ended"));
        set.finish(&Baseline::capture(&project, &[]).unwrap())
            .unwrap();
        assert!(
            why(store.resume(&id, &dir.path().join("q"), Marks::User)).contains("of the project")
        );
        assert!(why(store.resume(&id, &project, Marks::Trusted)).contains("marks"));
        let (_set, lock) = store.resume(&id, &project, Marks::User).unwrap();
        assert!(why(store.resume(&id, &project, Marks::User)).contains("another run"));
        drop(lock);
        assert!(store.resume(&id, &project, Marks::User).is_ok());
    }

    /// A continued run's baseline keeps each path's earliest stamp.
    #[test]
    fn the_earliest_stamp_of_a_path_stands() {
        let stamp = |size| super::super::baseline::Stamp {
            mode: 0o644,
            size,
            ino: 1,
            mtime: 0,
            mtime_ns: 0,
            ctime: 0,
            ctime_ns: 0,
        };
        let mut earlier = Baseline::default();
        earlier.entries.insert("a".into(), stamp(1));
        earlier.during.insert("d".into());
        let mut now = Baseline::default();
        now.entries.insert("a".into(), stamp(2));
        now.entries.insert("b".into(), stamp(3));
        let merged = now.over(&earlier);
        assert_eq!(merged.entries["a"].size, 1);
        assert_eq!(merged.entries["b"].size, 3);
        assert!(merged.changed_during("d"));
    }
}
