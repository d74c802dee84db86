//! Reading an overlay's upper layer, against its lower layer, into changes.
//!
//! The overlay records a deletion as a whiteout (a 0/0 character device, or
//! a file with the `overlay.whiteout` xattr), a directory that replaced one
//! of the lower layer as an opaque directory (`overlay.opaque=y`), and any
//! other write as a full copy of the entry (hull mounts with `metacopy=off`
//! and `redirect_dir=off`: a renamed directory is a new one plus a
//! whiteout). A copy whose bytes equal the lower file's (the same size and
//! sha256) is a mode change, or nothing at all (a file opened for writing and left alone, a touch).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::FileType;

use super::at;
use super::{Change, ChangesError, Marks, Node, Op, MAX_CHANGES, MAX_DEPTH};

/// The changes an upper layer holds against its lower one, sorted by path
/// (a directory before what is in it).
pub fn scan(upper: &Path, lower: &Path, marks: Marks) -> Result<Vec<Change>, ChangesError> {
    let open = |p: &Path| {
        at::open_root(p).map_err(|source| ChangesError::Io {
            what: "cannot open",
            path: p.to_path_buf(),
            source,
        })
    };
    let mut s = Scan {
        upper: upper.to_path_buf(),
        marks,
        out: Vec::new(),
    };
    let (u, l) = (open(upper)?, open(lower)?);
    s.dir(u.as_fd(), Some(l.as_fd()), "", false, 0)?;
    s.out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(s.out)
}

struct Scan {
    upper: PathBuf,
    marks: Marks,
    out: Vec<Change>,
}

impl Scan {
    fn io(&self, what: &'static str, rel: &str) -> impl FnOnce(std::io::Error) -> ChangesError {
        let path = self.upper.join(rel);
        move |source| ChangesError::Io { what, path, source }
    }

    /// `opened`, or `None` with the entry reported as refused when its mode
    /// denies hull reading it: the command may leave what it made
    /// unreadable (mode 000), and when hull is not root it cannot read it
    /// either. The rest of the set is kept.
    fn readable<T>(
        &mut self,
        opened: std::io::Result<T>,
        path: &str,
        what: &str,
    ) -> Result<Option<T>, ChangesError> {
        match opened {
            Ok(t) => Ok(Some(t)),
            Err(e) if e.raw_os_error() == Some(libc::EACCES) => {
                self.push(refused(
                    path,
                    &format!("{what} hull cannot read (its mode denies it)"),
                ))?;
                Ok(None)
            }
            Err(e) => Err(self.io("cannot open", path)(e)),
        }
    }

    fn push(&mut self, c: Change) -> Result<(), ChangesError> {
        if self.out.len() >= MAX_CHANGES {
            return Err(ChangesError::TooMany {
                path: self.upper.clone(),
                what: "changes",
                limit: MAX_CHANGES,
            });
        }
        self.out.push(c);
        Ok(())
    }

    /// One directory of the upper layer; `lower` is the same directory in
    /// the lower layer when it is one there; `opaque` when the upper
    /// directory hides the lower one's entries (each then deleted unless
    /// the upper has its own).
    fn dir(
        &mut self,
        upper: BorrowedFd<'_>,
        lower: Option<BorrowedFd<'_>>,
        rel: &str,
        opaque: bool,
        depth: usize,
    ) -> Result<(), ChangesError> {
        if depth > MAX_DEPTH {
            return Err(ChangesError::TooDeep {
                path: self.upper.join(rel),
            });
        }
        let names = at::list(upper).map_err(self.io("cannot list", rel))?;
        let mut seen = Vec::new();
        for name in &names {
            let path = join(rel, &name.to_string_lossy());
            let Some(name) = name.to_str() else {
                use std::os::unix::ffi::OsStrExt;
                let mut exact = join(rel, "").into_bytes();
                exact.extend_from_slice(name.as_bytes());
                self.push(Change {
                    reason: Some(
                        "its name is not UTF-8: hull keeps no change it cannot name exactly \
                         (path_hex has its bytes)"
                            .into(),
                    ),
                    path_hex: Some(hull_exec::text::hex(&exact)),
                    ..refused(&path, "")
                })?;
                continue;
            };
            seen.push(name.to_string());
            let Some(st) = at::stat(upper, name).map_err(self.io("cannot stat", &path))? else {
                continue;
            };
            let before = match lower {
                Some(l) => {
                    lower_node(l, name).map_err(self.io("cannot read the project's", &path))?
                }
                None => None,
            };
            match at::file_type(&st) {
                FileType::CharacterDevice if st.st_rdev == 0 => {
                    // A whiteout: the lower entry is deleted.
                    if let Some(b) = before {
                        let b = settle(b).map_err(self.io("cannot read the project's", &path))?;
                        self.push(change(&path, Op::Deleted, Some(b), None))?;
                    }
                }
                FileType::Directory => {
                    let Some(sub) =
                        self.readable(at::open_dir(upper, name), &path, "a directory")?
                    else {
                        continue;
                    };
                    let after = Node::Dir {
                        mode: at::perm(&st),
                    };
                    let sub_opaque = at::is_opaque(sub.as_fd(), self.marks);
                    let lower_dir: Option<OwnedFd> = match before {
                        Some((Node::Dir { mode }, _)) => {
                            if mode != at::perm(&st) {
                                self.push(change(
                                    &path,
                                    Op::Mode,
                                    Some(Node::Dir { mode }),
                                    Some(after.clone()),
                                ))?;
                            }
                            lower
                                .map(|l| at::open_dir(l, name))
                                .transpose()
                                .map_err(self.io("cannot open the project's", &path))?
                        }
                        Some(b) => {
                            let b =
                                settle(b).map_err(self.io("cannot read the project's", &path))?;
                            self.push(change(&path, Op::Modified, Some(b), Some(after)))?;
                            None
                        }
                        None => {
                            self.push(change(&path, Op::Added, None, Some(after)))?;
                            None
                        }
                    };
                    self.dir(
                        sub.as_fd(),
                        lower_dir.as_ref().map(|d| d.as_fd()),
                        &path,
                        sub_opaque,
                        depth + 1,
                    )?;
                }
                FileType::RegularFile => {
                    let Some(f) = self.readable(at::open_file(upper, name), &path, "a file")?
                    else {
                        continue;
                    };
                    if st.st_size == 0 && at::is_xattr_whiteout(&f, self.marks) {
                        if let Some(b) = before {
                            let b =
                                settle(b).map_err(self.io("cannot read the project's", &path))?;
                            self.push(change(&path, Op::Deleted, Some(b), None))?;
                        }
                        continue;
                    }
                    let (sha256, size, binary) =
                        at::digest(&f).map_err(self.io("cannot read", &path))?;
                    let after = Node::File {
                        size,
                        mode: at::perm(&st),
                        sha256,
                        binary,
                    };
                    match before {
                        Some((Node::File { mode, .. }, Some(lf))) => {
                            let b = lower_file_node(&lf, mode)
                                .map_err(self.io("cannot read the project's", &path))?;
                            // The same bytes: the same size and sha256.
                            let same = matches!(
                                (&b, &after),
                                (Node::File { size: s1, sha256: h1, .. }, Node::File { size: s2, sha256: h2, .. })
                                    if s1 == s2 && h1 == h2
                            );
                            if !same {
                                self.push(change(&path, Op::Modified, Some(b), Some(after)))?;
                            } else if mode != at::perm(&st) {
                                self.push(change(&path, Op::Mode, Some(b), Some(after)))?;
                            }
                        }
                        Some((b, _)) => {
                            self.push(change(&path, Op::Modified, Some(b), Some(after)))?
                        }
                        None => self.push(change(&path, Op::Added, None, Some(after)))?,
                    }
                }
                FileType::Symlink => {
                    let t = at::read_link(upper, name)
                        .map_err(self.io("cannot read the link", &path))?;
                    let Ok(target) = String::from_utf8(t) else {
                        self.push(refused(&path, "a symlink whose target is not UTF-8"))?;
                        continue;
                    };
                    let after = Node::Symlink { target };
                    match before {
                        Some((b, _)) if b == after => {}
                        Some(b) => {
                            let b =
                                settle(b).map_err(self.io("cannot read the project's", &path))?;
                            self.push(change(&path, Op::Modified, Some(b), Some(after)))?
                        }
                        None => self.push(change(&path, Op::Added, None, Some(after)))?,
                    }
                }
                FileType::Fifo => self.push(refused(&path, "a fifo"))?,
                FileType::Socket => self.push(refused(&path, "a socket"))?,
                FileType::CharacterDevice | FileType::BlockDevice => {
                    self.push(refused(&path, "a device node"))?
                }
                FileType::Unknown => self.push(refused(&path, "an entry of unknown type"))?,
            }
        }
        if opaque {
            if let Some(l) = lower {
                for name in at::list(l).map_err(self.io("cannot list the project's", rel))? {
                    let Some(name) = name.to_str() else { continue };
                    if seen.iter().any(|s| s == name) {
                        continue;
                    }
                    let path = join(rel, name);
                    if let Some(b) =
                        lower_node(l, name).map_err(self.io("cannot read the project's", &path))?
                    {
                        let b = settle(b).map_err(self.io("cannot read the project's", &path))?;
                        self.push(change(&path, Op::Deleted, Some(b), None))?;
                    }
                }
            }
        }
        Ok(())
    }
}

fn join(rel: &str, name: &str) -> String {
    if rel.is_empty() {
        name.to_string()
    } else {
        format!("{rel}/{name}")
    }
}

fn change(path: &str, op: Op, before: Option<Node>, after: Option<Node>) -> Change {
    Change {
        path: path.to_string(),
        op,
        before,
        after,
        reason: None,
        path_hex: None,
    }
}

fn refused(path: &str, why: &str) -> Change {
    Change {
        path: path.to_string(),
        op: Op::Refused,
        before: None,
        after: None,
        reason: Some(format!(
            "{why}: a change set carries files, directories and symlinks only"
        )),
        path_hex: None,
    }
}

/// What the lower layer has at `name` (a regular file also opened, for the
/// comparison). Its digest is taken only when it is needed.
fn lower_node(
    dir: BorrowedFd<'_>,
    name: &str,
) -> std::io::Result<Option<(Node, Option<std::fs::File>)>> {
    let Some(st) = at::stat(dir, name)? else {
        return Ok(None);
    };
    Ok(Some(match at::file_type(&st) {
        FileType::Directory => (
            Node::Dir {
                mode: at::perm(&st),
            },
            None,
        ),
        FileType::Symlink => {
            let t = at::read_link(dir, name)?;
            (
                Node::Symlink {
                    target: String::from_utf8_lossy(&t).into_owned(),
                },
                None,
            )
        }
        FileType::RegularFile => {
            let f = at::open_file(dir, name)?;
            (
                Node::File {
                    size: st.st_size as u64,
                    mode: at::perm(&st),
                    sha256: String::new(),
                    binary: false,
                },
                Some(f),
            )
        }
        // A fifo or device in the project: shown as a file of its size.
        _ => (
            Node::File {
                size: 0,
                mode: at::perm(&st),
                sha256: String::new(),
                binary: true,
            },
            None,
        ),
    }))
}

/// A lower node as reported: a regular file with its digest.
fn settle((node, file): (Node, Option<std::fs::File>)) -> std::io::Result<Node> {
    match (node, file) {
        (Node::File { mode, .. }, Some(f)) => lower_file_node(&f, mode),
        (n, _) => Ok(n),
    }
}

/// The lower file's node with its digest.
fn lower_file_node(f: &std::fs::File, mode: u32) -> std::io::Result<Node> {
    let (sha256, size, binary) = at::digest(f)?;
    Ok(Node::File {
        size,
        mode,
        sha256,
        binary,
    })
}
