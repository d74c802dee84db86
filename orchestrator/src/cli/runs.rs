//! `hull runs list|gc`: the instance directories under the runs root, and
//! their cleanup (see [`crate::runtime::gc`]).
use std::io::Write;

use clap::Subcommand;

use crate::runtime::{self, GcOutcome, RunState};

#[derive(Debug, Subcommand)]
pub enum RunsCommand {
    /// List instance directories and their state.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Clean what no process holds: tmp of idle instances, spill older than
    /// 24 h, then empty run dirs. Exits 1 when some dir could not be cleaned.
    Gc {
        #[arg(long)]
        json: bool,
    },
}

pub fn runs(c: RunsCommand) -> anyhow::Result<i32> {
    let root = runtime::runs_root();
    let mut out = std::io::stdout().lock();
    match c {
        RunsCommand::List { json } => {
            let l = runtime::list(&root)?;
            if json {
                serde_json::to_writer_pretty(&mut out, &l)?;
                writeln!(out)?;
            } else if l.is_empty() {
                writeln!(out, "no hull instances under {}", root.display())?;
            } else {
                writeln!(
                    out,
                    "{:<36}  {:<7}  {:<20}  {:>9}  {:>9}  {:>5}",
                    "ID", "STATE", "CREATED", "TMP", "SPILL", "FILES"
                )?;
                for i in &l {
                    let state = match i.state {
                        RunState::Active => "active",
                        RunState::Idle => "idle",
                        RunState::NoLock => "no-lock",
                    };
                    let created = i
                        .created
                        .map(|t| humantime::format_rfc3339_seconds(t).to_string())
                        .unwrap_or_else(|| "-".into());
                    writeln!(
                        out,
                        "{:<36}  {:<7}  {:<20}  {:>9}  {:>9}  {:>5}",
                        i.id.to_string(),
                        state,
                        created,
                        size(i.tmp_bytes),
                        size(i.spill_bytes),
                        i.spill_files
                    )?;
                }
            }
            Ok(0)
        }
        RunsCommand::Gc { json } => {
            let r = runtime::gc(&root, &crate::tier::reclaim_stale_run)?;
            // Kept VMs whose supervisor is gone: their runs' tmp and spill.
            #[cfg(target_os = "linux")]
            for name in crate::vm::supervisor::sweep_leftovers() {
                eprintln!("hull runs gc: VM {name} is down: removed its tmp and spill");
            }
            let failed = r
                .entries
                .iter()
                .any(|e| matches!(e.outcome, GcOutcome::Failed { .. }));
            if json {
                serde_json::to_writer_pretty(&mut out, &r)?;
                writeln!(out)?;
            } else if r.entries.is_empty() {
                writeln!(out, "no hull instances under {}", root.display())?;
            } else {
                for e in &r.entries {
                    writeln!(out, "{}: {}", e.name, describe(&e.outcome))?;
                }
            }
            Ok(if failed { 1 } else { 0 })
        }
    }
}

fn describe(o: &GcOutcome) -> String {
    match o {
        GcOutcome::InUse => "in use, not touched".into(),
        GcOutcome::Cleaned {
            tmp_removed,
            spill_removed,
            spill_kept,
            bytes_freed,
            dir_removed,
        } => {
            let mut parts = Vec::new();
            if *tmp_removed {
                parts.push("tmp removed".to_string());
            }
            parts.push(format!(
                "{spill_removed} spill file(s) removed, {spill_kept} kept"
            ));
            parts.push(format!("{} freed", size(*bytes_freed)));
            if *dir_removed {
                parts.push("run dir removed".into());
            }
            format!("idle: {}", parts.join(", "))
        }
        GcOutcome::Skipped { reason } => format!("skipped: {reason}"),
        GcOutcome::Failed { error } => format!("FAILED: {error}"),
    }
}

fn size(b: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if b < 1024 {
        return format!("{b} B");
    }
    let mut v = b as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes() {
        assert_eq!(super::size(0), "0 B");
        assert_eq!(super::size(1023), "1023 B");
        assert_eq!(super::size(1536), "1.5 KiB");
        assert_eq!(super::size(5 * 1024 * 1024), "5.0 MiB");
    }
}
