//! Templates: a session's workspace kept under a name, for later sessions
//! to start from (`hull serve`: `POST /v1/sessions/{id}/template`, then
//! `"from": NAME`), each on a copy-on-write layer of its own over it.
//!
//! A template is a directory `<image cache>/templates/<NAME>/`: `meta.json`
//! (whose it is, what it was made from: tier, policy and its digest, image,
//! session, when) and `workspace/`, a copy of the session's workspace made
//! by [`crate::changes::copy_tree`] (from held descriptors, no link
//! followed, while the session's commands may still be writing). It is
//! made under a name of its own and renamed when whole. A session started
//! from it holds `<NAME>.lock` shared for its life; removal takes it
//! exclusively, or refuses while one is in use.
//!
//! What is carried, on the process tiers: the workspace only (the session's
//! processes, `/tmp` and home are not); nothing of the environment its
//! execs were given.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};
use serde::{Deserialize, Serialize};

const DIR: &str = "templates";
const META: &str = "meta.json";
const WORKSPACE: &str = "workspace";
/// What a template's workspace may hold.
pub const MAX_ENTRIES: u64 = 1_000_000;
pub const MAX_BYTES: u64 = 32 << 30;

#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error(
        "template name {0:?}: 1 to 64 letters, digits, `.`, `_` or `-`, not starting with `.` \
         nor ending in `.lock`"
    )]
    Name(String),
    #[error("template {0} exists already (`hull templates rm {0}` removes it)")]
    Exists(String),
    #[error("no template {0} (`hull templates list` shows them)")]
    NotFound(String),
    #[error("template {0} is in use by a session started from it; it is removed when none is")]
    InUse(String),
    #[error("template {name}: its workspace: {source}")]
    Copy {
        name: String,
        #[source]
        source: crate::changes::CopyError,
    },
    #[error("template {name}: cannot {what}: {source}")]
    Io {
        name: String,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Cache(#[from] crate::vm::image::ImageError),
}

/// What a template was made from, checked when a session starts from it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    pub name: String,
    /// The uid of the caller whose session it was made from: only theirs.
    pub owner: u32,
    pub tier: String,
    /// The policy as the session named it, and the digest of its text.
    pub policy: String,
    pub policy_sha256: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    pub made_unix: u64,
    pub from_session: String,
    /// What its workspace holds: entries and bytes, and how many entries
    /// were left out (fifos, sockets, devices, entries that changed kind
    /// while copied).
    pub entries: u64,
    pub bytes: u64,
    pub left_out: u64,
}

/// The digest of a policy's text, as a template records it.
pub fn policy_digest(pf: &crate::policy::PolicyFile) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(pf.source.text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The template whose workspace holds `path`, if one does (a change set's
/// project, say). Compared by device and inode, level by level, with the
/// templates of the default image cache.
pub fn holding(path: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let root = crate::vm::image::Cache::default_location()
        .ok()?
        .root()
        .join(DIR);
    let root_id = std::fs::metadata(&root).ok().map(|m| (m.dev(), m.ino()))?;
    let mut at = Some(path);
    let mut below: Vec<&std::ffi::OsStr> = Vec::new();
    while let Some(p) = at {
        if let Ok(m) = std::fs::metadata(p) {
            if (m.dev(), m.ino()) == root_id {
                return below.last().map(|n| n.to_string_lossy().into_owned());
            }
        }
        below.extend(p.file_name());
        at = p.parent();
    }
    None
}

/// Checks a template's name.
pub fn check_name(name: &str) -> Result<(), TemplateError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && !name.ends_with(".lock")
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    match ok {
        true => Ok(()),
        false => Err(TemplateError::Name(name.to_string())),
    }
}

/// The templates of the image cache.
#[derive(Debug)]
pub struct Store {
    root: PathBuf,
    fd: OwnedFd,
}

/// A template in use: its workspace, held (shared) until dropped.
#[derive(Debug)]
pub struct InUse {
    pub meta: Meta,
    pub workspace: PathBuf,
    _lock: std::fs::File,
}

impl Store {
    /// The store of the default image cache, made (0700) when missing.
    pub fn open() -> Result<Store, TemplateError> {
        Store::of(&crate::vm::image::Cache::default_location()?)
    }

    /// The store of `cache`.
    pub fn of(cache: &crate::vm::image::Cache) -> Result<Store, TemplateError> {
        let dir = cache.open_private()?;
        let fd = dir.subdir(DIR).map_err(|source| TemplateError::Io {
            name: String::new(),
            what: "open the templates of the image cache",
            source,
        })?;
        Ok(Store {
            root: dir.path().join(DIR),
            fd,
        })
    }

    fn io<'a>(
        name: &'a str,
        what: &'static str,
    ) -> impl FnOnce(std::io::Error) -> TemplateError + 'a {
        move |source| TemplateError::Io {
            name: name.to_string(),
            what,
            source,
        }
    }

    fn open_dir(&self, name: &str) -> std::io::Result<OwnedFd> {
        Ok(rustix::fs::openat(
            &self.fd,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?)
    }

    fn lock(&self, name: &str) -> Result<std::fs::File, TemplateError> {
        let fd = rustix::fs::openat(
            &self.fd,
            format!("{name}.lock").as_str(),
            OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(|e| Store::io(name, "open the lock of")(e.into()))?;
        Ok(std::fs::File::from(fd))
    }

    /// Makes the template `meta.name` of the workspace `src`, of what
    /// `reader` could read there (none: all of it, a workspace of hull's
    /// own).
    pub fn make(
        &self,
        mut meta: Meta,
        src: &Path,
        reader: Option<u32>,
    ) -> Result<Meta, TemplateError> {
        let name = meta.name.clone();
        check_name(&name)?;
        if self.open_dir(&name).is_ok() {
            return Err(TemplateError::Exists(name));
        }
        // A name of this making's own (two may run at once).
        let part = format!(".{name}.part-{}", uuid::Uuid::new_v4().simple());
        let made = (|| -> Result<Meta, TemplateError> {
            rustix::fs::mkdirat(&self.fd, part.as_str(), Mode::from_raw_mode(0o700))
                .map_err(|e| Store::io(&name, "make")(e.into()))?;
            let dir = self
                .open_dir(&part)
                .map_err(Store::io(&name, "open the new template"))?;
            // The workspace is reached by users' ids on a fork (0755).
            rustix::fs::mkdirat(&dir, WORKSPACE, Mode::from_raw_mode(0o755))
                .map_err(|e| Store::io(&name, "make the workspace of")(e.into()))?;
            let dst = rustix::fs::openat(
                &dir,
                WORKSPACE,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| Store::io(&name, "open the workspace of")(e.into()))?;
            let from = rustix::fs::open(
                src,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| Store::io(&name, "open the session's workspace for")(e.into()))?;
            // Only what `reader` could read: the copy is hull's, and a
            // fork reads it as its own.
            let limits = crate::changes::CopyLimits {
                entries: MAX_ENTRIES,
                bytes: MAX_BYTES,
                reader,
            };
            let copied =
                crate::changes::copy_tree(from.as_fd(), dst.as_fd(), limits).map_err(|source| {
                    TemplateError::Copy {
                        name: name.clone(),
                        source,
                    }
                })?;
            // The workspace's own mode, as the session's.
            if let Ok(st) = rustix::fs::fstat(&from) {
                let _ = rustix::fs::fchmod(&dst, Mode::from_raw_mode(st.st_mode & 0o777));
            }
            meta.entries = copied.entries;
            meta.bytes = copied.bytes;
            meta.left_out = copied.left_out_count;
            let body = serde_json::to_vec_pretty(&meta)
                .map_err(|e| Store::io(&name, "record")(std::io::Error::other(e.to_string())))?;
            let f = rustix::fs::openat(
                &dir,
                META,
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            )
            .map_err(|e| Store::io(&name, "record")(e.into()))?;
            std::io::Write::write_all(&mut std::fs::File::from(f), &body)
                .map_err(Store::io(&name, "record"))?;
            rustix::fs::renameat_with(
                &self.fd,
                part.as_str(),
                &self.fd,
                name.as_str(),
                rustix::fs::RenameFlags::NOREPLACE,
            )
            .map_err(|e| match e {
                rustix::io::Errno::EXIST | rustix::io::Errno::NOTEMPTY => {
                    TemplateError::Exists(name.clone())
                }
                e => Store::io(&name, "name")(e.into()),
            })?;
            Ok(meta.clone())
        })();
        if made.is_err() {
            let _ = crate::runtime::fsx::remove_tree(&self.root.join(&part));
        }
        made
    }

    /// The template `name` of `owner`'s, held (shared) for a session that
    /// starts from it.
    pub fn take(&self, name: &str, owner: u32) -> Result<InUse, TemplateError> {
        check_name(name)?;
        let lock = self.lock(name)?;
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockShared)
            .map_err(|e| Store::io(name, "lock")(e.into()))?;
        let meta = self.meta(name)?;
        // Another caller's template is not theirs to see.
        if meta.owner != owner {
            return Err(TemplateError::NotFound(name.to_string()));
        }
        Ok(InUse {
            workspace: self.root.join(name).join(WORKSPACE),
            meta,
            _lock: lock,
        })
    }

    fn meta(&self, name: &str) -> Result<Meta, TemplateError> {
        let dir = self
            .open_dir(name)
            .map_err(|_| TemplateError::NotFound(name.to_string()))?;
        let f = rustix::fs::openat(
            &dir,
            META,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| Store::io(name, "read")(e.into()))?;
        let mut body = Vec::new();
        std::io::Read::read_to_end(
            &mut std::io::Read::take(std::fs::File::from(f), 1 << 20),
            &mut body,
        )
        .map_err(Store::io(name, "read"))?;
        serde_json::from_slice(&body)
            .map_err(|e| Store::io(name, "read")(std::io::Error::other(e.to_string())))
    }

    /// The templates of `owner` (every one: none), by name.
    pub fn list(&self, owner: Option<u32>) -> Result<Vec<Meta>, TemplateError> {
        let dir =
            rustix::fs::Dir::read_from(&self.fd).map_err(|e| Store::io("", "list")(e.into()))?;
        let mut out = Vec::new();
        for e in dir.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if check_name(&name).is_err() || name.ends_with(".lock") {
                continue;
            }
            if let Ok(m) = self.meta(&name) {
                if owner.is_none_or(|o| o == m.owner) {
                    out.push(m);
                }
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Removes the template `name` (of `owner`'s, when one is named),
    /// unless a session uses it.
    pub fn remove(&self, name: &str, owner: Option<u32>) -> Result<(), TemplateError> {
        check_name(name)?;
        let meta = self.meta(name)?;
        if owner.is_some_and(|o| o != meta.owner) {
            return Err(TemplateError::NotFound(name.to_string()));
        }
        let lock = self.lock(name)?;
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive)
            .map_err(|_| TemplateError::InUse(name.to_string()))?;
        // Renamed away first: no session finds a half-removed template.
        let gone = format!(".{name}.gone-{}", uuid::Uuid::new_v4().simple());
        rustix::fs::renameat(&self.fd, name, &self.fd, gone.as_str())
            .map_err(|e| Store::io(name, "remove")(e.into()))?;
        crate::runtime::fsx::remove_tree(&self.root.join(&gone))
            .map_err(Store::io(name, "remove"))?;
        let _ = rustix::fs::unlinkat(
            &self.fd,
            format!("{name}.lock").as_str(),
            rustix::fs::AtFlags::empty(),
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(name: &str, owner: u32) -> Meta {
        Meta {
            name: name.into(),
            owner,
            tier: "bwrap".into(),
            policy: "default".into(),
            policy_sha256: "0".repeat(64),
            image: None,
            made_unix: 0,
            from_session: "s".into(),
            entries: 0,
            bytes: 0,
            left_out: 0,
        }
    }

    /// A template is its owner's: another caller finds none, lists none,
    /// removes none; a template in use is not removed; a name is made once.
    #[test]
    fn a_template_is_its_owner_s_and_stays_while_used() {
        let t = tempfile::tempdir().unwrap();
        let store = Store::of(&crate::vm::image::Cache::at(t.path().join("cache"))).unwrap();
        let src = t.path().join("src");
        std::fs::create_dir_all(src.join("lib")).unwrap();
        std::fs::write(src.join("lib/x"), "x").unwrap();
        let made = store.make(meta("t", 1000), &src, Some(1000)).unwrap();
        assert_eq!((made.entries, made.bytes), (2, 1));
        assert!(matches!(
            store.make(meta("t", 1000), &src, Some(1000)),
            Err(TemplateError::Exists(_))
        ));
        assert!(matches!(
            store.take("t", 1001),
            Err(TemplateError::NotFound(_))
        ));
        assert!(store.list(Some(1001)).unwrap().is_empty());
        assert!(matches!(
            store.remove("t", Some(1001)),
            Err(TemplateError::NotFound(_))
        ));
        let held = store.take("t", 1000).unwrap();
        assert_eq!(
            std::fs::read_to_string(held.workspace.join("lib/x")).unwrap(),
            "x"
        );
        assert!(matches!(
            store.remove("t", None),
            Err(TemplateError::InUse(_))
        ));
        drop(held);
        store.remove("t", Some(1000)).unwrap();
        assert!(store.list(None).unwrap().is_empty());
        assert!(matches!(
            store.take("t", 1000),
            Err(TemplateError::NotFound(_))
        ));
    }

    #[test]
    fn names_are_plain() {
        for ok in ["a", "py-env.2", "X_1"] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", ".hidden", "a/b", "..", "a b", "x.lock", &"x".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }
}
