//! The guest image recipe (`images/` in the repository), embedded in the `hull`
//! binary, and the image id: a hash of every recipe file.
//!
//! Embedding means an installed `hull` builds exactly the recipe it was compiled
//! with, and the id cannot drift from the files that are run. A changed recipe file
//! gives a new id, so the cache never serves an image built from other inputs.
//! The guest agent is not part of the image (see [`super::agent_disk`]). What the id does not cover: the Debian mirror's state at build time
//! (package versions are recorded in the manifest instead).

use std::io;
use std::path::Path;

use sha2::{Digest, Sha256};

/// One recipe file: its path under `images/`, its bytes, and whether it is run.
#[derive(Debug, Clone, Copy)]
pub struct RecipeFile {
    pub path: &'static str,
    pub bytes: &'static [u8],
    pub executable: bool,
}

macro_rules! recipe {
    ($( $path:literal => $exec:literal ),* $(,)?) => {
        &[ $( RecipeFile {
            path: $path,
            bytes: include_bytes!(concat!("../../../../images/", $path)),
            executable: $exec,
        }, )* ]
    };
}

/// Every file of the recipe, sorted by path. `images/README.md` is documentation
/// and not part of it (a test checks that nothing else is left out).
pub const FILES: &[RecipeFile] = recipe! {
    "apt-mirror.sh" => false,
    "build.sh" => true,
    "guest/hull-init" => true,
    "guest/hull-prepare" => true,
    "guest/metadata.yaml" => false,
    "guest/preseed.yaml" => false,
    "hooks/container-customize" => true,
    "hooks/guest-download" => true,
    "initrd/init" => true,
    "packages/container.list" => false,
    "packages/guest.list" => false,
};

/// Bumped when the meaning of the id changes (hash layout, cache layout).
const ID_DOMAIN: &[u8] = b"hull-image-id-v2\0";

/// Hex characters of the sha256 used as the image id (64 bits).
pub const ID_LEN: usize = 16;

/// The full sha256 (hex) of the recipe files.
pub fn image_hash() -> String {
    let mut h = Sha256::new();
    h.update(ID_DOMAIN);
    for f in FILES {
        h.update(f.path.as_bytes());
        h.update([0u8, u8::from(f.executable)]);
        h.update((f.bytes.len() as u64).to_le_bytes());
        h.update(f.bytes);
    }
    hex(&h.finalize())
}

/// The id of the image this recipe builds: the first [`ID_LEN`] hex digits of [`image_hash`].
pub fn image_id() -> String {
    let mut h = image_hash();
    h.truncate(ID_LEN);
    h
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// Write the recipe into `dir` (created), scripts executable.
pub fn materialise(dir: &Path) -> io::Result<()> {
    for f in FILES {
        let dest = dir.join(f.path);
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&dest, f.bytes)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = if f.executable { 0o755 } else { 0o644 };
            std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(mode))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_recipe_file_is_embedded_and_sorted() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../images");
        let mut on_disk = Vec::new();
        fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
            for e in std::fs::read_dir(dir).unwrap() {
                let e = e.unwrap();
                let p = e.path();
                if e.file_type().unwrap().is_dir() {
                    walk(root, &p, out);
                } else {
                    let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
                    if rel != "README.md" {
                        out.push(rel);
                    }
                }
            }
        }
        walk(&root, &root, &mut on_disk);
        on_disk.sort();
        let embedded: Vec<String> = FILES.iter().map(|f| f.path.to_owned()).collect();
        assert_eq!(embedded, on_disk, "images/ and recipe::FILES differ");
        #[cfg(unix)]
        for f in FILES {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(root.join(f.path))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(
                mode & 0o111 != 0,
                f.executable,
                "{}: executable bit",
                f.path
            );
        }
    }

    #[test]
    fn the_id_is_a_stable_prefix_of_the_recipe_hash() {
        let a = image_id();
        assert_eq!(a.len(), ID_LEN);
        assert_eq!(a, image_id());
        assert!(image_hash().starts_with(&a));
        assert!(a.bytes().all(|b| b.is_ascii_hexdigit()));
    }

    #[test]
    fn materialise_writes_every_file_with_its_mode() {
        let dir = tempfile::tempdir().unwrap();
        materialise(dir.path()).unwrap();
        for f in FILES {
            let got = std::fs::read(dir.path().join(f.path)).unwrap();
            assert_eq!(got, f.bytes, "{}", f.path);
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                let mode = std::fs::metadata(dir.path().join(f.path))
                    .unwrap()
                    .permissions()
                    .mode();
                assert_eq!(mode & 0o777, if f.executable { 0o755 } else { 0o644 });
            }
        }
    }

    /// The image's Debian mirror comes from the host's apt sources: the
    /// first enabled `deb` source serving the suite, deb822 before one-line
    /// files, trailing slash dropped, nothing when none serves it.
    #[cfg(unix)]
    #[test]
    fn the_mirror_is_read_from_the_hosts_apt_sources() {
        let f = FILES.iter().find(|f| f.path == "apt-mirror.sh").unwrap();
        let d = tempfile::tempdir().unwrap();
        let lib = d.path().join("apt-mirror.sh");
        std::fs::write(&lib, f.bytes).unwrap();
        let etc = d.path().join("apt");
        std::fs::create_dir_all(etc.join("sources.list.d")).unwrap();
        std::fs::write(
            etc.join("sources.list.d/a.sources"),
            "Types: deb-src\nURIs: http://src.invalid/debian\nSuites: bookworm\n\n\
             Types: deb\nURIs: http://off.invalid/debian\nSuites: bookworm\nEnabled: no\n\n\
             # a comment\nTypes: deb\nURIs: http://mirror.invalid/debian/\n\
             Suites: bookworm bookworm-updates\nComponents: main\n",
        )
        .unwrap();
        std::fs::write(
            etc.join("sources.list"),
            "# deb http://old.invalid/debian bookworm-security main\n\
             deb [signed-by=/k.gpg arch=amd64] http://sec.invalid/debian-security bookworm-security main\n",
        )
        .unwrap();
        let uri = |suite: &str| {
            let o = std::process::Command::new("bash")
                .arg("-c")
                .arg(format!(". '{}'; host_apt_uri {suite}", lib.display()))
                .env("APT_ETC", &etc)
                .output()
                .unwrap();
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            String::from_utf8(o.stdout).unwrap()
        };
        assert_eq!(uri("bookworm"), "http://mirror.invalid/debian\n");
        assert_eq!(uri("bookworm-updates"), "http://mirror.invalid/debian\n");
        assert_eq!(
            uri("bookworm-security"),
            "http://sec.invalid/debian-security\n"
        );
        assert_eq!(uri("trixie"), "");
    }
}
