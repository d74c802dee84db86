//! (in progress)

pub mod hyperv;
