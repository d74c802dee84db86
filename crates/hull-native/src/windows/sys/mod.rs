//! The Windows calls behind the Windows tiers (compiled only for Windows).

mod process;

use std::ffi::OsString;

use crate::policy::lower::appcontainer::{AclPlan, Deny, SystemDirs, Trustee, WinPath};
use crate::policy::lower::restricted::RestrictedPlan;
use crate::probe::{Helper, Probe};
use crate::Tier;

use super::elevated::{AceKind, ElevatedError, ElevatedPlan};
use super::{command_line, desktop_name, TrampolineSpec, WinError, WinTier};
use crate::winsec::acl::{self, Change};
use crate::winsec::sid::{self, Sid};

fn os(tier: Tier, call: &'static str, what: impl Into<String>, message: String) -> WinError {
    WinError::Os {
        tier,
        call,
        what: what.into(),
        message,
    }
}

/// This host's system directories (`%SystemRoot%`, `%ProgramFiles%`, ...),
/// with the stock layout for any variable that is unset.
pub fn system_dirs() -> SystemDirs {
    let mut d = SystemDirs::default();
    for var in [
        "SystemRoot",
        "ProgramFiles",
        "ProgramFiles(x86)",
        "ProgramData",
    ] {
        if let Some(p) =
            std::env::var_os(var).and_then(|v| WinPath::parse_str(&v.to_string_lossy()))
        {
            if !d.dirs.contains(&p) {
                d.dirs.push(p);
            }
        }
    }
    d
}

pub fn probe_restricted() -> Probe {
    let tier = Tier::Restricted;
    let cap = match sid::capability_sid("hull-ws-probe") {
        Ok(c) => c,
        Err(e) => return Probe::unavailable(tier, format!("cannot derive a capability SID: {e}")),
    };
    match process::restricted_token(std::slice::from_ref(&cap), &cap) {
        Ok(_) => Probe::available(
            tier,
            "restricted Low-integrity tokens can be created",
            Vec::new(),
        ),
        Err(e) => Probe::unavailable(tier, format!("cannot create a restricted token: {e}")),
    }
}

pub fn probe_appcontainer() -> Probe {
    let tier = Tier::AppContainer;
    let made = sid::appcontainer_sid("hull.ws.probe", true);
    sid::delete_appcontainer("hull.ws.probe");
    match made {
        Ok(s) => Probe::available(
            tier,
            format!(
                "AppContainer profiles can be created (probe SID {})",
                s.to_string_sid().unwrap_or_default()
            ),
            vec![Helper {
                name: "userenv".into(),
                path: "CreateAppContainerProfile".into(),
                version: "system".into(),
            }],
        ),
        Err(e) => Probe::unavailable(tier, format!("cannot create an AppContainer profile: {e}")),
    }
}

/// Creates the empty placeholder directories of a plan. A path that exists
/// must be a real directory or file (never a symlink or junction, which
/// would carry the ACEs elsewhere).
fn placeholders(tier: Tier, paths: &[WinPath]) -> Result<(), WinError> {
    for p in paths {
        let path = std::path::Path::new(p.as_str());
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(WinError::Placeholder {
                    tier,
                    path: p.to_string(),
                    message: "is a symlink or junction".into(),
                })
            }
            Ok(_) => {}
            Err(_) => std::fs::create_dir(path).map_err(|e| WinError::Placeholder {
                tier,
                path: p.to_string(),
                message: e.to_string(),
            })?,
        }
    }
    Ok(())
}

fn exists(p: &WinPath) -> bool {
    std::fs::symlink_metadata(p.as_str()).is_ok()
}

/// Applies one ACE unless it needs elevation, in which case it must already
/// be there (applied by `hull setup --elevated`).
fn ensure(
    tier: Tier,
    plan_elevated: &[WinPath],
    missing_elevated: &mut Vec<WinPath>,
    path: &WinPath,
    sid: &Sid,
    change: Change,
    inherit: crate::policy::lower::appcontainer::Inherit,
) -> Result<(), WinError> {
    if !exists(path) {
        return Ok(()); // grants on missing paths grant nothing; protections got placeholders
    }
    let (deny, mask) = match change {
        Change::Allow(m) => (false, m),
        Change::Deny(m) => (true, m),
        Change::Strip => {
            if plan_elevated.contains(path) {
                return Ok(());
            }
            return acl::apply(path.as_str(), sid, change, inherit)
                .map_err(|e| os(tier, "SetNamedSecurityInfoW", path.to_string(), e));
        }
    };
    let present = acl::has_ace(path.as_str(), sid, deny, mask)
        .map_err(|e| os(tier, "GetNamedSecurityInfoW", path.to_string(), e))?;
    if present {
        return Ok(());
    }
    if plan_elevated.contains(path) {
        missing_elevated.push(path.clone());
        return Ok(());
    }
    acl::apply(path.as_str(), sid, change, inherit)
        .map_err(|e| os(tier, "SetNamedSecurityInfoW", path.to_string(), e))
}

fn sids_for(
    tier: Tier,
    trustees: impl Iterator<Item = Trustee>,
) -> Result<Vec<(Trustee, Sid)>, WinError> {
    let mut out: Vec<(Trustee, Sid)> = Vec::new();
    for t in trustees {
        if out.iter().any(|(x, _)| *x == t) {
            continue;
        }
        let s = sid::trustee_sid(&t).map_err(|e| os(tier, "derive SID", t.label(), e))?;
        out.push((t, s));
    }
    Ok(out)
}

fn find<'a>(sids: &'a [(Trustee, Sid)], t: &Trustee) -> &'a Sid {
    // every trustee of the plan was derived by `sids_for`
    &sids.iter().find(|(x, _)| x == t).unwrap_or(&sids[0]).1
}

fn refuse_unelevated(
    tier: Tier,
    missing: Vec<WinPath>,
    plan: ElevatedPlan,
) -> Result<(), WinError> {
    if missing.is_empty() {
        return Ok(());
    }
    let dir = std::env::var_os("LOCALAPPDATA")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
        .join("hull");
    let file = dir.join("elevated-plan.json");
    std::fs::create_dir_all(&dir)
        .and_then(|_| std::fs::write(&file, plan.to_json()))
        .map_err(|e| os(tier, "write", file.display().to_string(), e.to_string()))?;
    Err(WinError::NeedsElevation {
        tier,
        count: missing.len(),
        first: missing[0].to_string(),
        plan: file,
    })
}

pub fn prepare_appcontainer(plan: &AclPlan) -> Result<(), WinError> {
    let tier = Tier::AppContainer;
    placeholders(tier, &plan.placeholders)?;
    let trustees = plan
        .entries
        .iter()
        .map(|e| e.trustee.clone())
        .chain(plan.denies.iter().map(|d| d.trustee.clone()))
        .chain(std::iter::once(Trustee::Package(
            plan.package_sid_name.clone(),
        )));
    let sids = sids_for(tier, trustees)?;
    let mut missing = Vec::new();
    let el = &plan.needs_elevation;
    for s in &plan.strip {
        ensure(
            tier,
            el,
            &mut missing,
            &s.path,
            find(&sids, &s.trustee),
            Change::Strip,
            crate::policy::lower::appcontainer::Inherit::Tree,
        )?;
    }
    for e in &plan.entries {
        ensure(
            tier,
            el,
            &mut missing,
            &e.path,
            find(&sids, &e.trustee),
            Change::Allow(e.rights.mask()),
            e.inherit,
        )?;
    }
    for d in &plan.denies {
        ensure(
            tier,
            el,
            &mut missing,
            &d.path,
            find(&sids, &d.trustee),
            Change::Deny(d.deny.mask()),
            d.inherit,
        )?;
    }
    refuse_unelevated(tier, missing, ElevatedPlan::from_acl_plan(plan))
}

pub fn prepare_restricted(plan: &RestrictedPlan) -> Result<(), WinError> {
    let tier = Tier::Restricted;
    placeholders(tier, &plan.placeholders)?;
    let trustees = plan
        .entries
        .iter()
        .map(|e| e.trustee.clone())
        .chain(plan.denies.iter().map(|d| d.trustee.clone()))
        .chain(std::iter::once(Trustee::Capability(
            plan.capability_sid_name.clone(),
        )));
    let sids = sids_for(tier, trustees)?;
    let mut missing = Vec::new();
    let el = &plan.needs_elevation;
    for e in &plan.entries {
        ensure(
            tier,
            el,
            &mut missing,
            &e.path,
            find(&sids, &e.trustee),
            Change::Allow(e.rights.mask()),
            e.inherit,
        )?;
    }
    for d in &plan.denies {
        ensure(
            tier,
            el,
            &mut missing,
            &d.path,
            find(&sids, &d.trustee),
            Change::Deny(d.deny.mask()),
            d.inherit,
        )?;
    }
    for l in &plan.labels {
        if !exists(&l.path) {
            continue;
        }
        if el.contains(&l.path) {
            // Labels on system paths are not offered to the helper: refuse.
            missing.push(l.path.clone());
            continue;
        }
        acl::set_label(l.path.as_str(), l.level, l.policy, l.inherit)
            .map_err(|e| os(tier, "SetNamedSecurityInfoW(label)", l.path.to_string(), e))?;
    }
    refuse_unelevated(tier, missing, ElevatedPlan::from_restricted_plan(plan))
}

/// The trampoline: starts the sandboxed process and waits for it.
pub fn run_sandboxed(t: &TrampolineSpec, argv: &[OsString]) -> Result<i32, WinError> {
    let tier = t.tier.tier();
    let args: Vec<String> = argv
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let cmdline = command_line(&args);
    let job = process::job(t.memory, t.processes, t.ui_restrictions)
        .map_err(|e| os(tier, "CreateJobObjectW", "job", e))?;
    let caps: Vec<Sid> = t
        .capabilities
        .iter()
        .map(|c| {
            sid::capability_sid(c)
                .map_err(|e| os(tier, "DeriveCapabilitySidsFromName", c.clone(), e))
        })
        .collect::<Result<_, _>>()?;
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
        ^ u128::from(std::process::id());
    let code = match t.tier {
        WinTier::AppContainer => {
            let name = t.container.as_deref().unwrap_or_default();
            let package = sid::appcontainer_sid(name, false)
                .map_err(|e| os(tier, "DeriveAppContainerSidFromAppContainerName", name, e))?;
            let desktop = if t.private_desktop {
                Some(
                    process::private_desktop(&desktop_name(nonce), &package)
                        .map_err(|e| os(tier, "CreateDesktopW", "desktop", e))?,
                )
            } else {
                None
            };
            process::run(
                process::Identity::AppContainer {
                    package: &package,
                    capabilities: &caps,
                },
                &cmdline,
                &t.cwd,
                desktop.as_ref(),
                &job,
            )
        }
        WinTier::Restricted => {
            let dacl_name = t.default_dacl_capability.as_deref().unwrap_or_default();
            let dacl = sid::capability_sid(dacl_name)
                .map_err(|e| os(tier, "DeriveCapabilitySidsFromName", dacl_name, e))?;
            let token = process::restricted_token(&caps, &dacl)
                .map_err(|e| os(tier, "CreateRestrictedToken", "token", e))?;
            let desktop = if t.private_desktop {
                Some(
                    process::private_desktop(&desktop_name(nonce), &dacl)
                        .map_err(|e| os(tier, "CreateDesktopW", "desktop", e))?,
                )
            } else {
                None
            };
            process::run(
                process::Identity::Token(&token),
                &cmdline,
                &t.cwd,
                desktop.as_ref(),
                &job,
            )
        }
    }
    .map_err(|e| {
        os(
            tier,
            "CreateProcess",
            args.first().cloned().unwrap_or_default(),
            e,
        )
    })?;
    // The job handle closes when `job` drops: anything the command left
    // running is killed now.
    drop(job);
    Ok(code as i32)
}

/// Applies a validated elevated plan (the helper, elevated).
pub fn apply_elevated(plan: &ElevatedPlan) -> Result<usize, ElevatedError> {
    let mut n = 0;
    for (index, e) in plan.entries.iter().enumerate() {
        let fail = |message: String| ElevatedError::Apply {
            index,
            path: e.path.clone(),
            message,
        };
        let sid = sid::trustee_sid(&e.trustee).map_err(fail)?;
        let change = match e.ace {
            AceKind::Allow(r) => Change::Allow(r.mask()),
            AceKind::Deny(d) => Change::Deny(Deny::mask(d)),
        };
        acl::apply(&e.path, &sid, change, e.inherit).map_err(fail)?;
        n += 1;
    }
    Ok(n)
}
