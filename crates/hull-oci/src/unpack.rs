//! Unpacking a flattened image into a directory tree hull owns: the root
//! of a bwrap sandbox (`hull run --tier bwrap --image REF`).
//!
//! The tarball is hull's own (written by [`crate::flatten`] from checked
//! layers), and still nothing of it is trusted. Every entry is made
//! relative to a held descriptor of its parent directory, reached from the
//! tree's root one `openat(O_NOFOLLOW | O_DIRECTORY)` at a time, so no link
//! of the image (or planted since) is ever followed on the host: a link is
//! made as a link (`symlinkat`) and only ever resolved inside the sandbox,
//! whose `/` is the image. Files are new (`O_CREAT | O_EXCL | O_NOFOLLOW`),
//! a hard link must name an earlier regular file of the tree, device
//! nodes in `/dev` are not made (the sandbox gets its own `/dev`) and any
//! other (one elsewhere, a fifo, a sparse file) refuses the image,
//! and no owner is taken from the image: everything is the unpacking
//! user's, with the image's mode less set-id, sticky and group or other
//! write bits (directories keep the owner's `rwx`, so the tree can be
//! removed). Entries and bytes are bounded.

use std::ffi::OsStr;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::flatten::Limits;

#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error("image entry {entry:?}: {why}")]
    Entry { entry: String, why: String },
    #[error("image entry {entry:?}: cannot {what}: {source}")]
    Io {
        entry: String,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("reading the image's tarball: {0}")]
    Read(#[source] std::io::Error),
    #[error("the image has more than {0} entries")]
    TooManyEntries(usize),
    #[error("the image holds more than {0} bytes of file contents")]
    TooLarge(u64),
}

/// What an unpacked tree holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Unpacked {
    pub entries: usize,
    pub bytes: u64,
    /// Device nodes in `/dev` not made.
    pub skipped: usize,
}

/// The directories from the root down to the entry being made, each held.
struct Chain {
    root: OwnedFd,
    held: Vec<(Vec<u8>, OwnedFd)>,
    /// Whether a directory an entry lies in that is not there yet is made
    /// (as `tar` does: a layer may hold `usr/local/bin/x` with no `usr`
    /// entry, and flattening keeps an upper layer's `usr` entry after the
    /// lower layer's `usr/bin`), and the paths of those made so.
    make_missing: bool,
    implied: Vec<Vec<u8>>,
}

impl Chain {
    /// The parent of `parts`' last component, opened without following a
    /// link, reusing the directories the previous entry held.
    fn parent(&mut self, parts: &[&[u8]], entry: &str) -> Result<&OwnedFd, UnpackError> {
        let dirs = &parts[..parts.len() - 1];
        let same = self
            .held
            .iter()
            .zip(dirs)
            .take_while(|((held, _), want)| held.as_slice() == **want)
            .count();
        self.held.truncate(same);
        for (i, name) in dirs.iter().enumerate().skip(same) {
            let at = self.held.last().map_or(&self.root, |(_, fd)| fd);
            let open = || {
                rustix::fs::openat(
                    at,
                    OsStr::from_bytes(name),
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )
            };
            let opened = match open() {
                // Nothing there: made as a directory of the tree's own (a
                // link or a file there is refused below, never followed).
                Err(Errno::NOENT) if self.make_missing => {
                    match rustix::fs::mkdirat(
                        at,
                        OsStr::from_bytes(name),
                        Mode::from_raw_mode(0o700),
                    ) {
                        Ok(()) => self.implied.push(dirs[..=i].join(&b'/')),
                        Err(Errno::EXIST) => {}
                        Err(e) => {
                            return Err(UnpackError::Entry {
                                entry: entry.to_string(),
                                why: format!(
                                    "cannot make its directory {:?} ({e})",
                                    String::from_utf8_lossy(name)
                                ),
                            })
                        }
                    }
                    open()
                }
                r => r,
            };
            let fd = opened.map_err(|e| UnpackError::Entry {
                entry: entry.to_string(),
                why: format!(
                    "its directory {:?} is not a directory of the image ({e})",
                    String::from_utf8_lossy(name)
                ),
            })?;
            self.held.push((name.to_vec(), fd));
        }
        Ok(self.held.last().map_or(&self.root, |(_, fd)| fd))
    }
}

/// The path of an entry as its components: relative, no `.` or `..`;
/// empty for the root itself.
fn components<'a>(raw: &'a [u8], entry: &str) -> Result<Vec<&'a [u8]>, UnpackError> {
    if raw.first() == Some(&b'/') {
        return Err(UnpackError::Entry {
            entry: entry.to_string(),
            why: "an absolute path".into(),
        });
    }
    let mut parts = Vec::new();
    for c in raw.split(|b| *b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => {
                return Err(UnpackError::Entry {
                    entry: entry.to_string(),
                    why: "a `..` component".into(),
                })
            }
            c => parts.push(c),
        }
    }
    if parts.len() > MAX_DEPTH {
        return Err(UnpackError::Entry {
            entry: entry.to_string(),
            why: format!("deeper than {MAX_DEPTH} directories"),
        });
    }
    Ok(parts)
}

/// The deepest an entry may lie (a descriptor is held per level).
pub const MAX_DEPTH: usize = 128;

/// Removes whatever is at `name` in `dir` (a directory with everything in
/// it), never following a link.
pub fn remove_at(dir: &impl AsFd, name: &OsStr) -> std::io::Result<()> {
    remove_below(dir, name, 0)
}

fn remove_below(dir: &impl AsFd, name: &OsStr, depth: usize) -> std::io::Result<()> {
    if depth > MAX_DEPTH {
        return Err(std::io::Error::other(format!(
            "more than {MAX_DEPTH} directories deep"
        )));
    }
    match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
        Ok(()) => return Ok(()),
        Err(Errno::NOENT) => return Ok(()),
        Err(Errno::ISDIR) | Err(Errno::PERM) => {}
        Err(e) => return Err(e.into()),
    }
    let sub = rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    // Our own tree: a directory left without the owner's bits is given
    // them back, so its entries can go.
    let _ = rustix::fs::fchmod(&sub, Mode::from_raw_mode(0o700));
    let mut names = Vec::new();
    for e in rustix::fs::Dir::read_from(&sub)? {
        let e = e?;
        let n = e.file_name().to_bytes();
        if n != b"." && n != b".." {
            names.push(n.to_vec());
        }
    }
    for n in names {
        remove_below(&sub, OsStr::from_bytes(&n), depth + 1)?;
    }
    rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)?;
    Ok(())
}

/// Unpacks the tarball `tar` into the empty directory `root`.
pub fn unpack(tar: impl Read, root: OwnedFd, limits: Limits) -> Result<Unpacked, UnpackError> {
    let mut archive = tar::Archive::new(crate::TarGuard::new(tar));
    let mut chain = Chain {
        root,
        held: Vec::new(),
        make_missing: true,
        implied: Vec::new(),
    };
    let mut done = Unpacked::default();
    // Directories get their own mode once everything in them is made.
    let mut modes: Vec<(Vec<u8>, u32)> = Vec::new();
    for e in archive.entries().map_err(UnpackError::Read)? {
        let mut e = e.map_err(UnpackError::Read)?;
        done.entries += 1;
        if done.entries > limits.entries {
            return Err(UnpackError::TooManyEntries(limits.entries));
        }
        let raw = e.path_bytes().into_owned();
        let entry = String::from_utf8_lossy(&raw).into_owned();
        let parts = components(&raw, &entry)?;
        let kind = e.header().entry_type();
        let mode = e.header().mode().unwrap_or(0o644) & 0o755;
        let Some(name) = parts.last().map(|n| OsStr::from_bytes(n)) else {
            // The root itself: its mode only.
            continue;
        };
        let io = |what: &'static str| {
            let entry = entry.clone();
            move |e: Errno| UnpackError::Io {
                entry: entry.clone(),
                what,
                source: e.into(),
            }
        };
        let refuse = |why: &str| UnpackError::Entry {
            entry: entry.clone(),
            why: why.to_string(),
        };
        let parent = chain.parent(&parts, &entry)?;
        // A later entry replaces an earlier one, as a runtime's unpacking
        // does; a directory stays (its children with it).
        let existing = rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW).ok();
        let is_dir =
            |st: &rustix::fs::Stat| FileType::from_raw_mode(st.st_mode) == FileType::Directory;
        match (kind.is_dir(), &existing) {
            (true, Some(st)) if is_dir(st) => {}
            (_, Some(_)) => remove_at(parent, name).map_err(|source| UnpackError::Io {
                entry: entry.clone(),
                what: "replace an earlier entry at",
                source,
            })?,
            (_, None) => {}
        }
        if kind.is_dir() {
            if existing.as_ref().is_none_or(|st| !is_dir(st)) {
                rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(0o700))
                    .map_err(io("make the directory"))?;
            }
            modes.push((parts.join(&b'/'), mode | 0o700));
        } else if kind.is_file() || kind == tar::EntryType::Continuous {
            let size = e.header().size().map_err(UnpackError::Read)?;
            done.bytes = done.bytes.saturating_add(size);
            if done.bytes > limits.bytes {
                return Err(UnpackError::TooLarge(limits.bytes));
            }
            let fd = rustix::fs::openat(
                parent,
                name,
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            )
            .map_err(io("create the file"))?;
            let mut f = std::fs::File::from(fd);
            let copied = std::io::copy(&mut (&mut e).take(size), &mut f).map_err(|source| {
                UnpackError::Io {
                    entry: entry.clone(),
                    what: "write the file",
                    source,
                }
            })?;
            if copied != size {
                return Err(refuse("the tarball ends inside it"));
            }
            rustix::fs::fchmod(&f, Mode::from_raw_mode(mode)).map_err(io("set the mode of"))?;
            if let Ok(t) = e.header().mtime() {
                let at = rustix::fs::Timespec {
                    tv_sec: i64::try_from(t).unwrap_or(0),
                    tv_nsec: 0,
                };
                let _ = rustix::fs::futimens(
                    &f,
                    &rustix::fs::Timestamps {
                        last_access: at,
                        last_modification: at,
                    },
                );
            }
        } else if kind.is_symlink() {
            let target = e
                .link_name_bytes()
                .ok_or_else(|| refuse("a symbolic link with no target"))?;
            if target.is_empty() || target.contains(&0) {
                return Err(refuse("a symbolic link with no target"));
            }
            rustix::fs::symlinkat(OsStr::from_bytes(&target), parent, name)
                .map_err(io("make the link"))?;
        } else if kind.is_hard_link() {
            let target = e
                .link_name_bytes()
                .ok_or_else(|| refuse("a hard link with no target"))?
                .into_owned();
            let tparts = components(&target, &entry)?;
            let Some(tname) = tparts.last().map(|n| OsStr::from_bytes(n)) else {
                return Err(refuse("a hard link to the root"));
            };
            // The target's directory, held apart from the entry's chain.
            let mut other = Chain {
                root: rustix::io::fcntl_dupfd_cloexec(&chain.root, 0)
                    .map_err(io("reach the root for"))?,
                held: Vec::new(),
                make_missing: false,
                implied: Vec::new(),
            };
            let tdir = other.parent(&tparts, &entry)?;
            let st = rustix::fs::statat(tdir, tname, AtFlags::SYMLINK_NOFOLLOW)
                .map_err(|_| refuse("a hard link to nothing made before it"))?;
            if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
                return Err(refuse("a hard link to something not a regular file"));
            }
            let parent = chain.parent(&parts, &entry)?;
            rustix::fs::linkat(tdir, tname, parent, name, AtFlags::empty())
                .map_err(io("make the hard link"))?;
        } else if matches!(kind, tar::EntryType::Char | tar::EntryType::Block)
            && parts.first() == Some(&&b"dev"[..])
        {
            // /dev/null and friends: the sandbox's /dev is bwrap's own.
            done.skipped += 1;
        } else {
            // As tier 3's rewrite of a rootfs: a device node elsewhere, a
            // fifo, a sparse file or a global header is nothing a userland
            // needs. (Pax headers and GNU long names are read by the tar
            // crate itself.)
            return Err(refuse(&format!(
                "an entry of type {kind:?} (a device node outside /dev, a fifo, ...), which a \
                 userland does not need"
            )));
        }
    }
    // A directory made because an entry needed it and never named itself
    // gets the mode `tar` gives such a one.
    for p in std::mem::take(&mut chain.implied) {
        if !modes.iter().any(|(m, _)| *m == p) {
            modes.push((p, 0o755));
        }
    }
    // Deepest first: a directory's mode may take the owner's write away
    // only after its children are made (they are; the mode keeps `rwx`
    // for the owner anyway).
    modes.sort_by_key(|m| std::cmp::Reverse(m.0.len()));
    for (raw, mode) in modes {
        let entry = String::from_utf8_lossy(&raw).into_owned();
        let parts = components(&raw, &entry)?;
        let parent = chain.parent(&parts, &entry)?;
        let Some(name) = parts.last().map(|n| OsStr::from_bytes(n)) else {
            continue;
        };
        let fd = rustix::fs::openat(
            parent,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| UnpackError::Io {
            entry: entry.clone(),
            what: "open the directory",
            source: e.into(),
        })?;
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode)).map_err(|e| UnpackError::Io {
            entry,
            what: "set the mode of",
            source: e.into(),
        })?;
    }
    rustix::fs::fchmod(&chain.root, Mode::from_raw_mode(0o755)).map_err(|e| UnpackError::Io {
        entry: "/".into(),
        what: "set the mode of",
        source: e.into(),
    })?;
    Ok(done)
}
