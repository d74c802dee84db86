//! Placeholders: the empty directories and files hull creates where a
//! protected path inside a writable root does not exist yet (`.git`, `.hull`,
//! a shell startup file), so that a mask has something to be mounted on.
//! They exist only while a run or a VM uses them.
//!
//! Every node is created and removed with `*at()` calls on directory
//! descriptors opened one component at a time from the writable root, never
//! following a symlink, so a link the command planted cannot redirect
//! either step. A registry in hull's private runs root records the nodes hull
//! created (device and inode, with the path), so a file of the user's that
//! happens to be empty is never taken for one of ours.
//!
//! Several runs may need one placeholder at once (two runs on one project, a
//! kept VM beside runs): each holds a shared `flock` on the node while it
//! uses it, and removal takes the exclusive lock without waiting, so the last
//! user removes it and nobody removes it from under another (which would
//! detach that run's mask). Creating, finding and removing happen under one
//! lock on the registry, so a node is never seen between its creation and
//! its registration.

// A command can write the trees this module works on: no path-based
// filesystem call (clippy.toml).
#![deny(clippy::disallowed_methods)]

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{
    flock, fstat, mkdirat, openat, statat, unlinkat, AtFlags, FlockOperation, Mode, OFlags,
};
use rustix::io::Errno;

/// The registry's directory inside the runs root.
const REGISTRY_DIR: &str = "placeholders";
/// Serializes creation, lookup and removal across hull processes.
const REGISTRY_LOCK: &str = ".lock";

/// A placeholder a plan asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    /// The protected path.
    pub path: PathBuf,
    /// The writable root it lies in (an ancestor of `path`).
    pub root: PathBuf,
    /// A directory (`.git`, `.hull`) or an empty file (a shell startup file).
    pub dir: bool,
    /// The plan saw something there: held only when it is a placeholder of
    /// hull's (another run's, which would otherwise remove it from under
    /// this one when it ends), made again if it has gone since, left alone
    /// when it is the user's.
    pub seen: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum PlaceholderError {
    #[error("cannot create placeholder {path} (it keeps the protected path covered): {source}")]
    Create {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "cannot create placeholder {path}: {found} is there (something replaced it while \
         hull prepared the run); refusing to run"
    )]
    Replaced { path: PathBuf, found: &'static str },
    #[error("placeholder {path} is not below its writable root {root}")]
    NotBelow { path: PathBuf, root: PathBuf },
    #[error("the placeholder registry {path}: {source}")]
    Registry {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// One node in use: its parent directory, its name, and the node itself
/// (held open with a shared lock).
#[derive(Debug)]
struct Node {
    path: PathBuf,
    parent: OwnedFd,
    name: OsString,
    node: OwnedFd,
    dir: bool,
}

/// The placeholders one run or VM uses; released (and removed when nobody
/// else uses them) by [`Held::release`] or on drop. Drop it only after
/// every process that relies on the masks is gone.
#[derive(Debug, Default)]
pub struct Held {
    registry: Option<PathBuf>,
    nodes: Vec<Node>,
}

/// Holds (creating what is missing) every placeholder in `wanted`, with
/// missing parent directories as placeholders of their own. `runs_root` is
/// hull's private runs root, which keeps the registry.
pub fn hold(wanted: &[Wanted], runs_root: &Path) -> Result<Held, PlaceholderError> {
    let mut held = Held::default();
    if wanted.is_empty() {
        return Ok(held);
    }
    let registry = open_registry(runs_root)?;
    let _guard = registry.lock()?;
    held.registry = Some(registry.dir.clone());
    for w in wanted {
        hold_one(w, &registry, &mut held)?;
    }
    Ok(held)
}

/// Whether `node` (open on `path`) is a placeholder hull made and still
/// records, as the registry in `runs_root` says; false when it cannot
/// tell. Read without the registry's lock: a placeholder made or removed
/// meanwhile is what a run that looks a moment earlier or later sees.
pub fn is_placeholder(runs_root: &Path, node: &OwnedFd, path: &Path) -> bool {
    open_registry(runs_root)
        .ok()
        .and_then(|r| r.is_ours(node, path).ok())
        .unwrap_or(false)
}

impl Held {
    /// The paths held, in creation order.
    pub fn paths(&self) -> impl Iterator<Item = &Path> {
        self.nodes.iter().map(|n| n.path.as_path())
    }

    /// Takes over the nodes `other` holds (released with these).
    pub fn absorb(&mut self, mut other: Held) {
        let registry = other.registry.take();
        if self.registry.is_none() {
            self.registry = registry;
        }
        self.nodes.append(&mut other.nodes);
    }

    /// Releases every node; removes those hull created that no one else
    /// holds and that are still empty. Errors are reported, not fatal: a
    /// placeholder left behind is what every earlier hull did.
    pub fn release(mut self) -> Vec<String> {
        self.release_all()
    }

    fn release_all(&mut self) -> Vec<String> {
        let mut problems = Vec::new();
        let Some(dir) = self.registry.take() else {
            return problems;
        };
        let registry = Registry { dir };
        let _guard = match registry.lock() {
            Ok(g) => g,
            Err(e) => {
                problems.push(e.to_string());
                self.nodes.clear();
                return problems;
            }
        };
        // Children before their parents.
        while let Some(n) = self.nodes.pop() {
            if let Err(e) = release_node(&n, &registry) {
                problems.push(format!("placeholder {}: {e}", n.path.display()));
            }
        }
        problems
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        for p in self.release_all() {
            tracing::warn!("{p}");
        }
    }
}

struct Registry {
    dir: PathBuf,
}

struct RegistryGuard(#[allow(dead_code)] File);

fn open_registry(runs_root: &Path) -> Result<Registry, PlaceholderError> {
    use super::instance::PrivateRootError;
    let root =
        super::instance::private_root(runs_root).map_err(|e| PlaceholderError::Registry {
            path: runs_root.to_path_buf(),
            source: match e {
                PrivateRootError::Io { source, .. } => source,
                PrivateRootError::Insecure(why) => io::Error::other(why),
            },
        })?;
    let dir = root.join(REGISTRY_DIR);
    super::fsx::ensure_private_dir(&dir).map_err(|source| PlaceholderError::Registry {
        path: dir.clone(),
        source,
    })?;
    Ok(Registry { dir })
}

impl Registry {
    fn err(&self, source: io::Error) -> PlaceholderError {
        PlaceholderError::Registry {
            path: self.dir.clone(),
            source,
        }
    }

    // The registry lies in the runs root, hull's own (no command has a
    // rule or a mount there), and its names hold no link.
    #[allow(clippy::disallowed_methods)]
    fn lock(&self) -> Result<RegistryGuard, PlaceholderError> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = self.dir.join(REGISTRY_LOCK);
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|e| self.err(e))?;
        lock(&f, FlockOperation::LockExclusive).map_err(|e| self.err(e))?;
        Ok(RegistryGuard(f))
    }

    fn entry(&self, node: &OwnedFd) -> io::Result<PathBuf> {
        let st = fstat(node)?;
        Ok(self.dir.join(format!("{:x}-{:x}", st.st_dev, st.st_ino)))
    }

    // The registry: hull's own (see `lock`).
    #[allow(clippy::disallowed_methods)]
    fn record(&self, node: &OwnedFd, path: &Path) -> io::Result<()> {
        std::fs::write(self.entry(node)?, path.as_os_str().as_bytes())
    }

    /// Whether hull created the node now at `path`.
    #[allow(clippy::disallowed_methods)] // the registry: hull's own (see `lock`)
    fn is_ours(&self, node: &OwnedFd, path: &Path) -> io::Result<bool> {
        match std::fs::read(self.entry(node)?) {
            Ok(bytes) => Ok(bytes == path.as_os_str().as_bytes()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    #[allow(clippy::disallowed_methods)] // the registry: hull's own (see `lock`)
    fn forget(&self, node: &OwnedFd) -> io::Result<()> {
        match std::fs::remove_file(self.entry(node)?) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

fn lock(f: &impl AsFd, op: FlockOperation) -> io::Result<bool> {
    loop {
        match flock(f, op) {
            Ok(()) => return Ok(true),
            Err(Errno::INTR) => continue,
            Err(Errno::WOULDBLOCK) => return Ok(false),
            Err(e) => return Err(e.into()),
        }
    }
}

fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

fn hold_one(w: &Wanted, registry: &Registry, held: &mut Held) -> Result<(), PlaceholderError> {
    let create_err = |path: &Path, e: io::Error| PlaceholderError::Create {
        path: path.to_path_buf(),
        source: e,
    };
    let rel = w
        .path
        .strip_prefix(&w.root)
        .ok()
        .filter(|r| {
            r.components().count() > 0 && r.components().all(|c| matches!(c, Component::Normal(_)))
        })
        .ok_or_else(|| PlaceholderError::NotBelow {
            path: w.path.clone(),
            root: w.root.clone(),
        })?;
    let mut dir: OwnedFd = openat(
        rustix::fs::CWD,
        &w.root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| create_err(&w.root, e.into()))?;
    let names: Vec<&OsStr> = rel.iter().collect();
    let mut path = w.root.clone();
    for (i, name) in names.iter().enumerate() {
        path.push(name);
        let last = i + 1 == names.len();
        let is_dir = !last || w.dir;
        if last && w.seen {
            // Only an empty directory or file can be one of ours; anything
            // else there is the user's, and stays as it is.
            if let Ok(st) = statat(&dir, *name, AtFlags::SYMLINK_NOFOLLOW) {
                let ft = rustix::fs::FileType::from_raw_mode(st.st_mode);
                let could_be_ours = if is_dir {
                    ft == rustix::fs::FileType::Directory
                } else {
                    ft == rustix::fs::FileType::RegularFile && st.st_size == 0
                };
                if !could_be_ours {
                    return Ok(());
                }
            }
        }
        let node = acquire(&dir, name, is_dir, &path, registry, held)?;
        if !last {
            dir = node;
        }
    }
    Ok(())
}

/// Finds or creates `name` in `parent`, locks it shared, and records it in
/// `held` when hull created it (now or in an earlier run). Returns a
/// descriptor of the node (for the next component).
fn acquire(
    parent: &OwnedFd,
    name: &OsStr,
    dir: bool,
    path: &Path,
    registry: &Registry,
    held: &mut Held,
) -> Result<OwnedFd, PlaceholderError> {
    let create_err = |e: io::Error| PlaceholderError::Create {
        path: path.to_path_buf(),
        source: e,
    };
    let created = if dir {
        match mkdirat(parent, name, Mode::from_raw_mode(0o755)) {
            Ok(()) => true,
            Err(Errno::EXIST) => false,
            Err(e) => return Err(create_err(e.into())),
        }
    } else {
        match openat(
            parent,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o644),
        ) {
            Ok(_) => true,
            Err(Errno::EXIST) => false,
            Err(e) => return Err(create_err(e.into())),
        }
    };
    let flags = if dir {
        dir_flags()
    } else {
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC
    };
    let node = match openat(parent, name, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::LOOP | Errno::NOTDIR) => {
            return Err(PlaceholderError::Replaced {
                path: path.to_path_buf(),
                found: if dir {
                    "a symlink or a file"
                } else {
                    "a symlink"
                },
            })
        }
        Err(e) => return Err(create_err(e.into())),
    };
    let st = fstat(&node).map_err(|e| create_err(e.into()))?;
    let ftype = rustix::fs::FileType::from_raw_mode(st.st_mode);
    let expected = if dir {
        rustix::fs::FileType::Directory
    } else {
        rustix::fs::FileType::RegularFile
    };
    if ftype != expected {
        return Err(PlaceholderError::Replaced {
            path: path.to_path_buf(),
            found: if dir { "a non-directory" } else { "a non-file" },
        });
    }
    let ours = if created {
        registry.record(&node, path).map_err(|e| registry.err(e))?;
        true
    } else {
        registry.is_ours(&node, path).map_err(|e| registry.err(e))?
    };
    if ours {
        // Exclusive holders take the registry lock first, which we hold:
        // this never waits.
        lock(&node, FlockOperation::LockShared).map_err(create_err)?;
        let parent = rustix::io::dup(parent).map_err(|e| create_err(e.into()))?;
        let keep = rustix::io::dup(&node).map_err(|e| create_err(e.into()))?;
        held.nodes.push(Node {
            path: path.to_path_buf(),
            parent,
            name: name.to_os_string(),
            node: keep,
            dir,
        });
    }
    Ok(node)
}

fn release_node(n: &Node, registry: &Registry) -> io::Result<()> {
    if !lock(&n.node, FlockOperation::NonBlockingLockExclusive)? {
        return Ok(()); // another run or VM uses it: the last one removes it
    }
    // Still the node at that name?
    let flags = AtFlags::SYMLINK_NOFOLLOW;
    let now = match statat(&n.parent, &n.name, flags) {
        Ok(st) => st,
        Err(Errno::NOENT) => return registry.forget(&n.node),
        Err(e) => return Err(e.into()),
    };
    let held = fstat(&n.node)?;
    if (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino) {
        return registry.forget(&n.node);
    }
    if n.dir {
        match unlinkat(&n.parent, &n.name, AtFlags::REMOVEDIR) {
            Ok(()) => {}
            // Something was put inside (a parent of a placeholder that
            // the command filled): it is no longer only ours.
            Err(Errno::NOTEMPTY | Errno::EXIST) => {}
            Err(e) => return Err(e.into()),
        }
    } else if held.st_size == 0 {
        unlinkat(&n.parent, &n.name, AtFlags::empty())?;
    }
    registry.forget(&n.node)
}

#[cfg(test)]
// Tests build their trees by path.
#[allow(clippy::disallowed_methods)]
mod tests {
    use super::*;

    struct Fixture {
        _t: tempfile::TempDir,
        runs: PathBuf,
        root: PathBuf,
        outside: PathBuf,
    }

    fn fixture() -> Fixture {
        let t = tempfile::tempdir().unwrap();
        let runs = t.path().join("runs");
        let root = t.path().join("home");
        let outside = t.path().join("outside");
        std::fs::create_dir(&root).unwrap();
        std::fs::create_dir(&outside).unwrap();
        Fixture {
            _t: t,
            runs,
            root,
            outside,
        }
    }

    fn want(f: &Fixture, rel: &str, dir: bool) -> Wanted {
        Wanted {
            seen: false,
            path: f.root.join(rel),
            root: f.root.clone(),
            dir,
        }
    }

    #[test]
    fn created_for_the_run_and_removed_after_it() {
        let f = fixture();
        let w = [
            want(&f, ".git", true),
            want(&f, ".bash_profile", false),
            want(&f, ".config/fish/config.fish", false),
        ];
        let held = hold(&w, &f.runs).unwrap();
        assert!(f.root.join(".git").is_dir());
        assert_eq!(std::fs::read(f.root.join(".bash_profile")).unwrap(), b"");
        assert!(f.root.join(".config/fish/config.fish").is_file());
        assert_eq!(held.paths().count(), 5);
        assert!(held.release().is_empty());
        let left: Vec<_> = std::fs::read_dir(&f.root).unwrap().collect();
        assert!(left.is_empty(), "{left:?}");
        // The registry forgot them too.
        let reg: Vec<_> = std::fs::read_dir(f.runs.join(REGISTRY_DIR))
            .unwrap()
            .flatten()
            .filter(|e| e.file_name() != REGISTRY_LOCK)
            .collect();
        assert!(reg.is_empty(), "{reg:?}");
    }

    /// A placeholder hull made is told from the user's own, which looks
    /// the same (an empty directory).
    #[test]
    #[allow(clippy::disallowed_methods)] // a test's own temp dir
    fn a_placeholder_is_told_from_the_user_s_own() {
        let f = fixture();
        let open = |p: &Path| {
            openat(
                rustix::fs::CWD,
                p,
                OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .unwrap()
        };
        let hull = f.root.join(".hull");
        let held = hold(&[want(&f, ".hull", true)], &f.runs).unwrap();
        assert!(is_placeholder(&f.runs, &open(&hull), &hull));
        drop(held);
        std::fs::create_dir(&hull).unwrap();
        assert!(!is_placeholder(&f.runs, &open(&hull), &hull));
    }

    #[test]
    fn the_last_user_removes_it() {
        let f = fixture();
        let w = [want(&f, ".hull", true)];
        let a = hold(&w, &f.runs).unwrap();
        let b = hold(&w, &f.runs).unwrap();
        assert!(a.release().is_empty());
        assert!(
            f.root.join(".hull").is_dir(),
            "removed under the second run"
        );
        drop(b);
        assert!(!f.root.join(".hull").exists());
    }

    #[test]
    fn what_the_user_had_is_never_removed() {
        let f = fixture();
        std::fs::write(f.root.join(".bashrc"), b"").unwrap();
        std::fs::create_dir(f.root.join(".git")).unwrap();
        let held = hold(
            &[want(&f, ".bashrc", false), want(&f, ".git", true)],
            &f.runs,
        )
        .unwrap();
        assert_eq!(held.paths().count(), 0);
        drop(held);
        assert!(f.root.join(".bashrc").is_file() && f.root.join(".git").is_dir());
    }

    /// A run whose plan saw another run's placeholder holds it too: the
    /// first run's end leaves it for the second, whose end removes it. What
    /// is the user's (not empty, or not registered) is never held.
    #[test]
    fn a_placeholder_another_run_made_is_held_by_a_run_that_saw_it() {
        let f = fixture();
        let a = hold(&[want(&f, ".git", true)], &f.runs).unwrap();
        let seen = Wanted {
            seen: true,
            ..want(&f, ".git", true)
        };
        let b = hold(std::slice::from_ref(&seen), &f.runs).unwrap();
        drop(a);
        assert!(
            f.root.join(".git").is_dir(),
            "removed from under the second run"
        );
        drop(b);
        assert!(!f.root.join(".git").exists());
        // Gone between the plan and the hold: made again, and removed after.
        let b = hold(std::slice::from_ref(&seen), &f.runs).unwrap();
        assert!(f.root.join(".git").is_dir());
        drop(b);
        assert!(!f.root.join(".git").exists());
        // The user's own, empty or not, stays.
        std::fs::create_dir(f.root.join(".git")).unwrap();
        std::fs::write(f.root.join(".bashrc"), b"mine\n").unwrap();
        let rc = Wanted {
            seen: true,
            ..want(&f, ".bashrc", false)
        };
        drop(hold(&[seen, rc], &f.runs).unwrap());
        assert!(f.root.join(".git").is_dir());
        assert_eq!(std::fs::read(f.root.join(".bashrc")).unwrap(), b"mine\n");
    }

    #[test]
    fn a_placeholder_written_to_stays() {
        let f = fixture();
        let held = hold(&[want(&f, ".zshrc", false)], &f.runs).unwrap();
        std::fs::write(f.root.join(".zshrc"), b"kept\n").unwrap();
        drop(held);
        assert_eq!(std::fs::read(f.root.join(".zshrc")).unwrap(), b"kept\n");
    }

    #[test]
    fn planted_links_are_not_followed() {
        let f = fixture();
        std::os::unix::fs::symlink(&f.outside, f.root.join(".config")).unwrap();
        let e = hold(&[want(&f, ".config/fish/config.fish", false)], &f.runs).unwrap_err();
        assert!(matches!(e, PlaceholderError::Replaced { .. }), "{e}");
        std::os::unix::fs::symlink(f.outside.join("x"), f.root.join(".bashrc")).unwrap();
        let e = hold(&[want(&f, ".bashrc", false)], &f.runs).unwrap_err();
        assert!(matches!(e, PlaceholderError::Replaced { .. }), "{e}");
        let outside: Vec<_> = std::fs::read_dir(&f.outside).unwrap().collect();
        assert!(outside.is_empty(), "created outside: {outside:?}");
        // Nothing was held, so nothing of the user's is removed.
        assert!(f.root.join(".config").is_symlink() && f.root.join(".bashrc").is_symlink());
    }

    #[test]
    fn a_path_outside_its_root_is_refused() {
        let f = fixture();
        let w = Wanted {
            seen: false,
            path: f.outside.join("x"),
            root: f.root.clone(),
            dir: true,
        };
        assert!(matches!(
            hold(&[w], &f.runs).unwrap_err(),
            PlaceholderError::NotBelow { .. }
        ));
    }
}
