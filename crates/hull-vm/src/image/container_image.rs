//! `hull run --image REF`, `[vm] image`: a container image as the
//! container's userland. The image is read once per version of its source
//! into the cache (`hull-oci`: every blob checked against its digest), its
//! layers flattened into one tarball there, and that tarball is then a
//! `[vm] rootfs` like any other: checked and rewritten entry by entry by
//! the image build, prepared and snapshotted once per content.
//!
//! Everything lives in the private image cache: `oci-blobs/` (the blobs
//! while an import runs; removed once the image is flattened) and
//! `oci-rootfs/<manifest-hex>.tar` with `<manifest-hex>.json` (the image's
//! config: its environment, user, working directory, command). The record
//! `oci-sources.json` maps a reference and its source file's device, inode,
//! size and times to the manifest it held, so a later run reads nothing
//! again.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;

use super::{Cache, ImageError};

const BLOBS: &str = "oci-blobs";
const ROOTFS: &str = "oci-rootfs";
const SOURCES: &str = "oci-sources.json";
const TREES: &str = "oci-trees";
const LOCK: &str = "oci.lock";
/// The most references the record remembers.
const MAX_SOURCES: usize = 256;

/// A container image made a userland tarball.
#[derive(Debug, Clone)]
pub struct Imported {
    /// The digest that names its content (`sha256:...`).
    pub digest: String,
    /// The flattened tarball, in the cache.
    pub rootfs: PathBuf,
    /// What a container of it runs by default.
    pub config: hull_oci::RunConfig,
}

fn oci_err(reference: &str, e: impl std::fmt::Display) -> ImageError {
    ImageError::ContainerImage {
        reference: reference.to_string(),
        why: e.to_string(),
    }
}

/// The userland tarball of the image `reference` names, imported into
/// `cache` when it is not there yet (`on`: what is being done, for
/// progress). A registry's image is refused: [`import_with_network`]
/// pulls it.
pub fn import(
    cache: &Cache,
    reference: &str,
    on: &mut dyn FnMut(&str),
) -> Result<Imported, ImageError> {
    import_with_network(
        cache,
        reference,
        &crate::policy::net::NetPolicy::default(),
        on,
    )
}

/// [`import`], a registry's image pulled through hull's proxy holding
/// `net` (the run's network policy: the registry's host, its token service
/// and wherever it sends a blob must be allowed there), with the caller's
/// credentials for it ([`hull_oci::registry::credentials`]).
pub fn import_with_network(
    cache: &Cache,
    reference: &str,
    net: &crate::policy::net::NetPolicy,
    on: &mut dyn FnMut(&str),
) -> Result<Imported, ImageError> {
    let parsed: hull_oci::Reference = reference.parse().map_err(|e| oci_err(reference, e))?;
    let dir = cache.open_private()?;
    let io = |what: &'static str| ImageError::io(cache.root(), what);
    let rootfs_fd = dir
        .subdir(ROOTFS)
        .map_err(io("open the imported images of"))?;
    let rootfs_dir = cache.root().join(ROOTFS);
    let stamp = source_stamp(&parsed);
    let key = parsed.to_string();
    let known = |dir: &super::private_dir::PrivateDir| -> BTreeMap<String, (String, String)> {
        dir.read(SOURCES, 1 << 20)
            .ok()
            .flatten()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    };
    let found = |digest: &str| -> Option<Imported> {
        let hex = digest.trim_start_matches("sha256:");
        // Its last use, for eviction (least recently used first), on its
        // record: the tarball's own times name its version to the rootfs
        // digest's record, which would then read it again.
        let _ = rustix::fs::utimensat(
            &rootfs_fd,
            format!("{hex}.json").as_str(),
            &rustix::fs::Timestamps {
                last_access: now_spec(),
                last_modification: now_spec(),
            },
            rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
        );
        let config = super::private_dir::read_in(&rootfs_dir, &format!("{hex}.json"), 1 << 20)
            .ok()
            .flatten()
            .and_then(|b| serde_json::from_slice(&b).ok())?;
        let tar = format!("{hex}.tar");
        let st = rustix::fs::statat(
            &rootfs_fd,
            tar.as_str(),
            rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
        )
        .ok()?;
        (rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::RegularFile).then(
            || Imported {
                digest: digest.to_string(),
                rootfs: rootfs_dir.join(tar),
                config,
            },
        )
    };
    if let hull_oci::Reference::Imported(digest) = &parsed {
        return found(digest).ok_or_else(|| {
            oci_err(
                reference,
                "no image of that digest is in the image cache (`hull image list` shows \
                 what is; `hull image import REF` reads one)",
            )
        });
    }
    // A pull's way out: hull's proxy with the run's allowlist, checked for
    // the registry's host before anything is sent.
    let pulling = match &parsed {
        hull_oci::Reference::Registry { host, .. } => Some(pull_access(reference, host, net)?),
        _ => None,
    };
    if let (Some(stamp), Some((was, digest))) = (&stamp, known(&dir).get(&key)) {
        if was == stamp {
            if let Some(i) = found(digest) {
                return Ok(i);
            }
        }
    }
    // One import at a time: the blob store is shared.
    let lock = dir.open_lock(LOCK).map_err(io("open the import lock of"))?;
    lock.lock().map_err(io("lock the imports of"))?;
    let blobs_fd = dir.subdir(BLOBS).map_err(io("open the image blobs of"))?;
    let blobs = cache.root().join(BLOBS);
    on(&format!("reading {reference}"));
    let read = match &pulling {
        Some((access, _proxy)) => hull_oci::registry::pull(
            &parsed,
            &blobs,
            &blobs_fd,
            super::rootfs::MAX_TARBALL,
            access,
            &|d| found(d).is_some(),
        )
        .map(|p| match p {
            hull_oci::registry::Pulled::Have(d) => Err(d),
            hull_oci::registry::Pulled::Read(image) => Ok(image),
        }),
        None => hull_oci::read(&parsed, &blobs, &blobs_fd, super::rootfs::MAX_TARBALL).map(Ok),
    };
    // What the proxy refused, for the error (a redirect or a token
    // service the allowlist does not have).
    let proxy_refused = pulling
        .as_ref()
        .map(|(_, p)| p.audit().refused_lines())
        .unwrap_or_default();
    drop(pulling);
    let image = match read {
        Ok(Ok(image)) => image,
        // The registry's manifest is one imported already.
        Ok(Err(digest)) => {
            empty_store(&blobs_fd);
            drop(lock);
            return found(&digest).ok_or_else(|| oci_err(reference, "the imported image is gone"));
        }
        Err(e) => {
            empty_store(&blobs_fd);
            let mut why = hull_protocol::error_chain(&e);
            for line in proxy_refused {
                why.push_str(&format!("; {line}"));
            }
            return Err(ImageError::ContainerImageRead { why });
        }
    };
    let hex = image.digest.trim_start_matches("sha256:").to_string();
    if found(&image.digest).is_none() {
        on(&format!(
            "flattening {} layer(s) of {reference}",
            image.layers.len()
        ));
        let part = format!(".{hex}.tar.part");
        let f = rustix::fs::openat(
            &rootfs_fd,
            part.as_str(),
            rustix::fs::OFlags::CREATE
                | rustix::fs::OFlags::TRUNC
                | rustix::fs::OFlags::WRONLY
                | rustix::fs::OFlags::NOFOLLOW
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::from_raw_mode(0o600),
        )
        .map_err(|e| io("write the flattened image into")(e.into()))?;
        let mut out = std::io::BufWriter::new(std::fs::File::from(f));
        let limits = hull_oci::Limits {
            entries: super::rootfs::MAX_ENTRIES,
            bytes: super::rootfs::MAX_UNPACKED,
        };
        let flattened = hull_oci::flatten(&image.layers, limits, &mut out);
        let written = out
            .into_inner()
            .map_err(|e| e.into_error())
            .and_then(|f| f.sync_all());
        if let Err(e) = flattened {
            let _ = rustix::fs::unlinkat(&rootfs_fd, part.as_str(), rustix::fs::AtFlags::empty());
            empty_store(&blobs_fd);
            return Err(oci_err(reference, hull_protocol::error_chain(&e)));
        }
        written.map_err(io("write the flattened image into"))?;
        let record = ConfigRecord {
            source: reference,
            imported_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            ..ConfigRecord::from(&image.config)
        };
        let config = serde_json::to_vec(&record).map_err(|e| oci_err(reference, e))?;
        super::private_dir::replace_in(&rootfs_dir, &format!("{hex}.json"), &config)
            .map_err(io("record the image's config in"))?;
        rustix::fs::renameat(
            &rootfs_fd,
            part.as_str(),
            &rootfs_fd,
            format!("{hex}.tar").as_str(),
        )
        .map_err(|e| io("write the flattened image into")(e.into()))?;
    }
    empty_store(&blobs_fd);
    if let Some(stamp) = stamp {
        let mut sources = known(&dir);
        if sources.len() >= MAX_SOURCES {
            sources.clear();
        }
        sources.insert(key, (stamp, image.digest.clone()));
        if let Ok(b) = serde_json::to_vec(&sources) {
            if let Err(e) = dir.replace(SOURCES, &b) {
                tracing::warn!("image cache: cannot record the image's source: {e}");
            }
        }
    }
    drop(lock);
    found(&image.digest).ok_or_else(|| oci_err(reference, "the flattened image is gone"))
}

/// How a pull of the registry image `reference` at `host` reaches it:
/// refused unless `net` allows the host (its name, port and, for an
/// address written in the reference, the address); else through a proxy
/// of hull's holding `net`, serving this pull only (stopped when the
/// returned proxy is dropped).
fn pull_access(
    reference: &str,
    host: &str,
    net: &crate::policy::net::NetPolicy,
) -> Result<(hull_oci::registry::Access, crate::net::Proxy), ImageError> {
    use hull_oci::registry;
    let name = registry::host_name(host);
    let port = registry::host_port(host);
    let refused = |e: crate::policy::net::Refusal| {
        oci_err(
            reference,
            format!(
                "pulling it is refused by the policy's network: {e}{}",
                e.allow_with(port)
                    .map(|a| format!(" (to allow it: {a})"))
                    .unwrap_or_default()
            ),
        )
    };
    net.check_request(name, port).map_err(refused)?;
    if let Ok(addr) = name.parse::<std::net::IpAddr>() {
        net.check_address(addr).map_err(refused)?;
    }
    let credentials = registry::credentials(host, &|k| std::env::var_os(k))
        .map_err(|why| oci_err(reference, why))?;
    let io = |what: &'static str| {
        move |e: std::io::Error| oci_err(reference, format!("cannot {what}: {e}"))
    };
    // On loopback, where any process of the host may connect: a key of
    // this pull's only, so no other (a sandboxed command of another run
    // among them) reaches what this policy allows through it.
    let key = {
        let mut b = [0u8; 16];
        std::io::Read::read_exact(
            &mut std::fs::File::open("/dev/urandom").map_err(io("read a key for its proxy"))?,
            &mut b,
        )
        .map_err(io("read a key for its proxy"))?;
        b.iter().map(|x| format!("{x:02x}")).collect::<String>()
    };
    let listener =
        std::net::TcpListener::bind(("127.0.0.1", 0)).map_err(io("listen for its proxy"))?;
    let addr = listener.local_addr().map_err(io("listen for its proxy"))?;
    let proxy = crate::net::Proxy::start(
        crate::net::Listener::Tcp(listener),
        crate::net::Shared {
            policy: net.clone(),
            audit: crate::net::Audit::in_memory(),
            key: Some(key.clone()),
        },
    )
    .map_err(io("start its proxy"))?;
    Ok((
        registry::Access {
            proxy: Some(format!("http://{addr}")),
            proxy_key: Some(key),
            credentials,
        },
        proxy,
    ))
}

/// The image unpacked into a directory tree of the cache: a bwrap
/// sandbox's `/` (`hull run --tier bwrap --image REF`). Made once per image
/// (the imports' lock held), by [`hull_oci::unpack`] relative to held
/// descriptors, first under a name of its own, then renamed to the
/// image's digest: a tree with that name is whole. Removed with the image
/// (`hull image rm`, eviction), never while a run holds it: the tree comes
/// with a shared lock the run keeps until it ends.
pub fn tree(cache: &Cache, image: &Imported, on: &mut dyn FnMut(&str)) -> Result<Tree, ImageError> {
    use rustix::fs::{AtFlags, FileType, Mode, OFlags};
    let hex = image.digest.trim_start_matches("sha256:").to_string();
    let dir = cache.open_private()?;
    let io = |what: &'static str| ImageError::io(cache.root(), what);
    let in_use = dir
        .open_lock(&tree_lock(&hex))
        .map_err(io("open a tree's lock in"))?;
    in_use.lock_shared().map_err(io("lock a tree in"))?;
    let trees = dir
        .subdir(TREES)
        .map_err(io("open the unpacked images of"))?;
    let path = Tree {
        path: cache.root().join(TREES).join(&hex),
        in_use,
    };
    let whole = |trees: &OwnedFd| {
        rustix::fs::statat(trees, hex.as_str(), AtFlags::SYMLINK_NOFOLLOW)
            .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Directory)
    };
    if whole(&trees) {
        return Ok(path);
    }
    let lock = dir.open_lock(LOCK).map_err(io("open the import lock of"))?;
    lock.lock().map_err(io("lock the imports of"))?;
    if whole(&trees) {
        return Ok(path);
    }
    on(&format!("unpacking {} for the sandbox's /", image.digest));
    let part = format!(".{hex}.part");
    let part_os = std::ffi::OsStr::new(&part);
    // What a run that died while unpacking left (the lock is ours now).
    hull_oci::unpack::remove_at(&trees, part_os).map_err(io("remove a partial tree in"))?;
    rustix::fs::mkdirat(&trees, part.as_str(), Mode::from_raw_mode(0o700))
        .map_err(|e| io("make a tree in")(e.into()))?;
    let root = rustix::fs::openat(
        &trees,
        part.as_str(),
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io("open a tree in")(e.into()))?;
    let rootfs_fd = dir
        .subdir(ROOTFS)
        .map_err(io("open the imported images of"))?;
    let tar = rustix::fs::openat(
        &rootfs_fd,
        format!("{hex}.tar").as_str(),
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io("open the flattened image in")(e.into()))?;
    let limits = hull_oci::Limits {
        entries: super::rootfs::MAX_ENTRIES,
        bytes: super::rootfs::MAX_UNPACKED,
    };
    let unpacked = hull_oci::unpack(
        std::io::BufReader::new(std::fs::File::from(tar)),
        root,
        limits,
    );
    let unpacked = match unpacked {
        Ok(u) => u,
        Err(e) => {
            let _ = hull_oci::unpack::remove_at(&trees, part_os);
            return Err(oci_err(&image.digest, hull_protocol::error_chain(&e)));
        }
    };
    tracing::debug!(
        entries = unpacked.entries,
        bytes = unpacked.bytes,
        skipped = unpacked.skipped,
        "image unpacked"
    );
    rustix::fs::renameat(&trees, part.as_str(), &trees, hex.as_str())
        .map_err(|e| io("name the unpacked image in")(e.into()))?;
    Ok(path)
}

/// An unpacked image in use: removal waits for its lock.
#[derive(Debug)]
pub struct Tree {
    pub path: PathBuf,
    /// Held shared while a run uses the tree.
    pub in_use: std::fs::File,
}

/// The lock file of the tree of `hex` (in the cache's root; never removed,
/// so a run and a removal always lock the same file).
fn tree_lock(hex: &str) -> String {
    format!("oci-tree-{hex}.lock")
}

/// The config as hull keeps it beside the tarball, with where the image
/// came from and when.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "PascalCase")]
struct ConfigRecord<'a> {
    env: &'a Option<Vec<String>>,
    entrypoint: &'a Option<Vec<String>>,
    cmd: &'a Option<Vec<String>>,
    working_dir: &'a Option<String>,
    user: &'a Option<String>,
    source: &'a str,
    imported_unix: u64,
}

impl<'a> From<&'a hull_oci::RunConfig> for ConfigRecord<'a> {
    fn from(c: &'a hull_oci::RunConfig) -> ConfigRecord<'a> {
        ConfigRecord {
            env: &c.env,
            entrypoint: &c.entrypoint,
            cmd: &c.cmd,
            working_dir: &c.working_dir,
            user: &c.user,
            source: "",
            imported_unix: 0,
        }
    }
}

fn now_spec() -> rustix::fs::Timespec {
    rustix::fs::Timespec {
        tv_sec: 0,
        tv_nsec: rustix::fs::UTIME_NOW,
    }
}

/// How long after its last use an imported image is safe from eviction: a
/// run that found it is past opening it by then.
const EVICT_AFTER: std::time::Duration = std::time::Duration::from_secs(3600);

/// The imported images eviction may take, least recently used first:
/// (last use, digest, bytes). Not one used within [`EVICT_AFTER`].
pub fn evictable(cache: &Cache) -> Vec<(std::time::SystemTime, String, u64)> {
    let dir = cache.root().join(ROOTFS);
    let now = std::time::SystemTime::now();
    let mut out: Vec<_> = list(cache)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|l| {
            let hex = &l.digest["sha256:".len()..];
            let used = std::fs::symlink_metadata(dir.join(format!("{hex}.json")))
                .and_then(|m| m.modified())
                .ok()?;
            let idle = now.duration_since(used).unwrap_or_default();
            (idle >= EVICT_AFTER).then_some((used, l.digest, l.bytes + l.unpacked))
        })
        .collect();
    out.sort();
    out
}

/// An imported image, as `hull image list` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub digest: String,
    /// The reference it was imported from.
    pub source: String,
    /// The flattened tarball's size.
    pub bytes: u64,
    /// What its tree unpacked for bwrap holds on disk (0: none).
    pub unpacked: u64,
    pub imported_unix: u64,
}

#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Kept {
    #[serde(default)]
    source: String,
    #[serde(default)]
    imported_unix: u64,
}

/// Every imported image of `cache`, by digest.
pub fn list(cache: &Cache) -> Result<Vec<Listed>, ImageError> {
    let dir = cache.root().join(ROOTFS);
    let rd = match std::fs::read_dir(&dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(ImageError::io(&dir, "list the imported images in")(e)),
    };
    let mut out = Vec::new();
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(hex) = name.strip_suffix(".tar") else {
            continue;
        };
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            continue;
        }
        let kept: Option<Kept> = super::private_dir::read_in(&dir, &format!("{hex}.json"), 1 << 20)
            .ok()
            .flatten()
            .and_then(|b| serde_json::from_slice(&b).ok());
        let bytes = std::fs::symlink_metadata(e.path()).map_or(0, |m| m.len());
        let unpacked = super::dir_usage(&cache.root().join(TREES).join(hex));
        out.push(Listed {
            digest: format!("sha256:{hex}"),
            source: kept.as_ref().map(|k| k.source.clone()).unwrap_or_default(),
            bytes,
            unpacked,
            imported_unix: kept.map_or(0, |k| k.imported_unix),
        });
    }
    out.sort_by(|a, b| a.digest.cmp(&b.digest));
    Ok(out)
}

/// Removes the imported image whose digest is or starts with `prefix`
/// (`sha256:` optional); its digest. The userland image built from it,
/// if any, is another entry of the cache.
pub fn remove(cache: &Cache, prefix: &str) -> Result<String, ImageError> {
    let want = prefix.trim_start_matches("sha256:");
    let found: Vec<Listed> = list(cache)?
        .into_iter()
        .filter(|l| !want.is_empty() && l.digest["sha256:".len()..].starts_with(want))
        .collect();
    let one = match found.as_slice() {
        [one] => one.clone(),
        [] => {
            return Err(ImageError::ContainerImage {
                reference: prefix.to_string(),
                why: "no imported image has that digest (`hull image list`)".into(),
            })
        }
        _ => {
            return Err(ImageError::ContainerImage {
                reference: prefix.to_string(),
                why: format!(
                    "{} imported images start with it: give more of the digest",
                    found.len()
                ),
            })
        }
    };
    let dir = cache.open_private()?;
    let lock = dir
        .open_lock(LOCK)
        .map_err(ImageError::io(cache.root(), "open the import lock of"))?;
    lock.lock()
        .map_err(ImageError::io(cache.root(), "lock the imports of"))?;
    let rootfs_fd = dir
        .subdir(ROOTFS)
        .map_err(ImageError::io(cache.root(), "open the imported images of"))?;
    let hex = &one.digest["sha256:".len()..];
    // Not under a run that uses it.
    let in_use = dir
        .open_lock(&tree_lock(hex))
        .map_err(ImageError::io(cache.root(), "open a tree's lock in"))?;
    if in_use.try_lock().is_err() {
        return Err(ImageError::ContainerImage {
            reference: one.digest.clone(),
            why: "a run is using it (its unpacked tree); remove it once the run ends".into(),
        });
    }
    let trees = dir
        .subdir(TREES)
        .map_err(ImageError::io(cache.root(), "open the unpacked images of"))?;
    hull_oci::unpack::remove_at(&trees, std::ffi::OsStr::new(hex)).map_err(ImageError::io(
        &cache.root().join(TREES).join(hex),
        "remove",
    ))?;
    for name in [format!("{hex}.tar"), format!("{hex}.json")] {
        match rustix::fs::unlinkat(&rootfs_fd, name.as_str(), rustix::fs::AtFlags::empty()) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => {}
            Err(e) => {
                return Err(ImageError::io(
                    &cache.root().join(ROOTFS).join(&name),
                    "remove",
                )(e.into()))
            }
        }
    }
    Ok(one.digest)
}

/// Removes every blob of the store (they were needed to flatten only).
fn empty_store(store: &OwnedFd) {
    let Ok(dir) = rustix::fs::Dir::read_from(store.as_fd()) else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name().to_owned();
        if matches!(name.to_bytes(), b"." | b"..") {
            continue;
        }
        let _ = rustix::fs::unlinkat(store, name.as_c_str(), rustix::fs::AtFlags::empty());
    }
}

/// What names a version of the source: an archive's (or a layout's
/// `index.json`'s) device, inode, size and times; none for a registry.
fn source_stamp(r: &hull_oci::Reference) -> Option<String> {
    let path = match r {
        hull_oci::Reference::OciArchive(p) | hull_oci::Reference::DockerArchive(p) => p.clone(),
        hull_oci::Reference::OciLayout { dir, .. } => dir.join("index.json"),
        hull_oci::Reference::Registry { .. } | hull_oci::Reference::Imported(_) => return None,
    };
    Some(super::stamp_of(&std::fs::symlink_metadata(path).ok()?))
}

/// The writer of a progress line (unused when quiet).
pub fn say(quiet: bool) -> impl FnMut(&str) {
    move |what: &str| {
        if !quiet {
            let _ = writeln!(std::io::stderr(), "hull: {what}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Eviction takes imported images least recently used first, and none
    /// used within the hour (a run that found one opens it next).
    #[test]
    fn eviction_takes_imported_images_unused_for_an_hour_oldest_first() {
        let t = tempfile::tempdir().unwrap();
        let cache = Cache::at(t.path().join("cache"));
        let dir = cache.open_private().unwrap();
        drop(dir.subdir(ROOTFS).unwrap());
        let rootfs = cache.root().join(ROOTFS);
        let now = std::time::SystemTime::now();
        let hour = std::time::Duration::from_secs(3600);
        let mut made = Vec::new();
        for (i, age) in [
            (1u8, 3 * hour),
            (2, 2 * hour),
            (3, std::time::Duration::ZERO),
        ] {
            let hex = format!("{i:02x}").repeat(32);
            let tar = rootfs.join(format!("{hex}.tar"));
            std::fs::write(&tar, vec![0u8; 64 << 10]).unwrap();
            let record = rootfs.join(format!("{hex}.json"));
            std::fs::write(&record, br#"{"Source":"oci:/x"}"#).unwrap();
            std::fs::File::options()
                .write(true)
                .open(&record)
                .unwrap()
                .set_modified(now - age)
                .unwrap();
            made.push(format!("sha256:{hex}"));
        }
        let listed: Vec<String> = evictable(&cache).into_iter().map(|e| e.1).collect();
        assert_eq!(listed, [made[0].clone(), made[1].clone()]);
        // A cap the cache fits in once the oldest is gone.
        let total = super::super::dir_usage(cache.root());
        let removed = super::super::evict(&cache, total - (32 << 10), "").unwrap();
        assert_eq!(
            removed.iter().map(|r| r.0.as_str()).collect::<Vec<_>>(),
            [made[0].as_str()]
        );
        let left: Vec<String> = list(&cache)
            .unwrap()
            .into_iter()
            .map(|l| l.digest)
            .collect();
        assert_eq!(left, [made[1].clone(), made[2].clone()]);
    }
}
