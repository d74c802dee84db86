//! (in progress)

pub mod image;
