//! One policy, every tier.
//!
//! A policy says what a sandboxed command may read, read and execute, write,
//! and reach. It is parsed from TOML ([`file`]), resolved against one hull
//! instance ([`resolve`]: variables expanded, always-protected paths added),
//! then lowered by each tier into what that tier's mechanism enforces
//! ([`lower`]). Lowering is a pure function of the resolved policy and a view
//! of the host filesystem ([`HostFs`]), so every lowered form is golden-tested.
//!
//! What this crate protects against: a policy file that says something other
//! than what the reader thinks (unknown keys, wrong types, relative paths that
//! escape the project are errors, never ignored). What it does not: a policy
//! that grants too much. `hull policy explain` shows the boundary for review.
//!
//! The crate is the lowest floor of hull's workspace: it depends on no other
//! crate of hull's, starts no process and opens no socket. It reads the host
//! in two places only, both named: [`RealFs`] (`lstat`, `readlink` and
//! directory listings of the paths a policy names, for the lowerings) and
//! [`git`] (the walk of the writable roots for repositories, before a run).
//! Launching a tier, the runtime's directories and everything a command can
//! change live in the crates above, which may use this one and never the
//! other way round.

pub mod file;
#[cfg(unix)]
pub mod git;
pub mod hostfs;
pub mod lower;
pub mod net;
pub mod profiles;
pub mod resolve;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

pub use file::{PolicyError, PolicyFile};
pub use hostfs::{HostFs, NodeKind, RealFs};
pub use net::{NetMode, NetPolicy};
pub use resolve::{resolve, ResolveError, Vars};

/// How a path may be used. Ordered from least to most access.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Access {
    /// Read files and list directories.
    Read,
    /// Read, list, and execute.
    ReadExec,
    /// Read, list, execute, create, write, rename, remove.
    ReadWrite,
}

impl Access {
    pub fn as_str(self) -> &'static str {
        match self {
            Access::Read => "read",
            Access::ReadExec => "read_exec",
            Access::ReadWrite => "read_write",
        }
    }
}

/// Why a path is granted: which policy key, or hull's own runtime.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GrantOrigin {
    /// Listed in the policy file under `fs.<key>`.
    Policy,
    /// This instance's `tmp/` (always read-write).
    InstanceTmp,
    /// This instance's `spill/` (always read-only).
    InstanceSpill,
    /// A copy-on-write run's upper directory (read-write; [`Policy::cow_view`]).
    ChangeSet,
    /// hull's agent, a session's leader on a native tier (the one file,
    /// read and execute).
    Agent,
}

/// A path the command may use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Grant {
    pub path: PathBuf,
    pub access: Access,
    pub origin: GrantOrigin,
}

/// How a protected path is enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Protection {
    /// Neither readable nor writable; masked by an empty directory or file.
    Hidden,
    /// Readable, but never written, created, renamed or removed.
    ReadOnly,
}

/// Why a path is protected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProtectReason {
    /// Listed in the policy under `fs.deny`.
    PolicyDeny,
    /// hull's own config dir inside a writable root.
    HullConfig,
    /// `.git` inside a writable root (hooks and config run code on the host).
    GitMetadata,
    /// A shell startup file inside a writable root.
    ShellRc,
    /// The directory holding every hull instance (other instances' tmp/spill).
    OtherInstances,
    /// hull's own state: the tier-3 image cache and the VMs of `hull vm up`
    /// (their QMP and agent sockets).
    HullState,
}

impl ProtectReason {
    pub fn as_str(&self) -> &'static str {
        match self {
            ProtectReason::PolicyDeny => "policy fs.deny",
            ProtectReason::HullConfig => "hull config dir",
            ProtectReason::GitMetadata => "git metadata",
            ProtectReason::ShellRc => "shell startup file",
            ProtectReason::OtherInstances => "other hull instances",
            ProtectReason::HullState => "hull's own state",
        }
    }
}

/// A path the command must not use (or only read), even inside a grant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Protect {
    pub path: PathBuf,
    pub protection: Protection,
    pub reason: ProtectReason,
}

/// Resource limits. `None` means the tier's default.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct Limits {
    /// Wall time after which the whole process tree is killed.
    #[serde(with = "opt_duration_secs")]
    pub wall_time: Option<Duration>,
    /// Memory in bytes.
    pub memory: Option<u64>,
    /// Maximum number of processes/threads.
    pub pids: Option<u64>,
    /// CPUs (whole cores).
    pub cpus: Option<u32>,
}

mod opt_duration_secs {
    use serde::Serializer;
    use std::time::Duration;
    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_some(&d.as_secs_f64()),
            None => s.serialize_none(),
        }
    }
}

/// The environment given to the command: nothing from the host but `pass`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct EnvPolicy {
    /// Host variables passed through when set.
    pub pass: Vec<String>,
    /// Variables set to fixed values (after expansion).
    pub set: BTreeMap<String, String>,
}

/// What a command may do to git metadata (`.git`, `.gitmodules`, a
/// config's hooks and includes) in its writable roots: policy key `fs.git`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum GitMetadata {
    /// Read, never written: git runs hooks and config from there when
    /// someone uses git on the host.
    #[default]
    ReadOnly,
    /// Written like the rest of the root, which is then the command's
    /// whole (no `.hull` kept there either): for a copy that nobody uses
    /// on the host (a session's `copy` workspace, removed at its end).
    Writable,
}

impl GitMetadata {
    pub fn as_str(self) -> &'static str {
        match self {
            GitMetadata::ReadOnly => "read-only",
            GitMetadata::Writable => "writable",
        }
    }
}

/// A policy resolved for one hull instance: absolute paths, protections added.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Policy {
    /// Profile name or file path it came from.
    pub name: String,
    pub grants: Vec<Grant>,
    pub protects: Vec<Protect>,
    /// `fs.git`: whether git metadata in the writable roots is protected.
    pub git: GitMetadata,
    pub net: NetPolicy,
    pub limits: Limits,
    pub env: EnvPolicy,
    /// Tier 3's container userland.
    pub vm: VmPolicy,
    /// The variables it was resolved with (project, tmp, spill, home, runs).
    pub vars: Vars,
}

/// What tier 3's container holds beyond the image's default userland (the
/// other tiers run the host's own programs and ignore it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct VmPolicy {
    /// Debian packages added to the container image: valid names, sorted,
    /// no repeats. Empty: the image's default userland.
    pub packages: Vec<String>,
    /// A whole userland from this tarball instead (absolute path).
    pub rootfs: Option<std::path::PathBuf>,
    /// A whole userland from this container image instead (a reference:
    /// `oci-archive:PATH`, `docker-archive:PATH`, `oci:DIR[:TAG]`).
    pub image: Option<String>,
    /// Where the container sees the project.
    pub project_at: ProjectAt,
}

/// Where tier 3's container sees the project (`[vm] project_at`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ProjectAt {
    /// The container image's `WorkingDir` when the userland is an image
    /// that names one, else the host's path. Until hull has read the
    /// image's config (and set [`VmPolicy::project_at`] to one of the
    /// others), the host's path.
    #[default]
    Image,
    /// At the same path as on the host.
    Host,
    /// At this path (absolute, checked by [`check_project_at`]).
    Path(std::path::PathBuf),
}

/// Why `path` cannot be where the container sees the project: `/`, a
/// system directory itself (`/usr`, `/etc`, ...), or inside one the
/// container's own workings live in (`/proc`, `/sys`, `/dev`, `/run`,
/// `/etc`, `/boot`, the programs' directories, hull's `/opt/hull`).
/// Inside `/usr`, `/opt`, `/var`, `/srv` and anywhere else is fine
/// (`/usr/src/app`, `/testbed`).
pub fn check_project_at(path: &std::path::Path) -> Result<(), String> {
    use std::path::Component;
    let text = path.to_str().ok_or("is not UTF-8")?;
    if !path.is_absolute() || text.contains('\0') {
        return Err("is not an absolute path".into());
    }
    if !path
        .components()
        .skip(1)
        .all(|c| matches!(c, Component::Normal(_)))
    {
        return Err("has `.` or `..` in it".into());
    }
    if path.components().count() < 2 {
        return Err("is the container's `/`".into());
    }
    if let Some(d) = lower::vm::SYSTEM_DIRS
        .iter()
        .find(|d| path == std::path::Path::new(d))
    {
        return Err(format!("is the container's own {d}"));
    }
    const INSIDE: &[&str] = &[
        "/proc",
        "/sys",
        "/dev",
        "/run",
        "/etc",
        "/boot",
        "/bin",
        "/sbin",
        "/lib",
        "/lib32",
        "/lib64",
        "/libx32",
        "/opt/hull",
    ];
    if let Some(d) = INSIDE.iter().find(|d| path.starts_with(d)) {
        return Err(format!(
            "lies in {d}, which the container's own workings use"
        ));
    }
    Ok(())
}

impl Policy {
    /// The view of a copy-on-write run where a tier shows no overlay
    /// (seatbelt, appcontainer: the seeds' design): the project is
    /// read-only (its `read_write` grant becomes `read_exec`), and `upper`,
    /// the change set's directory outside it, is the one place the run
    /// writes its changes to the project. The boundary is this plan: what
    /// would carry writes aimed at the project into `upper` (a redirector)
    /// is convenience only, and without it those writes fail.
    pub fn cow_view(&self, upper: &std::path::Path) -> Policy {
        let mut p = self.clone();
        for g in &mut p.grants {
            if g.path == p.vars.project && g.access == Access::ReadWrite {
                g.access = Access::ReadExec;
            }
        }
        p.grants.push(Grant {
            path: upper.to_path_buf(),
            access: Access::ReadWrite,
            origin: GrantOrigin::ChangeSet,
        });
        p
    }

    /// Writable roots other than the instance tmp (the ones protections apply to).
    pub fn writable_roots(&self) -> impl Iterator<Item = &Grant> {
        self.grants.iter().filter(|g| g.access == Access::ReadWrite)
    }

    /// The environment the command starts with, from the host environment given.
    pub fn command_env(&self, host: &[(String, String)]) -> Vec<(String, String)> {
        let mut out: BTreeMap<String, String> = BTreeMap::new();
        for (k, v) in host {
            if self.env.pass.iter().any(|p| p == k) {
                out.insert(k.clone(), v.clone());
            }
        }
        for (k, v) in &self.env.set {
            out.insert(k.clone(), v.clone());
        }
        out.into_iter().collect()
    }
}
