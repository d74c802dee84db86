//! `hull canary [--tier T]... [--json]`: the escape probes against this
//! machine's tiers (`crate::canary`).
use clap::Args;

#[derive(Debug, Args)]
pub struct CanaryArgs {
    /// A tier to check (repeatable). Default: landlock and bwrap on Linux
    /// (and vm when its image is built), seatbelt on macOS.
    #[arg(long = "tier")]
    pub tiers: Vec<String>,
    /// One JSON document: every cell with its probe, class, tier, verdict
    /// and evidence.
    #[arg(long)]
    pub json: bool,
    /// Also write the matrix as one self-contained HTML page to FILE.
    #[arg(long, value_name = "FILE")]
    pub html: Option<std::path::PathBuf>,
    /// Run only this probe (repeatable; `--list` names them).
    #[arg(long = "probe", value_name = "ID")]
    pub probes: Vec<String>,
    /// List the probes (id, class, attack or allowed) and exit.
    #[arg(long)]
    pub list: bool,
}

#[cfg(unix)]
pub fn canary(a: CanaryArgs, quiet: bool) -> anyhow::Result<i32> {
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    use crate::tier::Tier;
    if a.list {
        for p in crate::canary::probes() {
            let kind = match p.kind {
                crate::canary::Kind::Attack => "attack",
                crate::canary::Kind::Positive => "allowed",
            };
            println!("{:<28} {:<30} {kind}", p.id, p.class);
        }
        return Ok(0);
    }
    let mut tiers = Vec::new();
    for t in &a.tiers {
        let tier = Tier::from_arg(t).ok_or_else(|| anyhow::anyhow!("unknown tier {t:?}"))?;
        if tier == Tier::None {
            anyhow::bail!("tier none is every probe's control; it runs anyway");
        }
        if !tiers.contains(&tier) {
            tiers.push(tier);
        }
    }
    if tiers.is_empty() {
        tiers = if cfg!(target_os = "macos") {
            vec![Tier::Seatbelt]
        } else {
            vec![Tier::Landlock, Tier::Bwrap]
        };
        // Tier 3 when it can run here and its image is built.
        #[cfg(target_os = "linux")]
        if crate::tier::ready(Tier::Vm).available
            && crate::tier::vm::find_image_with(&crate::vm::image::recipe::Recipe::base(), false)
                .is_ok()
        {
            tiers.push(Tier::Vm);
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [libc::SIGINT, libc::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop))?;
    }
    let bar = if quiet || a.json {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr())
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template("canary: {pos}/{len} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let cells = crate::canary::run(&tiers, &a.probes, &stop, |i, n, probe, tier| {
        bar.set_length(n as u64);
        bar.set_position(i as u64);
        bar.set_message(format!("{probe} on {tier}"));
    });
    bar.finish_and_clear();
    let cells = match cells {
        Ok(c) => c,
        Err(crate::canary::CanaryError::Interrupted) => {
            eprintln!("hull: canary interrupted; the decoy was removed");
            return Ok(130);
        }
        Err(e) => return Err(e.into()),
    };
    if let Some(f) = &a.html {
        crate::out_dir::write_file(f, crate::canary::render_html(&cells).as_bytes())
            .map_err(|e| anyhow::anyhow!("canary: cannot write {}: {e}", f.display()))?;
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&cells)?);
    } else {
        print!("{}", crate::canary::render(&cells));
    }
    Ok(if cells.iter().any(|c| c.verdict.is_bad()) {
        1
    } else {
        0
    })
}

#[cfg(not(unix))]
pub fn canary(_a: CanaryArgs, _quiet: bool) -> anyhow::Result<i32> {
    anyhow::bail!("hull canary runs on Linux and macOS for now")
}
