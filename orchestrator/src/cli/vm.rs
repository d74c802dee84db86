//! `hull vm up|status|down`. (Owned by the tier-3 VM work.)
use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum VmCommand {
    /// Start a VM that stays up for later `hull run --tier3 --vm NAME`.
    Up {
        #[arg(long, default_value = "default")]
        name: String,
    },
    /// Show running VMs.
    Status,
    /// Stop a VM.
    Down {
        #[arg(long, default_value = "default")]
        name: String,
    },
}

pub fn vm(_c: VmCommand) -> anyhow::Result<i32> {
    anyhow::bail!("hull vm: not built yet")
}
