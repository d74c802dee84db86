//! Probing: can this host run a tier, and if not, why not.

use serde::Serialize;

use super::{Os, Tier};

/// The result of probing one tier on this host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Probe {
    pub tier: Tier,
    pub level: u8,
    pub available: bool,
    /// Why not (or, when available, what was found), in plain words.
    pub reason: String,
    /// Helpers found, with their versions (`bwrap 0.8.0 at /usr/bin/bwrap`).
    pub helpers: Vec<Helper>,
}

/// An external program a tier uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Helper {
    pub name: String,
    pub path: String,
    pub version: String,
}

impl Probe {
    pub fn available(tier: Tier, reason: impl Into<String>, helpers: Vec<Helper>) -> Probe {
        Probe {
            tier,
            level: tier.level(),
            available: true,
            reason: reason.into(),
            helpers,
        }
    }

    pub fn unavailable(tier: Tier, reason: impl Into<String>) -> Probe {
        Probe {
            tier,
            level: tier.level(),
            available: false,
            reason: reason.into(),
            helpers: Vec::new(),
        }
    }

    /// The probe of a tier built for another OS: "needs macOS" / "needs Windows".
    pub fn wrong_os(tier: Tier) -> Probe {
        let names: Vec<&str> = tier.oses().iter().map(|o| o.as_str()).collect();
        Probe::unavailable(tier, format!("needs {}", names.join(" or ")))
    }
}

/// True when the tier is built for the OS this binary runs on.
pub fn built_for_this_os(tier: Tier) -> bool {
    Os::current().is_some_and(|os| tier.oses().contains(&os))
}
