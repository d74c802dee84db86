//! The layers of an image into one tarball, as a container runtime would
//! stack them, without unpacking anything: each layer is read as a stream
//! twice, once to learn which entry of which layer is in the final tree
//! (whiteouts and opaque directories applied, an entry replaced by a later
//! layer left out) and to check the layer's digest, once to copy those
//! entries into the output.
//!
//! Refused, naming the layer and entry: an absolute path or a `..`
//! component, an entry that lies under a symbolic link of the tree so far
//! (an unpacker that follows the link would write outside the root), a
//! whiteout of `/opt/hull` (where hull mounts its agent) or a whiteout with
//! no name, a layer whose uncompressed digest is not the config's, more
//! entries or bytes than the limits. What the output holds is checked again
//! by the userland's own rewrite (`[vm] rootfs`).

use std::collections::BTreeMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};

/// Where hull mounts its agent in a container: no layer may remove it.
const AGENT_MOUNT: &str = "opt/hull";
const WHITEOUT: &str = ".wh.";
const OPAQUE: &str = ".wh..wh..opq";

/// One layer: its blob (as stored, maybe compressed) and the digest of
/// its uncompressed tar (`sha256:HEX`, the config's `diff_id`).
#[derive(Debug, Clone)]
pub struct Layer {
    pub blob: PathBuf,
    pub diff_id: String,
}

/// Bounds on what a flattened image may hold.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Entries of every layer together.
    pub entries: usize,
    /// Bytes of file contents of every layer together, uncompressed.
    pub bytes: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum FlattenError {
    #[error("image layer {layer} ({blob}): entry {entry:?}: {why}")]
    Entry {
        layer: usize,
        blob: PathBuf,
        entry: String,
        why: String,
    },
    #[error(
        "image layer {layer} ({blob}): its content's digest is {got}, not the {want} its image's \
         config names"
    )]
    Digest {
        layer: usize,
        blob: PathBuf,
        got: String,
        want: String,
    },
    #[error("image layer {layer} ({blob}): {what}: {source}")]
    Io {
        layer: usize,
        blob: PathBuf,
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("the image's layers hold {what}, more than the limit of {limit}")]
    TooBig { what: &'static str, limit: u64 },
    #[error("writing the flattened image: {0}")]
    Write(#[source] io::Error),
}

/// What a flattened image holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flattened {
    /// Entries in the output.
    pub entries: usize,
    /// Entries of the layers left out (whited out or replaced).
    pub hidden: usize,
}

/// One entry in the final tree: the layer and its position there (the
/// last of a name in a layer wins, as an unpacker would leave it).
#[derive(Debug, Clone, Copy)]
struct Final {
    layer: usize,
    at: usize,
    kind: Kind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Dir,
    Symlink,
    Other,
}

/// Writes the image of `layers` (bottom first) to `out` as one tar. The
/// blobs must be hull's own copies: each is read twice.
pub fn flatten(
    layers: &[Layer],
    limits: Limits,
    out: &mut dyn Write,
) -> Result<Flattened, FlattenError> {
    let mut tree: BTreeMap<String, Final> = BTreeMap::new();
    let (mut entries, mut bytes, mut whiteouts, mut roots) = (0usize, 0u64, 0usize, 0usize);
    for (i, layer) in layers.iter().enumerate() {
        let io_err = |what| {
            let blob = layer.blob.clone();
            move |source| FlattenError::Io {
                layer: i + 1,
                blob: blob.clone(),
                what,
                source,
            }
        };
        let refuse = |entry: &str, why: String| FlattenError::Entry {
            layer: i + 1,
            blob: layer.blob.clone(),
            entry: entry.to_string(),
            why,
        };
        // The uncompressed stream hashed, and guarded against metadata
        // entries the tar crate would read whole into memory.
        let mut hashing =
            crate::TarGuard::new(open_layer(&layer.blob, limits).map_err(io_err("open"))?);
        // Whiteouts apply to the layers below only: gathered first,
        // applied before this layer's own entries.
        let mut gone: Vec<(String, bool)> = Vec::new();
        let mut own: Vec<(String, Kind)> = Vec::new();
        {
            let mut archive = tar::Archive::new(&mut hashing);
            for entry in archive.entries().map_err(io_err("read"))? {
                let entry = entry.map_err(io_err("read an entry of"))?;
                let raw = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
                let name = normalise(&raw).map_err(|why| refuse(&raw, why))?;
                entries += 1;
                if entries > limits.entries {
                    return Err(FlattenError::TooBig {
                        what: "more entries",
                        limit: limits.entries as u64,
                    });
                }
                let kind = entry.header().entry_type();
                if kind.is_file() {
                    bytes = bytes.saturating_add(entry.size());
                    if bytes > limits.bytes {
                        return Err(FlattenError::TooBig {
                            what: "more bytes",
                            limit: limits.bytes,
                        });
                    }
                }
                let (dir, base) = match name.rsplit_once('/') {
                    Some((d, b)) => (d, b),
                    None => ("", name.as_str()),
                };
                if let Some(target) = base.strip_prefix(WHITEOUT) {
                    whiteouts += 1;
                    let (path, opaque) = match base {
                        OPAQUE => (dir.to_string(), true),
                        _ if target.is_empty() || target == "." || target == ".." => {
                            return Err(refuse(&raw, "a whiteout that names nothing".into()))
                        }
                        _ => (join(dir, target), false),
                    };
                    if path == AGENT_MOUNT || path.starts_with(&format!("{AGENT_MOUNT}/")) {
                        return Err(refuse(
                            &raw,
                            format!("removes /{AGENT_MOUNT}, where hull mounts its agent"),
                        ));
                    }
                    gone.push((path, opaque));
                    continue;
                }
                if name.is_empty() {
                    roots += 1;
                    continue; // the root itself
                }
                let kind = match kind {
                    tar::EntryType::Directory => Kind::Dir,
                    tar::EntryType::Symlink => Kind::Symlink,
                    _ => Kind::Other,
                };
                own.push((name, kind));
            }
        }
        // The rest of the stream (padding past the end blocks) is hashed
        // too: the digest is of the whole uncompressed layer.
        io::copy(&mut hashing, &mut io::sink()).map_err(io_err("read"))?;
        let got = format!("sha256:{}", hashing.sha256());
        if got != layer.diff_id {
            return Err(FlattenError::Digest {
                layer: i + 1,
                blob: layer.blob.clone(),
                got,
                want: layer.diff_id.clone(),
            });
        }
        for (path, opaque) in gone {
            remove_below(&mut tree, &path);
            if !opaque {
                tree.remove(&path);
            }
        }
        for (at, (name, kind)) in own.into_iter().enumerate() {
            if let Some(link) =
                ancestors(&name).find(|a| tree.get(*a).is_some_and(|f| f.kind == Kind::Symlink))
            {
                return Err(refuse(
                    &name,
                    format!("lies under {link:?}, a symbolic link of the image"),
                ));
            }
            // A directory replaced by anything else takes what was below.
            if kind != Kind::Dir && tree.get(&name).is_some_and(|f| f.kind == Kind::Dir) {
                remove_below(&mut tree, &name);
            }
            tree.insert(name, Final { layer: i, at, kind });
        }
    }
    // One layer and nothing to apply: the layer as it is (what it holds is
    // checked again by the userland's rewrite).
    let kept = tree.len();
    if layers.len() == 1 && whiteouts == 0 && kept + roots == entries {
        let layer = &layers[0];
        let mut r = open_layer(&layer.blob, limits).map_err(|source| FlattenError::Io {
            layer: 1,
            blob: layer.blob.clone(),
            what: "open",
            source,
        })?;
        io::copy(&mut r, out).map_err(FlattenError::Write)?;
        return Ok(Flattened {
            entries: kept,
            hidden: 0,
        });
    }
    let mut builder = tar::Builder::new(out);
    builder.mode(tar::HeaderMode::Complete);
    for (i, layer) in layers.iter().enumerate() {
        let io_err = |what| {
            let blob = layer.blob.clone();
            move |source| FlattenError::Io {
                layer: i + 1,
                blob: blob.clone(),
                what,
                source,
            }
        };
        let mut archive = tar::Archive::new(crate::TarGuard::new(
            open_layer(&layer.blob, limits).map_err(io_err("open"))?,
        ));
        let mut at = 0usize;
        for entry in archive.entries().map_err(io_err("read"))? {
            let mut entry = entry.map_err(io_err("read an entry of"))?;
            let raw = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
            let Ok(name) = normalise(&raw) else {
                continue; // refused in the first pass
            };
            let base = name.rsplit('/').next().unwrap_or("");
            if base.starts_with(WHITEOUT) || name.is_empty() {
                continue;
            }
            let mine = tree.get(&name).is_some_and(|f| f.layer == i && f.at == at);
            at += 1;
            if !mine {
                continue;
            }
            let mut header = entry.header().clone();
            match header.entry_type() {
                tar::EntryType::Symlink | tar::EntryType::Link => {
                    let target = entry
                        .link_name_bytes()
                        .map(|t| String::from_utf8_lossy(&t).into_owned())
                        .unwrap_or_default();
                    let target = match header.entry_type() {
                        // A hard link names an entry of the tree.
                        tar::EntryType::Link => normalise(&target).unwrap_or(target),
                        _ => target,
                    };
                    builder
                        .append_link(&mut header, &name, &target)
                        .map_err(FlattenError::Write)?;
                }
                _ => builder
                    .append_data(&mut header, &name, &mut entry)
                    .map_err(FlattenError::Write)?,
            }
        }
    }
    builder.finish().map_err(FlattenError::Write)?;
    Ok(Flattened {
        entries: kept,
        hidden: entries - whiteouts - kept - roots,
    })
}

/// A layer's uncompressed stream, at most as long as `limits` allow: gzip
/// and zstd are known by their first bytes, anything else is read as a
/// plain tar.
fn open_layer(blob: &Path, limits: Limits) -> io::Result<Box<dyn Read>> {
    let r = decompressed(blob)?;
    // A stream longer than its entries and their headers can be (a
    // compressed run of zeros past the end blocks) is cut: its digest then
    // fails.
    let most = limits
        .bytes
        .saturating_add((limits.entries as u64).saturating_mul(3 * 512))
        .saturating_add(1 << 20);
    Ok(Box::new(r.take(most)))
}

/// A blob's uncompressed stream.
fn decompressed(blob: &Path) -> io::Result<Box<dyn Read>> {
    let f = std::fs::File::open(blob)?;
    let mut r = BufReader::new(f);
    let head = r.fill_buf()?;
    if head.starts_with(&[0x1f, 0x8b]) {
        return Ok(Box::new(flate2::bufread::MultiGzDecoder::new(r)));
    }
    if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        let d = ruzstd::decoding::StreamingDecoder::new(r)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
        return Ok(Box::new(d));
    }
    Ok(Box::new(r))
}

/// An entry's name relative to the root, without `./` or a trailing `/`;
/// refused when absolute or climbing (`..`).
pub(crate) fn normalise(raw: &str) -> Result<String, String> {
    if raw.starts_with('/') {
        return Err("an absolute path".into());
    }
    let mut parts = Vec::new();
    for c in raw.split('/') {
        match c {
            "" | "." => {}
            ".." => return Err("a `..` component".into()),
            c => parts.push(c),
        }
    }
    Ok(parts.join("/"))
}

fn join(dir: &str, name: &str) -> String {
    match dir {
        "" => name.to_string(),
        d => format!("{d}/{name}"),
    }
}

/// Every proper ancestor of `name`, nearest first.
fn ancestors(name: &str) -> impl Iterator<Item = &str> {
    let mut rest = name;
    std::iter::from_fn(move || {
        let (parent, _) = rest.rsplit_once('/')?;
        rest = parent;
        Some(parent)
    })
}

/// Removes every entry strictly below `dir` ("" is the root).
fn remove_below(tree: &mut BTreeMap<String, Final>, dir: &str) {
    let prefix = match dir {
        "" => String::new(),
        d => format!("{d}/"),
    };
    let below: Vec<String> = tree
        .range(prefix.clone()..)
        .take_while(|(k, _)| k.starts_with(&prefix))
        .map(|(k, _)| k.clone())
        .collect();
    for k in below {
        tree.remove(&k);
    }
}
