//! `hull image build|list|rm`. (Owned by the tier-3 image work.)
use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum ImageCommand {
    /// Build (or reuse, when cached) the guest image.
    Build,
    /// List cached images.
    List,
    /// Remove a cached image.
    Rm { id: String },
}

pub fn image(_c: ImageCommand) -> anyhow::Result<i32> {
    anyhow::bail!("hull image: not built yet")
}
