//! `hull run`.
use std::ffi::OsString;
use std::path::PathBuf;

use clap::Args;

use crate::run::{RunOptions, TierChoice};

#[derive(Debug, Args)]
pub struct RunArgs {
    /// auto (the host's tier 2), none, landlock, bwrap, seatbelt, restricted, appcontainer, vm.
    #[arg(long, default_value = "auto")]
    pub tier: String,
    /// Tier 3: an outer VM running an unprivileged container (same as --tier vm).
    #[arg(long, conflicts_with = "tier")]
    pub tier3: bool,
    /// A shipped profile name (default, readonly, build) or a policy file.
    #[arg(long, default_value = "default")]
    pub policy: String,
    /// The project directory (default: the current directory).
    #[arg(long)]
    pub project: Option<PathBuf>,
    /// Set a variable in the command's environment (repeatable).
    #[arg(long = "env", value_name = "K=V", value_parser = parse_env)]
    pub env: Vec<(String, String)>,
    /// Also set the variables read from descriptor N (`K=V` entries each
    /// ended by a NUL, at most 1 MiB; N is closed after): for callers
    /// whose values must not show on a command line, which any local user
    /// can read. Linux.
    #[arg(long = "env-fd", value_name = "N")]
    pub env_fd: Option<i32>,
    /// Kill the whole process tree after this long (e.g. 90s, 10m); overrides limits.wall_time.
    #[arg(long, value_parser = parse_timeout)]
    pub timeout: Option<std::time::Duration>,
    /// Store large output in the instance's spill dir and print head, tail and the path.
    #[arg(long, value_name = "BYTES", num_args = 0..=1, default_missing_value = "50000")]
    pub spill: Option<u64>,
    /// Join an existing instance (its spill stays readable), by id.
    #[arg(long, env = "HULL_INSTANCE")]
    pub instance: Option<String>,
    /// Tier 3: run in the VM named NAME kept up by `hull vm up`. Runs in
    /// one kept VM take turns: this one waits while another runs there.
    #[arg(long)]
    pub vm: Option<String>,
    /// With --vm: descriptor N holds the VM's turn, taken by the caller
    /// (`hull serve`, for the execs of one session); N is closed after.
    #[arg(long, value_name = "N", requires = "vm", hide = true)]
    pub vm_turn_fd: Option<i32>,
    /// Also write the run's result to FILE as JSON (outcome, exit code,
    /// tier, instance, spill, times), also when hull fails; FILE must be
    /// outside the policy's writable roots.
    #[arg(long, value_name = "FILE")]
    pub json_result: Option<PathBuf>,
    /// Copy-on-write: the project is read-only to the command, its writes
    /// land in a change set kept by hull (`hull changes show|diff|apply
    /// ID`). On bwrap, landlock and vm.
    #[arg(long)]
    pub cow: bool,
    /// With --cow: go on in the change set ID of an earlier --cow run on
    /// this project and tier (this run sees its writes and adds its own;
    /// one run at a time).
    #[arg(long, value_name = "ID", requires = "cow")]
    pub cow_continue: Option<String>,
    /// With --cow: write the change set's ID and a newline to descriptor N
    /// once the set is made, before the command starts (`hull serve`'s
    /// copy-on-write sessions); N is close-on-exec from then on.
    #[arg(long, value_name = "N", requires = "cow", hide = true)]
    pub changes_id_fd: Option<i32>,
    /// Run hull's agent as the command, serving execs on stdin and stdout
    /// inside this one sandbox (`hull serve`'s sessions; landlock, bwrap).
    #[arg(long, hide = true, conflicts_with_all = ["argv", "vm", "spill"])]
    pub session_leader: bool,
    /// Tier 3: run the command as this user of the container (root
    /// included: the container's root is unprivileged on the host), in a
    /// fresh VM or a `hull serve` session's; not in a kept VM other runs
    /// share. Files it writes to the shares are the host owner's.
    #[arg(long, value_name = "NAME", value_parser = parse_user, conflicts_with = "session_leader")]
    pub user: Option<String>,
    /// A container image as the userland: oci-archive:PATH,
    /// docker-archive:PATH (what `docker save` writes), oci:DIR[:TAG],
    /// docker://HOST/NAME[:TAG|@sha256:DIGEST] (pulled first, through the
    /// policy's network allowlist) or sha256:DIGEST (an imported image).
    /// Tier vm: its layers are the container's userland, instead of the
    /// policy's `[vm]` one, read and flattened once per version of the
    /// image, then prepared once like any userland; its User is the
    /// default --user, its WorkingDir where the project is. Tier bwrap:
    /// the image, unpacked once into the image cache, is the sandbox's `/`
    /// (read-only; the project and a /tmp of its own on top). Both: its
    /// Env is the command's (under the policy's `env.set` and --env), its
    /// Entrypoint and Cmd the command when none is given.
    #[arg(long, value_name = "REF", conflicts_with = "vm")]
    pub image: Option<String>,
    /// Start from the template NAME (made from a `hull serve` session):
    /// copy-on-write over its workspace, on its tier, under its policy and
    /// image (each checked; landlock, bwrap). The writes land in a change
    /// set of the run's own; the template is unchanged.
    #[arg(
        long,
        value_name = "NAME",
        conflicts_with_all = ["project", "image", "vm", "cow_continue", "session_leader"]
    )]
    pub from: Option<String>,
    /// The command and its arguments.
    #[arg(last = true, required_unless_present_any = ["session_leader", "image"])]
    pub argv: Vec<OsString>,
}

/// `--changes-id-fd N`: the descriptor, owned (close-on-exec) from here.
#[cfg(target_os = "linux")]
fn changes_id_to(fd: Option<i32>) -> anyhow::Result<Option<std::sync::Arc<std::fs::File>>> {
    let Some(fd) = fd else { return Ok(None) };
    let owned = crate::exec::env_fd::adopt(fd)
        .ok_or_else(|| anyhow::anyhow!("--changes-id-fd {fd}: not an open descriptor"))?;
    Ok(Some(std::sync::Arc::new(std::fs::File::from(owned))))
}

#[cfg(not(target_os = "linux"))]
fn changes_id_to(fd: Option<i32>) -> anyhow::Result<Option<std::sync::Arc<std::fs::File>>> {
    match fd {
        Some(fd) => anyhow::bail!("--changes-id-fd {fd}: Linux only for now"),
        None => Ok(None),
    }
}

fn parse_env(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected K=V"))?;
    if k.is_empty() || !k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return Err(format!("{k:?} is not a valid variable name"));
    }
    Ok((k.to_string(), v.to_string()))
}

fn parse_user(s: &str) -> Result<String, String> {
    hull_protocol::check_user_name(s).map(|()| s.to_string())
}

fn parse_timeout(s: &str) -> Result<std::time::Duration, String> {
    crate::policy::resolve::parse_duration(s)
}

/// The template `name` of the caller's, held, for a run on `tier` (auto:
/// the template's) under `policy`: refused unless it was made on that
/// tier, under that policy as its text is now.
#[cfg(target_os = "linux")]
fn from_template(
    name: &str,
    tier: &TierChoice,
    policy: &str,
) -> anyhow::Result<crate::templates::InUse> {
    let t = crate::templates::Store::open()?.take(name, rustix::process::geteuid().as_raw())?;
    let m = &t.meta;
    if let TierChoice::Named(named) = tier {
        if named.name() != m.tier {
            anyhow::bail!(
                "--from {name}: the template was made on tier {}, not {}; run it on its tier",
                m.tier,
                named.name()
            );
        }
    }
    if m.policy != policy {
        anyhow::bail!(
            "--from {name}: the template was made under policy {}, not {policy}; run it under \
             its policy (--policy {})",
            m.policy,
            m.policy
        );
    }
    let pf = crate::policy::profiles::load(policy)?;
    if crate::templates::policy_digest(&pf) != m.policy_sha256 {
        anyhow::bail!(
            "--from {name}: the policy {policy} has changed since the template was made under it"
        );
    }
    Ok(t)
}

pub fn run(a: RunArgs) -> anyhow::Result<i32> {
    #[cfg(target_os = "linux")]
    let a = {
        let mut a = a;
        if let Some(fd) = a.env_fd {
            a.env.extend(crate::exec::env_fd::take(fd)?);
        }
        a
    };
    #[cfg(not(target_os = "linux"))]
    if let Some(fd) = a.env_fd {
        anyhow::bail!("--env-fd {fd}: Linux only for now");
    }
    let tier = if a.tier3 || a.vm.is_some() {
        TierChoice::Named(crate::tier::Tier::Vm)
    } else {
        TierChoice::parse(&a.tier)?
    };
    // A template: its workspace is the project, copy-on-write, held
    // until the run ends.
    #[cfg(target_os = "linux")]
    let template = match &a.from {
        Some(name) => Some(from_template(name, &tier, &a.policy)?),
        None => None,
    };
    #[cfg(not(target_os = "linux"))]
    if let Some(name) = &a.from {
        anyhow::bail!("--from {name}: templates are Linux's only so far");
    }
    #[cfg(target_os = "linux")]
    let (tier, a) = match &template {
        Some(t) => {
            let mut a = a;
            a.project = Some(t.workspace.clone());
            a.cow = true;
            a.image = t.meta.image.clone();
            let tier = crate::tier::Tier::from_arg(&t.meta.tier)
                .map(TierChoice::Named)
                .unwrap_or(tier);
            (tier, a)
        }
        None => (tier, a),
    };
    let project = match a.project {
        Some(p) => p,
        None => super::default_project()?,
    };
    let result_file = a
        .json_result
        .as_deref()
        .map(crate::result_file::ResultFile::open)
        .transpose()?;
    let named = match tier {
        TierChoice::Named(t) => Some(t),
        TierChoice::Auto => None,
    };
    let program = a
        .argv
        .first()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let opts = RunOptions {
        tier,
        policy: a.policy,
        project,
        env: a.env,
        timeout: a.timeout,
        spill: a.spill,
        instance: a.instance,
        vm: a.vm,
        vm_turn_fd: a.vm_turn_fd,
        cow: a.cow,
        cow_continue: a.cow_continue,
        changes_id_to: changes_id_to(a.changes_id_fd)?,
        session_leader: a.session_leader,
        user: a.user,
        image: a.image,
        argv: a.argv,
    };
    let started = std::time::SystemTime::now();
    let clock = std::time::Instant::now();
    let res = crate::run::execute(opts, result_file.as_ref());
    // Not there or not executable: the shell's 127 and 126, with hull's
    // one line, not hull's own failure.
    let not_runnable = res.as_ref().err().and_then(|e| e.not_runnable(&program));
    if let Some((_, message)) = &not_runnable {
        eprintln!("hull: {message}");
    }
    // A result file hull refused to use is not written either.
    let refused = matches!(&res, Err(crate::run::RunError::ResultFile(_)));
    let written = match result_file.filter(|_| !refused) {
        Some(file) => {
            let started = started
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            let doc = result_doc(&res, not_runnable.as_ref(), named, started, clock.elapsed());
            Some(file.write(&doc))
        }
        None => None,
    };
    let code = match not_runnable {
        Some((code, _)) => code,
        None => {
            let outcome = res?;
            if let Some(why) = ending(&outcome) {
                eprintln!("hull: {why}");
            }
            outcome.status.exit_code()
        }
    };
    // The harness reads the file, not the exit code: without it the run's
    // result is unknown to it.
    if let Some(Err(e)) = written {
        return Err(anyhow::Error::from(e).context(format!(
            "the command's exit code was {code}, but its result file could not be written"
        )));
    }
    Ok(code)
}

/// What ended the run when hull ended it (its deadline, a signal hull
/// received), said once on stderr as `timeout(1)` users expect; `None`
/// when the command ended by itself.
fn ending(o: &crate::run::RunOutcome) -> Option<String> {
    use crate::exec::ExitStatus;
    let code = o.status.exit_code();
    match o.status {
        ExitStatus::TimedOut => Some(format!(
            "tier {}: the command ran past its time limit ({}) and was killed with every process it started (exit {code})",
            o.tier,
            o.timeout.map_or_else(|| "unknown".into(), seconds),
        )),
        ExitStatus::Interrupted(n) => Some(format!(
            "tier {}: hull received {}, and ended the command with every process it started (exit {code})",
            o.tier,
            signal_name(n),
        )),
        ExitStatus::Code(_) | ExitStatus::Signal(_) => None,
    }
}

/// `1s`, `1.5s`, `90s`: a limit as `--timeout` takes it.
fn seconds(d: std::time::Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{:.3}s", d.as_secs_f64())
            .trim_end_matches('0')
            .to_string()
    }
}

fn signal_name(n: i32) -> String {
    match n {
        1 => "SIGHUP".into(),
        2 => "SIGINT (Ctrl-C)".into(),
        3 => "SIGQUIT".into(),
        15 => "SIGTERM".into(),
        n => format!("signal {n}"),
    }
}

/// The `--json-result` document of a run that ended as `res`.
fn result_doc(
    res: &Result<crate::run::RunOutcome, crate::run::RunError>,
    not_runnable: Option<&(i32, String)>,
    named: Option<crate::tier::Tier>,
    started: f64,
    took: std::time::Duration,
) -> crate::result_file::RunResult {
    use crate::result_file::{Outcome, RunResult};
    let (exit_code, outcome, tier, instance, spill) = match (res, not_runnable) {
        (Ok(o), _) => (
            o.status.exit_code(),
            o.status.into(),
            Some(o.tier),
            Some(o.instance.clone()),
            Some(o.spill.clone()),
        ),
        (Err(_), Some((code, message))) => (
            *code,
            Outcome::NotRunnable {
                message: message.clone(),
            },
            named,
            None,
            None,
        ),
        (Err(e), None) => (
            crate::EXIT_HULL_FAILED,
            Outcome::HullError {
                message: super::error_text(e),
            },
            named,
            None,
            None,
        ),
    };
    RunResult {
        version: 1,
        exit_code,
        outcome,
        tier,
        instance,
        spill,
        started,
        seconds: took.as_secs_f64(),
        changes: res.as_ref().ok().and_then(|o| o.changes.clone()),
        usage: res.as_ref().map(|o| o.usage).unwrap_or_default(),
    }
}
