//! What a QEMU binary says about itself (its version, whether it has
//! `-sandbox`, whether it has the KVM accelerator), asked once per binary
//! and kept in the user's cache, so that a run does not start QEMU three
//! times before it starts the VM (40 to 200 ms each here).
//!
//! The key is the binary's identity (its path, device, inode, size, mtime
//! and ctime): a QEMU that is upgraded, replaced or rewritten is a new
//! inode or a new ctime, which no one can set back, and is asked again.
//!
//! Guards against: a fact read from a file another user could write (the
//! directory must be the user's own and writable by no one else, the file
//! the user's own regular file, opened without following a link and
//! bounded in size); a stale or forged fact weakening the VM: only facts
//! whose error fails closed are taken from the cache. A cached `sandbox`
//! that is false is asked again (a forged false would start QEMU without
//! its seccomp filter; a forged true makes QEMU refuse its argv), and a
//! wrong `kvm` at worst chooses TCG or a KVM probe boot that fails.

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The cache directory's name, below hull's cache dir.
const DIR: &str = "qemu";
/// Largest facts file read.
const MAX_BYTES: u64 = 4096;

/// What QEMU said.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Facts {
    /// The first line of `qemu -version`, if it answered.
    pub version: Option<String>,
    /// `qemu -sandbox on,... -version` succeeded.
    pub sandbox: bool,
    /// `qemu -accel help` lists `kvm`.
    pub kvm: bool,
}

#[derive(Serialize, Deserialize)]
struct Stored {
    key: String,
    facts: Facts,
}

/// The facts of `qemu`: from the cache when they are there for this very
/// binary, else asked (and kept). Once per binary and process either way.
pub fn of(qemu: &Path) -> Facts {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static SEEN: OnceLock<Mutex<HashMap<PathBuf, Facts>>> = OnceLock::new();
    let seen = SEEN.get_or_init(Default::default);
    if let Some(f) = seen.lock().ok().and_then(|m| m.get(qemu).cloned()) {
        return f;
    }
    let f = of_in(qemu, crate::state::cache_root().as_deref(), &ask);
    if let Ok(mut m) = seen.lock() {
        m.insert(qemu.to_path_buf(), f.clone());
    }
    f
}

/// [`of`] with hull's cache directory `dir` (none: no cache) and QEMU
/// asked by `ask(qemu, cached)`, which asks only what `cached` does not
/// settle.
fn of_in(qemu: &Path, dir: Option<&Path>, ask: &dyn Fn(&Path, Option<&Facts>) -> Facts) -> Facts {
    let Some(key) = key(qemu) else {
        return ask(qemu, None);
    };
    let name = format!("{}.json", &key[..32]);
    let cached = dir
        .and_then(|d| read(d, &name))
        .and_then(|s: Stored| (s.key == key).then_some(s.facts));
    if let Some(c) = &cached {
        if c.sandbox {
            return c.clone();
        }
    }
    let f = ask(qemu, cached.as_ref());
    if let Some(d) = dir {
        if let Err(e) = write(
            d,
            &name,
            &Stored {
                key,
                facts: f.clone(),
            },
        ) {
            tracing::debug!("cannot keep QEMU's facts in {}: {e}", d.join(DIR).display());
        }
    }
    f
}

/// Asks QEMU; `cached` facts that fail closed are kept (see the module).
fn ask(qemu: &Path, cached: Option<&Facts>) -> Facts {
    Facts {
        version: match cached {
            Some(c) if c.version.is_some() => c.version.clone(),
            _ => crate::qemu::version(qemu),
        },
        sandbox: crate::qemu::probe_sandbox(qemu),
        kvm: match cached {
            Some(c) => c.kvm,
            None => crate::qemu::probe_kvm(qemu),
        },
    }
}

/// The binary's identity, hashed: None when it cannot be read.
fn key(qemu: &Path) -> Option<String> {
    let m = std::fs::metadata(qemu).ok()?;
    let mut h = Sha256::new();
    for part in [
        qemu.as_os_str().as_encoded_bytes().to_vec(),
        m.dev().to_le_bytes().to_vec(),
        m.ino().to_le_bytes().to_vec(),
        m.size().to_le_bytes().to_vec(),
        m.mtime().to_le_bytes().to_vec(),
        m.mtime_nsec().to_le_bytes().to_vec(),
        m.ctime().to_le_bytes().to_vec(),
        m.ctime_nsec().to_le_bytes().to_vec(),
    ] {
        h.update(&part);
        h.update([0]);
    }
    Some(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Whether an open directory is the user's own and writable by no one else.
fn check_private(fd: &OwnedFd, what: &dyn Fn() -> String) -> std::io::Result<()> {
    let st = rustix::fs::fstat(fd)?;
    if st.st_uid != rustix::process::geteuid().as_raw() || st.st_mode & 0o022 != 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "{} is not private to this user (owner {}, mode {:o})",
                what(),
                st.st_uid,
                st.st_mode & 0o7777
            ),
        ));
    }
    Ok(())
}

/// hull's cache directory `root` and its [`DIR`] in it, each opened
/// without following a link and checked private; [`DIR`] is made (0700,
/// relative to `root`'s descriptor) when `make` says so. `root` itself is
/// never made here: without it nothing is kept.
fn open_dir(root: &Path, make: bool) -> std::io::Result<OwnedFd> {
    let flags = OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::RDONLY;
    let r = rustix::fs::open(root, flags, Mode::empty())?;
    check_private(&r, &|| root.display().to_string())?;
    if make {
        match rustix::fs::mkdirat(&r, DIR, Mode::from_raw_mode(0o700)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let d = rustix::fs::openat(&r, DIR, flags, Mode::empty())?;
    check_private(&d, &|| root.join(DIR).display().to_string())?;
    Ok(d)
}

fn read<T: for<'de> Deserialize<'de>>(root: &Path, name: &str) -> Option<T> {
    let d = open_dir(root, false).ok()?;
    let fd = rustix::fs::openat(
        &d,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let st = rustix::fs::fstat(&fd).ok()?;
    let regular =
        rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::RegularFile;
    if !regular || st.st_uid != rustix::process::geteuid().as_raw() || st.st_size as u64 > MAX_BYTES
    {
        return None;
    }
    let mut text = Vec::new();
    std::fs::File::from(fd)
        .take(MAX_BYTES)
        .read_to_end(&mut text)
        .ok()?;
    serde_json::from_slice(&text).ok()
}

/// Writes `value` as `name` in [`DIR`] below `root` (a new file renamed
/// over it).
fn write<T: Serialize>(root: &Path, name: &str, value: &T) -> std::io::Result<()> {
    let d = open_dir(root, true)?;
    let tmp = format!(".{name}.{}", std::process::id());
    let fd = rustix::fs::openat(
        &d,
        &tmp,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )?;
    let text = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    let written = std::fs::File::from(fd).write_all(&text);
    let renamed = written.and_then(|()| Ok(rustix::fs::renameat(&d, &tmp, &d, name)?));
    if renamed.is_err() {
        let _ = rustix::fs::unlinkat(&d, &tmp, rustix::fs::AtFlags::empty());
    }
    renamed
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// hull's cache directory, as the user's own 0700 one.
    fn private_root(dir: &Path) -> PathBuf {
        use std::os::unix::fs::DirBuilderExt;
        let root = dir.join("hull");
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&root)
            .unwrap();
        root
    }

    fn fake_qemu(dir: &Path) -> PathBuf {
        let q = dir.join("qemu-system-x86_64");
        std::fs::write(&q, "#!/bin/sh\n").unwrap();
        q
    }

    #[test]
    fn facts_are_asked_once_per_binary_and_again_when_it_changes() {
        let t = tempfile::tempdir().unwrap();
        let q = fake_qemu(t.path());
        let root = private_root(t.path());
        let cache = root.join(DIR);
        let asked = Cell::new(0);
        let ask = |_: &Path, _: Option<&Facts>| {
            asked.set(asked.get() + 1);
            Facts {
                version: Some(format!("QEMU {}", asked.get())),
                sandbox: true,
                kvm: false,
            }
        };
        let first = of_in(&q, Some(&root), &ask);
        assert_eq!(first.version.as_deref(), Some("QEMU 1"));
        assert_eq!(of_in(&q, Some(&root), &ask), first);
        assert_eq!(asked.get(), 1, "the second answer came from the cache");
        let mode = std::fs::metadata(&cache).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o700);
        // A rewritten binary (a new ctime, whatever its mtime) is asked again.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&q, "#!/bin/sh\n# upgraded\n").unwrap();
        assert_eq!(
            of_in(&q, Some(&root), &ask).version.as_deref(),
            Some("QEMU 2")
        );
        assert_eq!(asked.get(), 2);
    }

    #[test]
    fn a_cached_missing_sandbox_is_asked_again() {
        let t = tempfile::tempdir().unwrap();
        let q = fake_qemu(t.path());
        let root = private_root(t.path());
        let sandbox = Cell::new(false);
        let asked = Cell::new(0);
        let ask = |_: &Path, _: Option<&Facts>| {
            asked.set(asked.get() + 1);
            Facts {
                version: None,
                sandbox: sandbox.get(),
                kvm: false,
            }
        };
        assert!(!of_in(&q, Some(&root), &ask).sandbox);
        sandbox.set(true);
        assert!(
            of_in(&q, Some(&root), &ask).sandbox,
            "a false is never taken from the cache"
        );
        assert_eq!(asked.get(), 2);
    }

    #[test]
    fn a_cache_others_may_write_or_a_planted_link_is_not_read() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let q = fake_qemu(t.path());
        let root = private_root(t.path());
        let cache = root.join(DIR);
        let asked = Cell::new(0);
        let ask = |_: &Path, _: Option<&Facts>| {
            asked.set(asked.get() + 1);
            Facts {
                version: None,
                sandbox: true,
                kvm: false,
            }
        };
        of_in(&q, Some(&root), &ask);
        assert_eq!(asked.get(), 1);
        // Writable by the group: not read (and not written).
        std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o770)).unwrap();
        of_in(&q, Some(&root), &ask);
        assert_eq!(asked.get(), 2);
        std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o700)).unwrap();
        // The facts file replaced by a link to a file of the same text: not followed.
        let file = std::fs::read_dir(&cache)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|e| e == "json"))
            .unwrap();
        let elsewhere = t.path().join("elsewhere.json");
        std::fs::rename(&file, &elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &file).unwrap();
        assert!(of_in(&q, Some(&root), &ask).sandbox);
        assert_eq!(asked.get(), 3, "a link is not read");
        // The rename over the link replaced the link, not its target.
        assert!(std::fs::symlink_metadata(&file).unwrap().is_file());
        // A directory link in place of the cache: not read, nothing
        // written through it.
        let real = t.path().join("real");
        std::fs::rename(&cache, &real).unwrap();
        std::os::unix::fs::symlink(&real, &cache).unwrap();
        let before: Vec<_> = std::fs::read_dir(&real).unwrap().collect();
        of_in(&q, Some(&root), &ask);
        assert_eq!(asked.get(), 4, "a linked cache directory is not read");
        assert_eq!(std::fs::read_dir(&real).unwrap().count(), before.len());
        // hull's cache directory itself a link: nothing is made below it.
        let other = t.path().join("other");
        std::fs::create_dir(&other).unwrap();
        std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o700)).unwrap();
        let linked = t.path().join("linked");
        std::os::unix::fs::symlink(&other, &linked).unwrap();
        of_in(&q, Some(&linked), &ask);
        assert_eq!(asked.get(), 5);
        assert_eq!(std::fs::read_dir(&other).unwrap().count(), 0);
    }
}
