//! Spare inodes: how the landlock tier lets a command create entries
//! directly in a directory that was split around protected paths.
//!
//! Landlock grants a right on everything below a directory, so a project
//! holding `.git` (read-only) and `.hull` (hidden) cannot carry "make files
//! here" without carrying it into `.git/hooks` too; the lowering splits it
//! (`policy::lower::landlock`), and nothing can be created in it by the
//! kernel's own checks. But Landlock rules belong to inodes, not names: a
//! file or directory that had a full-rights rule when the ruleset was made
//! keeps it wherever it is renamed to. So before the command starts hull
//! makes a pool of empty files and directories (`.hull/spares-<run>/f<i>`,
//! `d<i>`) on the same filesystem, the helper gives each a rule with the
//! writable rights, and when the command creates `target/` or `out.txt`
//! directly in the split directory, the broker (`tier::broker::create`)
//! renames the next spare into place (`RENAME_NOREPLACE`) instead. Nothing
//! the command names is created by the kernel on its behalf outside the
//! pool, and protected names are refused by the broker.
//!
//! The spares are reachable by path before they are used (Landlock does not
//! check the directories on the way, and the split directory's `read_dir`
//! reaches into `.hull`): a command can write into a spare early. That gives
//! it nothing the writable directory does not already give: a spare's
//! contents only ever land at a name the broker allowed. It cannot move,
//! link or remove a spare (the pool directory has no rule). The pool is
//! removed after the run, and a pool no run holds (its hull was killed) by
//! the next run on that project.

use std::collections::HashSet;
use std::os::fd::AsRawFd;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use rustix::fs::{fchown, mkdirat, openat, Mode, OFlags};
use serde::{Deserialize, Serialize};

use crate::policy::lower::landlock::Closed;
use crate::policy::{Policy, Protection};

/// Files and directories in one run's pool: the entries a command can
/// create directly in a split directory (a build makes a handful: `target/`,
/// `node_modules/`, `build/`, a lock file, objects of a flat C project).
pub const FILES: u32 = 256;
pub const DIRS: u32 = 64;

/// Prefix of a pool's directory name inside `.hull`.
const PREFIX: &str = "spares-";
/// Prefix of a pool's name before it is locked.
const MAKING: &str = "making-spares-";
/// Age after which an unlocked pool being made is taken as abandoned.
const MAKING_GRACE: std::time::Duration = std::time::Duration::from_secs(600);

/// What the helper needs to give every spare its rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpareSet {
    pub dir: PathBuf,
    pub files: u32,
    pub dirs: u32,
    /// Subdirectories the spares are spread over (`c<k>`), made in
    /// parallel: creates in one directory take its lock in turn.
    #[serde(default = "one")]
    pub chunks: u32,
}

fn one() -> u32 {
    1
}

impl SpareSet {
    /// Spare file `i`, relative to the pool directory.
    pub fn file_name(&self, i: u32) -> String {
        format!("c{}/f{i}", i % self.chunks.max(1))
    }

    /// Spare directory `i`, relative to the pool directory.
    pub fn dir_name(&self, i: u32) -> String {
        format!("c{}/d{i}", i % self.chunks.max(1))
    }

    /// Every spare's path, files then directories, with whether it is a
    /// directory.
    pub fn paths(&self) -> impl Iterator<Item = (PathBuf, bool)> + '_ {
        let files = (0..self.files).map(|i| (self.dir.join(self.file_name(i)), false));
        let dirs = (0..self.dirs).map(|i| (self.dir.join(self.dir_name(i)), true));
        files.chain(dirs)
    }
}

#[derive(Debug, thiserror::Error)]
#[error("tier landlock: cannot prepare spare entries in {path}: {source}")]
pub struct SpareError {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// One run's pool in a writable root's `.hull`; removed on drop.
#[derive(Debug)]
pub struct Pool {
    set: SpareSet,
    dir: OwnedFd,
    /// The `.hull` it is in, and its name there: removed through these,
    /// so a `.hull` replaced meanwhile does not redirect the removal.
    parent: OwnedFd,
    name: String,
    owner: Option<(u32, u32)>,
    next_file: AtomicU32,
    next_dir: AtomicU32,
    /// The pool's filesystem.
    dev: u64,
    /// Inodes of spare files handed out (only those are taken back).
    handed: Mutex<HashSet<u64>>,
    /// Spare files taken back (`r<n>`), in the order they came.
    recycled: Mutex<Vec<String>>,
    next_recycled: AtomicU32,
}

impl Pool {
    /// Makes the pool `<hull_dir>/spares-<run_id>` with `files` files and
    /// `dirs` directories, owned by `owner` when given (hull is root: the
    /// writable root's owner, whom the command's idmapped mount shows as
    /// the sandbox user). `hull_dir` must be a real directory (a symlink
    /// is refused). The pool is locked (`flock` on its directory) while it
    /// exists, made under a temporary name and renamed once locked; pools
    /// nobody holds locked (their hull was killed) are removed first.
    pub fn create(
        hull_dir: &Path,
        run_id: &str,
        owner: Option<(u32, u32)>,
        files: u32,
        dirs: u32,
    ) -> Result<Pool, SpareError> {
        let name = format!("{PREFIX}{run_id}");
        let path = hull_dir.join(&name);
        let err = |source: std::io::Error| SpareError {
            path: path.clone(),
            source,
        };
        let parent = open_dir_nofollow(rustix::fs::CWD, hull_dir).map_err(err)?;
        sweep(&parent);
        let making = format!("{MAKING}{run_id}");
        mkdirat(&parent, making.as_str(), Mode::from_raw_mode(0o700)).map_err(|e| err(e.into()))?;
        let dir = open_dir_nofollow(&parent, Path::new(&making)).map_err(err)?;
        rustix::fs::flock(&dir, rustix::fs::FlockOperation::NonBlockingLockExclusive)
            .map_err(|e| err(e.into()))?;
        rustix::fs::renameat_with(
            &parent,
            making.as_str(),
            &parent,
            name.as_str(),
            rustix::fs::RenameFlags::NOREPLACE,
        )
        .map_err(|e| err(e.into()))?;
        let dev = rustix::fs::fstat(&dir).map_err(|e| err(e.into()))?.st_dev;
        let pool = Pool {
            dir,
            parent,
            name,
            dev,
            handed: Mutex::default(),
            recycled: Mutex::default(),
            next_recycled: AtomicU32::new(0),
            set: SpareSet {
                dir: path.clone(),
                files,
                dirs,
                chunks: std::thread::available_parallelism()
                    .map_or(1, |n| n.get() as u32)
                    .clamp(1, 4),
            },
            owner,
            next_file: AtomicU32::new(0),
            next_dir: AtomicU32::new(0),
        };
        pool.fill().map_err(err)?;
        Ok(pool)
    }

    /// Makes every spare, one thread per chunk.
    fn fill(&self) -> std::io::Result<()> {
        let own = |fd: &OwnedFd| -> std::io::Result<()> {
            if let Some((u, g)) = self.owner {
                fchown(
                    fd,
                    Some(rustix::fs::Uid::from_raw(u)),
                    Some(rustix::fs::Gid::from_raw(g)),
                )?;
            }
            Ok(())
        };
        own(&self.dir)?;
        let chunks = self.set.chunks.max(1);
        let chunk = |k: u32| -> std::io::Result<()> {
            let name = format!("c{k}");
            mkdirat(&self.dir, name.as_str(), Mode::from_raw_mode(0o700))?;
            let dir = open_dir_nofollow(&self.dir, Path::new(&name))?;
            own(&dir)?;
            for i in (k..self.set.files).step_by(chunks as usize) {
                let fd = openat(
                    &dir,
                    format!("f{i}"),
                    OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::WRONLY
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o600),
                )?;
                own(&fd)?;
            }
            for i in (k..self.set.dirs).step_by(chunks as usize) {
                let name = format!("d{i}");
                mkdirat(&dir, name.as_str(), Mode::from_raw_mode(0o700))?;
                own(&open_dir_nofollow(&dir, Path::new(&name))?)?;
            }
            Ok(())
        };
        std::thread::scope(|s| {
            let made: Vec<_> = (0..chunks).map(|k| s.spawn(move || chunk(k))).collect();
            made.into_iter().try_for_each(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(std::io::Error::other("a spare maker panicked")))
            })
        })
    }

    pub fn set(&self) -> &SpareSet {
        &self.set
    }

    /// The pool directory.
    pub fn dir(&self) -> std::os::fd::BorrowedFd<'_> {
        self.dir.as_fd()
    }

    /// Who a new entry belongs to (hull is root), else None.
    pub fn owner(&self) -> Option<(u32, u32)> {
        self.owner
    }

    /// The name of the next unused spare file, or None when all are used:
    /// a fresh one, else a recycled one that no process holds open
    /// (emptied, mode 0600).
    pub fn take_file(&self) -> Option<String> {
        if let Some(i) = take(&self.next_file, self.set.files) {
            return Some(self.set.file_name(i));
        }
        let mut recycled = self.recycled.lock().unwrap_or_else(|e| e.into_inner());
        let at = recycled.iter().position(|name| self.reusable(name))?;
        Some(recycled.remove(at))
    }

    /// Records a spare handed out under another name (its inode).
    pub fn handed(&self, ino: u64) {
        self.handed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(ino);
    }

    /// Instead of removing `name` from `dir`, takes it back into the pool
    /// when it is a regular file this pool handed out with no other link;
    /// false (nothing done) otherwise. Its rule goes with the inode, so it
    /// can serve a later create once nothing holds it open.
    pub fn recycle(&self, dir: impl AsFd, name: &[u8]) -> std::io::Result<bool> {
        let st = rustix::fs::statat(&dir, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)?;
        let regular =
            rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::RegularFile;
        let ours = self
            .handed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&st.st_ino);
        if !regular || st.st_nlink != 1 || !ours || st.st_dev != self.dev {
            return Ok(false);
        }
        let n = self.next_recycled.fetch_add(1, Ordering::AcqRel);
        let back = format!("r{n}");
        rustix::fs::renameat_with(
            &dir,
            name,
            &self.dir,
            back.as_str(),
            rustix::fs::RenameFlags::NOREPLACE,
        )?;
        self.recycled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(back);
        Ok(true)
    }

    /// Whether recycled spare `name` can be handed out again: no process
    /// has it open or mapped (a write lease is granted only then), and it
    /// is emptied for its next use.
    fn reusable(&self, name: &str) -> bool {
        let Ok(fd) = openat(
            &self.dir,
            name,
            OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) else {
            return false;
        };
        // SAFETY: fcntl on a descriptor we own, integer arguments.
        let leased = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETLEASE, libc::F_WRLCK) == 0 };
        if !leased {
            return false;
        }
        // SAFETY: as above; releases the lease just taken.
        unsafe {
            libc::fcntl(fd.as_raw_fd(), libc::F_SETLEASE, libc::F_UNLCK);
        }
        rustix::fs::ftruncate(&fd, 0).is_ok()
            && rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o600)).is_ok()
    }

    /// The name of the next unused spare directory, or None.
    pub fn take_dir(&self) -> Option<String> {
        take(&self.next_dir, self.set.dirs).map(|i| self.set.dir_name(i))
    }
}

fn take(next: &AtomicU32, total: u32) -> Option<u32> {
    next.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
        (n < total).then_some(n + 1)
    })
    .ok()
}

impl Drop for Pool {
    fn drop(&mut self) {
        if let Err(e) = crate::runtime::remove_tree(&beneath(&self.parent, &self.name)) {
            tracing::warn!(
                "tier landlock: could not remove the spare entries {}: {e}",
                self.set.dir.display()
            );
        }
    }
}

/// The pools of one run, and the split directories each serves.
#[derive(Debug, Default)]
pub struct Served {
    /// Each split directory with the pool of its writable root.
    pub served: Vec<(Closed, Arc<Pool>)>,
    /// Split directories without a pool, with the reason (told to the user).
    pub unserved: Vec<(Closed, String)>,
    /// `.hull` directories hull made for the pools; released after them.
    pub placeholders: crate::runtime::placeholder::Held,
}

impl Served {
    /// One set per pool, for the helper.
    pub fn sets(&self) -> Vec<SpareSet> {
        let mut out: Vec<SpareSet> = Vec::new();
        for (_, p) in &self.served {
            if !out.contains(p.set()) {
                out.push(p.set().clone());
            }
        }
        out
    }
}

/// Makes a pool in the `.hull` of each writable root that holds a split
/// directory of `closed` (one pool per root, made once, in `run_dir`'s
/// name). A root whose `.hull` is not hidden by the policy, is not a real
/// directory, or lies on another filesystem than the split directory gets
/// none: its split directories stay closed, with the reason.
pub fn serve(policy: &Policy, closed: &[Closed], run_dir: &Path) -> Served {
    let mut out = Served::default();
    let run = ThisRun {
        id: run_dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        runs_root: run_dir.parent().unwrap_or(run_dir).to_path_buf(),
        root_user: crate::tier::identity::hull_is_root(),
    };
    let mut pools: Vec<(PathBuf, Arc<Pool>)> = Vec::new();
    for c in closed {
        let root = policy
            .writable_roots()
            .filter(|g| c.dir.starts_with(&g.path))
            .max_by_key(|g| g.path.components().count())
            .map(|g| g.path.clone());
        let pool = match root {
            None => Err("it lies in no writable root".to_string()),
            Some(root) => match pools.iter().find(|(r, _)| *r == root) {
                Some((_, p)) => Ok(Arc::clone(p)),
                None => make_pool(policy, &root, &c.dir, &run, &mut out)
                    .inspect(|p| pools.push((root.clone(), Arc::clone(p)))),
            },
        };
        match pool {
            Ok(p) => out.served.push((c.clone(), p)),
            Err(why) => out.unserved.push((c.clone(), why)),
        }
    }
    out
}

/// The run a pool is made for.
struct ThisRun {
    id: String,
    runs_root: PathBuf,
    root_user: bool,
}

fn make_pool(
    policy: &Policy,
    root: &Path,
    split: &Path,
    run: &ThisRun,
    out: &mut Served,
) -> Result<Arc<Pool>, String> {
    use std::os::unix::fs::MetadataExt;
    let hull = root.join(".hull");
    let hidden = policy
        .protects
        .iter()
        .any(|p| p.path == hull && p.protection == Protection::Hidden);
    if !hidden {
        return Err(format!("{} is not hidden by the policy", hull.display()));
    }
    let root_meta = std::fs::metadata(root).map_err(|e| format!("{}: {e}", root.display()))?;
    if std::fs::symlink_metadata(&hull).is_err() {
        let wanted = [crate::runtime::placeholder::Wanted {
            path: hull.clone(),
            root: root.to_path_buf(),
            dir: true,
        }];
        let held = crate::runtime::placeholder::hold(&wanted, &run.runs_root)
            .map_err(|e| e.to_string())?;
        out.placeholders.absorb(held);
    }
    let meta = std::fs::symlink_metadata(&hull).map_err(|e| format!("{}: {e}", hull.display()))?;
    if !meta.is_dir() {
        return Err(format!("{} is not a directory", hull.display()));
    }
    let split_dev = std::fs::metadata(split)
        .map_err(|e| format!("{}: {e}", split.display()))?
        .dev();
    if meta.dev() != split_dev {
        return Err(format!("{} is on another filesystem", hull.display()));
    }
    let owner = run.root_user.then(|| (root_meta.uid(), root_meta.gid()));
    if run.root_user && meta.uid() != root_meta.uid() && meta.mode() & 0o001 == 0 {
        return Err(format!(
            "{} belongs to uid {} (not {}'s owner) and others cannot search it, so the \
             sandbox user could not reach the entries hull prepares there",
            hull.display(),
            meta.uid(),
            root.display()
        ));
    }
    Pool::create(&hull, &run.id, owner, FILES, DIRS)
        .map(Arc::new)
        .map_err(|e| e.to_string())
}

fn open_dir_nofollow(at: impl AsFd, path: &Path) -> std::io::Result<OwnedFd> {
    Ok(openat(
        at,
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Removes the pools in `hull_dir` no run holds (locked): left by a hull
/// that was killed. One being made is given `MAKING_GRACE` to lock itself.
fn sweep(hull_dir: &OwnedFd) {
    let Ok(entries) = std::fs::read_dir(beneath(hull_dir, ".")) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let making = name.as_bytes().starts_with(MAKING.as_bytes());
        if !making && !name.as_bytes().starts_with(PREFIX.as_bytes()) {
            continue;
        }
        let Ok(st) = rustix::fs::statat(hull_dir, &name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
        else {
            continue;
        };
        let modified = std::time::UNIX_EPOCH
            + std::time::Duration::from_secs(u64::try_from(st.st_mtime).unwrap_or(0));
        let young = modified.elapsed().map_or(true, |age| age < MAKING_GRACE);
        let is_dir =
            rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Directory;
        if !is_dir || (making && young) {
            continue;
        }
        let Ok(dir) = open_dir_nofollow(hull_dir, Path::new(&name)) else {
            continue;
        };
        if rustix::fs::flock(&dir, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_ok() {
            let _ = crate::runtime::remove_tree(&beneath(hull_dir, &name));
        }
    }
}

/// `name` in the directory `dir` is open on, as a path that goes through
/// that descriptor (`/proc/self/fd/N/name`), not through its path.
fn beneath(dir: &OwnedFd, name: impl AsRef<std::ffi::OsStr>) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd())).join(name.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_is_made_handed_out_once_each_and_removed() {
        let d = tempfile::tempdir().unwrap();
        let hull = d.path().join(".hull");
        std::fs::create_dir(&hull).unwrap();
        std::fs::create_dir(hull.join("spares-old")).unwrap();
        std::fs::write(hull.join("spares-old/f0"), "").unwrap();
        let live = Pool::create(&hull, "live", None, 1, 1).unwrap();
        std::fs::create_dir(hull.join("making-spares-new")).unwrap();
        let pool = Pool::create(&hull, "r1", None, 3, 2).unwrap();
        assert!(!hull.join("spares-old").exists(), "an unheld pool is swept");
        assert!(hull.join("spares-live").exists(), "a held pool is kept");
        assert!(
            hull.join("making-spares-new").exists(),
            "one being made is kept"
        );
        drop(live);
        let set = pool.set().clone();
        let paths: Vec<_> = set.paths().collect();
        assert_eq!(paths.len(), 5);
        for (p, is_dir) in &paths {
            let m = std::fs::symlink_metadata(p).unwrap();
            assert_eq!(m.is_dir(), *is_dir, "{}", p.display());
        }
        let files: Vec<_> = std::iter::from_fn(|| pool.take_file()).collect();
        let want: Vec<_> = (0..3).map(|i| set.file_name(i)).collect();
        assert_eq!(files, want);
        assert_eq!(pool.take_dir(), Some(set.dir_name(0)));
        assert_eq!(pool.take_dir(), Some(set.dir_name(1)));
        assert_eq!(pool.take_dir(), None);
        drop(pool);
        assert!(!set.dir.exists(), "removed after the run");
        assert!(hull.exists());
    }

    #[test]
    fn a_linked_hull_dir_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let elsewhere = d.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, d.path().join(".hull")).unwrap();
        let e = Pool::create(&d.path().join(".hull"), "r", None, 1, 1).unwrap_err();
        assert!(e.to_string().contains(".hull"), "{e}");
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
    }
}
