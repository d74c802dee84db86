//! Reading an image from where its reference points into a store of
//! blobs, each named by the digest of its content as hull computed it
//! while copying: nothing of the source is used but those copies, and a
//! blob that is not what its name says is refused.
//!
//! The archives are read once, as streams; an OCI layout is read below its
//! directory with no symbolic link followed. The store is a directory hull
//! holds open (its own, private).

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags, ResolveFlags};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::flatten::{normalise, Layer};
use crate::Reference;

/// The largest metadata file read (an index, a manifest, a config).
pub(crate) const MAX_JSON: u64 = 4 << 20;
/// The most entries an archive may hold.
const MAX_ARCHIVE_ENTRIES: usize = 100_000;

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("image {reference}: {what} {path}: {source}")]
    Io {
        reference: String,
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("image {reference}: {why}")]
    Refused { reference: String, why: String },
}

/// What a container runs by default, from the image's config.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct RunConfig {
    #[serde(default)]
    pub env: Option<Vec<String>>,
    #[serde(default)]
    pub entrypoint: Option<Vec<String>>,
    #[serde(default)]
    pub cmd: Option<Vec<String>>,
    #[serde(default)]
    pub working_dir: Option<String>,
    #[serde(default)]
    pub user: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
struct ConfigFile {
    #[serde(default)]
    config: Option<RunConfig>,
    rootfs: RootFs,
}

#[derive(Debug, Clone, Deserialize)]
struct RootFs {
    diff_ids: Vec<String>,
}

/// An image read into the store.
#[derive(Debug, Clone)]
pub struct Image {
    /// What names this image's content: its manifest's digest (an OCI
    /// layout or archive) or its config's (a docker archive).
    pub digest: String,
    pub config: RunConfig,
    /// Bottom first, each a blob of the store.
    pub layers: Vec<Layer>,
}

/// A blob of the store, by digest.
pub(crate) fn blob_path(store: &Path, digest: &str) -> PathBuf {
    store.join(digest.trim_start_matches("sha256:"))
}

/// Reads the image `reference` names into `store` (a directory hull holds
/// as `store_fd`; every blob it needs ends there, at most `max_bytes` of
/// them).
pub fn read(
    reference: &Reference,
    store: &Path,
    store_fd: &OwnedFd,
    max_bytes: u64,
) -> Result<Image, SourceError> {
    let r = reference.to_string();
    let refuse = |why: String| SourceError::Refused {
        reference: r.clone(),
        why,
    };
    match reference {
        Reference::OciArchive(path) | Reference::DockerArchive(path) => {
            let files = read_archive(&r, path, store_fd, max_bytes)?;
            match reference {
                Reference::OciArchive(_) => {
                    let index = files.json.get("index.json").ok_or_else(|| {
                        refuse("no index.json in the archive (not an OCI archive)".into())
                    })?;
                    let mut fetch = |d: &str, _: Kind| match files
                        .blobs
                        .contains(d.trim_start_matches("sha256:"))
                    {
                        true => Ok(()),
                        false => Err(refuse(format!("the blob {d} is not in the archive"))),
                    };
                    oci_image(&r, index, None, store, &mut fetch)
                }
                _ => docker_image(&r, &files, store),
            }
        }
        Reference::OciLayout { dir, tag } => {
            let root = rustix::fs::open(
                dir,
                OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| io_err(&r, "open the layout", dir, e.into()))?;
            let index = read_small(&root, "index.json")
                .map_err(|e| io_err(&r, "read", &dir.join("index.json"), e))?;
            // Each blob the image needs is copied from the layout as it is
            // named, and checked.
            let mut total = 0u64;
            let mut fetch = |digest: &str, _: Kind| -> Result<(), SourceError> {
                let hexd = digest_hex(digest).map_err(refuse)?;
                let name = format!("blobs/sha256/{hexd}");
                let f = open_beneath(&root, &name)
                    .map_err(|e| io_err(&r, "open", &dir.join(&name), e))?;
                let (got, n) = store_blob(
                    store_fd,
                    &mut std::fs::File::from(f),
                    max_bytes.saturating_sub(total),
                )
                .map_err(|e| io_err(&r, "copy", &dir.join(&name), e))?;
                total += n;
                if got != hexd {
                    return Err(refuse(format!(
                        "{name} holds sha256:{got}: not the blob its name says"
                    )));
                }
                Ok(())
            };
            oci_image(&r, &index, tag.as_deref(), store, &mut fetch)
        }
        Reference::Registry { .. } => Err(refuse(
            "a registry's image is pulled with the network its run allows \
             (hull_oci::registry::pull)"
                .into(),
        )),
        Reference::Imported(_) => Err(refuse("an imported image is in hull's cache".into())),
    }
}

pub(crate) fn io_err(r: &str, what: &'static str, path: &Path, source: io::Error) -> SourceError {
    SourceError::Io {
        reference: r.to_string(),
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// The hex of a `sha256:HEX` digest, checked.
pub(crate) fn digest_hex(d: &str) -> Result<String, String> {
    let h = d
        .strip_prefix("sha256:")
        .ok_or_else(|| format!("the digest {d:?} is not sha256"))?;
    if h.len() != 64
        || !h
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    {
        return Err(format!("the digest {d:?} is not sha256:HEX"));
    }
    Ok(h.to_string())
}

/// What an archive held: its small metadata files by name, and the
/// digests of the blobs stored (and, for a docker archive, which name of
/// the archive each came from).
struct ArchiveFiles {
    json: HashMap<String, Vec<u8>>,
    blobs: std::collections::HashSet<String>,
    by_name: HashMap<String, String>,
}

fn read_archive(
    r: &str,
    path: &Path,
    store_fd: &OwnedFd,
    max_bytes: u64,
) -> Result<ArchiveFiles, SourceError> {
    let refuse = |why: String| SourceError::Refused {
        reference: r.to_string(),
        why,
    };
    let f = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io_err(r, "open", path, e.into()))?;
    let st = rustix::fs::fstat(&f).map_err(|e| io_err(r, "inspect", path, e.into()))?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(refuse(format!("{} is not a regular file", path.display())));
    }
    let mut files = ArchiveFiles {
        json: HashMap::new(),
        blobs: Default::default(),
        by_name: HashMap::new(),
    };
    let mut total = 0u64;
    let mut count = 0usize;
    let mut archive = tar::Archive::new(crate::TarGuard::new(io::BufReader::new(
        std::fs::File::from(f),
    )));
    for entry in archive.entries().map_err(|e| io_err(r, "read", path, e))? {
        let mut entry = entry.map_err(|e| io_err(r, "read an entry of", path, e))?;
        count += 1;
        if count > MAX_ARCHIVE_ENTRIES {
            return Err(refuse(format!(
                "the archive holds more than {MAX_ARCHIVE_ENTRIES} entries"
            )));
        }
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let raw = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let Ok(name) = normalise(&raw) else {
            return Err(refuse(format!(
                "the archive's entry {raw:?} is absolute or climbs"
            )));
        };
        if matches!(
            name.as_str(),
            "index.json" | "manifest.json" | "oci-layout" | "repositories"
        ) || (name.ends_with(".json") && !name.contains('/') && entry.size() <= MAX_JSON)
            && !name.starts_with("blobs/")
        {
            if entry.size() > MAX_JSON {
                return Err(refuse(format!("{name} is larger than {MAX_JSON} bytes")));
            }
            total += entry.size();
            if total > max_bytes {
                return Err(refuse(format!(
                    "the archive holds more than {max_bytes} bytes"
                )));
            }
            let mut body = Vec::new();
            (&mut entry)
                .take(MAX_JSON)
                .read_to_end(&mut body)
                .map_err(|e| io_err(r, "read", &path.join(&name), e))?;
            // A docker archive's config is a blob too, named by its hex.
            let digest = hex(&Sha256::digest(&body));
            files.by_name.insert(name.clone(), digest.clone());
            store_bytes(store_fd, &digest, &body)
                .map_err(|e| io_err(r, "store", &path.join(&name), e))?;
            files.blobs.insert(digest);
            // The metadata the image is found by; the rest is in the store.
            if matches!(name.as_str(), "index.json" | "manifest.json") {
                files.json.insert(name, body);
            }
            continue;
        }
        let (digest, n) = store_blob(store_fd, &mut entry, max_bytes.saturating_sub(total))
            .map_err(|e| io_err(r, "copy", &path.join(&name), e))?;
        total += n;
        if let Some(named) = name.strip_prefix("blobs/sha256/") {
            if named != digest {
                return Err(refuse(format!(
                    "{name} holds sha256:{digest}: not the blob its name says"
                )));
            }
        }
        files.by_name.insert(name, digest.clone());
        files.blobs.insert(digest);
    }
    Ok(files)
}

/// Copies `from` into the store under the hex of its digest (at most
/// `left` bytes); returns the hex and the size.
pub(crate) fn store_blob(
    store: &OwnedFd,
    from: &mut dyn Read,
    left: u64,
) -> io::Result<(String, u64)> {
    let tmp = format!(".part-{}", std::process::id());
    let f = rustix::fs::openat(
        store,
        tmp.as_str(),
        OFlags::CREATE | OFlags::TRUNC | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )?;
    let mut out = io::BufWriter::new(std::fs::File::from(f));
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut n = 0u64;
    loop {
        let k = from.read(&mut buf)?;
        if k == 0 {
            break;
        }
        n += k as u64;
        if n > left {
            drop(out);
            let _ = rustix::fs::unlinkat(store, tmp.as_str(), rustix::fs::AtFlags::empty());
            return Err(io::Error::other(format!(
                "the image's blobs are larger than the limit ({left} bytes left)"
            )));
        }
        hash.update(&buf[..k]);
        out.write_all(&buf[..k])?;
    }
    out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    let digest = hex(&hash.finalize());
    rustix::fs::renameat(store, tmp.as_str(), store, digest.as_str())?;
    Ok((digest, n))
}

pub(crate) fn store_bytes(store: &OwnedFd, digest: &str, body: &[u8]) -> io::Result<()> {
    let (got, _) = store_blob(store, &mut &body[..], u64::MAX)?;
    debug_assert_eq!(got, digest);
    Ok(())
}

/// `name` below `root`, no link followed and no step out.
fn open_beneath(root: &OwnedFd, name: &str) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat2(
        root.as_fd(),
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )?)
}

/// A small file below `root` (regular, at most [`MAX_JSON`] bytes).
fn read_small(root: &OwnedFd, name: &str) -> io::Result<Vec<u8>> {
    let f = open_beneath(root, name)?;
    let st = rustix::fs::fstat(&f)?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(io::Error::other("not a regular file"));
    }
    let mut body = Vec::new();
    std::fs::File::from(f)
        .take(MAX_JSON + 1)
        .read_to_end(&mut body)?;
    if body.len() as u64 > MAX_JSON {
        return Err(io::Error::other(format!("larger than {MAX_JSON} bytes")));
    }
    Ok(body)
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Index {
    manifests: Vec<Descriptor>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Descriptor {
    #[serde(default)]
    media_type: String,
    digest: String,
    #[serde(default)]
    annotations: HashMap<String, String>,
    #[serde(default)]
    platform: Option<Platform>,
}

#[derive(Debug, Deserialize)]
struct Platform {
    os: String,
    architecture: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Manifest {
    config: Descriptor,
    layers: Vec<Descriptor>,
}

const INDEX_TYPES: [&str; 2] = [
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];

/// The host's architecture as images name it.
fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// What a digest names, for a source that keeps the two apart (a
/// registry serves manifests and blobs at different places).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Manifest,
    Blob,
}

/// Puts the blob a digest names into the store, checked, or says why it
/// cannot.
pub(crate) type Fetch<'a> = dyn FnMut(&str, Kind) -> Result<(), SourceError> + 'a;

/// A metadata blob of the store (an index, a manifest, a config): fetched
/// first, at most [`MAX_JSON`] bytes.
fn read_json_blob(
    r: &str,
    store: &Path,
    d: &str,
    kind: Kind,
    fetch: &mut Fetch,
) -> Result<Vec<u8>, SourceError> {
    digest_hex(d).map_err(|why| refused(r, why))?;
    fetch(d, kind)?;
    let p = blob_path(store, d);
    let body = std::fs::read(&p).map_err(|e| io_err(r, "read", &p, e))?;
    if body.len() as u64 > MAX_JSON {
        return Err(refused(r, format!("{d} is larger than {MAX_JSON} bytes")));
    }
    Ok(body)
}

fn refused(r: &str, why: String) -> SourceError {
    SourceError::Refused {
        reference: r.to_string(),
        why,
    }
}

/// The image an OCI index names (by `tag`, else its one manifest, an index
/// within followed once, the host's platform taken).
fn oci_image(
    r: &str,
    index: &[u8],
    tag: Option<&str>,
    store: &Path,
    fetch: &mut Fetch,
) -> Result<Image, SourceError> {
    let (digest, body) = pick_manifest(r, index, tag, store, fetch)?;
    image_of(r, digest, &body, store, fetch)
}

/// The digest and body of the manifest an index names for the host's
/// platform (by `tag`, else its one manifest; an index within followed
/// once).
pub(crate) fn pick_manifest(
    r: &str,
    index: &[u8],
    tag: Option<&str>,
    store: &Path,
    fetch: &mut Fetch,
) -> Result<(String, Vec<u8>), SourceError> {
    let refuse = |why: String| refused(r, why);
    let parse_index = |body: &[u8]| -> Result<Index, SourceError> {
        serde_json::from_slice(body).map_err(|e| refuse(format!("its index: {e}")))
    };
    let index = parse_index(index)?;
    let pick = |idx: &Index, tag: Option<&str>| -> Result<(String, String), SourceError> {
        let named: Vec<&Descriptor> = match tag {
            Some(t) => idx
                .manifests
                .iter()
                .filter(|m| {
                    m.annotations
                        .get("org.opencontainers.image.ref.name")
                        .map(String::as_str)
                        == Some(t)
                })
                .collect(),
            None => idx.manifests.iter().collect(),
        };
        let platform: Vec<&&Descriptor> = named
            .iter()
            .filter(|m| {
                m.platform
                    .as_ref()
                    .is_none_or(|p| p.os == "linux" && p.architecture == host_arch())
            })
            .collect();
        match platform.as_slice() {
            [one] => Ok((one.digest.clone(), one.media_type.clone())),
            [] => Err(refuse(match tag {
                Some(t) => format!("no manifest tagged {t:?} for linux/{}", host_arch()),
                None => format!("no manifest for linux/{}", host_arch()),
            })),
            _ => Err(refuse(format!(
                "{} manifests: name one by its tag (oci:DIR:TAG)",
                platform.len()
            ))),
        }
    };
    let (mut digest, kind) = pick(&index, tag)?;
    let mut body = read_json_blob(r, store, &digest, Kind::Manifest, fetch)?;
    if INDEX_TYPES.contains(&kind.as_str()) || is_index(&body) {
        let inner = parse_index(&body)?;
        digest = pick(&inner, None)?.0;
        body = read_json_blob(r, store, &digest, Kind::Manifest, fetch)?;
        if is_index(&body) {
            return Err(refuse(format!(
                "{digest} is an index inside an index inside the index (one level is followed)"
            )));
        }
    }
    Ok((digest, body))
}

/// Whether a manifest is an index (its `mediaType`, or `manifests` and no
/// `layers`).
fn is_index(body: &[u8]) -> bool {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Peek {
        #[serde(default)]
        media_type: Option<String>,
        #[serde(default)]
        manifests: Option<serde::de::IgnoredAny>,
        #[serde(default)]
        layers: Option<serde::de::IgnoredAny>,
    }
    match serde_json::from_slice::<Peek>(body) {
        Ok(p) => match p.media_type {
            Some(t) => INDEX_TYPES.contains(&t.as_str()),
            None => p.manifests.is_some() && p.layers.is_none(),
        },
        Err(_) => false,
    }
}

/// The image of the manifest `digest` (its `body`): its config and its
/// layers fetched and checked.
pub(crate) fn image_of(
    r: &str,
    digest: String,
    body: &[u8],
    store: &Path,
    fetch: &mut Fetch,
) -> Result<Image, SourceError> {
    let refuse = |why: String| refused(r, why);
    let manifest: Manifest =
        serde_json::from_slice(body).map_err(|e| refuse(format!("its manifest {digest}: {e}")))?;
    let config_body = read_json_blob(r, store, &manifest.config.digest, Kind::Blob, fetch)?;
    let config: ConfigFile = serde_json::from_slice(&config_body)
        .map_err(|e| refuse(format!("its config {}: {e}", manifest.config.digest)))?;
    if config.rootfs.diff_ids.len() != manifest.layers.len() {
        return Err(refuse(format!(
            "its manifest has {} layers and its config {} diff_ids",
            manifest.layers.len(),
            config.rootfs.diff_ids.len()
        )));
    }
    let mut layers = Vec::new();
    for (l, diff_id) in manifest.layers.iter().zip(&config.rootfs.diff_ids) {
        digest_hex(&l.digest).map_err(refuse)?;
        digest_hex(diff_id).map_err(refuse)?;
        fetch(&l.digest, Kind::Blob)?;
        layers.push(Layer {
            blob: blob_path(store, &l.digest),
            diff_id: diff_id.clone(),
        });
    }
    Ok(Image {
        digest,
        config: config.config.unwrap_or_default(),
        layers,
    })
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct DockerManifest {
    config: String,
    #[serde(default)]
    repo_tags: Option<Vec<String>>,
    layers: Vec<String>,
}

fn docker_image(r: &str, files: &ArchiveFiles, store: &Path) -> Result<Image, SourceError> {
    let refuse = |why: String| SourceError::Refused {
        reference: r.to_string(),
        why,
    };
    let body = files
        .json
        .get("manifest.json")
        .ok_or_else(|| refuse("no manifest.json in the archive (not a docker archive)".into()))?;
    let manifests: Vec<DockerManifest> =
        serde_json::from_slice(body).map_err(|e| refuse(format!("its manifest.json: {e}")))?;
    let m = match manifests.as_slice() {
        [one] => one,
        [] => return Err(refuse("its manifest.json names no image".into())),
        many => {
            return Err(refuse(format!(
                "its manifest.json names {} images ({}): save one",
                many.len(),
                many.iter()
                    .flat_map(|m| m.repo_tags.clone().unwrap_or_default())
                    .collect::<Vec<_>>()
                    .join(", ")
            )))
        }
    };
    let stored = |name: &str| -> Result<String, SourceError> {
        let n = normalise(name).map_err(|why| refuse(format!("{name:?}: {why}")))?;
        files
            .by_name
            .get(&n)
            .cloned()
            .ok_or_else(|| refuse(format!("{name} is not in the archive")))
    };
    let config_hex = stored(&m.config)?;
    let config_body = std::fs::read(store.join(&config_hex))
        .map_err(|e| io_err(r, "read", &store.join(&config_hex), e))?;
    let config: ConfigFile = serde_json::from_slice(&config_body)
        .map_err(|e| refuse(format!("its config {}: {e}", m.config)))?;
    if config.rootfs.diff_ids.len() != m.layers.len() {
        return Err(refuse(format!(
            "its manifest has {} layers and its config {} diff_ids",
            m.layers.len(),
            config.rootfs.diff_ids.len()
        )));
    }
    let mut layers = Vec::new();
    for (name, diff_id) in m.layers.iter().zip(&config.rootfs.diff_ids) {
        digest_hex(diff_id).map_err(refuse)?;
        layers.push(Layer {
            blob: store.join(stored(name)?),
            diff_id: diff_id.clone(),
        });
    }
    Ok(Image {
        digest: format!("sha256:{config_hex}"),
        config: config.config.unwrap_or_default(),
        layers,
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
