//! Tier 3 (`vm`): `hull run --tier3` and the VMs `hull vm up` keeps.
//!
//! One run, in a fixed order that fails closed at every step: lower the
//! policy ([`policy::lower::vm`]), find QEMU, virtiofsd and the guest image,
//! choose the accelerator, start one virtiofsd per share and QEMU
//! ([`vm::machine`]), wait for the outer agent's hello, ask it to set up this
//! instance's container (`Configure`: a clone of the base container, the
//! shares as Incus disk devices at their host paths, the policy's limits, no
//! NIC), run the command there, stream its output, and tear everything down.
//! An error at any step stops the run; nothing is retried under a weaker
//! tier or on the host.
//!
//! With `--vm NAME` the command runs in a VM kept up by `hull vm up`
//! ([`crate::vm::supervisor`]), whose shares were fixed when it started: the
//! run's policy and project must lower to the same shares, or it is refused.
//!
//! What this does not protect against: see [`crate::vm`] and
//! [`policy::lower::vm`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use hull_protocol::{ConfigureSpec, ContainerSpec, Share as ProtoShare};

use crate::exec::{CommandSpec, ExitStatus, OutputSink};
use crate::policy::lower::vm::{self as lower_vm, VmLowerError, VmPlan};
use crate::policy::{Policy, Protection};
use crate::tier::probe::Probe;
use crate::tier::Tier;
use crate::vm::qemu::Accel;
use crate::vm::virtiofsd::{HostMask, MaskKind, SandboxMode, VirtiofsdSpec};

#[derive(Debug, thiserror::Error)]
pub enum VmTierError {
    #[error(transparent)]
    Lower(#[from] VmLowerError),
    #[error(
        "tier vm: no guest image found (looked in {looked}); build it with `hull image build`"
    )]
    NoImage { looked: String },
    #[error("tier vm: path {0} is not UTF-8; the guest agent needs UTF-8 paths")]
    NotUtf8(PathBuf),
    #[error("tier vm: the container request is invalid: {0}")]
    Configure(String),
    #[cfg(target_os = "linux")]
    #[error(transparent)]
    Machine(#[from] crate::vm::machine::MachineError),
    #[cfg(unix)]
    #[error("{source}\n  console log: {console}")]
    Agent {
        console: PathBuf,
        #[source]
        source: crate::vm::agent::AgentError,
    },
    #[cfg(target_os = "linux")]
    #[error(transparent)]
    Supervisor(#[from] crate::vm::supervisor::SupervisorError),
    #[cfg(target_os = "linux")]
    #[error(transparent)]
    Snapshot(#[from] crate::vm::snapshot::SnapshotError),
    #[error("tier vm: cannot install signal handlers: {0}")]
    Signals(#[source] std::io::Error),
    #[error("tier vm is not built for this OS yet (Linux hosts only for now)")]
    Unsupported,
    #[error(transparent)]
    SandboxUser(#[from] crate::sandbox_user::SandboxUserError),
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
        let env = std::env::var("HULL_VM_BOOT_TIMEOUT")
            .ok()
            .and_then(|s| s.parse::<u64>().ok());
        Duration::from_secs(env.unwrap_or(secs))
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
fn own_ids(s: &lower_vm::Share) -> bool {
    #[cfg(unix)]
    // SAFETY: geteuid takes no arguments and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    #[cfg(not(unix))]
    let root = false;
    !s.readonly || s.origin != lower_vm::ShareOrigin::Policy || !root
}

/// The virtiofsd of each share, sockets in `dir`.
pub fn share_specs(plan: &VmPlan, dir: &Path) -> Vec<VirtiofsdSpec> {
    plan.shares
        .iter()
        .map(|s| VirtiofsdSpec {
            tag: s.tag.clone(),
            shared_dir: s.host_path.clone(),
            socket: dir.join(format!("vfs-{}.sock", s.tag)),
            readonly: s.readonly,
            sandbox: SandboxMode::Namespace,
            translate: own_ids(s).then_some((plan.uid, plan.gid)),
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
        })
        .collect()
}

/// The `Configure` request for the plan: container `name`, cloned from the
/// base, with one Incus disk device per share at its host path.
pub fn configure_spec(
    plan: &VmPlan,
    name: &str,
    clock_unix_ns: u64,
) -> Result<ConfigureSpec, VmTierError> {
    let mut shares = Vec::new();
    for s in &plan.shares {
        let container_path = s
            .container_path
            .to_str()
            .ok_or_else(|| VmTierError::NotUtf8(s.container_path.clone()))?
            .to_string();
        shares.push(ProtoShare {
            tag: s.tag.clone(),
            guest_path: s.guest_path.clone(),
            container_path,
            readonly: s.readonly,
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
    };
    spec.validate().map_err(VmTierError::Configure)?;
    Ok(spec)
}

/// The guest image to boot: `HULL_VM_IMAGE` (one image dir), else the image
/// `hull image build` made for this recipe and this hull-agent binary (an
/// image of another recipe or agent is never used: rebuild it).
pub fn find_image() -> Result<PathBuf, VmTierError> {
    let complete = |d: &Path| {
        ["vmlinux", "initrd.cpio", "disk.raw"]
            .iter()
            .all(|f| d.join(f).is_file())
    };
    if let Some(d) = std::env::var_os("HULL_VM_IMAGE") {
        let d = PathBuf::from(d);
        if complete(&d) {
            return Ok(d);
        }
        return Err(VmTierError::NoImage {
            looked: format!("HULL_VM_IMAGE={}", d.display()),
        });
    }
    let cache = crate::vm::image::Cache::default_location().map_err(|e| VmTierError::NoImage {
        looked: format!("the image cache ({e})"),
    })?;
    let agent = crate::vm::image::default_agent_path().map_err(|e| VmTierError::NoImage {
        looked: format!("the hull-agent binary ({e})"),
    })?;
    match crate::vm::image::find(&cache, &agent) {
        Ok(img) => Ok(img.dir.clone()),
        Err(e) => Err(VmTierError::NoImage {
            looked: format!(
                "{} for agent {} ({e})",
                cache.root().display(),
                agent.display()
            ),
        }),
    }
}

/// What `hull policy explain --tier vm` prints.
pub fn explain(policy: &Policy) -> Result<String, VmTierError> {
    let plan = lower_vm::lower(policy, &crate::policy::RealFs)?;
    let mut out = plan.render();
    out.push_str("  per share: virtiofsd --sandbox=namespace --seccomp=kill --cache=auto");
    out.push_str(&format!(
        " --translate-uid=map:{}:0:1 --translate-gid=map:{}:0:1 [--readonly]\n",
        plan.uid, plan.gid
    ));
    out.push_str(
        "  QEMU: -nodefaults -no-user-config -nic none -sandbox on,... \
         memfd shared RAM, virtio-serial agent port, QMP, console log in the instance dir\n",
    );
    out.push_str("  accelerator: see `hull probe` (KVM only when a probe boot succeeds)\n");
    Ok(out)
}

/// The cheap check of a run: QEMU and virtiofsd exist (no process spawned,
/// no image hashed; a missing image or a broken QEMU fails the run's setup,
/// naming the piece, and nothing runs).
#[cfg(target_os = "linux")]
pub fn ready() -> Probe {
    let arch = crate::vm::qemu::Arch::host();
    if crate::vm::qemu::find_qemu(arch).is_none() {
        return Probe::unavailable(
            Tier::Vm,
            format!(
                "{} not found; install QEMU 9 or later (scripts/setup.sh --tier3)",
                arch.qemu_binary()
            ),
        );
    }
    if crate::vm::virtiofsd::find_virtiofsd().is_none() {
        return Probe::unavailable(
            Tier::Vm,
            "virtiofsd not found (PATH, /usr/libexec, ~/.cargo/bin); install it with `cargo install virtiofsd --version 1.14.0 --locked` (scripts/setup.sh --tier3)",
        );
    }
    Probe::available(Tier::Vm, "QEMU and virtiofsd found", Vec::new())
}

/// Probes tier 3 on this host: QEMU, virtiofsd, a built image, the accelerator.
pub fn probe() -> Probe {
    imp::probe()
}

/// Runs one command in a fresh VM (or in `vm` when named) and returns how
/// it ended. `instance_dir` holds the VM's sockets, logs and pid files;
/// `instance_id` names the container.
pub fn run(
    policy: &Policy,
    spec: &CommandSpec,
    instance_dir: &Path,
    instance_id: &str,
    sink: Option<&mut dyn OutputSink>,
    vm: Option<&str>,
) -> Result<ExitStatus, VmTierError> {
    imp::run(policy, spec, instance_dir, instance_id, sink, vm)
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

/// Writes output straight to hull's stdout and stderr.
#[derive(Debug, Default)]
pub struct StdioSink;

impl OutputSink for StdioSink {
    fn stdout(&mut self, d: &[u8]) -> std::io::Result<()> {
        use std::io::Write;
        let mut o = std::io::stdout().lock();
        o.write_all(d)?;
        o.flush()
    }
    fn stderr(&mut self, d: &[u8]) -> std::io::Result<()> {
        use std::io::Write;
        let mut e = std::io::stderr().lock();
        e.write_all(d)?;
        e.flush()
    }
}

#[cfg(target_os = "linux")]
pub use imp::{start_vm, Started};

#[cfg(target_os = "linux")]
mod imp {
    use std::sync::atomic::{AtomicI32, Ordering};
    use std::sync::Arc;

    use super::*;
    use crate::tier::probe::Helper;
    use crate::vm::agent::ExecOptions;
    use crate::vm::machine::{BootImage, Machine, MachineSpec, Tools};
    use crate::vm::snapshot;

    /// `HULL_VM_SNAPSHOT=off` boots every run (benchmarks of the boot path).
    fn snapshot_wanted() -> bool {
        !matches!(
            std::env::var("HULL_VM_SNAPSHOT").as_deref(),
            Ok("off" | "0" | "no")
        )
    }

    pub(super) fn probe() -> Probe {
        let tools = match Tools::find() {
            Ok(t) => t,
            Err(e) => return Probe::unavailable(Tier::Vm, e.to_string()),
        };
        let mut helpers = vec![Helper {
            name: "qemu".into(),
            path: tools.qemu.display().to_string(),
            version: tools.qemu_version.clone(),
        }];
        let Some(vfs) = &tools.virtiofsd else {
            return Probe {
                helpers,
                ..Probe::unavailable(
                    Tier::Vm,
                    "virtiofsd not found (PATH, /usr/libexec, ~/.cargo/bin); install it with `cargo install virtiofsd --version 1.14.0 --locked` (scripts/setup.sh --tier3)",
                )
            };
        };
        helpers.push(Helper {
            name: "virtiofsd".into(),
            path: vfs.display().to_string(),
            version: crate::vm::virtiofsd::version(vfs).unwrap_or_else(|| "unknown".into()),
        });
        let choice = crate::vm::accel::probe_accel();
        let sandbox = if tools.sandbox {
            "QEMU -sandbox on"
        } else {
            "QEMU without -sandbox (seccomp not built in)"
        };
        match find_image() {
            Ok(img) => {
                let snap = match BootImage::from_dir(&img) {
                    Ok(boot) => {
                        let g = snapshot::geometry_for(&img, &boot, &tools, choice.accel);
                        match snapshot::open(&img, &g) {
                            Some(s) => format!(
                                "snapshot ready ({} MiB of state)",
                                s.manifest.state_bytes >> 20
                            ),
                            None => {
                                "no snapshot yet (`hull image build` or the first run prepares it)"
                                    .into()
                            }
                        }
                    }
                    Err(e) => format!("image unusable: {e}"),
                };
                Probe {
                    helpers,
                    ..Probe::available(
                        Tier::Vm,
                        format!(
                            "accelerator {} ({}); {sandbox}; image {}; {snap}",
                            choice.accel,
                            choice.reason,
                            img.display()
                        ),
                        Vec::new(),
                    )
                }
            }
            Err(e) => Probe {
                helpers,
                ..Probe::unavailable(
                    Tier::Vm,
                    format!(
                        "{e}; accelerator would be {} ({})",
                        choice.accel, choice.reason
                    ),
                )
            },
        }
    }

    /// SIGINT/SIGTERM/SIGHUP set `flag` to the signal number.
    fn watch_signals() -> Result<(Arc<AtomicI32>, signal_hook::iterator::Handle), VmTierError> {
        let flag = Arc::new(AtomicI32::new(0));
        let mut signals = signal_hook::iterator::Signals::new([
            signal_hook::consts::SIGINT,
            signal_hook::consts::SIGTERM,
            signal_hook::consts::SIGHUP,
        ])
        .map_err(VmTierError::Signals)?;
        let handle = signals.handle();
        let f = flag.clone();
        std::thread::spawn(move || {
            for s in signals.forever() {
                f.store(s, Ordering::SeqCst);
            }
        });
        Ok((flag, handle))
    }

    pub(super) fn run(
        policy: &Policy,
        spec: &CommandSpec,
        instance_dir: &Path,
        instance_id: &str,
        sink: Option<&mut dyn OutputSink>,
        vm: Option<&str>,
    ) -> Result<ExitStatus, VmTierError> {
        let plan = lower_vm::lower(policy, &crate::policy::RealFs)?;
        let (irq, handle) = watch_signals()?;
        let mut stdio = StdioSink;
        let sink: &mut dyn OutputSink = match sink {
            Some(s) => s,
            None => &mut stdio,
        };
        let r = match vm {
            Some(name) => {
                crate::vm::supervisor::run_in(name, policy, &plan, spec, sink, irq.clone())
                    .map_err(VmTierError::from)
            }
            None => run_fresh(&plan, spec, instance_dir, instance_id, sink, irq.clone()),
        };
        handle.close();
        r
    }

    fn run_fresh(
        plan: &VmPlan,
        spec: &CommandSpec,
        instance_dir: &Path,
        instance_id: &str,
        sink: &mut dyn OutputSink,
        irq: Arc<AtomicI32>,
    ) -> Result<ExitStatus, VmTierError> {
        let tools = Tools::find()?;
        let image_dir = find_image()?;
        let accel = crate::vm::accel::probe_accel().accel;
        // Per hull process: several runs may share one instance (--instance).
        let run_name = format!("vm-{}", std::process::id());
        let dir = instance_dir.join(&run_name);
        // Logs outlive the run (24 h, as the spill), so a failed run's
        // console log is still there to read; never in a dir the guest
        // sees.
        let log_dir = instance_dir.join(crate::runtime::LOGS_DIR).join(&run_name);
        std::fs::create_dir_all(&dir).map_err(|source| {
            crate::vm::machine::MachineError::from(crate::vm::machine::MachineErrorKind::Io {
                step: crate::vm::machine::Step::Prepare,
                console: dir.join("console.log"),
                source,
            })
        })?;
        let name = lower_vm::RUN_CONTAINER.to_string();
        let t0 = std::time::Instant::now();
        let phase =
            |what: &str| tracing::info!("tier vm: {what} at {:.3} s", t0.elapsed().as_secs_f64());
        let Started {
            mut machine,
            plan,
            hold: _hold,
            deadlines: (boot_deadline, setup_deadline),
        } = start_vm(
            plan,
            &tools,
            &image_dir,
            accel,
            format!("hull-{instance_id}"),
            &dir,
            &log_dir,
        )?;
        let plan = &plan;
        phase("VM started");
        let console = machine.console_log().to_path_buf();
        let agent_err = |source| VmTierError::Agent {
            console: console.clone(),
            source,
        };
        let cancelled = || interrupted(&irq).is_some();
        let mut agent = match machine.connect_agent_until(boot_deadline, &cancelled) {
            Ok(a) => a,
            Err(_) if cancelled() => return Ok(interrupted_status(&irq)),
            Err(e) => return Err(e.into()),
        };
        phase("agent hello");
        let cfg = configure_spec(plan, &name, now_ns())?;
        match agent.configure(&cfg, setup_deadline, &mut || {
            cancelled() || !machine_alive(&mut machine)
        }) {
            Ok(_) => {}
            Err(_) if cancelled() => {
                machine.kill();
                return Ok(interrupted_status(&irq));
            }
            Err(e) => return Err(agent_err(e)),
        }
        let opts = ExecOptions {
            stdin: Some(Box::new(std::io::stdin())),
            uid_gid: Some((plan.uid, plan.gid)),
            interrupt: Some(irq.clone()),
            ..ExecOptions::default()
        };
        phase("container configured");
        match agent.exec(spec, sink, opts) {
            Ok(st) => {
                phase("command ended");
                machine.shutdown(Some(&mut agent), Duration::from_secs(10));
                phase("VM down");
                Ok(st)
            }
            Err(crate::vm::agent::AgentError::Unresponsive { why, .. }) => {
                // The guest ignored Kill: the VM goes, and the command with it.
                tracing::warn!("tier vm: the guest did not answer Kill after {why}; VM killed");
                machine.kill();
                Ok(match interrupted(&irq) {
                    Some(sig) => ExitStatus::Interrupted(sig),
                    None => ExitStatus::TimedOut,
                })
            }
            Err(e) => {
                machine.kill();
                Err(agent_err(e))
            }
        }
    }

    /// A VM that runs, and the plan its shares were started for (the
    /// policy's, with slot tags when restored from a snapshot).
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
    pub fn start_vm(
        plan: &VmPlan,
        tools: &Tools,
        image_dir: &Path,
        accel: Accel,
        vm_name: String,
        dir: &Path,
        log_dir: &Path,
    ) -> Result<Started, VmTierError> {
        let image = BootImage::from_dir(image_dir)?;
        let run_as = qemu_user()?;
        let geometry = snapshot::geometry_for(image_dir, &image, tools, accel);
        let use_snapshot = match snapshot_wanted() {
            false => None,
            true => {
                match snapshot::fits(plan, &geometry) {
                    Ok(()) => Some(geometry),
                    Err(why) => {
                        eprintln!("hull: tier vm: booting the guest instead of restoring its snapshot: {why}");
                        None
                    }
                }
            }
        };
        match use_snapshot {
            Some(g) => {
                let hold = snapshot::ensure(image_dir, &image, &g, tools, &mut |step| {
                    eprintln!("hull: tier vm: preparing the image's snapshot (once): {step}")
                })?;
                let slotted = snapshot::slotted(plan);
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
    fn qemu_user() -> Result<Option<String>, VmTierError> {
        if !crate::sandbox_user::hull_is_root() {
            return Ok(None);
        }
        crate::sandbox_user::lookup("tier vm: QEMU")?;
        Ok(Some(crate::sandbox_user::NAME.to_string()))
    }

    fn interrupted_status(irq: &AtomicI32) -> ExitStatus {
        ExitStatus::Interrupted(interrupted(irq).unwrap_or(libc::SIGINT))
    }

    fn machine_alive(m: &mut Machine) -> bool {
        m.is_running()
    }

    fn interrupted(irq: &AtomicI32) -> Option<i32> {
        let s = irq.load(Ordering::SeqCst);
        (s != 0).then_some(s)
    }
}

/// Nanoseconds since the Unix epoch (the guest sets its clock from it).
pub fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos().min(u128::from(u64::MAX)) as u64)
        .unwrap_or(0)
}

#[cfg(not(target_os = "linux"))]
mod imp {
    use super::*;

    pub(super) fn probe() -> Probe {
        let choice = crate::vm::accel::probe_accel();
        Probe::unavailable(
            Tier::Vm,
            format!(
                "tier vm runs on Linux hosts for now (virtiofsd is Linux-only); accelerator here would be {} ({})",
                choice.accel, choice.reason
            ),
        )
    }

    pub(super) fn run(
        _policy: &Policy,
        _spec: &CommandSpec,
        _instance_dir: &Path,
        _instance_id: &str,
        _sink: Option<&mut dyn OutputSink>,
        _vm: Option<&str>,
    ) -> Result<ExitStatus, VmTierError> {
        Err(VmTierError::Unsupported)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::policy::hostfs::FakeFs;
    use crate::policy::{resolve, PolicyFile, Vars};

    fn plan() -> VmPlan {
        default_plan()
    }

    /// The default profile lowered for a fake host (also used by the
    /// snapshot tests).
    pub(crate) fn default_plan() -> VmPlan {
        let vars = Vars {
            project: "/work/proj".into(),
            tmp: "/tmp/hull-runs/ID/tmp".into(),
            spill: "/tmp/hull-runs/ID/spill".into(),
            home: "/home/u".into(),
            runs: "/tmp/hull-runs".into(),
        };
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
                "spill: --socket-path=/tmp/hull-runs/ID/vm/vfs-spill.sock --shared-dir=/tmp/hull-runs/ID/spill --sandbox=namespace --seccomp=kill --cache=auto --translate-uid=map:1000:0:1 --translate-gid=map:1000:0:1 --log-level=info --readonly | ",
                "tmp: --socket-path=/tmp/hull-runs/ID/vm/vfs-tmp.sock --shared-dir=/tmp/hull-runs/ID/tmp --sandbox=namespace --seccomp=kill --cache=auto --translate-uid=map:1000:0:1 --translate-gid=map:1000:0:1 --log-level=info | ",
                "project: --socket-path=/tmp/hull-runs/ID/vm/vfs-project.sock --shared-dir=/work/proj --sandbox=namespace --seccomp=kill --cache=auto --translate-uid=map:1000:0:1 --translate-gid=map:1000:0:1 --log-level=info | ReadOnly /work/proj/.git, Hidden /work/proj/.hull",
            ]
        );
    }

    #[test]
    fn golden_configure_request() {
        let c = configure_spec(&plan(), lower_vm::RUN_CONTAINER, 42).unwrap();
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(
            json,
            r#"{"shares":[{"tag":"spill","guest_path":"/mnt/hull/spill","container_path":"/tmp/hull-runs/ID/spill","readonly":true},{"tag":"tmp","guest_path":"/mnt/hull/tmp","container_path":"/tmp/hull-runs/ID/tmp","readonly":false},{"tag":"project","guest_path":"/mnt/hull/project","container_path":"/work/proj","readonly":false}],"container":{"name":"hull-run","base":"hull-base","uid":1000,"gid":1000,"memory_bytes":4294967296,"cpus":null,"processes":1024},"clock_unix_ns":42,"prepare":false}"#
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
        let vars = Vars {
            project: "/work/proj".into(),
            tmp: "/tmp/hull-runs/ID/tmp".into(),
            spill: "/tmp/hull-runs/ID/spill".into(),
            home: "/home/u".into(),
            runs: "/tmp/hull-runs".into(),
        };
        let fs = FakeFs::new()
            .dir("/work/proj")
            .dir("/tmp/hull-runs/ID/tmp")
            .dir("/tmp/hull-runs/ID/spill");
        let pf = PolicyFile::parse("p", "version = 1\n[fs]\nread = [\"${PROJECT}\"]\n").unwrap();
        let plan = lower_vm::lower(&resolve(&pf, &vars).unwrap(), &fs).unwrap();
        let c = configure_spec(&plan, "hull-x", 1).unwrap();
        let p = c.shares.iter().find(|s| s.tag == "project").unwrap();
        assert!(p.readonly);
        let v = share_specs(&plan, Path::new("/r"));
        assert!(v.iter().find(|s| s.tag == "project").unwrap().readonly);
    }
}
