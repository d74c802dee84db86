//! The image cache directory: where images live, which entries are complete,
//! who may remove what, and removal that never leaves the cache.
//!
//! Layout under the cache root (`$XDG_CACHE_HOME/hull/images`):
//! - `<id>/`: a complete image (it has a valid `manifest.json`, written last);
//! - `<id>.partial-<pid>/`: a build in progress, or the remains of one that failed
//!   or was interrupted (never used as an image);
//! - `<id>.lock`: an OS file lock. A build holds it exclusively (and so does every
//!   process the build started: the lock file is the build script's stdin); a VM
//!   using the image holds it shared, so the image is not removed or rebuilt under it;
//! - `bases/<key>/`: the guest's own system (rootfs, kernel, initrd), the same for
//!   every image of one recipe whatever its container's userland: `build.sh` keeps it
//!   and copies it into the next build of another userland, and keeps only the
//!   current recipe's (not an image: never listed, never booted).
//!
//! Guards against: an interrupted build counting as built (only the final rename
//! publishes a directory under the bare id), removing a partial that a live build
//! still writes, removing an image a VM uses, and a removal that follows a symlink
//! or descends into a file system mounted inside a partial (an interrupted
//! mmdebstrap can leave `proc`, `sys` or `dev` mounted in its rootfs): mounts below
//! the directory are detached first and removal refuses to cross a device boundary.
//! Another local user cannot write anything in it: the root is checked private, and
//! every directory on the way to it root's or ours, before anything in it is read or
//! written (`private_dir`).

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};

use super::recipe::ID_LEN;

/// The directory of the kept guest systems under the cache root (`build.sh`
/// owns what is inside).
pub const GUEST_BASES: &str = "bases";
use super::ImageError;

/// The cache root and the names inside it.
#[derive(Debug, Clone)]
pub struct Cache {
    root: PathBuf,
}

/// One entry of the cache directory.
#[derive(Debug)]
pub enum Entry {
    /// A complete image.
    Built(Box<super::BuiltImage>),
    /// A build directory: `live` while its build still runs.
    Partial {
        id: String,
        dir: PathBuf,
        live: bool,
    },
    /// A directory named like an image whose manifest is missing or invalid.
    Broken {
        id: String,
        dir: PathBuf,
        reason: String,
    },
}

impl Cache {
    /// The cache under `root` (created on first build).
    pub fn at(root: impl Into<PathBuf>) -> Cache {
        Cache { root: root.into() }
    }

    /// `$HULL_IMAGE_CACHE`, else `$XDG_CACHE_HOME/hull/images`, else
    /// `~/.cache/hull/images` (`%LOCALAPPDATA%\hull\images` on Windows).
    pub fn default_location() -> Result<Cache, ImageError> {
        crate::state::image_cache_root()
            .map(Cache::at)
            .ok_or(ImageError::NoCacheDir)
    }

    /// The root, made (0700) if missing, held open and checked private:
    /// ours, writable by nobody else, every directory on the way root's or
    /// ours, no entry of anyone else's (`private_dir`). Before anything is
    /// read from or written to the cache.
    pub fn open_private(&self) -> Result<super::private_dir::PrivateDir, ImageError> {
        let root = std::path::absolute(&self.root)
            .map_err(ImageError::io(&self.root, "resolve the image cache"))?;
        super::private_dir::PrivateDir::open(&root).map_err(|e| ImageError::NotPrivate {
            root: self.root.clone(),
            reason: e.to_string(),
        })
    }

    /// [`Cache::open_private`], the root then let go.
    pub fn check_private(&self) -> Result<(), ImageError> {
        self.open_private().map(drop)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where the complete image `id` lives.
    pub fn image_dir(&self, id: &str) -> PathBuf {
        self.root.join(id)
    }

    /// This process's build directory for `id`.
    pub fn partial_dir(&self, id: &str) -> PathBuf {
        self.root
            .join(format!("{id}.partial-{}", std::process::id()))
    }

    /// The lock file of image `id`.
    pub fn lock_path(&self, id: &str) -> PathBuf {
        self.root.join(format!("{id}.lock"))
    }

    /// Open (creating) the lock file of `id`, without locking it: in the
    /// root checked private, relative to its descriptor, never through a
    /// link, and only a regular file of ours.
    pub fn lock_file(&self, id: &str) -> Result<File, ImageError> {
        let path = self.lock_path(id);
        let dir = self.open_private()?;
        dir.open_lock(&format!("{id}.lock"))
            .map_err(ImageError::io(&path, "open the image lock"))
    }

    /// Every entry, sorted by name. A missing cache directory is an empty cache.
    pub fn entries(&self) -> Result<Vec<Entry>, ImageError> {
        let rd = match fs::read_dir(&self.root) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(ImageError::io(&self.root, "list the image cache")(e)),
        };
        let mut names: Vec<String> = rd
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        names.sort();
        let mut out = Vec::new();
        for name in names {
            let dir = self.root.join(&name);
            if is_id(&name) {
                match super::BuiltImage::open(&dir) {
                    Ok(img) => out.push(Entry::Built(Box::new(img))),
                    Err(e) => out.push(Entry::Broken {
                        id: name,
                        dir,
                        reason: hull_protocol::error_chain(&e),
                    }),
                }
            } else if let Some(id) = partial_id(&name) {
                let live = self.build_is_live(id);
                out.push(Entry::Partial {
                    id: id.to_owned(),
                    dir,
                    live,
                });
            }
        }
        Ok(out)
    }

    /// Whether some process holds the lock of `id` (a build, or a VM using it).
    fn build_is_live(&self, id: &str) -> bool {
        match self.lock_file(id) {
            Ok(f) => match f.try_lock() {
                Ok(()) => {
                    let _ = f.unlock();
                    false
                }
                Err(_) => true,
            },
            Err(_) => true,
        }
    }

    /// Remove every partial directory of `id`. The caller holds the lock of `id`
    /// exclusively, so none of them belongs to a running build.
    pub fn remove_partials_locked(&self, id: &str) -> Result<(), ImageError> {
        for entry in self.entries()? {
            if let Entry::Partial { id: pid, dir, .. } = entry {
                if pid == id {
                    remove_tree(&dir)?;
                }
            }
        }
        Ok(())
    }
}

impl Cache {
    /// Removes every partial build whose lock nobody holds (a build that
    /// failed, or whose hull and script were killed), holding that lock
    /// while it removes; returns each one's name and the bytes freed.
    pub fn remove_dead_partials(&self) -> Result<Vec<(String, u64)>, ImageError> {
        let mut removed = Vec::new();
        for entry in self.entries()? {
            let Entry::Partial {
                id,
                dir,
                live: false,
            } = entry
            else {
                continue;
            };
            let lock = self.lock_file(&id)?;
            if lock.try_lock().is_err() {
                continue; // a build of it started since
            }
            let bytes = super::dir_usage(&dir);
            remove_tree(&dir)?;
            let name = dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            removed.push((name, bytes));
        }
        Ok(removed)
    }
}

/// `<16 hex digits>`
pub fn is_id(s: &str) -> bool {
    s.len() == ID_LEN
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The id of a `<id>.partial-<pid>` name.
pub fn partial_id(s: &str) -> Option<&str> {
    let (id, pid) = s.split_once(".partial-")?;
    (is_id(id) && !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit())).then_some(id)
}

/// Remove `dir` and everything below it, without following symlinks and without
/// entering another file system: mounts below `dir` are detached first (Linux), and
/// a directory on another device stops the removal with an error.
pub fn remove_tree(dir: &Path) -> Result<(), ImageError> {
    let meta = match fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(ImageError::io(dir, "inspect before removal")(e)),
    };
    if !meta.is_dir() {
        return Err(ImageError::RemoveRefused {
            path: dir.to_path_buf(),
            reason: "not a directory".into(),
        });
    }
    #[cfg(target_os = "linux")]
    detach_mounts_below(dir)?;
    imp::remove_below(dir, &meta)?;
    fs::remove_dir(dir).map_err(ImageError::io(dir, "remove"))
}

#[cfg(unix)]
mod imp {
    use std::fs;
    use std::os::unix::fs::MetadataExt;
    use std::path::Path;

    use super::ImageError;

    pub(super) fn remove_below(dir: &Path, top: &fs::Metadata) -> Result<(), ImageError> {
        let rd = fs::read_dir(dir).map_err(ImageError::io(dir, "list for removal"))?;
        for entry in rd {
            let entry = entry.map_err(ImageError::io(dir, "list for removal"))?;
            let path = entry.path();
            let meta = fs::symlink_metadata(&path)
                .map_err(ImageError::io(&path, "inspect for removal"))?;
            if meta.is_dir() {
                if meta.dev() != top.dev() {
                    return Err(ImageError::RemoveRefused {
                        path,
                        reason: "it is on another file system (still mounted?)".into(),
                    });
                }
                remove_below(&path, top)?;
                fs::remove_dir(&path).map_err(ImageError::io(&path, "remove"))?;
            } else {
                fs::remove_file(&path).map_err(ImageError::io(&path, "remove"))?;
            }
        }
        Ok(())
    }
}

#[cfg(not(unix))]
mod imp {
    use std::fs;
    use std::path::Path;

    use super::ImageError;

    pub(super) fn remove_below(dir: &Path, _top: &fs::Metadata) -> Result<(), ImageError> {
        // std's remove_dir_all does not follow symlinks or junctions.
        for entry in fs::read_dir(dir).map_err(ImageError::io(dir, "list for removal"))? {
            let path = entry
                .map_err(ImageError::io(dir, "list for removal"))?
                .path();
            let meta = fs::symlink_metadata(&path)
                .map_err(ImageError::io(&path, "inspect for removal"))?;
            if meta.is_dir() {
                fs::remove_dir_all(&path).map_err(ImageError::io(&path, "remove"))?;
            } else {
                fs::remove_file(&path).map_err(ImageError::io(&path, "remove"))?;
            }
        }
        Ok(())
    }
}

/// Detach every mount at or below `dir`, deepest first.
#[cfg(target_os = "linux")]
fn detach_mounts_below(dir: &Path) -> Result<(), ImageError> {
    let real = fs::canonicalize(dir).map_err(ImageError::io(dir, "resolve before removal"))?;
    let info = fs::read_to_string("/proc/self/mountinfo")
        .map_err(ImageError::io(Path::new("/proc/self/mountinfo"), "read"))?;
    let mut points: Vec<PathBuf> = mount_points(&info)
        .into_iter()
        .filter(|p| p.starts_with(&real) && *p != real)
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for p in points {
        rustix::mount::unmount(&p, rustix::mount::UnmountFlags::DETACH).map_err(|e| {
            ImageError::RemoveRefused {
                path: p.clone(),
                reason: format!("a file system is mounted there and unmounting it failed: {e}"),
            }
        })?;
    }
    Ok(())
}

/// Mount points (field 5) of `/proc/self/mountinfo`, with `\ooo` escapes decoded.
#[cfg(any(target_os = "linux", test))]
pub fn mount_points(mountinfo: &str) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|field| PathBuf::from(hull_exec::mountinfo::unescape(field)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(is_id("0123456789abcdef"));
        assert!(!is_id("0123456789ABCDEF"));
        assert!(!is_id("0123456789abcde"));
        assert_eq!(
            partial_id("0123456789abcdef.partial-42"),
            Some("0123456789abcdef")
        );
        assert_eq!(partial_id("0123456789abcdef.partial-"), None);
        assert_eq!(partial_id("0123456789abcdef.partial-4x"), None);
        assert_eq!(partial_id("xyz.partial-1"), None);
    }

    #[test]
    fn mountinfo_points_are_unescaped() {
        let info = "36 35 98:0 / /mnt/a\\040b rw,noatime master:1 - ext3 /dev/root rw\n\
                    37 35 0:5 / /proc rw - proc proc rw\n";
        assert_eq!(
            mount_points(info),
            vec![PathBuf::from("/mnt/a b"), PathBuf::from("/proc")]
        );
    }

    #[cfg(unix)]
    #[test]
    fn remove_tree_does_not_follow_symlinks() {
        let outside = tempfile::tempdir().unwrap();
        let keep = outside.path().join("keep");
        fs::write(&keep, b"keep").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("img");
        fs::create_dir_all(victim.join("a/b")).unwrap();
        fs::write(victim.join("a/b/f"), b"x").unwrap();
        std::os::unix::fs::symlink(outside.path(), victim.join("a/link")).unwrap();
        remove_tree(&victim).unwrap();
        assert!(!victim.exists());
        assert_eq!(fs::read(&keep).unwrap(), b"keep");
    }

    #[cfg(unix)]
    #[test]
    fn removal_refuses_a_directory_on_another_device() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("sub")).unwrap();
        fs::write(dir.path().join("sub/f"), b"x").unwrap();
        // Pretend the top was on /proc's device: every directory below differs.
        let other = fs::symlink_metadata("/proc").unwrap();
        let err = imp::remove_below(dir.path(), &other).unwrap_err();
        assert!(matches!(err, ImageError::RemoveRefused { .. }), "{err}");
        assert_eq!(fs::read(dir.path().join("sub/f")).unwrap(), b"x");
    }

    /// A partial with a live mount inside (as an interrupted mmdebstrap leaves):
    /// removal detaches it and never deletes what the mount shows.
    #[cfg(target_os = "linux")]
    #[test]
    #[ignore = "needs root (mounts a tmpfs); run with --ignored as root"]
    fn removal_detaches_mounts_inside() {
        let shown = tempfile::tempdir().unwrap();
        fs::write(shown.path().join("precious"), b"keep").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("p");
        fs::create_dir_all(victim.join("rootfs/dev")).unwrap();
        rustix::mount::mount_bind(shown.path(), victim.join("rootfs/dev"))
            .expect("bind mount (needs root)");
        remove_tree(&victim).unwrap();
        assert!(!victim.exists());
        assert_eq!(fs::read(shown.path().join("precious")).unwrap(), b"keep");
    }

    #[cfg(unix)]
    #[test]
    fn a_cache_others_can_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("images");
        let cache = Cache::at(&root);
        cache.check_private().unwrap();
        assert!(root.is_dir());
        fs::set_permissions(&root, fs::Permissions::from_mode(0o777)).unwrap();
        let e = cache.check_private().unwrap_err();
        assert!(e.to_string().contains("writable by group or others"), "{e}");
        fs::remove_dir(&root).unwrap();
        std::os::unix::fs::symlink(dir.path(), &root).unwrap();
        assert!(cache.check_private().is_err());
    }

    #[test]
    fn partials_and_broken_entries_are_listed_not_built() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::at(dir.path());
        fs::create_dir_all(dir.path().join("0123456789abcdef.partial-1")).unwrap();
        fs::create_dir_all(dir.path().join("fedcba9876543210")).unwrap();
        fs::create_dir_all(dir.path().join("unrelated")).unwrap();
        let entries = cache.entries().unwrap();
        assert_eq!(entries.len(), 2, "{entries:?}");
        assert!(
            matches!(&entries[0], Entry::Partial { id, live: false, .. } if id == "0123456789abcdef")
        );
        assert!(matches!(&entries[1], Entry::Broken { id, .. } if id == "fedcba9876543210"));
        // A held lock makes the partial live.
        let lock = cache.lock_file("0123456789abcdef").unwrap();
        lock.lock().unwrap();
        let entries = cache.entries().unwrap();
        assert!(matches!(&entries[0], Entry::Partial { live: true, .. }));
    }
}
