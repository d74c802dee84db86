//! The shared first step of filesystem lowering for Linux tiers: grants and
//! protections put in mount order, with host facts applied (missing paths,
//! symlinks, grants swallowed by a protection) and the placeholders that
//! protections of missing paths need.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::{Access, Grant, HostFs, NodeKind, Policy, Protect, ProtectReason, Protection};

/// A node hull creates on the host before launch so a protection of a path
/// that does not exist yet has something to cover: an empty directory
/// (`.git`, `.hull`) or an empty file (a shell startup file), with any
/// missing parent directories. It exists only while a run uses it
/// (`runtime::placeholder`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Placeholder {
    pub path: PathBuf,
    /// The writable root it lies in; created beneath it, never by path.
    pub root: PathBuf,
    pub dir: bool,
}

/// One filesystem step, in the order it must be applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Step {
    /// Make `path` visible with `access`.
    Grant {
        path: PathBuf,
        access: Access,
        dir: bool,
    },
    /// Recreate a symlink as it is on the host (its target is not granted by it).
    Symlink { path: PathBuf, target: PathBuf },
    /// Mask `path` (hidden) with an empty read-only dir or file.
    Hide {
        path: PathBuf,
        dir: bool,
        reason: ProtectReason,
    },
    /// Make `path` read-only (it stays visible).
    ReadOnly {
        path: PathBuf,
        dir: bool,
        reason: ProtectReason,
    },
    /// Keep the directory `path` where it is: a directory between a
    /// writable root and something protected inside it. A tier that
    /// protects with mounts makes it a mount point of its own (bwrap binds
    /// it onto itself), since renaming an ancestor of a mount is allowed
    /// and would let the command recreate the protected path unprotected.
    Pin { path: PathBuf },
}

impl Step {
    pub fn path(&self) -> &Path {
        match self {
            Step::Grant { path, .. }
            | Step::Symlink { path, .. }
            | Step::Hide { path, .. }
            | Step::ReadOnly { path, .. }
            | Step::Pin { path } => path,
        }
    }
}

/// The ordered filesystem plan, before a tier turns it into its own syntax.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct FsPlan {
    pub steps: Vec<Step>,
    pub placeholders: Vec<Placeholder>,
    /// Protected paths inside a writable root that were there when the
    /// plan was made, bound as they were: each may be another run's
    /// placeholder, which a run must hold (made again if it has gone since:
    /// `runtime::placeholder::Wanted::seen`), or the other run's end
    /// removes it before this one's sandbox binds it.
    #[serde(skip)]
    pub found: Vec<Placeholder>,
    /// Things a reviewer should know: skipped missing paths, narrowed grants.
    pub notes: Vec<String>,
}

/// Why a policy cannot be enforced on this host as written.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    #[error("cannot protect {path} ({reason}): it is a symlink; replace it with a directory or file, or remove it")]
    ProtectedSymlink { path: PathBuf, reason: &'static str },
    #[error("cannot protect {path} ({reason}): it does not exist inside the writable root {root}, and hull creates placeholders only for .hull, .git and shell startup files; create it (an empty file is fine) or make {root} read-only")]
    MissingProtected {
        path: PathBuf,
        root: PathBuf,
        reason: &'static str,
    },
    #[error("{0}")]
    CrossesSymlink(Box<LinkCrossing>),
    #[error("the project cannot be at {at} in the sandbox: {why}")]
    ProjectAt { at: PathBuf, why: String },
}

/// A policy path that goes through a symlink inside a writable root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkCrossing {
    pub path: PathBuf,
    pub link: PathBuf,
    pub target: PathBuf,
    pub root: PathBuf,
}

impl std::fmt::Display for LinkCrossing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the policy path {} lies below {}, a symlink (to {}) inside the writable root {}, \
             which a command could have planted there; refusing it (remove the link, or name \
             the real path in the policy)",
            self.path.display(),
            self.link.display(),
            self.target.display(),
            self.root.display()
        )
    }
}

/// Refuses a grant or protection whose path goes through a symlink inside
/// a writable root: a command can plant one there between runs, and the
/// tiers would then grant, mask or create placeholders wherever it points.
pub fn check_no_planted_links(policy: &Policy, fs: &dyn HostFs) -> Result<(), PlanError> {
    let writable: Vec<&Path> = policy.writable_roots().map(|g| g.path.as_path()).collect();
    let paths = policy
        .grants
        .iter()
        .map(|g| g.path.as_path())
        .chain(policy.protects.iter().map(|p| p.path.as_path()));
    for path in paths {
        let Some(root) = writable
            .iter()
            .filter(|w| path.starts_with(w) && path != **w)
            .max_by_key(|w| w.components().count())
        else {
            continue;
        };
        let mut between: Vec<&Path> = path.ancestors().skip(1).take_while(|a| a != root).collect();
        between.reverse();
        for a in between {
            if let NodeKind::Symlink(target) = fs.kind(a) {
                return Err(PlanError::CrossesSymlink(Box::new(LinkCrossing {
                    path: path.to_path_buf(),
                    link: a.to_path_buf(),
                    target,
                    root: root.to_path_buf(),
                })));
            }
        }
    }
    Ok(())
}

/// Builds the ordered plan. Steps are sorted by depth so a parent comes
/// before what is layered inside it; at equal depth grants come before
/// protections.
pub fn plan(policy: &Policy, fs: &dyn HostFs) -> Result<FsPlan, PlanError> {
    check_no_planted_links(policy, fs)?;
    let mut out = FsPlan::default();
    let writable: Vec<&Grant> = policy.writable_roots().collect();
    let mut entries: Vec<(usize, u8, Step)> = Vec::new();

    for g in &policy.grants {
        let mut access = g.access;
        if g.origin == crate::GrantOrigin::Policy {
            if let Some(p) = covering(&policy.protects, &g.path, Protection::Hidden) {
                out.notes.push(format!(
                    "{} ({}) is inside {} ({}): hidden",
                    g.path.display(),
                    g.access.as_str(),
                    p.path.display(),
                    p.reason.as_str()
                ));
                continue;
            }
            if access == Access::ReadWrite {
                if let Some(p) = covering(&policy.protects, &g.path, Protection::ReadOnly) {
                    out.notes.push(format!(
                        "{} is inside {} ({}): read-only",
                        g.path.display(),
                        p.path.display(),
                        p.reason.as_str()
                    ));
                    access = Access::ReadExec;
                }
            }
        }
        // The instance's own dirs exist whenever a command runs.
        let kind = if matches!(
            g.origin,
            crate::GrantOrigin::Policy | crate::GrantOrigin::Agent
        ) {
            fs.kind(&g.path)
        } else {
            NodeKind::Dir
        };
        let step = match kind {
            NodeKind::Missing => {
                out.notes.push(format!(
                    "{} ({}) does not exist: skipped",
                    g.path.display(),
                    g.access.as_str()
                ));
                continue;
            }
            NodeKind::Symlink(target) => Step::Symlink {
                path: g.path.clone(),
                target,
            },
            NodeKind::Dir => Step::Grant {
                path: g.path.clone(),
                access,
                dir: true,
            },
            NodeKind::File => Step::Grant {
                path: g.path.clone(),
                access,
                dir: false,
            },
        };
        entries.push((depth(&g.path), 0, step));
    }

    for p in &policy.protects {
        // Only what some grant would expose needs a step; the rest is absent.
        let Some(inside) = policy
            .grants
            .iter()
            .filter(|g| p.path.starts_with(&g.path) && fs.kind(&g.path) != NodeKind::Missing)
            .max_by_key(|g| depth(&g.path))
        else {
            continue;
        };
        let in_writable = writable
            .iter()
            .find(|w| p.path.starts_with(&w.path) && p.path != w.path);
        let found = |dir| {
            in_writable.map(|root| Placeholder {
                path: p.path.clone(),
                root: root.path.clone(),
                dir,
            })
        };
        let dir = match fs.kind(&p.path) {
            NodeKind::Dir => {
                out.found.extend(found(true));
                true
            }
            NodeKind::File => {
                out.found.extend(found(false));
                false
            }
            NodeKind::Symlink(_) => {
                return Err(PlanError::ProtectedSymlink {
                    path: p.path.clone(),
                    reason: p.reason.as_str(),
                })
            }
            NodeKind::Missing => {
                let Some(root) = in_writable else {
                    // Inside a read-only grant: the command cannot create it.
                    continue;
                };
                if inside.access != Access::ReadWrite {
                    continue;
                }
                let dir = match p.reason {
                    // The runs dir always exists while an instance runs.
                    ProtectReason::HullConfig
                    | ProtectReason::GitMetadata
                    | ProtectReason::OtherInstances => true,
                    // An empty file, for the run only (an empty
                    // ~/.bash_profile left behind would stop bash from
                    // reading ~/.profile).
                    ProtectReason::ShellRc => false,
                    // Nothing of hull's there yet: nothing to hide.
                    ProtectReason::HullState => continue,
                    ProtectReason::PolicyDeny => {
                        return Err(PlanError::MissingProtected {
                            path: p.path.clone(),
                            root: root.path.clone(),
                            reason: p.reason.as_str(),
                        })
                    }
                };
                out.placeholders.push(Placeholder {
                    path: p.path.clone(),
                    root: root.path.clone(),
                    dir,
                });
                dir
            }
        };
        let step = match p.protection {
            Protection::Hidden => Step::Hide {
                path: p.path.clone(),
                dir,
                reason: p.reason.clone(),
            },
            Protection::ReadOnly => Step::ReadOnly {
                path: p.path.clone(),
                dir,
                reason: p.reason.clone(),
            },
        };
        entries.push((depth(&p.path), 1, step));
    }

    // Pins: every directory strictly between a writable root and a
    // protection or narrower grant inside it, unless a step of its own
    // already covers it (it is then a mount point anyway).
    let mut pins: Vec<PathBuf> = Vec::new();
    for (_, _, step) in &entries {
        let (path, narrower) = match step {
            Step::Hide { path, .. } | Step::ReadOnly { path, .. } => (path, true),
            Step::Grant { path, access, .. } => (path, *access != Access::ReadWrite),
            Step::Symlink { .. } | Step::Pin { .. } => continue,
        };
        if !narrower {
            continue;
        }
        let Some(root) = writable
            .iter()
            .filter(|w| path.starts_with(&w.path) && *path != w.path)
            .max_by_key(|w| depth(&w.path))
        else {
            continue;
        };
        for a in path.ancestors().skip(1).take_while(|a| *a != root.path) {
            if !pins.iter().any(|p| p == a) {
                pins.push(a.to_path_buf());
            }
        }
    }
    pins.retain(|p| !entries.iter().any(|(_, _, s)| s.path() == p));
    for path in pins {
        // A missing parent of a placeholder is created with it.
        let created = out.placeholders.iter().any(|h| h.path.starts_with(&path));
        if fs.kind(&path) == NodeKind::Dir || created {
            entries.push((depth(&path), 0, Step::Pin { path }));
        }
    }

    entries.sort_by(|a, b| {
        (a.0, a.1)
            .cmp(&(b.0, b.1))
            .then_with(|| a.2.path().cmp(b.2.path()))
    });
    out.steps = entries.into_iter().map(|(_, _, s)| s).collect();
    Ok(out)
}

fn covering<'a>(protects: &'a [Protect], path: &Path, kind: Protection) -> Option<&'a Protect> {
    protects
        .iter()
        .filter(|p| p.protection == kind)
        .find(|p| path.starts_with(&p.path))
}

fn depth(p: &Path) -> usize {
    p.components().count()
}
