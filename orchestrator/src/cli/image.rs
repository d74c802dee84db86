//! `hull image build|list|show|rm`: argument parsing and output only.
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};

use crate::vm::image::{self, build, BuiltImage, Cache, Entry};

#[derive(Debug, Subcommand)]
pub enum ImageCommand {
    /// Build (or reuse, when cached) the tier-3 guest image.
    Build(BuildArgs),
    /// List cached images and unfinished builds.
    List,
    /// Show the paths and manifest of an image (default: this recipe's) and
    /// the agent disk a run would attach.
    Show {
        /// Image id or unique prefix.
        id: Option<String>,
        #[command(flatten)]
        agent: AgentArg,
    },
    /// Read a container image (oci-archive:PATH, docker-archive:PATH,
    /// oci:DIR[:TAG], docker://HOST/NAME[:TAG|@sha256:DIGEST]) into the
    /// cache and flatten its layers into the userland tarball `hull run
    /// --image REF` uses; says its digest (which names it from then on:
    /// `--image sha256:DIGEST`) and where the tarball is.
    Import {
        /// The image reference.
        reference: String,
        /// The policy whose network a registry's image is pulled through
        /// (its `[net] allow` must name the registry's host); a profile
        /// name or a file. Without it, nothing is pulled.
        #[arg(long, value_name = "POLICY")]
        policy: Option<String>,
    },
    /// Remove a cached image, an unfinished build, or an imported
    /// container image (by its digest, `sha256:...`, or a unique prefix).
    Rm {
        /// Image id, unique prefix, `<id>.partial-<pid>`, or `sha256:DIGEST`.
        id: String,
    },
}

#[derive(Debug, Args)]
pub struct AgentArg {
    /// The hull-agent binary (Linux x86-64) the guest runs, from a disk of
    /// its own beside the image [default: $HULL_AGENT, else hull-agent next to hull].
    #[arg(long, value_name = "PATH")]
    pub agent: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct BuildArgs {
    #[command(flatten)]
    pub agent: AgentArg,
    /// Rebuild even when the image is cached.
    #[arg(long)]
    pub force: bool,
    /// Build the image of this policy's container userland (its `[vm]
    /// packages`; a profile name or a file) instead of the default one.
    #[arg(long, value_name = "POLICY")]
    pub policy: Option<String>,
    /// Do not prepare the VM snapshot runs restore from (the first
    /// `hull run --tier3` then prepares it).
    #[arg(long)]
    pub no_snapshot: bool,
}

impl AgentArg {
    fn path(&self) -> anyhow::Result<PathBuf> {
        match &self.agent {
            Some(p) => Ok(p.clone()),
            None => Ok(image::default_agent_path()?),
        }
    }
}

pub fn image(c: ImageCommand) -> anyhow::Result<i32> {
    let cache = Cache::default_location()?;
    match c {
        ImageCommand::Build(a) => build_cmd(&cache, a),
        ImageCommand::List => list(&cache),
        ImageCommand::Show { id, agent } => show(&cache, id, &agent),
        ImageCommand::Import { reference, policy } => import(&cache, &reference, policy.as_deref()),
        ImageCommand::Rm { id } if id.starts_with("sha256:") => {
            let digest = remove_imported(&cache, &id)?;
            println!("removed the imported image {digest}");
            Ok(0)
        }
        ImageCommand::Rm { id } => {
            let dir = image::remove(&cache, &id)?;
            println!("removed {}", dir.display());
            Ok(0)
        }
    }
}

/// The container images imported into the cache.
#[cfg(target_os = "linux")]
fn imported(cache: &Cache) -> anyhow::Result<Vec<image::container_image::Listed>> {
    Ok(image::container_image::list(cache)?)
}

#[cfg(target_os = "linux")]
fn list_imported(imported: &[image::container_image::Listed]) {
    if imported.is_empty() {
        return;
    }
    println!(
        "{:<71} {:>9} {:>9}  {:<20} SOURCE",
        "IMPORTED IMAGE", "SIZE", "UNPACKED", "IMPORTED"
    );
    for i in imported {
        println!(
            "{:<71} {:>9} {:>9}  {:<20} {}",
            i.digest,
            human(i.bytes),
            if i.unpacked == 0 {
                "-".to_string()
            } else {
                human(i.unpacked)
            },
            humantime::format_rfc3339_seconds(
                std::time::UNIX_EPOCH + Duration::from_secs(i.imported_unix)
            ),
            i.source
        );
    }
    println!();
}

#[cfg(target_os = "linux")]
fn remove_imported(cache: &Cache, digest: &str) -> anyhow::Result<String> {
    Ok(image::container_image::remove(cache, digest)?)
}

#[cfg(not(target_os = "linux"))]
fn imported(_cache: &Cache) -> anyhow::Result<Vec<()>> {
    Ok(Vec::new())
}

#[cfg(not(target_os = "linux"))]
fn list_imported(_imported: &[()]) {}

#[cfg(not(target_os = "linux"))]
fn remove_imported(_cache: &Cache, digest: &str) -> anyhow::Result<String> {
    anyhow::bail!("{digest}: container images are read on Linux hosts only so far")
}

#[cfg(target_os = "linux")]
fn import(cache: &Cache, reference: &str, policy: Option<&str>) -> anyhow::Result<i32> {
    let mut say = image::container_image::say(false);
    let net = match policy {
        Some(p) => crate::policy::profiles::load(p)?.net_policy()?,
        None => crate::policy::net::NetPolicy::default(),
    };
    let i = image::container_image::import_with_network(cache, reference, &net, &mut say)
        .with_context(|| match (policy, reference.starts_with("docker://")) {
            (None, true) => "pulling needs a policy whose network allows the registry: \
                             hull image import --policy POLICY REF"
                .to_string(),
            _ => format!("importing {reference}"),
        })?;
    println!("{}\t{}", i.digest, i.rootfs.display());
    Ok(0)
}

#[cfg(not(target_os = "linux"))]
fn import(_cache: &Cache, reference: &str, _policy: Option<&str>) -> anyhow::Result<i32> {
    anyhow::bail!("container image {reference}: read on Linux hosts only so far")
}

fn build_cmd(cache: &Cache, a: BuildArgs) -> anyhow::Result<i32> {
    let recipe = match &a.policy {
        Some(p) => image::recipe_for(&crate::policy::profiles::load(p)?.vm_policy()?)?,
        None => image::recipe::Recipe::base(),
    };
    if let Some(p) = &a.policy {
        eprintln!("userland of {p}: {}", recipe.userland());
    }
    let opts = build::BuildOptions {
        agent: a.agent.path()?,
        force: a.force,
        recipe,
    };
    let mut progress = image::progress::BuildProgress::new("");
    let mut cached = false;
    let mut on = |ev: build::BuildEvent| {
        cached |= matches!(ev, build::BuildEvent::Cached { .. });
        progress.on(ev)
    };
    let result = build::build(cache, &opts, &mut on);
    drop(progress);
    let img = result?;
    if cached {
        // Nothing was built now: the steps' times are the old build's.
        let ago = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
            .saturating_sub(img.manifest.created_unix);
        eprintln!(
            "  nothing built now: this image was built {} ago, in {:.0} s (--force builds it again)",
            age(ago),
            img.manifest.build_seconds
        );
    } else {
        for s in &img.manifest.steps {
            eprintln!("  {:>7.1} s  {}", s.seconds, s.name);
        }
    }
    print_paths(&img);
    let guest = image::GuestImage::with_agent(&img.dir, &a.agent.path()?)?;
    println!("agent     {}", guest.agent.path.display());
    if !a.no_snapshot {
        snapshot_step(&guest)?;
    }
    Ok(0)
}

/// `3 min`, `5 h`, `2 days`: how long ago, roughly.
fn age(secs: u64) -> String {
    match secs {
        0..=119 => format!("{secs} s"),
        120..=7199 => format!("{} min", secs / 60),
        7200..=172_799 => format!("{} h", secs / 3600),
        _ => format!("{} days", secs / 86_400),
    }
}

/// Prepares (or finds) the snapshot `hull run --tier3` restores.
#[cfg(target_os = "linux")]
fn snapshot_step(img: &image::GuestImage) -> anyhow::Result<()> {
    use crate::vm::machine::Tools;
    use crate::vm::snapshot;
    let tools = Tools::find()?;
    let accel = crate::vm::accel::probe_accel().accel;
    let t0 = std::time::Instant::now();
    let hold = snapshot::ensure_for(img, &tools, accel, &mut |step| {
        eprintln!("snapshot: {step} ({:.0} s)", t0.elapsed().as_secs_f64())
    })
    .context("prepare the tier-3 snapshot")?;
    let m = &hold.snapshot.manifest;
    println!(
        "snapshot  {} ({} MiB of state; {accel}, {} MiB, {} vCPU; boot {:.1} s, prepare {:.1} s, save {:.1} s)",
        hold.snapshot.dir.display(),
        m.state_bytes >> 20,
        m.geometry.memory_mib,
        m.geometry.cpus,
        m.boot_s,
        m.prepare_s,
        m.save_s
    );
    Ok(())
}

/// Off Linux there is no tier-3 VM to snapshot: asking for one is an error.
#[cfg(not(target_os = "linux"))]
fn snapshot_step(_img: &image::GuestImage) -> anyhow::Result<()> {
    anyhow::bail!(
        "tier vm snapshots need a Linux host (QEMU with virtiofsd); build with --no-snapshot here"
    )
}

fn print_paths(img: &BuiltImage) {
    println!("id        {}", img.id);
    println!("kernel    {}", img.kernel.display());
    println!("initrd    {}", img.initrd.display());
    println!(
        "base disk {} ({})",
        img.base_disk.display(),
        img.manifest.base_disk_format
    );
    println!("cmdline   {}", img.cmdline());
}

fn list(cache: &Cache) -> anyhow::Result<i32> {
    let entries = cache.entries()?;
    let imported = imported(cache)?;
    if entries.is_empty() && imported.is_empty() {
        println!("no images in {}", cache.root().display());
        return Ok(0);
    }
    list_imported(&imported);
    if entries.is_empty() {
        return Ok(0);
    }
    println!(
        "{:<34} {:<16} {:>9}  {:<20} USERLAND",
        "ID", "STATUS", "SIZE", "CREATED"
    );
    for e in entries {
        match e {
            Entry::Built(img) => {
                // Current: this hull's recipe with the image's packages
                // is the image's id (runs use it).
                let current = image::recipe::Recipe::of_image(&img.manifest).id() == img.id;
                let status = if current { "built (current)" } else { "built" };
                println!(
                    "{:<34} {:<16} {:>9}  {:<20} {}",
                    img.id,
                    status,
                    human(img.disk_usage()),
                    humantime::format_rfc3339_seconds(
                        std::time::UNIX_EPOCH + Duration::from_secs(img.manifest.created_unix)
                    ),
                    image::recipe::Recipe::of_image(&img.manifest).userland(),
                );
            }
            Entry::Partial { dir, live, .. } => {
                let name = dir
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let status = if live { "building" } else { "unfinished" };
                println!(
                    "{:<34} {:<16} {:>9}",
                    name,
                    status,
                    human(image::dir_usage(&dir))
                );
            }
            Entry::Broken { id, dir, reason } => {
                println!(
                    "{:<34} {:<16} {:>9}  {}",
                    id,
                    "broken",
                    human(image::dir_usage(&dir)),
                    reason
                );
            }
        }
    }
    Ok(0)
}

fn show(cache: &Cache, id: Option<String>, agent: &AgentArg) -> anyhow::Result<i32> {
    let img = match id {
        Some(q) => {
            let (_, dir) = image::resolve(cache, &q)?;
            BuiltImage::open(&dir)?
        }
        None => image::find(cache, &image::recipe::Recipe::base())?,
    };
    print_paths(&img);
    let guest = image::GuestImage::looking_at(&img.dir, &agent.path()?)?;
    let made = if guest.agent.path.is_file() {
        "made"
    } else {
        "not made yet: the first run makes it"
    };
    println!("agent     {} ({made})", guest.agent.path.display());
    println!(
        "{}",
        serde_json::to_string_pretty(&img.manifest).context("encode the manifest")?
    );
    Ok(0)
}

pub(crate) fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}
