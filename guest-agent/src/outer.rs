//! Outer-VM mode (stub: the image engineer replaces this file).

/// Arguments of `hull-agent outer`.
#[derive(Debug, clap::Args)]
pub struct OuterArgs {}

pub fn run(_args: OuterArgs) -> anyhow::Result<()> {
    anyhow::bail!("hull-agent outer: not implemented yet")
}
