//! The certificate authorities the host trusts, for a run with network:
//! a host may reach its registries through a TLS-inspecting gateway whose
//! authority only the host's trust store holds (corporate networks do
//! this; `update-ca-certificates` puts it in the bundle). Tier 3's
//! container has the image's own `/etc`, and some clients carry a store of
//! their own on every tier (Node's, pip's vendored certifi in a venv), so
//! hull copies the host's bundle into the run's tmp and names it to the
//! clients by their variables, unless the policy or `--env` set them.
//!
//! The tmp is the command's: the copy is made before the command starts,
//! through a descriptor of the tmp, never following a link; one that
//! exists already (a session's earlier exec made it) is left as it is.

use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

/// The host's bundle, the first of these that is a regular file (Debian
/// and Ubuntu, Fedora and RHEL, Alpine and others).
pub const HOST_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

/// The variables the clients read a bundle from: OpenSSL's (curl, git,
/// cargo, Python's ssl), Node's extra authorities, pip's, requests',
/// cargo's and git's own.
pub const VARS: &[&str] = &[
    "SSL_CERT_FILE",
    "NODE_EXTRA_CA_CERTS",
    "PIP_CERT",
    "REQUESTS_CA_BUNDLE",
    "CARGO_HTTP_CAINFO",
    "CURL_CA_BUNDLE",
    "GIT_SSL_CAINFO",
];

/// Where in the run's tmp the copy is.
pub const DIR: &str = ".hull-ca";
pub const FILE: &str = "ca-certificates.crt";

/// A bundle larger than this is not copied (the host's is a few hundred
/// KiB).
const MAX_BYTES: u64 = 16 << 20;

/// The host's bundle: its path and bytes, if one is there.
pub fn host_bundle() -> Option<(PathBuf, Vec<u8>)> {
    HOST_BUNDLES.iter().find_map(|p| {
        let f = std::fs::File::open(p).ok()?;
        let meta = f.metadata().ok()?;
        if !meta.is_file() || meta.len() > MAX_BYTES {
            return None;
        }
        let mut bytes = Vec::new();
        f.take(MAX_BYTES).read_to_end(&mut bytes).ok()?;
        Some((PathBuf::from(p), bytes))
    })
}

/// Copies the host's bundle to `tmp/.hull-ca/ca-certificates.crt` (0644,
/// its directory 0755), beneath a descriptor of `tmp`, no link followed.
/// Returns the copy's path; `None` when the host has no bundle.
#[cfg(unix)]
pub fn install(tmp: &Path) -> io::Result<Option<PathBuf>> {
    use rustix::fs::{Mode, OFlags};
    let Some((_, bytes)) = host_bundle() else {
        return Ok(None);
    };
    let dir_flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let top = rustix::fs::open(tmp, dir_flags, Mode::empty())?;
    match rustix::fs::mkdirat(&top, DIR, Mode::from_raw_mode(0o755)) {
        Ok(()) | Err(rustix::io::Errno::EXIST) => {}
        Err(e) => return Err(e.into()),
    }
    let dir = rustix::fs::openat(&top, DIR, dir_flags, Mode::empty())?;
    let path = tmp.join(DIR).join(FILE);
    let file = match rustix::fs::openat(
        &dir,
        FILE,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
    ) {
        Ok(f) => f,
        // An earlier exec of the same tmp made it.
        Err(rustix::io::Errno::EXIST) => return Ok(Some(path)),
        Err(e) => return Err(e.into()),
    };
    std::fs::File::from(file).write_all(&bytes)?;
    Ok(Some(path))
}

/// The variables naming `bundle` that `env` does not set yet.
pub fn env(bundle: &Path, env: &[(String, String)]) -> Vec<(String, String)> {
    VARS.iter()
        .filter(|v| !env.iter().any(|(k, _)| k == *v))
        .map(|v| (v.to_string(), bundle.to_string_lossy().into_owned()))
        .collect()
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    /// The copy lands beneath the tmp; a link planted where it goes is
    /// not followed (a directory link fails the copy; a file there is
    /// left as the command made it), nothing is written outside; a
    /// variable the policy set is kept.
    #[test]
    fn the_copy_lands_beneath_the_tmp_and_follows_no_link() {
        let Some((_, host)) = host_bundle() else {
            panic!("this test needs a CA bundle at one of {HOST_BUNDLES:?}");
        };
        let d = tempfile::tempdir().unwrap();
        let tmp = d.path().join("tmp");
        std::fs::create_dir(&tmp).unwrap();
        let p = install(&tmp).unwrap().unwrap();
        assert_eq!(p, tmp.join(DIR).join(FILE));
        assert_eq!(std::fs::read(&p).unwrap(), host);
        // Again: left as it is.
        std::fs::write(&p, b"theirs").unwrap();
        assert_eq!(install(&tmp).unwrap().unwrap(), p);
        assert_eq!(std::fs::read(&p).unwrap(), b"theirs");
        // A planted link, as directory or as file.
        let outside = d.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        for (i, plant) in [DIR, ""].iter().enumerate() {
            let tmp = d.path().join(format!("tmp{i}"));
            std::fs::create_dir(&tmp).unwrap();
            if plant.is_empty() {
                std::fs::create_dir(tmp.join(DIR)).unwrap();
                std::os::unix::fs::symlink(outside.join("f"), tmp.join(DIR).join(FILE)).unwrap();
            } else {
                std::os::unix::fs::symlink(&outside, tmp.join(DIR)).unwrap();
            }
            let r = install(&tmp);
            if plant.is_empty() {
                assert!(r.is_ok(), "{r:?}");
            } else {
                assert!(r.is_err(), "{r:?}");
            }
            assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
        }
        let set = env(&p, &[("PIP_CERT".into(), "/mine.pem".into())]);
        assert_eq!(set.len(), VARS.len() - 1);
        assert!(set
            .iter()
            .all(|(k, v)| k != "PIP_CERT" && *v == p.to_string_lossy()));
    }
}
