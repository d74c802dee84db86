//! Sealed memfds: bytes hull hands a helper or a child (a plan, an
//! environment) through a descriptor instead of a command line or a file.

use std::os::fd::OwnedFd;

/// A memfd holding `bytes`, sealed against every change (write, grow,
/// shrink, further seals) and positioned at its start: what a helper reads
/// from it is what hull wrote, whoever else holds it.
pub fn sealed(name: &str, bytes: &[u8]) -> std::io::Result<OwnedFd> {
    use rustix::fs::{fcntl_add_seals, memfd_create, MemfdFlags, SealFlags};
    let fd = memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
        .map_err(std::io::Error::from)?;
    let mut f = std::fs::File::from(fd);
    std::io::Write::write_all(&mut f, bytes)?;
    std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(0))?;
    fcntl_add_seals(
        &f,
        SealFlags::WRITE | SealFlags::GROW | SealFlags::SHRINK | SealFlags::SEAL,
    )
    .map_err(std::io::Error::from)?;
    Ok(OwnedFd::from(f))
}
