//! The Windows tiers: `restricted` (tier 1) and `appcontainer` (tier 2, the
//! Windows default), and the elevated helper both use for paths the user
//! cannot change.
//!
//! How a command starts: [`launch_appcontainer`] / [`launch_restricted`]
//! lower the policy, create placeholders, apply the ACEs (and labels) the
//! user may apply, verify those that need elevation were applied by
//! `hull setup --elevated` (refusing to run otherwise), and return a
//! `std::process::Command` for the shared executor: `hull __windows-exec
//! --spec JSON -- ARGV`. That trampoline (this same binary, unsandboxed, the
//! user's own rights) creates a Job Object with kill-on-close, a private
//! desktop, and the sandboxed process (suspended, assigned to the job, then
//! resumed), with only the three standard handles inherited. It waits and
//! exits with the command's code; when the executor kills it (timeout,
//! Ctrl-C), its job handle closes and Windows ends the whole tree.
//! `std::process::Command` cannot take a token or a security-capabilities
//! attribute, which is why the trampoline exists.
//!
//! What this protects against and what it does not: see the lowering modules
//! ([`crate::policy::lower::appcontainer`], [`crate::policy::lower::restricted`])
//! and `docs/tiers.md`. Verified here by compiling for `x86_64-pc-windows-gnu`
//! and by unit tests of the pure parts on Linux; not run on Windows.

pub mod elevated;
#[cfg(windows)]
mod sys;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Command;

use serde::{Deserialize, Serialize};

use crate::exec::CommandSpec;
use crate::policy::lower::appcontainer::{self, AclPlan, WinLowerError};
use crate::policy::lower::restricted::{self, RestrictedPlan};
use crate::policy::Policy;
use crate::probe::Probe;
use crate::Tier;

/// The largest `--spec` the trampoline accepts.
pub const MAX_SPEC_BYTES: usize = 64 * 1024;

/// Errors of the Windows tiers; each names the tier, the path or call, and
/// what is missing.
#[derive(Debug, thiserror::Error)]
pub enum WinError {
    #[error("tier {tier} needs Windows")]
    WrongOs { tier: Tier },
    #[error("tier {tier}: {source}")]
    Lower {
        tier: Tier,
        #[source]
        source: WinLowerError,
    },
    #[error("tier {tier}: {count} path(s) need ACEs only an administrator can set ({first}, ...); run `hull setup --elevated {plan}` once, then rerun")]
    NeedsElevation {
        tier: Tier,
        count: usize,
        first: String,
        plan: PathBuf,
    },
    #[error("tier {tier}: {call} failed on {what}: {message}")]
    Os {
        tier: Tier,
        call: &'static str,
        what: String,
        message: String,
    },
    #[error("tier {tier}: placeholder {path}: {message}")]
    Placeholder {
        tier: Tier,
        path: String,
        message: String,
    },
    #[error("__windows-exec: bad --spec: {0}")]
    BadSpec(String),
    #[error("tier {tier}: empty command")]
    EmptyCommand { tier: Tier },
    #[error("tier {tier}: cannot find the hull executable for the trampoline: {source}")]
    CurrentExe {
        tier: Tier,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Elevated(#[from] elevated::ElevatedError),
}

/// Which Windows tier a trampoline starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WinTier {
    Restricted,
    AppContainer,
}

impl WinTier {
    pub fn tier(self) -> Tier {
        match self {
            WinTier::Restricted => Tier::Restricted,
            WinTier::AppContainer => Tier::AppContainer,
        }
    }
}

/// What the trampoline needs to start the sandboxed process. Small and
/// passed on the command line (never through a file the sandbox could write).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrampolineSpec {
    pub tier: WinTier,
    /// AppContainer profile name (appcontainer only).
    pub container: Option<String>,
    /// Capability names: for appcontainer the SECURITY_CAPABILITIES list
    /// (the instance capability); for restricted the restricting SIDs.
    pub capabilities: Vec<String>,
    /// Capability whose SID gets `GENERIC_ALL` in the token's default DACL
    /// (restricted only).
    pub default_dacl_capability: Option<String>,
    pub memory: Option<u64>,
    pub processes: Option<u64>,
    pub ui_restrictions: bool,
    pub private_desktop: bool,
    pub cwd: PathBuf,
}

impl TrampolineSpec {
    pub fn for_appcontainer(plan: &AclPlan, cwd: PathBuf) -> TrampolineSpec {
        TrampolineSpec {
            tier: WinTier::AppContainer,
            container: Some(plan.package_sid_name.clone()),
            capabilities: vec![plan.instance_capability.clone()],
            default_dacl_capability: None,
            memory: plan.job.memory,
            processes: plan.job.processes,
            ui_restrictions: plan.job.ui_restrictions,
            private_desktop: plan.private_desktop,
            cwd,
        }
    }

    pub fn for_restricted(plan: &RestrictedPlan, cwd: PathBuf) -> TrampolineSpec {
        TrampolineSpec {
            tier: WinTier::Restricted,
            container: None,
            capabilities: vec![
                plan.capability_sid_name.clone(),
                plan.instance_capability.clone(),
            ],
            default_dacl_capability: Some(plan.instance_capability.clone()),
            memory: plan.job.memory,
            processes: plan.job.processes,
            ui_restrictions: plan.job.ui_restrictions,
            private_desktop: plan.private_desktop,
            cwd,
        }
    }

    /// Parses and checks a `--spec` value (bounded; names must be hull's).
    pub fn parse(s: &str) -> Result<TrampolineSpec, WinError> {
        if s.len() > MAX_SPEC_BYTES {
            return Err(WinError::BadSpec(format!(
                "{} bytes, more than {MAX_SPEC_BYTES}",
                s.len()
            )));
        }
        let spec: TrampolineSpec =
            serde_json::from_str(s).map_err(|e| WinError::BadSpec(e.to_string()))?;
        let hull_name = |n: &str, prefix: &str| {
            n.strip_prefix(prefix).is_some_and(|id| {
                !id.is_empty()
                    && id.len() <= 64
                    && id
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            })
        };
        match (spec.tier, &spec.container) {
            (WinTier::AppContainer, Some(c)) if hull_name(c, "hull.ws.") => {}
            (WinTier::Restricted, None) => {}
            _ => {
                return Err(WinError::BadSpec(
                    "container name missing or not hull's".into(),
                ))
            }
        }
        if spec.capabilities.is_empty()
            || spec.capabilities.len() > 4
            || !spec
                .capabilities
                .iter()
                .all(|c| hull_name(c, "hull-ws-") || hull_name(c, "hull-run-"))
        {
            return Err(WinError::BadSpec(
                "capability names must be hull-ws-* or hull-run-*".into(),
            ));
        }
        if spec.tier == WinTier::Restricted && spec.default_dacl_capability.is_none() {
            return Err(WinError::BadSpec(
                "restricted needs default_dacl_capability".into(),
            ));
        }
        Ok(spec)
    }
}

/// Probes tier 1 on Windows: a restricted, Low-integrity token can be made.
pub fn probe_restricted() -> Probe {
    #[cfg(windows)]
    {
        sys::probe_restricted()
    }
    #[cfg(not(windows))]
    {
        Probe::wrong_os(Tier::Restricted)
    }
}

/// Probes tier 2 on Windows: an AppContainer profile can be created and its
/// SID derived.
pub fn probe_appcontainer() -> Probe {
    #[cfg(windows)]
    {
        sys::probe_appcontainer()
    }
    #[cfg(not(windows))]
    {
        Probe::wrong_os(Tier::AppContainer)
    }
}

/// The workspace id of a policy (from its project path).
pub fn workspace_of(policy: &Policy) -> String {
    appcontainer::workspace_id(&policy.vars.project.to_string_lossy())
}

/// Prepares the host for `spec` under AppContainer and returns the trampoline
/// command. Fails closed: any ACE that cannot be applied or verified is an
/// error and nothing runs.
pub fn launch_appcontainer(policy: &Policy, spec: &CommandSpec) -> Result<Command, WinError> {
    let tier = Tier::AppContainer;
    #[cfg(windows)]
    let system = sys::system_dirs();
    #[cfg(not(windows))]
    let system = appcontainer::SystemDirs::default();
    let plan = appcontainer::lower_with(policy, &workspace_of(policy), &system)
        .map_err(|source| WinError::Lower { tier, source })?;
    #[cfg(windows)]
    {
        sys::prepare_appcontainer(&plan)?;
        trampoline(
            tier,
            &TrampolineSpec::for_appcontainer(&plan, spec.cwd.clone()),
            spec,
        )
    }
    #[cfg(not(windows))]
    {
        let _ = (&plan, spec, TrampolineSpec::for_appcontainer);
        Err(WinError::WrongOs { tier })
    }
}

/// Prepares the host for `spec` under the restricted token and returns the
/// trampoline command.
pub fn launch_restricted(policy: &Policy, spec: &CommandSpec) -> Result<Command, WinError> {
    let tier = Tier::Restricted;
    #[cfg(windows)]
    let system = sys::system_dirs();
    #[cfg(not(windows))]
    let system = appcontainer::SystemDirs::default();
    let plan = restricted::lower_with(policy, &workspace_of(policy), &system)
        .map_err(|source| WinError::Lower { tier, source })?;
    #[cfg(windows)]
    {
        sys::prepare_restricted(&plan)?;
        trampoline(
            tier,
            &TrampolineSpec::for_restricted(&plan, spec.cwd.clone()),
            spec,
        )
    }
    #[cfg(not(windows))]
    {
        let _ = (&plan, spec, TrampolineSpec::for_restricted);
        Err(WinError::WrongOs { tier })
    }
}

/// `hull __windows-exec --spec JSON -- ARGV` with a clean environment.
#[cfg_attr(not(windows), allow(dead_code))]
fn trampoline(tier: Tier, t: &TrampolineSpec, spec: &CommandSpec) -> Result<Command, WinError> {
    if spec.argv.is_empty() {
        return Err(WinError::EmptyCommand { tier });
    }
    let exe = std::env::current_exe().map_err(|source| WinError::CurrentExe { tier, source })?;
    let mut c = Command::new(exe);
    c.args(trampoline_args(t, &spec.argv)?);
    c.env_clear();
    c.envs(spec.env.iter().map(|(k, v)| (k, v)));
    c.current_dir(&spec.cwd);
    Ok(c)
}

/// The trampoline's arguments.
pub fn trampoline_args(t: &TrampolineSpec, argv: &[OsString]) -> Result<Vec<OsString>, WinError> {
    let json = serde_json::to_string(t).map_err(|e| WinError::BadSpec(e.to_string()))?;
    let mut a: Vec<OsString> = vec!["__windows-exec".into(), "--spec".into(), json.into()];
    a.push("--".into());
    a.extend(argv.iter().cloned());
    Ok(a)
}

/// The trampoline's entry point (`hull __windows-exec`): returns the
/// command's exit code.
pub fn exec_main(spec: &str, argv: &[OsString]) -> Result<i32, WinError> {
    let t = TrampolineSpec::parse(spec)?;
    if argv.is_empty() {
        return Err(WinError::EmptyCommand {
            tier: t.tier.tier(),
        });
    }
    #[cfg(windows)]
    {
        sys::run_sandboxed(&t, argv)
    }
    #[cfg(not(windows))]
    {
        Err(WinError::WrongOs {
            tier: t.tier.tier(),
        })
    }
}

/// Quotes one argument the way `CommandLineToArgvW` and the MSVC runtime
/// split it back: backslashes are literal except before a quote.
pub fn quote_arg(arg: &str) -> String {
    if !arg.is_empty() && !arg.contains([' ', '\t', '\n', '\u{b}', '"']) {
        return arg.to_string();
    }
    let mut out = String::from("\"");
    let mut backslashes = 0usize;
    for c in arg.chars() {
        match c {
            '\\' => backslashes += 1,
            '"' => {
                out.extend(std::iter::repeat_n('\\', backslashes * 2 + 1));
                out.push('"');
                backslashes = 0;
            }
            _ => {
                out.extend(std::iter::repeat_n('\\', backslashes));
                out.push(c);
                backslashes = 0;
            }
        }
    }
    out.extend(std::iter::repeat_n('\\', backslashes * 2));
    out.push('"');
    out
}

/// A whole command line from argv (each argument quoted).
pub fn command_line(argv: &[String]) -> String {
    argv.iter()
        .map(|a| quote_arg(a))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A private desktop name, unique per trampoline.
pub fn desktop_name(nonce: u128) -> String {
    format!("hull-{nonce:032x}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::lower::testing::windows_policy;

    /// `CommandLineToArgvW`'s splitting rules, for checking `quote_arg`.
    fn split(cmd: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut cur = String::new();
        let mut in_q = false;
        let mut have = false;
        let chars: Vec<char> = cmd.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            if c == '\\' {
                let mut n = 0;
                while i < chars.len() && chars[i] == '\\' {
                    n += 1;
                    i += 1;
                }
                if i < chars.len() && chars[i] == '"' {
                    cur.extend(std::iter::repeat_n('\\', n / 2));
                    if n % 2 == 1 {
                        cur.push('"');
                        i += 1;
                    }
                } else {
                    cur.extend(std::iter::repeat_n('\\', n));
                }
                have = true;
                continue;
            }
            if c == '"' {
                in_q = !in_q;
                have = true;
            } else if (c == ' ' || c == '\t') && !in_q {
                if have {
                    out.push(std::mem::take(&mut cur));
                    have = false;
                }
            } else {
                cur.push(c);
                have = true;
            }
            i += 1;
        }
        if have {
            out.push(cur);
        }
        out
    }

    #[test]
    fn quoting_round_trips_through_the_windows_splitting_rules() {
        let cases: Vec<Vec<&str>> = vec![
            vec!["cmd.exe", "/c", "echo hi"],
            vec![
                "a\\b\\",
                "x y\\",
                "q\"uote",
                "",
                "\\\\srv\\share\\",
                "tab\there",
            ],
            vec![
                "C:\\Program Files\\Git\\bin\\sh.exe",
                "-c",
                "echo \"$HOME\"\\",
            ],
        ];
        for argv in cases {
            let owned: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
            assert_eq!(
                split(&command_line(&owned)),
                owned,
                "{}",
                command_line(&owned)
            );
        }
    }

    #[test]
    fn trampoline_spec_round_trips_and_is_checked() {
        let pol = windows_policy("default");
        let plan = appcontainer::lower(&pol, "ws1").unwrap();
        let t = TrampolineSpec::for_appcontainer(&plan, "C:\\Users\\u\\proj".into());
        let args = trampoline_args(&t, &["cmd".into(), "/c".into(), "ver".into()]).unwrap();
        assert_eq!(args[0], "__windows-exec");
        assert_eq!(args[3], "--");
        let parsed = TrampolineSpec::parse(args[2].to_str().unwrap()).unwrap();
        assert_eq!(parsed, t);
        assert_eq!(parsed.capabilities, vec!["hull-run-id1".to_string()]);

        let rplan = restricted::lower(&pol, "ws1").unwrap();
        let r = TrampolineSpec::for_restricted(&rplan, "C:\\p".into());
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(TrampolineSpec::parse(&json).unwrap(), r);

        // names that are not hull's, unknown fields, oversize: refused
        let mut bad = t.clone();
        bad.capabilities = vec!["internetClient".into()];
        let e = TrampolineSpec::parse(&serde_json::to_string(&bad).unwrap()).unwrap_err();
        assert!(e.to_string().contains("capability"), "{e}");
        let mut bad = t.clone();
        bad.container = Some("Microsoft.Edge".into());
        assert!(TrampolineSpec::parse(&serde_json::to_string(&bad).unwrap()).is_err());
        let extra = json.replacen('{', "{\"x\":1,", 1);
        assert!(TrampolineSpec::parse(&extra).is_err());
        assert!(TrampolineSpec::parse(&"x".repeat(MAX_SPEC_BYTES + 1)).is_err());
    }

    #[cfg(not(windows))]
    #[test]
    fn off_windows_probes_say_needs_windows_and_launches_refuse() {
        for p in [probe_restricted(), probe_appcontainer()] {
            assert!(!p.available);
            assert_eq!(p.reason, "needs Windows");
        }
        let pol = windows_policy("default");
        let spec = CommandSpec {
            argv: vec!["cmd".into()],
            cwd: "C:\\Users\\u\\proj".into(),
            env: vec![],
            timeout: None,
            user: None,
        };
        assert!(matches!(
            launch_appcontainer(&pol, &spec),
            Err(WinError::WrongOs {
                tier: Tier::AppContainer
            })
        ));
        assert!(matches!(
            launch_restricted(&pol, &spec),
            Err(WinError::WrongOs {
                tier: Tier::Restricted
            })
        ));
        let t = TrampolineSpec::for_appcontainer(
            &appcontainer::lower(&pol, "ws1").unwrap(),
            "C:\\p".into(),
        );
        let e = exec_main(&serde_json::to_string(&t).unwrap(), &["cmd".into()]).unwrap_err();
        assert!(e.to_string().contains("needs Windows"), "{e}");
    }
}
