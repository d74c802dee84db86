//! One run at a time in a kept VM, each with a tmp of its own.
//!
//! Every run in a kept VM's container is the container's uid 1000: two at
//! once could read each other's environment through `/proc`, signal each
//! other, and share the VM's tmp (their `TMPDIR` and, in the shipped
//! profiles, `HOME`). So runs take turns: `hull run --vm NAME` takes an
//! exclusive `flock` on `<vms>/NAME/turn` for its whole run (a second run
//! waits, and says so), and the run's tmp is a directory hull makes for it
//! in the VM's tmp (`tmp/<run id>`, made exclusively, so nothing planted
//! can be it), after removing everything else there; it is removed again
//! when the run ends. The proxy's audit in the VM's spill is truncated at
//! each turn, so a run sees only its own refusals there, and the
//! container's own scratch is emptied (`client::scrub_container`).
//!
//! A `hull serve` session is one sandbox: it takes its VM's turn for the
//! session's life and hands it to each of its execs (`--vm-turn-fd`),
//! which run side by side in the session's tmp, as the session's commands
//! share their workspace on every tier.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, RawFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use rustix::fs::{flock, FlockOperation};

use super::{io_err, SupervisorError, VmState};

/// The lock file of a VM's turn, in its directory.
const TURN_FILE: &str = "turn";

/// A run's turn in a kept VM: held until dropped.
#[derive(Debug)]
pub struct Turn {
    _lock: File,
}

/// What taking a turn came to.
#[derive(Debug)]
pub enum Taken {
    Turn(Turn),
    /// The caller was interrupted by this signal while it waited.
    Interrupted(i32),
}

fn open_turn(dir: &Path) -> Result<File, SupervisorError> {
    let path = dir.join(TURN_FILE);
    if !dir.is_dir() {
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned());
        return Err(SupervisorError::NotUp {
            name: name.unwrap_or_default(),
        });
    }
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .map_err(io_err("open", &path))
}

impl Turn {
    /// Takes VM `name`'s turn (its directory `dir`), waiting while another
    /// run holds it; says once on stderr that it waits. A signal recorded
    /// in `irq` ends the wait.
    pub fn take(dir: &Path, name: &str, irq: &AtomicI32) -> Result<Taken, SupervisorError> {
        let lock = open_turn(dir)?;
        let mut said = false;
        loop {
            match flock(lock.as_fd(), FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => return Ok(Taken::Turn(Turn { _lock: lock })),
                Err(rustix::io::Errno::WOULDBLOCK) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(io_err("lock", &dir.join(TURN_FILE))(e.into())),
            }
            if !said {
                eprintln!(
                    "hull: tier vm: VM {name} is serving another run; waiting for it to end \
                     (runs in one kept VM take turns)"
                );
                said = true;
            }
            let sig = irq.load(Ordering::SeqCst);
            if sig != 0 {
                return Ok(Taken::Interrupted(sig));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The turn of VM directory `dir` held by this process's caller and
    /// handed down as descriptor `fd` (`--vm-turn-fd`, from `hull serve`):
    /// it must be that VM's turn file, and the lock is taken through it
    /// without waiting: at once when the caller holds it on that open
    /// file, refused when another run holds it.
    pub fn inherited(fd: RawFd, dir: &Path) -> Result<Turn, SupervisorError> {
        let path = dir.join(TURN_FILE);
        let bad = |why: String| {
            SupervisorError::Other(format!(
                "hull run: --vm-turn-fd {fd}: {why} (the turn of {})",
                path.display()
            ))
        };
        let lock = File::from(
            crate::exec::env_fd::adopt(fd).ok_or_else(|| bad("not an open descriptor".into()))?,
        );
        let held = lock.metadata().map_err(io_err("stat", &path))?;
        let want = std::fs::symlink_metadata(&path).map_err(io_err("stat", &path))?;
        if (held.dev(), held.ino()) != (want.dev(), want.ino()) || !want.is_file() {
            return Err(bad("it is not that VM's turn file".into()));
        }
        // The caller's lock is on this open file: a non-blocking exclusive
        // lock through it succeeds. If it fails, someone else holds it.
        flock(lock.as_fd(), FlockOperation::NonBlockingLockExclusive)
            .map_err(|_| bad("its lock is held by another run".into()))?;
        Ok(Turn { _lock: lock })
    }
}

/// Takes VM `name`'s turn for a caller that hands it to its runs
/// (`--vm-turn-fd`): the open turn file, its lock held; refused when
/// another run holds it (a session's VM is its own).
pub fn hold_turn(name: &str) -> Result<File, SupervisorError> {
    let dir = super::vm_dir(name)?;
    let lock = open_turn(&dir)?;
    flock(lock.as_fd(), FlockOperation::NonBlockingLockExclusive).map_err(|e| {
        SupervisorError::Other(format!(
            "hull vm: cannot hold the turn of VM {name} ({}): {e}",
            dir.join(TURN_FILE).display()
        ))
    })?;
    Ok(lock)
}

/// A run's own tmp in a kept VM: `<vm tmp>/<run id>`, made by hull after
/// everything else in the VM's tmp was removed, and removed (with anything
/// else there) when dropped.
#[derive(Debug)]
pub struct RunTmp {
    vm_tmp: PathBuf,
    pub path: PathBuf,
}

impl RunTmp {
    /// Empties the VM's tmp `vm_tmp` (kept: its share holds it open) and
    /// makes the run's directory `id` in it, with the owner and mode of
    /// `vm_tmp` (what the VM's runs may write). Truncates the proxy's
    /// audit in the VM's spill.
    pub fn make(st: &VmState, id: &str) -> Result<RunTmp, SupervisorError> {
        empty(&st.tmp)?;
        truncate_audit(&st.spill)?;
        let path = st.tmp.join(id);
        let top = std::fs::symlink_metadata(&st.tmp).map_err(io_err("stat", &st.tmp))?;
        if !top.is_dir() {
            return Err(io_err("use", &st.tmp)(io::Error::other("not a directory")));
        }
        std::fs::DirBuilder::new()
            .mode(top.mode() & 0o7777)
            .create(&path)
            .map_err(io_err("create", &path))?;
        let dir = rustix::fs::open(
            &path,
            rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::NOFOLLOW
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| io_err("open", &path)(e.into()))?;
        rustix::fs::fchown(
            &dir,
            Some(rustix::process::Uid::from_raw(top.uid())),
            Some(rustix::process::Gid::from_raw(top.gid())),
        )
        .map_err(|e| io_err("chown", &path)(e.into()))?;
        rustix::fs::fchmod(&dir, rustix::fs::Mode::from_raw_mode(top.mode() & 0o7777))
            .map_err(|e| io_err("chmod", &path)(e.into()))?;
        Ok(RunTmp {
            vm_tmp: st.tmp.clone(),
            path,
        })
    }
}

impl Drop for RunTmp {
    fn drop(&mut self) {
        // A VM a fault took down during the run: its supervisor removed
        // its tmp with it.
        if std::fs::symlink_metadata(&self.vm_tmp)
            .is_err_and(|e| e.kind() == io::ErrorKind::NotFound)
        {
            return;
        }
        if let Err(e) = empty(&self.vm_tmp) {
            eprintln!("hull: {e}");
        }
    }
}

/// Removes every entry of directory `dir`, which stays (a share holds
/// it). An entry is never followed: a link is removed as a link, and
/// `remove_tree` removes a directory without following links below it.
fn empty(dir: &Path) -> Result<(), SupervisorError> {
    let entries = std::fs::read_dir(dir).map_err(io_err("read", dir))?;
    for e in entries {
        let e = e.map_err(io_err("read", dir))?;
        let path = e.path();
        let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
        let r = match is_dir {
            true => crate::runtime::remove_tree(&path),
            false => std::fs::remove_file(&path).or_else(|e| match e.kind() {
                io::ErrorKind::NotFound => Ok(()),
                _ => Err(e),
            }),
        };
        r.map_err(io_err("remove", &path))?;
    }
    Ok(())
}

/// Truncates the VM proxy's audit file in `spill` (the proxy appends to
/// it), if there is one.
fn truncate_audit(spill: &Path) -> Result<(), SupervisorError> {
    let path = spill.join(crate::net::audit::FILE);
    match std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
    {
        Ok(f) => f.set_len(0).map_err(io_err("truncate", &path)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err("open", &path)(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_turn_waits_and_an_interrupt_ends_the_wait() {
        let d = tempfile::tempdir().unwrap();
        let irq = AtomicI32::new(0);
        let Taken::Turn(first) = Turn::take(d.path(), "t", &irq).unwrap() else {
            panic!("the first turn waited");
        };
        irq.store(2, Ordering::SeqCst);
        assert!(matches!(
            Turn::take(d.path(), "t", &irq).unwrap(),
            Taken::Interrupted(2)
        ));
        drop(first);
        assert!(matches!(
            Turn::take(d.path(), "t", &irq).unwrap(),
            Taken::Turn(_)
        ));
    }

    #[test]
    fn an_inherited_turn_is_the_vm_s_and_not_another_run_s() {
        use std::os::fd::IntoRawFd;
        let d = tempfile::tempdir().unwrap();
        let irq = AtomicI32::new(0);
        // Held by another run: refused.
        let Taken::Turn(other_run) = Turn::take(d.path(), "t", &irq).unwrap() else {
            panic!("waited");
        };
        let f = open_turn(d.path()).unwrap();
        assert!(Turn::inherited(f.into_raw_fd(), d.path()).is_err());
        drop(other_run);
        // Held through this open file: accepted.
        let f = open_turn(d.path()).unwrap();
        flock(f.as_fd(), FlockOperation::LockExclusive).unwrap();
        let kept = f.try_clone().unwrap();
        let t = Turn::inherited(f.into_raw_fd(), d.path()).unwrap();
        // Another file: refused.
        let other = d.path().join("other");
        std::fs::write(&other, "").unwrap();
        let o = File::open(&other).unwrap();
        assert!(Turn::inherited(o.into_raw_fd(), d.path()).is_err());
        drop((t, kept));
        assert!(matches!(
            Turn::take(d.path(), "t", &irq).unwrap(),
            Taken::Turn(_)
        ));
    }

    #[test]
    fn a_run_tmp_starts_empty_and_goes_with_everything_else() {
        let d = tempfile::tempdir().unwrap();
        let tmp = d.path().join("tmp");
        let spill = d.path().join("spill");
        std::fs::create_dir(&tmp).unwrap();
        std::fs::create_dir(&spill).unwrap();
        std::fs::create_dir(tmp.join("old")).unwrap();
        std::fs::write(tmp.join("old/.gitconfig"), "x").unwrap();
        let outside = d.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), "x").unwrap();
        std::os::unix::fs::symlink(&outside, tmp.join("link")).unwrap();
        std::fs::write(spill.join(crate::net::audit::FILE), "refused\n").unwrap();
        let st = VmState {
            name: "t".into(),
            pid: 0,
            start_time: None,
            program: PathBuf::new(),
            project: PathBuf::new(),
            policy: String::new(),
            idle_secs: 0,
            state: super::super::Phase::Ready,
            error: None,
            tmp: tmp.clone(),
            spill: spill.clone(),
            shares: Vec::new(),
            accel: String::new(),
            started_unix: 0,
            console: PathBuf::new(),
            faulted: false,
        };
        let run = RunTmp::make(&st, "run1").unwrap();
        let names: Vec<_> = std::fs::read_dir(&tmp)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["run1"]);
        assert_eq!(std::fs::read_dir(&run.path).unwrap().count(), 0);
        assert_eq!(
            std::fs::metadata(spill.join(crate::net::audit::FILE))
                .unwrap()
                .len(),
            0
        );
        std::fs::write(run.path.join("left"), "x").unwrap();
        std::fs::write(tmp.join("beside"), "x").unwrap();
        // A planted directory of the next run's name is removed first.
        drop(run);
        assert_eq!(std::fs::read_dir(&tmp).unwrap().count(), 0);
        assert!(outside.join("keep").exists(), "a link was followed");
    }
}
