//! Git repositories inside writable roots: everything git reads that can
//! make it run code later on the host, protected like the top `.git`.
//!
//! Only `<root>/.git` is protected by [`super::resolve`]. But a plain host
//! `git status` also reads the git dirs of submodules (through their `.git`
//! gitfiles), and git runs what a repository's config names: hooks under
//! `core.hooksPath`, files pulled in by `include.path` and
//! `includeIf.*.path`, and `.gitmodules` `update = !cmd`. When any of those
//! lies in the worktree, the command could edit it. So, before a run, every
//! writable root is walked (never following a symlink, never into a `.git`)
//! and these become read-only protections:
//!
//! - every `.git` below the root, directory or gitfile (submodules, nested
//!   repositories, worktrees);
//! - every `.gitmodules` beside one;
//! - every `core.hooksPath`, `include.path` and `includeIf.*.path` of those
//!   repositories' configs that resolves inside a writable root (a missing
//!   hooks directory gets an empty placeholder; a missing include file is an
//!   error: the command could create it).
//!
//! After the run, `.git` entries that did not exist before are reported
//! ([`new_repositories`]): git runs their config when someone uses git
//! there. What this does not cover: a repository whose config git reads
//! from outside every writable root (its own business), config keys that
//! name commands rather than files (they live in the protected `.git`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::{GitMetadata, Policy, Protect, ProtectReason, Protection};

/// Directories deeper than this below a writable root are not walked.
const MAX_DEPTH: usize = 64;
/// At most this many entries are looked at per run (a runaway tree ends the
/// walk with an error rather than a hang).
const MAX_ENTRIES: usize = 2_000_000;

#[derive(Debug, thiserror::Error)]
pub enum GitScanError {
    #[error(
        "{root}: more than {MAX_ENTRIES} entries; hull cannot check it for nested git repositories"
    )]
    TooLarge { root: PathBuf },
    #[error("git config {config} includes {path}, inside the writable root {root}, which does not exist: the command could create it. Create it (an empty file is fine) or remove the include")]
    MissingInclude {
        config: PathBuf,
        path: PathBuf,
        root: PathBuf,
    },
}

/// What the walk found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Repos {
    /// Every `.git` (directory or file) below a writable root.
    pub git_entries: BTreeSet<PathBuf>,
    /// Those of them that are empty directories: no repository git would
    /// use (`hull vm up` puts one over a project's missing `.git` while its
    /// VM is up, to mount read-only).
    pub empty: BTreeSet<PathBuf>,
}

/// Walks the writable roots of `policy` for `.git` entries (not following
/// symlinks), but not the paths it hides (a project's `.hull`, hull's
/// spare entries there): the command cannot make a repository there that
/// anybody runs git in.
pub fn find_in(policy: &Policy) -> Result<Repos, GitScanError> {
    let roots: Vec<&Path> = policy.writable_roots().map(|g| g.path.as_path()).collect();
    let hidden: Vec<&Path> = policy
        .protects
        .iter()
        .filter(|p| p.protection == Protection::Hidden)
        .map(|p| p.path.as_path())
        .collect();
    find_repositories(&roots, &hidden)
}

/// Walks `roots` for `.git` entries (not following symlinks), leaving out
/// the directories `skip` names.
pub fn find_repositories(roots: &[&Path], skip: &[&Path]) -> Result<Repos, GitScanError> {
    let mut out = Repos::default();
    let mut seen = 0usize;
    for root in roots {
        let mut stack = vec![(root.to_path_buf(), 0usize)];
        while let Some((dir, depth)) = stack.pop() {
            let Ok(rd) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in rd.flatten() {
                seen += 1;
                if seen > MAX_ENTRIES {
                    return Err(GitScanError::TooLarge {
                        root: root.to_path_buf(),
                    });
                }
                let Ok(ft) = e.file_type() else { continue };
                let path = e.path();
                if e.file_name() == ".git" {
                    let empty = ft.is_dir()
                        && std::fs::read_dir(&path).is_ok_and(|mut d| d.next().is_none());
                    if empty {
                        out.empty.insert(path.clone());
                    }
                    out.git_entries.insert(path);
                    continue;
                }
                if ft.is_dir() && depth < MAX_DEPTH && !skip.contains(&path.as_path()) {
                    stack.push((path, depth + 1));
                }
            }
        }
    }
    Ok(out)
}

/// Adds the protections of [the module docs](self) to `policy`; none
/// where its `fs.git` makes git metadata writable.
pub fn protect(policy: &mut Policy, repos: &Repos) -> Result<(), GitScanError> {
    if policy.git == GitMetadata::Writable {
        return Ok(());
    }
    let roots: Vec<PathBuf> = policy.writable_roots().map(|g| g.path.clone()).collect();
    let inside = |p: &Path| roots.iter().find(|r| p.starts_with(r)).cloned();
    let mut add: Vec<PathBuf> = Vec::new();
    for git in &repos.git_entries {
        let Some(top) = git.parent() else { continue };
        // The top `.git` of each root is protected already.
        if !roots.iter().any(|r| r == top) {
            add.push(git.clone());
        }
        let modules = top.join(".gitmodules");
        if modules.is_file() {
            add.push(modules);
        }
        let Some(config) = config_of(git) else {
            continue;
        };
        for (key, value) in file_values(&config) {
            let base = if key == "core.hookspath" {
                top.to_path_buf()
            } else {
                config.parent().map(Path::to_path_buf).unwrap_or_default()
            };
            let target = expand(&value, &base, &policy.vars.home);
            let Some(root) = inside(&target) else {
                continue;
            };
            if target.symlink_metadata().is_err() && key != "core.hookspath" {
                return Err(GitScanError::MissingInclude {
                    config: config.clone(),
                    path: target,
                    root,
                });
            }
            add.push(target);
        }
    }
    for path in add {
        if !policy.protects.iter().any(|p| p.path == path) {
            policy.protects.push(Protect {
                path,
                protection: Protection::ReadOnly,
                reason: ProtectReason::GitMetadata,
            });
        }
    }
    policy
        .protects
        .sort_by(|a, b| a.path.cmp(&b.path).then(a.protection.cmp(&b.protection)));
    Ok(())
}

/// `.git` entries in `after` that were not in `before`, or were an empty
/// directory there; an empty directory is none.
pub fn new_repositories(before: &Repos, after: &Repos) -> Vec<PathBuf> {
    after
        .git_entries
        .iter()
        .filter(|g| !after.empty.contains(*g))
        .filter(|g| !before.git_entries.contains(*g) || before.empty.contains(*g))
        .cloned()
        .collect()
}

/// The config file of a `.git` directory, or of the git dir a gitfile
/// names (`gitdir: PATH`, relative to the gitfile's directory).
fn config_of(git: &Path) -> Option<PathBuf> {
    let meta = git.symlink_metadata().ok()?;
    if meta.is_dir() {
        return Some(git.join("config"));
    }
    if !meta.is_file() || meta.len() > 4096 {
        return None;
    }
    let text = std::fs::read_to_string(git).ok()?;
    let dir = text.lines().next()?.strip_prefix("gitdir:")?.trim();
    let dir = Path::new(dir);
    let dir = if dir.is_absolute() {
        dir.to_path_buf()
    } else {
        git.parent()?.join(dir)
    };
    Some(dir.join("config"))
}

/// The values of the keys that name files, read by git itself (its config
/// syntax has quoting and continuation rules worth not rewriting): one
/// `git config --null --get-regexp` per repository. No git, no values.
fn file_values(config: &Path) -> Vec<(String, String)> {
    if !config.is_file() {
        return Vec::new();
    }
    let Ok(out) = std::process::Command::new("git")
        .args(["config", "--no-includes", "--null", "--file"])
        .arg(config)
        .args([
            "--get-regexp",
            r"^(core\.hookspath|include\.path|includeif\..*\.path)$",
        ])
        .env_clear()
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
    else {
        return Vec::new();
    };
    parse_null_pairs(&out.stdout)
}

/// `key\nvalue\0` records of `git config --null --get-regexp`.
fn parse_null_pairs(bytes: &[u8]) -> Vec<(String, String)> {
    String::from_utf8_lossy(bytes)
        .split('\0')
        .filter_map(|rec| {
            let (k, v) = rec.split_once('\n')?;
            let key = k.to_ascii_lowercase();
            let key = if key.starts_with("includeif.") {
                "includeif.path".to_string()
            } else {
                key
            };
            Some((key, v.to_string()))
        })
        .collect()
}

/// A config path as git resolves it: `~/` is the home, relative is relative
/// to `base`; `..` components are folded lexically.
fn expand(value: &str, base: &Path, home: &Path) -> PathBuf {
    let p = if let Some(rest) = value.strip_prefix("~/") {
        home.join(rest)
    } else {
        base.join(value)
    };
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn null_pairs_and_paths() {
        let got = parse_null_pairs(
            b"core.hookspath\n.githooks\0include.path\n../shared.cfg\0includeIf.gitdir:/x/.path\n~/c\0",
        );
        assert_eq!(
            got,
            vec![
                ("core.hookspath".into(), ".githooks".into()),
                ("include.path".into(), "../shared.cfg".into()),
                ("includeif.path".into(), "~/c".into()),
            ]
        );
        let home = Path::new("/home/u");
        assert_eq!(
            expand("../shared.cfg", Path::new("/p/.git"), home),
            Path::new("/p/shared.cfg")
        );
        assert_eq!(expand("~/c", Path::new("/p"), home), Path::new("/home/u/c"));
    }

    #[test]
    fn finds_nested_repositories_and_their_files() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path();
        std::fs::create_dir_all(p.join(".git")).unwrap();
        std::fs::create_dir_all(p.join("vendor/lib/.git")).unwrap();
        std::fs::create_dir_all(p.join("sub")).unwrap();
        std::fs::write(p.join("sub/.git"), "gitdir: ../.git/modules/sub\n").unwrap();
        std::fs::write(p.join(".gitmodules"), "").unwrap();
        std::os::unix::fs::symlink("/", p.join("link")).unwrap();
        let repos = find_repositories(&[p], &[]).unwrap();
        let want: BTreeSet<PathBuf> = [
            p.join(".git"),
            p.join("vendor/lib/.git"),
            p.join("sub/.git"),
        ]
        .into_iter()
        .collect();
        assert_eq!(repos.git_entries, want);
        // What the policy hides is not walked (hull's spare entries in
        // `.hull`): a repository there is not found, and the rest are.
        std::fs::create_dir_all(p.join(".hull/spares-r/c0/d1/.git")).unwrap();
        let all = find_repositories(&[p], &[]).unwrap();
        assert!(all
            .git_entries
            .contains(&p.join(".hull/spares-r/c0/d1/.git")));
        let hull = p.join(".hull");
        let repos = find_repositories(&[p], &[hull.as_path()]).unwrap();
        assert_eq!(repos.git_entries, want);
        assert_eq!(
            config_of(&p.join("sub/.git")),
            Some(p.join("sub/../.git/modules/sub/config"))
        );
    }

    /// A new `.git` is reported, and so is an empty one that was filled;
    /// an empty directory (a kept VM's placeholder) is no repository.
    #[test]
    fn new_repositories_are_reported_and_empty_placeholders_are_not() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path();
        let before = find_repositories(&[p], &[]).unwrap();
        std::fs::create_dir(p.join(".git")).unwrap();
        std::fs::create_dir_all(p.join("a/.git")).unwrap();
        std::fs::write(p.join("a/.git/config"), "").unwrap();
        let placeholder = find_repositories(&[p], &[]).unwrap();
        assert_eq!(placeholder.git_entries.len(), 2);
        assert_eq!(new_repositories(&before, &placeholder), [p.join("a/.git")]);
        std::fs::write(p.join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
        let filled = find_repositories(&[p], &[]).unwrap();
        assert_eq!(new_repositories(&placeholder, &filled), [p.join(".git")]);
        assert!(new_repositories(&filled, &filled).is_empty());
    }
}
