//! `hull changes list|show|diff|apply|discard`: the change sets that
//! copy-on-write runs keep (see [`crate::changes`]).

use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum ChangesCommand {
    /// List the change sets, oldest first.
    List {
        #[arg(long)]
        json: bool,
    },
    /// One line per change: A added, M modified, D deleted, m mode, ! refused.
    Show {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// The changes as a unified diff (text files), by size and hash (binary
    /// and large files), by target (symlinks).
    Diff {
        id: String,
        /// Only the changes at or below these paths (relative to the project).
        paths: Vec<String>,
    },
    /// Write the changes into the project: all or nothing, unless paths are
    /// named. A path the project changed since the run started is a
    /// conflict, left alone. Exits 1 when any path conflicts.
    Apply {
        id: String,
        /// Only the changes at or below these paths (relative to the project).
        paths: Vec<String>,
        #[arg(long)]
        json: bool,
    },
    /// Remove a change set and what it holds.
    Discard { id: String },
}

#[cfg(target_os = "linux")]
pub fn changes(c: ChangesCommand) -> anyhow::Result<i32> {
    imp::changes(c)
}

#[cfg(not(target_os = "linux"))]
pub fn changes(_: ChangesCommand) -> anyhow::Result<i32> {
    anyhow::bail!("hull changes: copy-on-write runs need Linux (overlayfs) on this version of hull")
}

#[cfg(target_os = "linux")]
mod imp {
    use std::io::Write;

    use super::ChangesCommand;
    use crate::changes::{self, Store};
    use crate::text::{one_line, quote_path};

    pub(super) fn changes(c: ChangesCommand) -> anyhow::Result<i32> {
        let store = Store::open(Store::default_root());
        let mut out = std::io::stdout().lock();
        match c {
            ChangesCommand::List { json } => {
                let l = store.list()?;
                if json {
                    let v: Vec<_> = l
                        .iter()
                        .map(|m| {
                            serde_json::json!({
                                "id": m.id, "project": m.project, "tier": m.tier,
                                "argv": m.argv, "created": m.created,
                                "finished": m.finished, "counts": m.counts,
                            })
                        })
                        .collect();
                    writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
                } else if l.is_empty() {
                    writeln!(out, "no change sets in {}", store.root().display())?;
                } else {
                    writeln!(
                        out,
                        "{:<12}  {:<20}  {:<8}  {:>5} {:>5} {:>5} {:>5} {:>5}  PROJECT",
                        "ID", "CREATED", "TIER", "A", "M", "D", "m", "!"
                    )?;
                    for m in &l {
                        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(m.created);
                        let c = &m.counts;
                        writeln!(
                            out,
                            "{:<12}  {:<20}  {:<8}  {:>5} {:>5} {:>5} {:>5} {:>5}  {}",
                            m.id,
                            humantime::format_rfc3339_seconds(t).to_string(),
                            m.tier,
                            c.added,
                            c.modified,
                            c.deleted,
                            c.mode,
                            c.refused,
                            one_line(&m.project.display().to_string())
                        )?;
                    }
                }
                Ok(0)
            }
            ChangesCommand::Show { id, json } => {
                let set = store.get(&id)?;
                if json {
                    let v = serde_json::json!({
                        "id": set.meta.id, "project": set.meta.project, "tier": set.meta.tier,
                        "argv": set.meta.argv, "counts": set.meta.counts,
                        "changes": set.changes,
                    });
                    writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
                    return Ok(0);
                }
                writeln!(
                    out,
                    "change set {} of {} ({} run: {})",
                    set.meta.id,
                    one_line(&set.meta.project.display().to_string()),
                    set.meta.tier,
                    one_line(&set.meta.argv.join(" "))
                )?;
                for c in &set.changes {
                    let what = match (&c.after, &c.before) {
                        (_, _) if c.op == changes::Op::Refused => {
                            one_line(c.reason.as_deref().unwrap_or(""))
                        }
                        (Some(changes::Node::Symlink { target }), _) => {
                            format!("symlink -> {}", quote_path(target))
                        }
                        (Some(n @ changes::Node::File { size, binary, .. }), _) => format!(
                            "{} {size} bytes{}{}",
                            n.kind(),
                            if *binary { ", binary" } else { "" },
                            mode_note(c)
                        ),
                        (Some(n), _) => format!("{}{}", n.kind(), mode_note(c)),
                        (None, Some(b)) => b.kind().to_string(),
                        (None, None) => String::new(),
                    };
                    writeln!(out, "{} {}  {what}", c.op.letter(), quote_path(&c.path))?;
                }
                if set.changes.is_empty() {
                    writeln!(out, "no changes")?;
                }
                Ok(0)
            }
            ChangesCommand::Diff { id, paths } => {
                let set = store.get(&id)?;
                out.write_all(changes::diff(&set, &paths)?.as_bytes())?;
                Ok(0)
            }
            ChangesCommand::Apply { id, paths, json } => {
                let set = store.get(&id)?;
                // A run from a template wrote over the template's
                // workspace, which every session started from it shares:
                // never changed.
                if let Some(name) = crate::templates::holding(&set.meta.project) {
                    anyhow::bail!(
                        "change set {id}: its project is the workspace of the template {name}, \
                         which is never changed (sessions started from it share it); `hull \
                         changes diff {id}` shows what the run wrote"
                    );
                }
                let r = changes::apply(&set, &paths)?;
                if json {
                    writeln!(out, "{}", serde_json::to_string_pretty(&r)?)?;
                } else {
                    for p in &r.applied {
                        writeln!(out, "applied {}", quote_path(p))?;
                    }
                    for s in &r.refused {
                        writeln!(out, "refused {}: {}", quote_path(&s.path), one_line(&s.why))?;
                    }
                }
                if r.conflicts.is_empty() {
                    return Ok(0);
                }
                let mut err = std::io::stderr().lock();
                for s in &r.conflicts {
                    writeln!(
                        err,
                        "hull: conflict: {}: {}",
                        quote_path(&s.path),
                        one_line(&s.why)
                    )?;
                }
                if paths.is_empty() {
                    writeln!(
                        err,
                        "hull: nothing of change set {} was applied; name the paths to apply the others",
                        set.meta.id
                    )?;
                }
                Ok(1)
            }
            ChangesCommand::Discard { id } => {
                store.discard(&id)?;
                writeln!(out, "discarded {id}")?;
                Ok(0)
            }
        }
    }

    fn mode_note(c: &changes::Change) -> String {
        match (
            c.op,
            c.before.as_ref().and_then(changes::Node::mode),
            c.after.as_ref().and_then(changes::Node::mode),
        ) {
            (changes::Op::Mode, Some(b), Some(a)) => format!(", mode {b:o} -> {a:o}"),
            _ => String::new(),
        }
    }
}
