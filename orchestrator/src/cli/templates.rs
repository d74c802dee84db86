//! `hull templates list|rm`: argument parsing and output only.

use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum TemplatesCommand {
    /// List the templates of this image cache: name, what they were made
    /// from (tier, policy, image, session), size and when.
    List,
    /// Remove a template (refused while a session started from it runs).
    Rm {
        /// The template's name.
        name: String,
    },
}

#[cfg(target_os = "linux")]
pub fn templates(c: TemplatesCommand) -> anyhow::Result<i32> {
    let store = crate::templates::Store::open()?;
    match c {
        TemplatesCommand::List => {
            let all = store.list(None)?;
            if all.is_empty() {
                println!("no templates");
                return Ok(0);
            }
            println!(
                "{:<24} {:<9} {:<16} {:>9} {:>10} {:<20} FROM",
                "TEMPLATE", "TIER", "POLICY", "ENTRIES", "SIZE", "MADE"
            );
            for m in all {
                println!(
                    "{:<24} {:<9} {:<16} {:>9} {:>10} {:<20} session {}{}",
                    m.name,
                    m.tier,
                    m.policy,
                    m.entries,
                    super::image::human(m.bytes),
                    humantime::format_rfc3339_seconds(
                        std::time::UNIX_EPOCH + std::time::Duration::from_secs(m.made_unix)
                    ),
                    m.from_session,
                    m.image.map(|i| format!(" on {i}")).unwrap_or_default()
                );
            }
            Ok(0)
        }
        TemplatesCommand::Rm { name } => {
            store.remove(&name, None)?;
            println!("removed the template {name}");
            Ok(0)
        }
    }
}

#[cfg(not(target_os = "linux"))]
pub fn templates(_c: TemplatesCommand) -> anyhow::Result<i32> {
    anyhow::bail!("templates are made by `hull serve` sessions on Linux hosts only so far")
}
