//! `hull read`. (Owned by the runtime work.)
use clap::Args;

#[derive(Debug, Args)]
pub struct ReadArgs {
    /// A path in the project or in this instance's spill.
    pub path: Option<String>,
    #[arg(long)]
    pub start_line: Option<u64>,
    #[arg(long)]
    pub max_lines: Option<u64>,
    /// Resume from the cursor a previous answer gave.
    #[arg(long, conflicts_with_all = ["path", "start_line", "max_lines"])]
    pub cursor: Option<String>,
}

pub fn read(_a: ReadArgs) -> anyhow::Result<i32> {
    anyhow::bail!("hull read: not built yet")
}
