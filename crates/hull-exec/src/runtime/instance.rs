//! One instance's run dir and its lock.
//!
//! Creating an instance builds the run dir under a staging name
//! (`.new-<uuid>`), creates and locks `.active` there, creates `tmp/` and
//! `spill/`, and only then renames it to `<uuid>`: a run dir that cleanup
//! can see always has a held lock from its first moment. (Windows cannot
//! rename a directory with open files inside: there the lock is taken right
//! after the rename, and creation retries if a cleanup removed the new dir
//! in between.)
//!
//! An [`Instance`] holds two shared holds on `.active`: one private to this
//! process and one for the children it starts ([`Instance::pass_lock_to`]).
//! The private one keeps the instance in use for as long as this process
//! lives, whatever a child does with its copy; the children's one keeps it
//! in use after this process died, for as long as any of them lives.
//!
//! On unix both descriptors are close-on-exec in this process, and the
//! children's one is made inheritable only in the child, between fork and
//! exec: a process with several instances (`hull serve`), or unrelated
//! helpers it starts, never carry an instance's lock by accident. On Windows
//! the children's handle is inheritable, so every child created with handle
//! inheritance carries it.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use super::{fsx, lock, InstanceId, INSTANCE_ENV, LOCK_FILE, SPILL_DIR, SPILL_ENV, TMP_DIR};
use crate::policy::Vars;

/// Errors creating, joining or finishing an instance. Each names the path.
#[derive(Debug, thiserror::Error)]
pub enum InstanceError {
    #[error(
        "runs root {path:?} is not safe to use: {reason}; set HULL_RUNS_DIR to a private directory"
    )]
    RunsRootInsecure { path: PathBuf, reason: String },
    #[error("{what} the runs root {path:?}: {source}; set HULL_RUNS_DIR to a writable directory of your own")]
    RunsRoot {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("runs root {path:?} is not valid UTF-8 (its paths go into the command's environment)")]
    NotUtf8 { path: PathBuf },
    #[error("hull instance {id} does not exist under {root:?} (it ended and was cleaned up)")]
    NotFound { id: InstanceId, root: PathBuf },
    #[error("{what} {path:?}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> InstanceError {
    let path = path.to_path_buf();
    move |source| InstanceError::Io { what, path, source }
}

/// What [`Instance::finish`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct FinishOutcome {
    /// `tmp/` and the other scratch were removed (nobody else held the instance).
    pub tmp_removed: bool,
    /// The run dir itself was removed: this process made it, and it held
    /// nothing to keep.
    pub dir_removed: bool,
}

/// A run dir in use by this process. Dropping it releases this process's
/// holds without cleaning up; call [`Instance::finish`] to clean up.
#[derive(Debug)]
pub struct Instance {
    id: InstanceId,
    root: PathBuf,
    dir: PathBuf,
    tmp: PathBuf,
    spill: PathBuf,
    /// This process's own hold; never passed to children.
    own: File,
    /// The hold passed to children.
    inherited: File,
    /// This process made the instance (not `--instance ID`): when nothing
    /// is left to keep, [`Instance::finish`] removes its run dir.
    created: bool,
}

impl Instance {
    /// Creates a new instance with a fresh id under `runs_root` (creating the
    /// root, private, if missing).
    pub fn create(runs_root: &Path) -> Result<Instance, InstanceError> {
        let root = prepare_root(runs_root)?;
        loop {
            match create_with_id(&root, InstanceId::new())? {
                Some(i) => return Ok(i),
                None => continue, // a UUID collision: take another
            }
        }
    }

    /// Joins an existing instance (for `hull run --instance ID`), so this
    /// process can use its spill and tmp; recreates `tmp/` (and `spill/`) if
    /// cleanup removed them while the instance was idle. Waits while a
    /// cleanup holds the lock exclusively.
    pub fn join(runs_root: &Path, id: InstanceId) -> Result<Instance, InstanceError> {
        let root = prepare_root(runs_root)?;
        join_at(&root, id)
    }

    /// Joins the instance `id`, or creates it under that id if it does not
    /// exist (a harness that picks its session id itself).
    pub fn join_or_create(runs_root: &Path, id: InstanceId) -> Result<Instance, InstanceError> {
        let root = prepare_root(runs_root)?;
        // Racing a cleanup that is removing the old dir, or another creator:
        // each round either joins or creates; a few rounds always settle it.
        let mut last = None;
        for _ in 0..8 {
            match join_at(&root, id) {
                Ok(i) => return Ok(i),
                Err(e @ InstanceError::NotFound { .. }) => last = Some(e),
                Err(e) => return Err(e),
            }
            if let Some(i) = create_with_id(&root, id)? {
                return Ok(i);
            }
        }
        Err(last.unwrap_or(InstanceError::NotFound { id, root }))
    }

    /// Ends this process's use: releases both holds, then removes `tmp/`
    /// (and other per-run scratch, all but `.active` and `spill/`) if no
    /// other process (another hull joined to the same id, or a child that
    /// outlived its command) holds the instance. Spill is kept for
    /// [`super::gc`]. Two processes finishing concurrently never remove tmp
    /// from under each other: removal happens only under the exclusive lock.
    pub fn finish(self) -> Result<FinishOutcome, InstanceError> {
        let Instance {
            own,
            inherited,
            dir,
            created,
            ..
        } = self;
        drop(inherited);
        drop(own);
        let lock_path = dir.join(LOCK_FILE);
        let Some(excl) = lock::try_exclusive(&lock_path).map_err(io_err("locking", &lock_path))?
        else {
            return Ok(FinishOutcome {
                tmp_removed: false,
                dir_removed: false,
            });
        };
        if !created {
            super::gc::remove_scratch(&dir).map_err(io_err("removing scratch in", &dir))?;
            drop(excl);
            return Ok(FinishOutcome {
                tmp_removed: true,
                dir_removed: false,
            });
        }
        // A run that leaves nothing to keep (no spill, no logs) leaves no
        // run dir either.
        let dir_removed = super::gc::finish_locked(&dir, &lock_path, excl)
            .map_err(io_err("removing scratch in", &dir))?;
        Ok(FinishOutcome {
            tmp_removed: true,
            dir_removed,
        })
    }

    /// The instance id (`HULL_INSTANCE`).
    pub fn id(&self) -> InstanceId {
        self.id
    }
    /// The runs root (canonical), holding every instance's run dir.
    pub fn runs_root(&self) -> &Path {
        &self.root
    }
    /// `<runs_root>/<id>` (canonical).
    pub fn dir(&self) -> &Path {
        &self.dir
    }
    /// The command's scratch dir, read-write (`TMPDIR`, `TMP`, `TEMP`).
    pub fn tmp(&self) -> &Path {
        &self.tmp
    }
    /// Where hull writes large outputs; read-only for commands (`HULL_SPILL`).
    pub fn spill(&self) -> &Path {
        &self.spill
    }

    /// The environment a command of this instance gets from the runtime:
    /// `TMPDIR`, `TMP`, `TEMP` = tmp, `HULL_SPILL` = spill, `HULL_INSTANCE` = id.
    pub fn child_env(&self) -> Vec<(String, String)> {
        // prepare_root checked the root is UTF-8, so these paths are too.
        let tmp = self.tmp.to_string_lossy().into_owned();
        vec![
            ("TMPDIR".into(), tmp.clone()),
            ("TMP".into(), tmp.clone()),
            ("TEMP".into(), tmp),
            (SPILL_ENV.into(), self.spill.to_string_lossy().into_owned()),
            (INSTANCE_ENV.into(), self.id.to_string()),
        ]
    }

    /// The policy variables for this instance.
    pub fn vars(&self, project: &Path, home: &Path) -> Vars {
        Vars {
            project: project.to_path_buf(),
            tmp: self.tmp.clone(),
            spill: self.spill.clone(),
            home: home.to_path_buf(),
            runs: self.root.clone(),
        }
    }

    /// Makes a child started from `cmd` carry this instance's lock, so the
    /// instance stays in use while the child (or anything it starts) lives,
    /// also after this process died. Spawn `cmd` while `self` is alive.
    /// On unix this adds a `pre_exec` step clearing close-on-exec on the
    /// lock descriptor in the child only; on Windows the handle is already
    /// inheritable and this does nothing.
    #[cfg(unix)]
    pub fn pass_lock_to(&self, cmd: &mut std::process::Command) {
        use std::os::fd::{AsRawFd, BorrowedFd};
        use std::os::unix::process::CommandExt;
        let fd = self.inherited.as_raw_fd();
        let hook = move || {
            // SAFETY: runs in the forked child before exec, where `fd` is the
            // parent's open lock descriptor (the parent keeps it open while
            // `self` lives, and the caller spawns while it does).
            let b = unsafe { BorrowedFd::borrow_raw(fd) };
            rustix::io::fcntl_setfd(b, rustix::io::FdFlags::empty()).map_err(io::Error::from)
        };
        // SAFETY: the hook only calls fcntl(2), which is async-signal-safe,
        // and neither allocates nor takes locks.
        unsafe {
            cmd.pre_exec(hook);
        }
    }

    /// See the unix variant: the handle is inheritable already.
    #[cfg(windows)]
    pub fn pass_lock_to(&self, _cmd: &mut std::process::Command) {}

    /// The children's lock descriptor, for launchers that do not use
    /// `std::process::Command`: the child must have it open without
    /// close-on-exec after its exec (it is close-on-exec here). Never close
    /// it in the child: an instance whose hull died would then look idle
    /// while its command still runs.
    #[cfg(unix)]
    pub fn lock_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.inherited.as_fd()
    }

    /// [`Self::lock_fd`] as a raw number, for launchers that keep
    /// descriptors open across exec by number (clearing close-on-exec in
    /// the child), such as `tier::launch::ChildSetup::keep_fds`.
    #[cfg(unix)]
    pub fn lock_raw_fd(&self) -> super::LockFd {
        std::os::fd::AsRawFd::as_raw_fd(&self.inherited)
    }

    /// [`Self::lock_handle`] as a raw handle.
    #[cfg(windows)]
    pub fn lock_raw_fd(&self) -> super::LockFd {
        std::os::windows::io::AsRawHandle::as_raw_handle(&self.inherited)
    }

    /// The children's lock handle (inheritable); a launcher that passes an
    /// explicit handle list must include it.
    #[cfg(windows)]
    pub fn lock_handle(&self) -> std::os::windows::io::BorrowedHandle<'_> {
        use std::os::windows::io::AsHandle;
        self.inherited.as_handle()
    }
}

/// Creates the root if missing; checks it is a private directory of ours
/// and UTF-8; returns its canonical path.
fn prepare_root(runs_root: &Path) -> Result<PathBuf, InstanceError> {
    let canon = private_root(runs_root).map_err(|e| match e {
        PrivateRootError::Io { what, source } => InstanceError::RunsRoot {
            what,
            path: runs_root.to_path_buf(),
            source,
        },
        PrivateRootError::Insecure(reason) => InstanceError::RunsRootInsecure {
            path: runs_root.to_path_buf(),
            reason,
        },
    })?;
    if canon.to_str().is_none() {
        return Err(InstanceError::NotUtf8 { path: canon });
    }
    Ok(canon)
}

/// Why a directory of hull's own state cannot be used.
#[derive(Debug)]
pub enum PrivateRootError {
    Io {
        what: &'static str,
        source: std::io::Error,
    },
    /// Another user could plant something in it.
    Insecure(String),
}

/// Creates `root` (and missing parents, each 0700) if missing, then checks
/// it is a real directory (not a symlink), owned by this user, and not
/// writable by group or others: a directory another local user made first
/// (in /tmp, say) could hold planted pid files or symlinks. Returns its
/// canonical path.
pub fn private_root(root: &Path) -> Result<PathBuf, PrivateRootError> {
    let io = |what| move |source| PrivateRootError::Io { what, source };
    fsx::make_private_dir_all(root).map_err(io("creating"))?;
    let md = std::fs::symlink_metadata(root).map_err(io("inspecting"))?;
    if !md.is_dir() {
        return Err(PrivateRootError::Insecure(
            "it is a symlink or not a directory".into(),
        ));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let me = rustix::process::geteuid().as_raw();
        if md.uid() != me {
            return Err(PrivateRootError::Insecure(format!(
                "owned by uid {}, not by us (uid {me})",
                md.uid()
            )));
        }
        if md.mode() & 0o022 != 0 {
            return Err(PrivateRootError::Insecure(format!(
                "writable by group or others (mode {:o})",
                md.mode() & 0o7777
            )));
        }
    }
    std::fs::canonicalize(root).map_err(io("resolving"))
}

/// Builds a run dir for `id` under a staging name and renames it into
/// place. `Ok(None)` when `<root>/<id>` already exists (or, on Windows, was
/// cleaned away again before we could hold it).
fn create_with_id(root: &Path, id: InstanceId) -> Result<Option<Instance>, InstanceError> {
    let staging = root.join(format!(".new-{}", InstanceId::new()));
    fsx::make_private_dir(&staging).map_err(io_err("creating", &staging))?;
    let cleanup = |_: &InstanceError| {
        let _ = fsx::remove_tree(&staging);
    };
    #[cfg(unix)]
    let holds = build(&staging).inspect_err(cleanup)?;
    // Windows holds nothing yet (see below).
    #[cfg(windows)]
    build(&staging).inspect_err(cleanup)?;
    let dir = root.join(id.to_string());
    if let Err(e) = fsx::rename_noreplace(&staging, &dir) {
        // Unlinking under our own holds is fine on unix; they close on return.
        let _ = fsx::remove_tree(&staging);
        return match e.kind() {
            io::ErrorKind::AlreadyExists => Ok(None),
            _ => Err(io_err("renaming into place", &dir)(e)),
        };
    }
    #[cfg(unix)]
    {
        let (own, inherited) = holds;
        Ok(Some(Instance {
            id,
            root: root.to_path_buf(),
            tmp: dir.join(TMP_DIR),
            spill: dir.join(SPILL_DIR),
            dir,
            own,
            inherited,
            created: true,
        }))
    }
    #[cfg(windows)]
    {
        // Windows cannot rename a directory with files open inside, so the
        // holds are taken after the rename; a cleanup in between can only
        // remove the new dir, and then the caller tries again.
        match join_at(root, id) {
            Ok(i) => Ok(Some(Instance { created: true, ..i })),
            Err(InstanceError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// Creates `.active` (held, on unix), `tmp/` and `spill/` in a staging dir.
#[cfg(unix)]
fn build(staging: &Path) -> Result<(File, File), InstanceError> {
    let lock_path = staging.join(LOCK_FILE);
    let own = lock::hold_shared(&lock_path, true).map_err(io_err("creating lock", &lock_path))?;
    let inherited = hold_inheritable(&lock_path)?;
    make_dirs(staging)?;
    Ok((own, inherited))
}

#[cfg(windows)]
fn build(staging: &Path) -> Result<(), InstanceError> {
    let lock_path = staging.join(LOCK_FILE);
    drop(lock::hold_shared(&lock_path, true).map_err(io_err("creating lock", &lock_path))?);
    make_dirs(staging)
}

fn make_dirs(staging: &Path) -> Result<(), InstanceError> {
    for d in [TMP_DIR, SPILL_DIR] {
        let p = staging.join(d);
        fsx::make_private_dir(&p).map_err(io_err("creating", &p))?;
    }
    Ok(())
}

fn hold_inheritable(lock_path: &Path) -> Result<File, InstanceError> {
    let f = lock::hold_shared(lock_path, false).map_err(io_err("locking", lock_path))?;
    #[cfg(windows)]
    lock::set_inheritable(&f).map_err(io_err("making lock inheritable", lock_path))?;
    Ok(f)
}

fn join_at(root: &Path, id: InstanceId) -> Result<Instance, InstanceError> {
    let dir = root.join(id.to_string());
    let not_found = || InstanceError::NotFound {
        id,
        root: root.to_path_buf(),
    };
    match std::fs::symlink_metadata(&dir) {
        Ok(md) if md.is_dir() => {}
        Ok(_) => return Err(not_found()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(not_found()),
        Err(e) => return Err(io_err("inspecting", &dir)(e)),
    }
    let lock_path = dir.join(LOCK_FILE);
    let own = match lock::hold_shared(&lock_path, false) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(not_found()),
        Err(e) => return Err(io_err("locking", &lock_path)(e)),
    };
    // A cleanup may have removed the dir while we waited for the lock.
    if !lock::still_at(&own, &lock_path).map_err(io_err("locking", &lock_path))? {
        return Err(not_found());
    }
    // From here on nobody can clean the dir: we hold it.
    let inherited = hold_inheritable(&lock_path)?;
    let tmp = dir.join(TMP_DIR);
    let spill = dir.join(SPILL_DIR);
    for p in [&tmp, &spill] {
        fsx::ensure_private_dir(p).map_err(io_err("creating", p))?;
    }
    Ok(Instance {
        id,
        root: root.to_path_buf(),
        dir,
        tmp,
        spill,
        own,
        inherited,
        created: false,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn private_root() -> (tempfile::TempDir, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let r = d.path().join("runs");
        (d, r)
    }

    #[test]
    fn create_makes_layout_and_holds_lock() {
        let _serial = crate::runtime::serial();
        let (_d, root) = private_root();
        let i = Instance::create(&root).unwrap();
        assert!(i.dir().join(LOCK_FILE).is_file());
        assert!(i.tmp().is_dir() && i.spill().is_dir());
        assert_eq!(
            i.dir().file_name().unwrap().to_str().unwrap(),
            i.id().to_string()
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            for p in [i.dir(), i.tmp(), i.spill()] {
                let m = std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
                assert_eq!(m & 0o077, 0, "{p:?} mode {m:o}");
            }
        }
        assert!(lock::try_exclusive(&i.dir().join(LOCK_FILE))
            .unwrap()
            .is_none());
        // No staging dir left behind.
        let names: Vec<_> = std::fs::read_dir(i.runs_root())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        let env = i.child_env();
        assert!(env.contains(&("TMPDIR".into(), i.tmp().to_str().unwrap().into())));
        assert!(env.contains(&("HULL_INSTANCE".into(), i.id().to_string())));
    }

    #[test]
    fn finish_removes_tmp_only_when_last() {
        let _serial = crate::runtime::serial();
        let (_d, root) = private_root();
        let a = Instance::create(&root).unwrap();
        std::fs::write(a.tmp().join("scratch"), b"x").unwrap();
        std::fs::write(a.spill().join("out.txt"), b"y").unwrap();
        // Per-run scratch beside tmp (what bwrap's launcher keeps there).
        std::fs::create_dir_all(a.dir().join("mask/dir")).unwrap();
        std::fs::write(a.dir().join("mask/file"), b"").unwrap();
        let b = Instance::join(&root, a.id()).unwrap();
        let tmp = a.tmp().to_path_buf();
        assert_eq!(
            a.finish().unwrap(),
            FinishOutcome {
                tmp_removed: false,
                dir_removed: false
            }
        );
        assert!(tmp.join("scratch").is_file(), "b still uses tmp");
        let spill = b.spill().to_path_buf();
        assert_eq!(
            b.finish().unwrap(),
            FinishOutcome {
                tmp_removed: true,
                dir_removed: false
            }
        );
        assert!(!tmp.exists());
        assert!(!spill.with_file_name("mask").exists());
        assert!(spill.join("out.txt").is_file(), "spill is kept");
        assert!(spill.with_file_name(LOCK_FILE).is_file());
    }

    #[test]
    fn join_recreates_tmp_and_refuses_unknown() {
        let _serial = crate::runtime::serial();
        let (_d, root) = private_root();
        let a = Instance::create(&root).unwrap();
        let id = a.id();
        let tmp = a.tmp().to_path_buf();
        // Something to keep, so the run dir stays for a later join.
        std::fs::write(a.spill().join("out.txt"), b"y").unwrap();
        assert!(a.finish().unwrap().tmp_removed);
        assert!(!tmp.exists());
        let b = Instance::join(&root, id).unwrap();
        assert!(tmp.is_dir());
        drop(b);
        let other = InstanceId::new();
        assert!(matches!(
            Instance::join(&root, other),
            Err(InstanceError::NotFound { .. })
        ));
        let c = Instance::join_or_create(&root, other).unwrap();
        assert_eq!(c.id(), other);
        assert!(c.tmp().is_dir());
        let d = Instance::join_or_create(&root, other).unwrap();
        assert_eq!(d.dir(), c.dir());
    }

    #[cfg(unix)]
    #[test]
    fn insecure_root_refused() {
        use std::os::unix::fs::PermissionsExt;
        let (_d, root) = private_root();
        std::fs::create_dir(&root).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = Instance::create(&root).unwrap_err();
        assert!(matches!(e, InstanceError::RunsRootInsecure { .. }), "{e}");
        assert_eq!(
            std::fs::read_dir(&root).unwrap().count(),
            0,
            "nothing created"
        );
        let link = root.with_file_name("link");
        std::os::unix::fs::symlink(&root, &link).unwrap();
        let e = Instance::create(&link).unwrap_err();
        assert!(matches!(e, InstanceError::RunsRootInsecure { .. }), "{e}");
    }

    /// Whether process `pid` has `target` open (Linux: /proc/PID/fd).
    #[cfg(target_os = "linux")]
    pub(crate) fn has_open(pid: u32, target: &Path) -> bool {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.unwrap().path()).ok())
            .any(|l| l == target)
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn only_children_given_the_lock_carry_it() {
        let _serial = crate::runtime::serial();
        use rustix::io::{fcntl_getfd, FdFlags};
        use std::process::{Command, Stdio};
        let (_d, root) = private_root();
        let i = Instance::create(&root).unwrap();
        assert!(fcntl_getfd(i.lock_fd()).unwrap().contains(FdFlags::CLOEXEC));
        assert!(fcntl_getfd(&i.own).unwrap().contains(FdFlags::CLOEXEC));
        let lock = i.dir().join(LOCK_FILE);
        let spawn = |pass: bool| {
            let mut c = Command::new("sleep");
            c.arg("600").stdin(Stdio::null()).stdout(Stdio::null());
            if pass {
                i.pass_lock_to(&mut c);
            }
            c.spawn().unwrap()
        };
        let mut with = spawn(true);
        let mut without = spawn(false);
        // exec has happened once /proc shows the new image; poll the fd
        // table, which is final after exec.
        let exec_done = |pid: u32| {
            std::fs::read_link(format!("/proc/{pid}/exe"))
                .map(|p| p.ends_with("sleep"))
                .unwrap_or(false)
        };
        while !exec_done(with.id()) || !exec_done(without.id()) {
            std::thread::yield_now();
        }
        assert!(has_open(with.id(), &lock), "child given the lock holds it");
        assert!(!has_open(without.id(), &lock), "other children do not");
        for c in [&mut with, &mut without] {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }
}
