//! The elevated helper's plan: ACEs on paths the user cannot change (the
//! Windows and Program Files directories, ProgramData), applied once by
//! `hull setup --elevated PLAN` in a separate, elevated process, never by the
//! harness process itself.
//!
//! The harness writes the plan file (JSON) from the lowered plan; the helper
//! reads it with a size cap, validates every entry against fixed rules and
//! applies it. The rules are what keep an elevated helper from being a
//! general "grant anything" tool if the file were tampered with:
//! - only paths under the system directories (everything else the user
//!   applies unelevated);
//! - only hull's own trustees (`hull.ws.*` packages, `hull-ws-*` and
//!   `hull-run-*` capabilities), never a well-known group such as Everyone;
//! - allow ACEs only read or read+execute, except modify under ProgramData;
//!   deny ACEs of any kind; never on a system directory itself or a drive root;
//! - at most [`MAX_ENTRIES`] entries, at most [`MAX_PLAN_BYTES`] bytes.
//!
//! What this does not do: it cannot tell whether the user meant the grant;
//! the helper prints the validated plan before applying it, and Windows' UAC
//! prompt is the user's confirmation.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::policy::lower::appcontainer::{
    AclPlan, Deny, Inherit, Rights, SystemDirs, Trustee, WinPath,
};
use crate::policy::lower::restricted::RestrictedPlan;

pub const MAX_PLAN_BYTES: usize = 1 << 20;
pub const MAX_ENTRIES: usize = 256;
pub const PLAN_VERSION: u32 = 1;

/// Errors reading, validating or applying an elevated plan.
#[derive(Debug, thiserror::Error)]
pub enum ElevatedError {
    #[error("elevated plan {path}: {message}")]
    Read { path: String, message: String },
    #[error("elevated plan entry {index} ({path}): {message}")]
    Invalid {
        index: usize,
        path: String,
        message: String,
    },
    #[error("elevated plan: {0}")]
    Plan(String),
    #[error("elevated plan entry {index} ({path}): applying failed: {message}")]
    Apply {
        index: usize,
        path: String,
        message: String,
    },
    #[error("hull setup --elevated needs Windows")]
    WrongOs,
}

/// What one ACE does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "rights")]
pub enum AceKind {
    Allow(Rights),
    Deny(Deny),
}

/// One ACE for the helper to apply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ElevatedAce {
    pub path: String,
    pub trustee: Trustee,
    pub ace: AceKind,
    pub inherit: Inherit,
    pub reason: String,
}

/// The plan file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ElevatedPlan {
    pub version: u32,
    pub entries: Vec<ElevatedAce>,
}

impl ElevatedPlan {
    /// The entries of an AppContainer plan that need elevation.
    pub fn from_acl_plan(plan: &AclPlan) -> ElevatedPlan {
        let mut entries = Vec::new();
        for e in plan
            .entries
            .iter()
            .filter(|e| plan.needs_elevation.contains(&e.path))
        {
            entries.push(ElevatedAce {
                path: e.path.to_string(),
                trustee: e.trustee.clone(),
                ace: AceKind::Allow(e.rights),
                inherit: e.inherit,
                reason: e.reason.clone(),
            });
        }
        for d in plan
            .denies
            .iter()
            .filter(|d| plan.needs_elevation.contains(&d.path))
        {
            entries.push(ElevatedAce {
                path: d.path.to_string(),
                trustee: d.trustee.clone(),
                ace: AceKind::Deny(d.deny),
                inherit: d.inherit,
                reason: d.reason.clone(),
            });
        }
        ElevatedPlan {
            version: PLAN_VERSION,
            entries,
        }
    }

    /// The entries of a restricted plan that need elevation (ACEs only:
    /// labels on system paths are not offered; tier 1 refuses such policies).
    pub fn from_restricted_plan(plan: &RestrictedPlan) -> ElevatedPlan {
        let mut entries = Vec::new();
        for e in plan
            .entries
            .iter()
            .filter(|e| plan.needs_elevation.contains(&e.path))
        {
            entries.push(ElevatedAce {
                path: e.path.to_string(),
                trustee: e.trustee.clone(),
                ace: AceKind::Allow(e.rights),
                inherit: e.inherit,
                reason: e.reason.clone(),
            });
        }
        for d in plan
            .denies
            .iter()
            .filter(|d| plan.needs_elevation.contains(&d.path))
        {
            entries.push(ElevatedAce {
                path: d.path.to_string(),
                trustee: d.trustee.clone(),
                ace: AceKind::Deny(d.deny),
                inherit: d.inherit,
                reason: d.reason.clone(),
            });
        }
        ElevatedPlan {
            version: PLAN_VERSION,
            entries,
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

fn hull_trustee(t: &Trustee) -> bool {
    let id_ok = |id: &str| {
        !id.is_empty()
            && id.len() <= 64
            && id
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    };
    match t {
        Trustee::Package(n) => n.strip_prefix("hull.ws.").is_some_and(id_ok),
        Trustee::Capability(n) => n
            .strip_prefix("hull-ws-")
            .or_else(|| n.strip_prefix("hull-run-"))
            .is_some_and(id_ok),
    }
}

/// Parses and validates plan text; every rule in the module docs.
pub fn validate(text: &str, system: &SystemDirs) -> Result<ElevatedPlan, ElevatedError> {
    if text.len() > MAX_PLAN_BYTES {
        return Err(ElevatedError::Plan(format!(
            "{} bytes, more than {MAX_PLAN_BYTES}",
            text.len()
        )));
    }
    let plan: ElevatedPlan =
        serde_json::from_str(text).map_err(|e| ElevatedError::Plan(e.to_string()))?;
    if plan.version != PLAN_VERSION {
        return Err(ElevatedError::Plan(format!(
            "version {} (this hull reads {PLAN_VERSION})",
            plan.version
        )));
    }
    if plan.entries.len() > MAX_ENTRIES {
        return Err(ElevatedError::Plan(format!(
            "{} entries, more than {MAX_ENTRIES}",
            plan.entries.len()
        )));
    }
    let program_data = WinPath::parse_str("C:\\ProgramData");
    for (index, e) in plan.entries.iter().enumerate() {
        let bad = |message: &str| ElevatedError::Invalid {
            index,
            path: e.path.clone(),
            message: message.to_string(),
        };
        let p = WinPath::parse_str(&e.path).ok_or_else(|| bad("not an absolute Windows path"))?;
        if p.as_str() != e.path {
            return Err(bad(
                "not in normal form (backslashes, no trailing separator)",
            ));
        }
        if !system.contains(&p) {
            return Err(bad(
                "not under a system directory: the user applies it, not the helper",
            ));
        }
        if p.parent().is_none() || system.dirs.contains(&p) {
            return Err(bad("a drive root or a system directory itself"));
        }
        if !hull_trustee(&e.trustee) {
            return Err(bad(
                "trustee is not one of hull's AppContainer or capability names",
            ));
        }
        if let AceKind::Allow(Rights::M) = e.ace {
            let under_program_data = system
                .dirs
                .iter()
                .filter(|d| d.file_name().eq_ignore_ascii_case("ProgramData"))
                .chain(program_data.iter())
                .any(|d| p.starts_with(d));
            if !under_program_data {
                return Err(bad("modify is only granted under ProgramData"));
            }
        }
        if e.reason.len() > 200 || e.reason.contains(['\n', '\r']) {
            return Err(bad("reason too long or not one line"));
        }
    }
    Ok(plan)
}

/// Reads a plan file with the size cap and validates it.
pub fn read(path: &Path, system: &SystemDirs) -> Result<ElevatedPlan, ElevatedError> {
    use std::io::Read;
    let err = |message: String| ElevatedError::Read {
        path: path.display().to_string(),
        message,
    };
    let f = std::fs::File::open(path).map_err(|e| err(e.to_string()))?;
    let mut text = String::new();
    f.take(MAX_PLAN_BYTES as u64 + 1)
        .read_to_string(&mut text)
        .map_err(|e| err(e.to_string()))?;
    validate(&text, system)
}

/// Applies a validated plan (the helper, elevated). Stops at the first
/// failure; ACEs already applied stay (applying again is idempotent).
pub fn apply(plan: &ElevatedPlan) -> Result<usize, ElevatedError> {
    #[cfg(windows)]
    {
        super::sys::apply_elevated(plan)
    }
    #[cfg(not(windows))]
    {
        let _ = plan;
        Err(ElevatedError::WrongOs)
    }
}

/// `hull setup --elevated PLAN`: read, validate, show and apply a plan.
pub fn setup_main(path: &Path) -> Result<i32, ElevatedError> {
    #[cfg(windows)]
    let system = super::sys::system_dirs();
    #[cfg(not(windows))]
    let system = SystemDirs::default();
    #[cfg(not(windows))]
    {
        let _ = (path, system);
        Err(ElevatedError::WrongOs)
    }
    #[cfg(windows)]
    {
        let plan = read(path, &system)?;
        for e in &plan.entries {
            println!(
                "{:?} {:?} {}  {}  # {}",
                e.ace,
                e.inherit,
                e.path,
                e.trustee.label(),
                e.reason
            );
        }
        let n = apply(&plan)?;
        println!("hull setup: applied {n} ACE(s) from {}", path.display());
        Ok(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::lower::appcontainer;
    use crate::policy::lower::testing::windows_policy;
    use crate::policy::{Access, Grant, GrantOrigin};

    fn plan_with_git() -> ElevatedPlan {
        let mut pol = windows_policy("default");
        pol.grants.push(Grant {
            path: "C:\\Program Files\\Git".into(),
            access: Access::ReadExec,
            origin: GrantOrigin::Policy,
        });
        ElevatedPlan::from_acl_plan(&appcontainer::lower(&pol, "ws1").unwrap())
    }

    #[test]
    fn the_plan_holds_only_the_system_entries_and_validates() {
        let plan = plan_with_git();
        assert_eq!(plan.entries.len(), 1);
        assert_eq!(plan.entries[0].path, "C:\\Program Files\\Git");
        assert_eq!(plan.entries[0].ace, AceKind::Allow(Rights::RX));
        let back = validate(&plan.to_json(), &SystemDirs::default()).unwrap();
        assert_eq!(back, plan);
    }

    fn invalid(edit: impl Fn(&mut ElevatedAce)) -> String {
        let mut plan = plan_with_git();
        edit(&mut plan.entries[0]);
        validate(&plan.to_json(), &SystemDirs::default())
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn tampered_plans_are_refused() {
        assert!(invalid(|e| e.path = "C:\\Users\\u\\proj".into()).contains("not under a system"));
        assert!(invalid(|e| e.path = "C:\\Windows".into()).contains("system directory itself"));
        assert!(invalid(|e| e.path = "C:\\Program Files\\Git\\".into()).contains("normal form"));
        assert!(invalid(|e| e.path = "/usr".into()).contains("absolute Windows path"));
        assert!(
            invalid(|e| e.trustee = Trustee::Package("Microsoft.Edge".into())).contains("trustee")
        );
        assert!(
            invalid(|e| e.trustee = Trustee::Capability("internetClient".into()))
                .contains("trustee")
        );
        assert!(invalid(|e| e.ace = AceKind::Allow(Rights::M)).contains("modify"));
        assert!(invalid(|e| e.reason = "a\nb".into()).contains("one line"));
        // modify under ProgramData is the one modify allowed
        let mut plan = plan_with_git();
        plan.entries[0].path = "C:\\ProgramData\\hull-cache".into();
        plan.entries[0].ace = AceKind::Allow(Rights::M);
        assert!(validate(&plan.to_json(), &SystemDirs::default()).is_ok());
        // unknown fields, wrong version, too many entries, too big
        let json = plan
            .to_json()
            .replacen("\"version\"", "\"extra\": 1, \"version\"", 1);
        assert!(validate(&json, &SystemDirs::default()).is_err());
        plan.version = 2;
        assert!(validate(&plan.to_json(), &SystemDirs::default()).is_err());
        plan.version = 1;
        plan.entries = vec![plan.entries[0].clone(); MAX_ENTRIES + 1];
        assert!(validate(&plan.to_json(), &SystemDirs::default()).is_err());
        assert!(validate(&" ".repeat(MAX_PLAN_BYTES + 1), &SystemDirs::default()).is_err());
    }

    #[test]
    fn read_caps_the_size() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("plan.json");
        std::fs::write(&p, plan_with_git().to_json()).unwrap();
        assert_eq!(read(&p, &SystemDirs::default()).unwrap(), plan_with_git());
        std::fs::write(&p, vec![b' '; MAX_PLAN_BYTES + 10]).unwrap();
        assert!(read(&p, &SystemDirs::default()).is_err());
    }

    #[cfg(not(windows))]
    #[test]
    fn apply_needs_windows() {
        assert!(matches!(
            apply(&plan_with_git()),
            Err(ElevatedError::WrongOs)
        ));
    }
}
