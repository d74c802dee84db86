//! Lowering for tier 1 on Linux: Landlock path rules.
//!
//! Landlock only adds access: a right granted on a directory holds for
//! everything beneath it, and nothing can take it back for a subpath. So a
//! grant that contains a protected path is split: the granted directory keeps
//! only `read_dir`, each of its entries (found on the host at launch) gets the
//! grant, and the split recurses down to the protected path, which gets
//! read-only rights (`ReadOnly`) or none (`Hidden`). The kernel then lets
//! nothing create, rename or remove entries directly in a writable directory
//! that was split (for example the project root, which holds `.git` and
//! `.hull`): those are listed in [`LandlockPlan::closed`], and at run time
//! hull's create broker performs them with spare inodes that carry rules of
//! their own (`tier::spares`, `tier::broker::create`).
//!
//! Not enforced here: network (seccomp does that, see `tier::landlock`).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::plan::{self, PlanError, Step};
use crate::{Access, HostFs, NodeKind, Policy};

/// A Landlock filesystem right (the kernel's `LANDLOCK_ACCESS_FS_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Right {
    Execute,
    WriteFile,
    ReadFile,
    ReadDir,
    RemoveDir,
    RemoveFile,
    MakeDir,
    MakeReg,
    MakeSock,
    MakeFifo,
    MakeSym,
    Refer,
    Truncate,
    IoctlDev,
    ResolveUnix,
}

/// One rule: `rights` beneath `path`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    pub path: PathBuf,
    pub rights: Vec<Right>,
}

/// What `hull __landlock-exec` applies before it executes the command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LandlockPlan {
    pub rules: Vec<Rule>,
    pub notes: Vec<String>,
    /// Writable directories split around protected paths: Landlock lets the
    /// command write in them, but not create, rename or remove entries
    /// directly in them; the create broker does that (or, without spares,
    /// the user is told before the command runs).
    #[serde(default)]
    pub closed: Vec<Closed>,
}

/// A writable directory whose own entries are fixed (see [`LandlockPlan::closed`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Closed {
    pub dir: PathBuf,
    /// The protected paths it was split around.
    pub around: Vec<PathBuf>,
}

impl Closed {
    /// What the user is told before the command runs when no spare entries
    /// could be made for it: the directory, why, and the tiers that can.
    pub fn warning(&self) -> String {
        let around: Vec<String> = self
            .around
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        format!(
            "tier landlock: the command can write in {dir} and below, but cannot create, \
             rename or remove entries directly in {dir} (Landlock grants a right on everything \
             below a directory, so it is split to keep {around} protected); a build that creates \
             files or directories there (target/, node_modules/, out.txt) fails with \
             \"Permission denied\". Run it with --tier bwrap or --tier3, which protect those \
             paths with mounts instead",
            dir = self.dir.display(),
            around = around.join(", "),
        )
    }
}

const DEVICES_RW: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
];

fn file_rights(access: Access) -> Vec<Right> {
    use Right::*;
    match access {
        Access::Read => vec![ReadFile],
        Access::ReadExec => vec![ReadFile, Execute],
        Access::ReadWrite => vec![ReadFile, Execute, WriteFile, Truncate],
    }
}

fn dir_rights(access: Access) -> Vec<Right> {
    use Right::*;
    match access {
        Access::Read => vec![ReadFile, ReadDir],
        Access::ReadExec => vec![ReadFile, ReadDir, Execute],
        Access::ReadWrite => vec![
            ReadFile,
            ReadDir,
            Execute,
            WriteFile,
            Truncate,
            RemoveDir,
            RemoveFile,
            MakeDir,
            MakeReg,
            MakeSock,
            MakeFifo,
            MakeSym,
            Refer,
            ResolveUnix,
        ],
    }
}

/// The rights of a writable grant on a directory or a file (what a spare
/// entry of `tier::spares` gets).
pub fn writable_rights(dir: bool) -> Vec<Right> {
    rights(Access::ReadWrite, dir)
}

fn rights(access: Access, dir: bool) -> Vec<Right> {
    if dir {
        dir_rights(access)
    } else {
        file_rights(access)
    }
}

/// What keeps a path inside a grant from getting the grant's rights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Guard {
    /// A protection that hides it.
    Hidden,
    /// A protection that makes it read-only.
    ReadOnly,
    /// A grant of its own, narrower than the writable one around it.
    Narrower,
}

/// Lowers a policy to Landlock rules.
pub fn lower(policy: &Policy, fs: &dyn HostFs) -> Result<LandlockPlan, PlanError> {
    let fsplan = plan::plan(policy, fs)?;
    let mut notes = fsplan.notes.clone();
    // What a grant would otherwise expose: protections, and narrower grants
    // nested in a writable one (Landlock rights add up, so a read-only
    // grant inside a writable root is only read-only if the root is split
    // around it).
    let writable: Vec<&Path> = fsplan
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::Grant {
                path,
                access: Access::ReadWrite,
                ..
            } => Some(path.as_path()),
            _ => None,
        })
        .collect();
    let protected: Vec<(PathBuf, Guard)> = fsplan
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::Hide { path, .. } => Some((path.clone(), Guard::Hidden)),
            Step::ReadOnly { path, .. } => Some((path.clone(), Guard::ReadOnly)),
            Step::Grant { path, access, .. }
                if *access != Access::ReadWrite
                    && writable.iter().any(|w| path.starts_with(w) && path != w) =>
            {
                Some((path.clone(), Guard::Narrower))
            }
            _ => None,
        })
        .collect();
    // No placeholders: a directory with a protected path below it is split,
    // and no entry can be created directly in a split directory, so a
    // missing protected path stays missing.
    let mut rules = Vec::new();
    let mut closed = Vec::new();
    for s in &fsplan.steps {
        let Step::Grant { path, access, dir } = s else {
            continue;
        };
        let inside: Vec<&(PathBuf, Guard)> = protected
            .iter()
            .filter(|(p, _)| p.starts_with(path) && p != path)
            .collect();
        // A read grant around read-only protections needs no split.
        let needs_split = inside.iter().any(|(_, g)| *g == Guard::Hidden)
            || (*access == Access::ReadWrite && !inside.is_empty());
        if !*dir || !needs_split {
            rules.push(Rule {
                path: path.clone(),
                rights: rights(*access, *dir),
            });
            continue;
        }
        notes.push(if *access == Access::ReadWrite {
            format!(
                "{} is split around protected paths: entries directly in it are created, renamed and removed by hull's broker (spare entries with rules of their own)",
                path.display()
            )
        } else {
            format!("{} is split around protected paths", path.display())
        });
        if *access == Access::ReadWrite {
            closed.push(Closed {
                dir: path.clone(),
                around: inside.iter().map(|(p, _)| p.clone()).collect(),
            });
        }
        split(path, *access, &inside, fs, &mut rules, &mut notes);
    }
    for d in DEVICES_RW {
        rules.push(Rule {
            path: PathBuf::from(d),
            rights: vec![Right::ReadFile, Right::WriteFile],
        });
    }
    rules.push(Rule {
        path: PathBuf::from("/dev/tty"),
        rights: vec![Right::ReadFile, Right::WriteFile, Right::IoctlDev],
    });
    rules.push(Rule {
        path: PathBuf::from("/proc"),
        rights: dir_rights(Access::Read),
    });
    Ok(LandlockPlan {
        rules,
        notes,
        closed,
    })
}

fn split(
    dir: &Path,
    access: Access,
    inside: &[&(PathBuf, Guard)],
    fs: &dyn HostFs,
    rules: &mut Vec<Rule>,
    notes: &mut Vec<String>,
) {
    rules.push(Rule {
        path: dir.to_path_buf(),
        rights: vec![Right::ReadDir],
    });
    for (name, kind) in fs.entries(dir) {
        let child = dir.join(&name);
        if let Some((_, guard)) = inside.iter().find(|(p, _)| *p == child) {
            // A hidden path gets nothing; a narrower grant has a rule of
            // its own.
            if *guard == Guard::ReadOnly {
                let is_dir = kind == NodeKind::Dir;
                rules.push(Rule {
                    path: child,
                    rights: rights(access.min(Access::ReadExec), is_dir),
                });
            }
            continue;
        }
        let below: Vec<&(PathBuf, Guard)> = inside
            .iter()
            .copied()
            .filter(|(p, _)| p.starts_with(&child))
            .collect();
        match kind {
            NodeKind::Dir if !below.is_empty() => split(&child, access, &below, fs, rules, notes),
            NodeKind::Dir => rules.push(Rule {
                path: child,
                rights: rights(access, true),
            }),
            NodeKind::File => rules.push(Rule {
                path: child,
                rights: rights(access, false),
            }),
            NodeKind::Symlink(_) => notes.push(format!(
                "{} is a symlink in a split directory: not granted",
                child.display()
            )),
            NodeKind::Missing => {}
        }
    }
}

impl LandlockPlan {
    /// One line per rule, for `hull policy explain`.
    pub fn display_lines(&self) -> Vec<String> {
        self.rules
            .iter()
            .map(|r| {
                let names: Vec<String> = r
                    .rights
                    .iter()
                    .map(|x| {
                        serde_json::to_value(x)
                            .ok()
                            .and_then(|v| v.as_str().map(str::to_string))
                            .unwrap_or_default()
                    })
                    .collect();
                format!("{}: {}", r.path.display(), names.join(","))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lower::testing::{golden, host, vars};
    use crate::{profiles, resolve};

    fn lowered(profile: &str) -> LandlockPlan {
        let pf = profiles::load(profile).unwrap();
        let p = resolve(&pf, &vars()).unwrap();
        lower(&p, &host()).unwrap()
    }

    #[test]
    fn golden_shipped_profiles() {
        for name in ["default", "readonly", "build"] {
            let plan = lowered(name);
            let mut text = plan.display_lines().join("\n");
            text.push_str("\n# notes\n");
            for n in &plan.notes {
                text.push_str(&format!("{n}\n"));
            }
            golden(&format!("landlock-{name}.txt"), &text);
        }
    }

    #[test]
    fn project_is_split_and_protected_entries_get_no_write() {
        let plan = lowered("default");
        let get = |p: &str| {
            plan.rules
                .iter()
                .find(|r| r.path == Path::new(p))
                .map(|r| r.rights.clone())
        };
        assert_eq!(get("/work/proj"), Some(vec![Right::ReadDir]));
        let src = get("/work/proj/src").unwrap();
        assert!(src.contains(&Right::MakeReg) && src.contains(&Right::WriteFile));
        let git = get("/work/proj/.git").unwrap();
        assert!(!git.contains(&Right::WriteFile) && !git.contains(&Right::MakeReg));
        assert!(git.contains(&Right::ReadFile));
        assert_eq!(get("/work/proj/.hull"), None, "hidden: no rule at all");
        // nothing grants write on a parent of .git
        for r in &plan.rules {
            if Path::new("/work/proj/.git").starts_with(&r.path) {
                assert!(!r.rights.contains(&Right::WriteFile), "{r:?}");
            }
        }
    }

    #[test]
    fn a_split_writable_project_is_told_to_the_user() {
        let plan = lowered("default");
        assert_eq!(plan.closed.len(), 1, "{:?}", plan.closed);
        let c = &plan.closed[0];
        assert_eq!(c.dir, Path::new("/work/proj"));
        assert!(c.around.contains(&PathBuf::from("/work/proj/.git")));
        assert!(c.around.contains(&PathBuf::from("/work/proj/.hull")));
        let w = c.warning();
        for needed in [
            "/work/proj",
            ".git",
            ".hull",
            "--tier bwrap",
            "Permission denied",
        ] {
            assert!(w.contains(needed), "{needed}: {w}");
        }
        assert!(
            lowered("readonly").closed.is_empty(),
            "nothing to create there"
        );
    }

    #[test]
    fn read_only_project_needs_no_split() {
        let plan = lowered("readonly");
        let proj = plan
            .rules
            .iter()
            .find(|r| r.path == Path::new("/work/proj"))
            .unwrap();
        assert_eq!(proj.rights, vec![Right::ReadFile, Right::ReadDir]);
    }
}
