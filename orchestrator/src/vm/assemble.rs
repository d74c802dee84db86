//! Assembling a tier-3 VM from a lowered plan: the deadlines, sizes and
//! shares of the machine, the guest image, the container request, and
//! starting it (restored from the image's snapshot, or booted). Shared by
//! `hull run --tier3` (the tier adapter, `tier::vm`), `hull vm up`
//! ([`crate::vm::supervisor`]) and the batch pool ([`crate::vm::pool`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use hull_protocol::{ConfigureSpec, ContainerSpec, OverlaySpec, Share as ProtoShare};

use crate::policy::lower::vm::{self as lower_vm, VmPlan};
use crate::policy::Protection;
use crate::vm::image::recipe::Recipe;
use crate::vm::image::GuestImage;
use crate::vm::qemu::Accel;
use crate::vm::virtiofsd::{HostMask, MaskKind, OverlayRole, SandboxMode, ViewBind, VirtiofsdSpec};
#[cfg(target_os = "linux")]
use crate::vm::{
    machine::{BootImage, Machine, MachineSpec, Tools},
    snapshot,
};

#[derive(Debug, thiserror::Error)]
pub enum AssembleError {
    #[error(
        "tier vm: no guest image found (looked in {looked}); build it with `hull image build`"
    )]
    NoImage { looked: String },
    /// The agent binary or its disk (the message names the path).
    #[error(transparent)]
    Agent(crate::vm::image::ImageError),
    #[error("tier vm: path {0} is not UTF-8; the guest agent needs UTF-8 paths")]
    NotUtf8(PathBuf),
    #[error("tier vm: the container request is invalid: {0}")]
    Configure(String),
    #[cfg(target_os = "linux")]
    #[error(transparent)]
    Machine(#[from] crate::vm::machine::MachineError),
    #[cfg(target_os = "linux")]
    #[error(transparent)]
    Snapshot(#[from] crate::vm::snapshot::SnapshotError),
    #[error(transparent)]
    SandboxUser(#[from] crate::sandbox_user::SandboxUserError),
    #[error("tier vm: the container userland of {userland}: {source}")]
    Userland {
        /// What the policy asks for ([`Recipe::userland`]).
        userland: String,
        #[source]
        source: Box<crate::vm::image::ImageError>,
    },
    #[error(
        "tier vm: HULL_VM_IMAGE={dir} holds another container userland ({has}) than the policy's \
         ({wants}); unset HULL_VM_IMAGE to use the image cache"
    )]
    OtherUserland {
        dir: Box<Path>,
        has: String,
        wants: String,
    },
}

/// The recipe of `vm`'s container userland ([`crate::vm::image::recipe_for`]:
/// a rootfs tarball is checked here, before any VM starts).
pub fn recipe_for(vm: &crate::policy::VmPolicy) -> Result<Recipe, AssembleError> {
    crate::vm::image::recipe_for(vm).map_err(|source| AssembleError::Userland {
        userland: match &vm.rootfs {
            Some(p) => format!("the [vm] rootfs {}", p.display()),
            None => format!("the [vm] packages {}", vm.packages.join(", ")),
        },
        source: Box::new(source),
    })
}

/// Builds the image of a policy's container userland (its `[vm] packages`)
/// when it is not cached yet, reporting the build's progress to `on`; the
/// default userland is `hull image build`'s (or setup's) to make, and
/// `HULL_VM_IMAGE` names its image itself ([`find_image`] checks it).
pub fn ensure_userland(
    recipe: &Recipe,
    on: &mut dyn FnMut(crate::vm::image::build::BuildEvent),
) -> Result<(), AssembleError> {
    let default = recipe.packages().is_empty() && recipe.rootfs().is_none();
    if default || crate::settings::get().vm_image.is_some() {
        return Ok(());
    }
    let failed = |source| AssembleError::Userland {
        userland: recipe.userland(),
        source: Box::new(source),
    };
    let cache = crate::vm::image::Cache::default_location().map_err(failed)?;
    if crate::vm::image::find(&cache, recipe).is_ok() {
        return Ok(());
    }
    let opts = crate::vm::image::build::BuildOptions {
        agent: crate::vm::image::default_agent_path().map_err(failed)?,
        force: false,
        recipe: recipe.clone(),
    };
    crate::vm::image::build::build(&cache, &opts, on).map_err(failed)?;
    Ok(())
}

/// Hello and setup deadlines for a VM restored from a snapshot: it answers
/// in about a second here, so a silent one is reported well before a boot
/// deadline would end.
pub fn restore_deadlines(accel: Accel) -> (Duration, Duration) {
    let (boot, setup) = deadlines(accel);
    let cap = match accel {
        Accel::Tcg => Duration::from_secs(60),
        _ => Duration::from_secs(20),
    };
    (boot.min(cap), setup.min(cap * 2))
}

/// Boot and setup deadlines for an accelerator (TCG is 10-20x slower).
pub fn deadlines(accel: Accel) -> (Duration, Duration) {
    let scale = |secs: u64| {
        crate::settings::get()
            .vm_boot_timeout
            .unwrap_or(Duration::from_secs(secs))
    };
    match accel {
        Accel::Tcg => (scale(300), scale(300)),
        _ => (scale(60), scale(120)),
    }
}

/// The VM's memory: the container's limit plus room for the guest kernel,
/// incusd and the page cache, at least 1 GiB. Guest RAM is a memfd that
/// the host only backs as the guest touches it.
pub fn vm_memory_mib(plan: &VmPlan) -> u32 {
    let container = plan.limits.memory_bytes.map(|b| b >> 20).unwrap_or(2048);
    (container + 768).clamp(1024, 64 * 1024) as u32
}

/// vCPUs: the policy's limit, else up to 2 of the host's cores.
pub fn vm_cpus(plan: &VmPlan) -> u32 {
    let host = std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(1);
    plan.limits.cpus.unwrap_or(2).clamp(1, host.max(1))
}

/// Whether a share's files show the host's uid 0 as the command's uid:
/// the command's own (writable shares, the instance's dirs). A read-only
/// grant of the policy keeps the host's ids when hull runs as root, so the
/// container user reads only what others may there (a 0600 root file stays
/// unreadable), as on the process tiers. When hull is not root, uid 0 in
/// virtiofsd is the caller, and the caller's files stay the command's.
/// A `--cow` overlay's lower layer is the project: the command's too.
fn own_ids(plan: &VmPlan, s: &lower_vm::Share) -> bool {
    if plan.is_overlay_lower(s) {
        return true;
    }
    #[cfg(unix)]
    // SAFETY: geteuid takes no arguments and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    #[cfg(not(unix))]
    let root = false;
    !s.readonly || s.origin != lower_vm::ShareOrigin::Policy || !root
}

/// The virtiofsd of each share, sockets in `dir`; shares packed under one
/// tag (each with its `subdir`) get one virtiofsd over a view in
/// `dir/view-<tag>`.
pub fn share_specs(plan: &VmPlan, dir: &Path) -> Vec<VirtiofsdSpec> {
    let mut specs: Vec<VirtiofsdSpec> = Vec::new();
    for s in &plan.shares {
        let Some(sub) = &s.subdir else {
            specs.push(one_share_spec(plan, s, dir));
            continue;
        };
        let view = dir.join(format!("view-{}", s.tag));
        let bind = ViewBind {
            source: s.host_path.clone(),
            at: view.join(sub),
        };
        match specs.iter_mut().find(|v| v.tag == s.tag) {
            Some(v) => v.views.push(bind),
            None => specs.push(VirtiofsdSpec {
                tag: s.tag.clone(),
                shared_dir: view,
                socket: dir.join(format!("vfs-{}.sock", s.tag)),
                readonly: true,
                sandbox: SandboxMode::Namespace,
                translate: own_ids(plan, s).then_some((plan.uid, plan.gid)),
                masks: Vec::new(),
                views: vec![bind],
                overlay: None,
            }),
        }
    }
    specs
}

fn one_share_spec(plan: &VmPlan, s: &lower_vm::Share, dir: &Path) -> VirtiofsdSpec {
    VirtiofsdSpec {
        tag: s.tag.clone(),
        shared_dir: s.host_path.clone(),
        socket: dir.join(format!("vfs-{}.sock", s.tag)),
        readonly: s.readonly,
        sandbox: SandboxMode::Namespace,
        translate: own_ids(plan, s).then_some((plan.uid, plan.gid)),
        masks: s
            .masks
            .iter()
            .map(|m| HostMask {
                path: m.path.clone(),
                kind: match m.protection {
                    Protection::Hidden => MaskKind::Hidden,
                    Protection::ReadOnly => MaskKind::ReadOnly,
                },
                placeholder_is_file: m.placeholder_is_file,
            })
            .collect(),
        views: Vec::new(),
        overlay: if s.origin == lower_vm::ShareOrigin::ChangeSet {
            Some(OverlayRole::Upper)
        } else if plan.is_overlay_lower(s) {
            Some(OverlayRole::Lower)
        } else {
            None
        },
    }
}

/// The `Configure` request for the plan: container `name`, cloned from the
/// base, with one Incus disk device per share at its host path.
pub fn configure_spec(
    plan: &VmPlan,
    name: &str,
    clock_unix_ns: u64,
    network: Option<hull_protocol::NetworkSpec>,
) -> Result<ConfigureSpec, AssembleError> {
    let mut shares = Vec::new();
    for s in &plan.shares {
        if s.origin == lower_vm::ShareOrigin::ChangeSet {
            // Mounted in the guest only: the overlay's upper layer.
            continue;
        }
        let container_path = s
            .container_path
            .to_str()
            .ok_or_else(|| AssembleError::NotUtf8(s.container_path.clone()))?
            .to_string();
        shares.push(ProtoShare {
            tag: s.tag.clone(),
            guest_path: s.guest_path.clone(),
            container_path,
            readonly: s.readonly,
            subdir: s.subdir.clone(),
            noexec: !s.exec,
        });
    }
    let spec = ConfigureSpec {
        shares,
        container: ContainerSpec {
            name: name.to_string(),
            base: plan.base_container.clone(),
            uid: plan.uid,
            gid: plan.gid,
            memory_bytes: plan.limits.memory_bytes,
            cpus: plan.limits.cpus,
            processes: plan
                .limits
                .processes
                .map(|p| p.min(u64::from(u32::MAX)) as u32),
        },
        clock_unix_ns,
        prepare: false,
        network,
        overlay: overlay_spec(plan)?,
    };
    spec.validate().map_err(AssembleError::Configure)?;
    Ok(spec)
}

/// The `Configure`'s overlay of a `--cow` plan: the change set's share
/// over the project's, with every protected path of the project (its
/// masks, at their container paths) to be bound read-only over it.
fn overlay_spec(plan: &VmPlan) -> Result<Option<OverlaySpec>, AssembleError> {
    let Some((upper, lower)) = plan.overlay() else {
        return Ok(None);
    };
    let mut protect = Vec::new();
    for m in &lower.masks {
        let rel = m.path.strip_prefix(&lower.host_path).unwrap_or(&m.path);
        let at = lower.container_path.join(rel);
        protect.push(
            at.to_str()
                .ok_or_else(|| AssembleError::NotUtf8(at.clone()))?
                .to_string(),
        );
    }
    Ok(Some(OverlaySpec {
        tag: upper.tag.clone(),
        guest_path: upper.guest_path.clone(),
        lower: lower.tag.clone(),
        protect,
    }))
}

/// The guest image to boot: `HULL_VM_IMAGE` (one image dir), else the image
/// `hull image build` made for this recipe with the userland `recipe` names
/// (an image of another recipe is never used: rebuild it), with the disk of
/// this hull's agent (made in the image directory when missing: under a
/// second).
pub fn find_image(recipe: &Recipe) -> Result<GuestImage, AssembleError> {
    find_image_with(recipe, true)
}

/// [`find_image`]; `make_agent_disk: false` only looks (`hull probe`).
pub fn find_image_with(
    recipe: &Recipe,
    make_agent_disk: bool,
) -> Result<GuestImage, AssembleError> {
    let complete = |d: &Path| {
        ["vmlinux", "initrd.cpio", "disk.raw"]
            .iter()
            .all(|f| d.join(f).is_file())
    };
    let dir = match crate::settings::get().vm_image.clone() {
        Some(d) if complete(&d) && recipe != &Recipe::base() => {
            let has = crate::vm::image::BuiltImage::open(&d).map(|i| i.manifest);
            let same = match &has {
                Ok(m) if recipe.rootfs().is_some() => m.hash == recipe.hash(),
                Ok(m) => m.packages == recipe.packages(),
                Err(_) => false,
            };
            if !same {
                return Err(AssembleError::OtherUserland {
                    dir: d.into(),
                    has: has
                        .map(|m| format!("[vm] packages {}", m.packages.join(", ")))
                        .unwrap_or_else(|e| e.to_string()),
                    wants: recipe.userland(),
                });
            }
            d
        }
        Some(d) if complete(&d) => d,
        Some(d) => {
            return Err(AssembleError::NoImage {
                looked: format!("HULL_VM_IMAGE={}", d.display()),
            })
        }
        None => {
            let cache = crate::vm::image::Cache::default_location().map_err(|e| {
                AssembleError::NoImage {
                    looked: format!("the image cache ({e})"),
                }
            })?;
            crate::vm::image::find(&cache, recipe)
                .map_err(|e| AssembleError::NoImage {
                    looked: format!("{} ({e})", cache.root().display()),
                })?
                .dir
        }
    };
    let agent = crate::vm::image::default_agent_path().map_err(AssembleError::Agent)?;
    match make_agent_disk {
        true => GuestImage::with_agent(&dir, &agent),
        false => GuestImage::looking_at(&dir, &agent),
    }
    .map_err(AssembleError::Agent)
}

/// Nanoseconds since the Unix epoch (the guest sets its clock from it).
pub fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos().min(u128::from(u64::MAX)) as u64)
        .unwrap_or(0)
}

/// Stale-instance cleanup for tier 3 (call from runtime GC for an instance
/// dir whose `.active` lock is free): kills the QEMU and virtiofsd a crashed
/// hull left in `<instance>/vm-<pid>/` and removes its sockets.
#[cfg(target_os = "linux")]
pub fn cleanup_stale_instance(
    instance_dir: &Path,
) -> std::io::Result<crate::vm::machine::StaleCleanup> {
    let mut all = crate::vm::machine::StaleCleanup::default();
    let rd = match std::fs::read_dir(instance_dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(all),
        Err(e) => return Err(e),
    };
    for e in rd.filter_map(|e| e.ok()) {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("vm-") && e.path().is_dir() {
            let c = crate::vm::machine::cleanup_stale(&e.path())?;
            all.killed.extend(c.killed);
        }
    }
    Ok(all)
}

/// `HULL_VM_SNAPSHOT=off` boots every run (benchmarks of the boot path).
#[cfg(target_os = "linux")]
fn snapshot_wanted() -> bool {
    !crate::settings::get().vm_snapshot_off
}

/// A VM that runs, and the plan its shares were started for (the
/// policy's, with slot tags when restored from a snapshot).
#[cfg(target_os = "linux")]
#[derive(Debug)]
pub struct Started {
    pub machine: Machine,
    pub plan: VmPlan,
    /// Keeps the snapshot from being replaced while the VM uses it.
    pub hold: Option<snapshot::SnapshotUse>,
    /// Hello and setup deadlines: a restored VM gets shorter ones.
    pub deadlines: (Duration, Duration),
}

/// Starts the VM for `plan`: restores the image's prepared snapshot
/// (built once when missing), or boots when `HULL_VM_SNAPSHOT=off` or
/// the plan does not fit a snapshot. Both give the same boundary:
/// nothing here changes what is enforced, only how long it takes.
#[cfg(target_os = "linux")]
pub fn start_vm(
    plan: &VmPlan,
    tools: &Tools,
    guest: &GuestImage,
    accel: Accel,
    vm_name: String,
    dir: &Path,
    log_dir: &Path,
) -> Result<Started, AssembleError> {
    let image = BootImage::from_image(guest)?;
    let run_as = qemu_user()?;
    let geometry = snapshot::Geometry {
        memory_mib: snapshot::memory_for(plan),
        ..snapshot::geometry(guest, &image, tools, accel)
    };
    let use_snapshot = match snapshot_wanted() {
        false => None,
        true => match snapshot::fits(plan, &geometry) {
            Ok(()) => Some(geometry),
            Err(why) => {
                eprintln!(
                    "hull: tier vm: booting the guest instead of restoring its snapshot: {why}"
                );
                None
            }
        },
    };
    match use_snapshot {
        Some(g) => {
            let size = match g.memory_mib {
                snapshot::SNAPSHOT_MEMORY_MIB => String::new(),
                m => format!(" for {m} MiB VMs (the policy's memory limit)"),
            };
            let hold = snapshot::ensure(&guest.dir, &image, &g, tools, &mut |step| {
                eprintln!("hull: tier vm: preparing the image's snapshot{size} (once): {step}")
            })?;
            let slotted = snapshot::slotted(plan, g.slots);
            let machine = snapshot::restore(
                &hold.snapshot,
                &image,
                tools,
                &snapshot::RestoreSpec {
                    name: vm_name,
                    dir,
                    log_dir,
                    slotted: &slotted,
                    run_as: run_as.as_deref(),
                },
            )?;
            Ok(Started {
                machine,
                plan: slotted,
                hold: Some(hold),
                deadlines: restore_deadlines(accel),
            })
        }
        None => {
            let mspec = MachineSpec {
                name: vm_name,
                dir: dir.to_path_buf(),
                log_dir: log_dir.to_path_buf(),
                image,
                accel,
                memory_mib: vm_memory_mib(plan),
                cpus: vm_cpus(plan),
                shares: share_specs(plan, dir),
                incoming: None,
                run_as,
            };
            Ok(Started {
                machine: Machine::start(&mspec, tools)?,
                plan: plan.clone(),
                hold: None,
                deadlines: deadlines(accel),
            })
        }
    }
}

/// The user QEMU runs the guest as: the sandbox user when hull runs as
/// root (QEMU is then never root while untrusted code runs in it).
#[cfg(target_os = "linux")]
fn qemu_user() -> Result<Option<String>, AssembleError> {
    if !crate::sandbox_user::hull_is_root() {
        return Ok(None);
    }
    crate::sandbox_user::lookup("tier vm: QEMU")?;
    Ok(Some(crate::sandbox_user::NAME.to_string()))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::policy::hostfs::FakeFs;
    use crate::policy::{resolve, PolicyFile, Vars};

    fn plan() -> VmPlan {
        default_plan()
    }

    /// A run's paths on the fake host of these tests.
    fn fake_vars() -> Vars {
        Vars {
            project: "/work/proj".into(),
            tmp: "/tmp/hull-runs/ID/tmp".into(),
            spill: "/tmp/hull-runs/ID/spill".into(),
            home: "/home/u".into(),
            runs: "/tmp/hull-runs".into(),
        }
    }

    /// The default profile lowered for a fake host (also used by the
    /// snapshot tests).
    pub(crate) fn default_plan() -> VmPlan {
        let vars = fake_vars();
        let fs = FakeFs::new()
            .dir("/work/proj/.git")
            .dir("/tmp/hull-runs/ID/tmp")
            .dir("/tmp/hull-runs/ID/spill");
        let pf = crate::policy::profiles::load("default").unwrap();
        lower_vm::lower(&resolve(&pf, &vars).unwrap(), &fs).unwrap()
    }

    #[test]
    fn golden_virtiofsd_specs_for_the_default_profile() {
        let specs = share_specs(&plan(), Path::new("/tmp/hull-runs/ID/vm"));
        let got: Vec<String> = specs
            .iter()
            .map(|s| {
                let argv: Vec<String> = s
                    .argv()
                    .into_iter()
                    .map(|a| a.into_string().unwrap())
                    .collect();
                let masks: Vec<String> = s
                    .masks
                    .iter()
                    .map(|m| format!("{:?} {}", m.kind, m.path.display()))
                    .collect();
                format!("{}: {} | {}", s.tag, argv.join(" "), masks.join(", "))
            })
            .collect();
        assert_eq!(
            got,
            [
                "spill: --socket-path=/tmp/hull-runs/ID/vm/vfs-spill.sock --shared-dir=/tmp/hull-runs/ID/spill --sandbox=namespace --seccomp=kill --cache=auto --translate-uid=map:1000:0:1 --translate-gid=map:1000:0:1 --modcaps=-mknod --log-level=info --readonly | ",
                "tmp: --socket-path=/tmp/hull-runs/ID/vm/vfs-tmp.sock --shared-dir=/tmp/hull-runs/ID/tmp --sandbox=namespace --seccomp=kill --cache=auto --translate-uid=map:1000:0:1 --translate-gid=map:1000:0:1 --modcaps=-mknod --log-level=info | ",
                "project: --socket-path=/tmp/hull-runs/ID/vm/vfs-project.sock --shared-dir=/work/proj --sandbox=namespace --seccomp=kill --cache=auto --translate-uid=map:1000:0:1 --translate-gid=map:1000:0:1 --modcaps=-mknod --log-level=info | ReadOnly /work/proj/.git, Hidden /work/proj/.hull",
            ]
        );
    }

    #[test]
    fn a_cow_plan_makes_the_project_the_read_only_lower_of_an_overlay() {
        let cow = lower_vm::with_cow(
            plan(),
            Path::new("/work/proj"),
            Path::new("/state/changes/ID/layers"),
        )
        .unwrap();
        let specs = share_specs(&cow, Path::new("/tmp/hull-runs/ID/vm"));
        let project = specs.iter().find(|s| s.tag == "project").unwrap();
        assert!(project.readonly);
        assert_eq!(project.overlay, Some(OverlayRole::Lower));
        assert_eq!(project.translate, Some((1000, 1000)), "the command's files");
        assert!(!project.argv().iter().any(|a| a == "--xattr"));
        let upper = specs.iter().find(|s| s.tag == "changes").unwrap();
        assert_eq!(upper.shared_dir, Path::new("/state/changes/ID/layers"));
        assert!(!upper.readonly);
        assert_eq!(upper.overlay, Some(OverlayRole::Upper));
        assert!(upper.argv().iter().any(|a| a == "--xattr"));
        assert_eq!(upper.translate, Some((1000, 1000)));
        // The guest gets the project read-only, the overlay over it, and
        // never the change set's share as a container path.
        let c = configure_spec(&cow, lower_vm::RUN_CONTAINER, 42, None).unwrap();
        assert!(c.shares.iter().all(|s| s.tag != "changes"));
        let p = c.shares.iter().find(|s| s.tag == "project").unwrap();
        assert!(p.readonly);
        assert_eq!(
            c.overlay,
            Some(OverlaySpec {
                tag: "changes".into(),
                guest_path: "/mnt/hull/changes".into(),
                lower: "project".into(),
                protect: vec!["/work/proj/.git".into(), "/work/proj/.hull".into()],
            })
        );
        // Slotted for a restore, the lower is never packed away.
        #[cfg(target_os = "linux")]
        {
            let slotted = crate::vm::snapshot::slotted(&cow, 2);
            let (u, l) = slotted.overlay().unwrap();
            assert!(l.subdir.is_none() && u.subdir.is_none());
            let c = configure_spec(&slotted, lower_vm::RUN_CONTAINER, 42, None).unwrap();
            assert_eq!(c.overlay.as_ref().unwrap().lower, l.tag);
        }
        // A read-only project has nothing to keep.
        let mut ro = plan();
        ro.shares.iter_mut().for_each(|s| s.readonly = true);
        let e = lower_vm::with_cow(ro, Path::new("/work/proj"), Path::new("/l")).unwrap_err();
        assert!(e.to_string().contains("read-only"), "{e}");
    }

    #[test]
    fn golden_configure_request() {
        let c = configure_spec(&plan(), lower_vm::RUN_CONTAINER, 42, None).unwrap();
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(
            json,
            r#"{"shares":[{"tag":"spill","guest_path":"/mnt/hull/spill","container_path":"/tmp/hull-runs/ID/spill","readonly":true,"noexec":true},{"tag":"tmp","guest_path":"/mnt/hull/tmp","container_path":"/tmp/hull-runs/ID/tmp","readonly":false,"noexec":false},{"tag":"project","guest_path":"/mnt/hull/project","container_path":"/work/proj","readonly":false,"noexec":false}],"container":{"name":"hull-run","base":"hull-base","uid":1000,"gid":1000,"memory_bytes":4294967296,"cpus":null,"processes":1024},"clock_unix_ns":42,"prepare":false}"#
        );
    }

    #[test]
    fn sizes_follow_the_policy() {
        let p = plan();
        assert_eq!(vm_memory_mib(&p), 4096 + 768);
        assert!(vm_cpus(&p) >= 1);
    }

    #[test]
    fn readonly_profile_gives_a_readonly_project_device() {
        let vars = fake_vars();
        let fs = FakeFs::new()
            .dir("/work/proj")
            .dir("/tmp/hull-runs/ID/tmp")
            .dir("/tmp/hull-runs/ID/spill");
        let pf = PolicyFile::parse("p", "version = 1\n[fs]\nread = [\"${PROJECT}\"]\n").unwrap();
        let plan = lower_vm::lower(&resolve(&pf, &vars).unwrap(), &fs).unwrap();
        let c = configure_spec(&plan, "hull-x", 1, None).unwrap();
        let p = c.shares.iter().find(|s| s.tag == "project").unwrap();
        assert!(p.readonly);
        let v = share_specs(&plan, Path::new("/r"));
        assert!(v.iter().find(|s| s.tag == "project").unwrap().readonly);
    }
}
