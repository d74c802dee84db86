//! `hull probe`.
use clap::Args;

#[derive(Debug, Args)]
pub struct ProbeArgs {
    #[arg(long)]
    pub json: bool,
}

pub fn probe(_a: ProbeArgs) -> anyhow::Result<i32> {
    anyhow::bail!("not built yet")
}
