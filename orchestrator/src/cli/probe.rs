//! `hull probe [--json]`: every tier of every OS, available or not, and why.
use clap::Args;

use crate::tier::probe::Probe;

#[derive(Debug, Args)]
pub struct ProbeArgs {
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
    /// Probe only this tier.
    #[arg(long)]
    pub tier: Option<String>,
}

pub fn probe(a: ProbeArgs) -> anyhow::Result<i32> {
    let probes = match &a.tier {
        Some(t) => {
            let tier = crate::tier::Tier::from_arg(t)
                .ok_or_else(|| anyhow::anyhow!("unknown tier {t:?}"))?;
            vec![crate::tier::probe(tier)]
        }
        None => crate::tier::probe_all(),
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&probes)?);
        return Ok(0);
    }
    print!("{}", render(&probes));
    Ok(0)
}

/// The human-readable table.
pub fn render(probes: &[Probe]) -> String {
    let mut out = String::new();
    for p in probes {
        let mark = if p.available { "yes" } else { "no " };
        out.push_str(&format!(
            "tier {} {:<13} {}  {}\n",
            p.level,
            p.tier.name(),
            mark,
            p.reason
        ));
        for h in &p.helpers {
            out.push_str(&format!("    {} {} ({})\n", h.name, h.version, h.path));
        }
    }
    let auto = crate::tier::Os::current().map(crate::tier::Tier::auto_for);
    if let Some(t) = auto {
        out.push_str(&format!("--tier auto chooses: {t}\n"));
    }
    out
}
