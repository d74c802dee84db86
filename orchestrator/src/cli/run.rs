//! `hull run`.
use clap::Args;

#[derive(Debug, Args)]
pub struct RunArgs {
    #[arg(last = true, required = true)]
    pub argv: Vec<std::ffi::OsString>,
}

pub fn run(_a: RunArgs) -> anyhow::Result<i32> {
    anyhow::bail!("not built yet")
}
