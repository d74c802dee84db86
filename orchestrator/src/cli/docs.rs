//! `hull completions SHELL` and `hull man`: generated from the same
//! definitions the parser uses, so they cannot drift from it.
use std::path::PathBuf;

use clap::{Args, CommandFactory};

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// bash, zsh, fish, elvish or powershell.
    pub shell: clap_complete::Shell,
}

#[derive(Debug, Args)]
pub struct ManArgs {
    /// Write hull.1 and a page for each subcommand (hull-run.1, ...) into
    /// DIR instead of printing hull.1.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// Prints the completion script for `a.shell`.
pub fn completions(a: CompletionsArgs) -> anyhow::Result<i32> {
    let mut cmd = super::Cli::command();
    clap_complete::generate(a.shell, &mut cmd, "hull", &mut std::io::stdout());
    Ok(0)
}

/// Prints hull.1, or writes every page into `--dir`.
pub fn man(a: ManArgs) -> anyhow::Result<i32> {
    let cmd = super::Cli::command();
    match a.dir {
        None => {
            clap_mangen::Man::new(cmd).render(&mut std::io::stdout())?;
        }
        Some(dir) => {
            std::fs::create_dir_all(&dir)
                .map_err(|e| anyhow::anyhow!("hull man: cannot create {}: {e}", dir.display()))?;
            clap_mangen::generate_to(cmd, &dir).map_err(|e| {
                anyhow::anyhow!("hull man: cannot write into {}: {e}", dir.display())
            })?;
        }
    }
    Ok(0)
}
