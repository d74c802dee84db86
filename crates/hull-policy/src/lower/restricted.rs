//! Restricted-token lowering (Windows tier 1): the resolved policy as a token
//! plan and the ACEs and integrity labels that go with it.
//!
//! The command runs with a restricted copy of the user's token: every
//! privilege but `SeChangeNotifyPrivilege` removed (`DISABLE_MAX_PRIVILEGE`),
//! as a limited user (`LUA_TOKEN`), `WRITE_RESTRICTED` with restricting SIDs
//! that are only the workspace's capability SID, this instance's capability
//! SID and the logon SID, at Low integrity. A write then needs two things the
//! user's own files do not have: an ACE for one of those SIDs (the second,
//! restricted access check) and a label no higher than Low (no write up).
//! The plan gives both to the writable roots (workspace capability) and the
//! instance tmp (instance capability, so two instances never write each
//! other's run dir); protected paths inside writable roots get a deny-write
//! ACE for the capability SID and an explicit Medium label (hidden ones also
//! no-read-up, so a Low process cannot read `.hull/`).
//!
//! What this does not do, in plain words: reads are not confidential. A Low
//! process reads every file a Medium one can, except the hidden paths the
//! plan labels no-read-up; home directories, other instances' tmp and spill,
//! and the rest of the disk stay readable. There is no network control at
//! all. Labelling a writable root Low also lets any other Low-integrity
//! process of the same user write it. Tier 2 (`appcontainer`) is the
//! Windows default for these reasons.

use std::fmt::Write as _;

use serde::Serialize;

use super::appcontainer::{
    check_id, instance_id, render_common, render_job, AclEntry, Deny, DenyEntry, Ignored, Inherit,
    JobPlan, Rights, StripEntry, SystemDirs, Trustee, WinLowerError, WinPath, WinView,
};
use crate::{Access, GrantOrigin, Policy, Protection};

/// A SID the restricted token names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "name")]
pub enum TokenSid {
    /// A capability SID derived from a name.
    Capability(String),
    /// The logon session SID of the user's token.
    Logon,
    /// The user's own SID.
    User,
    /// `NT AUTHORITY\SYSTEM`.
    System,
}

impl TokenSid {
    fn label(&self) -> String {
        match self {
            TokenSid::Capability(n) => format!("capability:{n}"),
            TokenSid::Logon => "logon".into(),
            TokenSid::User => "user".into(),
            TokenSid::System => "system".into(),
        }
    }
}

/// Integrity levels a label can set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Integrity {
    /// `S-1-16-4096`.
    Low,
    /// `S-1-16-8192`.
    Medium,
}

/// A mandatory label policy (`SYSTEM_MANDATORY_LABEL_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LabelPolicy {
    pub no_write_up: bool,
    pub no_read_up: bool,
    pub no_execute_up: bool,
}

impl LabelPolicy {
    pub const NW: LabelPolicy = LabelPolicy {
        no_write_up: true,
        no_read_up: false,
        no_execute_up: false,
    };
    pub const NR_NW_NX: LabelPolicy = LabelPolicy {
        no_write_up: true,
        no_read_up: true,
        no_execute_up: true,
    };

    /// The `SYSTEM_MANDATORY_LABEL_*` bits.
    pub fn mask(self) -> u32 {
        (self.no_write_up as u32)
            | ((self.no_read_up as u32) << 1)
            | ((self.no_execute_up as u32) << 2)
    }

    fn as_str(self) -> String {
        let mut s = String::new();
        if self.no_read_up {
            s.push_str("NR");
        }
        if self.no_write_up {
            s.push_str("NW");
        }
        if self.no_execute_up {
            s.push_str("NX");
        }
        s
    }
}

/// A mandatory label to set on a path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LabelEntry {
    pub path: WinPath,
    pub level: Integrity,
    pub policy: LabelPolicy,
    pub inherit: Inherit,
    pub reason: String,
}

/// The token the command runs with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TokenPlan {
    pub disable_max_privilege: bool,
    pub lua_token: bool,
    pub write_restricted: bool,
    pub restricting_sids: Vec<TokenSid>,
    pub integrity: Integrity,
    /// Who gets `GENERIC_ALL` on objects the command creates (pipes, events):
    /// it must include a restricting SID or the command cannot write its own.
    pub default_dacl: Vec<TokenSid>,
}

/// The tier-1 plan for one workspace and one instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RestrictedPlan {
    pub capability_sid_name: String,
    pub instance_capability: String,
    pub token: TokenPlan,
    pub entries: Vec<AclEntry>,
    pub denies: Vec<DenyEntry>,
    pub labels: Vec<LabelEntry>,
    pub placeholders: Vec<WinPath>,
    pub needs_elevation: Vec<WinPath>,
    pub ignored: Vec<Ignored>,
    /// What this tier cannot enforce for this policy, in plain words.
    pub not_enforced: Vec<String>,
    pub job: JobPlan,
    pub private_desktop: bool,
}

/// The capability name of a workspace (tier 1).
pub fn capability_name(workspace_id: &str) -> Result<String, WinLowerError> {
    check_id(workspace_id)?;
    Ok(format!("hull-ws-{workspace_id}"))
}

/// Lowers with the stock system directories.
pub fn lower(policy: &Policy, workspace_id: &str) -> Result<RestrictedPlan, WinLowerError> {
    lower_with(policy, workspace_id, &SystemDirs::default())
}

/// Lowers a resolved policy to the restricted-token plan.
pub fn lower_with(
    policy: &Policy,
    workspace_id: &str,
    system: &SystemDirs,
) -> Result<RestrictedPlan, WinLowerError> {
    let ws = capability_name(workspace_id)?;
    let inst = format!("hull-run-{}", instance_id(policy)?);
    let ws_t = Trustee::Capability(ws.clone());
    let inst_t = Trustee::Capability(inst.clone());
    let view = WinView::of(policy);
    let mut plan = RestrictedPlan {
        capability_sid_name: ws.clone(),
        instance_capability: inst.clone(),
        token: TokenPlan {
            disable_max_privilege: true,
            lua_token: true,
            write_restricted: true,
            restricting_sids: vec![
                TokenSid::Capability(ws.clone()),
                TokenSid::Capability(inst.clone()),
                TokenSid::Logon,
            ],
            integrity: Integrity::Low,
            default_dacl: vec![TokenSid::User, TokenSid::System, TokenSid::Capability(inst)],
        },
        entries: Vec::new(),
        denies: Vec::new(),
        labels: Vec::new(),
        placeholders: Vec::new(),
        needs_elevation: Vec::new(),
        ignored: view.ignored.clone(),
        not_enforced: vec![
            "reads: a Low-integrity process reads every file the user can, except the paths labelled no-read-up below".into(),
            "network: no control at all at tier 1".into(),
        ],
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
        if *access != Access::ReadWrite {
            // Reads need no ACE at tier 1; the Medium label keeps it unwritable.
            continue;
        }
        let (trustee, reason) = match origin {
            GrantOrigin::InstanceTmp => (inst_t.clone(), "instance tmp".to_string()),
            _ => (ws_t.clone(), "policy read_write".to_string()),
        };
        plan.entries.push(AclEntry {
            path: path.clone(),
            trustee: trustee.clone(),
            rights: Rights::M,
            inherit: Inherit::Tree,
            reason: reason.clone(),
        });
        plan.labels.push(LabelEntry {
            path: path.clone(),
            level: Integrity::Low,
            policy: LabelPolicy::NW,
            inherit: Inherit::Tree,
            reason,
        });
        if *origin == GrantOrigin::Policy {
            plan.denies.push(DenyEntry {
                path: path.clone(),
                trustee,
                deny: Deny::Delete,
                inherit: Inherit::This,
                reason: "writable root: not renamable or removable".into(),
            });
        }
    }
    let roots: Vec<WinPath> = view.writable_roots().into_iter().cloned().collect();
    for ((path, protection, why), guards) in view.guarded() {
        plan.placeholders.push(path.clone());
        plan.denies.push(DenyEntry {
            path: path.clone(),
            trustee: ws_t.clone(),
            deny: match protection {
                Protection::Hidden => Deny::All,
                Protection::ReadOnly => Deny::Write,
            },
            inherit: Inherit::Tree,
            reason: why.clone(),
        });
        plan.labels.push(LabelEntry {
            path: path.clone(),
            level: Integrity::Medium,
            policy: match protection {
                Protection::Hidden => LabelPolicy::NR_NW_NX,
                Protection::ReadOnly => LabelPolicy::NW,
            },
            inherit: Inherit::Tree,
            reason: why.clone(),
        });
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
                trustee: ws_t.clone(),
                deny: Deny::Delete,
                inherit: Inherit::This,
                reason: format!("holds a protected path ({why}): not renamable"),
            });
        }
    }
    // Hidden paths outside the writable roots: a no-read-up label where the
    // path exists (applying skips missing ones: the command cannot create
    // them there). The runs root cannot be labelled so: this instance's own
    // spill below it must stay readable, and a label is not per instance.
    let runs = WinPath::parse(&policy.vars.runs);
    for (path, protection, why) in &view.protects {
        if *protection != Protection::Hidden || plan.labels.iter().any(|l| &l.path == path) {
            continue;
        }
        if runs.as_ref() == Some(path) {
            plan.not_enforced.push(format!(
                "{path} ({why}): other instances' tmp and spill are readable at tier 1"
            ));
            continue;
        }
        plan.labels.push(LabelEntry {
            path: path.clone(),
            level: Integrity::Medium,
            policy: LabelPolicy::NR_NW_NX,
            inherit: Inherit::Tree,
            reason: format!("{why}, when it exists"),
        });
    }
    plan.placeholders.sort();
    plan.placeholders.dedup();
    let mut elev: Vec<WinPath> = plan
        .entries
        .iter()
        .map(|e| &e.path)
        .chain(plan.denies.iter().map(|d| &d.path))
        .chain(plan.labels.iter().map(|l| &l.path))
        .filter(|p| system.contains(p))
        .cloned()
        .collect();
    elev.sort();
    elev.dedup();
    plan.needs_elevation = elev;
    Ok(plan)
}

impl RestrictedPlan {
    /// Text for `hull policy explain --tier restricted` and the golden files.
    pub fn render(&self) -> String {
        let mut o = String::new();
        let t = &self.token;
        let _ = writeln!(o, "workspace capability: {}", self.capability_sid_name);
        let _ = writeln!(o, "instance capability: {}", self.instance_capability);
        let mut flags = Vec::new();
        if t.disable_max_privilege {
            flags.push("DISABLE_MAX_PRIVILEGE");
        }
        if t.lua_token {
            flags.push("LUA_TOKEN");
        }
        if t.write_restricted {
            flags.push("WRITE_RESTRICTED");
        }
        let _ = writeln!(o, "token: {} integrity={:?}", flags.join("|"), t.integrity);
        let sids = |v: &[TokenSid]| v.iter().map(TokenSid::label).collect::<Vec<_>>().join(", ");
        let _ = writeln!(o, "restricting sids: {}", sids(&t.restricting_sids));
        let _ = writeln!(o, "default dacl (GENERIC_ALL): {}", sids(&t.default_dacl));
        let strip: [StripEntry; 0] = [];
        render_common(
            &mut o,
            &self.entries,
            &self.denies,
            &strip,
            &self.placeholders,
            &self.needs_elevation,
            &self.ignored,
        );
        o.push_str("labels:\n");
        for l in &self.labels {
            let _ = writeln!(
                o,
                "  {:?} {:<6} {:<9} {}  # {}",
                l.level,
                l.policy.as_str(),
                l.inherit.as_str(),
                l.path,
                l.reason
            );
        }
        o.push_str("not enforced:\n");
        for n in &self.not_enforced {
            let _ = writeln!(o, "  {n}");
        }
        render_job(&mut o, &self.job, self.private_desktop);
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lower::testing::windows_policy;
    use crate::profiles;

    #[test]
    fn golden_plans_for_shipped_policies() {
        for (name, _) in profiles::PROFILES {
            let plan = lower(&windows_policy(name), "ws1").unwrap();
            crate::lower::testing::golden(&format!("restricted-{name}.txt"), &plan.render());
        }
    }

    #[test]
    fn token_is_write_restricted_low_without_the_user_sid() {
        let plan = lower(&windows_policy("default"), "ws1").unwrap();
        let t = &plan.token;
        assert!(t.disable_max_privilege && t.lua_token && t.write_restricted);
        assert_eq!(t.integrity, Integrity::Low);
        // the user SID as a restricting SID would pass every write the user may do
        assert!(!t.restricting_sids.contains(&TokenSid::User));
        assert!(t
            .restricting_sids
            .contains(&TokenSid::Capability("hull-ws-ws1".into())));
        assert!(t
            .restricting_sids
            .contains(&TokenSid::Capability("hull-run-id1".into())));
        // objects the command creates are writable by a restricting SID
        assert!(t
            .default_dacl
            .iter()
            .any(|s| t.restricting_sids.contains(s)));
    }

    #[test]
    fn writable_roots_get_ace_and_low_label_protected_paths_medium() {
        let plan = lower(&windows_policy("default"), "ws1").unwrap();
        let proj = WinPath::parse_str("C:\\Users\\u\\proj").unwrap();
        assert!(plan
            .entries
            .iter()
            .any(|e| e.path == proj && e.rights == Rights::M));
        assert!(plan
            .labels
            .iter()
            .any(|l| l.path == proj && l.level == Integrity::Low && l.policy == LabelPolicy::NW));
        let hull = WinPath::parse_str("C:\\Users\\u\\proj\\.hull").unwrap();
        let l = plan.labels.iter().find(|l| l.path == hull).unwrap();
        assert_eq!(
            (l.level, l.policy),
            (Integrity::Medium, LabelPolicy::NR_NW_NX)
        );
        assert_eq!(LabelPolicy::NR_NW_NX.mask(), 7);
        let git = WinPath::parse_str("C:\\Users\\u\\proj\\.git").unwrap();
        assert!(plan
            .denies
            .iter()
            .any(|d| d.path == git && d.deny == Deny::Write));
        // read-only grants need no ACE at tier 1 (and get none)
        assert!(!plan.entries.iter().any(|e| e.rights != Rights::M));
        // the instance tmp is the instance's, not the workspace's
        let tmp = plan
            .entries
            .iter()
            .find(|e| e.reason == "instance tmp")
            .unwrap();
        assert_eq!(tmp.trustee, Trustee::Capability("hull-run-id1".into()));
    }

    #[test]
    fn what_tier_one_cannot_do_is_said() {
        let plan = lower(&windows_policy("readonly"), "ws1").unwrap();
        let text = plan.not_enforced.join("\n");
        assert!(text.contains("reads"), "{text}");
        assert!(text.contains("network: no control"), "{text}");
        assert!(
            text.contains("hull-runs"),
            "the runs root is readable: {text}"
        );
    }
}
