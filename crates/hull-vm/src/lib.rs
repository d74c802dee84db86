//! Tier 3: the outer VM (QEMU) and its guest agent.
//!
//! What this protects against: everything the command does happening on the
//! host. The command runs in an unprivileged Incus container inside a QEMU
//! VM with no network device; the host only exposes directories through
//! virtiofsd processes that enforce read-only and protected paths on the host
//! side, and talks to the guest through one virtio-serial port carrying
//! `hull-protocol` frames, every one of which is treated as hostile.
//!
//! What it does not: protect against QEMU or virtiofsd bugs reachable from
//! the guest (both are sandboxed with seccomp, and QEMU has no devices beyond
//! those listed in [`qemu`]), or against a policy that shares too much.
//!
//! Modules, in the order a VM comes up:
//! - [`accel`]: which accelerator really works here (KVM is probed by booting);
//! - [`virtiofsd`]: one supervised file server per share;
//! - [`qemu`]: the QEMU argv from typed values;
//! - [`qemu_facts`]: what a QEMU binary says of itself, asked once per binary;
//! - [`proc`]: helper processes tied to the instance, stale ones cleaned;
//! - [`qmp`]: the control socket;
//! - [`machine`]: start/stop of one VM, waiting for the agent;
//! - [`agent`]: the host side of the agent session;
//! - [`net_channel`]: a run's proxy, bridged to the VM's network port;
//! - [`heartbeat`]: whether a busy guest still answers;
//! - [`pool`]: `hull batch`, a warm pool of restored VMs, one per job;
//! - [`snapshot`]: prepared VM snapshots, restored instead of booting;
//! - [`supervisor`]: VMs kept up by `hull vm up`, relaying agent sessions;
//! - [`image`]: the guest image: recipe, cache, build;
//! - [`hyperv`]: the Hyper-V backend (Windows).
//!
//! And [`prepare`], what every run is prepared from (the project's path,
//! the resolved policy, the command's environment): here because the
//! lowest of its users are the supervisor and the pool; `hull run` uses it
//! from above.
//!
//! The floor above `hull-net` and `hull-exec`: what it may not do is know
//! a run, the other tiers or the CLI. `hull run --tier3` (`hull::tier`'s vm
//! adapter), `hull batch` and `hull vm` are in the application crate above.

pub mod accel;
#[cfg(unix)]
pub mod agent;
pub mod assemble;
#[cfg(target_os = "linux")]
pub mod batch_out;
pub mod heartbeat;
pub mod hyperv;
pub mod image;
#[cfg(unix)]
pub mod libc_needs;
#[cfg(target_os = "linux")]
pub mod machine;
#[cfg(target_os = "linux")]
pub mod net_channel;
pub mod qemu;
#[cfg(unix)]
pub mod qemu_facts;

#[cfg(target_os = "linux")]
pub mod pool;
pub mod prepare;
#[cfg(unix)]
pub mod proc;
#[cfg(unix)]
pub mod qmp;
#[cfg(target_os = "linux")]
pub mod session;
pub mod shape;
#[cfg(target_os = "linux")]
pub mod snapshot;
#[cfg(target_os = "linux")]
pub mod supervisor;
pub mod virtiofsd;

#[cfg(unix)]
use hull_exec::exec;
#[cfg(target_os = "linux")]
use hull_exec::out_dir;
#[cfg(any(target_os = "linux", not(unix)))]
use hull_exec::runtime;
#[cfg(windows)]
use hull_exec::winsec;
use hull_exec::{os, sandbox_user, settings, state, text};
#[cfg(unix)]
use hull_net as net;
use hull_policy as policy;

pub use hull_policy::lower::vm::{GUEST_GID, GUEST_UID};

// The VM tests: built with the `tier3` feature only (Cargo.toml).
#[cfg(test)]
#[cfg(feature = "tier3")]
pub(crate) mod testkit;
#[cfg(test)]
#[cfg(all(target_os = "linux", feature = "tier3"))]
mod vm_tests;
