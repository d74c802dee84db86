//! TEMPORARY shim until the runtime module lands (instance dirs and lock).
pub mod spill;

use std::path::{Path, PathBuf};

pub fn runs_root() -> PathBuf {
    std::env::var_os("HULL_RUNS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("hull-runs"))
}

#[cfg(unix)]
pub type LockFd = std::os::fd::RawFd;
#[cfg(not(unix))]
pub type LockFd = ();

#[derive(Debug)]
pub struct Instance {
    id: String,
    dir: PathBuf,
    tmp: PathBuf,
    spill: PathBuf,
    lock: std::fs::File,
}

impl Instance {
    pub fn create(runs: &Path) -> std::io::Result<Instance> {
        let id = uuid::Uuid::new_v4().to_string();
        Self::open(runs, &id)
    }
    pub fn join(runs: &Path, id: &str) -> std::io::Result<Instance> {
        Self::open(runs, id)
    }
    fn open(runs: &Path, id: &str) -> std::io::Result<Instance> {
        let dir = runs.join(id);
        let tmp = dir.join("tmp");
        let spill = dir.join("spill");
        std::fs::create_dir_all(&tmp)?;
        std::fs::create_dir_all(&spill)?;
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(".active"))?;
        #[cfg(unix)]
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockShared)?;
        Ok(Instance {
            id: id.to_string(),
            dir,
            tmp,
            spill,
            lock,
        })
    }
    pub fn id(&self) -> &str {
        &self.id
    }
    pub fn dir(&self) -> &Path {
        &self.dir
    }
    pub fn tmp(&self) -> &Path {
        &self.tmp
    }
    pub fn spill(&self) -> &Path {
        &self.spill
    }
    #[cfg(unix)]
    pub fn lock_raw_fd(&self) -> LockFd {
        std::os::fd::AsRawFd::as_raw_fd(&self.lock)
    }
    #[cfg(not(unix))]
    pub fn lock_raw_fd(&self) -> LockFd {}
    pub fn finish(self) {
        let _ = std::fs::remove_dir_all(&self.tmp);
    }
}
