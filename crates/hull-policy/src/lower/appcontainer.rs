//! AppContainer lowering (Windows tier 2): the resolved policy as an ACL plan
//! for one workspace's AppContainer profile.
//!
//! An AppContainer process is refused every file its package SID (or one of
//! its capability SIDs) is not granted by an ACE, so the plan is the list of
//! ACEs to add: read (`R`), read+execute (`RX`) or modify (`M`) for the
//! workspace's package SID on the policy's grants; the instance's own `tmp/`
//! (modify) and `spill/` (read) for a per-instance capability SID, so two
//! instances of one workspace never reach each other's run dir; explicit deny
//! ACEs on the protected paths inside grants (hidden: everything; read-only:
//! every write, delete and ACL change); deny-delete on each writable root and
//! on the directories between it and a protected path, so a protection cannot
//! be renamed away with its parent (modify without `FILE_DELETE_CHILD` leaves
//! deletion of an entry to the entry's own ACL). Hidden paths (`.hull/` above
//! all) are also stripped of any allow ACE the package SID has there.
//!
//! No capability is requested, whatever the policy's network mode: never
//! `internetClient`, which opens every host. `net.mode = "allowlist"` needs
//! what only an administrator can set up ([`NETWORK_ALLOWLIST`]), so the
//! plan says so and the run is refused until hull's elevated helper does it.
//!
//! What this does not do: it cannot hide what every AppContainer can read
//! (the `ALL APPLICATION PACKAGES` ACEs on the Windows and Program Files
//! directories); network isolation of AppContainers is enforced by Windows
//! Filtering Platform filters that hull does not install (that needs admin):
//! without them the missing capability is the only barrier. ACEs attach to
//! objects, not names: a protected path that does not exist is covered by an
//! empty placeholder directory created before the run (as on Linux).
//!
//! The plan is pure: paths are handled as Windows path text ([`WinPath`]), the
//! same on every host, so it is golden-tested on Linux.

use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::{Access, GrantOrigin, Policy, Protection};

/// Errors of Windows plan lowering.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WinLowerError {
    #[error("workspace id {0:?} must be 1 to 32 characters of a-z, 0-9 and -")]
    BadWorkspaceId(String),
    #[error("the instance dir of tmp {0} is not a Windows path named by an instance id")]
    BadInstanceDir(String),
}

/// A Windows path as text: `C:\dir\file` or `\\server\share\dir`.
/// Normalized: backslashes, no trailing separator, no `.` or `..`. Compared
/// case-insensitively, component by component, as NTFS does.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct WinPath(String);

impl WinPath {
    /// Parses a policy path; `None` when it is not an absolute Windows path
    /// (for example `/usr` from a Linux-shaped profile).
    pub fn parse(p: &Path) -> Option<WinPath> {
        Self::parse_str(&p.to_string_lossy())
    }

    pub fn parse_str(s: &str) -> Option<WinPath> {
        let s = s.replace('/', "\\");
        let b = s.as_bytes();
        let (prefix, rest) =
            if b.len() >= 3 && b[0].is_ascii_alphabetic() && b[1] == b':' && b[2] == b'\\' {
                (format!("{}:", (b[0] as char).to_ascii_uppercase()), &s[3..])
            } else if let Some(unc) = s.strip_prefix("\\\\") {
                let mut parts = unc.splitn(3, '\\');
                let server = parts.next().filter(|x| !x.is_empty())?;
                let share = parts.next().filter(|x| !x.is_empty())?;
                (format!("\\\\{server}\\{share}"), parts.next().unwrap_or(""))
            } else {
                return None;
            };
        let mut out = prefix;
        let mut depth = 0;
        for c in rest.split('\\').filter(|c| !c.is_empty()) {
            if c == "." || c == ".." || c.contains(['<', '>', '"', '|', '?', '*', ':']) {
                return None;
            }
            out.push('\\');
            out.push_str(c);
            depth += 1;
        }
        if depth == 0 && !out.starts_with("\\\\") {
            out.push('\\');
        }
        Some(WinPath(out))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    fn components(&self) -> Vec<String> {
        self.0
            .split('\\')
            .filter(|c| !c.is_empty())
            .map(str::to_ascii_lowercase)
            .collect()
    }

    /// `self` is `other` or below it.
    pub fn starts_with(&self, other: &WinPath) -> bool {
        let (a, b) = (self.components(), other.components());
        a.len() >= b.len() && a[..b.len()] == b[..]
    }

    /// The parent directory, `None` at a drive root or share.
    pub fn parent(&self) -> Option<WinPath> {
        let comps = self.components().len();
        let min = if self.0.starts_with("\\\\") { 2 } else { 1 };
        if comps <= min {
            return None;
        }
        let i = self.0.rfind('\\')?;
        WinPath::parse_str(&self.0[..i.max(3)])
    }

    /// The last component.
    pub fn file_name(&self) -> &str {
        self.0.rsplit('\\').next().unwrap_or("")
    }
}

impl std::fmt::Display for WinPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Rights an allow ACE grants, in `icacls` terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Rights {
    /// `FILE_GENERIC_READ`.
    R,
    /// `FILE_GENERIC_READ | FILE_GENERIC_EXECUTE`.
    RX,
    /// Modify: read, write, execute, delete (not `FILE_DELETE_CHILD`, not
    /// `WRITE_DAC`, not `WRITE_OWNER`).
    M,
}

impl Rights {
    pub fn for_access(a: Access) -> Rights {
        match a {
            Access::Read => Rights::R,
            Access::ReadExec => Rights::RX,
            Access::ReadWrite => Rights::M,
        }
    }

    /// The access mask (`winnt.h` values).
    pub fn mask(self) -> u32 {
        match self {
            Rights::R => FILE_GENERIC_READ,
            Rights::RX => FILE_GENERIC_READ | FILE_GENERIC_EXECUTE,
            Rights::M => FILE_GENERIC_READ | FILE_GENERIC_WRITE | FILE_GENERIC_EXECUTE | DELETE,
        }
    }
}

/// What a deny ACE refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Deny {
    /// Every access (hidden).
    All,
    /// Every write, delete and ACL or owner change (read-only).
    Write,
    /// Deleting or renaming the object itself (a guarded directory).
    Delete,
}

impl Deny {
    pub fn mask(self) -> u32 {
        match self {
            Deny::All => FILE_ALL_ACCESS,
            Deny::Write => WRITE_MASK,
            Deny::Delete => DELETE,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Deny::All => "deny all",
            Deny::Write => "deny write",
            Deny::Delete => "deny delete",
        }
    }
}

/// Which objects an ACE applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Inherit {
    /// The object and, for a directory, everything below it: `(OI)(CI)`
    /// (applied without inheritance flags when the object is a file).
    Tree,
    /// The object only.
    This,
}

impl Inherit {
    pub fn as_str(self) -> &'static str {
        match self {
            Inherit::Tree => "(OI)(CI)",
            Inherit::This => "this only",
        }
    }
}

/// The SID an ACE names, before it is derived on Windows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "name")]
pub enum Trustee {
    /// The package SID of the AppContainer profile named so.
    Package(String),
    /// The capability SID `DeriveCapabilitySidsFromName` gives for the name.
    Capability(String),
}

impl Trustee {
    pub fn label(&self) -> String {
        match self {
            Trustee::Package(n) => format!("package:{n}"),
            Trustee::Capability(n) => format!("capability:{n}"),
        }
    }
}

/// One allow ACE.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AclEntry {
    pub path: WinPath,
    pub trustee: Trustee,
    pub rights: Rights,
    pub inherit: Inherit,
    pub reason: String,
}

/// One deny ACE.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DenyEntry {
    pub path: WinPath,
    pub trustee: Trustee,
    pub deny: Deny,
    pub inherit: Inherit,
    pub reason: String,
}

/// Allow ACEs of a trustee removed from a path (hidden paths).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StripEntry {
    pub path: WinPath,
    pub trustee: Trustee,
    pub reason: String,
}

/// A policy path with no meaning on Windows, and why it is skipped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Ignored {
    pub path: String,
    pub reason: String,
}

/// The Job Object every sandboxed tree runs in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct JobPlan {
    /// `JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE`: the tree dies with hull's handle.
    pub kill_on_close: bool,
    /// `JOB_OBJECT_LIMIT_JOB_MEMORY`, bytes.
    pub memory: Option<u64>,
    /// `JOB_OBJECT_LIMIT_ACTIVE_PROCESS`.
    pub processes: Option<u64>,
    /// `JOB_OBJECT_UILIMIT_*`: no clipboard, global atoms, foreign USER
    /// handles, desktop switch, display or system settings, or logoff.
    pub ui_restrictions: bool,
}

impl JobPlan {
    pub fn for_policy(policy: &Policy) -> JobPlan {
        JobPlan {
            kill_on_close: true,
            memory: policy.limits.memory,
            processes: policy.limits.pids,
            ui_restrictions: true,
        }
    }
}

/// Where Windows keeps what the user cannot change. Grants there need the
/// elevated helper. [`SystemDirs::default`] is the stock `C:` layout; the
/// launcher passes the host's own (`%SystemRoot%`, `%ProgramFiles%`, ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SystemDirs {
    pub dirs: Vec<WinPath>,
}

impl Default for SystemDirs {
    fn default() -> Self {
        let dirs = [
            "C:\\Windows",
            "C:\\Program Files",
            "C:\\Program Files (x86)",
            "C:\\ProgramData",
        ]
        .iter()
        .filter_map(|s| WinPath::parse_str(s))
        .collect();
        SystemDirs { dirs }
    }
}

impl SystemDirs {
    pub fn contains(&self, p: &WinPath) -> bool {
        self.dirs.iter().any(|d| p.starts_with(d))
    }
}

/// What `net.mode = "allowlist"` needs on this tier, which hull cannot do
/// without an administrator: an AppContainer reaches no loopback address
/// without a loopback exemption for its package SID, and with
/// `internetClient` it reaches every host; so the proxy is reached through
/// WFP filters keyed on the package SID (permit a connect to 127.0.0.1 on
/// the proxy's port, block every other connect and bind) plus the loopback
/// exemption, both set by an elevated helper before the run and removed
/// after it.
pub const NETWORK_ALLOWLIST: &str = "allowlist: needs hull's elevated helper (an administrator): a loopback exemption for the package SID and WFP filters keyed on it that permit a connect to 127.0.0.1 on the proxy's port and block every other connect and bind; internetClient is never requested; until hull has that helper the run is refused";

/// The AppContainer plan for one workspace and one instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AclPlan {
    /// The AppContainer profile name; its package SID is derived from it.
    pub package_sid_name: String,
    /// The per-instance capability its tmp and spill are granted to.
    pub instance_capability: String,
    /// Well-known capabilities requested: none (never `internetClient`).
    pub capabilities: Vec<String>,
    /// The policy's network mode, and what this tier needs for it.
    pub network: crate::NetMode,
    pub entries: Vec<AclEntry>,
    pub denies: Vec<DenyEntry>,
    pub strip: Vec<StripEntry>,
    /// Empty directories created before the ACEs, so a protection of a path
    /// that does not exist yet has an object to attach to.
    pub placeholders: Vec<WinPath>,
    /// Paths of entries and denies under the system directories: applied once
    /// by `hull setup --elevated`, verified (never applied) by the launcher.
    pub needs_elevation: Vec<WinPath>,
    pub ignored: Vec<Ignored>,
    pub job: JobPlan,
    pub private_desktop: bool,
}

/// The AppContainer profile name for a workspace.
pub fn container_name(workspace_id: &str) -> Result<String, WinLowerError> {
    check_id(workspace_id)?;
    Ok(format!("hull.ws.{workspace_id}"))
}

/// A workspace id from a project path: 16 hex digits of SHA-256 of the
/// lower-cased path, so one project always maps to one profile.
pub fn workspace_id(project: &str) -> String {
    use sha2::Digest;
    let h = sha2::Sha256::digest(project.to_lowercase().as_bytes());
    h.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

pub fn check_id(id: &str) -> Result<(), WinLowerError> {
    let ok = !id.is_empty()
        && id.len() <= 32
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(WinLowerError::BadWorkspaceId(id.to_string()))
    }
}

/// The instance id: the name of the run dir holding `tmp`.
pub fn instance_id(policy: &Policy) -> Result<String, WinLowerError> {
    let bad = || WinLowerError::BadInstanceDir(policy.vars.tmp.to_string_lossy().into_owned());
    let tmp = WinPath::parse(&policy.vars.tmp).ok_or_else(bad)?;
    let id = tmp
        .parent()
        .ok_or_else(bad)?
        .file_name()
        .to_ascii_lowercase();
    check_id(&id).map_err(|_| bad())?;
    Ok(id)
}

/// A protected Windows path, how, and why.
pub type Protected = (WinPath, Protection, String);

/// The grants and protections of a policy as Windows paths, with the
/// non-Windows ones set aside. Shared by both Windows tiers.
#[derive(Debug, Clone)]
pub struct WinView {
    pub grants: Vec<(WinPath, Access, GrantOrigin)>,
    pub protects: Vec<Protected>,
    pub ignored: Vec<Ignored>,
}

impl WinView {
    pub fn of(policy: &Policy) -> WinView {
        let mut v = WinView {
            grants: Vec::new(),
            protects: Vec::new(),
            ignored: Vec::new(),
        };
        for g in &policy.grants {
            match WinPath::parse(&g.path) {
                Some(p) => v.grants.push((p, g.access, g.origin.clone())),
                None => v.ignored.push(Ignored {
                    path: g.path.to_string_lossy().into_owned(),
                    reason: format!("{} grant: not a Windows path", g.access.as_str()),
                }),
            }
        }
        for p in &policy.protects {
            match WinPath::parse(&p.path) {
                Some(w) => v
                    .protects
                    .push((w, p.protection, p.reason.as_str().to_string())),
                None => v.ignored.push(Ignored {
                    path: p.path.to_string_lossy().into_owned(),
                    reason: format!("{}: not a Windows path", p.reason.as_str()),
                }),
            }
        }
        v
    }

    /// Whether a policy grant lies inside a protection (the protection wins).
    pub fn refused(&self, path: &WinPath, origin: &GrantOrigin) -> Option<&Protected> {
        if *origin != GrantOrigin::Policy {
            return None;
        }
        self.protects.iter().find(|(p, _, _)| path.starts_with(p))
    }

    /// Writable roots (policy grants not refused, and the instance tmp).
    pub fn writable_roots(&self) -> Vec<&WinPath> {
        self.grants
            .iter()
            .filter(|(p, a, o)| *a == Access::ReadWrite && self.refused(p, o).is_none())
            .map(|(p, _, _)| p)
            .collect()
    }

    /// Each protection inside a writable root, with the directories from its
    /// parent up to that root (the guards).
    pub fn guarded(&self) -> Vec<(&Protected, Vec<WinPath>)> {
        let roots = self.writable_roots();
        let mut out = Vec::new();
        for pr in &self.protects {
            let inside: Vec<&&WinPath> = roots.iter().filter(|r| pr.0.starts_with(r)).collect();
            if inside.is_empty() {
                continue;
            }
            let mut guards = Vec::new();
            let mut cur = pr.0.parent();
            while let Some(d) = cur {
                if !inside.iter().any(|r| d.starts_with(r)) {
                    break;
                }
                cur = d.parent();
                guards.push(d);
            }
            out.push((pr, guards));
        }
        out
    }
}

/// Lowers a resolved policy to the AppContainer plan of workspace
/// `workspace_id`, with the stock system directories.
pub fn lower(policy: &Policy, workspace_id: &str) -> Result<AclPlan, WinLowerError> {
    lower_with(policy, workspace_id, &SystemDirs::default())
}

/// [`lower`] with the host's system directories.
pub fn lower_with(
    policy: &Policy,
    workspace_id: &str,
    system: &SystemDirs,
) -> Result<AclPlan, WinLowerError> {
    let name = container_name(workspace_id)?;
    let inst = format!("hull-run-{}", instance_id(policy)?);
    let pkg = Trustee::Package(name.clone());
    let cap = Trustee::Capability(inst.clone());
    let view = WinView::of(policy);
    let mut plan = AclPlan {
        package_sid_name: name,
        instance_capability: inst,
        capabilities: Vec::new(),
        network: policy.net.mode,
        entries: Vec::new(),
        denies: Vec::new(),
        strip: Vec::new(),
        placeholders: Vec::new(),
        needs_elevation: Vec::new(),
        ignored: view.ignored.clone(),
        job: JobPlan::for_policy(policy),
        private_desktop: true,
    };
    for (path, access, origin) in &view.grants {
        if let Some((p, _, why)) = view.refused(path, origin) {
            plan.ignored.push(Ignored {
                path: path.to_string(),
                reason: format!(
                    "{} grant inside protected {p} ({why}): refused",
                    access.as_str()
                ),
            });
            continue;
        }
        let (trustee, reason) = match origin {
            GrantOrigin::Policy => (pkg.clone(), format!("policy {}", access.as_str())),
            GrantOrigin::InstanceTmp => (cap.clone(), "instance tmp".to_string()),
            GrantOrigin::InstanceSpill => (cap.clone(), "instance spill, read-only".to_string()),
            GrantOrigin::ChangeSet => (
                cap.clone(),
                "the change set's upper directory (--cow), read-write".to_string(),
            ),
            GrantOrigin::Agent => (cap.clone(), "hull's agent, read and execute".to_string()),
        };
        plan.entries.push(AclEntry {
            path: path.clone(),
            trustee,
            rights: Rights::for_access(*access),
            inherit: Inherit::Tree,
            reason,
        });
    }
    let roots: Vec<WinPath> = view.writable_roots().into_iter().cloned().collect();
    for root in &roots {
        let trustee = if plan
            .entries
            .iter()
            .any(|e| &e.path == root && matches!(e.trustee, Trustee::Capability(_)))
        {
            continue; // the instance tmp: nothing inside it is protected
        } else {
            pkg.clone()
        };
        plan.denies.push(DenyEntry {
            path: root.clone(),
            trustee,
            deny: Deny::Delete,
            inherit: Inherit::This,
            reason: "writable root: not renamable or removable".into(),
        });
    }
    for ((path, protection, why), guards) in view.guarded() {
        let deny = match protection {
            Protection::Hidden => Deny::All,
            Protection::ReadOnly => Deny::Write,
        };
        plan.placeholders.push(path.clone());
        plan.denies.push(DenyEntry {
            path: path.clone(),
            trustee: pkg.clone(),
            deny,
            inherit: Inherit::Tree,
            reason: why.clone(),
        });
        if *protection == Protection::Hidden {
            plan.strip.push(StripEntry {
                path: path.clone(),
                trustee: pkg.clone(),
                reason: why.clone(),
            });
        }
        for g in guards {
            if roots.contains(&g)
                || plan
                    .denies
                    .iter()
                    .any(|d| d.path == g && d.deny == Deny::Delete)
            {
                continue;
            }
            plan.denies.push(DenyEntry {
                path: g,
                trustee: pkg.clone(),
                deny: Deny::Delete,
                inherit: Inherit::This,
                reason: format!("holds a protected path ({why}): not renamable"),
            });
        }
    }
    // Hidden paths under a system directory (readable by every AppContainer)
    // need a deny ACE there too.
    for (path, protection, why) in &view.protects {
        if *protection == Protection::Hidden
            && system.contains(path)
            && !plan.denies.iter().any(|d| &d.path == path)
        {
            plan.denies.push(DenyEntry {
                path: path.clone(),
                trustee: pkg.clone(),
                deny: Deny::All,
                inherit: Inherit::Tree,
                reason: format!("{why} (readable by every AppContainer otherwise)"),
            });
        }
    }
    plan.placeholders.sort();
    plan.placeholders.dedup();
    let mut elev: Vec<WinPath> = plan
        .entries
        .iter()
        .map(|e| &e.path)
        .chain(plan.denies.iter().map(|d| &d.path))
        .filter(|p| system.contains(p))
        .cloned()
        .collect();
    elev.sort();
    elev.dedup();
    plan.needs_elevation = elev;
    Ok(plan)
}

impl AclPlan {
    /// Text for `hull policy explain --tier appcontainer` and the golden files.
    pub fn render(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(o, "appcontainer profile: {}", self.package_sid_name);
        let _ = writeln!(o, "instance capability: {}", self.instance_capability);
        let _ = writeln!(
            o,
            "capabilities: {}",
            if self.capabilities.is_empty() {
                "none (internetClient is not requested)".to_string()
            } else {
                self.capabilities.join(", ")
            }
        );
        let _ = writeln!(
            o,
            "network: {}",
            match self.network {
                crate::NetMode::None => "none (no capability, no loopback exemption)",
                crate::NetMode::Allowlist => NETWORK_ALLOWLIST,
            }
        );
        render_common(
            &mut o,
            &self.entries,
            &self.denies,
            &self.strip,
            &self.placeholders,
            &self.needs_elevation,
            &self.ignored,
        );
        render_job(&mut o, &self.job, self.private_desktop);
        o
    }
}

pub fn render_common(
    o: &mut String,
    entries: &[AclEntry],
    denies: &[DenyEntry],
    strip: &[StripEntry],
    placeholders: &[WinPath],
    elevation: &[WinPath],
    ignored: &[Ignored],
) {
    o.push_str("allow:\n");
    for e in entries {
        let _ = writeln!(
            o,
            "  {:<3} {:<9} {}  {}  # {}",
            format!("{:?}", e.rights),
            e.inherit.as_str(),
            e.path,
            e.trustee.label(),
            e.reason
        );
    }
    o.push_str("deny:\n");
    for d in denies {
        let _ = writeln!(
            o,
            "  {:<11} {:<9} {}  {}  # {}",
            d.deny.as_str(),
            d.inherit.as_str(),
            d.path,
            d.trustee.label(),
            d.reason
        );
    }
    o.push_str("strip (allow ACEs removed):\n");
    for s in strip {
        let _ = writeln!(o, "  {}  {}  # {}", s.path, s.trustee.label(), s.reason);
    }
    o.push_str("placeholders (empty dirs created when missing):\n");
    for p in placeholders {
        let _ = writeln!(o, "  {p}");
    }
    o.push_str("needs elevation (hull setup --elevated):\n");
    for p in elevation {
        let _ = writeln!(o, "  {p}");
    }
    o.push_str("ignored:\n");
    for i in ignored {
        let _ = writeln!(o, "  {}  # {}", i.path, i.reason);
    }
}

pub fn render_job(o: &mut String, j: &JobPlan, desktop: bool) {
    let opt = |v: Option<u64>| v.map_or("none".to_string(), |n| n.to_string());
    let _ = writeln!(
        o,
        "job: kill_on_close={} memory={} processes={} ui_restrictions={}",
        j.kill_on_close,
        opt(j.memory),
        opt(j.processes),
        j.ui_restrictions
    );
    let _ = writeln!(o, "private desktop: {desktop}");
}

// winnt.h access masks, spelled here so the plan is the same on every host.
pub const DELETE: u32 = 0x0001_0000;
pub const READ_CONTROL: u32 = 0x0002_0000;
pub const WRITE_DAC: u32 = 0x0004_0000;
pub const WRITE_OWNER: u32 = 0x0008_0000;
pub const SYNCHRONIZE: u32 = 0x0010_0000;
pub const FILE_READ_DATA: u32 = 0x0001;
pub const FILE_WRITE_DATA: u32 = 0x0002;
pub const FILE_APPEND_DATA: u32 = 0x0004;
pub const FILE_READ_EA: u32 = 0x0008;
pub const FILE_WRITE_EA: u32 = 0x0010;
pub const FILE_EXECUTE: u32 = 0x0020;
pub const FILE_DELETE_CHILD: u32 = 0x0040;
pub const FILE_READ_ATTRIBUTES: u32 = 0x0080;
pub const FILE_WRITE_ATTRIBUTES: u32 = 0x0100;
pub const FILE_GENERIC_READ: u32 =
    READ_CONTROL | FILE_READ_DATA | FILE_READ_ATTRIBUTES | FILE_READ_EA | SYNCHRONIZE;
pub const FILE_GENERIC_WRITE: u32 = READ_CONTROL
    | FILE_WRITE_DATA
    | FILE_WRITE_ATTRIBUTES
    | FILE_WRITE_EA
    | FILE_APPEND_DATA
    | SYNCHRONIZE;
pub const FILE_GENERIC_EXECUTE: u32 =
    READ_CONTROL | FILE_READ_ATTRIBUTES | FILE_EXECUTE | SYNCHRONIZE;
pub const FILE_ALL_ACCESS: u32 = 0x001F_01FF;
/// Everything that changes an object (its data, names below it, attributes,
/// ACL or owner), for read-only protections. Not `SYNCHRONIZE` or
/// `READ_CONTROL`, so reading stays allowed.
pub const WRITE_MASK: u32 = FILE_WRITE_DATA
    | FILE_APPEND_DATA
    | FILE_WRITE_EA
    | FILE_WRITE_ATTRIBUTES
    | FILE_DELETE_CHILD
    | DELETE
    | WRITE_DAC
    | WRITE_OWNER;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lower::testing::windows_policy;
    use crate::{profiles, Grant};

    /// `net.mode = "allowlist"` requests no capability and says what the
    /// elevated helper must set up. Golden: `appcontainer-default-allowlist.txt`.
    #[test]
    fn an_allow_list_requests_no_capability_and_names_the_helper() {
        let mut pol = windows_policy("default");
        pol.net.mode = crate::NetMode::Allowlist;
        let plan = lower(&pol, "ws1").unwrap();
        assert!(plan.capabilities.is_empty());
        let text = plan.render();
        assert!(text.contains("WFP filters keyed on it"), "{text}");
        crate::lower::testing::golden("appcontainer-default-allowlist.txt", &text);
    }

    /// `--cow` as the seeds design it: the workspace's ACE read-only (and
    /// execute) for the package, the change set's upper directory (under
    /// %LOCALAPPDATA%) modify for this run's capability only. Golden:
    /// `appcontainer-default-cow.txt`.
    #[test]
    fn a_cow_view_makes_the_workspace_read_only_and_the_upper_writable() {
        let upper = Path::new("C:\\Users\\u\\AppData\\Local\\hull\\changes\\0123456789ab\\upper");
        let plain = lower(&windows_policy("default"), "ws1").unwrap();
        let plan = lower(&windows_policy("default").cow_view(upper), "ws1").unwrap();
        let proj = WinPath::parse_str("C:\\Users\\u\\proj").unwrap();
        let up = WinPath::parse_str(upper.to_str().unwrap()).unwrap();
        let rights = |p: &AclPlan, w: &WinPath| {
            p.entries
                .iter()
                .filter(|e| e.path == *w)
                .map(|e| e.rights)
                .collect::<Vec<_>>()
        };
        assert_eq!(rights(&plain, &proj), [Rights::M], "control");
        assert!(
            !rights(&plan, &proj).contains(&Rights::M),
            "{}",
            plan.render()
        );
        assert_eq!(rights(&plan, &up), [Rights::M], "{}", plan.render());
        assert!(plan
            .entries
            .iter()
            .any(|e| e.path == up && e.trustee != Trustee::Package("hull.ws.ws1".into())));
        crate::lower::testing::golden("appcontainer-default-cow.txt", &plan.render());
    }

    #[test]
    fn golden_plans_for_shipped_policies() {
        for (name, _) in profiles::PROFILES {
            let plan = lower(&windows_policy(name), "ws1").unwrap();
            crate::lower::testing::golden(&format!("appcontainer-{name}.txt"), &plan.render());
        }
    }

    #[test]
    fn win_paths_parse_normalize_and_compare_case_insensitively() {
        let p = |s: &str| WinPath::parse_str(s);
        assert_eq!(
            p("c:/Users/u/proj/").unwrap().as_str(),
            "C:\\Users\\u\\proj"
        );
        assert_eq!(p("C:\\").unwrap().as_str(), "C:\\");
        assert!(p("/usr").is_none());
        assert!(p("C:\\a\\..\\b").is_none());
        assert!(p("C:relative").is_none());
        assert!(p("\\\\srv").is_none());
        let unc = p("\\\\srv\\share\\d").unwrap();
        assert_eq!(unc.parent().unwrap().as_str(), "\\\\srv\\share");
        assert!(unc.parent().unwrap().parent().is_none());
        let proj = p("C:\\Users\\U\\Proj").unwrap();
        assert!(p("c:\\users\\u\\proj\\.hull").unwrap().starts_with(&proj));
        assert!(!p("C:\\Users\\u\\project2").unwrap().starts_with(&proj));
        assert_eq!(proj.parent().unwrap().as_str(), "C:\\Users\\U");
        assert_eq!(p("C:\\x").unwrap().parent().unwrap().as_str(), "C:\\");
        assert!(p("C:\\").unwrap().parent().is_none());
    }

    #[test]
    fn no_network_capability_and_hull_dir_stripped() {
        let plan = lower(&windows_policy("default"), "ws1").unwrap();
        assert!(plan.capabilities.is_empty());
        assert!(!plan.render().contains("internetClient,"));
        let hull = WinPath::parse_str("C:\\Users\\u\\proj\\.hull").unwrap();
        assert!(plan.strip.iter().any(|s| s.path == hull));
        assert!(plan
            .denies
            .iter()
            .any(|d| d.path == hull && d.deny == Deny::All && d.inherit == Inherit::Tree));
        let git = WinPath::parse_str("C:\\Users\\u\\proj\\.git").unwrap();
        assert!(plan
            .denies
            .iter()
            .any(|d| d.path == git && d.deny == Deny::Write));
        assert!(plan.placeholders.contains(&hull) && plan.placeholders.contains(&git));
        // the project is modify for the package, and not removable itself
        let proj = WinPath::parse_str("C:\\Users\\u\\proj").unwrap();
        assert!(plan.entries.iter().any(|e| e.path == proj
            && e.rights == Rights::M
            && e.trustee == Trustee::Package("hull.ws.ws1".into())));
        assert!(plan
            .denies
            .iter()
            .any(|d| d.path == proj && d.deny == Deny::Delete));
    }

    #[test]
    fn instance_dirs_belong_to_the_instance_capability_not_the_workspace() {
        let plan = lower(&windows_policy("default"), "ws1").unwrap();
        assert_eq!(plan.instance_capability, "hull-run-id1");
        let cap = Trustee::Capability("hull-run-id1".into());
        let tmp = plan
            .entries
            .iter()
            .find(|e| e.reason == "instance tmp")
            .unwrap();
        assert_eq!((tmp.rights, &tmp.trustee), (Rights::M, &cap));
        let spill = plan
            .entries
            .iter()
            .find(|e| e.reason.starts_with("instance spill"))
            .unwrap();
        assert_eq!((spill.rights, &spill.trustee), (Rights::R, &cap));
        // nothing grants the runs root itself
        let runs = WinPath::parse_str("C:\\Users\\u\\AppData\\Local\\Temp\\hull-runs").unwrap();
        assert!(!plan.entries.iter().any(|e| e.path == runs));
    }

    #[test]
    fn system_paths_need_elevation_and_linux_paths_are_ignored() {
        let mut pol = windows_policy("build");
        pol.grants.push(Grant {
            path: "C:\\Program Files\\Git".into(),
            access: Access::ReadExec,
            origin: GrantOrigin::Policy,
        });
        let plan = lower(&pol, "ws1").unwrap();
        assert_eq!(
            plan.needs_elevation,
            vec![WinPath::parse_str("C:\\Program Files\\Git").unwrap()]
        );
        assert!(plan.ignored.iter().any(|i| i.path == "/usr"));
        assert!(plan.ignored.iter().any(|i| i.path == "/etc/shadow"));
        // the build policy's caches are read-only: no writable root, no
        // delete guard there; the project is the writable root
        let reg = WinPath::parse_str("C:\\Users\\u\\.cargo\\registry").unwrap();
        assert!(!plan.denies.iter().any(|d| d.path == reg));
        let proj = WinPath::parse_str("C:\\Users\\u\\proj").unwrap();
        assert!(plan
            .denies
            .iter()
            .any(|d| d.path == proj && d.deny == Deny::Delete));
    }

    #[test]
    fn workspace_ids_are_checked() {
        assert!(lower(&windows_policy("default"), "Bad Id").is_err());
        assert!(lower(&windows_policy("default"), "").is_err());
        let id = workspace_id("C:\\Users\\u\\proj");
        assert_eq!(id, workspace_id("c:\\users\\u\\PROJ"));
        assert_eq!(id.len(), 16);
        assert!(container_name(&id).unwrap().len() <= 64);
    }

    #[test]
    fn masks_match_winnt() {
        assert_eq!(FILE_GENERIC_READ, 0x0012_0089);
        assert_eq!(FILE_GENERIC_WRITE, 0x0012_0116);
        assert_eq!(FILE_GENERIC_EXECUTE, 0x0012_00A0);
        assert_eq!(Rights::M.mask(), 0x0013_01BF);
        assert_eq!(Rights::M.mask() & FILE_DELETE_CHILD, 0);
        assert_eq!(Deny::Write.mask() & FILE_READ_DATA, 0);
    }
}
