//! Lowering for tier 3 (`vm`): the policy as virtiofs shares, host-side
//! masks, and the Incus disk devices the guest agent adds to the container.
//!
//! Each granted host directory becomes one virtiofs share served by its own
//! virtiofsd, mounted in the guest at `/mnt/hull/<tag>` and passed into the
//! container at the same path as on the host. (A restore with more shares
//! than the snapshot's slots packs the read-only grants without masks into
//! one virtiofsd: hull's `vm::snapshot::slotted`.) Read-only grants and the
//! instance spill are read-only *on the host* (`virtiofsd --readonly`), not
//! only in the guest.
//!
//! Protections inside shares (`.git`, `.hull`, shell rc files, `fs.deny`)
//! are enforced on the host too: the share's virtiofsd runs in a private
//! mount namespace where each protected path is bind-mounted read-only onto
//! itself, or covered by an empty read-only directory or file (see
//! hull's `vm::virtiofsd`). A read-only grant nested in a writable one is a
//! read-only mask of the outer share; a writable grant nested in a read-only
//! one is its own writable share, mounted over the outer one in the container.
//!
//! System directories (`/usr`, `/bin`, `/lib*`, `/etc`, `/opt`, ...) are not
//! shared: the container has its own userland from the guest image, so the
//! host's system files (and its `/etc`) never enter the VM. Grants that are
//! files, symlinks or missing are listed as not shared, with the reason.
//!
//! What this does not protect: `read` versus `read_exec` is only a guest
//! mount option (`noexec`) on tier 3; code in the VM can always copy a
//! readable file somewhere executable. A protected path that is a symlink, or
//! below a symlink, inside a share that must mask it is an error (a mount
//! follows links), never silently unprotected.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::{Access, GrantOrigin, HostFs, NodeKind, Policy, ProtectReason, Protection};

/// The guest uid (and, inside the container via `raw.idmap`, the container
/// uid) commands run as. Host files appear owned by it.
pub const GUEST_UID: u32 = 1000;
/// The guest gid commands run as.
pub const GUEST_GID: u32 = 1000;
/// Where the outer agent mounts shares in the guest.
pub const GUEST_SHARE_ROOT: &str = "/mnt/hull";
/// Incus container the per-instance container is cloned from.
pub const BASE_CONTAINER: &str = "hull-base";
/// The container name a run configures: the image prepared a clone of the
/// base under this name (its AppArmor profile compiled), so it starts fast.
/// Each VM boots from its own copy-on-write disk, so the name is per VM.
pub const RUN_CONTAINER: &str = "hull-run";

/// Host directories the container image provides itself; never shared.
pub const SYSTEM_DIRS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/boot",
    "/dev", "/proc", "/sys", "/run", "/var", "/srv",
];

/// Why a share exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ShareOrigin {
    /// A policy grant.
    Policy,
    /// The instance's `tmp/`.
    InstanceTmp,
    /// The instance's `spill/` (always read-only).
    InstanceSpill,
    /// A `--cow` run's change set (its `layers/`: `upper/` and `work/`):
    /// writable, mounted in the guest only, as the upper layer of an
    /// overlay over the read-only share at the same container path
    /// ([`with_cow`]). Never attached to the container itself.
    ChangeSet,
}

/// A protected path masked inside a share by the share's virtiofsd.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Mask {
    pub path: PathBuf,
    pub protection: Protection,
    pub reason: ProtectReason,
    /// False when the path does not exist yet: a placeholder is created on
    /// the host (writable shares), so the guest cannot create it either.
    pub exists: bool,
    /// A missing path gets an empty file (shell rc files) instead of a dir.
    pub placeholder_is_file: bool,
}

/// One virtiofs share.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Share {
    /// virtiofs tag (`project`, `spill`, `tmp`, `ro-1`, `rw-1`, ...).
    pub tag: String,
    pub host_path: PathBuf,
    /// Mount point in the guest (`/mnt/hull/<tag>`).
    pub guest_path: String,
    /// Path of the Incus disk device in the container (same as on the host).
    pub container_path: PathBuf,
    /// `virtiofsd --readonly` on the host, and `readonly=true` on the device.
    pub readonly: bool,
    /// Programs may be executed from it (guest mount without `noexec`).
    pub exec: bool,
    pub origin: ShareOrigin,
    /// Protected paths inside, masked on the host.
    pub masks: Vec<Mask>,
    /// Set when the share is packed with other read-only shares into one
    /// virtiofs device (see hull's `vm::snapshot::slotted`): its
    /// directory in that device's view. Never set by the lowering.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subdir: Option<String>,
}

/// Why a grant is not shared.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NotShared {
    /// A system directory: the container has its own.
    FromImage,
    /// Covered by the share of this enclosing directory, with the same access.
    Covered { by: PathBuf },
    /// Inside a writable share: masked read-only there.
    MaskedReadOnly { share: PathBuf },
    /// Does not exist on the host.
    Missing,
    /// A file: virtiofs shares directories only.
    File,
    /// A symlink: grant the directory it points to.
    Symlink { target: PathBuf },
    /// Denied by a protection that covers it.
    Denied { by: PathBuf },
}

/// A grant that does not become a share, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Skipped {
    pub path: PathBuf,
    pub access: Access,
    pub why: NotShared,
}

/// Container limits from the policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct ContainerLimits {
    pub memory_bytes: Option<u64>,
    pub cpus: Option<u32>,
    pub processes: Option<u64>,
}

/// What tier 3 enforces for a policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VmPlan {
    pub shares: Vec<Share>,
    pub skipped: Vec<Skipped>,
    pub uid: u32,
    pub gid: u32,
    pub base_container: String,
    pub limits: ContainerLimits,
    /// Always `none`: the VM has no NIC and the container none but `lo`.
    pub network: &'static str,
}

/// A policy tier 3 cannot enforce as written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VmLowerError {
    #[error(
        "tier vm: protected path {path} ({reason}) is {what} inside the share of {share}; a \
         mount would follow the link, so tier vm cannot mask it. Replace the link, or remove \
         {share} from the policy's writable paths"
    )]
    SymlinkInShare {
        path: PathBuf,
        reason: &'static str,
        what: &'static str,
        share: PathBuf,
    },
    #[error(
        "tier vm: share {path} lies inside the hidden path {hidden} of share {outer}; the \
         container could not mount it there. Narrow the grant of {outer}"
    )]
    ShareUnderHiddenMask {
        path: PathBuf,
        hidden: PathBuf,
        outer: PathBuf,
    },
    #[error("tier vm: more than {0} shares; narrow the policy")]
    TooManyShares(usize),
    #[error(
        "tier vm: --cow: the project {project} is not a writable share of this policy ({why}); \
         there is nothing for the command to write, so nothing to keep. Run without --cow"
    )]
    CowWithoutWritableProject { project: PathBuf, why: &'static str },
    #[error("tier vm: the project cannot be at {at} in the container: {why}")]
    ProjectAt { at: PathBuf, why: String },
    #[error(
        "tier vm: the project cannot be at {at} in the container: the share of {share} is at \
         {container} there, and one would be mounted over the other. Set `[vm] project_at` to \
         \"host\" or to another path"
    )]
    ProjectAtOverlaps {
        at: PathBuf,
        share: PathBuf,
        container: PathBuf,
    },
    #[error("tier vm: {0}")]
    Plan(#[from] super::plan::PlanError),
}

/// The most shares one VM gets (each is a virtiofsd and a PCI device).
pub const MAX_SHARES: usize = 32;

/// A system directory, or inside one: the container image has its own.
pub fn is_system(p: &Path) -> bool {
    p == Path::new("/") || SYSTEM_DIRS.iter().any(|d| p.starts_with(d))
}

/// Lowers `policy` for tier 3. Pure: the host is only seen through `fs`.
pub fn lower(policy: &Policy, fs: &dyn HostFs) -> Result<VmPlan, VmLowerError> {
    super::plan::check_no_planted_links(policy, fs)?;
    let mut skipped = Vec::new();
    // Candidate shares: (path, access, origin), sorted by path so parents come first.
    let mut cands: Vec<(PathBuf, Access, ShareOrigin)> = Vec::new();
    for g in &policy.grants {
        let origin = match g.origin {
            GrantOrigin::Policy => ShareOrigin::Policy,
            GrantOrigin::InstanceTmp => ShareOrigin::InstanceTmp,
            GrantOrigin::InstanceSpill => ShareOrigin::InstanceSpill,
            // A host directory as a policy grant is: tier 3 does not lower
            // a `cow_view` (the seatbelt and appcontainer plan); its
            // `--cow` is [`with_cow`] over the ordinary plan.
            GrantOrigin::ChangeSet => ShareOrigin::Policy,
            // Native sessions only: the guest has its own agent.
            GrantOrigin::Agent => continue,
        };
        let skip = |why| Skipped {
            path: g.path.clone(),
            access: g.access,
            why,
        };
        if origin == ShareOrigin::Policy && is_system(&g.path) {
            skipped.push(skip(NotShared::FromImage));
            continue;
        }
        // The instance's own dirs are created by hull before the VM starts.
        let kind = match origin {
            ShareOrigin::Policy => fs.kind(&g.path),
            _ => NodeKind::Dir,
        };
        match kind {
            NodeKind::Dir => {}
            NodeKind::Missing => {
                skipped.push(skip(NotShared::Missing));
                continue;
            }
            NodeKind::File => {
                skipped.push(skip(NotShared::File));
                continue;
            }
            NodeKind::Symlink(target) => {
                skipped.push(skip(NotShared::Symlink { target }));
                continue;
            }
        }
        // Denied by a protection at or above it? (The instance's own dirs sit
        // on top of the runs mask by design.)
        if origin == ShareOrigin::Policy {
            if let Some(p) = policy
                .protects
                .iter()
                .find(|p| p.protection == Protection::Hidden && g.path.starts_with(&p.path))
            {
                skipped.push(skip(NotShared::Denied { by: p.path.clone() }));
                continue;
            }
        }
        let access = match origin {
            ShareOrigin::InstanceSpill => Access::Read,
            _ => g.access,
        };
        // A read-only protection at the root makes the whole share read-only.
        let access = if access == Access::ReadWrite
            && policy
                .protects
                .iter()
                .any(|p| p.protection == Protection::ReadOnly && g.path.starts_with(&p.path))
        {
            Access::ReadExec
        } else {
            access
        };
        cands.push((g.path.clone(), access, origin));
    }
    cands.sort_by(|a, b| a.0.cmp(&b.0));

    // Drop candidates covered by an enclosing share of the same writability;
    // a read-only grant inside a writable share becomes a mask of it.
    let mut shares: Vec<Share> = Vec::new();
    let mut ro_in_rw: Vec<(PathBuf, usize)> = Vec::new();
    for (path, access, origin) in cands {
        let readonly = access != Access::ReadWrite;
        let exec = access != Access::Read;
        // The innermost enclosing share.
        let outer = shares
            .iter()
            .enumerate()
            .filter(|(_, s)| path.starts_with(&s.host_path))
            .max_by_key(|(_, s)| s.host_path.components().count())
            .map(|(i, _)| i);
        if let (Some(i), ShareOrigin::Policy) = (outer, origin) {
            let o = &shares[i];
            if o.readonly == readonly {
                skipped.push(Skipped {
                    path,
                    access,
                    why: NotShared::Covered {
                        by: o.host_path.clone(),
                    },
                });
                continue;
            }
            if readonly && !o.readonly {
                ro_in_rw.push((path.clone(), i));
                skipped.push(Skipped {
                    path,
                    access,
                    why: NotShared::MaskedReadOnly {
                        share: o.host_path.clone(),
                    },
                });
                continue;
            }
        }
        shares.push(Share {
            tag: String::new(),
            guest_path: String::new(),
            container_path: path.clone(),
            host_path: path,
            readonly,
            exec,
            origin,
            masks: Vec::new(),
            subdir: None,
        });
    }
    if shares.len() > MAX_SHARES {
        return Err(VmLowerError::TooManyShares(MAX_SHARES));
    }

    // Tags: fixed names for the project and the instance dirs, numbered otherwise.
    let (mut n_ro, mut n_rw) = (0, 0);
    for s in &mut shares {
        s.tag = match s.origin {
            ShareOrigin::InstanceSpill => "spill".into(),
            ShareOrigin::InstanceTmp => "tmp".into(),
            ShareOrigin::ChangeSet => "changes".into(),
            ShareOrigin::Policy if s.host_path == policy.vars.project => "project".into(),
            ShareOrigin::Policy if s.readonly => {
                n_ro += 1;
                format!("ro-{n_ro}")
            }
            ShareOrigin::Policy => {
                n_rw += 1;
                format!("rw-{n_rw}")
            }
        };
        s.guest_path = format!("{GUEST_SHARE_ROOT}/{}", s.tag);
    }
    // Masks: every protection inside a share that the share would otherwise
    // expose: hidden ones in every share, read-only ones in writable shares.
    let mut masks: Vec<(usize, Mask)> = Vec::new();
    let mut add_mask = |i: usize,
                        share: &Share,
                        path: &Path,
                        protection: Protection,
                        reason: ProtectReason|
     -> Result<(), VmLowerError> {
        let kind = check_below(share, path, &reason, fs)?;
        masks.push((
            i,
            Mask {
                path: path.to_path_buf(),
                protection,
                placeholder_is_file: reason == ProtectReason::ShellRc,
                reason,
                exists: kind != NodeKind::Missing,
            },
        ));
        Ok(())
    };
    for (i, s) in shares.iter().enumerate() {
        for p in &policy.protects {
            if p.path == s.host_path || !p.path.starts_with(&s.host_path) {
                continue;
            }
            let needed = match p.protection {
                Protection::Hidden => true,
                Protection::ReadOnly => !s.readonly,
            };
            if needed {
                add_mask(i, s, &p.path, p.protection, p.reason.clone())?;
            }
        }
    }
    for (path, i) in &ro_in_rw {
        let s = &shares[*i];
        add_mask(*i, s, path, Protection::ReadOnly, ProtectReason::PolicyDeny)?;
    }
    for (i, m) in masks {
        shares[i].masks.push(m);
    }
    for s in &mut shares {
        s.masks.sort_by(|a, b| a.path.cmp(&b.path));
        s.masks.dedup_by(|a, b| a.path == b.path);
    }
    // A share may not sit inside another share's hidden mask: the container
    // would have to create its mount point in an empty read-only directory.
    for s in &shares {
        for o in &shares {
            if let Some(m) = o
                .masks
                .iter()
                .find(|m| m.protection == Protection::Hidden && s.host_path.starts_with(&m.path))
            {
                return Err(VmLowerError::ShareUnderHiddenMask {
                    path: s.host_path.clone(),
                    hidden: m.path.clone(),
                    outer: o.host_path.clone(),
                });
            }
        }
    }

    if let crate::ProjectAt::Path(at) = &policy.vm.project_at {
        project_at(&mut shares, &policy.vars.project, at)?;
    }

    Ok(VmPlan {
        shares,
        skipped,
        uid: GUEST_UID,
        gid: GUEST_GID,
        base_container: BASE_CONTAINER.into(),
        limits: ContainerLimits {
            memory_bytes: policy.limits.memory,
            cpus: policy.limits.cpus,
            processes: policy.limits.pids,
        },
        network: "none",
    })
}

/// Moves the project's share (and every share inside it) to `at` in the
/// container (`[vm] project_at`, an image's `WorkingDir`). Nothing else
/// may lie at, above or below `at`: the instance's directories and the
/// other grants stay at their host paths.
fn project_at(shares: &mut [Share], project: &Path, at: &Path) -> Result<(), VmLowerError> {
    crate::check_project_at(at).map_err(|why| VmLowerError::ProjectAt {
        at: at.to_path_buf(),
        why,
    })?;
    for s in shares.iter_mut() {
        if let Ok(rest) = s.host_path.strip_prefix(project) {
            s.container_path = if rest.as_os_str().is_empty() {
                at.to_path_buf()
            } else {
                at.join(rest)
            };
        } else if s.container_path.starts_with(at) || at.starts_with(&s.container_path) {
            return Err(VmLowerError::ProjectAtOverlaps {
                at: at.to_path_buf(),
                share: s.host_path.clone(),
                container: s.container_path.clone(),
            });
        }
    }
    Ok(())
}

/// `--cow`: the project's share becomes read-only on the host (its
/// virtiofsd `--readonly`; its masks kept, placeholders for missing ones
/// made as for a writable share) and the lower layer of an overlay in the
/// guest, whose upper layer is `layers` (a change set's `upper/` and
/// `work/`), served writable by a share of its own ([`ShareOrigin::ChangeSet`],
/// at the project's container path). The command's writes land in
/// `layers/upper` on the host and nowhere else.
pub fn with_cow(mut plan: VmPlan, project: &Path, layers: &Path) -> Result<VmPlan, VmLowerError> {
    let refuse = |why| VmLowerError::CowWithoutWritableProject {
        project: project.to_path_buf(),
        why,
    };
    let share = plan
        .shares
        .iter_mut()
        .find(|s| s.origin == ShareOrigin::Policy && s.host_path == project)
        .ok_or_else(|| refuse("it is not shared on its own"))?;
    if share.readonly {
        return Err(refuse("it is shared read-only"));
    }
    share.readonly = true;
    let container_path = share.container_path.clone();
    plan.shares.push(Share {
        tag: "changes".into(),
        host_path: layers.to_path_buf(),
        guest_path: format!("{GUEST_SHARE_ROOT}/changes"),
        container_path,
        readonly: false,
        exec: false,
        origin: ShareOrigin::ChangeSet,
        masks: Vec::new(),
        subdir: None,
    });
    if plan.shares.len() > MAX_SHARES {
        return Err(VmLowerError::TooManyShares(MAX_SHARES));
    }
    Ok(plan)
}

impl VmPlan {
    /// Where the container sees the host path `path`: in the share that
    /// holds it (the deepest), else at the same path.
    pub fn container_path_of(&self, path: &Path) -> PathBuf {
        self.shares
            .iter()
            .filter(|s| s.origin != ShareOrigin::ChangeSet)
            .filter_map(|s| Some((s, path.strip_prefix(&s.host_path).ok()?)))
            .max_by_key(|(s, _)| s.host_path.components().count())
            .map_or_else(
                || path.to_path_buf(),
                |(s, rest)| {
                    if rest.as_os_str().is_empty() {
                        s.container_path.clone()
                    } else {
                        s.container_path.join(rest)
                    }
                },
            )
    }

    /// The `--cow` overlay's shares, when the plan has one: the change
    /// set's (upper) and the read-only share beneath it (lower).
    pub fn overlay(&self) -> Option<(&Share, &Share)> {
        let upper = self
            .shares
            .iter()
            .find(|s| s.origin == ShareOrigin::ChangeSet)?;
        let lower = self.shares.iter().find(|s| {
            s.origin == ShareOrigin::Policy && s.container_path == upper.container_path
        })?;
        Some((upper, lower))
    }

    /// Whether `s` is the lower layer of the plan's `--cow` overlay.
    pub fn is_overlay_lower(&self, s: &Share) -> bool {
        self.overlay().is_some_and(|(_, lower)| lower.tag == s.tag)
    }
}

/// Checks that no component from the share root down to `path` is a
/// symlink; returns the kind of `path` itself.
fn check_below(
    share: &Share,
    path: &Path,
    reason: &ProtectReason,
    fs: &dyn HostFs,
) -> Result<NodeKind, VmLowerError> {
    let rel = path.strip_prefix(&share.host_path).unwrap_or(path);
    let mut p = share.host_path.clone();
    let mut kind = NodeKind::Dir;
    for c in rel.components() {
        p.push(c);
        kind = fs.kind(&p);
        match kind {
            NodeKind::Symlink(_) => {
                return Err(VmLowerError::SymlinkInShare {
                    path: path.to_path_buf(),
                    reason: reason.as_str(),
                    what: if p == path {
                        "a symlink"
                    } else {
                        "below a symlink"
                    },
                    share: share.host_path.clone(),
                })
            }
            NodeKind::Missing => return Ok(NodeKind::Missing),
            _ => {}
        }
    }
    Ok(kind)
}

impl VmPlan {
    /// The human-readable form `hull policy explain --tier vm` prints.
    pub fn render(&self) -> String {
        let mut o = String::new();
        o.push_str("tier vm: QEMU outer VM (no NIC) + unprivileged Incus container (no NIC)\n");
        o.push_str(&format!(
            "  commands run as uid {} gid {} in a clone of {}\n",
            self.uid, self.gid, self.base_container
        ));
        let lim = |v: Option<String>| v.unwrap_or_else(|| "default".into());
        o.push_str(&format!(
            "  limits: memory {}, cpus {}, processes {}\n",
            lim(self.limits.memory_bytes.map(|b| format!("{} MiB", b >> 20))),
            lim(self.limits.cpus.map(|c| c.to_string())),
            lim(self.limits.processes.map(|p| p.to_string())),
        ));
        o.push_str("  virtiofs shares (read-only is enforced by virtiofsd on the host):\n");
        for s in &self.shares {
            o.push_str(&format!(
                "    {:<8} {} {}{} -> guest {} -> container {}\n",
                s.tag,
                if s.readonly { "ro" } else { "rw" },
                s.host_path.display(),
                if s.exec { "" } else { " (noexec)" },
                s.guest_path,
                s.container_path.display()
            ));
            for m in &s.masks {
                o.push_str(&format!(
                    "             mask {} {} ({}{})\n",
                    match m.protection {
                        Protection::Hidden => "hidden   ",
                        Protection::ReadOnly => "read-only",
                    },
                    m.path.display(),
                    m.reason.as_str(),
                    if m.exists {
                        ""
                    } else {
                        ", missing: empty placeholder while the share is up"
                    }
                ));
            }
        }
        if !self.skipped.is_empty() {
            o.push_str("  not shared:\n");
            let mut by_why: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for s in &self.skipped {
                let why = match &s.why {
                    NotShared::FromImage => "system dir, the container image has its own".into(),
                    NotShared::Covered { by } => {
                        format!("covered by the share of {}", by.display())
                    }
                    NotShared::MaskedReadOnly { share } => {
                        format!("read-only mask in the share of {}", share.display())
                    }
                    NotShared::Missing => "missing on the host".into(),
                    NotShared::File => "a file; tier vm shares directories only".into(),
                    NotShared::Symlink { target } => {
                        format!("a symlink to {}; grant the target", target.display())
                    }
                    NotShared::Denied { by } => format!("denied by {}", by.display()),
                };
                by_why
                    .entry(why)
                    .or_default()
                    .push(s.path.display().to_string());
            }
            for (why, paths) in by_why {
                o.push_str(&format!("    {}: {}\n", paths.join(" "), why));
            }
        }
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hostfs::FakeFs;
    use crate::{resolve, PolicyFile, Vars};

    fn vars() -> Vars {
        Vars {
            project: "/work/proj".into(),
            tmp: "/tmp/hull-runs/ID/tmp".into(),
            spill: "/tmp/hull-runs/ID/spill".into(),
            home: "/home/u".into(),
            runs: "/tmp/hull-runs".into(),
        }
    }

    fn host() -> FakeFs {
        FakeFs::new()
            .dir("/usr/bin")
            .dir("/etc")
            .dir("/work/proj/src")
            .dir("/work/proj/.git/hooks")
            .dir("/tmp/hull-runs/ID/tmp")
            .dir("/tmp/hull-runs/ID/spill")
            .dir("/home/u/.cargo/registry")
            .dir("/home/u/.rustup")
            .file("/home/u/.cargo/credentials.toml")
    }

    fn plan(text: &str, fs: &FakeFs) -> Result<VmPlan, VmLowerError> {
        let pf = PolicyFile::parse("p", text).unwrap();
        lower(&resolve(&pf, &vars()).unwrap(), fs)
    }

    fn profile(name: &str, fs: &FakeFs) -> VmPlan {
        let pf = crate::profiles::load(name).unwrap();
        lower(&resolve(&pf, &vars()).unwrap(), fs).unwrap()
    }

    #[test]
    fn golden_default_profile() {
        let p = profile("default", &host());
        assert_eq!(
            p.render(),
            "\
tier vm: QEMU outer VM (no NIC) + unprivileged Incus container (no NIC)
  commands run as uid 1000 gid 1000 in a clone of hull-base
  limits: memory 4096 MiB, cpus default, processes 1024
  virtiofs shares (read-only is enforced by virtiofsd on the host):
    spill    ro /tmp/hull-runs/ID/spill (noexec) -> guest /mnt/hull/spill -> container /tmp/hull-runs/ID/spill
    tmp      rw /tmp/hull-runs/ID/tmp -> guest /mnt/hull/tmp -> container /tmp/hull-runs/ID/tmp
    project  rw /work/proj -> guest /mnt/hull/project -> container /work/proj
             mask read-only /work/proj/.git (git metadata)
             mask hidden    /work/proj/.hull (hull config dir, missing: empty placeholder while the share is up)
  not shared:
    /etc /usr /bin /sbin /lib /lib64 /lib32 /libx32 /opt: system dir, the container image has its own
"
        );
        let project = p.shares.iter().find(|s| s.tag == "project").unwrap();
        assert!(!project.readonly);
        let spill = p.shares.iter().find(|s| s.tag == "spill").unwrap();
        assert!(spill.readonly, "spill is always read-only on the host");
    }

    #[test]
    fn golden_build_profile_masks_credentials_and_keeps_home_invisible() {
        let p = profile("build", &host());
        let got = p.render();
        assert!(
            got.contains("    ro-2     ro /home/u/.rustup -> guest /mnt/hull/ro-2 -> container /home/u/.rustup\n"),
            "{got}"
        );
        // The caches are read-only (and not executable) in the guest too.
        assert!(
            got.contains("    ro-1     ro /home/u/.cargo/registry (noexec) -> guest /mnt/hull/ro-1 -> container /home/u/.cargo/registry\n"),
            "{got}"
        );
        // The home itself is never shared; missing caches are listed.
        assert!(!p.shares.iter().any(|s| s.host_path == Path::new("/home/u")));
        assert!(got.contains("/home/u/.cargo/git /home/u/.npm /home/u/.cache/pip /home/u/.cargo/bin /home/u/.pyenv /home/u/.nvm: missing on the host"), "{got}");
        // credentials sit outside every share: nothing to mask, nothing visible.
        assert!(!got.contains("credentials"), "{got}");
    }

    #[test]
    fn readonly_profile_shares_the_project_read_only_without_masks_for_read_only_paths() {
        let p = profile("readonly", &host());
        let project = p.shares.iter().find(|s| s.tag == "project").unwrap();
        assert!(project.readonly);
        assert!(!project.exec, "read (not read_exec) is noexec in the guest");
        // .git needs no read-only mask in a read-only share; there is no
        // .hull mask either since the project is not a writable root.
        assert!(project.masks.is_empty(), "{:?}", project.masks);
    }

    #[test]
    fn the_project_is_moved_where_the_policy_puts_it_with_what_lies_inside() {
        let fs = host().dir("/work/proj/out").dir("/home/u/notes");
        let text = "version = 1\n[fs]\nread = [\"${PROJECT}\", \"${HOME}/notes\"]\n\
                    read_write = [\"${PROJECT}/out\"]\n[vm]\nproject_at = \"/testbed\"\n";
        let p = plan(text, &fs).unwrap();
        let at = |host: &str| {
            let s = p.shares.iter().find(|s| s.host_path == Path::new(host));
            s.unwrap().container_path.clone()
        };
        assert_eq!(at("/work/proj"), Path::new("/testbed"));
        assert_eq!(at("/work/proj/out"), Path::new("/testbed/out"));
        // The rest stays where the host has it.
        assert_eq!(at("/home/u/notes"), Path::new("/home/u/notes"));
        assert_eq!(
            at("/tmp/hull-runs/ID/spill"),
            Path::new("/tmp/hull-runs/ID/spill")
        );
        // Masks are the host's (virtiofsd applies them), unmoved.
        let project = p.shares.iter().find(|s| s.tag == "project").unwrap();
        assert!(project
            .masks
            .iter()
            .all(|m| m.path.starts_with("/work/proj")));
        // Where a command in the project starts.
        assert_eq!(
            p.container_path_of(Path::new("/work/proj/src")),
            Path::new("/testbed/src")
        );
        assert_eq!(
            p.container_path_of(Path::new("/work/proj/out/x")),
            Path::new("/testbed/out/x")
        );
        assert_eq!(
            p.container_path_of(Path::new("/elsewhere")),
            Path::new("/elsewhere")
        );
        // The host's path: nothing moves.
        let host_text = text.replace("\"/testbed\"", "\"host\"");
        let p = plan(&host_text, &fs).unwrap();
        assert!(p.shares.iter().all(|s| s.container_path == s.host_path));
    }

    #[test]
    fn a_project_place_over_another_share_or_the_system_is_refused() {
        let at = |place: &str| {
            let text = format!("version = 1\n[fs]\nread_write = [\"${{PROJECT}}\"]\n[vm]\nproject_at = {place:?}\n");
            let pf = PolicyFile::parse("p", &text).map_err(|e| e.to_string())?;
            let pol = resolve(&pf, &vars()).map_err(|e| e.to_string())?;
            lower(&pol, &host()).map(|_| ()).map_err(|e| e.to_string())
        };
        // Over the instance's directories (both ways round).
        for place in ["/tmp", "/tmp/hull-runs/ID/spill/x"] {
            let e = at(place).unwrap_err();
            assert!(
                e.contains("mounted over the other") && e.contains("/tmp/hull-runs/ID/"),
                "{place}: {e}"
            );
        }
        // The container's own directories, and what is not a plain path.
        for place in [
            "/",
            "/usr",
            "/etc/app",
            "/proc/x",
            "/opt/hull/x",
            "/run/hull",
            "work",
            "/a/../b",
        ] {
            let e = at(place).unwrap_err();
            assert!(e.contains("vm.project_at"), "{place}: {e}");
        }
        for place in [
            "/testbed",
            "/usr/src/app",
            "/opt/app",
            "/var/www/html",
            "/root",
        ] {
            assert_eq!(at(place), Ok(()), "{place}");
        }
    }

    #[test]
    fn cow_over_a_moved_project_keeps_its_place() {
        let text =
            "version = 1\n[fs]\nread_write = [\"${PROJECT}\"]\n[vm]\nproject_at = \"/app\"\n";
        let p = plan(text, &host()).unwrap();
        let p = with_cow(p, Path::new("/work/proj"), Path::new("/l")).unwrap();
        let (upper, lower) = p.overlay().expect("an overlay");
        assert_eq!(upper.container_path, Path::new("/app"));
        assert_eq!(lower.container_path, Path::new("/app"));
        assert!(lower.readonly && lower.host_path == Path::new("/work/proj"));
    }

    #[test]
    fn nested_grants_become_masks_or_own_shares() {
        let fs = host().dir("/work/proj/vendor").dir("/home/u/notes/draft");
        let p = plan(
            "version = 1\n[fs]\nread_write = [\"${PROJECT}\", \"${HOME}/notes/draft\"]\nread = [\"${PROJECT}/vendor\", \"${HOME}/notes\"]\n",
            &fs,
        )
        .unwrap();
        let project = p.shares.iter().find(|s| s.tag == "project").unwrap();
        let vendor = project
            .masks
            .iter()
            .find(|m| m.path == Path::new("/work/proj/vendor"))
            .expect("read grant inside a writable share is a read-only mask");
        assert_eq!(vendor.protection, Protection::ReadOnly);
        let notes = p
            .shares
            .iter()
            .find(|s| s.host_path == Path::new("/home/u/notes"))
            .unwrap();
        assert!(notes.readonly);
        let draft = p
            .shares
            .iter()
            .find(|s| s.host_path == Path::new("/home/u/notes/draft"))
            .expect("writable grant inside a read-only share gets its own share");
        assert!(!draft.readonly);
        // Its .git/.hull protections are masked in the writable share.
        assert!(draft.masks.iter().any(|m| m.path.ends_with(".hull")));
    }

    #[test]
    fn deny_inside_a_share_is_hidden_and_deny_over_a_share_drops_it() {
        let fs = host().dir("/work/proj/secrets");
        let p = plan(
            "version = 1\n[fs]\nread_write = [\"${PROJECT}\", \"${HOME}/.cargo/registry\"]\ndeny = [\"secrets\", \"${HOME}/.cargo\"]\n",
            &fs,
        )
        .unwrap();
        let project = p.shares.iter().find(|s| s.tag == "project").unwrap();
        let m = project
            .masks
            .iter()
            .find(|m| m.path == Path::new("/work/proj/secrets"))
            .unwrap();
        assert_eq!(m.protection, Protection::Hidden);
        assert!(m.exists);
        assert!(!p
            .shares
            .iter()
            .any(|s| s.host_path.starts_with("/home/u/.cargo")));
        assert!(p
            .skipped
            .iter()
            .any(|s| s.path == Path::new("/home/u/.cargo/registry")
                && s.why
                    == NotShared::Denied {
                        by: "/home/u/.cargo".into()
                    }));
    }

    #[test]
    fn symlinked_protected_path_in_a_writable_share_is_an_error() {
        let fs = FakeFs::new()
            .dir("/work/proj/src")
            .symlink("/work/proj/.git", "/elsewhere/.git")
            .dir("/tmp/hull-runs/ID/tmp")
            .dir("/tmp/hull-runs/ID/spill");
        let e = plan("version = 1\n[fs]\nread_write = [\"${PROJECT}\"]\n", &fs).unwrap_err();
        assert!(
            matches!(
                e,
                VmLowerError::SymlinkInShare {
                    what: "a symlink",
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("/work/proj/.git"), "{e}");
    }

    #[test]
    fn files_symlinks_and_root_are_not_shared() {
        let fs = host()
            .file("/home/u/.gitconfig")
            .symlink("/home/u/link", "/work/proj");
        let p = plan(
            "version = 1\n[fs]\nread = [\"${HOME}/.gitconfig\", \"${HOME}/link\", \"/\"]\n",
            &fs,
        )
        .unwrap();
        let why = |path: &str| {
            p.skipped
                .iter()
                .find(|s| s.path == Path::new(path))
                .map(|s| s.why.clone())
        };
        assert_eq!(why("/home/u/.gitconfig"), Some(NotShared::File));
        assert_eq!(
            why("/home/u/link"),
            Some(NotShared::Symlink {
                target: "/work/proj".into()
            })
        );
        assert_eq!(why("/"), Some(NotShared::FromImage));
        // Only the instance dirs remain.
        let tags: Vec<&str> = p.shares.iter().map(|s| s.tag.as_str()).collect();
        assert_eq!(tags, ["spill", "tmp"]);
    }

    #[test]
    fn a_shared_tmp_hides_other_instances_and_is_refused_around_our_own() {
        // /tmp shared read-only would hide /tmp/hull-runs (other instances);
        // this instance's tmp/spill shares sit under that mask, where the
        // container could not create their mount points: refused, clearly.
        let e = plan("version = 1\n[fs]\nread = [\"/tmp\"]\n", &host()).unwrap_err();
        assert_eq!(
            e,
            VmLowerError::ShareUnderHiddenMask {
                path: "/tmp/hull-runs/ID/spill".into(),
                hidden: "/tmp/hull-runs".into(),
                outer: "/tmp".into(),
            }
        );
        // With the runs dir elsewhere, /tmp is a plain read-only share.
        let mut v = vars();
        v.runs = "/var/hull-runs".into();
        v.tmp = "/var/hull-runs/ID/tmp".into();
        v.spill = "/var/hull-runs/ID/spill".into();
        let pf = PolicyFile::parse("p", "version = 1\n[fs]\nread = [\"/tmp\"]\n").unwrap();
        let fs = host()
            .dir("/var/hull-runs/ID/tmp")
            .dir("/var/hull-runs/ID/spill");
        let p = lower(&resolve(&pf, &v).unwrap(), &fs).unwrap();
        let t = p
            .shares
            .iter()
            .find(|s| s.host_path == Path::new("/tmp"))
            .unwrap();
        assert!(t.readonly);
        assert!(t.masks.is_empty());
    }
}
