//! The guest image recipe (`images/` in the repository), embedded in the `hull`
//! binary, and the image id: a hash of every recipe file.
//!
//! Embedding means an installed `hull` builds exactly the recipe it was compiled
//! with, and the id cannot drift from the files that are run. A changed recipe file
//! gives a new id, so the cache never serves an image built from other inputs.
//! The guest agent is not part of the image (see [`super::agent_disk`]). What the id does not cover: the Debian mirror's state at build time
//! (package versions are recorded in the manifest instead).

use super::hex;
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

/// The recipe of one userland: [`FILES`], with the `[vm] packages` of a
/// policy added to `packages/container.list`. No packages: the default
/// image, whose id is the hash of [`FILES`] as they are.
///
/// The packages are part of the hashed files, so each distinct list has an
/// image (and id) of its own and the build runs them exactly as hashed.
/// They are checked names ([`crate::policy::file::valid_debian_package`]):
/// nothing else can reach the build's package list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recipe {
    packages: Vec<String>,
    rootfs: Option<RootfsSource>,
}

/// A `[vm] rootfs` tarball and the sha256 of its bytes when it was checked
/// ([`super::rootfs::check`]): the digest is what the id covers.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RootfsSource {
    pub path: std::path::PathBuf,
    pub sha256: String,
}

/// The recipe file that records a rootfs's digest (hashed and written
/// like the others; `build.sh` does not read it).
const ROOTFS_DIGEST: &str = "container/rootfs.sha256";

/// The recipe file the packages are added to.
const CONTAINER_LIST: &str = "packages/container.list";

impl Recipe {
    /// The default userland's recipe.
    pub fn base() -> Recipe {
        Recipe::default()
    }

    /// The recipe with `packages` (valid Debian names) in the container;
    /// sorted and deduplicated here too, so one list has one id.
    pub fn with_packages(packages: &[String]) -> Recipe {
        let mut packages = packages.to_vec();
        packages.sort();
        packages.dedup();
        debug_assert!(packages
            .iter()
            .all(|p| crate::policy::file::valid_debian_package(p)));
        Recipe {
            packages,
            rootfs: None,
        }
    }

    /// The packages added to the default userland.
    pub fn packages(&self) -> &[String] {
        &self.packages
    }

    /// The recipe whose container is the checked tarball `rootfs` instead
    /// of the image's userland.
    pub fn with_rootfs(rootfs: RootfsSource) -> Recipe {
        Recipe {
            packages: Vec::new(),
            rootfs: Some(rootfs),
        }
    }

    /// The recipe a built image's manifest says it was built from (its id
    /// is the image's when this hull's recipe built it).
    pub fn of_image(m: &super::Manifest) -> Recipe {
        match &m.rootfs {
            Some(r) => Recipe::with_rootfs(r.clone()),
            None => Recipe::with_packages(&m.packages),
        }
    }

    /// The tarball the container comes from, when not the image's.
    pub fn rootfs(&self) -> Option<&RootfsSource> {
        self.rootfs.as_ref()
    }

    /// What the container holds, for messages: `the [vm] packages a, b`,
    /// `the [vm] rootfs PATH`, or `the default userland`.
    pub fn userland(&self) -> String {
        match (&self.rootfs, self.packages.is_empty()) {
            (Some(r), _) => format!("the [vm] rootfs {}", r.path.display()),
            (None, false) => format!("the [vm] packages {}", self.packages.join(", ")),
            (None, true) => "the default userland".into(),
        }
    }

    /// Each file's path, bytes and executable bit, sorted by path.
    fn files(
        &self,
    ) -> impl Iterator<Item = (&'static str, std::borrow::Cow<'static, [u8]>, bool)> + '_ {
        FILES
            .iter()
            .map(move |f| {
                let bytes = if f.path == CONTAINER_LIST && !self.packages.is_empty() {
                    let mut b = f.bytes.to_vec();
                    if !b.ends_with(b"\n") {
                        b.push(b'\n');
                    }
                    b.extend_from_slice(b"# [vm] packages of the policy\n");
                    for p in &self.packages {
                        b.extend_from_slice(p.as_bytes());
                        b.push(b'\n');
                    }
                    std::borrow::Cow::Owned(b)
                } else {
                    std::borrow::Cow::Borrowed(f.bytes)
                };
                (f.path, bytes, f.executable)
            })
            .chain(self.rootfs.iter().map(|r| {
                (
                    ROOTFS_DIGEST,
                    std::borrow::Cow::Owned(format!("{}\n", r.sha256).into_bytes()),
                    false,
                )
            }))
    }

    /// The full sha256 (hex) of the recipe files.
    pub fn hash(&self) -> String {
        let mut h = Sha256::new();
        h.update(ID_DOMAIN);
        for (path, bytes, executable) in self.files() {
            h.update(path.as_bytes());
            h.update([0u8, u8::from(executable)]);
            h.update((bytes.len() as u64).to_le_bytes());
            h.update(&bytes);
        }
        hex(&h.finalize())
    }

    /// The id of the image this recipe builds: the first [`ID_LEN`] hex
    /// digits of [`Recipe::hash`].
    pub fn id(&self) -> String {
        let mut h = self.hash();
        h.truncate(ID_LEN);
        h
    }

    /// Write the recipe into `dir` (created), scripts executable.
    pub fn materialise(&self, dir: &Path) -> io::Result<()> {
        for (path, bytes, executable) in self.files() {
            let dest = dir.join(path);
            if let Some(parent) = dest.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&dest, &bytes)?;
            #[cfg(not(unix))]
            let _ = executable;
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                let mode = if executable { 0o755 } else { 0o644 };
                std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(mode))?;
            }
        }
        Ok(())
    }
}

/// The full sha256 (hex) of the default recipe.
pub fn image_hash() -> String {
    Recipe::base().hash()
}

/// The id of the default image: the first [`ID_LEN`] hex digits of [`image_hash`].
pub fn image_id() -> String {
    Recipe::base().id()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_recipe_file_is_embedded_and_sorted() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../images");
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

    /// A rootfs gives an id of its own per digest, recorded in the recipe.
    #[test]
    fn a_rootfs_makes_a_recipe_of_its_own_per_digest() {
        let r = |sha: &str| {
            Recipe::with_rootfs(RootfsSource {
                path: "/x/rootfs.tar".into(),
                sha256: sha.into(),
            })
        };
        let (a, b) = (r(&"a".repeat(64)), r(&"b".repeat(64)));
        assert_ne!(a.id(), b.id());
        assert_ne!(a.id(), image_id());
        assert_eq!(a.id(), r(&"a".repeat(64)).id());
        let dir = tempfile::tempdir().unwrap();
        a.materialise(dir.path()).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join(ROOTFS_DIGEST)).unwrap(),
            format!("{}\n", "a".repeat(64))
        );
        assert_eq!(a.userland(), "the [vm] rootfs /x/rootfs.tar");
    }

    /// Packages give another id, whatever their order or repeats, and
    /// reach the container's list as written; no packages is the default.
    #[test]
    fn packages_make_a_recipe_of_their_own() {
        let base = Recipe::base();
        assert_eq!(Recipe::with_packages(&[]), base);
        assert_eq!(Recipe::with_packages(&[]).id(), image_id());
        let a = Recipe::with_packages(&["nodejs".into(), "npm".into()]);
        let b = Recipe::with_packages(&["npm".into(), "nodejs".into(), "npm".into()]);
        let c = Recipe::with_packages(&["nodejs".into()]);
        assert_eq!(a.id(), b.id());
        assert_ne!(a.id(), base.id());
        assert_ne!(a.id(), c.id());
        assert_eq!(a.packages(), ["nodejs", "npm"]);
        let dir = tempfile::tempdir().unwrap();
        a.materialise(dir.path()).unwrap();
        let list = std::fs::read_to_string(dir.path().join(CONTAINER_LIST)).unwrap();
        let base_list = FILES.iter().find(|f| f.path == CONTAINER_LIST).unwrap();
        assert!(list.starts_with(std::str::from_utf8(base_list.bytes).unwrap()));
        assert!(
            list.ends_with("# [vm] packages of the policy\nnodejs\nnpm\n"),
            "{list}"
        );
    }

    #[test]
    fn materialise_writes_every_file_with_its_mode() {
        let dir = tempfile::tempdir().unwrap();
        Recipe::base().materialise(dir.path()).unwrap();
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
