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
//! link or remove a spare (the pool directory has no rule).
//!
//! Where the pool lives: a project with no `.hull` of its own (as agent
//! harnesses make them, one per sample) takes a pool from hull's runs root
//! (`<runs>/spares/spares-<run>`), when the runs root is on the split
//! directory's mount (a rename does not cross mounts) and hidden by the
//! policy: pools there serve every project on that mount, one run at a
//! time, and nothing is made in the project. The runs root is hull's
//! user's and nobody else's to write (`runtime`), `spares/` is 0700: when
//! hull is root the command's sandbox user cannot even reach a spare
//! there by path. A project that has a `.hull` keeps its pool there, as
//! does one on another mount than the runs root (hull then makes a
//! `.hull` for the run and removes it with the pool afterwards).
//!
//! A kept pool outlives its run and the next run adopts it (making 320
//! inodes and removing them again cost 5-200 ms a run on ext4, whose
//! inode allocator slows down as recently freed inodes pile up; adopting
//! costs a `stat` a spare). On adoption every spare is checked against
//! the pool's seal: the coarse
//! clock time hull wrote once it had made the spares, before any command
//! ran. A spare whose ctime is not before the seal was changed since
//! (written, chmod, an xattr or ACL set, an entry made inside it: each
//! moves the ctime, which no process can set back) and is replaced, as is
//! one of the wrong type, owner, mode, size or link count; recycled
//! spares are removed. A pool with no valid seal is removed whole; one
//! sealed for another owner is left to that owner's runs. When every
//! spare was intact the seal stands; when some were made, the pool is
//! sealed anew and the spares kept are checked once more. Pools are
//! locked (`flock`) while a run holds them, so concurrent runs each take
//! their own.
//!
//! The pool cannot grow while the command runs: a Landlock ruleset is
//! fixed once the command's process restricts itself, and a rule belongs
//! to an inode that existed then, so every spare is made before.

// A command can write the trees this module works on: no path-based
// filesystem call (clippy.toml).
#![deny(clippy::disallowed_methods)]

use std::collections::HashSet;
use std::ffi::OsStr;
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
/// The seal's file in a pool directory.
const SEAL: &str = "seal";
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

    /// Every spare's name relative to the pool directory, files then
    /// directories, with whether it is a directory.
    pub fn names(&self) -> impl Iterator<Item = (String, bool)> + '_ {
        let files = (0..self.files).map(|i| (self.file_name(i), false));
        let dirs = (0..self.dirs).map(|i| (self.dir_name(i), true));
        files.chain(dirs)
    }

    /// Every spare's path, files then directories, with whether it is a
    /// directory.
    pub fn paths(&self) -> impl Iterator<Item = (PathBuf, bool)> + '_ {
        self.names().map(|(n, d)| (self.dir.join(n), d))
    }
}

#[derive(Debug, thiserror::Error)]
#[error("tier landlock: cannot prepare spare entries in {path}: {source}")]
pub struct SpareError {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// One run's pool in a writable root's `.hull`: kept for the next run when
/// the `.hull` was there before (see the module comment), else removed on
/// drop with the `.hull` hull made for it.
#[derive(Debug)]
pub struct Pool {
    set: SpareSet,
    dir: OwnedFd,
    /// The `.hull` it is in and its name there, when it goes with the run:
    /// removed through these, so a `.hull` replaced meanwhile does not
    /// redirect the removal.
    remove: Option<(OwnedFd, String)>,
    owner: Option<(u32, u32)>,
    next_file: AtomicU32,
    next_dir: AtomicU32,
    /// The pool's filesystem.
    dev: u64,
    /// Inodes of spare files handed out (only those are taken back).
    handed: Mutex<HashSet<u64>>,
    /// Spare files taken back (`r<n>`), in the order they came.
    recycled: Mutex<Vec<String>>,
    /// Spare directories taken back (`r<n>` too), emptied by the command.
    recycled_dirs: Mutex<Vec<String>>,
    next_recycled: AtomicU32,
    /// The spares' descriptors until the run's rules are bound.
    rule_fds: Mutex<Vec<(bool, OwnedFd)>>,
}

impl Pool {
    /// Takes a pool in `hull_dir` with `files` files and `dirs`
    /// directories, owned by `owner` when given (hull is root: the
    /// writable root's owner, whom the command's idmapped mount shows as
    /// the sandbox user): an idle one, checked and topped up, else a new
    /// `<hull_dir>/spares-<run_id>`. `hull_dir` must be a real directory (a
    /// symlink is refused). The pool is locked (`flock` on its directory)
    /// while a run holds it; a new one is made under a temporary name and
    /// renamed once locked. Pools that cannot be adopted (no valid seal:
    /// their maker was killed) are removed.
    #[cfg(test)]
    pub fn create(
        hull_dir: &Path,
        run_id: &str,
        owner: Option<(u32, u32)>,
        files: u32,
        dirs: u32,
        keep: bool,
    ) -> Result<Pool, SpareError> {
        let parent = open_dir_nofollow(rustix::fs::CWD, hull_dir).map_err(|source| SpareError {
            path: hull_dir.to_path_buf(),
            source,
        })?;
        Pool::create_in(parent, hull_dir, run_id, owner, files, dirs, keep)
    }

    /// [`Pool::create`] in the `.hull` directory `parent` is open on
    /// (`hull_dir` names it in messages and the helper's plan only).
    pub fn create_in(
        parent: OwnedFd,
        hull_dir: &Path,
        run_id: &str,
        owner: Option<(u32, u32)>,
        files: u32,
        dirs: u32,
        keep: bool,
    ) -> Result<Pool, SpareError> {
        let name = format!("{PREFIX}{run_id}");
        let path = hull_dir.join(&name);
        let err = |source: std::io::Error| SpareError {
            path: path.clone(),
            source,
        };
        let chunks = std::thread::available_parallelism()
            .map_or(1, |n| n.get() as u32)
            .clamp(1, 4);
        let want = Seal {
            time: (0, 0),
            owner: owner_or_self(owner),
            files,
            dirs,
            chunks,
        };
        if let Some((dir, name)) = keep.then(|| adopt(&parent, &want)).flatten() {
            let path = hull_dir.join(&name);
            let err = |source: std::io::Error| SpareError {
                path: path.clone(),
                source,
            };
            let pool = Pool::new(dir, path.clone(), owner, &want, None).map_err(err)?;
            pool.fill(&want).map_err(err)?;
            return Ok(pool);
        }
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
        let remove = match keep {
            true => None,
            false => Some((parent, name)),
        };
        let pool = Pool::new(dir, path.clone(), owner, &want, remove).map_err(err)?;
        pool.fill(&want).map_err(err)?;
        Ok(pool)
    }

    fn new(
        dir: OwnedFd,
        path: PathBuf,
        owner: Option<(u32, u32)>,
        want: &Seal,
        remove: Option<(OwnedFd, String)>,
    ) -> std::io::Result<Pool> {
        let dev = rustix::fs::fstat(&dir)?.st_dev;
        Ok(Pool {
            dir,
            remove,
            dev,
            handed: Mutex::default(),
            recycled: Mutex::default(),
            recycled_dirs: Mutex::default(),
            next_recycled: AtomicU32::new(0),
            rule_fds: Mutex::default(),
            set: SpareSet {
                dir: path,
                files: want.files,
                dirs: want.dirs,
                chunks: want.chunks,
            },
            owner,
            next_file: AtomicU32::new(0),
            next_dir: AtomicU32::new(0),
        })
    }

    /// Makes every spare that is missing, replaces every one changed since
    /// the seal (one thread per chunk), removes recycled ones, and seals
    /// the pool anew; then checks the spares it kept once more against the
    /// old seal (one changed while this ran fails the pool: fail closed).
    fn fill(&self, want: &Seal) -> std::io::Result<()> {
        let old = read_seal(&self.dir);
        remove_recycled(&self.dir);
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
        let check = |dir: &OwnedFd, name: &str, is_dir: bool| match &old {
            Some(seal) => spare_intact(dir, name, is_dir, seal, want, self.dev),
            None => Presence::Missing,
        };
        // Pass 1: each chunk's spares, kept when intact, else made anew.
        let ctime = |fd: &OwnedFd| -> std::io::Result<Time> {
            let st = rustix::fs::fstat(fd)?;
            Ok(ctime_of(&st))
        };
        // Each spare is opened once: checked through that descriptor, and
        // its rule is bound to it (`rules::bind`), never found by name
        // again. Slot `i` is file `i`, slot `files + j` directory `j`.
        type Kept = Vec<(usize, bool, OwnedFd)>;
        let chunk = |k: u32| -> std::io::Result<(Kept, Kept, Time)> {
            let name = format!("c{k}");
            match mkdirat(&self.dir, name.as_str(), Mode::from_raw_mode(0o700)) {
                Err(rustix::io::Errno::EXIST) => {}
                r => r?,
            }
            let dir = open_dir_nofollow(&self.dir, Path::new(&name))?;
            own(&dir)?;
            let (mut kept, mut made_fds) = (Vec::new(), Vec::new());
            let mut newest = (0, 0);
            let files = (k..self.set.files)
                .step_by(chunks as usize)
                .map(|i| (i as usize, format!("f{i}"), false));
            let dirs = (k..self.set.dirs)
                .step_by(chunks as usize)
                .map(|i| ((self.set.files + i) as usize, format!("d{i}"), true));
            for (slot, name, is_dir) in files.chain(dirs) {
                match check(&dir, &name, is_dir) {
                    Presence::Intact(fd) => {
                        kept.push((slot, is_dir, fd));
                        continue;
                    }
                    Presence::Changed => remove_entry(&dir, &name)?,
                    Presence::Missing => {}
                }
                let made = if is_dir {
                    mkdirat(&dir, name.as_str(), Mode::from_raw_mode(0o700))?;
                    let fd = open_dir_nofollow(&dir, Path::new(&name))?;
                    own(&fd)?;
                    fd
                } else {
                    let fd = openat(
                        &dir,
                        name.as_str(),
                        OFlags::CREATE
                            | OFlags::EXCL
                            | OFlags::WRONLY
                            | OFlags::NOFOLLOW
                            | OFlags::CLOEXEC,
                        Mode::from_raw_mode(0o600),
                    )?;
                    own(&fd)?;
                    fd
                };
                newest = newest.max(ctime(&made)?);
                made_fds.push((slot, is_dir, made));
            }
            Ok((kept, made_fds, newest))
        };
        let (kept, made, newest) = std::thread::scope(|s| {
            let made: Vec<_> = (0..chunks).map(|k| s.spawn(move || chunk(k))).collect();
            made.into_iter().try_fold(
                (Vec::new(), Vec::new(), (0, 0)),
                |(mut all_kept, mut all_made, newest), h| {
                    let (kept, made, n) = h
                        .join()
                        .unwrap_or_else(|_| Err(std::io::Error::other("a spare maker panicked")))?;
                    all_kept.extend(kept);
                    all_made.extend(made);
                    Ok::<_, std::io::Error>((all_kept, all_made, newest.max(n)))
                },
            )
        })?;
        let keep_fds = |kept: Kept, made: Kept| {
            let mut fds: Vec<(usize, bool, OwnedFd)> = kept.into_iter().chain(made).collect();
            fds.sort_unstable_by_key(|(slot, ..)| *slot);
            *self.rule_fds.lock().unwrap_or_else(|e| e.into_inner()) =
                fds.into_iter().map(|(_, d, fd)| (d, fd)).collect();
        };
        if self.remove.is_some() {
            keep_fds(kept, made);
            return Ok(()); // goes with the run: never adopted, no seal
        }
        if old.is_some() && newest == (0, 0) {
            // Nothing made: every spare is one the old seal covers, and
            // still before it (pass 1): the seal stands as it is.
            keep_fds(kept, made);
            return Ok(());
        }
        // The seal must be newer than every spare made (same clock tick:
        // they would count as changed next time): a tick is a few ms.
        for _ in 0..40 {
            if write_seal(&self.dir, want)? > newest {
                break;
            }
            std::thread::sleep(std::time::Duration::from_micros(500));
        }
        // Pass 2: a spare kept in pass 1 and changed before the new seal
        // would pass as sealed; its ctime is past the old seal then.
        if let Some(seal) = &old {
            for (slot, is_dir, fd) in &kept {
                if !held_intact(fd, *is_dir, seal, want, self.dev) {
                    let name = self
                        .set
                        .names()
                        .nth(*slot)
                        .map(|(n, _)| n)
                        .unwrap_or_default();
                    return Err(std::io::Error::other(format!(
                        "the spare {name} changed while hull checked the pool"
                    )));
                }
            }
        }
        keep_fds(kept, made);
        Ok(())
    }

    /// Every spare's descriptor, in [`SpareSet::names`]'s order, with
    /// whether it is a directory: the inodes [`Pool::fill`] checked or
    /// made. Taken once (the run's ruleset binds them), empty after.
    pub fn take_rule_fds(&self) -> Vec<(bool, OwnedFd)> {
        std::mem::take(&mut *self.rule_fds.lock().unwrap_or_else(|e| e.into_inner()))
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
        while let Some(i) = take(&self.next_file, self.set.files) {
            let name = self.set.file_name(i);
            // Checked empty when taken: what the command wrote into it by
            // its path is never carried to the name it is placed at.
            match rustix::fs::statat(
                &self.dir,
                name.as_str(),
                rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
            ) {
                Ok(st)
                    if rustix::fs::FileType::from_raw_mode(st.st_mode)
                        == rustix::fs::FileType::RegularFile
                        && st.st_size == 0
                        && st.st_nlink == 1
                        && st.st_dev == self.dev =>
                {
                    return Some(name)
                }
                _ => {
                    tracing::debug!(spare = %name, "spares: a spare file not empty when taken, skipped")
                }
            }
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
        if !regular || st.st_nlink != 1 || !self.handed_out(st.st_ino) || st.st_dev != self.dev {
            return Ok(false);
        }
        let back = self.take_back(&dir, name)?;
        self.recycled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(back);
        Ok(true)
    }

    /// Whether this pool handed inode `ino` out.
    fn handed_out(&self, ino: u64) -> bool {
        self.handed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&ino)
    }

    /// Renames `name` of `dir` back into the pool as the next `r<n>`.
    fn take_back(&self, dir: impl AsFd, name: &[u8]) -> std::io::Result<String> {
        let n = self.next_recycled.fetch_add(1, Ordering::AcqRel);
        let back = format!("r{n}");
        rustix::fs::renameat_with(
            &dir,
            name,
            &self.dir,
            back.as_str(),
            rustix::fs::RenameFlags::NOREPLACE,
        )?;
        Ok(back)
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

    /// The name of the next unused spare directory, or None: a fresh one,
    /// else one a removal took back. Each is checked empty when taken (an
    /// entry in it, which the command may have put there by its path, is
    /// never carried to the name it is placed at: that spare is skipped).
    pub fn take_dir(&self) -> Option<String> {
        while let Some(i) = take(&self.next_dir, self.set.dirs) {
            let name = self.set.dir_name(i);
            if self.empty_dir(&name) {
                return Some(name);
            }
            tracing::debug!(spare = %name, "spares: a spare directory not empty when taken, skipped");
        }
        let mut recycled = self.recycled_dirs.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(name) = recycled.pop() {
            if self.empty_dir(&name) {
                return Some(name);
            }
        }
        None
    }

    /// Whether spare directory `name` is a directory of the pool's
    /// filesystem with no entry but `.` and `..`.
    fn empty_dir(&self, name: &str) -> bool {
        let Ok(fd) = openat(
            &self.dir,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) else {
            return false;
        };
        dir_is_empty(&fd, self.dev)
    }

    /// Instead of removing directory `name` from `dir`, takes it back into
    /// the pool when this pool handed it out and it is empty; false
    /// (nothing done) otherwise. Its rule goes with the inode, so a
    /// `mkdir`/`rmdir` loop does not use the pool up.
    pub fn recycle_dir(&self, dir: impl AsFd, name: &[u8]) -> std::io::Result<bool> {
        let fd = match openat(
            &dir,
            OsStr::from_bytes(name),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(_) => return Ok(false),
        };
        let st = rustix::fs::fstat(&fd)?;
        if !self.handed_out(st.st_ino) || !dir_is_empty(&fd, self.dev) {
            return Ok(false);
        }
        let back = self.take_back(&dir, name)?;
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o700))?;
        self.recycled_dirs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(back);
        Ok(true)
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
        let Some((parent, name)) = &self.remove else {
            return;
        };
        if let Err(e) = crate::runtime::remove_tree(&beneath(parent, name)) {
            tracing::warn!(
                "tier landlock: could not remove the spare entries {}: {e}",
                self.set.dir.display()
            );
        }
    }
}

/// An inode's ctime: seconds and nanoseconds.
type Time = (i64, u64);

fn ctime_of(st: &rustix::fs::Stat) -> Time {
    (st.st_ctime, st.st_ctime_nsec)
}

/// What a pool was sealed for, and when.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seal {
    /// The seal file's ctime (seconds, nanoseconds): written once the
    /// spares were made, before any command ran. A spare changed later
    /// has a ctime at or after it, whatever the filesystem's granularity.
    time: Time,
    owner: (u32, u32),
    files: u32,
    dirs: u32,
    chunks: u32,
}

impl Seal {
    fn text(&self) -> String {
        format!(
            "hull-spares 1 {} {} {} {} {}\n",
            self.owner.0, self.owner.1, self.files, self.dirs, self.chunks
        )
    }

    fn parse(text: &str) -> Option<Seal> {
        let f: Vec<&str> = text.trim_end().split(' ').collect();
        let [tag, "1", u, g, files, dirs, chunks] = f[..] else {
            return None;
        };
        (tag == "hull-spares").then_some(())?;
        Some(Seal {
            time: (0, 0),
            owner: (u.parse().ok()?, g.parse().ok()?),
            files: files.parse().ok()?,
            dirs: dirs.parse().ok()?,
            chunks: chunks.parse().ok()?,
        })
    }

    /// Whether a pool sealed so serves a run that wants `want`.
    fn fits(&self, want: &Seal) -> bool {
        (self.owner, self.files, self.dirs, self.chunks)
            == (want.owner, want.files, want.dirs, want.chunks)
    }
}

/// The owner spares get: `owner`, else hull's own ids.
fn owner_or_self(owner: Option<(u32, u32)>) -> (u32, u32) {
    owner.unwrap_or_else(|| {
        (
            rustix::process::geteuid().as_raw(),
            rustix::process::getegid().as_raw(),
        )
    })
}

/// The pool's seal: what it was made for, and as its time the seal file's
/// own ctime (the filesystem's clock and granularity, as the spares').
fn read_seal(dir: &OwnedFd) -> Option<Seal> {
    use std::io::Read;
    let fd = openat(
        dir,
        SEAL,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
        Mode::empty(),
    )
    .ok()?;
    let st = rustix::fs::fstat(&fd).ok()?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
        return None;
    }
    let mut text = String::new();
    std::fs::File::from(fd)
        .take(256)
        .read_to_string(&mut text)
        .ok()?;
    Some(Seal {
        time: ctime_of(&st),
        ..Seal::parse(&text)?
    })
}

/// Seals the pool now: a new file renamed over the old seal (never
/// opening one that is there); its ctime is the seal's time.
fn write_seal(dir: &OwnedFd, want: &Seal) -> std::io::Result<Time> {
    use std::io::Write;
    let tmp = format!("{SEAL}.{}", std::process::id());
    let _ = rustix::fs::unlinkat(dir, tmp.as_str(), rustix::fs::AtFlags::empty());
    let fd = openat(
        dir,
        tmp.as_str(),
        OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )?;
    std::fs::File::from(fd).write_all(want.text().as_bytes())?;
    rustix::fs::renameat(dir, tmp.as_str(), dir, SEAL)?;
    let st = rustix::fs::statat(dir, SEAL, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)?;
    Ok(ctime_of(&st))
}

/// What a spare of an adopted pool is.
#[derive(Debug)]
enum Presence {
    Missing,
    /// As hull made it before the seal: kept, with the descriptor it was
    /// checked through (its rule is bound to that inode).
    Intact(OwnedFd),
    /// Something else is there: replaced.
    Changed,
}

/// Whether spare `name` in `dir` is exactly what hull made before `seal`:
/// the type, owner and mode it was made with, empty, one link, on the
/// pool's filesystem, and its ctime before the seal (any write, chmod,
/// chown, xattr, ACL or entry made inside since moves the ctime).
fn spare_intact(
    dir: &OwnedFd,
    name: &str,
    is_dir: bool,
    seal: &Seal,
    want: &Seal,
    dev: u64,
) -> Presence {
    let fd = match openat(
        dir,
        name,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Presence::Missing,
        Err(_) => return Presence::Changed,
    };
    match held_intact(&fd, is_dir, seal, want, dev) {
        true => Presence::Intact(fd),
        false => Presence::Changed,
    }
}

/// Whether the spare `fd` is open on is exactly what hull made before
/// `seal` (see [`spare_intact`]).
fn held_intact(fd: &OwnedFd, is_dir: bool, seal: &Seal, want: &Seal, dev: u64) -> bool {
    let Ok(st) = rustix::fs::fstat(fd) else {
        return false;
    };
    let (ty, mode, links) = match is_dir {
        false => (rustix::fs::FileType::RegularFile, 0o600, 1),
        true => (rustix::fs::FileType::Directory, 0o700, 2),
    };
    // A directory's ctime moves with every entry made in, moved into or
    // linked into it, so one before the seal is as empty as it was made
    // (and `take_dir` reads it once more before handing it out).
    rustix::fs::FileType::from_raw_mode(st.st_mode) == ty
        && st.st_mode & 0o7777 == mode
        && (st.st_uid, st.st_gid) == want.owner
        && st.st_nlink == links
        && (is_dir || st.st_size == 0)
        && st.st_dev == dev
        && ctime_of(&st) < seal.time
}

/// Whether the directory `fd` is on `dev` and holds no entry but `.` and
/// `..` (an unreadable one counts as not empty).
fn dir_is_empty(fd: &OwnedFd, dev: u64) -> bool {
    if rustix::fs::fstat(fd).map(|st| st.st_dev) != Ok(dev) {
        return false;
    }
    let Ok(mut entries) = rustix::fs::Dir::read_from(fd) else {
        return false;
    };
    entries.all(|e| e.is_ok_and(|e| matches!(e.file_name().to_bytes(), b"." | b"..")))
}

/// Removes entry `name` of `dir` (a tree for a directory), never following
/// a link.
fn remove_entry(dir: &OwnedFd, name: &str) -> std::io::Result<()> {
    match rustix::fs::unlinkat(dir, name, rustix::fs::AtFlags::empty()) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::ISDIR) | Err(rustix::io::Errno::PERM) => {
            crate::runtime::remove_tree(&beneath(dir, name))
        }
        Err(e) => Err(e.into()),
    }
}

/// Removes the recycled spares (`r<n>`, files and directories) a run left
/// in the pool.
fn remove_recycled(dir: &OwnedFd) {
    for name in entry_names(dir) {
        let b = name.as_bytes();
        if b.len() > 1 && b[0] == b'r' && b[1..].iter().all(u8::is_ascii_digit) {
            if let Some(name) = name.to_str() {
                let _ = remove_entry(dir, name);
            }
        }
    }
}

/// The names in the directory `dir` is open on, but `.` and `..` (none
/// when it cannot be read).
fn entry_names(dir: &OwnedFd) -> Vec<std::ffi::OsString> {
    use std::os::unix::ffi::OsStringExt;
    let Ok(entries) = rustix::fs::Dir::read_from(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|e| e.file_name().to_bytes().to_vec())
        .filter(|n| n != b"." && n != b"..")
        .map(std::ffi::OsString::from_vec)
        .collect()
}

/// How many idle pools of one owner a directory keeps besides the one a
/// run adopts: one a run at a time was made for (a batch's jobs side by
/// side), the rest removed as a run finds them (320 inodes each).
const IDLE_KEPT: usize = 8;

/// An idle pool in `hull_dir` sealed for what `want` needs, locked: its
/// directory and name. Idle pools that cannot serve (no seal, or another
/// size) are removed, and so are those of `want`'s owner beyond
/// [`IDLE_KEPT`]; those of another owner are left to its runs, and those
/// being made their grace.
fn adopt(hull_dir: &OwnedFd, want: &Seal) -> Option<(OwnedFd, String)> {
    let mut found = None;
    let mut idle = 0usize;
    for name in entry_names(hull_dir) {
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
        if rustix::fs::flock(&dir, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err() {
            continue; // a run holds it
        }
        let seal = (!making).then(|| read_seal(&dir)).flatten();
        let usable = seal.as_ref().is_some_and(|s| s.fits(want));
        // Sealed for another owner (the shared pools serve every project
        // on their filesystem, whoever owns it): kept for its runs.
        let foreign = seal.as_ref().is_some_and(|s| s.owner != want.owner);
        match (usable, &found) {
            (true, None) => found = Some((dir, name.to_string_lossy().into_owned())),
            (true, Some(_)) if idle < IDLE_KEPT => idle += 1, // kept for another run
            (false, _) if foreign => {}
            // Unusable, or idle beyond the bound.
            _ => {
                let _ = crate::runtime::remove_tree(&beneath(hull_dir, &name));
            }
        }
    }
    found
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
    /// Each pool once (a pool serves every split directory of its root).
    pub fn pools(&self) -> Vec<Arc<Pool>> {
        let mut out: Vec<Arc<Pool>> = Vec::new();
        for (_, p) in &self.served {
            if !out.iter().any(|o| Arc::ptr_eq(o, p)) {
                out.push(Arc::clone(p));
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
        root_user: crate::identity::hull_is_root(),
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
    let hull = root.join(".hull");
    // The writable root opened once, no link on the way; `.hull` and the
    // split directory looked at through it, never by path again.
    let root_fd = rustix::fs::openat2(
        rustix::fs::CWD,
        root,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        rustix::fs::ResolveFlags::NO_SYMLINKS | rustix::fs::ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(|e| format!("{}: {e}", root.display()))?;
    let root_meta = rustix::fs::fstat(&root_fd).map_err(|e| format!("{}: {e}", root.display()))?;
    let owner = run
        .root_user
        .then_some((root_meta.st_uid, root_meta.st_gid));
    let rel = split.strip_prefix(root).unwrap_or(Path::new(""));
    let split_fd = crate::runtime::beneath::openat2(
        &root_fd,
        if rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            rel
        },
        OFlags::PATH | OFlags::CLOEXEC,
        Mode::empty(),
        rustix::fs::ResolveFlags::BENEATH | rustix::fs::ResolveFlags::NO_SYMLINKS,
    )
    .map_err(|e| format!("{}: {e}", split.display()))?;
    // A project with no `.hull` of its own takes a pool hull keeps in its
    // runs root, when that is on the split directory's mount: nothing is
    // made in the project, nothing removed after (see the module comment).
    // A placeholder `.hull` of hull's (a session's or a kept VM's open on
    // the project) is not the project's own.
    let has_hull = match rustix::fs::openat(
        &root_fd,
        ".hull",
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => !crate::runtime::placeholder::is_placeholder(&run.runs_root, &fd, &hull),
        Err(_) => false,
    };
    if !has_hull {
        match shared_pool(policy, &split_fd, run, owner) {
            Ok(Some(pool)) => return Ok(pool),
            Ok(None) => {}
            Err(why) => tracing::debug!("spares: no shared pool ({why}); the project's .hull"),
        }
    }
    let hidden = policy
        .protects
        .iter()
        .any(|p| p.path == hull && p.protection == Protection::Hidden);
    if !hidden {
        return Err(format!("{} is not hidden by the policy", hull.display()));
    }
    // A pool stays for the next run only in a `.hull` the project has: one
    // hull makes goes after the run, with the pool; so does one another
    // run made and still holds (a placeholder of hull's, held by this run
    // too, removed by the last run that holds it).
    let wanted = [crate::runtime::placeholder::Wanted {
        path: hull.clone(),
        root: root.to_path_buf(),
        dir: true,
        seen: rustix::fs::statat(&root_fd, ".hull", rustix::fs::AtFlags::SYMLINK_NOFOLLOW).is_ok(),
    }];
    let held =
        crate::runtime::placeholder::hold(&wanted, &run.runs_root).map_err(|e| e.to_string())?;
    let keep = !held.paths().any(|p| p == hull);
    out.placeholders.absorb(held);
    let hull_fd =
        open_dir_nofollow(&root_fd, Path::new(".hull")).map_err(|e| match e.raw_os_error() {
            Some(libc::ENOTDIR) | Some(libc::ELOOP) => {
                format!("{} is not a directory", hull.display())
            }
            _ => format!("{}: {e}", hull.display()),
        })?;
    let meta = rustix::fs::fstat(&hull_fd).map_err(|e| format!("{}: {e}", hull.display()))?;
    let split_dev = rustix::fs::fstat(&split_fd)
        .map_err(|e| format!("{}: {e}", split.display()))?
        .st_dev;
    if meta.st_dev != split_dev {
        return Err(format!("{} is on another filesystem", hull.display()));
    }
    if run.root_user && meta.st_uid != root_meta.st_uid && meta.st_mode & 0o001 == 0 {
        return Err(format!(
            "{} belongs to uid {} (not {}'s owner) and others cannot search it, so the \
             sandbox user could not reach the entries hull prepares there",
            hull.display(),
            meta.st_uid,
            root.display()
        ));
    }
    Pool::create_in(hull_fd, &hull, &run.id, owner, FILES, DIRS, keep)
        .map(Arc::new)
        .map_err(|e| e.to_string())
}

/// The directory in the runs root that holds the shared pools.
const SHARED: &str = "spares";

/// A pool of the runs root's `spares/` for a split directory (`split` is
/// open on it), when the policy hides the runs root from the command and
/// both are on one mount (a spare is renamed into place): None otherwise.
/// The runs root is hull's (its user's, mode 0700: `runtime`), and so is
/// `spares/` (made 0700, checked): nobody else plants a pool there. When
/// hull is root, the command's sandbox user cannot even reach it.
fn shared_pool(
    policy: &Policy,
    split: &OwnedFd,
    run: &ThisRun,
    owner: Option<(u32, u32)>,
) -> Result<Option<Arc<Pool>>, String> {
    let hidden = policy
        .protects
        .iter()
        .any(|p| run.runs_root.starts_with(&p.path) && p.protection == Protection::Hidden);
    if !hidden {
        return Ok(None);
    }
    let shown = |e: &dyn std::fmt::Display| format!("{}: {e}", run.runs_root.display());
    let runs = rustix::fs::openat2(
        rustix::fs::CWD,
        &run.runs_root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        rustix::fs::ResolveFlags::NO_SYMLINKS | rustix::fs::ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(|e| shown(&e))?;
    let me = rustix::process::geteuid().as_raw();
    // Ours, and nobody else can write in it (others may search it: the
    // runtime's rule for the runs root); `spares/` is ours alone.
    let ours = |st: &rustix::fs::Stat, others: u32| {
        st.st_uid == me
            && st.st_mode & others == 0
            && rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Directory
    };
    if !ours(&rustix::fs::fstat(&runs).map_err(|e| shown(&e))?, 0o022) {
        return Ok(None);
    }
    match mkdirat(&runs, SHARED, Mode::from_raw_mode(0o700)) {
        Ok(()) | Err(rustix::io::Errno::EXIST) => {}
        Err(e) => return Err(shown(&e)),
    }
    let path = run.runs_root.join(SHARED);
    let dir = open_dir_nofollow(&runs, Path::new(SHARED))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let st = rustix::fs::fstat(&dir).map_err(|e| format!("{}: {e}", path.display()))?;
    if !ours(&st, 0o077) {
        return Err(format!(
            "{} is not a directory of uid {me} only (mode {:o}, uid {})",
            path.display(),
            st.st_mode & 0o7777,
            st.st_uid
        ));
    }
    let mount = |fd: &OwnedFd| {
        rustix::fs::statx(
            fd,
            "",
            rustix::fs::AtFlags::EMPTY_PATH,
            rustix::fs::StatxFlags::MNT_ID,
        )
        .ok()
        .filter(|st| st.stx_mask & rustix::fs::StatxFlags::MNT_ID.bits() != 0)
        .map(|st| st.stx_mnt_id)
    };
    match (mount(&dir), mount(split)) {
        (Some(a), Some(b)) if a == b => {}
        _ => return Ok(None),
    }
    Pool::create_in(dir, &path, &run.id, owner, FILES, DIRS, true)
        .map(|p| Some(Arc::new(p)))
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

/// `name` in the directory `dir` is open on, as a path that goes through
/// that descriptor (`/proc/self/fd/N/name`), not through its path.
fn beneath(dir: &OwnedFd, name: impl AsRef<std::ffi::OsStr>) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd())).join(name.as_ref())
}

#[cfg(test)]
// Tests build their trees by path.
#[allow(clippy::disallowed_methods)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_is_made_handed_out_once_each_and_kept_for_the_next_run() {
        let d = tempfile::tempdir().unwrap();
        let hull = d.path().join(".hull");
        std::fs::create_dir(&hull).unwrap();
        // Left by a hull killed while making it: no seal.
        std::fs::create_dir(hull.join("spares-old")).unwrap();
        std::fs::write(hull.join("spares-old/f0"), "").unwrap();
        let live = Pool::create(&hull, "live", None, 1, 1, true).unwrap();
        std::fs::create_dir(hull.join("making-spares-new")).unwrap();
        let pool = Pool::create(&hull, "r1", None, 3, 2, true).unwrap();
        assert!(
            !hull.join("spares-old").exists(),
            "an unsealed pool is swept"
        );
        assert!(hull.join("spares-live").exists(), "a held pool is kept");
        assert!(
            hull.join("making-spares-new").exists(),
            "one being made is kept"
        );
        drop(live);
        let set = pool.set().clone();
        assert_eq!(set.dir, hull.join("spares-r1"));
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
        assert!(set.dir.exists(), "kept after the run");
        // The next run adopts it: the same spares, nothing made again.
        let inodes = |set: &SpareSet| -> Vec<u64> {
            use std::os::unix::fs::MetadataExt;
            set.paths()
                .map(|(p, _)| std::fs::symlink_metadata(p).unwrap().ino())
                .collect()
        };
        let before = inodes(&set);
        let again = Pool::create(&hull, "r2", None, 3, 2, true).unwrap();
        assert_eq!(again.set().dir, set.dir, "adopted");
        assert_eq!(inodes(again.set()), before, "nothing made again");
        // A second concurrent run gets a pool of its own.
        let other = Pool::create(&hull, "r3", None, 3, 2, true).unwrap();
        assert_eq!(other.set().dir, hull.join("spares-r3"));
    }

    /// What a command can do to a spare before it is used (write into it,
    /// chmod it, set an xattr, make an entry inside a spare directory) is
    /// undone before the next run: those spares are made anew, empty; the
    /// untouched ones are kept. A spare taken and recycled is removed.
    #[test]
    fn spares_changed_after_the_seal_are_made_anew() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let d = tempfile::tempdir().unwrap();
        let hull = d.path().join(".hull");
        std::fs::create_dir(&hull).unwrap();
        let pool = Pool::create(&hull, "r1", None, 4, 3, true).unwrap();
        let set = pool.set().clone();
        let path = |name: String| set.dir.join(name);
        // Made anew: born after the changes (an inode number may be reused).
        let born = |p: &Path| std::fs::symlink_metadata(p).unwrap().created().unwrap();
        let ino = |p: &Path| std::fs::symlink_metadata(p).unwrap().ino();
        let (f0, f1, f2, f3) = (
            path(set.file_name(0)),
            path(set.file_name(1)),
            path(set.file_name(2)),
            path(set.file_name(3)),
        );
        let (d0, d1, d2) = (
            path(set.dir_name(0)),
            path(set.dir_name(1)),
            path(set.dir_name(2)),
        );
        let kept = [ino(&f3), ino(&d2)];

        // The command's changes, after the seal (a tick later at most).
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&f0, b"planted").unwrap();
        std::fs::set_permissions(&f1, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::set_permissions(&f1, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(d0.join("planted"), b"x").unwrap();
        std::fs::remove_file(d0.join("planted")).unwrap();
        std::fs::set_permissions(&d1, std::fs::Permissions::from_mode(0o2770)).unwrap();
        std::fs::set_permissions(&d1, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::remove_file(&f2).unwrap();
        std::fs::write(set.dir.join("r0"), b"recycled").unwrap();
        let changes_done = std::time::SystemTime::now();
        // Inode times come from the coarse clock: a tick or two behind.
        std::thread::sleep(std::time::Duration::from_millis(30));
        drop(pool);
        let again = Pool::create(&hull, "r2", None, 4, 3, true).unwrap();
        assert_eq!(again.set().dir, set.dir, "adopted");
        assert_eq!([ino(&f3), ino(&d2)], kept, "untouched spares are kept");
        for p in [&f0, &f1, &d0, &d1] {
            assert!(born(p) > changes_done, "{} was not made anew", p.display());
        }
        assert!(f2.exists(), "a missing spare is made");
        assert_eq!(std::fs::read(&f0).unwrap(), b"");
        assert_eq!(std::fs::read_dir(&d0).unwrap().count(), 0);
        assert!(!set.dir.join("r0").exists(), "recycled spares are removed");
        for (p, is_dir) in again.set().paths() {
            let m = std::fs::symlink_metadata(&p).unwrap();
            assert_eq!(m.is_dir(), is_dir);
            assert_eq!(m.mode() & 0o7777, if is_dir { 0o700 } else { 0o600 });
        }
    }

    /// Idle pools beyond [`IDLE_KEPT`] go as a run finds them; one a run
    /// holds stays.
    #[test]
    fn idle_pools_are_kept_up_to_a_bound() {
        let d = tempfile::tempdir().unwrap();
        let hull = d.path().join(".hull");
        std::fs::create_dir(&hull).unwrap();
        let pools: Vec<Pool> = (0..IDLE_KEPT + 4)
            .map(|i| Pool::create(&hull, &format!("r{i}"), None, 1, 1, true).unwrap())
            .collect();
        let count = || {
            std::fs::read_dir(&hull)
                .unwrap()
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(PREFIX))
                .count()
        };
        assert_eq!(count(), IDLE_KEPT + 4, "each run held its own");
        let held = Pool::create(&hull, "held", None, 1, 1, true).unwrap();
        assert_eq!(count(), IDLE_KEPT + 5, "all were held: none adopted");
        drop(pools);
        let adopted = Pool::create(&hull, "next", None, 1, 1, true).unwrap();
        assert_eq!(
            count(),
            IDLE_KEPT + 2,
            "adopted one, kept {IDLE_KEPT} idle, and the held one"
        );
        assert!(held.set().dir.exists());
        drop(adopted);
    }

    #[test]
    fn a_linked_hull_dir_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let elsewhere = d.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, d.path().join(".hull")).unwrap();
        let e = Pool::create(&d.path().join(".hull"), "r", None, 1, 1, true).unwrap_err();
        assert!(e.to_string().contains(".hull"), "{e}");
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
    }
}
