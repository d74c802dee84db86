//! Lowering: the resolved policy turned into what one tier's mechanism
//! enforces. Pure functions of ([`Policy`](super::Policy), [`HostFs`](super::HostFs)).

pub mod appcontainer;
pub mod bwrap;
pub mod landlock;
pub mod seatbelt;
pub mod vm;
