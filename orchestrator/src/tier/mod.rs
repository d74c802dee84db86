//! The closed set of tiers, and probing which ones this host can run.
//!
//! Every tier enforces the same [`Policy`](crate::policy::Policy) with its own
//! mechanism. Selection never degrades: a tier that cannot be set up is an
//! error naming the missing piece; nothing reruns a command under a weaker
//! tier or unsandboxed.
//!
//! The process tiers, the [`Tier`] names and probing are the `hull-native`
//! crate, re-exported here; this module adds tier 3 ([`vm`], the adapter
//! onto `vm/`) and the dispatch over every tier.

#[cfg(target_os = "linux")]
pub use hull_native::{broker, cow, identity, launch, rules, seccomp, spares, user_scratch};
pub use hull_native::{bwrap, landlock, none, probe, seatbelt, windows, NetUnsupported, Os, Tier};

pub mod vm;

/// Ends what a crashed run left outside its run dir: a tier-3 run's QEMU
/// and virtiofsd (and the placeholders they hold). The runtime's cleanup
/// calls it ([`crate::runtime::Reclaim`]) on an idle run dir, under its
/// lock; the process tiers leave nothing outside.
pub fn reclaim_stale_run(dir: &std::path::Path) {
    #[cfg(target_os = "linux")]
    let _ = vm::cleanup_stale_instance(dir);
    #[cfg(not(target_os = "linux"))]
    let _ = dir;
}

/// Probes one tier on this host.
pub fn probe(tier: Tier) -> probe::Probe {
    if !probe::built_for_this_os(tier) {
        return probe::Probe::wrong_os(tier);
    }
    let p = match tier {
        Tier::None => none::probe(),
        Tier::Landlock => landlock::probe(),
        Tier::Bwrap => bwrap::probe(),
        Tier::Vm => vm_probe(),
        // The macOS and Windows tiers probe themselves on their OS.
        Tier::Seatbelt => seatbelt::probe(),
        Tier::Restricted => windows::probe_restricted(),
        Tier::AppContainer => windows::probe_appcontainer(),
    };
    with_sandbox_user(p)
}

/// When hull runs as root, the Linux tiers run the command (landlock,
/// bwrap) or QEMU (vm) as the sandbox user: without it they are
/// unavailable, and say how to create it.
fn with_sandbox_user(p: probe::Probe) -> probe::Probe {
    #[cfg(target_os = "linux")]
    if p.available
        && matches!(p.tier, Tier::Landlock | Tier::Bwrap | Tier::Vm)
        && crate::sandbox_user::hull_is_root()
    {
        if let Err(e) = crate::sandbox_user::lookup(p.tier.name()) {
            return probe::Probe {
                helpers: p.helpers,
                ..probe::Probe::unavailable(p.tier, e.to_string())
            };
        }
    }
    p
}

fn vm_probe() -> probe::Probe {
    vm::probe()
}

/// The cheap check `hull run` makes before using a tier: the pieces exist.
/// Anything subtler fails when the tier is set up, and fails closed there.
pub fn ready(tier: Tier) -> probe::Probe {
    if !probe::built_for_this_os(tier) {
        return probe::Probe::wrong_os(tier);
    }
    match tier {
        #[cfg(target_os = "linux")]
        Tier::Bwrap => with_sandbox_user(bwrap::ready()),
        #[cfg(target_os = "linux")]
        Tier::Vm => with_sandbox_user(vm::ready()),
        _ => probe(tier),
    }
}

/// Probes every tier, in [`Tier::ALL`] order.
pub fn probe_all() -> Vec<probe::Probe> {
    Tier::ALL.into_iter().map(probe).collect()
}
