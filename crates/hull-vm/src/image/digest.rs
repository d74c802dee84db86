//! The digests of an image's files, recorded in its manifest at build time
//! and checked before a VM uses them.
//!
//! The root disk is a 12 GiB sparse file with about a tenth of it written,
//! so the digest is one a hole costs nothing to compute: the sha256 of the
//! file's length followed by the sha256 of every 1 MiB chunk, where a chunk
//! that lies wholly in a hole (`SEEK_DATA`) is known to be zeros. It depends
//! only on the bytes, not on where the holes are.
//!
//! Hashing the disk takes seconds, so it is done once per file state: after
//! a check passes, `verified.json` beside the manifest records each file's
//! inode, size, mtime and ctime, and a later open whose stamps all match
//! skips the hashing. Any change to a file's content changes its ctime, which
//! no process can set back, so a file changed after its check is hashed again
//! and refused.

use super::hex;
use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Chunk size of the digest.
const CHUNK: u64 = 1 << 20;
/// The record of files checked since they last changed.
pub const VERIFIED_FILE: &str = "verified.json";

/// What the manifest records of one file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileDigest {
    pub size: u64,
    /// See the module comment: sha256 of the length and of every 1 MiB chunk's sha256.
    pub chunked_sha256: String,
}

/// When a file was last found to match its digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

#[cfg(unix)]
fn stamp(f: &File) -> io::Result<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let m = f.metadata()?;
    Ok(Stamp {
        dev: m.dev(),
        ino: m.ino(),
        size: m.size(),
        mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
        ctime_ns: i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec()),
    })
}

/// Elsewhere nothing like ctime exists: a stamp that never matches, so
/// every open hashes.
#[cfg(not(unix))]
fn stamp(_f: &File) -> io::Result<Stamp> {
    Ok(Stamp {
        dev: u64::MAX,
        ino: u64::MAX,
        size: u64::MAX,
        mtime_ns: -1,
        ctime_ns: -1,
    })
}

/// The digest of the open file `f`.
pub fn digest(f: &mut File) -> io::Result<FileDigest> {
    let size = f.metadata()?.len();
    let mut outer = Sha256::new();
    outer.update(size.to_le_bytes());
    let zero_chunk = Sha256::digest(vec![0u8; CHUNK as usize]);
    let mut buf = vec![0u8; CHUNK as usize];
    let mut data = DataFinder::default();
    let mut off = 0u64;
    while off < size {
        let len = CHUNK.min(size - off);
        let hole = !data.any_in(f, off, len)?;
        if hole && len == CHUNK {
            outer.update(zero_chunk);
        } else if hole {
            outer.update(Sha256::digest(vec![0u8; len as usize]));
        } else {
            let b = &mut buf[..len as usize];
            read_at(f, b, off)?;
            outer.update(Sha256::digest(&*b));
        }
        off += len;
    }
    Ok(FileDigest {
        size,
        chunked_sha256: hex(&outer.finalize()),
    })
}

/// Where the next data (not a hole) starts, found with `SEEK_DATA`.
#[derive(Default)]
struct DataFinder {
    /// `Some(d)`: data at `d`; `None`: none after the last search.
    next: Option<Option<u64>>,
}

impl DataFinder {
    /// Whether `[off, off + len)` may hold data.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    fn any_in(&mut self, f: &File, off: u64, len: u64) -> io::Result<bool> {
        use rustix::fs::{seek, SeekFrom};
        let stale = match self.next {
            None => true,
            Some(Some(d)) => d < off,
            Some(None) => false,
        };
        if stale {
            self.next = Some(match seek(f, SeekFrom::Data(off)) {
                Ok(d) => Some(d),
                // ENXIO: no data at or after `off`.
                Err(rustix::io::Errno::NXIO) => None,
                Err(e) => return Err(e.into()),
            });
        }
        Ok(matches!(self.next, Some(Some(d)) if d < off + len))
    }

    /// Without `SEEK_DATA` every chunk is read.
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    fn any_in(&mut self, _f: &File, _off: u64, _len: u64) -> io::Result<bool> {
        let _ = self.next;
        Ok(true)
    }
}

#[cfg(unix)]
fn read_at(f: &File, buf: &mut [u8], off: u64) -> io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(f, buf, off)
}

#[cfg(not(unix))]
fn read_at(f: &mut File, buf: &mut [u8], off: u64) -> io::Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    f.seek(SeekFrom::Start(off))?;
    f.read_exact(buf)
}

/// Why an image's file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DigestError {
    #[error("{name}: {source}")]
    Io {
        name: String,
        #[source]
        source: io::Error,
    },
    #[error("{name} does not match the digest in the manifest (it changed after the build)")]
    Mismatch { name: String },
    #[error("the manifest records no digest of {name}")]
    Unrecorded { name: String },
}

/// The digests of `names` in `dir`, for a new manifest; records them as
/// checked.
pub fn compute(dir: &Path, names: &[&str]) -> Result<BTreeMap<String, FileDigest>, DigestError> {
    let mut out = BTreeMap::new();
    let mut verified = BTreeMap::new();
    for name in names {
        let io = |source| DigestError::Io {
            name: name.to_string(),
            source,
        };
        let mut f = File::open(dir.join(name)).map_err(io)?;
        out.insert(name.to_string(), digest(&mut f).map_err(io)?);
        verified.insert(name.to_string(), stamp(&f).map_err(io)?);
    }
    write_verified(dir, &verified);
    Ok(out)
}

/// Checks every file `names` in `dir` against `digests`: by its stamp when
/// it is unchanged since its last check, else by hashing it again.
pub fn check(
    dir: &Path,
    names: &[&str],
    digests: &BTreeMap<String, FileDigest>,
) -> Result<(), DigestError> {
    let mut verified = read_verified(dir);
    let mut changed = false;
    for name in names {
        let io = |source| DigestError::Io {
            name: name.to_string(),
            source,
        };
        let want = digests.get(*name).ok_or_else(|| DigestError::Unrecorded {
            name: name.to_string(),
        })?;
        let mut f = File::open(dir.join(name)).map_err(io)?;
        let now = stamp(&f).map_err(io)?;
        if verified.get(*name) == Some(&now) && now.size == want.size {
            continue;
        }
        if now.size != want.size || digest(&mut f).map_err(io)? != *want {
            return Err(DigestError::Mismatch {
                name: name.to_string(),
            });
        }
        verified.insert(name.to_string(), now);
        changed = true;
    }
    if changed {
        write_verified(dir, &verified);
    }
    Ok(())
}

fn read_verified(dir: &Path) -> BTreeMap<String, Stamp> {
    match crate::image::private_dir::read_in(dir, VERIFIED_FILE, 1 << 16) {
        Ok(Some(text)) => serde_json::from_slice(&text).unwrap_or_default(),
        _ => BTreeMap::new(),
    }
}

/// Best effort: without the record the next open hashes again.
fn write_verified(dir: &Path, v: &BTreeMap<String, Stamp>) {
    let Ok(bytes) = serde_json::to_vec(v) else {
        return;
    };
    let _ = crate::image::private_dir::replace_in(dir, VERIFIED_FILE, &bytes);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Seek, SeekFrom, Write};

    #[test]
    fn holes_and_written_zeros_digest_alike() {
        let t = tempfile::tempdir().unwrap();
        let sparse = t.path().join("sparse");
        let dense = t.path().join("dense");
        let mut f = File::create(&sparse).unwrap();
        f.seek(SeekFrom::Start(5 * CHUNK + 17)).unwrap();
        f.write_all(b"data").unwrap();
        f.set_len(9 * CHUNK + 3).unwrap();
        let mut d = vec![0u8; (9 * CHUNK + 3) as usize];
        d[(5 * CHUNK + 17) as usize..][..4].copy_from_slice(b"data");
        std::fs::write(&dense, &d).unwrap();
        let a = digest(&mut File::open(&sparse).unwrap()).unwrap();
        let b = digest(&mut File::open(&dense).unwrap()).unwrap();
        assert_eq!(a, b);
        d[3] = 1;
        std::fs::write(&dense, &d).unwrap();
        assert_ne!(a, digest(&mut File::open(&dense).unwrap()).unwrap());
    }

    #[test]
    fn a_file_changed_after_its_check_is_refused() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("disk.raw"), b"original").unwrap();
        let digests = compute(t.path(), &["disk.raw"]).unwrap();
        check(t.path(), &["disk.raw"], &digests).unwrap();
        // Same size, same mtime set back: the ctime still gives it away.
        let p = t.path().join("disk.raw");
        let mtime = std::fs::metadata(&p).unwrap().modified().unwrap();
        std::fs::write(&p, b"tampered").unwrap();
        File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        let e = check(t.path(), &["disk.raw"], &digests).unwrap_err();
        assert!(matches!(e, DigestError::Mismatch { .. }), "{e}");
        // Restored bytes pass again (by hashing).
        std::fs::write(&p, b"original").unwrap();
        check(t.path(), &["disk.raw"], &digests).unwrap();
        assert!(matches!(
            check(t.path(), &["vmlinux"], &digests).unwrap_err(),
            DigestError::Unrecorded { .. }
        ));
    }
}
