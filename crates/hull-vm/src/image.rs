//! Tier-3 guest images: the cached, prepared outer-VM guest that `hull image build`
//! makes from Debian packages, and the contract a VM launcher must follow to boot it.
//!
//! An image is a directory `<cache>/<id>/` holding `vmlinux` (the kernel ELF, booted
//! through its PVH entry), `initrd.cpio`, `disk.raw` (the prepared root disk, read
//! only: boot it through a per-VM qcow2 overlay) and `manifest.json` (written last).
//! The id hashes the embedded recipe alone ([`recipe`]); the guest agent comes
//! on a disk of its own, `agent-<hash>.ext4` in the same directory
//! ([`agent_disk`]), so a new agent never rebuilds the image.
//!
//! Protects against: using an image built from other inputs (the id), a half-built
//! image (only complete directories carry a manifest; see [`cache`]), removing an
//! image a VM uses ([`BuiltImage::lock_shared`]), and a corrupted base disk being
//! written through (files are read-only, the overlay takes every write).
//! Does not protect the cache from another local user with write access to it, and
//! does not verify the Debian packages beyond what apt and mmdebstrap verify.

pub mod agent_disk;
pub mod build;
pub mod cache;
#[cfg(target_os = "linux")]
pub mod container_image;
pub mod digest;
pub mod private_dir;
pub mod progress;
pub mod recipe;
pub mod rootfs;

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use cache::{Cache, Entry};

/// `manifest.json` format version.
pub const MANIFEST_FORMAT: u32 = 3;
/// Name of the virtio-serial port the outer agent serves on.
pub const AGENT_PORT: &str = "agent.0";
/// Kernel command line for a normal boot (the root disk must be the first virtio-blk).
pub const KERNEL_CMDLINE: &str = "console=ttyS0 quiet panic=-1 root=/dev/vda";
/// Where the outer agent mounts the virtiofs shares in the guest (`<root>/<tag>`).
pub const SHARE_ROOT: &str = "/mnt/hull";
/// Incus container every run container is cloned from (stopped, never started).
pub const BASE_CONTAINER: &str = "hull-base";
/// A clone of the base, prepared and started once at build time so its AppArmor
/// profile is compiled and cached in the image: configure this name for a fast start.
pub const RUN_CONTAINER: &str = "hull-run";
/// Alias of the imported container image.
pub const IMAGE_ALIAS: &str = "hull-image";
/// The guest uid and gid commands run as (what the host's virtiofsd must translate
/// the host user to, and the only id `raw.idmap` maps into the container).
pub const GUEST_UID: u32 = 1000;
pub const GUEST_GID: u32 = 1000;
/// Memory the guest needs to run incusd and one container, MiB.
pub const MIN_MEMORY_MIB: u32 = 768;

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error(transparent)]
    Rootfs(#[from] rootfs::RootfsError),
    #[error("container image {reference}: {why}")]
    ContainerImage { reference: String, why: String },
    /// Reading a container image failed: `why` names the image itself.
    #[error("container {why}")]
    ContainerImageRead { why: String },
    #[error("{path}: cannot {what}")]
    Io {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("no cache directory for tier-3 images: set XDG_CACHE_HOME, HOME or HULL_IMAGE_CACHE")]
    NoCacheDir,
    #[error(
        "tier-3 guest agent not found at {path}: build it with `cargo build -p hull-agent --release` \
         and pass --agent PATH (or set HULL_AGENT)"
    )]
    AgentMissing { path: PathBuf },
    #[error("{path} is not a Linux x86-64 executable ({why}); the guest agent runs inside the Linux guest")]
    AgentNotLinux { path: PathBuf, why: String },
    #[error(
        "the guest agent {path} is dynamically linked ({why}): as the container's init it would \
         load the container's own loader, C library and /etc/ld.so.preload as container root, \
         and a [vm] rootfs supplies those. Build it static: cargo build -p hull-agent --target \
         x86_64-unknown-linux-musl (scripts/setup.sh adds the target)"
    )]
    AgentNotStatic { path: PathBuf, why: String },
    #[error("tier-3 image {id} ({userland}) is not built; run `hull image build` (with `--policy POLICY` for a policy's userland), or let a run build a policy's")]
    NotBuilt { id: String, userland: String },
    #[error("cannot make the guest agent's disk {path}: `{cmd}` failed: {why}")]
    AgentDisk {
        path: PathBuf,
        cmd: String,
        why: String,
    },
    #[error("{dir}: not a usable image: {reason}")]
    Invalid { dir: PathBuf, reason: String },
    #[error(
        "the image cache {root} is not private to this user ({reason}); an image another \
         user can write would boot their code (choose another with HULL_IMAGE_CACHE)"
    )]
    NotPrivate { root: PathBuf, reason: String },
    #[error(
        "tier-3 image {dir}: {source}; refusing to start a VM from it (remove it and build \
         it again: hull image build --force)"
    )]
    Changed {
        dir: PathBuf,
        #[source]
        source: digest::DigestError,
    },
    #[error(
        "the image cache {root} has {free_mib} MiB free; a build needs about {need_mib} MiB: \
         remove old images (`hull image list`, `hull image rm`) or choose a larger disk with \
         HULL_IMAGE_CACHE"
    )]
    NoSpace {
        root: PathBuf,
        free_mib: u64,
        need_mib: u64,
    },
    #[error("no image matches {query:?} in {root} (see `hull image list`)")]
    NoMatch { query: String, root: PathBuf },
    #[error("{query:?} matches more than one image: {ids}")]
    Ambiguous { query: String, ids: String },
    #[error("image {id} is in use (a VM or a build holds {lock}); stop it first")]
    InUse { id: String, lock: PathBuf },
    #[error("refusing to remove {path}: {reason}")]
    RemoveRefused { path: PathBuf, reason: String },
    #[error("`hull image build` is missing tools: {list}; install them with: {install}")]
    MissingTools { list: String, install: String },
    #[error("`hull image build` needs root on this host: {why}")]
    NeedsRoot { why: &'static str },
    #[error("`hull image build` runs on Linux hosts only (mmdebstrap, mkfs.ext4 -d); build the image on Linux")]
    UnsupportedHost,
    #[error("image build failed at step {step}: {message}\n  build log: {log}\n{tail}")]
    BuildFailed {
        step: String,
        message: String,
        log: PathBuf,
        tail: String,
    },
}

impl ImageError {
    pub(crate) fn io(path: &Path, what: &'static str) -> impl FnOnce(io::Error) -> ImageError {
        let path = path.to_path_buf();
        move |source| ImageError::Io { path, what, source }
    }
}

/// How a VM boots and talks to this image. The host side must match it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuestContract {
    /// `-append` for a normal boot (add nothing that changes `hull.mode`).
    pub cmdline: String,
    /// virtio-serial port name of the outer agent.
    pub agent_port: String,
    /// Guest directory the shares are mounted under (`<share_root>/<tag>`).
    pub share_root: String,
    pub base_container: String,
    pub run_container: String,
    pub image_alias: String,
    /// Guest uid/gid of the command user (virtiofsd translates the host user to it).
    pub uid: u32,
    pub gid: u32,
    pub min_memory_mib: u32,
    /// QEMU devices the guest expects, in order.
    pub devices: Vec<String>,
}

impl GuestContract {
    pub fn current() -> GuestContract {
        GuestContract {
            cmdline: KERNEL_CMDLINE.into(),
            agent_port: AGENT_PORT.into(),
            share_root: SHARE_ROOT.into(),
            base_container: BASE_CONTAINER.into(),
            run_container: RUN_CONTAINER.into(),
            image_alias: IMAGE_ALIAS.into(),
            uid: GUEST_UID,
            gid: GUEST_GID,
            min_memory_mib: MIN_MEMORY_MIB,
            devices: vec![
                "virtio-blk-pci: the root disk, a qcow2 overlay over disk.raw (first virtio-blk = /dev/vda)".into(),
                "virtio-blk-pci, read-only: the agent disk agent-<sha256>.ext4 (second virtio-blk = /dev/vdb, mounted at /opt/hull)".into(),
                "virtio-rng-pci: seeds the guest CRNG (incusd blocks on getrandom without it)".into(),
                "virtio-serial-pci + virtserialport name=agent.0: the agent channel".into(),
                "vhost-user-fs-pci per share, tag = Share.tag (shared memory backend)".into(),
                "isa serial (-serial): the console (console=ttyS0)".into(),
            ],
        }
    }
}

/// Time one build step took.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepTiming {
    pub name: String,
    pub seconds: f64,
}

/// `manifest.json`: written last; its presence makes a directory an image.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format: u32,
    pub id: String,
    /// Full sha256 of the recipe (the id is its prefix).
    pub hash: String,
    pub created_unix: u64,
    pub kernel: String,
    pub initrd: String,
    pub base_disk: String,
    pub base_disk_format: String,
    /// The digest of each of `kernel`, `initrd` and `base_disk`, checked
    /// before a VM uses them ([`digest`]).
    pub files: BTreeMap<String, digest::FileDigest>,
    pub guest: GuestContract,
    /// Facts the recipe reported (package versions, sizes, prepare timings).
    pub info: BTreeMap<String, String>,
    pub steps: Vec<StepTiming>,
    pub build_seconds: f64,
    /// The `[vm] packages` added to the default userland (none: the
    /// default image).
    #[serde(default)]
    pub packages: Vec<String>,
    /// The `[vm] rootfs` tarball the container came from instead.
    #[serde(default)]
    pub rootfs: Option<recipe::RootfsSource>,
}

/// A complete image and the paths a VM launcher needs.
#[derive(Debug, Clone)]
pub struct BuiltImage {
    pub id: String,
    pub dir: PathBuf,
    /// The kernel ELF (`-kernel`; QEMU uses its PVH entry).
    pub kernel: PathBuf,
    /// `-initrd`.
    pub initrd: PathBuf,
    /// The prepared root disk (raw, read-only): the backing file of a per-VM overlay,
    /// `qemu-img create -f qcow2 -b <base_disk> -F raw overlay.qcow2`.
    pub base_disk: PathBuf,
    pub manifest: Manifest,
}

/// A shared hold on an image: while it lives, the image is not removed or rebuilt.
#[derive(Debug)]
pub struct ImageUse {
    _lock: File,
}

impl BuiltImage {
    /// Open the image in `dir`, checking the manifest and the files it names.
    pub fn open(dir: &Path) -> Result<BuiltImage, ImageError> {
        let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        BuiltImage::open_named(dir, name)
    }

    /// [`BuiltImage::open`] for a directory not (yet) named after its id.
    pub(crate) fn open_named(dir: &Path, id: &str) -> Result<BuiltImage, ImageError> {
        let invalid = |reason: String| ImageError::Invalid {
            dir: dir.to_path_buf(),
            reason,
        };
        let path = dir.join("manifest.json");
        let text = match std::fs::read(&path) {
            Ok(t) if t.len() <= 1 << 20 => t,
            Ok(_) => return Err(invalid("manifest.json is larger than 1 MiB".into())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(invalid("no manifest.json (an unfinished build?)".into()))
            }
            Err(e) => return Err(ImageError::io(&path, "read")(e)),
        };
        let manifest: Manifest =
            serde_json::from_slice(&text).map_err(|e| invalid(format!("manifest.json: {e}")))?;
        if manifest.format != MANIFEST_FORMAT {
            return Err(invalid(format!(
                "manifest format {} (this hull reads {MANIFEST_FORMAT}); rebuild it",
                manifest.format
            )));
        }
        if manifest.id != id || !manifest.hash.starts_with(&manifest.id) {
            return Err(invalid(format!(
                "manifest id {} does not match the directory",
                manifest.id
            )));
        }
        let file = |rel: &str| -> Result<PathBuf, ImageError> {
            if rel.is_empty() || rel.contains('/') || rel.contains('\\') || rel.starts_with('.') {
                return Err(invalid(format!(
                    "manifest names a file outside the image: {rel:?}"
                )));
            }
            let p = dir.join(rel);
            if !p.is_file() {
                return Err(invalid(format!("{rel} is missing")));
            }
            Ok(p)
        };
        let img = BuiltImage {
            id: manifest.id.clone(),
            dir: dir.to_path_buf(),
            kernel: file(&manifest.kernel)?,
            initrd: file(&manifest.initrd)?,
            base_disk: file(&manifest.base_disk)?,
            manifest,
        };
        let names = [
            img.manifest.kernel.as_str(),
            img.manifest.initrd.as_str(),
            img.manifest.base_disk.as_str(),
        ];
        digest::check(dir, &names, &img.manifest.files).map_err(|source| ImageError::Changed {
            dir: dir.to_path_buf(),
            source,
        })?;
        Ok(img)
    }

    /// The kernel command line of a normal boot.
    pub fn cmdline(&self) -> &str {
        &self.manifest.guest.cmdline
    }

    /// Hold the image while a VM uses it. Blocks while a build of the same id runs.
    /// The lock file's modification time records the use ([`evict`] removes
    /// the least recently used userland first).
    pub fn lock_shared(&self, cache: &Cache) -> Result<ImageUse, ImageError> {
        let f = cache.lock_file(&self.id)?;
        f.lock_shared()
            .map_err(ImageError::io(&cache.lock_path(&self.id), "lock the image"))?;
        let _ = f.set_modified(std::time::SystemTime::now());
        Ok(ImageUse { _lock: f })
    }

    /// Bytes the image takes on disk (sparse files count what is allocated).
    pub fn disk_usage(&self) -> u64 {
        dir_usage(&self.dir)
    }
}

/// Allocated bytes below `dir` (best effort).
pub fn dir_usage(dir: &Path) -> u64 {
    let mut total = 0;
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    for e in rd.flatten() {
        let Ok(m) = std::fs::symlink_metadata(e.path()) else {
            continue;
        };
        if m.is_dir() {
            total += dir_usage(&e.path());
        } else {
            #[cfg(unix)]
            {
                use std::os::unix::fs::MetadataExt;
                total += m.blocks() * 512;
            }
            #[cfg(not(unix))]
            {
                total += m.len();
            }
        }
    }
    total
}

/// The agent binary hull uses by default: `$HULL_AGENT`; else, in a cargo
/// build tree (`target/<profile>/hull`), the static agent built beside it
/// (`target/x86_64-unknown-linux-musl/<profile>/hull-agent`) when there is
/// one; else `hull-agent` next to the running `hull`.
pub fn default_agent_path() -> Result<PathBuf, ImageError> {
    if let Some(p) = &crate::settings::get().agent {
        return Ok(p.clone());
    }
    let exe = std::env::current_exe().map_err(ImageError::io(
        Path::new("/proc/self/exe"),
        "find the hull binary",
    ))?;
    let musl = exe.parent().and_then(|dir| {
        Some(
            dir.parent()?
                .join(STATIC_AGENT_TARGET)
                .join(dir.file_name()?)
                .join("hull-agent"),
        )
    });
    match musl {
        Some(m) if m.is_file() => Ok(m),
        _ => Ok(exe.with_file_name("hull-agent")),
    }
}

/// The target tier 3's agent is built for: static, loading nothing.
pub const STATIC_AGENT_TARGET: &str = "x86_64-unknown-linux-musl";

/// Read the agent binary (bounded) and check it is a Linux x86-64 ELF.
pub fn read_agent(path: &Path) -> Result<Vec<u8>, ImageError> {
    const MAX_AGENT: u64 = 512 << 20;
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(ImageError::AgentMissing {
                path: path.to_path_buf(),
            })
        }
        Err(e) => return Err(ImageError::io(path, "inspect the agent binary")(e)),
    };
    let not_linux = |why: &str| ImageError::AgentNotLinux {
        path: path.to_path_buf(),
        why: why.into(),
    };
    if !meta.is_file() || meta.len() > MAX_AGENT {
        return Err(not_linux("not a regular file of at most 512 MiB"));
    }
    let bytes = std::fs::read(path).map_err(ImageError::io(path, "read the agent binary"))?;
    check_linux_x86_64_elf(&bytes).map_err(not_linux)?;
    check_static(&bytes).map_err(|why| ImageError::AgentNotStatic {
        path: path.to_path_buf(),
        why,
    })?;
    Ok(bytes)
}

/// No program interpreter (`PT_INTERP`) and no needed library
/// (`DT_NEEDED`): the kernel runs it as it is, and nothing is loaded. A
/// static PIE keeps a dynamic section for its own relocations, which is
/// fine. Headers out of the file's bounds are refused.
fn check_static(b: &[u8]) -> Result<(), String> {
    let at = |off: u64, len: u64| -> Result<&[u8], String> {
        let end = off.checked_add(len).ok_or("a header out of bounds")?;
        b.get(
            usize::try_from(off).map_err(|_| "a header out of bounds")?
                ..usize::try_from(end).map_err(|_| "a header out of bounds")?,
        )
        .ok_or_else(|| "a header out of bounds".to_string())
    };
    let u16_at = |x: &[u8], i: usize| u16::from_le_bytes([x[i], x[i + 1]]);
    let u32_at = |x: &[u8], i: usize| u32::from_le_bytes(x[i..i + 4].try_into().unwrap_or([0; 4]));
    let u64_at = |x: &[u8], i: usize| u64::from_le_bytes(x[i..i + 8].try_into().unwrap_or([0; 8]));
    let phoff = u64_at(b, 32);
    let phentsize = u64::from(u16_at(b, 54));
    let phnum = u64::from(u16_at(b, 56));
    if phnum == 0 {
        return Ok(());
    }
    if phentsize < 56 {
        return Err("program headers of an unknown size".into());
    }
    for i in 0..phnum {
        let off = i
            .checked_mul(phentsize)
            .and_then(|o| o.checked_add(phoff))
            .ok_or("a header out of bounds")?;
        let ph = at(off, 56)?;
        let (kind, offset, filesz) = (u32_at(ph, 0), u64_at(ph, 8), u64_at(ph, 32));
        match kind {
            3 => {
                let name = at(offset, filesz.min(4096))?;
                let end = name.iter().position(|c| *c == 0).unwrap_or(name.len());
                return Err(format!(
                    "it names the loader {}",
                    String::from_utf8_lossy(&name[..end])
                ));
            }
            2 => {
                let d = at(offset, filesz.min(1 << 20))?;
                for e in d.chunks_exact(16) {
                    match u64_at(e, 0) {
                        0 => break,
                        1 => return Err("it needs shared libraries (DT_NEEDED)".into()),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// ELF64, little-endian, `ET_EXEC`/`ET_DYN`, `EM_X86_64`, System V or Linux ABI.
fn check_linux_x86_64_elf(b: &[u8]) -> Result<(), &'static str> {
    if b.len() < 64 || &b[..4] != b"\x7fELF" {
        return Err("no ELF header");
    }
    if b[4] != 2 || b[5] != 1 {
        return Err("not a 64-bit little-endian ELF");
    }
    if b[7] != 0 && b[7] != 3 {
        return Err("not a Linux ELF");
    }
    let e_type = u16::from_le_bytes([b[16], b[17]]);
    if e_type != 2 && e_type != 3 {
        return Err("not an executable");
    }
    if u16::from_le_bytes([b[18], b[19]]) != 62 {
        return Err("not built for x86-64");
    }
    Ok(())
}

/// The recipe of a policy's container userland: the default one, its `[vm]
/// packages`, or its `[vm] rootfs` tarball checked entry by entry (once per
/// version of the file: its digest is kept in the cache by the file's
/// device, inode, size and times, so a run does not read gigabytes again).
pub fn recipe_for(vm: &crate::policy::VmPolicy) -> Result<recipe::Recipe, ImageError> {
    let imported;
    let path = match (&vm.image, &vm.rootfs) {
        (Some(reference), _) => {
            imported = container_userland(reference)?;
            &imported
        }
        (None, Some(path)) => path,
        (None, None) => return Ok(recipe::Recipe::with_packages(&vm.packages)),
    };
    let cache = Cache::default_location()?;
    let sha256 = rootfs_digest(&cache, path)?;
    Ok(recipe::Recipe::with_rootfs(recipe::RootfsSource {
        path: path.clone(),
        sha256,
    }))
}

/// The userland tarball of the container image `reference` (imported
/// into the cache once: [`container_image::import`]).
#[cfg(target_os = "linux")]
fn container_userland(reference: &str) -> Result<PathBuf, ImageError> {
    let cache = Cache::default_location()?;
    let mut say = container_image::say(false);
    Ok(container_image::import(&cache, reference, &mut say)?.rootfs)
}

#[cfg(not(target_os = "linux"))]
fn container_userland(reference: &str) -> Result<PathBuf, ImageError> {
    Err(ImageError::ContainerImage {
        reference: reference.to_string(),
        why: "container images are read on Linux hosts only so far".into(),
    })
}

/// Lowercase hex of `b` (digests, ids, disk names).
pub(crate) use crate::text::hex;

/// The most tarballs whose digests the cache remembers.
const MAX_ROOTFS_DIGESTS: usize = 64;

/// The digest of a checked rootfs tarball, from the cache's record when the
/// file is the one recorded, else by checking it (and recording it).
fn rootfs_digest(cache: &Cache, path: &Path) -> Result<String, ImageError> {
    // Private before anything in it is read or written.
    let dir = cache.open_private()?;
    let f = rootfs::open(path)?;
    let stamp = file_stamp(&f);
    let mut known: BTreeMap<String, (String, String)> = dir
        .read(ROOTFS_DIGESTS, 1 << 20)
        .ok()
        .flatten()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    let key = path.display().to_string();
    if let (Some(stamp), Some((was, sha))) = (&stamp, known.get(&key)) {
        if was == stamp {
            return Ok(sha.clone());
        }
    }
    let checked = rootfs::check_opened(path, f)?;
    if let Some(stamp) = stamp {
        if known.len() >= MAX_ROOTFS_DIGESTS {
            known.clear();
        }
        known.insert(key, (stamp, checked.sha256.clone()));
        // Best effort: a record not written costs a check next time.
        if let Ok(b) = serde_json::to_vec(&known) {
            if let Err(e) = dir.replace(ROOTFS_DIGESTS, &b) {
                tracing::warn!("image cache: cannot record the rootfs digest: {e}");
            }
        }
    }
    Ok(checked.sha256)
}

/// The cache's record of checked rootfs tarballs.
const ROOTFS_DIGESTS: &str = "rootfs-digests.json";

/// Device, inode, size, modification and change times of the open file: a
/// file with the same stamp has not been written since (ctime moves with
/// every write).
#[cfg(unix)]
fn file_stamp(f: &std::fs::File) -> Option<String> {
    Some(stamp_of(&f.metadata().ok()?))
}

/// A file's version as a record keeps it: its device, inode, size and
/// modification and change times.
#[cfg(unix)]
pub(crate) fn stamp_of(m: &std::fs::Metadata) -> String {
    use std::os::unix::fs::MetadataExt;
    format!(
        "{}:{}:{}:{}.{}:{}.{}",
        m.dev(),
        m.ino(),
        m.size(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec()
    )
}

/// Without a change time the digest is taken every time.
#[cfg(not(unix))]
fn file_stamp(_f: &std::fs::File) -> Option<String> {
    None
}

/// The built image of `recipe`, or [`ImageError::NotBuilt`].
pub fn find(cache: &Cache, recipe: &recipe::Recipe) -> Result<BuiltImage, ImageError> {
    let id = recipe.id();
    cache.check_private()?;
    match BuiltImage::open(&cache.image_dir(&id)) {
        Ok(img) => Ok(img),
        Err(ImageError::Invalid { .. }) => Err(ImageError::NotBuilt {
            id,
            userland: recipe.userland(),
        }),
        Err(e) => Err(e),
    }
}

/// What a VM boots: an image directory and the agent's disk for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestImage {
    pub dir: PathBuf,
    pub agent: agent_disk::AgentDisk,
}

impl GuestImage {
    /// The image in `dir` with the disk of the agent at `agent` (made
    /// there when missing).
    pub fn with_agent(dir: &Path, agent: &Path) -> Result<GuestImage, ImageError> {
        Ok(GuestImage {
            dir: dir.to_path_buf(),
            agent: agent_disk::ensure(dir, agent)?,
        })
    }

    /// [`GuestImage::with_agent`] without making the disk (it may be missing).
    pub fn looking_at(dir: &Path, agent: &Path) -> Result<GuestImage, ImageError> {
        Ok(GuestImage {
            dir: dir.to_path_buf(),
            agent: agent_disk::locate_only(dir, agent)?,
        })
    }

    /// The image's id (its directory's name).
    pub fn id(&self) -> String {
        self.dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }
}

/// Resolve an id prefix (or a full directory name) among the cache entries.
pub fn resolve(cache: &Cache, query: &str) -> Result<(String, PathBuf), ImageError> {
    let mut hits: Vec<(String, PathBuf)> = Vec::new();
    for e in cache.entries()? {
        let (name, dir) = match e {
            Entry::Built(img) => (img.id.clone(), img.dir.clone()),
            Entry::Broken { id, dir, .. } => (id, dir),
            Entry::Partial { dir, .. } => {
                let n = dir
                    .file_name()
                    .and_then(|n| n.to_str())
                    .unwrap_or_default()
                    .to_owned();
                (n, dir)
            }
        };
        if name == query {
            return Ok((name, dir));
        }
        if !query.is_empty() && name.starts_with(query) && !name.contains(".partial-") {
            hits.push((name, dir));
        }
    }
    match hits.len() {
        0 => Err(ImageError::NoMatch {
            query: query.into(),
            root: cache.root().to_path_buf(),
        }),
        1 => Ok(hits.remove(0)),
        _ => Err(ImageError::Ambiguous {
            query: query.into(),
            ids: hits
                .iter()
                .map(|h| h.0.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

/// Remove the image (or partial build) `query` names. Refuses while a VM or a build
/// holds its lock.
pub fn remove(cache: &Cache, query: &str) -> Result<PathBuf, ImageError> {
    let (name, dir) = resolve(cache, query)?;
    let id = cache::partial_id(&name).unwrap_or(&name).to_owned();
    let lock = cache.lock_file(&id)?;
    if lock.try_lock().is_err() {
        let lock = cache.lock_path(&id);
        return Err(ImageError::InUse { id, lock });
    }
    cache::remove_tree(&dir)?;
    Ok(dir)
}

/// The most a container userland's packages may take, to download and
/// installed, when `HULL_USERLAND_MAX` is not set (the build's first step
/// checks the sizes the package list resolves to in the mirror's index).
pub const DEFAULT_USERLAND_MAX: u64 = 5 << 30;

/// The size [`evict`] keeps the cache under when `HULL_IMAGE_CACHE_MAX`
/// is not set: about 15 userland images of 2.5 GiB with their snapshots.
pub const DEFAULT_CACHE_MAX: u64 = 40 << 30;

/// Brings the cache back under `cap` bytes, counting everything under it
/// (images, the guests' kept systems, partial builds, logs): removes dead
/// partial builds first (always: they are never used), then failed
/// builds' logs, then images of other recipes (no hull of this build uses
/// them), then userland images (`[vm] packages`, `[vm] rootfs`), least
/// recently used first, then imported container images not used for an
/// hour, least recently used first. Never this recipe's default image, the image
/// `keep`, one a VM or a build holds, or a live build. Returns what it
/// removed and the bytes each freed.
pub fn evict(cache: &Cache, cap: u64, keep: &str) -> Result<Vec<(String, u64)>, ImageError> {
    let mut removed = cache.remove_dead_partials()?;
    let mut total = dir_usage(cache.root());
    if total > cap {
        removed.extend(remove_failed_logs(cache, keep));
        total = dir_usage(cache.root());
    }
    let base = recipe::image_id();
    // (not of this recipe, last use, id, dir, bytes)
    let mut candidates = Vec::new();
    for e in cache.entries()? {
        if let cache::Entry::Built(img) = e {
            if img.id == keep || img.id == base {
                continue;
            }
            let bytes = img.disk_usage();
            let stale = recipe::Recipe::of_image(&img.manifest).id() != img.id;
            let used = std::fs::metadata(cache.lock_path(&img.id))
                .and_then(|m| m.modified())
                .unwrap_or(std::time::UNIX_EPOCH);
            candidates.push((!stale, used, img.id.clone(), img.dir.clone(), bytes));
        }
    }
    candidates.sort();
    for (_, _, id, dir, bytes) in candidates {
        if total <= cap {
            break;
        }
        let lock = cache.lock_file(&id)?;
        if lock.try_lock().is_err() {
            continue;
        }
        cache::remove_tree(&dir)?;
        drop(lock);
        total = total.saturating_sub(bytes);
        removed.push((id, bytes));
    }
    // Then container images imported and flattened, least recently used
    // first (one is read again when a run names it).
    #[cfg(target_os = "linux")]
    for (_, digest, bytes) in container_image::evictable(cache) {
        if total <= cap {
            break;
        }
        if container_image::remove(cache, &digest).is_ok() {
            total = total.saturating_sub(bytes);
            removed.push((digest, bytes));
        }
    }
    Ok(removed)
}

/// Removes every failed build's log but `keep`'s.
fn remove_failed_logs(cache: &Cache, keep: &str) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(cache.root()) else {
        return out;
    };
    let kept = format!("{keep}.{}", build::FAILED_LOG);
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(id) = name.strip_suffix(&format!(".{}", build::FAILED_LOG)) else {
            continue;
        };
        let is_file = e.file_type().map(|t| t.is_file()).unwrap_or(false);
        if name == kept || !cache::is_id(id) || !is_file {
            continue;
        }
        let bytes = dir_usage_of_file(&e.path());
        if std::fs::remove_file(e.path()).is_ok() {
            out.push((name, bytes));
        }
    }
    out
}

fn dir_usage_of_file(p: &Path) -> u64 {
    let Ok(m) = std::fs::symlink_metadata(p) else {
        return 0;
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        m.blocks() * 512
    }
    #[cfg(not(unix))]
    {
        m.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cache another user made (or one others can write) is refused
    /// before root reads or writes anything in it: a link planted at the
    /// digest record's temporary name once made root overwrite the file it
    /// named, and only then refuse the cache.
    #[cfg(unix)]
    #[test]
    fn a_planted_cache_is_refused_before_anything_is_written_in_it() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let tar = rootfs::tests::tarball(t.path(), &rootfs::tests::base());
        let victim = t.path().join("victim");
        std::fs::write(&victim, b"root's own").unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
        let planted = t.path().join("planted");
        std::fs::create_dir(&planted).unwrap();
        for name in ["rootfs-digests.json.tmp", "rootfs-digests.json"] {
            std::os::unix::fs::symlink(&victim, planted.join(name)).unwrap();
        }
        // Another user's: `nobody` as root; as anyone else, one all can write.
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            std::os::unix::fs::lchown(&planted, Some(65534), Some(65534)).unwrap();
            for name in ["rootfs-digests.json.tmp", "rootfs-digests.json"] {
                std::os::unix::fs::lchown(planted.join(name), Some(65534), Some(65534)).unwrap();
            }
        } else {
            std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o777)).unwrap();
        }
        let e = rootfs_digest(&Cache::at(&planted), &tar)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not private"), "{e}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"root's own");
        // The control: a cache of our own records the digest, in a file of
        // its own (a link planted there is replaced, never followed).
        let own = t.path().join("own");
        std::fs::create_dir(&own).unwrap();
        std::fs::set_permissions(&own, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::symlink(&victim, own.join("rootfs-digests.json.tmp")).unwrap();
        let sha = rootfs_digest(&Cache::at(&own), &tar).unwrap();
        let record = std::fs::read_to_string(own.join("rootfs-digests.json")).unwrap();
        assert!(record.contains(&sha), "{record}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"root's own");
    }

    fn fake_image(cache: &Cache, id: &str) -> PathBuf {
        let dir = cache.image_dir(id);
        std::fs::create_dir_all(&dir).unwrap();
        for f in ["vmlinux", "initrd.cpio", "disk.raw"] {
            std::fs::write(dir.join(f), b"x").unwrap();
        }
        let files = digest::compute(&dir, &["vmlinux", "initrd.cpio", "disk.raw"]).unwrap();
        let m = Manifest {
            format: MANIFEST_FORMAT,
            id: id.into(),
            hash: format!("{id}{}", "0".repeat(48)),
            created_unix: 1,
            kernel: "vmlinux".into(),
            initrd: "initrd.cpio".into(),
            base_disk: "disk.raw".into(),
            base_disk_format: "raw".into(),
            files,
            guest: GuestContract::current(),
            info: BTreeMap::new(),
            steps: vec![],
            build_seconds: 1.0,
            packages: vec![],
            rootfs: None,
        };
        std::fs::write(dir.join("manifest.json"), serde_json::to_vec(&m).unwrap()).unwrap();
        dir
    }

    /// A fake image of this recipe with `packages` (its id is theirs).
    fn fake_userland(cache: &Cache, packages: &[&str]) -> String {
        let packages: Vec<String> = packages.iter().map(|p| p.to_string()).collect();
        let r = recipe::Recipe::with_packages(&packages);
        let id = r.id();
        let dir = fake_image(cache, &id);
        let path = dir.join("manifest.json");
        let mut m: Manifest = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        m.hash = r.hash();
        m.packages = packages;
        std::fs::write(&path, serde_json::to_vec(&m).unwrap()).unwrap();
        std::fs::write(dir.join("disk.raw.extra"), vec![1u8; 64 << 10]).unwrap();
        id
    }

    /// Over the cap, images of other recipes go first, then userland
    /// images least recently used first; the image just built, this
    /// recipe's default one and one a VM holds stay.
    #[test]
    fn eviction_keeps_the_default_the_new_and_the_used() {
        let d = tempfile::tempdir().unwrap();
        let cache = Cache::at(d.path().join("images"));
        fake_image(&cache, &recipe::image_id());
        fake_image(&cache, "00000000000000aa");
        let (base, old) = (recipe::image_id(), "00000000000000aa".to_string());
        let a = fake_userland(&cache, &["nodejs"]);
        let b = fake_userland(&cache, &["cargo"]);
        let c = fake_userland(&cache, &["npm"]);
        let new = fake_userland(&cache, &["golang"]);
        let t = |secs| std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs);
        for (id, used) in [(&a, 300), (&b, 100), (&c, 200)] {
            cache.lock_file(id).unwrap().set_modified(t(used)).unwrap();
        }
        // b is the least recently used, but a VM holds it.
        let img_b = BuiltImage::open(&cache.image_dir(&b)).unwrap();
        let hold = img_b.lock_shared(&cache).unwrap();
        let size = |id: &str| dir_usage(&cache.image_dir(id));
        let all: u64 = [&base, &old, &a, &b, &c, &new]
            .iter()
            .map(|i| size(i))
            .sum();
        // Room for everything but about two userland images.
        let cap = all - size(&a) - size(&c) + 1;
        let removed: Vec<String> = evict(&cache, cap, &new)
            .unwrap()
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        assert_eq!(removed, [old, c, a]);
        for kept in [&base, &b, &new] {
            assert!(cache.image_dir(kept).is_dir(), "{kept}");
        }
        drop(hold);
        // Under the cap, nothing goes.
        assert!(evict(&cache, u64::MAX, &new).unwrap().is_empty());
    }

    /// Dead partial builds are removed by eviction whatever the cap, a live
    /// one is kept, and the cap counts everything under the cache (the
    /// guests' kept systems, logs), not only its images.
    #[test]
    fn eviction_removes_dead_partials_and_counts_everything() {
        let d = tempfile::tempdir().unwrap();
        let cache = Cache::at(d.path().join("images"));
        fake_image(&cache, &recipe::image_id());
        let a = fake_userland(&cache, &["nodejs"]);
        let partial = |id: &str, pid: u32| {
            let dir = cache.root().join(format!("{id}.partial-{pid}"));
            std::fs::create_dir_all(dir.join("work")).unwrap();
            std::fs::write(dir.join("work/disk.raw"), vec![1u8; 256 << 10]).unwrap();
            dir
        };
        let dead = partial("00000000000000dd", 4_000_001);
        let live = partial("00000000000000ee", 4_000_002);
        let holder = cache.lock_file("00000000000000ee").unwrap();
        holder.lock().unwrap();
        // Under any cap: the dead partial goes, the live one stays.
        let removed = evict(&cache, u64::MAX, "").unwrap();
        assert_eq!(
            removed.iter().map(|r| r.0.as_str()).collect::<Vec<_>>(),
            ["00000000000000dd.partial-4000001"]
        );
        assert!(removed[0].1 >= 256 << 10);
        assert!(!dead.exists() && live.is_dir() && cache.image_dir(&a).is_dir());
        drop(holder);
        // The guests' kept systems and a failed build's log count: with
        // them the cache is over a cap its images fit under.
        let bases = cache.root().join(cache::GUEST_BASES).join("k");
        std::fs::create_dir_all(&bases).unwrap();
        std::fs::write(bases.join("rootfs"), vec![1u8; 512 << 10]).unwrap();
        let log = cache
            .root()
            .join(format!("00000000000000cc.{}", build::FAILED_LOG));
        std::fs::write(&log, vec![b'x'; 64 << 10]).unwrap();
        let images =
            dir_usage(&cache.image_dir(&recipe::image_id())) + dir_usage(&cache.image_dir(&a));
        let removed = evict(&cache, images + (64 << 10), "").unwrap();
        let names: Vec<_> = removed.iter().map(|r| r.0.as_str()).collect();
        // The live partial's build ended (its lock let go): dead now.
        assert!(
            names.contains(&"00000000000000ee.partial-4000002"),
            "{names:?}"
        );
        assert!(
            names.contains(&log.file_name().unwrap().to_str().unwrap()),
            "{names:?}"
        );
        assert!(names.contains(&a.as_str()), "{names:?}");
        assert!(dir_usage(cache.root()) <= images + (64 << 10) + (600 << 10));
    }

    #[test]
    fn open_checks_manifest_and_files() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = Cache::at(tmp.path());
        let dir = fake_image(&cache, "0123456789abcdef");
        let img = BuiltImage::open(&dir).unwrap();
        assert_eq!(img.kernel, dir.join("vmlinux"));
        assert_eq!(img.cmdline(), KERNEL_CMDLINE);
        std::fs::write(dir.join("initrd.cpio"), b"y").unwrap();
        let e = BuiltImage::open(&dir).unwrap_err();
        assert!(
            e.to_string()
                .contains("initrd.cpio does not match the digest"),
            "{e}"
        );
        std::fs::remove_file(dir.join("disk.raw")).unwrap();
        let e = BuiltImage::open(&dir).unwrap_err();
        assert!(e.to_string().contains("disk.raw is missing"), "{e}");
    }

    #[test]
    fn manifest_cannot_point_outside_the_image() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = Cache::at(tmp.path());
        let dir = fake_image(&cache, "0123456789abcdef");
        let mut m: Manifest =
            serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
        m.base_disk = "../../etc/passwd".into();
        std::fs::write(dir.join("manifest.json"), serde_json::to_vec(&m).unwrap()).unwrap();
        let e = BuiltImage::open(&dir).unwrap_err();
        assert!(e.to_string().contains("outside the image"), "{e}");
    }

    #[test]
    fn remove_resolves_prefixes_and_respects_the_use_lock() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = Cache::at(tmp.path());
        let a = fake_image(&cache, "0123456789abcdef");
        let b = fake_image(&cache, "0123999999999999");
        assert!(matches!(
            remove(&cache, "0123"),
            Err(ImageError::Ambiguous { .. })
        ));
        assert!(matches!(
            remove(&cache, "ffff"),
            Err(ImageError::NoMatch { .. })
        ));
        let img = BuiltImage::open(&a).unwrap();
        let hold = img.lock_shared(&cache).unwrap();
        assert!(matches!(
            remove(&cache, "012345"),
            Err(ImageError::InUse { .. })
        ));
        assert!(a.exists());
        drop(hold);
        assert_eq!(remove(&cache, "012345").unwrap(), a);
        assert!(!a.exists());
        assert!(b.exists());
    }

    #[test]
    fn agent_must_be_a_linux_x86_64_elf() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("agent");
        assert!(matches!(
            read_agent(&p),
            Err(ImageError::AgentMissing { .. })
        ));
        std::fs::write(&p, b"#!/bin/sh\n").unwrap();
        assert!(matches!(
            read_agent(&p),
            Err(ImageError::AgentNotLinux { .. })
        ));
        let mut elf = vec![0u8; 64];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[4] = 2;
        elf[5] = 1;
        elf[16] = 3;
        elf[18] = 183; // aarch64
        std::fs::write(&p, &elf).unwrap();
        let e = read_agent(&p).unwrap_err();
        assert!(e.to_string().contains("x86-64"), "{e}");
        elf[18] = 62;
        std::fs::write(&p, &elf).unwrap();
        assert_eq!(read_agent(&p).unwrap(), elf);
    }

    /// The agent is the container's init: one with an interpreter or
    /// needed libraries would load the container's own loader, libc and
    /// `/etc/ld.so.preload` as container root (a `[vm] rootfs` is anyone's).
    /// The host's dynamic `true` is refused, naming its loader; a static
    /// build (the workspace's musl agent, when built) passes.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_dynamically_linked_agent_is_refused() {
        let t = ["/usr/bin/true", "/bin/true"]
            .into_iter()
            .map(Path::new)
            .find(|p| p.is_file())
            .expect("a true binary");
        let e = read_agent(t).unwrap_err().to_string();
        assert!(
            e.contains("dynamically linked") && e.contains("ld-linux") && e.contains("musl"),
            "{e}"
        );
        let musl = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../target/x86_64-unknown-linux-musl/debug/hull-agent");
        if musl.is_file() {
            read_agent(&musl).unwrap();
        }
    }

    #[test]
    fn the_recipe_uses_the_contract_names() {
        let text = |p: &str| {
            let f = recipe::FILES.iter().find(|f| f.path == p).unwrap();
            String::from_utf8(f.bytes.to_vec()).unwrap()
        };
        let init = text("guest/hull-init");
        assert!(
            init.contains(&format!("--port {AGENT_PORT}")),
            "hull-init port"
        );
        let prep = text("guest/hull-prepare");
        for name in [BASE_CONTAINER, RUN_CONTAINER, IMAGE_ALIAS] {
            assert!(prep.contains(name), "hull-prepare does not use {name}");
        }
        assert!(
            prep.contains(&format!("both {GUEST_UID} {GUEST_GID}")),
            "raw.idmap"
        );
        // Every exec names its user or ids (the host's choice, uid 1000
        // unless a session names another user of the container).
        assert!(
            prep.contains("hull-agent inner --listen-unix /run/hull/inner.sock'")
                && !prep.contains("--run-as"),
            "inner agent"
        );
        let dir = agent_disk::GUEST_DIR;
        assert!(
            init.contains(&format!("/dev/vdb {dir}"))
                && init.contains(&format!("{dir}/{}", agent_disk::FILE)),
            "hull-init mounts the agent disk"
        );
        assert!(
            prep.contains(&format!("source={dir} path={dir} readonly=true")),
            "hull-base gets the agent directory read-only"
        );
        let build = text("build.sh");
        assert!(build.contains(&format!("root:{GUEST_UID}:1")));
        assert!(!build.contains("hull-agent\""), "the image holds no agent");
        assert!(KERNEL_CMDLINE.contains("root=/dev/vda"));
    }
}
