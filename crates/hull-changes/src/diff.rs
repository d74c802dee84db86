//! A change set as text for review: unified diffs of text files (the
//! project's file now against the change set's), binary and large files by
//! size and hash, links by target. Everything from the command (names,
//! link targets, contents) is made printable before it is shown.

use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd};

use super::store::ChangeSet;
use super::{at, ChangesError, Node, Op, MAX_DIFF_BYTES};
use hull_exec::text::{one_line, printable, quote_path};

/// The diff of the changes at or below each path of `only` (all when
/// empty).
pub fn diff(set: &ChangeSet, only: &[String]) -> Result<String, ChangesError> {
    let project = &set.meta.project;
    let root = at::open_root(project).map_err(|source| ChangesError::Io {
        what: "cannot open the project",
        path: project.clone(),
        source,
    })?;
    let upper_dir = set.upper();
    let upper = at::open_root(&upper_dir).map_err(|source| ChangesError::Io {
        what: "cannot open",
        path: upper_dir.clone(),
        source,
    })?;
    let mut out = String::new();
    for c in set.select(only)? {
        let path = quote_path(&c.path);
        match (c.op, &c.before, &c.after) {
            (Op::Refused, _, _) => out.push_str(&format!(
                "refused {path}: {}\n",
                one_line(c.reason.as_deref().unwrap_or(""))
            )),
            (Op::Deleted, Some(b), _) => out.push_str(&format!("deleted {path} ({})\n", b.kind())),
            (Op::Mode, b, Some(a)) => out.push_str(&format!(
                "mode {path} {:o} -> {:o}\n",
                b.as_ref().and_then(Node::mode).unwrap_or(0),
                a.mode().unwrap_or(0)
            )),
            (_, _, Some(Node::Symlink { target })) => {
                out.push_str(&format!("symlink {path} -> {}\n", quote_path(target)))
            }
            (_, _, Some(Node::Dir { mode })) => {
                out.push_str(&format!("directory {path} (mode {mode:o})\n"))
            }
            (_, b, Some(a @ Node::File { .. })) => {
                let old = match b {
                    Some(Node::File { .. }) => text_of(root.as_fd(), &c.path),
                    None => Some(String::new()),
                    _ => None,
                };
                let new = text_of(upper.as_fd(), &c.path);
                match (old, new, is_binary(a) || b.as_ref().is_some_and(is_binary)) {
                    (Some(old), Some(new), false) => {
                        let from = if b.is_some() {
                            quote_path(&format!("a/{}", c.path))
                        } else {
                            "/dev/null".into()
                        };
                        let d = similar::TextDiff::from_lines(&old, &new);
                        out.push_str(&printable(
                            &d.unified_diff()
                                .context_radius(3)
                                .header(&from, &quote_path(&format!("b/{}", c.path)))
                                .to_string(),
                        ));
                    }
                    _ => out.push_str(&format!(
                        "binary or large {path}: {} -> {}\n",
                        describe(b.as_ref()),
                        describe(Some(a))
                    )),
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

fn is_binary(n: &Node) -> bool {
    match n {
        Node::File { binary, size, .. } => *binary || *size > MAX_DIFF_BYTES,
        _ => false,
    }
}

/// A node by size and hash.
fn describe(n: Option<&Node>) -> String {
    match n {
        None => "nothing".into(),
        Some(Node::File { size, sha256, .. }) => format!("{size} bytes sha256:{sha256}"),
        Some(n) => n.kind().into(),
    }
}

/// The file at `rel` beneath `root` as UTF-8 text, when it is a regular
/// file of at most [`MAX_DIFF_BYTES`] that is text.
fn text_of(root: BorrowedFd<'_>, rel: &str) -> Option<String> {
    let (parent, name) = rel.rsplit_once('/').unwrap_or(("", rel));
    let dir = at::open_dir_path(root, parent).ok()?;
    let f = at::open_file(dir.as_fd(), name).ok()?;
    let mut buf = Vec::new();
    f.take(MAX_DIFF_BYTES + 1).read_to_end(&mut buf).ok()?;
    if buf.len() as u64 > MAX_DIFF_BYTES {
        return None;
    }
    String::from_utf8(buf).ok()
}
