//! Cleanup of run dirs nobody uses, and the listing behind `hull runs list`.
//!
//! Rules, applied only to a run dir whose `.active` this process can lock
//! exclusively without waiting (a held lock means in use: nothing in that dir
//! is touched, whatever its age):
//! - `tmp/` is removed, with any other per-run scratch hull keeps in the run
//!   dir (everything but `.active` and `spill/`, such as bwrap's mask files);
//! - spill files and logs older than `HULL_RUNS_MAX_AGE` (default
//!   [`SPILL_MAX_AGE`], by modification time) are removed;
//! - when the spill is then empty, the run dir itself is removed;
//! - beyond `HULL_RUNS_KEEP` (default [`RUNS_KEEP`]) idle run dirs, the
//!   oldest go whole, spill and all.
//!
//! A run that made its instance removes its run dir itself when it ends
//! with nothing to keep ([`finish_locked`]); [`gc_if_due`] runs a pass
//! from `hull run` at most every [`GC_INTERVAL`]: no manual `hull runs gc`
//! is needed.
//!
//! What a crashed run left outside its directory (a tier-3 run's QEMU and
//! virtiofsd, the placeholders they hold) is not the runtime's to know: the
//! caller passes a [`Reclaim`] that a pass calls, under the run dir's
//! exclusive lock, before the scratch that names those goes.
//!
//! Staging dirs (`.new-<uuid>`, an instance being created) are left alone for
//! [`STAGING_GRACE`], then treated the same way (a crashed creator). A run
//! dir without `.active` is only removed when it is empty. Names that are not
//! run dirs are never touched.

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::Serialize;

use super::{fsx, lock, InstanceId, LOCK_FILE, LOGS_DIR, SPILL_DIR, TMP_DIR};

/// What a pass calls on an idle run dir before cleaning it (its exclusive
/// lock held): the tiers end what a crashed run of theirs left running.
pub type Reclaim<'a> = &'a dyn Fn(&Path);

/// How long spill files are kept, unless `HULL_RUNS_MAX_AGE` says.
pub const SPILL_MAX_AGE: Duration = Duration::from_secs(24 * 3600);
/// How many idle run dirs a pass keeps, unless `HULL_RUNS_KEEP` says.
pub const RUNS_KEEP: usize = 200;
/// How long a staging dir is left alone.
pub const STAGING_GRACE: Duration = Duration::from_secs(3600);
/// [`gc_if_due`] runs a pass at most this often.
pub const GC_INTERVAL: Duration = Duration::from_secs(600);
/// File in the runs root whose modification time records the last pass.
const STAMP: &str = ".gc-stamp";

/// Errors reading the runs root. Errors inside one run dir do not stop a
/// pass; they are reported as [`GcOutcome::Failed`].
#[derive(Debug, thiserror::Error)]
pub enum GcError {
    #[error("reading runs root {path:?}: {source}")]
    ReadRoot {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// One cleanup pass.
#[derive(Debug, Clone, Serialize)]
pub struct GcReport {
    pub root: PathBuf,
    pub entries: Vec<GcEntry>,
}

/// What a pass did with one run dir.
#[derive(Debug, Clone, Serialize)]
pub struct GcEntry {
    /// The directory's name (an instance id, or `.new-…` for staging).
    pub name: String,
    #[serde(flatten)]
    pub outcome: GcOutcome,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum GcOutcome {
    /// Its lock is held: not touched.
    InUse,
    /// Idle: cleaned by the rules above.
    Cleaned {
        tmp_removed: bool,
        spill_removed: u64,
        spill_kept: u64,
        bytes_freed: u64,
        dir_removed: bool,
    },
    /// Left alone for the given reason.
    Skipped { reason: String },
    /// Cleaning failed part way; the error says where.
    Failed { error: String },
}

/// Whether a run dir is in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Some process holds its lock.
    Active,
    /// Nobody holds it: cleanup may remove its tmp and old spill.
    Idle,
    /// It has no `.active` (damaged): cleanup leaves it unless empty.
    NoLock,
}

/// One run dir, for `hull runs list`.
#[derive(Debug, Clone, Serialize)]
pub struct RunInfo {
    pub id: InstanceId,
    pub dir: PathBuf,
    pub state: RunState,
    /// When the instance was created (the lock file's modification time;
    /// hull never writes to it).
    #[serde(serialize_with = "ser_time")]
    pub created: Option<SystemTime>,
    pub tmp_bytes: u64,
    pub spill_bytes: u64,
    pub spill_files: u64,
}

fn ser_time<S: serde::Serializer>(t: &Option<SystemTime>, s: S) -> Result<S::Ok, S::Error> {
    match t {
        Some(t) => s.collect_str(&humantime::format_rfc3339_seconds(*t)),
        None => s.serialize_none(),
    }
}

enum Kind {
    Run,
    Staging,
}

fn classify(name: &str) -> Option<Kind> {
    if InstanceId::from_dir_name(name).is_some() {
        Some(Kind::Run)
    } else if name
        .strip_prefix(".new-")
        .and_then(InstanceId::from_dir_name)
        .is_some()
    {
        Some(Kind::Staging)
    } else {
        None
    }
}

fn read_root(root: &Path) -> Result<Vec<(String, PathBuf)>, GcError> {
    let rd = match std::fs::read_dir(root) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(GcError::ReadRoot {
                path: root.to_path_buf(),
                source,
            })
        }
    };
    let mut out = Vec::new();
    for e in rd {
        let e = e.map_err(|source| GcError::ReadRoot {
            path: root.to_path_buf(),
            source,
        })?;
        if let Some(name) = e.file_name().to_str() {
            out.push((name.to_string(), e.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// One cleanup pass over every run dir under `root` (see the module docs for
/// the rules). A missing root is an empty pass.
pub fn gc(root: &Path, reclaim: Reclaim<'_>) -> Result<GcReport, GcError> {
    let settings = crate::settings::get();
    gc_with(
        root,
        reclaim,
        settings.runs_max_age.unwrap_or(SPILL_MAX_AGE),
        settings.runs_keep.unwrap_or(RUNS_KEEP),
    )
}

/// [`gc`] with its bounds: spill and logs older than `max_age` go, and
/// idle run dirs beyond `keep` go whole, oldest first.
pub(crate) fn gc_with(
    root: &Path,
    reclaim: Reclaim<'_>,
    max_age: Duration,
    keep: usize,
) -> Result<GcReport, GcError> {
    let now = SystemTime::now();
    let mut entries = Vec::new();
    // Idle run dirs a pass kept, with when each was made.
    let mut kept: Vec<(Option<SystemTime>, usize, PathBuf)> = Vec::new();
    for (name, path) in read_root(root)? {
        let Some(kind) = classify(&name) else {
            continue;
        };
        let is_run = matches!(kind, Kind::Run);
        let outcome = match clean_one(&path, kind, now, Some(max_age), reclaim) {
            Ok(o) => o,
            Err(e) => GcOutcome::Failed {
                error: format!("{}: {e}", path.display()),
            },
        };
        if is_run
            && matches!(
                outcome,
                GcOutcome::Cleaned {
                    dir_removed: false,
                    ..
                }
            )
        {
            let made = std::fs::symlink_metadata(path.join(LOCK_FILE))
                .and_then(|m| m.modified())
                .ok();
            kept.push((made, entries.len(), path));
        }
        entries.push(GcEntry { name, outcome });
    }
    // Over the bound: the oldest go, whatever their spill holds (each
    // only while idle: its lock taken again).
    kept.sort();
    let over = kept.len().saturating_sub(keep);
    for (_, i, path) in kept.into_iter().take(over) {
        let outcome = match clean_one(&path, Kind::Run, now, None, reclaim) {
            Ok(GcOutcome::Cleaned {
                tmp_removed,
                spill_removed,
                bytes_freed,
                dir_removed,
                ..
            }) => {
                let GcOutcome::Cleaned {
                    tmp_removed: t,
                    spill_removed: s,
                    bytes_freed: b,
                    ..
                } = entries[i].outcome
                else {
                    continue;
                };
                GcOutcome::Cleaned {
                    tmp_removed: tmp_removed || t,
                    spill_removed: spill_removed + s,
                    spill_kept: 0,
                    bytes_freed: bytes_freed + b,
                    dir_removed,
                }
            }
            Ok(other) => other,
            Err(e) => GcOutcome::Failed {
                error: format!("{}: {e}", path.display()),
            },
        };
        entries[i].outcome = outcome;
    }
    Ok(GcReport {
        root: root.to_path_buf(),
        entries,
    })
}

/// The cheap pass for hull's start: runs [`gc`] only when the last pass
/// (recorded in `<root>/.gc-stamp`) is older than [`GC_INTERVAL`] or
/// unknown, so starting many hulls does not rescan the root each time.
/// `Ok(None)` when no pass was due or the root does not exist.
pub fn gc_if_due(root: &Path, reclaim: Reclaim<'_>) -> Result<Option<GcReport>, GcError> {
    if !root.is_dir() {
        return Ok(None);
    }
    let stamp = root.join(STAMP);
    if let Ok(md) = std::fs::symlink_metadata(&stamp) {
        let recent = md
            .modified()
            .ok()
            .and_then(|m| SystemTime::now().duration_since(m).ok())
            .is_some_and(|age| age < GC_INTERVAL);
        if md.is_file() && recent {
            return Ok(None);
        }
        let _ = std::fs::remove_file(&stamp);
    }
    // Best effort: without a stamp the next start simply runs a pass again.
    let _ = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&stamp);
    gc(root, reclaim).map(Some)
}

fn older_than(md: &std::fs::Metadata, now: SystemTime, age: Duration) -> bool {
    md.modified()
        .ok()
        .and_then(|m| now.duration_since(m).ok())
        .is_some_and(|a| a > age)
}

/// `max_age`: spill files and logs older go; `None`: all go.
fn clean_one(
    dir: &Path,
    kind: Kind,
    now: SystemTime,
    max_age: Option<Duration>,
    reclaim: Reclaim<'_>,
) -> io::Result<GcOutcome> {
    let md = std::fs::symlink_metadata(dir)?;
    if !md.is_dir() {
        return Ok(GcOutcome::Skipped {
            reason: "not a directory".into(),
        });
    }
    if matches!(kind, Kind::Staging) && !older_than(&md, now, STAGING_GRACE) {
        return Ok(GcOutcome::Skipped {
            reason: "being created".into(),
        });
    }
    let lock_path = dir.join(LOCK_FILE);
    if std::fs::symlink_metadata(&lock_path).is_err() {
        // No lock file: we cannot know whether it is in use. Only an empty
        // dir (a cleanup interrupted after removing `.active`) goes.
        return Ok(match std::fs::remove_dir(dir) {
            Ok(()) => GcOutcome::Cleaned {
                tmp_removed: false,
                spill_removed: 0,
                spill_kept: 0,
                bytes_freed: 0,
                dir_removed: true,
            },
            Err(_) => GcOutcome::Skipped {
                reason: "no .active lock file; not empty, left alone".into(),
            },
        });
    }
    let Some(excl) = lock::try_exclusive(&lock_path)? else {
        return Ok(GcOutcome::InUse);
    };
    // Holding the exclusive lock: no process uses this dir, and none can
    // join it until we release.
    match kind {
        Kind::Run => {
            // A crashed tier-3 run's QEMU and virtiofsd (and the
            // placeholders they keep in shared dirs) go before the scratch
            // that names them.
            reclaim(dir);
            clean_locked(dir, &lock_path, excl, now, max_age)
        }
        Kind::Staging => {
            let (bytes, _) = fsx::tree_usage(dir)?;
            std::fs::remove_file(&lock_path)?;
            drop(excl);
            fsx::remove_tree(dir)?;
            Ok(GcOutcome::Cleaned {
                tmp_removed: true,
                spill_removed: 0,
                spill_kept: 0,
                bytes_freed: bytes,
                dir_removed: true,
            })
        }
    }
}

/// Removes a run dir's per-run scratch: `tmp/` and anything else hull keeps
/// there for a run (bwrap's mask files), everything but `.active`,
/// `spill/` and `logs/`. Only call it under the exclusive lock. Returns whether `tmp/`
/// existed and the bytes freed.
pub(crate) fn remove_scratch(dir: &Path) -> io::Result<(bool, u64)> {
    let mut tmp_removed = false;
    let mut bytes = 0u64;
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((false, 0)),
        Err(e) => return Err(e),
    };
    for e in rd {
        let e = e?;
        let name = e.file_name();
        if name == LOCK_FILE || name == SPILL_DIR || name == LOGS_DIR {
            continue;
        }
        let p = e.path();
        // bwrap's masks are mode 0 (a denied path reads as denied, not
        // as empty): they are opened up before they are read.
        bytes += match fsx::tree_usage(&p) {
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                fsx::open_up(&p)?;
                fsx::tree_usage(&p)?
            }
            r => r?,
        }
        .0;
        if std::fs::symlink_metadata(&p)?.is_dir() {
            fsx::remove_tree(&p)?;
        } else {
            std::fs::remove_file(&p)?;
        }
        tmp_removed |= name == TMP_DIR;
    }
    Ok((tmp_removed, bytes))
}

/// At the end of a run that made its instance, while `excl` holds its
/// lock exclusively: removes the scratch, and the run dir too when its
/// spill and logs are empty (nothing to keep). Returns whether the dir
/// went.
pub(crate) fn finish_locked(dir: &Path, lock_path: &Path, excl: std::fs::File) -> io::Result<bool> {
    let outcome = clean_locked(dir, lock_path, excl, SystemTime::now(), Some(Duration::MAX))?;
    Ok(matches!(
        outcome,
        GcOutcome::Cleaned {
            dir_removed: true,
            ..
        }
    ))
}

/// Cleans a run dir while `excl` holds its lock exclusively: spill files
/// and logs older than `max_age` go (`None`: all of them).
fn clean_locked(
    dir: &Path,
    lock_path: &Path,
    excl: std::fs::File,
    now: SystemTime,
    max_age: Option<Duration>,
) -> io::Result<GcOutcome> {
    let (tmp_removed, mut bytes_freed) = remove_scratch(dir)?;
    let spill = dir.join(SPILL_DIR);
    let (spill_removed, spill_kept, b) = remove_aged(&spill, now, max_age)?;
    bytes_freed += b;
    let logs = dir.join(LOGS_DIR);
    let (_, logs_kept, b) = remove_aged(&logs, now, max_age)?;
    bytes_freed += b;
    if logs_kept == 0 {
        match std::fs::remove_dir(&logs) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    let mut dir_removed = false;
    if spill_kept == 0 && logs_kept == 0 {
        match std::fs::remove_dir(&spill) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        // Removing `.active` while holding it: a process waiting to join
        // sees that the file it locked is gone and reports the instance gone.
        // (On Windows the removal completes when our handle closes.)
        std::fs::remove_file(lock_path)?;
        drop(excl);
        std::fs::remove_dir(dir)?;
        dir_removed = true;
    } else {
        drop(excl);
    }
    Ok(GcOutcome::Cleaned {
        tmp_removed,
        spill_removed,
        spill_kept,
        bytes_freed,
        dir_removed,
    })
}

/// Removes the entries of `dir` older than `max_age` (`None`: all);
/// returns how many were removed and kept, and the bytes freed. A missing
/// dir is empty.
fn remove_aged(
    dir: &Path,
    now: SystemTime,
    max_age: Option<Duration>,
) -> io::Result<(u64, u64, u64)> {
    let (mut removed, mut kept, mut bytes) = (0u64, 0u64, 0u64);
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((0, 0, 0)),
        Err(e) => return Err(e),
    };
    for e in rd {
        let p = e?.path();
        let md = std::fs::symlink_metadata(&p)?;
        if max_age.is_none_or(|age| older_than(&md, now, age)) {
            bytes += fsx::tree_usage(&p)?.0;
            if md.is_dir() {
                fsx::remove_tree(&p)?;
            } else {
                std::fs::remove_file(&p)?;
            }
            removed += 1;
        } else {
            kept += 1;
        }
    }
    Ok((removed, kept, bytes))
}

/// Every run dir under `root` with its state and sizes. A missing root is
/// an empty list. Probing the state takes the exclusive lock for an instant
/// (a process joining at that moment waits for it).
pub fn list(root: &Path) -> Result<Vec<RunInfo>, GcError> {
    let mut out = Vec::new();
    for (name, path) in read_root(root)? {
        let Some(id) = InstanceId::from_dir_name(&name) else {
            continue;
        };
        if !std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
            continue;
        }
        let lock_path = path.join(LOCK_FILE);
        let lock_md = std::fs::symlink_metadata(&lock_path).ok();
        let state = match &lock_md {
            None => RunState::NoLock,
            Some(_) => match lock::try_exclusive(&lock_path) {
                Ok(Some(_)) => RunState::Idle,
                Ok(None) | Err(_) => RunState::Active,
            },
        };
        let (tmp_bytes, _) = fsx::tree_usage(&path.join(TMP_DIR)).unwrap_or((0, 0));
        let (spill_bytes, spill_files) = fsx::tree_usage(&path.join(SPILL_DIR)).unwrap_or((0, 0));
        out.push(RunInfo {
            id,
            dir: path,
            state,
            created: lock_md.and_then(|m| m.modified().ok()),
            tmp_bytes,
            spill_bytes,
            spill_files,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::Instance;

    /// Sets a file's modification time `age` into the past.
    pub(crate) fn age_file(p: &Path, age: Duration) {
        let t = SystemTime::now() - age;
        let f = std::fs::File::options().write(true).open(p).unwrap();
        f.set_modified(t).unwrap();
    }

    #[test]
    fn in_process_rules() {
        let _serial = crate::runtime::serial();
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("runs");
        let busy = Instance::create(&root).unwrap();
        std::fs::write(busy.tmp().join("t"), b"t").unwrap();
        std::fs::write(busy.spill().join("old.txt"), b"o").unwrap();
        age_file(&busy.spill().join("old.txt"), SPILL_MAX_AGE * 2);

        let idle = Instance::create(&root).unwrap();
        std::fs::write(idle.tmp().join("t"), b"tt").unwrap();
        std::fs::write(idle.spill().join("fresh.txt"), b"f").unwrap();
        std::fs::write(idle.spill().join("old.txt"), b"ooo").unwrap();
        age_file(
            &idle.spill().join("old.txt"),
            SPILL_MAX_AGE + Duration::from_secs(60),
        );
        let idle_dir = idle.dir().to_path_buf();
        drop(idle); // released, tmp still there

        let empty = Instance::create(&root).unwrap();
        let empty_dir = empty.dir().to_path_buf();
        std::fs::create_dir_all(empty_dir.join("mask/dir")).unwrap();
        std::fs::write(empty_dir.join("mask/file"), b"").unwrap();
        drop(empty);

        // Not ours: never touched.
        std::fs::create_dir(root.join("not-a-run")).unwrap();

        // The tiers' reclaim runs on each idle run dir, under its lock,
        // while the scratch is still there; never on a busy one.
        let reclaimed = std::cell::RefCell::new(Vec::new());
        let r = gc(&root, &|dir: &Path| {
            reclaimed
                .borrow_mut()
                .push((dir.to_path_buf(), dir.join(TMP_DIR).exists()))
        })
        .unwrap();
        let mut reclaimed = reclaimed.into_inner();
        reclaimed.sort();
        let mut want = vec![(idle_dir.clone(), true), (empty_dir.clone(), true)];
        want.sort();
        assert_eq!(reclaimed, want);
        let by = |dir: &Path| {
            let n = dir.file_name().unwrap().to_str().unwrap();
            r.entries
                .iter()
                .find(|e| e.name == n)
                .unwrap()
                .outcome
                .clone()
        };
        assert_eq!(by(busy.dir()), GcOutcome::InUse);
        assert!(busy.tmp().join("t").is_file());
        assert!(
            busy.spill().join("old.txt").is_file(),
            "held: old spill kept"
        );
        assert_eq!(
            by(&idle_dir),
            GcOutcome::Cleaned {
                tmp_removed: true,
                spill_removed: 1,
                spill_kept: 1,
                bytes_freed: 5,
                dir_removed: false
            }
        );
        assert!(!idle_dir.join(TMP_DIR).exists());
        assert!(idle_dir.join("spill/fresh.txt").is_file());
        assert!(!idle_dir.join("spill/old.txt").exists());
        assert!(matches!(
            by(&empty_dir),
            GcOutcome::Cleaned {
                dir_removed: true,
                ..
            }
        ));
        assert!(!empty_dir.exists());
        assert!(root.join("not-a-run").is_dir());
        assert_eq!(r.entries.len(), 3);

        let l = list(&root).unwrap();
        assert_eq!(l.len(), 2);
        let b = l.iter().find(|i| i.id == busy.id()).unwrap();
        assert_eq!(b.state, RunState::Active);
        assert_eq!((b.tmp_bytes, b.spill_bytes, b.spill_files), (1, 1, 1));
        let i = l.iter().find(|i| i.dir == idle_dir).unwrap();
        assert_eq!(i.state, RunState::Idle);
        assert_eq!((i.tmp_bytes, i.spill_files), (0, 1));
        assert!(i.created.is_some());
    }

    /// hull's own logs (a tier-3 run's console) outlive the run like the
    /// spill: kept while young, removed when old, and the run dir goes only
    /// when both are empty.
    #[test]
    fn logs_are_kept_like_the_spill() {
        let _serial = crate::runtime::serial();
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("runs");
        let i = Instance::create(&root).unwrap();
        let dir = i.dir().to_path_buf();
        let logs = dir.join(LOGS_DIR).join("vm-1");
        std::fs::create_dir_all(&logs).unwrap();
        std::fs::write(logs.join("console.log"), b"boot\n").unwrap();
        drop(i);
        gc(&root, &|_| {}).unwrap();
        assert!(logs.join("console.log").is_file(), "young logs are kept");
        assert!(!dir.join(TMP_DIR).exists());
        let t = SystemTime::now() - SPILL_MAX_AGE * 2;
        std::fs::File::open(&logs).unwrap().set_modified(t).unwrap();
        gc(&root, &|_| {}).unwrap();
        assert!(
            !dir.exists(),
            "old logs go, and the empty run dir with them"
        );
    }

    #[test]
    fn staging_left_alone_while_young_and_due_runs_once() {
        let _serial = crate::runtime::serial();
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("runs");
        std::fs::create_dir(&root).unwrap();
        let st = root.join(format!(".new-{}", InstanceId::new()));
        std::fs::create_dir(&st).unwrap();
        std::fs::write(st.join(LOCK_FILE), b"").unwrap();
        let r = gc_if_due(&root, &|_| {})
            .unwrap()
            .expect("first pass is due");
        assert!(matches!(r.entries[0].outcome, GcOutcome::Skipped { .. }));
        assert!(st.is_dir());
        assert!(
            gc_if_due(&root, &|_| {}).unwrap().is_none(),
            "stamp is fresh"
        );
        // An old staging dir of a crashed creator goes.
        let f = std::fs::File::open(&st).unwrap();
        f.set_modified(SystemTime::now() - 2 * STAGING_GRACE)
            .unwrap();
        drop(f);
        let r = gc(&root, &|_| {}).unwrap();
        assert!(matches!(
            r.entries[0].outcome,
            GcOutcome::Cleaned {
                dir_removed: true,
                ..
            }
        ));
        assert!(!st.exists());
    }
}
