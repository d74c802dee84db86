//! Container images for hull: what an image reference names
//! ([`Reference`]), reading the image into a store of blobs hull checked
//! against their digests ([`source`]), and flattening its layers into one
//! tarball, whiteouts applied, without unpacking anything ([`flatten`]).
//! The tarball is then a userland like any `[vm] rootfs`: checked and
//! rewritten by the image build, entry by entry.
//!
//! Nothing here is trusted: an archive, a layout and every layer are the
//! user's and may be hostile. Every input is bounded (metadata files,
//! blobs, entries, bytes), every blob is named by the digest hull computed
//! of it, and a layer must match the digest its config names.
//!
//! A registry's image is pulled by [`registry`], through the proxy the
//! caller names (hull's, holding the run's allowlist).
//!
//! Reading a source is Linux's only so far (a layout is read with
//! `openat2`); the rest is portable, and [`TarGuard`] is what every tar
//! hull reads goes through (`[vm] rootfs` too).

pub mod flatten;
pub mod reference;
#[cfg(target_os = "linux")]
pub mod registry;
#[cfg(target_os = "linux")]
pub mod source;
pub mod tar_guard;
#[cfg(target_os = "linux")]
pub mod unpack;
#[cfg(target_os = "linux")]
pub mod user;

pub use flatten::{flatten, FlattenError, Flattened, Layer, Limits};
pub use reference::{Reference, ReferenceError};
#[cfg(target_os = "linux")]
pub use source::{read, Image, RunConfig, SourceError};
pub use tar_guard::TarGuard;
#[cfg(target_os = "linux")]
pub use unpack::{unpack, UnpackError, Unpacked};
#[cfg(target_os = "linux")]
pub use user::resolve_user;
