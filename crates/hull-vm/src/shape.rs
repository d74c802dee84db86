//! The shape of a tier-3 VM from a lowered plan: its deadlines, memory and
//! vCPUs, its virtiofsd shares, and the container's `Configure` request.
//!
//! Pure but for the settings and the clock, and below both of its users:
//! [`crate::snapshot`] sizes and fills the snapshot's slots with it, and
//! [`crate::assemble`] starts machines (restored from a snapshot, or
//! booted) of this shape.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hull_protocol::{ConfigureSpec, ContainerSpec, OverlaySpec, Share as ProtoShare};

use crate::policy::lower::vm::{self as lower_vm, VmPlan};
use crate::policy::Protection;
use crate::qemu::Accel;
use crate::virtiofsd::{HostMask, MaskKind, OverlayRole, SandboxMode, ViewBind, VirtiofsdSpec};

/// Why a plan makes no container request.
#[derive(Debug, thiserror::Error)]
pub enum ShapeError {
    #[error("tier vm: path {0} is not UTF-8; the guest agent needs UTF-8 paths")]
    NotUtf8(PathBuf),
    #[error("tier vm: the container request is invalid: {0}")]
    Configure(String),
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
) -> Result<ConfigureSpec, ShapeError> {
    let mut shares = Vec::new();
    for s in &plan.shares {
        if s.origin == lower_vm::ShareOrigin::ChangeSet {
            // Mounted in the guest only: the overlay's upper layer.
            continue;
        }
        let container_path = s
            .container_path
            .to_str()
            .ok_or_else(|| ShapeError::NotUtf8(s.container_path.clone()))?
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
    spec.validate().map_err(ShapeError::Configure)?;
    Ok(spec)
}

/// The `Configure`'s overlay of a `--cow` plan: the change set's share
/// over the project's, with every protected path of the project (its
/// masks, at their container paths) to be bound read-only over it.
fn overlay_spec(plan: &VmPlan) -> Result<Option<OverlaySpec>, ShapeError> {
    let Some((upper, lower)) = plan.overlay() else {
        return Ok(None);
    };
    let mut protect = Vec::new();
    for m in &lower.masks {
        let rel = m.path.strip_prefix(&lower.host_path).unwrap_or(&m.path);
        let at = lower.container_path.join(rel);
        protect.push(
            at.to_str()
                .ok_or_else(|| ShapeError::NotUtf8(at.clone()))?
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

/// Nanoseconds since the Unix epoch (the guest sets its clock from it).
pub fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos().min(u128::from(u64::MAX)) as u64)
        .unwrap_or(0)
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
                "spill: --socket-path=/tmp/hull-runs/ID/vm/vfs-spill.sock --shared-dir=/tmp/hull-runs/ID/spill --sandbox=namespace --seccomp=kill --cache=auto --translate-uid=map:1000:0:1 --translate-uid=squash-guest:0:0:1000 --translate-uid=squash-guest:1001:0:4294966294 --translate-gid=map:1000:0:1 --translate-gid=squash-guest:0:0:1000 --translate-gid=squash-guest:1001:0:4294966294 --modcaps=-mknod --log-level=info --readonly | ",
                "tmp: --socket-path=/tmp/hull-runs/ID/vm/vfs-tmp.sock --shared-dir=/tmp/hull-runs/ID/tmp --sandbox=namespace --seccomp=kill --cache=auto --translate-uid=map:1000:0:1 --translate-uid=squash-guest:0:0:1000 --translate-uid=squash-guest:1001:0:4294966294 --translate-gid=map:1000:0:1 --translate-gid=squash-guest:0:0:1000 --translate-gid=squash-guest:1001:0:4294966294 --modcaps=-mknod --log-level=info | ",
                "project: --socket-path=/tmp/hull-runs/ID/vm/vfs-project.sock --shared-dir=/work/proj --sandbox=namespace --seccomp=kill --cache=auto --translate-uid=map:1000:0:1 --translate-uid=squash-guest:0:0:1000 --translate-uid=squash-guest:1001:0:4294966294 --translate-gid=map:1000:0:1 --translate-gid=squash-guest:0:0:1000 --translate-gid=squash-guest:1001:0:4294966294 --modcaps=-mknod --log-level=info | ReadOnly /work/proj/.git, Hidden /work/proj/.hull",
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
