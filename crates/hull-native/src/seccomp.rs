//! The seccomp filters of the Linux process tiers: the `hull-seccomp`
//! crate, shared with the tier-3 guest agent.
pub use hull_seccomp::*;
