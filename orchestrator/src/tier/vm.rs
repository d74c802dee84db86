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

use crate::exec::{CommandSpec, ExitStatus, OutputSink};
use crate::policy::lower::vm::{self as lower_vm, VmLowerError};
use crate::policy::Policy;
use crate::tier::probe::Probe;
use crate::tier::Tier;

#[derive(Debug, thiserror::Error)]
pub enum VmTierError {
    #[error(transparent)]
    Lower(#[from] VmLowerError),
    #[error(transparent)]
    Assemble(#[from] crate::vm::assemble::AssembleError),
    #[cfg(target_os = "linux")]
    #[error(transparent)]
    Machine(#[from] crate::vm::machine::MachineError),
    #[cfg(target_os = "linux")]
    #[error(transparent)]
    Session(#[from] crate::vm::session::SessionError),
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
    Image(#[from] crate::vm::image::ImageError),
    #[error(
        "tier vm: the container image {image} runs as user {user:?}, a numeric id: commands run \
         as users named in the container; name one with --user NAME"
    )]
    ImageUser { image: String, user: String },
    #[error(
        "tier vm: the container image {image} names no command (no Entrypoint, no Cmd): give one \
         after --"
    )]
    ImageNoCommand { image: String },
    #[error(
        "tier vm: the container image {image} has WorkingDir {dir:?}, which {why}: the project \
         cannot be mounted there; set `[vm] project_at` to \"host\" or to another path"
    )]
    ImageWorkingDir {
        image: String,
        dir: String,
        why: String,
    },
    #[error(
        "tier vm: --cow cannot run in the kept VM {name}: its shares were fixed when it \
         started (the project writable). Run without --vm for a VM of the run's own"
    )]
    CowInKeptVm { name: String },
    #[error(transparent)]
    SandboxUser(#[from] crate::sandbox_user::SandboxUserError),
    #[cfg(unix)]
    #[error(transparent)]
    Libc(#[from] crate::vm::libc_needs::LibcError),
}

/// What `hull policy explain --tier vm` prints.
pub fn explain(policy: &Policy) -> Result<String, VmTierError> {
    let plan = lower_vm::lower(policy, &crate::policy::RealFs)?;
    let mut out = plan.render();
    out.push_str("  per share: virtiofsd --sandbox=namespace --seccomp=kill --cache=auto");
    out.push_str(&format!(
        " --translate-uid=map:{}:0:1 --translate-gid=map:{}:0:1 (every other guest id \
         writes as the host owner: squash-guest) [--readonly]\n",
        plan.uid, plan.gid
    ));
    out.push_str(
        "  QEMU: -nodefaults -no-user-config -nic none -sandbox on,... \
         memfd shared RAM, virtio-serial agent port, QMP, console log in the instance dir\n",
    );
    out.push_str("  accelerator: see `hull probe` (KVM only when a probe boot succeeds)\n");
    // Not hashed here: a rootfs tarball or an image is read when a run or
    // a build needs its userland.
    if let Some(r) = &policy.vm.image {
        out.push_str(&format!(
            "  container userland: the container image {r} (its blobs checked against their \
             digests, its layers stacked into one tarball in the image cache once per version \
             of the image, then checked as a [vm] rootfs; its Env, User and Entrypoint/Cmd are \
             the command's defaults)\n"
        ));
    } else if let Some(r) = &policy.vm.rootfs {
        out.push_str(&format!(
            "  container userland: the [vm] rootfs {} (checked entry by entry; an image of \
             its own, built by the first run or `hull image build --policy P`)\n",
            r.display()
        ));
    } else if policy.vm.packages.is_empty() {
        out.push_str(
            "  container userland: the image's default (Debian bookworm, minbase + build tools)\n",
        );
    } else {
        let recipe = crate::vm::image::recipe::Recipe::with_packages(&policy.vm.packages);
        out.push_str(&format!(
            "  container userland: the image's default + [vm] packages {} (image {}; a run \
             builds it when it is not cached, or `hull image build --policy P`)\n",
            recipe.packages().join(" "),
            recipe.id()
        ));
    }
    out.push_str(&match &policy.vm.project_at {
        crate::policy::ProjectAt::Image if policy.vm.image.is_some() => {
            "  project in the container: at the image's WorkingDir, if it names one (else at \
             the host's path; a run in a kept VM: the host's path) ([vm] project_at)\n"
                .to_string()
        }
        crate::policy::ProjectAt::Path(p) => format!(
            "  project in the container: at {} ([vm] project_at)\n",
            p.display()
        ),
        _ => "  project in the container: at the host's path\n".to_string(),
    });
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
/// `instance_id` names the container. `cow`: the `layers/` directory of a
/// `--cow` run's change set ([`lower_vm::with_cow`]; not with `vm`, whose
/// shares were fixed when it started).
/// How a tier-3 run ended.
#[derive(Debug, Clone, Copy)]
pub struct VmRun {
    pub status: ExitStatus,
    /// Seconds from starting the VM (restored or booted) to the agent's
    /// hello; none in a kept VM (`--vm NAME`).
    pub restore_s: Option<f64>,
    /// The container's peak memory while the command ran, as the guest
    /// told it (its cgroup's `memory.peak`, reset at the command's start;
    /// the container's own idle processes included): a figure from the
    /// guest, not the host's.
    pub peak_memory_bytes: Option<u64>,
}

/// A VM kept up by `hull vm up` that a run goes to (`--vm NAME`).
#[derive(Debug, Clone, Copy)]
pub struct KeptVm<'a> {
    pub name: &'a str,
    /// `--vm-turn-fd`: the VM's turn, held by the caller (a `hull serve`
    /// session) and handed down; else the run takes its own.
    pub turn_fd: Option<i32>,
}

pub fn run(
    policy: &Policy,
    spec: &CommandSpec,
    instance_dir: &Path,
    instance_id: &str,
    sink: Option<&mut dyn OutputSink>,
    vm: Option<KeptVm<'_>>,
    cow: Option<&Path>,
) -> Result<VmRun, VmTierError> {
    if let (Some(kept), Some(_)) = (vm, cow) {
        return Err(VmTierError::CowInKeptVm {
            name: kept.name.to_string(),
        });
    }
    imp::run(policy, spec, instance_dir, instance_id, sink, vm, cow)
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
pub use crate::vm::assemble::cleanup_stale_instance;
pub use crate::vm::assemble::{find_image, find_image_with};

#[cfg(target_os = "linux")]
mod imp {
    use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::policy::lower::vm::VmPlan;
    use crate::tier::probe::Helper;
    use crate::vm::agent::ExecOptions;
    use crate::vm::machine::{BootImage, Tools};
    use crate::vm::session::{SessionError, StartOptions, VmSession};
    use crate::vm::snapshot;

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
        match find_image_with(&crate::vm::image::recipe::Recipe::base(), false) {
            Ok(img) => {
                let snap = match BootImage::from_image(&img) {
                    _ if !img.agent.path.is_file() => "no snapshot yet for this hull-agent (the \
                         first run makes its disk and snapshot)"
                        .to_string(),
                    Ok(boot) => {
                        let g = snapshot::geometry(&img, &boot, &tools, choice.accel);
                        match snapshot::open(&img.dir, &g) {
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
                            img.dir.display()
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

    /// SIGINT/SIGTERM/SIGHUP set `flag` to the signal number once the run
    /// has `started` (its VM starting: every step from there ends on the
    /// flag). Before that (the userland checked, its image built or waited
    /// for: steps that do not look at the flag) a signal ends hull at
    /// once, saying nothing ran; an image build it started goes on alone,
    /// holding its lock, as when hull is killed.
    fn watch_signals(
        started: Arc<AtomicBool>,
    ) -> Result<(Arc<AtomicI32>, signal_hook::iterator::Handle), VmTierError> {
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
                if !started.load(Ordering::SeqCst) {
                    let name = match s {
                        signal_hook::consts::SIGINT => "SIGINT",
                        signal_hook::consts::SIGTERM => "SIGTERM",
                        _ => "SIGHUP",
                    };
                    eprintln!(
                        "hull: tier vm: {name} before the run started (its userland image was \
                         being checked or built); nothing ran"
                    );
                    std::process::exit(128 + s);
                }
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
        vm: Option<super::KeptVm<'_>>,
        cow: Option<&Path>,
    ) -> Result<VmRun, VmTierError> {
        let plan = lower_vm::lower(policy, &crate::policy::RealFs)?;
        let plan = match cow {
            Some(layers) => lower_vm::with_cow(plan, &policy.vars.project, layers)?,
            None => plan,
        };
        // A host program that cannot run on the image's C library is
        // said before anything starts, not by the loader in the guest.
        if let Some(argv0) = spec.argv.first() {
            let path = spec
                .env
                .iter()
                .find(|(k, _)| k == "PATH")
                .map(|(_, v)| v.as_str());
            crate::vm::libc_needs::check(argv0, path, &spec.cwd, lower_vm::is_system)?;
        }
        // The command starts where the container sees its directory
        // (`[vm] project_at` may put the project elsewhere than the host).
        let spec = &CommandSpec {
            cwd: plan.container_path_of(&spec.cwd),
            ..spec.clone()
        };
        let started = Arc::new(AtomicBool::new(false));
        let (irq, handle) = watch_signals(started.clone())?;
        let mut stdio = StdioSink;
        let sink: &mut dyn OutputSink = match sink {
            Some(s) => s,
            None => &mut stdio,
        };
        let r = match vm {
            Some(kept) => {
                started.store(true, Ordering::SeqCst);
                crate::vm::supervisor::run_in(
                    kept.name,
                    kept.turn_fd,
                    policy,
                    &plan,
                    spec,
                    sink,
                    irq.clone(),
                )
                .map(|status| VmRun {
                    status,
                    restore_s: None,
                    peak_memory_bytes: None,
                })
                .map_err(VmTierError::from)
            }
            None => run_fresh(
                &plan,
                policy,
                spec,
                instance_dir,
                instance_id,
                sink,
                irq.clone(),
                &started,
            ),
        };
        handle.close();
        r
    }

    #[allow(clippy::too_many_arguments)]
    fn run_fresh(
        plan: &VmPlan,
        policy: &Policy,
        spec: &CommandSpec,
        instance_dir: &Path,
        instance_id: &str,
        sink: &mut dyn OutputSink,
        irq: Arc<AtomicI32>,
        started: &AtomicBool,
    ) -> Result<VmRun, VmTierError> {
        let tools = Tools::find()?;
        let recipe = crate::vm::assemble::recipe_for(&policy.vm)?;
        {
            let mut progress = crate::vm::image::progress::BuildProgress::new("tier vm: ");
            crate::vm::assemble::ensure_userland(&recipe, &mut |ev| progress.on(ev))?;
        }
        let image = find_image(&recipe)?;
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
        let t0 = std::time::Instant::now();
        let phase =
            |what: &str| tracing::info!("tier vm: {what} at {:.3} s", t0.elapsed().as_secs_f64());
        let cancelled = || interrupted(&irq).is_some();
        let start = StartOptions {
            plan,
            tools: &tools,
            image: &image,
            accel,
            vm_name: format!("hull-{instance_id}"),
            dir: &dir,
            log_dir: &log_dir,
        };
        // From here every step ends on the flag.
        started.store(true, Ordering::SeqCst);
        let mut session = match VmSession::start(start, &cancelled) {
            Ok(s) => s,
            Err(SessionError::Cancelled) => return Ok(interrupted_run(&irq, None)),
            Err(e) => return Err(e.into()),
        };
        let restore_s = Some(t0.elapsed().as_secs_f64());
        phase("agent hello");
        // The allow list: a proxy of this run's own, bridged to the VM.
        let spec = if policy.net.mode == crate::policy::NetMode::Allowlist {
            session.start_network("tier vm", &policy.net, &policy.vars.spill)?;
            &CommandSpec {
                env: crate::net::with_proxy_env(&spec.env),
                ..spec.clone()
            }
        } else {
            spec
        };
        match session.configure(lower_vm::RUN_CONTAINER, &cancelled) {
            Ok(()) => {}
            Err(SessionError::Cancelled) => {
                session.kill();
                return Ok(interrupted_run(&irq, restore_s));
            }
            Err(e) => return Err(e.into()),
        }
        phase("container configured");
        let opts = ExecOptions {
            stdin: Some(Box::new(std::io::stdin())),
            interrupt: Some(irq.clone()),
            ..ExecOptions::default()
        };
        let result = session.exec(spec, sink, opts);
        let peak_memory_bytes = session.last_peak_memory();
        phase("command ended");
        session.finish(Duration::from_secs(10), &cancelled);
        phase("VM down");
        Ok(VmRun {
            status: result?,
            restore_s,
            peak_memory_bytes,
        })
    }

    fn interrupted_run(irq: &AtomicI32, restore_s: Option<f64>) -> VmRun {
        VmRun {
            status: ExitStatus::Interrupted(interrupted(irq).unwrap_or(libc::SIGINT)),
            restore_s,
            peak_memory_bytes: None,
        }
    }

    fn interrupted(irq: &AtomicI32) -> Option<i32> {
        let s = irq.load(Ordering::SeqCst);
        (s != 0).then_some(s)
    }
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
        _vm: Option<super::KeptVm<'_>>,
        _cow: Option<&Path>,
    ) -> Result<VmRun, VmTierError> {
        Err(VmTierError::Unsupported)
    }
}

/// What a container image's config gives a run on it: the environment the
/// image sets, the user it runs as, and its command.
#[derive(Debug, Clone, Default)]
pub struct ImageDefaults {
    pub env: Vec<(String, String)>,
    /// A user of the container by name (`root` for 0); none: hull's
    /// account (uid 1000).
    pub user: Option<String>,
    /// Entrypoint then Cmd.
    pub argv: Vec<String>,
    /// `User` as the image writes it (bwrap maps the command's ids to it).
    pub user_raw: Option<String>,
    /// `WorkingDir`, checked ([`crate::policy::check_project_at`]): where
    /// the container sees the project unless the policy says otherwise.
    pub working_dir: Option<PathBuf>,
}

/// A registry's image (`docker://...`) pulled into the image cache through
/// the run's network policy `net`, named by its digest from then on (the
/// run's later steps find it in the cache, and read nothing again); any
/// other reference as it is.
#[cfg(target_os = "linux")]
pub fn pull_image(
    reference: &str,
    net: &crate::policy::net::NetPolicy,
) -> Result<String, VmTierError> {
    if !reference.starts_with("docker://") {
        return Ok(reference.to_string());
    }
    let cache = crate::vm::image::Cache::default_location()?;
    let mut say = crate::vm::image::container_image::say(false);
    let imported =
        crate::vm::image::container_image::import_with_network(&cache, reference, net, &mut say)?;
    Ok(imported.digest)
}

#[cfg(not(target_os = "linux"))]
pub fn pull_image(
    reference: &str,
    _net: &crate::policy::net::NetPolicy,
) -> Result<String, VmTierError> {
    Ok(reference.to_string())
}

/// The defaults of the container image `reference` on tier 3 (imported
/// into the image cache when it is not there yet).
#[cfg(target_os = "linux")]
pub fn image_defaults(reference: &str) -> Result<ImageDefaults, VmTierError> {
    let cache = crate::vm::image::Cache::default_location()?;
    let mut say = crate::vm::image::container_image::say(false);
    let c = crate::vm::image::container_image::import(&cache, reference, &mut say)?.config;
    Ok(ImageDefaults {
        user: image_user(reference, c.user.as_deref())?,
        ..defaults_of(reference, c)?
    })
}

/// What an image's config gives a run on any tier: its `User` as written
/// (a tier makes it its own user), none in `user`.
#[cfg(target_os = "linux")]
fn defaults_of(reference: &str, c: hull_oci::RunConfig) -> Result<ImageDefaults, VmTierError> {
    let env = c
        .env
        .unwrap_or_default()
        .into_iter()
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            Some((k.to_string(), v.to_string()))
        })
        .collect();
    let working_dir = image_working_dir(reference, c.working_dir.as_deref())?;
    let argv = c
        .entrypoint
        .unwrap_or_default()
        .into_iter()
        .chain(c.cmd.unwrap_or_default())
        .collect();
    Ok(ImageDefaults {
        env,
        user: None,
        argv,
        user_raw: c.user.filter(|u| !u.is_empty()),
        working_dir,
    })
}

/// An image's `WorkingDir` as the project's place in the container: none
/// for no `WorkingDir` or `/` (the host's path then); one the container
/// cannot have the project at is refused, naming `[vm] project_at`.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn image_working_dir(reference: &str, dir: Option<&str>) -> Result<Option<PathBuf>, VmTierError> {
    match dir {
        None | Some("") | Some("/") => Ok(None),
        Some(d) => {
            let path = PathBuf::from(d);
            crate::policy::check_project_at(&path).map_err(|why| VmTierError::ImageWorkingDir {
                image: reference.to_string(),
                dir: d.to_string(),
                why,
            })?;
            Ok(Some(path))
        }
    }
}

/// A container image as a bwrap sandbox's `/`.
#[derive(Debug)]
pub struct BwrapImage {
    /// Its config's defaults (`user` none: bwrap maps ids from
    /// `user_raw` instead).
    pub defaults: ImageDefaults,
    /// The image unpacked into a tree of the image cache.
    pub tree: PathBuf,
    /// The tree's lock, held shared while the run uses it (no removal
    /// takes it meanwhile).
    pub in_use: std::fs::File,
}

/// The image `reference` for bwrap, imported and unpacked when it is not
/// there yet (one import for its config and its tree).
#[cfg(target_os = "linux")]
pub fn image_on_bwrap(reference: &str) -> Result<BwrapImage, VmTierError> {
    let cache = crate::vm::image::Cache::default_location()?;
    let mut say = crate::vm::image::container_image::say(false);
    let imported = crate::vm::image::container_image::import(&cache, reference, &mut say)?;
    let t = crate::vm::image::container_image::tree(&cache, &imported, &mut say)?;
    Ok(BwrapImage {
        defaults: defaults_of(reference, imported.config)?,
        tree: t.path,
        in_use: t.in_use,
    })
}

#[cfg(not(target_os = "linux"))]
pub fn image_on_bwrap(_reference: &str) -> Result<BwrapImage, VmTierError> {
    Err(VmTierError::Unsupported)
}

/// The container user an image's `User` (`NAME`, `UID`, `NAME:GROUP`)
/// names: none for hull's account (uid 1000) or no user, `root` for 0, a
/// name as it is; another numeric id is refused (commands run as users
/// named in the container).
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn image_user(reference: &str, user: Option<&str>) -> Result<Option<String>, VmTierError> {
    let refuse = |u: &str| VmTierError::ImageUser {
        image: reference.to_string(),
        user: u.to_string(),
    };
    match user.map(|u| u.split(':').next().unwrap_or(u)) {
        None | Some("") | Some("1000") => Ok(None),
        Some("0") | Some("root") => Ok(Some("root".to_string())),
        Some(u) if u.bytes().all(|b| b.is_ascii_digit()) => Err(refuse(u)),
        Some(u) => {
            hull_protocol::check_user_name(u).map_err(|_| refuse(u))?;
            Ok(Some(u.to_string()))
        }
    }
}

#[cfg(not(target_os = "linux"))]
pub fn image_defaults(_reference: &str) -> Result<ImageDefaults, VmTierError> {
    Err(VmTierError::Unsupported)
}

#[cfg(test)]
mod image_tests {
    use super::*;

    #[test]
    fn an_image_s_user_is_a_container_user_by_name() {
        let u = |s: &str| image_user("oci:/i", Some(s)).map_err(|e| e.to_string());
        assert_eq!(u("1000"), Ok(None));
        assert_eq!(u("1000:1000"), Ok(None));
        assert_eq!(u(""), Ok(None));
        assert_eq!(u("0"), Ok(Some("root".into())));
        assert_eq!(u("root:root"), Ok(Some("root".into())));
        assert_eq!(u("app"), Ok(Some("app".into())));
        let e = u("1001").unwrap_err();
        assert!(e.contains("\"1001\"") && e.contains("--user NAME"), "{e}");
        assert!(u("../x").is_err());
        assert_eq!(
            image_user("oci:/i", None).map_err(|e| e.to_string()),
            Ok(None)
        );
    }

    #[test]
    fn an_image_s_working_dir_is_where_the_project_goes_unless_the_container_needs_it() {
        let w = |d: Option<&str>| image_working_dir("oci:/i", d).map_err(|e| e.to_string());
        assert_eq!(w(None), Ok(None));
        assert_eq!(w(Some("/")), Ok(None));
        assert_eq!(w(Some("/testbed")), Ok(Some(PathBuf::from("/testbed"))));
        assert_eq!(
            w(Some("/usr/src/app")),
            Ok(Some(PathBuf::from("/usr/src/app")))
        );
        for bad in ["/etc", "/proc/self", "/opt/hull", "app", "/a/../etc"] {
            let e = w(Some(bad)).unwrap_err();
            assert!(
                e.contains("oci:/i") && e.contains(bad) && e.contains("[vm] project_at"),
                "{bad}: {e}"
            );
        }
    }
}
