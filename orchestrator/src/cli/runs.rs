//! `hull runs list|gc`. (Owned by the runtime work.)
use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum RunsCommand {
    /// List instance directories and their state.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Remove what no live instance holds: tmp of dead instances, spill older than 24 h.
    Gc {
        #[arg(long)]
        json: bool,
    },
}

pub fn runs(_c: RunsCommand) -> anyhow::Result<i32> {
    anyhow::bail!("hull runs: not built yet")
}
