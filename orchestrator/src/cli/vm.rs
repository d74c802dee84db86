//! `hull vm up|status|down`: a tier-3 VM that stays up between runs.
use std::path::PathBuf;
use std::time::Duration;

use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum VmCommand {
    /// Start a VM that stays up for later `hull run --tier3 --vm NAME`.
    Up {
        #[arg(long, default_value = "default")]
        name: String,
        /// The project it shares (default: the current directory).
        #[arg(long)]
        project: Option<PathBuf>,
        /// A shipped profile name or a policy file; runs must use the same.
        #[arg(long, default_value = "default")]
        policy: String,
        /// Stop after this long with no client and no command (e.g. 30m, 2h).
        #[arg(long, default_value = "30m", value_parser = parse_duration)]
        idle: Duration,
        /// Give up when the VM is not ready after this long (e.g. 3m): the
        /// supervisor and its VM are stopped and hull exits 125 with the
        /// supervisor log's tail. Default: the accelerator's boot and setup
        /// deadlines plus a minute (11 min under TCG).
        #[arg(long, value_parser = parse_duration)]
        timeout: Option<Duration>,
    },
    /// Show the VMs and whether they are up.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Stop a VM.
    Down {
        #[arg(long, default_value = "default")]
        name: String,
        /// How long the VM may take to shut down cleanly before its
        /// supervisor is killed (and the VM with it).
        #[arg(long, default_value = "60s", value_parser = parse_duration)]
        timeout: Duration,
    },
    /// Internal: the supervisor process `hull vm up` starts.
    #[command(name = "__serve", hide = true)]
    Serve {
        #[arg(long)]
        name: String,
        #[arg(long)]
        project: PathBuf,
        #[arg(long)]
        policy: String,
        #[arg(long)]
        idle_secs: u64,
    },
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    crate::policy::resolve::parse_duration(s)
}

#[cfg(target_os = "linux")]
pub fn vm(c: VmCommand) -> anyhow::Result<i32> {
    use crate::vm::supervisor::{self, UpOptions};
    match c {
        VmCommand::Up {
            name,
            project,
            policy,
            idle,
            timeout,
        } => {
            let project = match project {
                Some(p) => p,
                None => super::default_project()?,
            };
            let project = std::fs::canonicalize(&project)
                .map_err(|e| anyhow::anyhow!("hull vm up: project {}: {e}", project.display()))?;
            // The policy's container userland, built here (with its
            // progress shown) when the policy adds packages not built yet.
            let recipe = crate::vm::assemble::recipe_for(
                &crate::policy::profiles::load(&policy)?.vm_policy()?,
            )?;
            let mut progress = crate::vm::image::progress::BuildProgress::new("hull vm up: ");
            crate::vm::assemble::ensure_userland(&recipe, &mut |ev| progress.on(ev))?;
            drop(progress);
            let exe = std::env::current_exe()?;
            let s = supervisor::up(
                &exe,
                &UpOptions {
                    name,
                    project,
                    policy,
                    idle,
                },
                timeout,
            )?;
            println!(
                "hull vm {}: up (accelerator {}, supervisor pid {}, project {}, policy {}, idle stop after {}s)",
                s.name,
                s.accel,
                s.pid,
                s.project.display(),
                s.policy,
                s.idle_secs
            );
            println!("  run in it: hull run --tier3 --vm {} -- CMD", s.name);
            Ok(0)
        }
        VmCommand::Status { json } => {
            let all = supervisor::status()?;
            if json {
                println!("{}", serde_json::to_string_pretty(&all)?);
                return Ok(0);
            }
            if all.is_empty() {
                println!("no VMs (start one with `hull vm up`)");
            }
            for v in all {
                match (&v.state, v.up) {
                    (Some(s), true) => println!(
                        "{:<16} {:<8} pid {} accel {} project {} policy {} (idle stop {}s)",
                        v.name,
                        s.state,
                        s.pid,
                        s.accel,
                        s.project.display(),
                        s.policy,
                        s.idle_secs
                    ),
                    (Some(s), false) => println!(
                        "{:<16} down     (last: {}{})",
                        v.name,
                        s.state,
                        s.error
                            .as_ref()
                            .map(|e| format!(": {e}"))
                            .unwrap_or_default()
                    ),
                    (None, up) => println!("{:<16} {}", v.name, if up { "up" } else { "down" }),
                }
            }
            Ok(0)
        }
        VmCommand::Down { name, timeout } => {
            if supervisor::down(&name, timeout)? {
                println!("hull vm {name}: down");
            } else {
                println!("hull vm {name}: was not up");
            }
            Ok(0)
        }
        VmCommand::Serve {
            name,
            project,
            policy,
            idle_secs,
        } => {
            supervisor::serve(&UpOptions {
                name,
                project,
                policy,
                idle: Duration::from_secs(idle_secs),
            })?;
            Ok(0)
        }
    }
}

#[cfg(not(target_os = "linux"))]
pub fn vm(_c: VmCommand) -> anyhow::Result<i32> {
    anyhow::bail!("hull vm: tier 3 runs on Linux hosts for now")
}
