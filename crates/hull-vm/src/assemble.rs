//! Assembling a tier-3 VM from a lowered plan: the guest image, the
//! container userland, and starting the machine [`crate::shape`] sizes
//! (restored from the image's snapshot, or booted). Shared by
//! `hull run --tier3` (the tier adapter, `tier::vm`), `hull vm up`
//! ([`crate::supervisor`]) and the batch pool ([`crate::pool`]).

use std::path::Path;
#[cfg(target_os = "linux")]
use std::time::Duration;

use crate::image::recipe::Recipe;
use crate::image::GuestImage;
#[cfg(target_os = "linux")]
use crate::{
    machine::{BootImage, Machine, MachineSpec, Tools},
    policy::lower::vm::VmPlan,
    qemu::Accel,
    shape::{deadlines, restore_deadlines, share_specs, vm_cpus, vm_memory_mib},
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
    Agent(crate::image::ImageError),
    #[error(transparent)]
    Shape(#[from] crate::shape::ShapeError),
    #[cfg(target_os = "linux")]
    #[error(transparent)]
    Machine(#[from] crate::machine::MachineError),
    #[cfg(target_os = "linux")]
    #[error(transparent)]
    Snapshot(#[from] crate::snapshot::SnapshotError),
    #[error(transparent)]
    SandboxUser(#[from] crate::sandbox_user::SandboxUserError),
    #[error("tier vm: the container userland of {userland}: {source}")]
    Userland {
        /// What the policy asks for ([`Recipe::userland`]).
        userland: String,
        #[source]
        source: Box<crate::image::ImageError>,
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

/// The recipe of `vm`'s container userland ([`crate::image::recipe_for`]:
/// a rootfs tarball is checked here, before any VM starts).
pub fn recipe_for(vm: &crate::policy::VmPolicy) -> Result<Recipe, AssembleError> {
    crate::image::recipe_for(vm).map_err(|source| AssembleError::Userland {
        userland: match (&vm.image, &vm.rootfs) {
            (Some(r), _) => format!("the container image {r}"),
            (None, Some(p)) => format!("the [vm] rootfs {}", p.display()),
            (None, None) => format!("the [vm] packages {}", vm.packages.join(", ")),
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
    on: &mut dyn FnMut(crate::image::build::BuildEvent),
) -> Result<(), AssembleError> {
    let default = recipe.packages().is_empty() && recipe.rootfs().is_none();
    if default || crate::settings::get().vm_image.is_some() {
        return Ok(());
    }
    let failed = |source| AssembleError::Userland {
        userland: recipe.userland(),
        source: Box::new(source),
    };
    let cache = crate::image::Cache::default_location().map_err(failed)?;
    if crate::image::find(&cache, recipe).is_ok() {
        return Ok(());
    }
    let opts = crate::image::build::BuildOptions {
        agent: crate::image::default_agent_path().map_err(failed)?,
        force: false,
        recipe: recipe.clone(),
    };
    crate::image::build::build(&cache, &opts, on).map_err(failed)?;
    Ok(())
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
            let has = crate::image::BuiltImage::open(&d).map(|i| i.manifest);
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
            let cache =
                crate::image::Cache::default_location().map_err(|e| AssembleError::NoImage {
                    looked: format!("the image cache ({e})"),
                })?;
            crate::image::find(&cache, recipe)
                .map_err(|e| AssembleError::NoImage {
                    looked: format!("{} ({e})", cache.root().display()),
                })?
                .dir
        }
    };
    let agent = crate::image::default_agent_path().map_err(AssembleError::Agent)?;
    match make_agent_disk {
        true => GuestImage::with_agent(&dir, &agent),
        false => GuestImage::looking_at(&dir, &agent),
    }
    .map_err(AssembleError::Agent)
}

/// Stale-instance cleanup for tier 3 (call from runtime GC for an instance
/// dir whose `.active` lock is free): kills the QEMU and virtiofsd a crashed
/// hull left in `<instance>/vm-<pid>/` and removes its sockets.
#[cfg(target_os = "linux")]
pub fn cleanup_stale_instance(
    instance_dir: &Path,
) -> std::io::Result<crate::machine::StaleCleanup> {
    let mut all = crate::machine::StaleCleanup::default();
    let rd = match std::fs::read_dir(instance_dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(all),
        Err(e) => return Err(e),
    };
    for e in rd.filter_map(|e| e.ok()) {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("vm-") && e.path().is_dir() {
            let c = crate::machine::cleanup_stale(&e.path())?;
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
