//! `hull policy check|explain`.
use clap::Args;

#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// Tier to show (default: every tier).
    #[arg(long)]
    pub tier: Option<String>,
    /// Policy file or profile name (default: `default`).
    pub policy: Option<String>,
    #[arg(long)]
    pub project: Option<std::path::PathBuf>,
    #[arg(long)]
    pub json: bool,
}

pub fn check(_p: &str) -> anyhow::Result<i32> {
    anyhow::bail!("not built yet")
}
pub fn explain(_a: ExplainArgs) -> anyhow::Result<i32> {
    anyhow::bail!("not built yet")
}
