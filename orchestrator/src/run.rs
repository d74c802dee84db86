//! `hull run`: one command, one tier, one policy, from start to exit code.
//!
//! The order is fixed and fails closed at every step: resolve the tier
//! (probing it; `auto` is the host's tier 2 and never tier 3), load and
//! resolve the policy for this instance, lower it for the tier, build the
//! command, run it. Any error before the command starts means the command
//! does not run at all; nothing is retried under another tier.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::exec::{CommandSpec, ExitStatus, OutputSink};
use crate::policy::{self, Policy};
use crate::prepare::{
    command_env, home_dir, project_path, resolve_policy, PrepareError, ProjectError, Repos,
};
use crate::tier::{probe::Probe, Tier};

/// Which tier the caller asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TierChoice {
    /// The host's tier 2.
    Auto,
    Named(Tier),
}

impl TierChoice {
    pub fn parse(s: &str) -> Result<TierChoice, RunError> {
        if s == "auto" {
            return Ok(TierChoice::Auto);
        }
        Tier::from_name(s)
            .map(TierChoice::Named)
            .ok_or_else(|| RunError::UnknownTier(s.to_string()))
    }
}

/// Everything `hull run` was asked.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub tier: TierChoice,
    pub policy: String,
    pub project: PathBuf,
    /// `--env K=V`: set by the (trusted) caller on top of the policy's env.
    pub env: Vec<(String, String)>,
    pub timeout: Option<Duration>,
    /// `--spill[=BYTES]`.
    pub spill: Option<u64>,
    /// `--instance ID`: join an existing instance (to read its spill).
    pub instance: Option<String>,
    /// `--vm NAME`: run in a VM kept up by `hull vm up` (tier 3).
    pub vm: Option<String>,
    /// `--vm-turn-fd N`: the kept VM's turn, held by the caller.
    pub vm_turn_fd: Option<i32>,
    /// `--cow`: the project read-only to the command, its writes kept as a
    /// change set ([`crate::changes`]).
    pub cow: bool,
    /// `--cow-continue ID`: the writes go on in the change set of an
    /// earlier `--cow` run on the project, whose writes this run sees.
    pub cow_continue: Option<String>,
    /// `--changes-id-fd N`: where the change set's ID is told once made.
    pub changes_id_to: Option<std::sync::Arc<std::fs::File>>,
    /// `--session-leader`: the command is hull's agent serving execs on its
    /// stdin and stdout (`hull serve`'s session, on landlock and bwrap):
    /// every exec runs inside this one sandbox. `argv` is then empty.
    pub session_leader: bool,
    /// `--user NAME`: tier 3 only, the container's user the command runs
    /// as (a session's `user=`); refused on the process tiers.
    pub user: Option<String>,
    /// `--image REF`: the container image whose layers are the userland
    /// (tier vm), instead of the policy's `[vm]` userland.
    pub image: Option<String>,
    pub argv: Vec<OsString>,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("tier {tier}: --cow is refused: {why}. Nothing was run")]
    CowRefused { tier: Tier, why: &'static str },
    #[error(
        "tier {tier}: --user {user} is refused: this tier runs the command only as the \
         sandbox's own user; tier vm runs it as any user of its container. Nothing was run"
    )]
    UserRefused { tier: Tier, user: String },
    #[error(
        "tier {tier}: --image {image} is refused: a container image is the userland of tier vm \
         (its container runs the image's programs) or the root of a bwrap sandbox; this tier \
         cannot change the root. Nothing was run"
    )]
    ImageRefused { tier: Tier, image: String },
    #[error(
        "tier {tier}: --image: the image's tree {tree} and {root}, which this policy makes \
         writable, overlap: the command could change the image every later run starts from. \
         Run from a project that neither holds hull's image cache nor lies in it, or set \
         HULL_IMAGE_CACHE elsewhere. Nothing was run"
    )]
    ImageCacheWritable {
        tier: Tier,
        tree: PathBuf,
        root: PathBuf,
    },
    #[error("tier {tier}: --image {image}: {why}. Nothing was run")]
    ImageUserUnknown {
        tier: Tier,
        image: String,
        why: String,
    },
    #[error("--changes-id-fd: cannot tell the change set's ID: {0}")]
    ChangesId(#[source] std::io::Error),
    #[cfg(target_os = "linux")]
    #[error("--cow: {0}")]
    Changes(#[from] crate::changes::ChangesError),
    #[cfg(target_os = "linux")]
    #[error(transparent)]
    Cow(#[from] crate::tier::cow::CowError),
    #[error("tier {0}: a session's leader runs on landlock and bwrap only. Nothing was run")]
    LeaderTier(Tier),
    #[error("tier {tier}: the session's agent {path}: {why} (set HULL_AGENT, or install hull-agent next to hull). Nothing was run")]
    LeaderAgent {
        tier: Tier,
        path: PathBuf,
        why: String,
    },
    #[error("unknown tier {0:?}; tiers: auto, none, landlock, restricted, bwrap, seatbelt, appcontainer, vm (or --tier3)")]
    UnknownTier(String),
    #[error("--tier auto: this host's tier 2 ({tier}) is unavailable: {reason}. Nothing was run. Ask for a lower tier explicitly (--tier landlock, or --tier none to run unsandboxed), or for tier 3 (--tier3)")]
    AutoUnavailable { tier: Tier, reason: String },
    #[error("tier {tier} is unavailable on this host: {reason}. Nothing was run")]
    Unavailable { tier: Tier, reason: String },
    #[error(transparent)]
    Project(#[from] ProjectError),
    #[error(transparent)]
    Policy(#[from] policy::PolicyError),
    #[error(transparent)]
    Prepare(#[from] PrepareError),
    #[error("tier {tier}: {source}")]
    Lower {
        tier: Tier,
        #[source]
        source: crate::policy::lower::plan::PlanError,
    },
    #[error("instance: {0}")]
    Instance(#[from] crate::runtime::InstanceError),
    #[error("instance: --instance: {0}")]
    InstanceId(#[from] crate::runtime::BadInstanceId),
    #[error("instance: the spill: {0}")]
    Spill(#[from] crate::runtime::SpillError),
    #[error(transparent)]
    Seatbelt(#[from] crate::tier::seatbelt::SeatbeltError),
    #[error(transparent)]
    Windows(#[from] crate::tier::windows::WinError),
    #[error(transparent)]
    Vm(#[from] crate::tier::vm::VmTierError),
    #[cfg(target_os = "linux")]
    #[error(transparent)]
    Bwrap(#[from] crate::tier::bwrap::BwrapError),
    #[cfg(target_os = "linux")]
    #[error(transparent)]
    Landlock(#[from] crate::tier::landlock::LandlockError),
    #[cfg(target_os = "linux")]
    #[error(transparent)]
    Identity(#[from] crate::tier::identity::IdentityError),
    #[cfg(target_os = "linux")]
    #[error(transparent)]
    Launch(#[from] crate::tier::launch::LaunchError),
    #[cfg(target_os = "linux")]
    #[error("tier {tier}: {source}")]
    Placeholders {
        tier: Tier,
        #[source]
        source: crate::runtime::placeholder::PlaceholderError,
    },
    /// A step of setting the sandbox up failed on the host.
    #[error(transparent)]
    SandboxUser(#[from] crate::sandbox_user::SandboxUserError),
    #[cfg(target_os = "linux")]
    #[error("tier {tier}: {source}")]
    NetProxy {
        tier: Tier,
        #[source]
        source: crate::net::helper::StartError,
    },
    #[error("tier {tier}: {what}: {source}")]
    Setup {
        tier: Tier,
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[cfg(target_os = "linux")]
    #[error("tier landlock: the run needs a cgroup v2 of its own, so that its whole process tree can be ended for certain: {source}. Run hull as root, or inside a cgroup delegated to you (systemd-run --user --scope -p Delegate=yes hull ...), or use --tier bwrap")]
    Cgroup {
        #[source]
        source: crate::exec::cgroup::CgroupError,
    },
    #[error("the command could not be run: {0}")]
    Exec(#[from] crate::exec::ExecError),
    /// A helper of the run ended while the command ran (the message names
    /// it and the tier).
    #[error(transparent)]
    HelperEnded(crate::exec::ExecError),
    #[error("tier {0} cannot run on this OS")]
    WrongOs(Tier),
    #[error("cannot copy the host's certificate authorities into the run's tmp {tmp}: {source}")]
    Trust {
        tmp: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Not a source: the one message is the cause.
    #[error("{0}. Nothing was run")]
    Net(crate::tier::NetUnsupported),
    #[error(transparent)]
    ResultFile(#[from] crate::result_file::ResultFileError),
    /// The program is not there (127) or cannot be executed (126).
    #[cfg(unix)]
    #[error(transparent)]
    NotRunnable(#[from] crate::exec::resolve::NotRunnable),
    #[cfg(target_os = "linux")]
    #[error("tier {tier}: {source}")]
    SetIdSweep {
        tier: Tier,
        #[source]
        source: crate::runtime::setid::SweepError,
    },
}

impl RunError {
    /// A program (`program`, the command's argv[0]) that is not there (127)
    /// or cannot be executed (126) in the sandbox: the exit code and hull's
    /// one-line message.
    pub fn not_runnable(&self, program: &str) -> Option<(i32, String)> {
        // Only tier 3's answer needs the name (Linux only, for now).
        #[cfg(not(target_os = "linux"))]
        let _ = program;
        #[cfg(unix)]
        if let RunError::NotRunnable(e) = self {
            return Some((e.exit_code(), e.to_string()));
        }
        let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(self);
        while let Some(e) = cur {
            #[cfg(target_os = "linux")]
            if let Some(crate::vm::agent::AgentError::NotRunnable { exit, message }) =
                e.downcast_ref()
            {
                let what = if *exit == crate::exec::resolve::EXIT_NOT_FOUND {
                    "command not found in the sandbox"
                } else {
                    "cannot be executed in the sandbox"
                };
                let program = crate::text::printable(program);
                return Some((*exit, format!("{program}: {what} (tier vm: {message})")));
            }
            // 126, as `docker exec -u` says a user it cannot find.
            #[cfg(target_os = "linux")]
            if let Some(crate::vm::agent::AgentError::UnknownUser { message }) = e.downcast_ref() {
                let program = crate::text::printable(program);
                return Some((
                    crate::exec::resolve::EXIT_NOT_EXECUTABLE,
                    format!("{program}: not run (tier vm: {message})"),
                ));
            }
            cur = e.source();
        }
        None
    }
}

/// A container image unpacked for bwrap: its tree and the ids its `User`
/// names there.
#[derive(Debug)]
pub struct ImageTree {
    pub path: PathBuf,
    pub ids: Option<(u32, u32)>,
    /// Where the sandbox sees the project; none: at its host path.
    pub project_at: Option<PathBuf>,
    /// The tree's lock, held shared until the run ends.
    _in_use: std::fs::File,
}

/// What a process tier's sandbox has beyond what its policy says.
#[derive(Debug, Clone, Copy, Default)]
pub struct Extras<'a> {
    /// `--cow`: the change set's directory; the project is an overlay.
    pub cow: Option<&'a Path>,
    /// `--session-leader`: the sandbox's own `/tmp` and `/var/tmp`.
    pub private_tmp: bool,
    /// `--image` on bwrap: the image's unpacked tree, the sandbox's `/`.
    pub image: Option<&'a ImageTree>,
}

/// The ids the image's `User` names in its tree (its own `/etc/passwd`).
#[cfg(target_os = "linux")]
fn image_ids(tree: &Path, user: &str) -> Result<(u32, u32), String> {
    let root = std::fs::File::open(tree).map_err(|e| format!("{}: {e}", tree.display()))?;
    hull_oci::resolve_user(&root, user)
}

#[cfg(not(target_os = "linux"))]
fn image_ids(_tree: &Path, _user: &str) -> Result<(u32, u32), String> {
    Err("images run on Linux only".into())
}

/// Resolves the choice to a tier that is available, or fails.
pub fn select_tier(choice: TierChoice) -> Result<(Tier, Probe), RunError> {
    match choice {
        TierChoice::Auto => {
            let os = crate::tier::Os::current().ok_or(RunError::WrongOs(Tier::Bwrap))?;
            let tier = Tier::auto_for(os);
            let p = crate::tier::ready(tier);
            if p.available {
                Ok((tier, p))
            } else {
                Err(RunError::AutoUnavailable {
                    tier,
                    reason: p.reason,
                })
            }
        }
        TierChoice::Named(tier) => {
            let p = crate::tier::ready(tier);
            if p.available {
                Ok((tier, p))
            } else {
                Err(RunError::Unavailable {
                    tier,
                    reason: p.reason,
                })
            }
        }
    }
}

/// With network, the host's certificate authorities for the command's
/// clients: a copy in `tmp`, named by their variables (`net::trust`).
#[cfg(unix)]
fn with_trust(
    mut env: Vec<(String, String)>,
    pol: &Policy,
    tmp: &Path,
) -> Result<Vec<(String, String)>, RunError> {
    if pol.net.mode != policy::NetMode::Allowlist {
        return Ok(env);
    }
    let bundle = crate::net::trust::install(tmp).map_err(|source| RunError::Trust {
        tmp: tmp.to_path_buf(),
        source,
    })?;
    if let Some(b) = bundle {
        let more = crate::net::trust::env(&b, &env);
        env.extend(more);
        env.sort();
    }
    Ok(env)
}

/// Off unix no tier has the network allow list yet.
#[cfg(not(unix))]
fn with_trust(
    env: Vec<(String, String)>,
    _pol: &Policy,
    _tmp: &Path,
) -> Result<Vec<(String, String)>, RunError> {
    Ok(env)
}

/// Runs a process-tier command (none, landlock, bwrap) to its end.
#[cfg(target_os = "linux")]
pub fn run_process_tier(
    tier: Tier,
    policy: &Policy,
    spec: &CommandSpec,
    run_dir: &Path,
    lock_fd: crate::runtime::LockFd,
    sink: Option<&mut dyn OutputSink>,
    extras: Extras<'_>,
) -> Result<ExitStatus, RunError> {
    use crate::policy::RealFs;
    let Extras {
        cow,
        private_tmp,
        image,
    } = extras;
    use crate::tier::launch::{self, ChildSetup};
    let mut setup = ChildSetup::from_limits(&policy.limits);
    setup.keep_fds.push(lock_fd);
    let mut keep_alive = Vec::new();
    // Released after the command and everything it started are gone.
    let mut placeholders = crate::runtime::placeholder::Held::default();
    // Landlock's spare entries: removed after the broker, before the
    // placeholders (a `.hull` made for them).
    let mut pools: Vec<std::sync::Arc<crate::tier::spares::Pool>> = Vec::new();
    // Answers the command's metadata calls on landlock (not root) until the
    // run ends.
    let mut broker: Option<crate::tier::broker::Broker> = None;
    // The broker's filter, installed after every other step of the child.
    let mut last_step: Option<crate::tier::broker::Handoff> = None;
    // Landlock applied by the command's own process (no helper), installed
    // after the child setup and before the broker's filter.
    let mut direct: Option<crate::tier::landlock::Direct> = None;
    // What the tier's helper says of the run once it ended: the sandbox
    // never came up, or the helper itself was killed.
    type Check = Box<dyn FnOnce(&crate::exec::ExitStatus) -> Result<(), RunError>>;
    let mut started_check: Option<Check> = None;
    let mut containment = crate::exec::process::Containment::None;
    // The policy's egress proxy (net.mode = "allowlist"), up until the
    // command and its tree are gone (the command's environment then points
    // at it).
    let mut proxy: Option<crate::net::helper::ProxyProcess> = None;
    // What the command's execve gets, whichever process performs it.
    let command_env = if policy.net.mode == crate::policy::NetMode::Allowlist {
        crate::net::with_proxy_env(&spec.env)
    } else {
        spec.env.clone()
    };
    let mut cmd = match tier {
        Tier::None => {
            eprintln!("{}", crate::tier::none::WARNING);
            setup.setsid = true;
            setup.drop_caps = true;
            let mut c = crate::tier::none::command(&spec.argv);
            c.current_dir(&spec.cwd);
            c.into()
        }
        Tier::Bwrap => {
            let masks = launch::create_masks(run_dir)?;
            use crate::policy::lower::bwrap as lower_bwrap;
            let mut plan = match image {
                Some(tree) => lower_bwrap::lower_on_image(
                    policy,
                    &RealFs,
                    &masks,
                    &spec.cwd,
                    &lower_bwrap::ImageRoot {
                        tree: &tree.path,
                        fs: &RealFs,
                        ids: tree.ids,
                        project_at: tree.project_at.as_deref(),
                    },
                ),
                None => lower_bwrap::lower(policy, &RealFs, &masks, &spec.cwd),
            }
            .map_err(|source| RunError::Lower { tier, source })?;
            // An image's sandbox has its own already.
            if private_tmp && image.is_none() {
                plan.with_private_tmp(private_tmp_size(policy));
            }
            tracing::debug!("bwrap planned");
            let wanted = placeholders_wanted(&plan.placeholders, &plan.found, |_| true);
            let runs_root = run_dir.parent().unwrap_or(run_dir);
            placeholders = crate::runtime::placeholder::hold(&wanted, runs_root)
                .map_err(|source| RunError::Placeholders { tier, source })?;
            tracing::debug!(count = wanted.len(), "placeholders held");
            // The allow list: the network namespace bwrap keeps is one hull
            // makes for the command, where the proxy's listener is the only
            // thing listening.
            let net_handoff = if policy.net.mode == crate::policy::NetMode::Allowlist {
                let (handoff, p) = start_netns_proxy(tier, policy)?;
                proxy = Some(p);
                Some(handoff)
            } else {
                None
            };
            let mut prepared = crate::tier::bwrap::command(
                &plan,
                &spec.argv,
                &command_env,
                net_handoff.is_some(),
            )?;
            if let Some(h) = net_handoff {
                // First: as root it needs CAP_SYS_ADMIN, before the switch.
                h.install(&mut prepared.command);
            }
            // Every connect goes to the broker: a read-only bind does not
            // stop one to a host service's socket under it.
            let filter = crate::tier::seccomp::build_connect_broker()
                .map(|p| crate::tier::seccomp::Raw::new(&p))
                .map_err(crate::tier::bwrap::BwrapError::from)?;
            let (b, handoff) = crate::tier::broker::Broker::with_handoff(
                crate::tier::broker::Handler::Connect(crate::tier::broker::Workers::new(
                    crate::tier::identity::hull_is_root(),
                )),
                filter,
            )
            .map_err(|source| RunError::Setup {
                tier,
                what: "starting the connect broker".into(),
                source,
            })?;
            broker = Some(b);
            last_step = Some(handoff);
            tracing::debug!("connect broker started");
            if crate::tier::identity::hull_is_root() {
                // Registered before ChildSetup's hook: the change of
                // credentials clears PDEATHSIG, which ChildSetup sets.
                let mut grants: Vec<crate::tier::identity::Grant> = plan
                    .sources
                    .iter()
                    .map(|s| crate::tier::identity::Grant {
                        path: s.path.clone(),
                        writable: s.writable,
                        // The instance's own dirs and masks are hull's.
                        own: s.writable || s.path.starts_with(run_dir),
                    })
                    .collect();
                grants.extend(cow.map(crate::tier::identity::Grant::change_set));
                let mut switch = crate::tier::identity::Switch::prepare("bwrap", &grants)?;
                if let Some(set_dir) = cow {
                    switch = switch.with_overlay(&spec.cwd, set_dir)?;
                }
                install_switch(&mut prepared.command, switch);
            } else if let Some(set_dir) = cow {
                let overlay = crate::tier::cow::UserOverlay::prepare("bwrap", &spec.cwd, set_dir)?;
                // SAFETY: `apply_in_child` makes raw, async-signal-safe
                // system calls only, on memory prepared before the fork.
                unsafe {
                    crate::exec::spawn::PreExec::pre_exec_step(
                        &mut prepared.command,
                        Box::new(move || overlay.apply_in_child()),
                    );
                }
            }
            for fd in &prepared.keep {
                setup.keep_fds.push(std::os::fd::AsRawFd::as_raw_fd(fd));
            }
            keep_alive.extend(prepared.keep);
            let status = prepared.status;
            started_check = Some(Box::new(move |exit| {
                crate::tier::bwrap::check_started(status, exit).map_err(RunError::from)
            }));
            containment = crate::exec::process::Containment::PidNamespace;
            prepared.command.into()
        }
        Tier::Landlock => {
            // `--cow`: the project's protections and narrower grants are
            // covered by mounts over the overlay (`cow_covers`), so the
            // Landlock plan grants the project whole, with no split.
            let covers = cow.map(|_| cow_covers(policy, &spec.cwd));
            let cow_policy = covers.as_ref().map(|_| without_inside(policy, &spec.cwd));
            let plan = crate::policy::lower::landlock::lower(
                cow_policy.as_ref().unwrap_or(policy),
                &RealFs,
            )
            .map_err(|source| RunError::Lower { tier, source })?;
            // Entries created directly in a split directory come from a
            // pool of spares the broker renames into place; where no pool
            // can be made, the user is told before the run (never a silent
            // "Permission denied" in the middle of a build; `-q` leaves the
            // command's stderr to itself).
            tracing::debug!("landlock planned");
            let served = crate::tier::spares::serve(policy, &plan.closed, run_dir);
            tracing::debug!("spares ready");
            for (c, why) in &served.unserved {
                tracing::warn!("{} (no spare entries: {why})", c.warning());
            }
            let spare_pools = served.pools();
            let splits = served
                .served
                .iter()
                .map(|(c, pool)| {
                    crate::tier::broker::Split::open(
                        &c.dir,
                        c.around.clone(),
                        std::sync::Arc::clone(pool),
                    )
                    .map_err(|source| RunError::Setup {
                        tier,
                        what: format!("opening {}", c.dir.display()),
                        source,
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            let creates = (!splits.is_empty())
                .then(|| std::sync::Arc::new(crate::tier::broker::Creates::new(splits)));
            pools = served.served.into_iter().map(|(_, p)| p).collect();
            placeholders = served.placeholders;
            // Landlock does not mediate inotify watches, nor metadata: a
            // watch goes to the broker, which allows it inside the grants,
            // and so do chmod, chown, utimes and xattrs, allowed inside the
            // writable roots only, outside every protection (the command
            // owns the caller's files everywhere when hull is not root, and
            // everything in the idmapped writable roots when it is).
            let as_command = crate::tier::identity::hull_is_root();
            // A session's own /tmp and /var/tmp (hull is root; as a user
            // its /tmp is still the host's): made now, so the broker knows
            // their files as the command's own.
            let private = crate::tier::identity::private_tmp(
                "landlock",
                &private_tmp_dirs(private_tmp && as_command, policy),
            )?;
            // As a user, the same directories of a session's own from a
            // helper's user namespace (`tier::user_scratch`); not for a
            // copy-on-write session, whose overlay has a user namespace of
            // its own.
            let user_dirs = private_tmp_dirs(private_tmp && !as_command && cow.is_none(), policy);
            let user_scratch = match user_dirs.is_empty() {
                true => None,
                false => {
                    let below: Vec<PathBuf> = policy
                        .grants
                        .iter()
                        .filter(|g| !hidden_grant(policy, g))
                        .filter(|g| user_dirs.iter().any(|(d, _)| strictly_inside(&g.path, d)))
                        .filter(|g| g.path.symlink_metadata().is_ok())
                        .map(|g| g.path.clone())
                        .collect();
                    Some(crate::tier::user_scratch::UserScratch::prepare(
                        "landlock", &user_dirs, &below, &spec.cwd,
                    )?)
                }
            };
            let own: Vec<u64> = private
                .iter()
                .map(|p| p.dev)
                .chain(user_scratch.iter().flat_map(|u| u.devices()))
                .collect();
            let handler = crate::tier::broker::Handler::Landlock {
                watch: crate::tier::broker::Scope::visible(policy).with_own_devices(&own),
                metadata: crate::tier::broker::Scope::of(policy).with_own_devices(&own),
                // Unix sockets the command may connect to (where the filter
                // brokers them): in the writable roots, as metadata.
                connect: crate::tier::broker::Scope::of(policy).with_own_devices(&own),
                workers: crate::tier::broker::Workers::new(as_command),
                creates,
            };
            let broker_err = |source| RunError::Setup {
                tier,
                what: "starting the broker".into(),
                source,
            };
            // The allow list: a network namespace of the command's own,
            // where the proxy's listener is the only thing listening.
            let mut net_handoff = None;
            let proxy_port = if policy.net.mode == crate::policy::NetMode::Allowlist {
                let (handoff, p) = start_netns_proxy(tier, policy)?;
                proxy = Some(p);
                net_handoff = Some(handoff);
                Some(crate::net::netns::PORT)
            } else {
                None
            };
            let mut request = crate::tier::landlock::Request {
                plan: &plan,
                limits: &policy.limits,
                argv: &spec.argv,
                env: &command_env,
                broker_fd: None,
                pools: &spare_pools,
                proxy_port,
                in_child: cow.map(|_| spec.cwd.as_path()),
            };
            // Restricted in the command's own process (no helper executed)
            // where no rule waits for the helper's mounts (`--cow`).
            let direct_prepared = crate::tier::landlock::Direct::prepare(&request)?;
            tracing::debug!("rules bound");
            // The ruleset, for the rules of a session's own /tmp and
            // terminals (mounted in the child, detached until then).
            let rules;
            let (program, args, search) = match direct_prepared {
                Some(d) => {
                    rules = d.rules()?;
                    let filter = crate::tier::seccomp::build_broker(
                        true,
                        !spare_pools.is_empty(),
                        d.unix_brokered(),
                    )
                    .map(|p| crate::tier::seccomp::Raw::new(&p))
                    .map_err(crate::tier::landlock::LandlockError::from)?;
                    let (b, handoff) = crate::tier::broker::Broker::with_handoff(handler, filter)
                        .map_err(broker_err)?;
                    broker = Some(b);
                    last_step = Some(handoff);
                    direct = Some(d);
                    setup.setsid = true;
                    setup.drop_caps = true;
                    let search = crate::exec::spawn::search_paths(&spec.argv[0], &command_env);
                    (spec.argv[0].clone(), spec.argv[1..].to_vec(), Some(search))
                }
                None => {
                    let (ours, theirs) =
                        crate::exec::fds::descriptor_pair().map_err(|source| RunError::Setup {
                            tier,
                            what: "the broker's socket".into(),
                            source,
                        })?;
                    broker = Some(
                        crate::tier::broker::Broker::start(ours, handler).map_err(broker_err)?,
                    );
                    let raw = std::os::fd::AsRawFd::as_raw_fd(&theirs);
                    setup.keep_fds.push(raw);
                    keep_alive.push(theirs);
                    request.broker_fd = Some(raw);
                    let prepared = crate::tier::landlock::command(&request)?;
                    rules = prepared.rules;
                    setup
                        .keep_fds
                        .push(std::os::fd::AsRawFd::as_raw_fd(&prepared.error_w));
                    keep_alive.push(prepared.error_w);
                    keep_alive.push(prepared.exe);
                    for fd in prepared.inherit {
                        setup.keep_fds.push(std::os::fd::AsRawFd::as_raw_fd(&fd));
                        keep_alive.push(fd);
                    }
                    let err_r = prepared.error_r;
                    started_check = Some(Box::new(move |_| {
                        crate::tier::landlock::check_started(err_r).map_err(RunError::from)
                    }));
                    let mut argv = prepared.argv;
                    let args = argv.split_off(1);
                    (argv.remove(0), args, None)
                }
            };
            // The tree in a cgroup of its own: ended by cgroup.kill, which
            // a process changing its pid in a loop cannot outrun. The
            // command (or its helper) is born inside it (see exec::spawn).
            let id = run_dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let cgroup = crate::exec::cgroup::RunCgroup::create(&id)
                .map_err(|source| RunError::Cgroup { source })?;
            tracing::debug!("cgroup made");
            let mut c =
                crate::exec::spawn::CgroupCommand::new(program, &cgroup).map_err(|source| {
                    RunError::Setup {
                        tier,
                        what: format!("opening the run's cgroup {}", cgroup.dir().display()),
                        source,
                    }
                })?;
            c.args(args);
            if let Some(paths) = search {
                c.search(paths);
            }
            if let Some(scratch) = user_scratch {
                // First of the child's steps: the network namespace below
                // is then made in the session's user namespace.
                let dirs: Vec<PathBuf> = user_dirs.iter().map(|(d, _)| d.clone()).collect();
                let plan = crate::policy::lower::plan::plan(policy, &RealFs)
                    .map_err(|source| RunError::Lower { tier, source })?;
                let wanted = placeholders_wanted(&plan.placeholders, &plan.found, |p| {
                    dirs.iter().any(|d| p.starts_with(d))
                });
                let runs_root = run_dir.parent().unwrap_or(run_dir);
                let held = crate::runtime::placeholder::hold(&wanted, runs_root)
                    .map_err(|source| RunError::Placeholders { tier, source })?;
                placeholders.absorb(held);
                let below =
                    private_tmp_covers(policy, &dirs, run_dir, crate::tier::cow::Detach::InChild)?;
                let scratch = scratch.with_covers(below);
                for root in scratch.roots() {
                    rules.allow_writable_dir(root, "the session's own /tmp")?;
                }
                rules.allow_pty(scratch.pts_root())?;
                // SAFETY: `apply_in_child` makes raw, async-signal-safe
                // system calls only, on memory prepared before the fork.
                unsafe {
                    crate::exec::spawn::PreExec::pre_exec_step(
                        &mut c,
                        Box::new(move || scratch.apply_in_child()),
                    );
                }
            }
            if let Some(h) = net_handoff {
                // First: as root it needs CAP_SYS_ADMIN, before the switch.
                h.install(&mut c);
            }
            containment = crate::exec::process::Containment::Cgroup(cgroup);
            c.current_dir(&spec.cwd);
            if crate::tier::identity::hull_is_root() {
                // As for bwrap: the helper that applies Landlock and execs
                // the command runs as the sandbox user already.
                let mut grants: Vec<crate::tier::identity::Grant> = policy
                    .grants
                    .iter()
                    // Below a session's own /tmp a grant is there only if
                    // mounted: one the plan hides is not.
                    .filter(|g| private.is_empty() || !hidden_grant(policy, g))
                    .map(|g| crate::tier::identity::Grant {
                        path: g.path.clone(),
                        writable: g.access == crate::policy::Access::ReadWrite,
                        own: g.access == crate::policy::Access::ReadWrite
                            || !matches!(
                                g.origin,
                                crate::policy::GrantOrigin::Policy
                                    | crate::policy::GrantOrigin::Agent
                            ),
                    })
                    .collect();
                grants.extend(cow.map(crate::tier::identity::Grant::change_set));
                let dirs: Vec<PathBuf> = private.iter().map(|p| p.path.clone()).collect();
                if !dirs.is_empty() {
                    // Below the session's own /tmp nothing stops a create
                    // but a mount: a protected path that is not there yet
                    // (a project's .git) gets hull's placeholder, as on
                    // bwrap, and is covered with the rest.
                    let plan = crate::policy::lower::plan::plan(policy, &RealFs)
                        .map_err(|source| RunError::Lower { tier, source })?;
                    let wanted = placeholders_wanted(&plan.placeholders, &plan.found, |p| {
                        dirs.iter().any(|d| p.starts_with(d))
                    });
                    let runs_root = run_dir.parent().unwrap_or(run_dir);
                    let held = crate::runtime::placeholder::hold(&wanted, runs_root)
                        .map_err(|source| RunError::Placeholders { tier, source })?;
                    placeholders.absorb(held);
                }
                let mut switch = crate::tier::identity::Switch::prepare_with_private(
                    "landlock", &grants, private,
                )?;
                if !dirs.is_empty() {
                    // The rule that lets the command write its own /tmp
                    // lets it write all that is mounted below: what it may
                    // not write there is covered by read-only mounts.
                    let below =
                        private_tmp_covers(policy, &dirs, run_dir, crate::tier::cow::Detach::Now)?;
                    switch = switch.with_private_covers(below);
                    for root in switch.private_roots() {
                        rules.allow_writable_dir(root, "the session's own /tmp")?;
                    }
                    // Terminals of its own: a session's shell tools open a
                    // pseudo-terminal (bwrap's --dev gives one too).
                    switch = switch.with_private_pts()?;
                    if let Some(pts) = switch.pts_root() {
                        rules.allow_pty(pts)?;
                    }
                }
                if let (Some(set_dir), Some(covers)) = (cow, &covers) {
                    let masks = launch::create_masks(run_dir)?;
                    switch = switch.with_overlay(&spec.cwd, set_dir)?.with_cow_masks(
                        &spec.cwd,
                        covers,
                        &masks.empty_dir,
                        &masks.empty_file,
                    )?;
                }
                install_switch(&mut c, switch.with_cwd(&spec.cwd)?);
            } else if let (Some(set_dir), Some(covers)) = (cow, &covers) {
                // As a user: the overlay and its covers in a user namespace
                // of the run's own (`tier::cow`), made before the helper,
                // whose rules then attach to the overlay.
                let masks = launch::create_masks(run_dir)?;
                let covers = crate::tier::cow::Covers::prepare(
                    "landlock",
                    &spec.cwd,
                    covers,
                    &masks.empty_dir,
                    &masks.empty_file,
                    crate::tier::cow::Detach::InChild,
                )?;
                let step = crate::tier::cow::UserOverlay::prepare("landlock", &spec.cwd, set_dir)?
                    .with_covers(covers)
                    .with_cwd("landlock", &spec.cwd)?;
                // SAFETY: `apply_in_child` makes raw, async-signal-safe
                // system calls only, on memory prepared before the fork.
                unsafe {
                    crate::exec::spawn::PreExec::pre_exec_step(
                        &mut c,
                        Box::new(move || step.apply_in_child()),
                    );
                }
            }
            crate::exec::process::Launch::IntoCgroup(c)
        }
        Tier::Vm | Tier::Seatbelt | Tier::Restricted | Tier::AppContainer => {
            return Err(RunError::WrongOs(tier))
        }
    };
    // The command's environment reaches the command only: under none it is
    // the program executed; bwrap and the Landlock helper carry it to the
    // command's own execve and start from hull's.
    match tier {
        Tier::None => cmd.set_env(&command_env),
        Tier::Landlock if direct.is_some() => cmd.set_env(&command_env),
        _ => cmd.set_env(&crate::exec::helper_env()),
    }
    setup.install(&mut cmd);
    let direct_failure = direct.map(|d| d.install(&mut cmd));
    if let Some(step) = last_step {
        step.install(&mut cmd);
    }
    tracing::debug!(%tier, "command built");
    let helpers = match &proxy {
        Some(p) => vec![p.watch().map_err(|source| RunError::Setup {
            tier,
            what: "watching the network proxy".into(),
            source,
        })?],
        None => Vec::new(),
    };
    let status =
        crate::exec::process::run(cmd, spec.timeout, sink, containment, keep_alive, helpers);
    tracing::debug!(?status, "command ended");
    if let Some(p) = proxy.take() {
        // It prints one line per refused host as it ends.
        p.finish(std::time::Duration::from_secs(2));
    }
    let status = status.map_err(|e| match e {
        e @ crate::exec::ExecError::HelperEnded { .. } => RunError::HelperEnded(e),
        crate::exec::ExecError::Spawn { program, source } => {
            match direct_failure.and_then(|f| f.of(&source)) {
                Some(e) => RunError::Landlock(e),
                None => RunError::Exec(crate::exec::ExecError::Spawn { program, source }),
            }
        }
        e => RunError::Exec(e),
    })?;
    drop(broker);
    drop(pools);
    for problem in placeholders.release() {
        eprintln!("hull: warning: tier {tier}: {problem} (left in place)");
    }
    if let Some(check) = started_check {
        // A sandbox that could not be set up is hull's failure, not the
        // command's exit code: report it as such (exit 125).
        check(&status)?;
    }
    Ok(status)
}

/// Starts the policy's proxy for a command in a network namespace of its
/// own: the handoff makes the namespace and the listener in the child
/// (install it before the sandbox-user switch); the proxy, a process of its
/// own (`net::helper`, the sandbox user when hull is root), accepts on it
/// and audits into the spill.
#[cfg(target_os = "linux")]
fn start_netns_proxy(
    tier: Tier,
    policy: &Policy,
) -> Result<(crate::net::netns::Handoff, crate::net::helper::ProxyProcess), RunError> {
    let root = crate::tier::identity::hull_is_root();
    let (handoff, arrival) =
        crate::net::netns::prepare(!root).map_err(|source| RunError::Setup {
            tier,
            what: "the socket for the proxy's listener".into(),
            source,
        })?;
    let proxy = crate::net::helper::start_for_run(
        &format!("tier {tier}"),
        &policy.net,
        &policy.vars.spill,
        crate::net::helper::Input::Arrival(arrival.0),
    )
    .map_err(|source| RunError::NetProxy { tier, source })?;
    Ok((handoff, proxy))
}

/// Runs the switch to the sandbox user in the child before exec; the
/// switch (and the user namespaces it holds) lives as long as the command.
#[cfg(target_os = "linux")]
fn install_switch(
    cmd: &mut impl crate::exec::spawn::PreExec,
    switch: crate::tier::identity::Switch,
) {
    // SAFETY: `apply_in_child` makes raw, async-signal-safe system calls
    // only, on memory prepared before the fork.
    unsafe {
        cmd.pre_exec_step(Box::new(move || switch.apply_in_child()));
    }
}

/// Off Linux the process tiers are the native ones: seatbelt on macOS,
/// restricted and appcontainer on Windows, and none everywhere.
#[cfg(not(target_os = "linux"))]
pub fn run_process_tier(
    tier: Tier,
    policy: &Policy,
    spec: &CommandSpec,
    _run_dir: &Path,
    _lock_fd: crate::runtime::LockFd,
    sink: Option<&mut dyn OutputSink>,
    _extras: Extras<'_>,
) -> Result<ExitStatus, RunError> {
    let mut cmd = match tier {
        Tier::None => {
            eprintln!("{}", crate::tier::none::WARNING);
            let mut c = crate::tier::none::command(&spec.argv);
            c.current_dir(&spec.cwd)
                .env_clear()
                .envs(spec.env.iter().cloned());
            c
        }
        Tier::Seatbelt => crate::tier::seatbelt::launch(policy, spec)?,
        Tier::AppContainer => crate::tier::windows::launch_appcontainer(policy, spec)?,
        Tier::Restricted => crate::tier::windows::launch_restricted(policy, spec)?,
        Tier::Landlock | Tier::Bwrap | Tier::Vm => return Err(RunError::WrongOs(tier)),
    };
    let _ = &mut cmd;
    Ok(crate::exec::portable::run(cmd, spec.timeout, sink)?)
}

/// Runs `opts` to the end and returns how the command ended.
/// What a run that hull saw to its end reports.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    pub status: ExitStatus,
    pub tier: Tier,
    pub instance: String,
    pub spill: PathBuf,
    /// `--cow`: the ID of the change set the run's writes were kept as.
    pub changes: Option<String>,
    /// What the run took, where the tier can tell.
    pub usage: crate::result_file::Usage,
    /// The wall-time limit the run had (`--timeout` or the policy's).
    pub timeout: Option<std::time::Duration>,
}

/// Runs the command. `result_file` (`--json-result`) is refused when it
/// lies inside a writable root of the policy, before anything runs.
pub fn execute(
    opts: RunOptions,
    result_file: Option<&crate::result_file::ResultFile>,
) -> Result<RunOutcome, RunError> {
    let (tier, _probe) = select_tier(opts.tier)?;
    tracing::debug!(%tier, "tier ready");
    if let Some(why) = opts.cow.then(|| cow_refused(tier)).flatten() {
        return Err(RunError::CowRefused { tier, why });
    }
    if let (Some(user), false) = (&opts.user, tier == Tier::Vm) {
        return Err(RunError::UserRefused {
            tier,
            user: user.clone(),
        });
    }
    if let (Some(image), false) = (&opts.image, matches!(tier, Tier::Vm | Tier::Bwrap)) {
        return Err(RunError::ImageRefused {
            tier,
            image: image.clone(),
        });
    }
    let leader = opts
        .session_leader
        .then(|| leader_agent(tier))
        .transpose()?;
    let runs = crate::runtime::runs_root();
    let project = project_path(&opts.project, &runs)?;
    let pf = policy::profiles::load(&opts.policy)?;
    // A network part the tier cannot enforce as written refuses the run
    // before anything is made.
    let net = pf.net_policy()?;
    tier.network(&net).map_err(RunError::Net)?;
    let instance = match &opts.instance {
        Some(id) => id
            .parse::<crate::runtime::InstanceId>()
            .map_err(RunError::from)
            .and_then(|id| Ok(crate::runtime::Instance::join(&runs, id)?)),
        None => Ok(crate::runtime::Instance::create(&runs)?),
    }?;
    // Opportunistic cleanup of dead instances (at most every few minutes).
    if let Err(e) = crate::runtime::gc_if_due(instance.runs_root(), &crate::tier::reclaim_stale_run)
    {
        tracing::warn!("cleaning old instances: {e}");
    }
    // Until the command starts, an error finishes the instance first (its
    // scratch removed), as the end of a run does.
    // `--image` on bwrap: the image's tree, the sandbox's `/`.
    let mut image_tree: Option<ImageTree> = None;
    let prepared = (|| -> Result<_, RunError> {
        let vars = instance.vars(&project, &home_dir());
        let (mut pol, repos_before) = resolve_policy(&pf, &vars)?;
        if let Some(image) = &opts.image {
            // The image is the whole userland: the policy's own is not used.
            pol.vm = policy::VmPolicy {
                image: Some(image.clone()),
                project_at: pol.vm.project_at.clone(),
                ..policy::VmPolicy::default()
            };
        }
        if let Some(agent) = &leader {
            pol.grants.push(policy::Grant {
                path: agent.clone(),
                access: policy::Access::ReadExec,
                origin: policy::GrantOrigin::Agent,
            });
        }
        if let Some(f) = result_file {
            f.check_outside(pol.writable_roots().map(|g| g.path.as_path()))?;
        }
        // A registry's image is pulled now, through the policy's network
        // (its registry must be allowed there), and named by its digest
        // from here on.
        // The resolved network: `registry:NAME` entries are hosts by now.
        let bwrap_image = match (&opts.image, tier) {
            (Some(r), Tier::Bwrap) => Some(crate::tier::vm::pull_image(r, &pol.net)?),
            _ => None,
        };
        if let (Some(r), Tier::Vm) = (pol.vm.image.clone(), tier) {
            pol.vm.image = Some(crate::tier::vm::pull_image(&r, &pol.net)?);
        }
        // A container image's config on tier 3: its environment (the
        // policy's `env.set`, the caller's and hull's own win), its user
        // (unless the run names one) and its command (when none is given).
        let image = match (&pol.vm.image, tier) {
            (Some(r), Tier::Vm) => Some(crate::tier::vm::image_defaults(r)?),
            _ => match (&bwrap_image, tier) {
                (Some(r), Tier::Bwrap) => {
                    let crate::tier::vm::BwrapImage {
                        defaults,
                        tree,
                        in_use,
                    } = crate::tier::vm::image_on_bwrap(r)?;
                    // Either way round: a project inside the cache's trees
                    // would write one of them as well.
                    let trees = tree.parent().unwrap_or(&tree);
                    if let Some(g) = pol
                        .writable_roots()
                        .find(|g| tree.starts_with(&g.path) || g.path.starts_with(trees))
                    {
                        return Err(RunError::ImageCacheWritable {
                            tier,
                            tree,
                            root: g.path.clone(),
                        });
                    }
                    // The image's `User`: the ids bwrap maps the caller's
                    // (the sandbox user's when hull is root) to.
                    let ids =
                        match &defaults.user_raw {
                            None => None,
                            Some(u) => Some(image_ids(&tree, u).map_err(|why| {
                                RunError::ImageUserUnknown {
                                    tier,
                                    image: r.clone(),
                                    why,
                                }
                            })?),
                        };
                    image_tree = Some(ImageTree {
                        path: tree,
                        ids,
                        // Set below, with tier 3's.
                        project_at: None,
                        _in_use: in_use,
                    });
                    Some(defaults)
                }
                _ => None,
            },
        };
        // Where the container (or bwrap's sandbox) sees the project, now
        // that the image's config is known: its `WorkingDir` unless the
        // policy names one. A kept VM (a session's) has its shares from
        // `hull vm up`, which reads no image config, and a session's API
        // names the host's paths: the host's path there.
        if pol.vm.project_at == policy::ProjectAt::Image {
            pol.vm.project_at = match image.as_ref().and_then(|d| d.working_dir.clone()) {
                Some(dir) if opts.vm.is_none() && !opts.session_leader => {
                    policy::ProjectAt::Path(dir)
                }
                _ => policy::ProjectAt::Host,
            };
        }
        if let Some(t) = &mut image_tree {
            t.project_at = match &pol.vm.project_at {
                policy::ProjectAt::Path(p) if !opts.session_leader => Some(p.clone()),
                _ => None,
            };
        }
        let mut env = command_env(&pol, &opts.env, instance.child_env());
        if let Some(d) = &image {
            let wins = |k: &str| {
                pol.env.set.contains_key(k)
                    || opts.env.iter().any(|(o, _)| o == k)
                    || instance.child_env().iter().any(|(o, _)| o == k)
            };
            for (k, v) in &d.env {
                if !wins(k) {
                    env.retain(|(x, _)| x != k);
                    env.push((k.clone(), v.clone()));
                }
            }
            env.sort();
        }
        let env = with_trust(env, &pol, instance.tmp())?;
        tracing::debug!(instance = %instance.id(), "policy resolved");
        let timeout = opts.timeout.or(pol.limits.wall_time);
        let spec = match &leader {
            // The leader lives until its session ends; the limit is each
            // exec's.
            Some(agent) => CommandSpec {
                argv: leader_argv(agent, timeout),
                cwd: project.clone(),
                env,
                timeout: None,
                user: None,
            },
            None => CommandSpec {
                argv: match (&image, opts.argv.is_empty()) {
                    (Some(d), true) if d.argv.is_empty() => {
                        return Err(crate::tier::vm::VmTierError::ImageNoCommand {
                            image: pol.vm.image.clone().unwrap_or_default(),
                        }
                        .into())
                    }
                    (Some(d), true) => d.argv.iter().map(OsString::from).collect(),
                    _ => opts.argv.clone(),
                },
                cwd: project.clone(),
                env,
                timeout,
                user: opts
                    .user
                    .clone()
                    .or_else(|| image.as_ref().and_then(|d| d.user.clone())),
            },
        };
        if image_tree.is_none() {
            // On an image the program is the image's, found in the sandbox.
            check_runnable(tier, &pol, &spec)?;
        }
        let spill_sink = opts
            .spill
            .map(|threshold| crate::runtime::spill::SpillSink::stdio(instance.spill(), threshold))
            .transpose()?;
        #[cfg(target_os = "linux")]
        let cow = if opts.cow {
            let c = start_cow(
                tier,
                &pol,
                &spec,
                opts.cow_continue.as_deref(),
                leader.is_some(),
            )?;
            if let Some(to) = &opts.changes_id_to {
                use std::io::Write;
                (&**to)
                    .write_all(format!("{}\n", c.set.meta.id).as_bytes())
                    .map_err(RunError::ChangesId)?;
            }
            Some(c)
        } else {
            None
        };
        #[cfg(not(target_os = "linux"))]
        let cow = ();
        Ok((pol, repos_before, spec, spill_sink, cow))
    })();
    let (pol, repos_before, spec, mut spill_sink, cow) = match prepared {
        Ok(p) => p,
        Err(e) => {
            if let Err(f) = instance.finish() {
                tracing::warn!("cleaning up the instance: {f}");
            }
            return Err(e);
        }
    };
    #[cfg(target_os = "linux")]
    let mut cow = cow;
    #[cfg(not(target_os = "linux"))]
    let () = cow;
    let sink: Option<&mut dyn OutputSink> = spill_sink.as_mut().map(|s| s as &mut dyn OutputSink);
    #[cfg(target_os = "linux")]
    let cow_dir = cow.as_ref().map(|c| c.set.dir.clone());
    #[cfg(not(target_os = "linux"))]
    let cow_dir: Option<PathBuf> = None;
    #[cfg(target_os = "linux")]
    let cow_layers = cow.as_ref().map(|c| c.set.layers().dir);
    #[cfg(not(target_os = "linux"))]
    let cow_layers: Option<PathBuf> = None;
    let started = std::time::SystemTime::now();
    let mut usage = crate::result_file::Usage::default();
    let result = match tier {
        Tier::Vm => crate::tier::vm::run(
            &pol,
            &spec,
            instance.dir(),
            &instance.id().to_string(),
            sink,
            opts.vm.as_deref().map(|name| crate::tier::vm::KeptVm {
                name,
                turn_fd: opts.vm_turn_fd,
            }),
            cow_layers.as_deref(),
        )
        .map(|r| {
            usage.restore_s = r.restore_s;
            usage.peak_memory_bytes = r.peak_memory_bytes;
            r.status
        })
        .map_err(RunError::from),
        Tier::None
        | Tier::Landlock
        | Tier::Bwrap
        | Tier::Seatbelt
        | Tier::Restricted
        | Tier::AppContainer => run_process_tier(
            tier,
            &pol,
            &spec,
            instance.dir(),
            instance.lock_raw_fd(),
            sink,
            Extras {
                cow: cow_dir.as_deref(),
                private_tmp: opts.session_leader,
                image: image_tree.as_ref(),
            },
        ),
    };
    // The host sees only QEMU on tier 3: the guest tells that tier's.
    #[cfg(unix)]
    if tier != Tier::Vm {
        usage.peak_rss_bytes = crate::exec::process::peak_rss_of_children();
    }
    // Second layer behind seccomp: no set-id file of the command's is left
    // for the host, also when the command's own status is an error.
    #[cfg(target_os = "linux")]
    let cow_upper = cow.as_ref().map(|c| c.set.upper());
    #[cfg(not(target_os = "linux"))]
    let cow_upper: Option<PathBuf> = None;
    let swept = sweep_setid(tier, &pol, started, cow_upper.as_deref());
    tracing::debug!("set-id files swept");
    report_new_repositories(tier, &pol, &repos_before);
    let (instance_id, spill) = (instance.id().to_string(), instance.spill().to_path_buf());
    if let Err(e) = instance.finish() {
        tracing::warn!("cleaning up the instance: {e}");
    }
    tracing::debug!("instance finished");
    // What the command wrote is kept whatever its status: the upper
    // layer is read once, now, and the set's ID said.
    #[cfg(target_os = "linux")]
    let changes = match cow.as_mut() {
        Some(CowRun { set, baseline, .. }) => {
            set.finish(baseline)?;
            eprintln!(
                "hull: changes kept as {id}; review with 'hull changes show {id}'",
                id = set.meta.id
            );
            Some(set.meta.id.clone())
        }
        None => None,
    };
    #[cfg(not(target_os = "linux"))]
    let changes = None;
    let status = result?;
    swept?;
    Ok(RunOutcome {
        status,
        tier,
        instance: instance_id,
        spill,
        changes,
        usage,
        timeout: spec.timeout,
    })
}

/// How large a session's own `/tmp` and `/var/tmp` may grow: as large as
/// the command may (tmpfs pages are its memory), 1 GiB where the policy
/// sets no limit.
#[cfg(target_os = "linux")]
fn private_tmp_size(policy: &Policy) -> u64 {
    policy.limits.memory.unwrap_or(1 << 30)
}

/// A session's own scratch directories on landlock, when hull is root
/// (as a user its `/tmp` is still the host's), with their size.
#[cfg(target_os = "linux")]
fn private_tmp_dirs(private_tmp: bool, policy: &Policy) -> Vec<(PathBuf, u64)> {
    if !private_tmp {
        return Vec::new();
    }
    crate::policy::lower::bwrap::PRIVATE_TMP
        .iter()
        .map(|d| (PathBuf::from(d), private_tmp_size(policy)))
        .collect()
}

/// The placeholders a plan needs (`missing`, to be made) and saw
/// (`found`), those whose path `keep` takes, as the registry holds them.
#[cfg(target_os = "linux")]
fn placeholders_wanted(
    missing: &[crate::policy::lower::plan::Placeholder],
    found: &[crate::policy::lower::plan::Placeholder],
    keep: impl Fn(&Path) -> bool,
) -> Vec<crate::runtime::placeholder::Wanted> {
    let seen = |ps: &[crate::policy::lower::plan::Placeholder], seen: bool| {
        ps.iter()
            .filter(|p| keep(&p.path))
            .map(|p| crate::runtime::placeholder::Wanted {
                path: p.path.clone(),
                root: p.root.clone(),
                dir: p.dir,
                seen,
            })
            .collect::<Vec<_>>()
    };
    let mut wanted = seen(missing, false);
    wanted.extend(seen(found, true));
    wanted
}

/// A grant of the policy's own that lies in a hidden protection: the
/// plan drops it.
#[cfg(target_os = "linux")]
fn hidden_grant(policy: &Policy, g: &crate::policy::Grant) -> bool {
    g.origin == crate::policy::GrantOrigin::Policy
        && policy.protects.iter().any(|p| {
            p.protection == crate::policy::Protection::Hidden && g.path.starts_with(&p.path)
        })
}

/// The covers of each of a session's own scratch directories `dirs`
/// ([`private_covers`]), their empty trees detached as `detach` says.
#[cfg(target_os = "linux")]
fn private_tmp_covers(
    policy: &Policy,
    dirs: &[PathBuf],
    run_dir: &Path,
    detach: crate::tier::cow::Detach,
) -> Result<Vec<crate::tier::cow::Covers>, RunError> {
    let masks = crate::tier::launch::create_masks(run_dir)?;
    let mut below = Vec::new();
    for dir in dirs {
        let covers = private_covers(policy, dir);
        tracing::debug!(dir = %dir.display(), ?covers, "a session's own tmp");
        below.push(crate::tier::cow::Covers::prepare(
            "landlock",
            dir,
            &covers,
            &masks.empty_dir,
            &masks.empty_file,
            detach,
        )?);
    }
    Ok(below)
}

/// What must be covered by mounts below a session's own scratch directory
/// `dir` on landlock, where the Landlock rule for the tmpfs lets the
/// command write everything mounted below it: each protection inside a
/// grant mounted there (`.git`, `.hull` of a project in `/tmp`), and each
/// such grant the command may not write (the spill, hull's agent, a
/// read-only grant, one inside a read-only protection). A protection that
/// lies in no grant covers only mount points of the tmpfs: nothing of the
/// host is there to hide.
#[cfg(target_os = "linux")]
fn private_covers(policy: &Policy, dir: &Path) -> Vec<(PathBuf, crate::tier::cow::Cover)> {
    use crate::policy::{Access, Protection};
    use crate::tier::cow::Cover;
    let mounted: Vec<&crate::policy::Grant> = policy
        .grants
        .iter()
        .filter(|g| strictly_inside(&g.path, dir) && !hidden_grant(policy, g))
        .collect();
    let mut covers: Vec<(PathBuf, Cover)> = policy
        .protects
        .iter()
        .filter(|p| mounted.iter().any(|g| p.path.starts_with(&g.path)))
        .map(|p| {
            let cover = match p.protection {
                Protection::Hidden => Cover::Hide,
                Protection::ReadOnly => Cover::ReadOnly,
            };
            (p.path.clone(), cover)
        })
        .collect();
    for g in &mounted {
        let read_only = g.access != Access::ReadWrite
            || policy
                .protects
                .iter()
                .any(|p| p.protection == Protection::ReadOnly && g.path.starts_with(&p.path));
        if read_only && !covers.iter().any(|(p, _)| p == &g.path) {
            covers.push((g.path.clone(), Cover::ReadOnly));
        }
    }
    covers
}

/// The agent a session's leader runs (`--session-leader`): hull's own
/// `hull-agent`, a regular executable file, by its real path (the path the
/// sandbox grants, read and execute only).
fn leader_agent(tier: Tier) -> Result<PathBuf, RunError> {
    if !matches!(tier, Tier::Landlock | Tier::Bwrap) {
        return Err(RunError::LeaderTier(tier));
    }
    let bad = |path: &Path, why: String| RunError::LeaderAgent {
        tier,
        path: path.to_path_buf(),
        why,
    };
    let path = crate::vm::image::default_agent_path()
        .map_err(|e| bad(Path::new("hull-agent"), e.to_string()))?;
    let real = std::fs::canonicalize(&path).map_err(|e| bad(&path, e.to_string()))?;
    let meta = std::fs::metadata(&real).map_err(|e| bad(&real, e.to_string()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
            return Err(bad(&real, "not an executable file".into()));
        }
    }
    #[cfg(not(unix))]
    let _ = meta;
    Ok(real)
}

/// The leader's command line: the agent serving on stdin and stdout, every
/// exec starting from the command's environment, each limited to the
/// run's time limit unless it names its own, what an exec leaves running
/// kept until the session ends.
fn leader_argv(agent: &Path, timeout: Option<Duration>) -> Vec<OsString> {
    let mut argv: Vec<OsString> = vec![
        agent.into(),
        "serve".into(),
        "--stdio".into(),
        "--inherit-env".into(),
        "--keep-leftovers".into(),
    ];
    if let Some(t) = timeout {
        argv.push("--default-timeout-ms".into());
        argv.push(t.as_millis().to_string().into());
    }
    argv
}

/// `--cow` on landlock: what covers each protection of the policy inside
/// `project`, and each narrower grant there (read-only onto itself).
#[cfg(target_os = "linux")]
fn cow_covers(policy: &Policy, project: &Path) -> Vec<(PathBuf, crate::tier::cow::Cover)> {
    use crate::tier::cow::Cover;
    let inside = |p: &Path| strictly_inside(p, project);
    policy
        .protects
        .iter()
        .filter(|p| inside(&p.path))
        .map(|p| {
            let cover = match p.protection {
                crate::policy::Protection::Hidden => Cover::Hide,
                crate::policy::Protection::ReadOnly => Cover::ReadOnly,
            };
            (p.path.clone(), cover)
        })
        .chain(
            policy
                .grants
                .iter()
                .filter(|g| inside(&g.path) && g.access != crate::policy::Access::ReadWrite)
                .map(|g| (g.path.clone(), Cover::ReadOnly)),
        )
        .collect()
}

#[cfg(target_os = "linux")]
fn strictly_inside(p: &Path, project: &Path) -> bool {
    p.starts_with(project) && p != project
}

/// `policy` without what [`cow_covers`] covers inside `project`.
#[cfg(target_os = "linux")]
fn without_inside(policy: &Policy, project: &Path) -> Policy {
    let inside = |p: &Path| strictly_inside(p, project);
    let mut p = policy.clone();
    p.protects.retain(|x| !inside(&x.path));
    p.grants
        .retain(|g| !(inside(&g.path) && g.access != crate::policy::Access::ReadWrite));
    p
}

/// Why `--cow` is refused on `tier`, if it is: where the tier cannot show
/// the project through an overlay.
pub fn cow_refused(tier: Tier) -> Option<&'static str> {
    match tier {
        #[cfg(target_os = "linux")]
        Tier::Bwrap => None,
        #[cfg(not(target_os = "linux"))]
        Tier::Bwrap => Some("bwrap runs on Linux only"),
        #[cfg(target_os = "linux")]
        Tier::Landlock => None,
        #[cfg(not(target_os = "linux"))]
        Tier::Landlock => Some("landlock runs on Linux only"),
        Tier::None => Some("tier none has no mount namespace: nothing would keep the command's writes from the project"),
        #[cfg(target_os = "linux")]
        Tier::Vm => None,
        #[cfg(not(target_os = "linux"))]
        Tier::Vm => Some("tier vm runs on Linux hosts only for now"),
        Tier::Seatbelt | Tier::Restricted | Tier::AppContainer => Some("not on this tier yet"),
    }
}

/// `--cow` (on a tier [`cow_refused`] let through): the project's baseline
/// and a new change set, before the command starts.
#[cfg(target_os = "linux")]
fn start_cow(
    tier: Tier,
    pol: &Policy,
    spec: &CommandSpec,
    continued: Option<&str>,
    leader: bool,
) -> Result<CowRun, RunError> {
    // What the policy protects inside the project is checked again on the
    // host when the set is read: no change there is ever applied.
    let protected: Vec<String> = pol
        .protects
        .iter()
        .filter_map(|p| p.path.strip_prefix(&spec.cwd).ok())
        .filter(|rel| !rel.as_os_str().is_empty())
        .filter_map(|rel| rel.to_str().map(str::to_string))
        .collect();
    let baseline = crate::changes::Baseline::capture(&spec.cwd, &protected)?;
    let store = crate::changes::Store::open(crate::changes::Store::default_root());
    // A session's leader runs hull's agent: the set is the session's.
    let argv: Vec<String> = match leader {
        true => vec!["(a hull serve session)".into()],
        false => spec
            .argv
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
    };
    // As root the overlay is mounted by root (trusted xattrs); as a user in
    // a user namespace of the run's own (user xattrs); on tier 3 by guest
    // root with `userxattr`, the one namespace the upper share lets through.
    let marks = if tier == Tier::Vm {
        crate::changes::Marks::User
    } else if crate::tier::identity::hull_is_root() {
        crate::changes::Marks::Trusted
    } else {
        crate::changes::Marks::User
    };
    if let Some(id) = continued {
        // Its upper layer already has the project's mode and its
        // protections; this run's are checked again when it is applied.
        let (mut set, lock) = store.resume(id, &spec.cwd, marks)?;
        let mut all = set.meta.protected.clone();
        all.extend(
            protected
                .into_iter()
                .filter(|p| !set.meta.protected.contains(p)),
        );
        set.protect(all)?;
        return Ok(CowRun {
            set,
            baseline,
            _lock: Some(lock),
        });
    }
    let mut set = store.create(&spec.cwd, tier.name(), &argv, marks)?;
    set.protect(protected)?;
    // The upper layer's top is the merged view's top: the project's mode,
    // on every tier (the one place it is set).
    let mode = std::fs::metadata(&spec.cwd)
        .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777)
        .map_err(|source| crate::changes::ChangesError::Io {
            what: "cannot stat",
            path: spec.cwd.clone(),
            source,
        })?;
    let upper = set.upper();
    std::fs::set_permissions(&upper, std::os::unix::fs::PermissionsExt::from_mode(mode)).map_err(
        |source| crate::changes::ChangesError::Io {
            what: "cannot set the mode of",
            path: upper,
            source,
        },
    )?;
    Ok(CowRun {
        set,
        baseline,
        _lock: None,
    })
}

/// A `--cow` run's change set, the project's baseline, and, when the set
/// is continued, its lock, held until the run is over.
#[cfg(target_os = "linux")]
struct CowRun {
    set: crate::changes::ChangeSet,
    baseline: crate::changes::Baseline,
    _lock: Option<std::fs::File>,
}

/// Refuses a program the sandbox would not find (exit 127) or could not
/// execute (126), before anything starts ([`crate::exec::resolve`]). Tier 3
/// runs the command in the guest's own filesystem: its agent answers there.
#[cfg(unix)]
fn check_runnable(tier: Tier, pol: &Policy, spec: &CommandSpec) -> Result<(), RunError> {
    use crate::exec::resolve::{check, on_host, view_of, why_hidden, NotRunnable, View};
    use crate::policy::Access;
    let Some(argv0) = spec.argv.first() else {
        return Ok(());
    };
    if tier == Tier::Vm {
        return Ok(());
    }
    let path = spec
        .env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str());
    let pol = (tier != Tier::None).then_some(pol);
    // bwrap's bind mounts carry no per-path noexec: a read grant runs.
    let read_runs = tier == Tier::Bwrap;
    let view = |p: &Path| match view_of(pol, p) {
        View::Visible(Access::Read) if read_runs => View::Visible(Access::ReadExec),
        v => v,
    };
    let granted = |p: &Path| pol.is_none_or(|pol| pol.grants.iter().any(|g| g.path == p));
    let sb = crate::exec::resolve::Sandbox {
        view: &view,
        granted: &granted,
    };
    let host = || on_host(argv0, path, &spec.cwd);
    match (check(tier.name(), argv0, path, &spec.cwd, &sb), pol) {
        (Ok(found), Some(pol)) => {
            // The sandbox runs another program than the host would.
            if let Some(h) = host().filter(|h| *h != found) {
                eprintln!(
                    "hull: tier {tier}: {} runs {} in the sandbox; on the host PATH finds {} first, hidden here: {}",
                    argv0.to_string_lossy(),
                    found.display(),
                    h.display(),
                    why_hidden(pol, &h)
                );
            }
            Ok(())
        }
        (Ok(_), None) => Ok(()),
        (
            Err(NotRunnable::NotFound {
                program,
                tier: t,
                path: searched,
                ..
            }),
            Some(pol),
        ) => {
            let hint = host()
                .map(|h| {
                    format!(
                        "; on the host it is {}, and {}",
                        h.display(),
                        why_hidden(pol, &h)
                    )
                })
                .unwrap_or_default();
            Err(NotRunnable::NotFound {
                program,
                tier: t,
                path: searched,
                hint,
            }
            .into())
        }
        (
            Err(NotRunnable::LinkOut {
                program,
                tier: t,
                link,
                target,
                ..
            }),
            Some(pol),
        ) => {
            let hint = format!("; {}", why_hidden(pol, &target));
            Err(NotRunnable::LinkOut {
                program,
                tier: t,
                link,
                target,
                hint,
            }
            .into())
        }
        (Err(e), _) => Err(e.into()),
    }
}

#[cfg(not(unix))]
fn check_runnable(_tier: Tier, _pol: &Policy, _spec: &CommandSpec) -> Result<(), RunError> {
    Ok(())
}

/// Names the git repositories the command created in its writable roots:
/// git runs what their config says when someone uses git there.
#[cfg(unix)]
fn report_new_repositories(tier: Tier, pol: &Policy, before: &Repos) {
    if tier == Tier::None || pol.git == policy::GitMetadata::Writable {
        return;
    }
    let Ok(after) = policy::git::find_in(pol) else {
        return;
    };
    for git in policy::git::new_repositories(before, &after) {
        eprintln!(
            "hull: tier {tier}: the command created the git repository {} (its config and hooks run when git is used there; review it)",
            git.display()
        );
    }
}

#[cfg(not(unix))]
fn report_new_repositories(_tier: Tier, _pol: &Policy, _before: &Repos) {}

/// On tier 3, when hull runs as root, clears the set-id bits the command
/// left in its writable roots (see [`crate::runtime::setid`]); fails when
/// one could not be cleared or checked. The process tiers need no sweep:
/// their seccomp filter is enforced by the host's kernel, and a command
/// that can defeat it already owns the host. On tier 3 the filter is the
/// guest kernel's, which the command may own without owning the host.
///
/// A `--cow` run's project is shared read-only (`lower::vm::with_cow`):
/// its writes are in the change set's upper layer, which is swept instead
/// of the project (a walk of the whole project, a stat per entry, for
/// nothing the guest could have written).
#[cfg(target_os = "linux")]
fn sweep_setid(
    tier: Tier,
    pol: &Policy,
    since: std::time::SystemTime,
    cow_upper: Option<&Path>,
) -> Result<(), RunError> {
    use crate::runtime::setid;
    if tier != Tier::Vm || !setid::needed() {
        return Ok(());
    }
    let cleared = setid::sweep_roots(setid_roots(pol, cow_upper), since)
        .map_err(|source| RunError::SetIdSweep { tier, source })?;
    for (path, mode) in cleared {
        eprintln!(
            "hull: tier {tier}: cleared the set-id bits of {} (mode {mode:o}) the command left",
            path.display()
        );
    }
    Ok(())
}

/// The directories a tier-3 command could write on the host: the policy's
/// writable roots, the project's replaced by the change set's upper layer
/// on a `--cow` run.
#[cfg(target_os = "linux")]
fn setid_roots<'a>(pol: &'a Policy, cow_upper: Option<&'a Path>) -> Vec<&'a Path> {
    pol.writable_roots()
        .map(|g| g.path.as_path())
        .filter(|r| cow_upper.is_none() || *r != pol.vars.project.as_path())
        .chain(cow_upper)
        .collect()
}

#[cfg(not(target_os = "linux"))]
fn sweep_setid(
    _tier: Tier,
    _pol: &Policy,
    _since: std::time::SystemTime,
    _cow_upper: Option<&Path>,
) -> Result<(), RunError> {
    Ok(())
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use crate::prepare::vars_for;

    #[test]
    fn a_cow_run_sweeps_its_upper_layer_instead_of_the_project() {
        let project = PathBuf::from("/work/proj");
        let vars = vars_for(
            project.clone(),
            "/r/i/tmp".into(),
            "/r/i/spill".into(),
            "/r".into(),
        );
        let file = crate::policy::profiles::load("default").unwrap();
        let pol = crate::policy::resolve(&file, &vars).unwrap();
        let plain = setid_roots(&pol, None);
        assert!(plain.contains(&project.as_path()), "{plain:?}");
        let upper = Path::new("/store/set/layers/upper");
        let cow = setid_roots(&pol, Some(upper));
        assert!(!cow.contains(&project.as_path()), "{cow:?}");
        assert!(cow.contains(&upper), "{cow:?}");
        // Every other writable root (the run's tmp and spill) is still swept.
        let others = |v: &[&Path]| -> Vec<PathBuf> {
            v.iter()
                .filter(|p| **p != project && **p != upper)
                .map(|p| p.to_path_buf())
                .collect()
        };
        assert_eq!(others(&plain), others(&cow));
        assert!(!others(&plain).is_empty(), "{plain:?}");
    }
}
