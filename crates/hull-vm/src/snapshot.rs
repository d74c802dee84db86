//! Prepared VM snapshots: tier 3 without booting on the hot path.
//!
//! Once per image and agent (and per QEMU, accelerator and VM size), [`ensure`] boots the
//! guest with [`SLOTS`] virtiofs devices that serve an empty read-only
//! directory and are never mounted, asks the outer agent to start the
//! pristine run container with no shares (`Configure { prepare: true }`),
//! closes the session, and saves the VM with QMP (`migrate` to a file with
//! the mapped-ram capability). What it writes, in `<image>/snapshot-<agent>/`
//! (`<agent>`: the first 16 hex digits of the agent's sha256):
//! `disk.qcow2` (the root disk as it was at that moment, a qcow2 over the
//! image's `disk.raw`), `state.mig` (memory and devices) and
//! `manifest.json` (the [`Geometry`] it was made for, written last).
//!
//! Each run then [`restore`]s it: a new QEMU with the same devices and
//! `-incoming defer`, the disk attached with `snapshot=on` (a throwaway
//! overlay, so every run starts from the same disk and memory and nothing a
//! run writes reaches the next), fresh virtiofsd processes serving this
//! run's directories behind the slot tags, `migrate-incoming`, `cont`. The
//! agent then mounts the slots, sets the clock, reseeds the CRNG, hot-adds
//! the shares and limits to the already running container, and runs the
//! command.
//!
//! A plan whose memory limit needs a bigger VM than the default snapshot's
//! gets a snapshot of its own size ([`memory_for`]: `snapshot-<agent>-<MiB>m/`,
//! rounded up to a whole GiB), built once like the default one, so no
//! policy's limit forces a boot.
//!
//! Protects against: a snapshot of other inputs being restored (the
//! geometry names image, agent, QEMU version, accelerator, memory, vCPUs,
//! slots and kernel command line; any change rebuilds), a half-written snapshot being
//! used (built in `<dir>.partial-<pid>/`, renamed into place after the
//! manifest; an exclusive lock serialises builders, a shared lock is held by
//! each restore so nothing replaces it under a run), state crossing runs (a
//! fresh overlay per restore; the container is only ever configured once).
//! Does not protect against: identical guest memory across restores beyond
//! the CRNG (ASLR of processes started before the snapshot is shared by
//! every restore; the command itself starts after the restore).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use hull_protocol::{ConfigureSpec, ContainerSpec};

use super::image::{agent_disk, GuestImage};
use super::machine::{BootImage, Machine, MachineError, MachineSpec, Tools};
use super::qemu::{Accel, Disk, DiskFormat, Incoming};
use super::virtiofsd::{SandboxMode, VirtiofsdSpec};
use crate::policy::lower::vm::{self as lower_vm, VmPlan, GUEST_SHARE_ROOT};

/// virtiofs devices every snapshot has; a plan with more shares boots cold.
pub const SLOTS: usize = 8;
/// `manifest.json` format of a snapshot, and of the device set it was
/// saved with (3: the network channel's port).
pub const SNAPSHOT_FORMAT: u32 = 3;
/// VM memory of the default snapshot: the default policy's 4 GiB container
/// limit plus the guest's own needs. RAM is a memfd the host backs only as
/// it is touched.
pub const SNAPSHOT_MEMORY_MIB: u32 = 4096 + 768;
/// The file names inside a snapshot directory.
const DISK: &str = "disk.qcow2";
const STATE: &str = "state.mig";
const MANIFEST: &str = "manifest.json";

/// Added to the kernel command line of the boot a snapshot is made from:
/// freed guest pages are zeroed, and zero pages are left out of the state
/// file and of what a restore loads (about a quarter less here). Not on the
/// plain boot path: zeroing every page the kernel frees at boot costs about
/// 20 s under TCG.
pub const SNAPSHOT_CMDLINE_EXTRA: &str = "init_on_free=1";

/// The virtiofs tag of slot `i`.
pub fn slot_tag(i: usize) -> String {
    format!("hull{i}")
}

/// What a snapshot was made for; a restore must match it exactly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Geometry {
    pub format: u32,
    pub image_id: String,
    /// sha256 of the agent on the agent disk (the guest runs it from there).
    pub agent_sha256: String,
    /// Which agent disk file (its stamp): the guest's cached view is of it.
    pub agent_disk: String,
    pub qemu_version: String,
    pub accel: String,
    pub memory_mib: u32,
    pub cpus: u32,
    pub slots: usize,
    pub cmdline: String,
}

/// `manifest.json` of a snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotManifest {
    pub geometry: Geometry,
    pub created_unix: u64,
    /// Seconds from QEMU start to the agent's hello, to the prepared
    /// container, and to the saved state.
    pub boot_s: f64,
    pub prepare_s: f64,
    pub save_s: f64,
    /// Bytes of the state file that hold data (it is sparse).
    pub state_bytes: u64,
}

/// A complete snapshot on disk.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub dir: PathBuf,
    pub disk: PathBuf,
    pub state: PathBuf,
    pub manifest: SnapshotManifest,
}

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("tier vm snapshot: {path}: cannot {what}: {source}")]
    Io {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("tier vm snapshot: qemu-img not found next to {qemu} or on PATH; install qemu-utils (scripts/setup.sh --tier3)")]
    NoQemuImg { qemu: PathBuf },
    #[error("tier vm snapshot: `{cmd}` failed: {stderr}")]
    QemuImg { cmd: String, stderr: String },
    #[error("tier vm snapshot: {step} failed: {source}")]
    Machine {
        step: &'static str,
        #[source]
        source: MachineError,
    },
    #[error("tier vm snapshot: {step}: {why}\n  console log: {console}")]
    Guest {
        step: &'static str,
        why: String,
        console: PathBuf,
    },
    #[error("tier vm snapshot: restoring {dir} failed: {why}\n  console log: {console}")]
    Restore {
        dir: PathBuf,
        why: String,
        console: PathBuf,
    },
}

fn io_err(path: &Path, what: &'static str) -> impl FnOnce(io::Error) -> SnapshotError {
    let path = path.to_path_buf();
    move |source| SnapshotError::Io { path, what, source }
}

/// The geometry a snapshot of `image` (booted as `boot`) needs on this host.
pub fn geometry(image: &GuestImage, boot: &BootImage, tools: &Tools, accel: Accel) -> Geometry {
    let host = std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(1);
    Geometry {
        format: SNAPSHOT_FORMAT,
        image_id: image.id(),
        agent_sha256: image.agent.sha256.clone(),
        agent_disk: image.agent.stamp.clone(),
        qemu_version: tools.qemu_version.clone(),
        accel: accel.name().to_owned(),
        memory_mib: SNAPSHOT_MEMORY_MIB,
        cpus: host.clamp(1, 2),
        slots: SLOTS,
        cmdline: format!("{} {SNAPSHOT_CMDLINE_EXTRA}", boot.cmdline),
    }
}

/// The VM memory of the snapshot `plan` restores from: the default
/// snapshot's when its limit fits there, else the VM the limit needs rounded
/// up to a whole GiB (so nearby limits share one snapshot).
pub fn memory_for(plan: &VmPlan) -> u32 {
    let need = crate::shape::vm_memory_mib(plan);
    if need <= SNAPSHOT_MEMORY_MIB {
        SNAPSHOT_MEMORY_MIB
    } else {
        need.div_ceil(1024) * 1024
    }
}

/// Whether `plan` fits a snapshot of `g`: at most [`SLOTS`] shares and a
/// memory limit the snapshot's VM can hold. (A plan that does not fit boots
/// cold: the same boundary, only slower.)
pub fn fits(plan: &VmPlan, g: &Geometry) -> Result<(), String> {
    let devices = devices(&slotted(plan, g.slots));
    if devices > g.slots {
        return Err(format!(
            "the policy needs {devices} virtiofs shares (its read-only grants without masks \
             packed into one), a snapshot has {} slots",
            g.slots
        ));
    }
    let need = crate::shape::vm_memory_mib(plan);
    if need > g.memory_mib {
        return Err(format!(
            "the policy's memory limit needs a {need} MiB VM, the snapshot has {} MiB",
            g.memory_mib
        ));
    }
    Ok(())
}

/// Whether a share may be packed with others into one virtiofs device: a
/// read-only grant of the policy with nothing masked inside (masks are
/// mounted per share), and not a `--cow` overlay's lower layer (mounted
/// on its own beneath the overlay).
fn packable(plan: &VmPlan, s: &lower_vm::Share) -> bool {
    s.readonly
        && s.origin == lower_vm::ShareOrigin::Policy
        && s.masks.is_empty()
        && !plan.is_overlay_lower(s)
}

/// `plan` with its shares renamed to slot tags (`hull0`, ...), mounted in
/// the guest at `/mnt/hull/<slot tag>`, in the plan's order (a share nested
/// in another is attached after it). When the plan has more shares than
/// `slots`, its [`packable`] shares go through one slot together, each as a
/// directory of that device's view (`subdir` `0`, `1`, ...), so a policy
/// with many read-only grants still restores.
pub fn slotted(plan: &VmPlan, slots: usize) -> VmPlan {
    let mut p = plan.clone();
    let can_pack: Vec<bool> = plan.shares.iter().map(|s| packable(plan, s)).collect();
    let pack = p.shares.len() > slots && can_pack.iter().filter(|c| **c).count() >= 2;
    let mut next = 0;
    let mut packed: Option<(String, usize)> = None;
    for (s, can) in p.shares.iter_mut().zip(can_pack) {
        if pack && can {
            let (tag, n) = packed.get_or_insert_with(|| {
                next += 1;
                (slot_tag(next - 1), 0)
            });
            s.tag = tag.clone();
            s.subdir = Some(n.to_string());
            *n += 1;
        } else {
            s.tag = slot_tag(next);
            next += 1;
        }
        s.guest_path = format!("{GUEST_SHARE_ROOT}/{}", s.tag);
    }
    p
}

/// The virtiofs devices a plan needs: one per distinct tag.
fn devices(plan: &VmPlan) -> usize {
    let mut tags: Vec<&str> = plan.shares.iter().map(|s| s.tag.as_str()).collect();
    tags.sort_unstable();
    tags.dedup();
    tags.len()
}

/// The virtiofsd of every slot: the plan's shares first (as
/// [`crate::shape::share_specs`] makes them), then the unused slots,
/// each serving `empty` read-only.
pub fn slot_specs(slotted: &VmPlan, dir: &Path, empty: &Path, slots: usize) -> Vec<VirtiofsdSpec> {
    let mut specs = crate::shape::share_specs(slotted, dir);
    for i in specs.len()..slots {
        let tag = slot_tag(i);
        specs.push(VirtiofsdSpec {
            socket: MachineSpec::share_socket(dir, &tag),
            tag,
            shared_dir: empty.to_path_buf(),
            readonly: true,
            sandbox: SandboxMode::Namespace,
            translate: None,
            masks: Vec::new(),
            views: Vec::new(),
            overlay: None,
        });
    }
    specs
}

/// The name of the snapshot directory for `g`: its agent, and its VM size
/// when that is not the default one.
fn dir_name(g: &Geometry) -> String {
    let agent = &g.agent_sha256[..16.min(g.agent_sha256.len())];
    if g.memory_mib == SNAPSHOT_MEMORY_MIB {
        format!("snapshot-{agent}")
    } else {
        format!("snapshot-{agent}-{}m", g.memory_mib)
    }
}

/// The directory of an image's snapshot for `g`.
pub fn dir_of(image_dir: &Path, g: &Geometry) -> PathBuf {
    image_dir.join(dir_name(g))
}

fn lock_path(image_dir: &Path, g: &Geometry) -> PathBuf {
    image_dir.join(format!("{}.lock", dir_name(g)))
}

/// A hold on a snapshot: while it lives the snapshot is not replaced.
#[derive(Debug)]
pub struct SnapshotUse {
    _lock: fs::File,
    pub snapshot: Snapshot,
}

fn open_lock(image_dir: &Path, g: &Geometry) -> Result<fs::File, SnapshotError> {
    let p = lock_path(image_dir, g);
    fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&p)
        .map_err(io_err(&p, "open the snapshot lock"))
}

/// The complete snapshot in `image_dir` made for `g`, if there is one.
pub fn open(image_dir: &Path, g: &Geometry) -> Option<Snapshot> {
    let dir = dir_of(image_dir, g);
    let text = fs::read(dir.join(MANIFEST)).ok()?;
    if text.len() > 1 << 20 {
        return None;
    }
    let manifest: SnapshotManifest = serde_json::from_slice(&text).ok()?;
    if manifest.geometry != *g {
        return None;
    }
    let (disk, state) = (dir.join(DISK), dir.join(STATE));
    (disk.is_file() && state.is_file()).then_some(Snapshot {
        dir,
        disk,
        state,
        manifest,
    })
}

/// The snapshot for `g`, holding it shared; builds it first (holding the
/// lock exclusively) when it is missing or was made for other inputs.
/// `progress` hears what is happening (a build takes a minute under TCG).
pub fn ensure(
    image_dir: &Path,
    image: &BootImage,
    g: &Geometry,
    tools: &Tools,
    progress: &mut dyn FnMut(&str),
) -> Result<SnapshotUse, SnapshotError> {
    let lock = open_lock(image_dir, g)?;
    let lp = lock_path(image_dir, g);
    lock.lock_shared()
        .map_err(io_err(&lp, "lock the snapshot"))?;
    if let Some(s) = open(image_dir, g) {
        return Ok(SnapshotUse {
            _lock: lock,
            snapshot: s,
        });
    }
    lock.unlock().map_err(io_err(&lp, "unlock the snapshot"))?;
    lock.lock().map_err(io_err(&lp, "lock the snapshot"))?;
    if open(image_dir, g).is_none() {
        build(image_dir, image, g, tools, progress)?;
        prune_old_agents(image_dir, &g.agent_sha256);
    }
    // Downgrade: other runs may restore it now.
    lock.unlock().map_err(io_err(&lp, "unlock the snapshot"))?;
    lock.lock_shared()
        .map_err(io_err(&lp, "lock the snapshot"))?;
    let snapshot = open(image_dir, g).ok_or_else(|| SnapshotError::Io {
        path: dir_of(image_dir, g),
        what: "open the snapshot just built",
        source: io::Error::other("it is missing or does not match"),
    })?;
    Ok(SnapshotUse {
        _lock: lock,
        snapshot,
    })
}

/// Agents whose disk and snapshots an image keeps (the newest by the
/// disk's time, and always the one in use): a debug and a release build
/// used in turn each keep theirs, older builds' go.
pub const KEEP_AGENTS: usize = 3;

/// Removes the agent disks and snapshots of all but the [`KEEP_AGENTS`]
/// newest agents (never `current`'s). A snapshot a run holds (its lock is
/// taken) keeps its agent. Best effort: what cannot go now goes next time.
pub fn prune_old_agents(image_dir: &Path, current: &str) {
    let current = agent_disk::file_name(current);
    let disks = agent_disk::list(image_dir);
    let current = image_dir.join(current);
    let keep: Vec<PathBuf> = std::iter::once(current.clone())
        .chain(disks.iter().map(|d| d.0.clone()).filter(|d| *d != current))
        .take(KEEP_AGENTS)
        .collect();
    for (disk, _) in disks {
        if keep.contains(&disk) {
            continue;
        }
        let Some(short) = disk
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("agent-"))
            .and_then(|n| n.strip_suffix(".ext4"))
        else {
            continue;
        };
        let prefix = format!("snapshot-{short}");
        let snaps: Vec<PathBuf> = fs::read_dir(image_dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.is_dir()
                    && p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n == prefix || n.starts_with(&format!("{prefix}-")))
            })
            .collect();
        // Take every snapshot's lock before removing anything of this agent.
        let mut held = Vec::new();
        let free = snaps.iter().all(|d| {
            let lock = d.with_file_name(format!(
                "{}.lock",
                d.file_name().unwrap_or_default().to_string_lossy()
            ));
            match fs::File::open(&lock) {
                Ok(f) if f.try_lock().is_ok() => {
                    held.push((f, lock));
                    true
                }
                Ok(_) => false,
                Err(_) => true,
            }
        });
        if !free {
            continue;
        }
        for d in &snaps {
            let _ = fs::remove_dir_all(d);
        }
        for (_f, lock) in &held {
            let _ = fs::remove_file(lock);
        }
        let _ = fs::remove_file(&disk);
    }
}

/// [`ensure`] for the image in `image_dir` on this host (its geometry from
/// `tools` and `accel`): what `hull image build` and `hull batch` call.
pub fn ensure_for(
    image: &GuestImage,
    tools: &Tools,
    accel: Accel,
    progress: &mut dyn FnMut(&str),
) -> Result<SnapshotUse, SnapshotError> {
    let boot = BootImage::from_image(image).map_err(|source| SnapshotError::Machine {
        step: "preparing the snapshot: opening the image",
        source,
    })?;
    let g = geometry(image, &boot, tools, accel);
    ensure(&image.dir, &boot, &g, tools, progress)
}

/// Finds `qemu-img` next to QEMU, else on PATH.
fn qemu_img(tools: &Tools) -> Result<PathBuf, SnapshotError> {
    if let Some(dir) = tools.qemu.parent() {
        let p = dir.join("qemu-img");
        if p.is_file() {
            return Ok(p);
        }
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join("qemu-img"))
        .find(|p| p.is_file())
        .ok_or_else(|| SnapshotError::NoQemuImg {
            qemu: tools.qemu.clone(),
        })
}

/// A qcow2 overlay at `overlay` over the raw disk `base` (stored as a path
/// relative to the overlay's directory, so the snapshot can be renamed).
fn create_overlay(tools: &Tools, base: &Path, overlay: &Path) -> Result<(), SnapshotError> {
    let bin = qemu_img(tools)?;
    let rel = Path::new("..").join(base.file_name().unwrap_or_default());
    let out = Command::new(&bin)
        .arg("create")
        .args(["-q", "-f", "qcow2", "-F", "raw", "-b"])
        .arg(&rel)
        .arg(overlay)
        .output()
        .map_err(io_err(&bin, "run qemu-img"))?;
    if !out.status.success() {
        return Err(SnapshotError::QemuImg {
            cmd: format!(
                "{} create -f qcow2 -F raw -b {} {}",
                bin.display(),
                rel.display(),
                overlay.display()
            ),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(())
}

/// Allocated bytes of a (sparse) file.
fn allocated(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(path).map(|m| m.blocks() * 512).unwrap_or(0)
}

/// The machine spec a snapshot is saved from and restored into: only the
/// sockets, logs, disk mode, virtiofsd directories and `incoming` differ.
#[allow(clippy::too_many_arguments)]
fn machine_spec(
    name: String,
    g: &Geometry,
    image: &BootImage,
    disk: &Path,
    restore: bool,
    dir: &Path,
    log_dir: &Path,
    shares: Vec<VirtiofsdSpec>,
) -> MachineSpec {
    let mut image = image.clone();
    image.cmdline = g.cmdline.clone();
    // The root disk becomes the snapshot's overlay; the agent disk stays.
    let root = Disk {
        path: disk.to_path_buf(),
        format: DiskFormat::Qcow2,
        readonly: false,
        snapshot: restore,
    };
    match image.disks.first_mut() {
        Some(d) => *d = root,
        None => image.disks.push(root),
    }
    MachineSpec {
        name,
        dir: dir.to_path_buf(),
        log_dir: log_dir.to_path_buf(),
        image,
        accel: parse_accel(&g.accel),
        memory_mib: g.memory_mib,
        cpus: g.cpus,
        shares,
        incoming: restore.then_some(Incoming::Defer),
        run_as: None,
    }
}

fn parse_accel(name: &str) -> Accel {
    [Accel::Kvm, Accel::Hvf, Accel::Whpx, Accel::Tcg]
        .into_iter()
        .find(|a| a.name() == name)
        .unwrap_or(Accel::Tcg)
}

/// Boots the image, prepares the container, saves the VM. Call holding the
/// snapshot lock exclusively.
fn build(
    image_dir: &Path,
    image: &BootImage,
    g: &Geometry,
    tools: &Tools,
    progress: &mut dyn FnMut(&str),
) -> Result<(), SnapshotError> {
    let final_dir = dir_of(image_dir, g);
    let partial = format!("{}.partial-", dir_name(g));
    // We hold this size's lock exclusively: every partial of this size is a
    // dead builder's (another size's builder holds another lock).
    if let Ok(rd) = fs::read_dir(image_dir) {
        for e in rd.flatten() {
            if e.file_name().to_string_lossy().starts_with(&partial) {
                let _ = fs::remove_dir_all(e.path());
            }
        }
    }
    let tmp = image_dir.join(format!("{partial}{}", std::process::id()));
    fs::create_dir_all(&tmp).map_err(io_err(&tmp, "create"))?;
    let r = build_in(&tmp, image_dir, image, g, tools, progress);
    if let Err(e) = r {
        // The error names the console log: the logs stay (the next
        // preparation of this size removes them), the rest goes now.
        keep_logs_only(&tmp);
        return Err(e);
    }
    // Replace an old snapshot (another geometry) only now.
    if final_dir.exists() {
        fs::remove_dir_all(&final_dir).map_err(io_err(&final_dir, "remove the old snapshot"))?;
    }
    fs::rename(&tmp, &final_dir).map_err(io_err(&final_dir, "move the snapshot into place"))?;
    Ok(())
}

/// Removes everything in a failed preparation's directory but its logs
/// (the console's, QEMU's, the file servers'): the disk overlay and a
/// partial state are hundreds of MiB.
fn keep_logs_only(tmp: &Path) {
    let Ok(rd) = fs::read_dir(tmp) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        let is_log = p.extension().is_some_and(|x| x == "log");
        match e.file_type() {
            Ok(t) if t.is_file() && is_log => {}
            Ok(t) if t.is_dir() => {
                let _ = fs::remove_dir_all(&p);
            }
            _ => {
                let _ = fs::remove_file(&p);
            }
        }
    }
}

fn build_in(
    tmp: &Path,
    image_dir: &Path,
    image: &BootImage,
    g: &Geometry,
    tools: &Tools,
    progress: &mut dyn FnMut(&str),
) -> Result<(), SnapshotError> {
    let base = image
        .disks
        .first()
        .map(|d| d.path.clone())
        .unwrap_or_else(|| image_dir.join("disk.raw"));
    let disk = tmp.join(DISK);
    create_overlay(tools, &base, &disk)?;
    // Sockets go to a short path (a unix socket path has 107 bytes).
    // A new private directory with an unpredictable name (unix sockets need
    // a short path; another user could pre-create a predictable one).
    let id = uuid::Uuid::new_v4().simple().to_string();
    let sock_dir = std::env::temp_dir().join(format!("hull-snapshot-{}", &id[..12]));
    // create_dir fails on a name that exists: never someone else's.
    {
        use std::os::unix::fs::DirBuilderExt;
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&sock_dir)
            .map_err(io_err(&sock_dir, "create"))?;
    }
    let r = boot_and_save(tmp, &sock_dir, &disk, image, g, tools, progress);
    let _ = fs::remove_dir_all(&sock_dir);
    r
}

fn boot_and_save(
    tmp: &Path,
    sock_dir: &Path,
    disk: &Path,
    image: &BootImage,
    g: &Geometry,
    tools: &Tools,
    progress: &mut dyn FnMut(&str),
) -> Result<(), SnapshotError> {
    let empty = sock_dir.join("empty");
    fs::create_dir_all(&empty).map_err(io_err(&empty, "create"))?;
    let no_shares = VmPlan {
        shares: Vec::new(),
        skipped: Vec::new(),
        uid: lower_vm::GUEST_UID,
        gid: lower_vm::GUEST_GID,
        base_container: lower_vm::BASE_CONTAINER.into(),
        limits: Default::default(),
        network: "none",
    };
    let shares = slot_specs(&no_shares, sock_dir, &empty, g.slots);
    let spec = machine_spec(
        "hull-snapshot".into(),
        g,
        image,
        disk,
        false,
        sock_dir,
        tmp,
        shares,
    );
    let (boot_deadline, setup_deadline) = crate::shape::deadlines(parse_accel(&g.accel));
    let t0 = Instant::now();
    progress("booting the guest");
    let mut m = Machine::start(&spec, tools).map_err(|source| SnapshotError::Machine {
        step: "preparing the snapshot: starting the VM",
        source,
    })?;
    let console = m.console_log().to_path_buf();
    let mut agent = m
        .connect_agent(boot_deadline)
        .map_err(|source| SnapshotError::Machine {
            step: "preparing the snapshot: the agent's hello",
            source,
        })?;
    let boot_s = t0.elapsed().as_secs_f64();
    progress("starting the pristine container");
    let cfg = ConfigureSpec {
        shares: Vec::new(),
        container: ContainerSpec {
            name: lower_vm::RUN_CONTAINER.into(),
            base: lower_vm::BASE_CONTAINER.into(),
            uid: lower_vm::GUEST_UID,
            gid: lower_vm::GUEST_GID,
            memory_bytes: None,
            cpus: None,
            processes: None,
        },
        clock_unix_ns: crate::shape::now_ns(),
        prepare: true,
        network: None,
        overlay: None,
    };
    let guest = |step: &'static str, why: String| SnapshotError::Guest {
        step,
        why,
        console: console.clone(),
    };
    agent
        .configure(&cfg, setup_deadline, &mut || false)
        .map_err(|e| guest("prepare the container", e.to_string()))?;
    let prepare_s = t0.elapsed().as_secs_f64() - boot_s;
    // End the session so the agent waits for the next host again, as it
    // must be when a restore connects.
    drop(agent);
    wait_console(&console, "host session ended", Duration::from_secs(30))
        .map_err(|why| guest("end the host session", why))?;
    // Let the agent reach its wait for the next host.
    std::thread::sleep(Duration::from_millis(300));
    progress("saving the VM state");
    let t1 = Instant::now();
    let state = tmp.join(STATE);
    let uri = format!("file:{}", state.display());
    {
        let q = m.qmp().ok_or_else(|| guest("save", "QMP is gone".into()))?;
        let qerr = |e: super::qmp::QmpError| e.to_string();
        q.stop().map_err(|e| guest("stop", qerr(e)))?;
        q.migrate_set_capabilities(&[("mapped-ram", true)])
            .map_err(|e| guest("migrate-set-capabilities", qerr(e)))?;
        q.migrate(&uri).map_err(|e| guest("migrate", qerr(e)))?;
        q.wait_migration(Duration::from_secs(600))
            .map_err(|e| guest("migrate", qerr(e)))?;
    }
    m.shutdown(None, Duration::from_secs(10));
    let save_s = t1.elapsed().as_secs_f64();
    // The disk is part of the snapshot now: nothing may write it again.
    for f in [disk, state.as_path()] {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(f, fs::Permissions::from_mode(0o444))
            .map_err(io_err(f, "make read-only"))?;
    }
    let manifest = SnapshotManifest {
        geometry: g.clone(),
        created_unix: crate::shape::now_ns() / 1_000_000_000,
        boot_s,
        prepare_s,
        save_s,
        state_bytes: allocated(&state),
    };
    let mp = tmp.join(MANIFEST);
    let text = serde_json::to_vec_pretty(&manifest).map_err(|e| SnapshotError::Io {
        path: mp.clone(),
        what: "serialise",
        source: io::Error::other(e),
    })?;
    fs::write(&mp, text).map_err(io_err(&mp, "write"))?;
    fs::File::open(&mp)
        .and_then(|f| f.sync_all())
        .map_err(io_err(&mp, "sync"))?;
    Ok(())
}

fn wait_console(console: &Path, needle: &str, d: Duration) -> Result<(), String> {
    let end = Instant::now() + d;
    loop {
        if fs::read_to_string(console)
            .unwrap_or_default()
            .contains(needle)
        {
            return Ok(());
        }
        if Instant::now() >= end {
            return Err(format!(
                "the console did not show {needle:?} within {} s",
                d.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What a restore is asked to start.
#[derive(Debug)]
pub struct RestoreSpec<'a> {
    pub name: String,
    /// Sockets, pid files and the per-run disk overlay.
    pub dir: &'a Path,
    pub log_dir: &'a Path,
    /// The plan after [`slotted`].
    pub slotted: &'a VmPlan,
    /// The user QEMU runs the guest as (`MachineSpec::run_as`).
    pub run_as: Option<&'a str>,
}

/// Starts a VM from `snap`: fresh virtiofsd per slot, QEMU with
/// `-incoming defer`, `migrate-incoming`, `cont`. The guest then runs where
/// the snapshot left it; connect to the agent as after a boot.
pub fn restore(
    snap: &Snapshot,
    image: &BootImage,
    tools: &Tools,
    r: &RestoreSpec<'_>,
) -> Result<Machine, SnapshotError> {
    let g = &snap.manifest.geometry;
    let empty = r.dir.join("empty");
    fs::create_dir_all(&empty).map_err(io_err(&empty, "create"))?;
    let shares = slot_specs(r.slotted, r.dir, &empty, g.slots);
    let mut spec = machine_spec(
        r.name.clone(),
        g,
        image,
        &snap.disk,
        true,
        r.dir,
        r.log_dir,
        shares,
    );
    spec.run_as = r.run_as.map(str::to_string);
    let t0 = std::time::Instant::now();
    let at = || t0.elapsed().as_secs_f64();
    let mut m = Machine::start(&spec, tools).map_err(|source| SnapshotError::Machine {
        step: "starting the VM to restore the snapshot",
        source,
    })?;
    tracing::debug!(
        "restore: {} virtiofsd and QEMU started, QMP ready at {:.3} s",
        spec.shares.len(),
        at()
    );
    let console = m.console_log().to_path_buf();
    let fail = |why: String| SnapshotError::Restore {
        dir: snap.dir.clone(),
        why,
        console: console.clone(),
    };
    // The state file is handed over open: QEMU may run as a user who
    // cannot reach the image cache.
    let state = fs::File::open(&snap.state).map_err(io_err(&snap.state, "open"))?;
    let q = m.qmp().ok_or_else(|| fail("QMP is gone".into()))?;
    let fdset = q
        .add_fd(std::os::fd::AsFd::as_fd(&state), "snapshot state")
        .map_err(|e| fail(format!("add-fd: {e}")))?;
    drop(state);
    let uri = format!("file:/dev/fdset/{fdset}");
    q.migrate_set_capabilities(&[("mapped-ram", true)])
        .map_err(|e| fail(format!("migrate-set-capabilities: {e}")))?;
    q.migrate_incoming(&uri)
        .map_err(|e| fail(format!("migrate-incoming: {e}")))?;
    q.wait_migration(Duration::from_secs(120))
        .map_err(|e| fail(format!("loading {}: {e}", snap.state.display())))?;
    tracing::debug!("restore: state loaded at {:.3} s", at());
    q.cont().map_err(|e| fail(format!("cont: {e}")))?;
    tracing::debug!("restore: guest resumed at {:.3} s", at());
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> VmPlan {
        crate::shape::tests::default_plan()
    }

    #[test]
    fn slotted_for_a_restore_a_cow_plan_s_lower_is_never_packed_away() {
        let cow = crate::policy::lower::vm::with_cow(
            plan(),
            Path::new("/work/proj"),
            Path::new("/state/changes/ID/layers"),
        )
        .unwrap();
        let slotted = slotted(&cow, 2);
        let (u, l) = slotted.overlay().unwrap();
        assert!(l.subdir.is_none() && u.subdir.is_none());
        let c = crate::shape::configure_spec(
            &slotted,
            crate::policy::lower::vm::RUN_CONTAINER,
            42,
            None,
        )
        .unwrap();
        assert_eq!(c.overlay.as_ref().unwrap().lower, l.tag);
    }

    fn geo() -> Geometry {
        Geometry {
            format: SNAPSHOT_FORMAT,
            image_id: "0123456789abcdef".into(),
            agent_sha256: "a1".repeat(32),
            agent_disk: "12-34".into(),
            qemu_version: "10.0.2".into(),
            accel: "tcg".into(),
            memory_mib: SNAPSHOT_MEMORY_MIB,
            cpus: 2,
            slots: SLOTS,
            cmdline: "root=/dev/vda quiet".into(),
        }
    }

    #[test]
    fn slots_keep_the_plan_and_pad_with_the_empty_dir() {
        let p = slotted(&plan(), SLOTS);
        let tags: Vec<&str> = p.shares.iter().map(|s| s.tag.as_str()).collect();
        assert_eq!(tags, ["hull0", "hull1", "hull2"]);
        assert_eq!(p.shares[2].guest_path, "/mnt/hull/hull2");
        assert_eq!(p.shares[2].host_path, Path::new("/work/proj"));
        // Masks and read-only stay with their share.
        assert!(p.shares[0].readonly);
        assert!(!p.shares[2].masks.is_empty());
        let specs = slot_specs(&p, Path::new("/r"), Path::new("/r/empty"), SLOTS);
        assert_eq!(specs.len(), SLOTS);
        assert_eq!(specs[2].shared_dir, Path::new("/work/proj"));
        assert_eq!(specs[2].socket, Path::new("/r/vfs-hull2.sock"));
        for s in &specs[3..] {
            assert_eq!(s.shared_dir, Path::new("/r/empty"));
            assert!(s.readonly, "{}", s.tag);
            assert!(s.masks.is_empty());
        }
        assert_eq!(specs[7].tag, "hull7");
    }

    #[test]
    fn a_plan_that_does_not_fit_is_named() {
        let mut p = plan();
        assert_eq!(fits(&p, &geo()), Ok(()));
        let extra = p.shares[0].clone();
        while p.shares.len() <= SLOTS {
            p.shares.push(extra.clone());
        }
        assert!(fits(&p, &geo()).unwrap_err().contains("slots"));
        let mut p = plan();
        p.limits.memory_bytes = Some(16 << 30);
        assert!(fits(&p, &geo()).unwrap_err().contains("memory"));
    }

    #[test]
    fn save_and_restore_specs_differ_only_where_they_may() {
        let img = BootImage {
            kernel: "/i/vmlinux".into(),
            initrd: Some("/i/initrd.cpio".into()),
            disks: vec![],
            cmdline: "root=/dev/vda quiet".into(),
        };
        let g = geo();
        let config = |name: &str, restore: bool, dir: &str, log: &str| {
            let d = Path::new(dir);
            let shares = slot_specs(&slotted(&plan(), SLOTS), d, &d.join("empty"), SLOTS);
            machine_spec(
                name.into(),
                &g,
                &img,
                Path::new("/i/snapshot/disk.qcow2"),
                restore,
                d,
                Path::new(log),
                shares,
            )
            .qemu_config(true)
        };
        let a = config("a", false, "/s", "/s");
        let b = config("b", true, "/r", "/l");
        assert_eq!(a.memory_mib, b.memory_mib);
        assert_eq!(a.cpus, b.cpus);
        assert_eq!(a.cmdline, b.cmdline);
        assert_eq!(a.kernel, b.kernel);
        let tags = |c: &super::super::qemu::MachineConfig| -> Vec<String> {
            c.shares.iter().map(|s| s.tag.clone()).collect()
        };
        assert_eq!(tags(&a), tags(&b));
        assert_eq!(a.disks[0].format, b.disks[0].format);
        assert!(!a.disks[0].snapshot && b.disks[0].snapshot);
        assert!(a.incoming.is_none() && b.incoming.is_some());
    }

    /// The default plan with `n` more read-only grants of the policy.
    fn with_read_grants(n: usize) -> VmPlan {
        let mut p = plan();
        let proto = p
            .shares
            .iter()
            .find(|s| s.tag == "project")
            .unwrap()
            .clone();
        for i in 0..n {
            let path = PathBuf::from(format!("/home/u/tool{i}"));
            p.shares.push(lower_vm::Share {
                tag: format!("ro-{}", i + 1),
                guest_path: format!("{GUEST_SHARE_ROOT}/ro-{}", i + 1),
                host_path: path.clone(),
                container_path: path,
                readonly: true,
                exec: true,
                origin: lower_vm::ShareOrigin::Policy,
                masks: Vec::new(),
                subdir: None,
            });
        }
        // A writable grant after them stays a device of its own.
        let mut rw = proto;
        rw.tag = "rw-1".into();
        rw.host_path = "/home/u/out".into();
        rw.masks.clear();
        p.shares.push(rw);
        p
    }

    #[test]
    fn read_only_grants_beyond_the_slots_share_one_view() {
        let p = with_read_grants(7);
        assert_eq!(p.shares.len(), 11);
        let g = geo();
        assert_eq!(fits(&p, &g), Ok(()));
        let s = slotted(&p, SLOTS);
        let tags: Vec<(&str, Option<&str>)> = s
            .shares
            .iter()
            .map(|x| (x.tag.as_str(), x.subdir.as_deref()))
            .collect();
        assert_eq!(
            tags,
            [
                ("hull0", None),
                ("hull1", None),
                ("hull2", None),
                ("hull3", Some("0")),
                ("hull3", Some("1")),
                ("hull3", Some("2")),
                ("hull3", Some("3")),
                ("hull3", Some("4")),
                ("hull3", Some("5")),
                ("hull3", Some("6")),
                ("hull4", None),
            ],
            "the plan's order is kept"
        );
        let specs = slot_specs(&s, Path::new("/r"), Path::new("/r/empty"), SLOTS);
        assert_eq!(specs.len(), SLOTS);
        let view = &specs[3];
        assert_eq!((view.tag.as_str(), view.readonly), ("hull3", true));
        assert_eq!(view.shared_dir, Path::new("/r/view-hull3"));
        assert!(view.masks.is_empty());
        assert_eq!(view.views.len(), 7);
        assert_eq!(view.views[6].source, Path::new("/home/u/tool6"));
        assert_eq!(view.views[6].at, Path::new("/r/view-hull3/6"));
        assert_eq!(specs[4].tag, "hull4");
        assert!(
            !specs[4].readonly,
            "the writable grant keeps its own device"
        );
        assert!(specs[4].views.is_empty());
        // What the guest is told is valid: one tag, a directory each.
        let c = crate::shape::configure_spec(&s, "hull-run", 1, None).unwrap();
        assert_eq!(c.validate(), Ok(()));
        assert_eq!(c.shares[9].source(), "/mnt/hull/hull3/6");
        assert_eq!(c.shares[9].container_path, "/home/u/tool6");
    }

    #[test]
    fn a_plan_within_the_slots_is_not_packed_and_one_beyond_them_boots() {
        let p = with_read_grants(4);
        assert_eq!(p.shares.len(), SLOTS);
        let s = slotted(&p, SLOTS);
        assert!(s.shares.iter().all(|x| x.subdir.is_none()));
        assert_eq!(devices(&s), SLOTS);
        // Writable grants are never packed: nine devices cannot restore.
        let mut p = plan();
        for i in 0..6 {
            let mut rw = p.shares[2].clone();
            rw.host_path = format!("/home/u/w{i}").into();
            p.shares.push(rw);
        }
        let why = fits(&p, &geo()).unwrap_err();
        assert!(why.contains("needs 9 virtiofs shares"), "{why}");
    }

    #[test]
    fn a_bigger_memory_limit_restores_from_a_snapshot_of_its_own_size() {
        let mut p = plan();
        p.limits.memory_bytes = Some(4 << 30);
        assert_eq!(memory_for(&p), SNAPSHOT_MEMORY_MIB);
        p.limits.memory_bytes = Some(1 << 30);
        assert_eq!(
            memory_for(&p),
            SNAPSHOT_MEMORY_MIB,
            "smaller limits share it"
        );
        p.limits.memory_bytes = Some(8 << 30);
        assert_eq!(memory_for(&p), 9216, "8 GiB + 768 MiB, rounded up to a GiB");
        let mut g = geo();
        assert!(fits(&p, &g).unwrap_err().contains("memory"));
        g.memory_mib = memory_for(&p);
        assert_eq!(fits(&p, &g), Ok(()));
        let img = Path::new("/img");
        let small = geo();
        assert_eq!(dir_of(img, &small), img.join("snapshot-a1a1a1a1a1a1a1a1"));
        assert_eq!(dir_of(img, &g), img.join("snapshot-a1a1a1a1a1a1a1a1-9216m"));
        assert_ne!(lock_path(img, &g), lock_path(img, &small));
        let mut other_agent = geo();
        other_agent.agent_sha256 = "b2".repeat(32);
        assert_ne!(dir_of(img, &other_agent), dir_of(img, &small));
    }

    #[test]
    fn only_a_complete_snapshot_of_the_same_geometry_opens() {
        let t = tempfile::tempdir().unwrap();
        let img = t.path();
        let g = geo();
        assert!(open(img, &g).is_none(), "nothing there yet");
        let d = dir_of(img, &g);
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join(DISK), b"q").unwrap();
        let m = SnapshotManifest {
            geometry: g.clone(),
            created_unix: 1,
            boot_s: 1.0,
            prepare_s: 1.0,
            save_s: 1.0,
            state_bytes: 1,
        };
        fs::write(d.join(MANIFEST), serde_json::to_vec(&m).unwrap()).unwrap();
        assert!(open(img, &g).is_none(), "no state file");
        fs::write(d.join(STATE), b"s").unwrap();
        assert!(open(img, &g).is_some());
        for change in [
            |g: &mut Geometry| g.qemu_version = "10.1.0".into(),
            |g: &mut Geometry| g.accel = "kvm".into(),
            |g: &mut Geometry| g.cpus = 1,
            |g: &mut Geometry| g.image_id = "fedcba9876543210".into(),
            |g: &mut Geometry| g.agent_sha256 = "b2".repeat(32),
            |g: &mut Geometry| g.agent_disk = "12-35".into(),
            |g: &mut Geometry| g.cmdline.push_str(" x"),
            |g: &mut Geometry| g.memory_mib += 1024,
        ] {
            let mut other = g.clone();
            change(&mut other);
            assert!(open(img, &other).is_none(), "{other:?}");
        }
        fs::write(d.join(MANIFEST), b"{not json").unwrap();
        assert!(open(img, &g).is_none(), "a broken manifest");
    }
}
