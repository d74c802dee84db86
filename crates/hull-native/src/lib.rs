//! The process tiers: the closed set of tiers, probing them, and the
//! launchers of every tier but the VM.
//!
//! Every tier enforces the same [`Policy`](crate::policy::Policy) with its own
//! mechanism. Selection never degrades: a tier that cannot be set up is an
//! error naming the missing piece; nothing reruns a command under a weaker
//! tier or unsandboxed.
//!
//! The floor above `hull-exec` and `hull-changes`: [`Tier`] and [`probe`]
//! name the tiers and say what a host can run; [`landlock`], [`bwrap`] (with
//! [`launch`], [`rules`], [`spares`], [`identity`], [`cow`] and the
//! [`broker`] that opens what a command may reach) are Linux's, [`seatbelt`]
//! macOS's and [`windows`] the restricted token's and AppContainer's.
//!
//! What it may not do: know the VM or a run. Tier 3 and the dispatch over
//! every tier (`hull::tier`) are in the application crate above, which
//! gives a run's lowered plan to the launcher here.

#[cfg(target_os = "linux")]
pub mod broker;
#[cfg(target_os = "linux")]
pub mod bwrap;
#[cfg(target_os = "linux")]
pub mod cow;
#[cfg(target_os = "linux")]
pub mod identity;
#[cfg(target_os = "linux")]
pub mod landlock;
#[cfg(target_os = "linux")]
pub mod launch;
#[cfg(target_os = "linux")]
mod mounts;
pub mod none;
pub mod probe;
#[cfg(target_os = "linux")]
pub mod rules;
pub mod seatbelt;
#[cfg(target_os = "linux")]
pub mod seccomp;
#[cfg(target_os = "linux")]
pub mod spares;
#[cfg(target_os = "linux")]
pub mod user_scratch;
pub mod windows;

/// Off Linux, the Linux tiers exist only to say so.
#[cfg(not(target_os = "linux"))]
pub mod landlock {
    use crate::{probe::Probe, Tier};
    pub fn probe() -> Probe {
        Probe::wrong_os(Tier::Landlock)
    }
    pub fn exec_main(
        _plan_fd: i32,
        _error_fd: Option<i32>,
        _argv: Vec<std::ffi::OsString>,
    ) -> anyhow::Result<i32> {
        anyhow::bail!("tier landlock needs Linux")
    }
}

/// Off Linux, the Linux tiers exist only to say so.
#[cfg(not(target_os = "linux"))]
pub mod bwrap {
    use crate::{probe::Probe, Tier};
    pub fn probe() -> Probe {
        Probe::wrong_os(Tier::Bwrap)
    }
}

#[cfg(target_os = "linux")]
use hull_changes as changes;
use hull_exec::exec;
#[cfg(windows)]
use hull_exec::winsec;
#[cfg(target_os = "linux")]
use hull_exec::{mountinfo, runtime, sandbox_user};
use hull_policy as policy;

use serde::Serialize;

/// A tier: one boundary mechanism. Matched exhaustively everywhere it matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tier {
    /// Tier 0: no boundary. cwd and environment scrub only; only by name.
    None,
    /// Tier 1 (Linux): Landlock + seccomp + no_new_privs.
    Landlock,
    /// Tier 1 (Windows): restricted token + low integrity + Job Object.
    Restricted,
    /// Tier 2 (Linux): bubblewrap namespaces and mounts + seccomp.
    Bwrap,
    /// Tier 2 (macOS): sandbox-exec with a generated SBPL profile.
    Seatbelt,
    /// Tier 2 (Windows): AppContainer + ACL grants + Job Object.
    AppContainer,
    /// Tier 3: outer VM + unprivileged Incus container.
    Vm,
}

/// In JSON a tier is its command-line name (`hull probe --json`, `hull
/// canary --json`, run results), so one spelling reaches scripts.
impl Serialize for Tier {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

pub use hull_exec::os::Os;

impl Tier {
    /// Every tier, in the order `hull probe` lists them.
    pub const ALL: [Tier; 7] = [
        Tier::None,
        Tier::Landlock,
        Tier::Restricted,
        Tier::Bwrap,
        Tier::Seatbelt,
        Tier::AppContainer,
        Tier::Vm,
    ];

    /// The name used on the command line and in policy explain.
    pub fn name(self) -> &'static str {
        match self {
            Tier::None => "none",
            Tier::Landlock => "landlock",
            Tier::Restricted => "restricted",
            Tier::Bwrap => "bwrap",
            Tier::Seatbelt => "seatbelt",
            Tier::AppContainer => "appcontainer",
            Tier::Vm => "vm",
        }
    }

    /// The strength level: 0 none, 1 process rules, 2 namespaces/containers, 3 VM.
    pub fn level(self) -> u8 {
        match self {
            Tier::None => 0,
            Tier::Landlock | Tier::Restricted => 1,
            Tier::Bwrap | Tier::Seatbelt | Tier::AppContainer => 2,
            Tier::Vm => 3,
        }
    }

    /// The operating systems the tier runs on.
    pub fn oses(self) -> &'static [Os] {
        match self {
            Tier::None | Tier::Vm => &[Os::Linux, Os::Macos, Os::Windows],
            Tier::Landlock | Tier::Bwrap => &[Os::Linux],
            Tier::Seatbelt => &[Os::Macos],
            Tier::Restricted | Tier::AppContainer => &[Os::Windows],
        }
    }

    /// Parses a command-line name (`vm` and `tier3` are the same).
    pub fn from_name(s: &str) -> Option<Tier> {
        match s {
            "tier3" => Some(Tier::Vm),
            _ => Tier::ALL.into_iter().find(|t| t.name() == s),
        }
    }

    /// Parses a `--tier` argument: a tier's name, or `auto` for this
    /// host's tier 2 ([`Tier::auto_for`]).
    pub fn from_arg(s: &str) -> Option<Tier> {
        match s {
            "auto" => Os::current().map(Tier::auto_for),
            _ => Tier::from_name(s),
        }
    }

    /// The host's tier 2, which `--tier auto` chooses.
    pub fn auto_for(os: Os) -> Tier {
        match os {
            Os::Linux => Tier::Bwrap,
            Os::Macos => Tier::Seatbelt,
            Os::Windows => Tier::AppContainer,
        }
    }
}

impl std::fmt::Display for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A policy's network part that a tier cannot enforce as written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetUnsupported {
    #[error("tier {tier}: net.mode = \"allowlist\" needs hull's network proxy, which this build of hull does not have yet; use net.mode = \"none\" (no network) until then")]
    NoProxy { tier: Tier },
    #[error("tier seatbelt: net.mode = \"allowlist\": the profile allows only hull's proxy on loopback (hull policy explain --tier seatbelt shows it), but hull does not start the proxy on macOS yet; use net.mode = \"none\" (no network), or a Linux tier (landlock, bwrap)")]
    NoProxyOnMacos,
    #[error("tier appcontainer: net.mode = \"allowlist\" {}", crate::policy::lower::appcontainer::NETWORK_ALLOWLIST.trim_start_matches("allowlist: "))]
    NeedsElevatedHelper,
}

impl Tier {
    /// How this tier enforces the policy's network part, in one line, or
    /// why it cannot. Shown by `hull policy explain`; a run refuses on the
    /// error.
    pub fn network(self, net: &crate::policy::NetPolicy) -> Result<&'static str, NetUnsupported> {
        use crate::policy::NetMode;
        match (net.mode, self) {
            (NetMode::None, Tier::None) => Ok("unrestricted: tier none isolates nothing"),
            (NetMode::None, Tier::Landlock) => {
                Ok("none: IP sockets refused by seccomp (unix sockets as the file grants allow)")
            }
            (NetMode::None, Tier::Bwrap) => {
                Ok("none: a network namespace of its own with only loopback")
            }
            (NetMode::None, Tier::Seatbelt) => Ok("none: (deny network*) in the profile"),
            (NetMode::None, Tier::AppContainer) => {
                Ok("none: no network capability (internetClient) granted")
            }
            (NetMode::None, Tier::Restricted) => {
                Ok("not controlled: a restricted token has no network control (see docs/tiers.md)")
            }
            (NetMode::None, Tier::Vm) => Ok("none: the VM has no network device"),
            (NetMode::Allowlist, Tier::None) => {
                Ok("unrestricted: tier none isolates nothing (the allow list is not applied)")
            }
            (NetMode::Allowlist, Tier::Bwrap) => Ok(
                "allowlist: only through hull's proxy (HTTP(S)_PROXY=http://127.0.0.1:3128, listening in a network namespace of the command's own with only loopback); nothing else is reachable",
            ),
            (NetMode::Allowlist, Tier::Landlock) => Ok(
                "allowlist: only through hull's proxy (HTTP(S)_PROXY=http://127.0.0.1:3128, listening in a network namespace of the command's own with only loopback; Landlock allows TCP connect to that port only); nothing else is reachable",
            ),
            // The network channel is wired on Linux's QEMU backend only.
            (NetMode::Allowlist, Tier::Vm) if cfg!(target_os = "linux") => Ok(
                "allowlist: only through hull's proxy (HTTP(S)_PROXY=http://127.0.0.1:3128 in the container, each connection carried over a virtio-serial port to the run's proxy on the host); the VM has no network device, so nothing else is reachable",
            ),
            (NetMode::Allowlist, Tier::Seatbelt) => Err(NetUnsupported::NoProxyOnMacos),
            (NetMode::Allowlist, Tier::AppContainer) => Err(NetUnsupported::NeedsElevatedHelper),
            (NetMode::Allowlist, tier) => Err(NetUnsupported::NoProxy { tier }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for t in Tier::ALL {
            assert_eq!(Tier::from_name(t.name()), Some(t));
        }
        assert_eq!(Tier::from_name("tier3"), Some(Tier::Vm));
        assert_eq!(Tier::from_name("auto"), None);
    }

    #[test]
    fn json_says_the_command_line_name() {
        for t in Tier::ALL {
            let json = serde_json::to_string(&t).expect("serialize");
            assert_eq!(json, format!("\"{}\"", t.name()));
        }
        assert_eq!(
            serde_json::to_string(&Tier::AppContainer).expect("serialize"),
            "\"appcontainer\""
        );
    }

    #[test]
    fn an_allowlist_is_refused_until_the_proxy_exists() {
        use crate::policy::{NetMode, NetPolicy};
        let none = NetPolicy::default();
        let allow = NetPolicy {
            mode: NetMode::Allowlist,
            ..NetPolicy::default()
        };
        for t in Tier::ALL {
            assert!(t.network(&none).is_ok(), "{t}");
            assert_eq!(
                t.network(&allow).is_ok(),
                matches!(t, Tier::None | Tier::Bwrap | Tier::Landlock | Tier::Vm),
                "{t}"
            );
        }
        let why = |t: Tier| t.network(&allow).unwrap_err().to_string();
        assert!(why(Tier::Seatbelt).contains("on macOS yet"));
        assert!(why(Tier::AppContainer).contains("WFP filters"));
        assert!(
            why(Tier::Restricted).contains("tier restricted")
                && why(Tier::Restricted).contains("proxy")
        );
    }

    #[test]
    fn auto_is_tier_two_never_three() {
        for os in [Os::Linux, Os::Macos, Os::Windows] {
            assert_eq!(Tier::auto_for(os).level(), 2);
        }
    }
}
