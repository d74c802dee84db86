//! What a run is prepared from, before any tier starts: the project's
//! path, the variables a policy is resolved with, the resolved policy (with
//! hull's own state hidden and what git would run protected) and the
//! command's environment.
//!
//! `hull run` prepares its runs here, and so do the VM's supervisor (`hull
//! vm up` resolves the policy of a kept VM) and the batch pool (one policy
//! for its workers): this module sits below all three. It uses the policy,
//! the runtime's settings and state paths and the network's registry
//! lookups, never `run`, `tier` or `vm`.

use std::path::{Path, PathBuf};

use crate::policy::{self, Policy, Vars};

/// The user's home directory, for `${HOME}`.
pub fn home_dir() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .unwrap_or_else(|| PathBuf::from("/nonexistent"))
}

/// Canonical project path, refused when inside the runs dir.
pub fn project_path(p: &Path, runs: &Path) -> Result<PathBuf, ProjectError> {
    let path = std::fs::canonicalize(p).map_err(|source| ProjectError::Open {
        path: p.to_path_buf(),
        source,
    })?;
    let runs_c = std::fs::canonicalize(runs).unwrap_or_else(|_| runs.to_path_buf());
    if path.starts_with(&runs_c) {
        return Err(ProjectError::InRuns { path, runs: runs_c });
    }
    Ok(path)
}

/// Why a run's project cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ProjectError {
    #[error("project {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("project {path} is inside hull's run directory {runs}; refusing (it would expose other instances)")]
    InRuns { path: PathBuf, runs: PathBuf },
}

/// Why a policy could not be prepared for a run.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error(transparent)]
    Policy(#[from] policy::PolicyError),
    #[cfg(unix)]
    #[error("net.allow: {0}")]
    Registry(#[from] crate::net::registry::RegistryError),
    #[cfg(unix)]
    #[error(transparent)]
    Git(#[from] policy::git::GitScanError),
}

/// The git repositories in a run's writable roots, as found before it.
#[cfg(unix)]
pub type Repos = policy::git::Repos;
/// Nothing to find where git repositories are not scanned.
#[cfg(not(unix))]
pub type Repos = ();

/// Resolves `pf` for an instance, hiding hull's own state from every grant
/// that would expose it (the runs root, in the policy already; the tier-3
/// image cache; the VMs of `hull vm up`) and protecting what git would run
/// from every repository in the writable roots ([`policy::git`]).
pub fn resolve_policy(
    pf: &policy::PolicyFile,
    vars: &Vars,
) -> Result<(Policy, Repos), PrepareError> {
    let mut pol = policy::resolve(pf, vars)?;
    // `registry:NAME`: the hosts the host's clients use, asked now.
    #[cfg(unix)]
    if pol.net.mode == policy::NetMode::Allowlist {
        crate::net::registry::apply(&mut pol.net)?;
    }
    for root in crate::state::hidden() {
        // A session started from a template works on the template's
        // workspace, in the image cache: the rest of hull's state there
        // stays hidden, entry by entry down to it.
        let hidden = match template_workspace_below(&root, &vars.project) {
            Some(components) => hidden_beside(&root, &components),
            None => vec![root],
        };
        for path in hidden {
            if !pol.protects.iter().any(|p| p.path == path) {
                pol.protects.push(policy::Protect {
                    path,
                    protection: policy::Protection::Hidden,
                    reason: policy::ProtectReason::HullState,
                });
            }
        }
    }
    pol.protects
        .sort_by(|a, b| a.path.cmp(&b.path).then(a.protection.cmp(&b.protection)));
    #[cfg(unix)]
    let repos = if pol.git == policy::GitMetadata::Writable {
        // Nothing of git's is protected: nothing to look for.
        Repos::default()
    } else {
        let repos = policy::git::find_in(&pol)?;
        policy::git::protect(&mut pol, &repos)?;
        repos
    };
    #[cfg(not(unix))]
    let repos = ();
    Ok((pol, repos))
}

/// The components from the image cache `root` down to `project` when the
/// project is a template's workspace (`templates/<NAME>/workspace`, as
/// `hull serve` starts a session from a template), else none.
fn template_workspace_below(root: &Path, project: &Path) -> Option<Vec<std::ffi::OsString>> {
    let root = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
    let rel = project.strip_prefix(&root).ok()?;
    let parts: Vec<std::ffi::OsString> = rel
        .components()
        .map(|c| c.as_os_str().to_os_string())
        .collect();
    match parts.as_slice() {
        [t, _, w] if t == "templates" && w == "workspace" => Some(parts),
        _ => None,
    }
}

/// Every entry beside the way from `root` down `components` (each
/// directory's other entries, as they are now), to hide them.
fn hidden_beside(root: &Path, components: &[std::ffi::OsString]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dir = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
    for next in components {
        match std::fs::read_dir(&dir) {
            Ok(entries) => out.extend(
                entries
                    .flatten()
                    .filter(|e| e.file_name() != *next)
                    .map(|e| e.path()),
            ),
            // What cannot be listed is hidden whole (and the way on with it).
            Err(_) => {
                out.push(dir);
                return out;
            }
        }
        dir.push(next);
    }
    out
}

/// The variables for resolving a policy in an instance.
pub fn vars_for(project: PathBuf, tmp: PathBuf, spill: PathBuf, runs: PathBuf) -> Vars {
    Vars {
        project,
        tmp,
        spill,
        home: home_dir(),
        runs,
    }
}

/// The command's environment: the policy's, the caller's `--env`, and hull's
/// own variables for the instance (which the caller cannot override).
pub fn command_env(
    policy: &Policy,
    overrides: &[(String, String)],
    own: Vec<(String, String)>,
) -> Vec<(String, String)> {
    let host: Vec<(String, String)> = std::env::vars().collect();
    let mut env = policy.command_env(&host);
    for (k, v) in overrides.iter().cloned().chain(own) {
        env.retain(|(x, _)| *x != k);
        env.push((k, v));
    }
    env.sort();
    env
}
