//! `hull image build`: run the embedded recipe into `<id>.partial-<pid>`, follow its
//! step markers, and publish the directory under `<id>` only when it is complete.
//!
//! Guards against: publishing a failed or interrupted build (manifest written last,
//! then one rename), two builds of one id racing (the id's lock; a second build
//! waits, then finds the first one's image), cleaning a partial a live build (or an
//! orphan of a killed hull) still writes (every process of the build inherits the
//! lock: it is the script's stdin), unbounded output from the script (lines are
//! capped), and a missing tool failing deep in the build (checked first, with the
//! packages that install it). Does not sandbox the recipe: it runs as root with the
//! Debian mirror as its only network peer, like any image builder.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use super::{
    recipe, BuiltImage, Cache, GuestContract, ImageError, Manifest, StepTiming, MANIFEST_FORMAT,
};

/// The converted `[vm] rootfs` tarball `build.sh` imports instead of
/// running mmdebstrap for the container.
const CONTAINER_ROOTFS: &str = "container-rootfs.tar";

/// Longest line accepted from the build script's stdout.
const MAX_LINE: u64 = 16 * 1024;
/// Most `@@info` facts kept.
const MAX_INFO: usize = 256;

/// What to build.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    /// The `hull-agent` binary the build's smoke test starts the container
    /// with (on its own disk, kept in the image directory for later runs;
    /// the image itself does not hold an agent).
    pub agent: PathBuf,
    /// Rebuild even when a complete image with this id exists.
    pub force: bool,
    /// The userland: the default, or with a policy's `[vm] packages`.
    pub recipe: recipe::Recipe,
}

/// Progress reported while building.
#[derive(Debug, Clone, PartialEq)]
pub enum BuildEvent {
    /// The image already exists; nothing was built.
    Cached { id: String },
    /// Another process holds the id's lock (a build, or a VM for `--force`).
    Waiting { id: String, lock: PathBuf },
    /// The build starts in this directory, logging to this file.
    Started {
        id: String,
        dir: PathBuf,
        log: PathBuf,
    },
    /// A step started (1-based).
    Step { n: u32, of: u32, name: String },
    /// The image is published.
    Done { id: String, seconds: f64 },
    /// An image was removed to keep the cache under its size cap.
    Evicted { id: String, bytes: u64 },
}

/// A parsed stdout line of `build.sh`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Marker {
    Step { n: u32, of: u32, name: String },
    Info { key: String, value: String },
    Error(String),
    Other(String),
}

/// Parse one line of the build script's stdout.
pub fn parse_marker(line: &str) -> Marker {
    let line = line.trim_end_matches(['\r', '\n']);
    if let Some(rest) = line.strip_prefix("@@step ") {
        if let Some((frac, name)) = rest.split_once(' ') {
            if let Some((n, of)) = frac.split_once('/') {
                if let (Ok(n), Ok(of)) = (n.parse(), of.parse()) {
                    if n >= 1 && n <= of {
                        return Marker::Step {
                            n,
                            of,
                            name: name.to_owned(),
                        };
                    }
                }
            }
        }
    } else if let Some(rest) = line.strip_prefix("@@info ") {
        if let Some((k, v)) = rest.split_once('=') {
            let key_ok = !k.is_empty()
                && k.len() <= 64
                && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if key_ok {
                return Marker::Info {
                    key: k.to_owned(),
                    value: v.to_owned(),
                };
            }
        }
    } else if let Some(rest) = line.strip_prefix("@@error ") {
        return Marker::Error(rest.to_owned());
    }
    Marker::Other(line.to_owned())
}

/// Tools the recipe runs on the host, and the Debian package of each.
pub const TOOLS: &[(&str, &str)] = &[
    ("mmdebstrap", "mmdebstrap"),
    ("qemu-system-x86_64", "qemu-system-x86"),
    ("mkfs.ext4", "e2fsprogs"),
    ("e2fsck", "e2fsprogs"),
    ("zstd", "zstd"),
    ("cpio", "cpio"),
    ("xz", "xz-utils"),
    ("dpkg-deb", "dpkg"),
    ("chroot", "coreutils"),
    ("timeout", "coreutils"),
    ("bash", "bash"),
];

/// The tools of [`TOOLS`] not found on `path` (a `PATH`-style list).
pub fn missing_tools(path: &std::ffi::OsStr) -> Vec<(&'static str, &'static str)> {
    let dirs: Vec<PathBuf> = std::env::split_paths(path).collect();
    TOOLS
        .iter()
        .filter(|(tool, _)| !dirs.iter().any(|d| is_executable(&d.join(tool))))
        .copied()
        .collect()
}

fn is_executable(p: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p)
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    }
    #[cfg(not(unix))]
    {
        p.is_file()
    }
}

/// The error for missing tools, with one install command.
pub fn missing_tools_error(missing: &[(&str, &str)]) -> ImageError {
    let mut pkgs: Vec<&str> = missing.iter().map(|m| m.1).collect();
    pkgs.sort();
    pkgs.dedup();
    let list = missing
        .iter()
        .map(|(t, p)| format!("{t} (package {p})"))
        .collect::<Vec<_>>()
        .join(", ");
    let mut install = format!("sudo apt-get install {}", pkgs.join(" "));
    if pkgs.contains(&"qemu-system-x86") {
        install.push_str(
            " (on Debian 12 take QEMU from bookworm-backports: \
             sudo apt-get install -t bookworm-backports qemu-system-x86; scripts/setup.sh --tier3 does all of it)",
        );
    }
    ImageError::MissingTools { list, install }
}

/// Build the image of this recipe unless it is cached; returns it.
pub fn build(
    cache: &Cache,
    opts: &BuildOptions,
    on: &mut dyn FnMut(BuildEvent),
) -> Result<BuiltImage, ImageError> {
    // Refuse a missing or foreign agent before minutes of work.
    super::read_agent(&opts.agent)?;
    let id = opts.recipe.id();
    let final_dir = cache.image_dir(&id);
    cache.check_private()?;
    if !opts.force {
        if let Ok(img) = BuiltImage::open(&final_dir) {
            on(BuildEvent::Cached { id });
            return Ok(img);
        }
    }
    preflight()?;
    check_space(cache.root(), BUILD_SPACE_MIB)?;

    let lock = cache.lock_file(&id)?;
    if lock.try_lock().is_err() {
        on(BuildEvent::Waiting {
            id: id.clone(),
            lock: cache.lock_path(&id),
        });
        lock.lock()
            .map_err(ImageError::io(&cache.lock_path(&id), "lock the image"))?;
    }
    // Another build may have finished while we waited.
    if !opts.force {
        if let Ok(img) = BuiltImage::open(&final_dir) {
            on(BuildEvent::Cached { id });
            return Ok(img);
        }
    }
    // We hold the lock: every partial of this id is dead; so is every
    // other one whose lock nobody holds.
    cache.remove_partials_locked(&id)?;
    cache.remove_dead_partials()?;

    let dir = cache.partial_dir(&id);
    std::fs::create_dir_all(&dir).map_err(ImageError::io(&dir, "create the build directory"))?;
    match build_in(cache, opts, &id, &dir, &lock, on) {
        Ok(img) => Ok(img),
        Err(e) => Err(discard(cache, &id, &dir, e)),
    }
}

/// A failed build's directory is removed (it held up to a GiB and more);
/// its log is kept as `<id>.failed.log` in the cache, and the error names
/// that.
fn discard(cache: &Cache, id: &str, dir: &Path, e: ImageError) -> ImageError {
    let kept = cache.root().join(format!("{id}.{FAILED_LOG}"));
    let log = dir.join("build.log");
    let moved = std::fs::rename(&log, &kept).is_ok();
    if let Err(err) = super::cache::remove_tree(dir) {
        tracing::warn!(
            "image cache: cannot remove the failed build {}: {err}",
            dir.display()
        );
    }
    match e {
        ImageError::BuildFailed {
            step,
            message,
            log: was,
            tail,
        } => ImageError::BuildFailed {
            step,
            message,
            log: if moved { kept } else { was },
            tail,
        },
        e => e,
    }
}

/// The suffix of a failed build's kept log.
pub const FAILED_LOG: &str = "failed.log";

/// The build in its partial directory `dir`, up to its publication.
fn build_in(
    cache: &Cache,
    opts: &BuildOptions,
    id: &str,
    dir: &Path,
    lock: &File,
    on: &mut dyn FnMut(BuildEvent),
) -> Result<BuiltImage, ImageError> {
    let id = id.to_string();
    let dir = dir.to_path_buf();
    let final_dir = cache.image_dir(&id);
    let recipe_dir = dir.join("recipe");
    opts.recipe
        .materialise(&recipe_dir)
        .map_err(ImageError::io(&recipe_dir, "write the recipe"))?;
    let log_path = dir.join("build.log");
    let log = File::create(&log_path).map_err(ImageError::io(&log_path, "create the build log"))?;
    on(BuildEvent::Started {
        id: id.clone(),
        dir: dir.clone(),
        log: log_path.clone(),
    });

    let started = Instant::now();
    // `[vm] rootfs`: the tarball checked again (it must still be the one
    // the id was computed from) and rewritten for the import; the recipe
    // then skips its own container step.
    if let Some(r) = opts.recipe.rootfs() {
        super::rootfs::convert(&r.path, &r.sha256, &dir.join(CONTAINER_ROOTFS))?;
    }
    let agent = super::agent_disk::ensure(&dir, &opts.agent)?;
    let bases = cache.root().join(super::cache::GUEST_BASES);
    let run = run_script(&dir, &recipe_dir, &agent.path, &bases, lock, log, on)?;
    if !run.success {
        return Err(ImageError::BuildFailed {
            step: run.last_step.unwrap_or_else(|| "start".into()),
            message: run
                .error
                .unwrap_or_else(|| format!("the recipe exited with {}", run.status)),
            log: log_path.clone(),
            tail: log_tail(&log_path, 15),
        });
    }

    // The digests the manifest records (seconds: holes are skipped).
    let names = ["vmlinux", "initrd.cpio", "disk.raw"];
    let files = super::digest::compute(&dir, &names).map_err(|e| ImageError::Invalid {
        dir: dir.clone(),
        reason: e.to_string(),
    })?;
    let manifest = Manifest {
        format: MANIFEST_FORMAT,
        id: id.clone(),
        hash: opts.recipe.hash(),
        packages: opts.recipe.packages().to_vec(),
        rootfs: opts.recipe.rootfs().cloned(),
        created_unix: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        kernel: "vmlinux".into(),
        initrd: "initrd.cpio".into(),
        base_disk: "disk.raw".into(),
        base_disk_format: "raw".into(),
        files,
        guest: GuestContract::current(),
        info: run.info,
        steps: run.steps,
        build_seconds: started.elapsed().as_secs_f64(),
    };
    write_manifest(&dir, &manifest)?;
    // Check it opens before publishing it.
    BuiltImage::open_named(&dir, &id)?;
    publish(cache, &dir, &final_dir, &id)?;
    on(BuildEvent::Done {
        id: id.clone(),
        seconds: manifest.build_seconds,
    });
    // The cache stays under its cap: older recipes and the least recently
    // used userlands go (best effort: a failure here loses no image).
    let cap = crate::settings::get()
        .image_cache_max
        .unwrap_or(super::DEFAULT_CACHE_MAX);
    match super::evict(cache, cap, &id) {
        Ok(removed) => {
            for (id, bytes) in removed {
                on(BuildEvent::Evicted { id, bytes });
            }
        }
        Err(e) => tracing::warn!("image cache: could not bring it under {cap} bytes: {e}"),
    }
    BuiltImage::open(&final_dir)
}

/// What a build takes on disk at its peak, with a margin: the image
/// itself is about 1.6 GiB (its 12 GiB disk is sparse), the rootfs, the
/// container image and the downloaded packages come on top while it builds.
const BUILD_SPACE_MIB: u64 = 3 * 1024;

/// Refuses a build that would fill the cache's disk minutes in.
fn check_space(root: &Path, need_mib: u64) -> Result<(), ImageError> {
    #[cfg(unix)]
    {
        let st = rustix::fs::statvfs(root).map_err(|e| ImageError::Io {
            path: root.to_path_buf(),
            what: "measure the free space of",
            source: e.into(),
        })?;
        let free_mib = st.f_bavail.saturating_mul(st.f_frsize) >> 20;
        if free_mib < need_mib {
            return Err(ImageError::NoSpace {
                root: root.to_path_buf(),
                free_mib,
                need_mib,
            });
        }
    }
    #[cfg(not(unix))]
    let _ = (root, need_mib);
    Ok(())
}

fn preflight() -> Result<(), ImageError> {
    if !cfg!(target_os = "linux") {
        return Err(ImageError::UnsupportedHost);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    // root's tools live in sbin, which a user's PATH may lack.
    let mut dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
    for d in ["/usr/sbin", "/sbin"] {
        if !dirs.iter().any(|x| x == Path::new(d)) {
            dirs.push(PathBuf::from(d));
        }
    }
    let joined = std::env::join_paths(dirs).unwrap_or(path);
    let missing = missing_tools(&joined);
    if !missing.is_empty() {
        return Err(missing_tools_error(&missing));
    }
    #[cfg(unix)]
    if !rustix::process::geteuid().is_root() {
        return Err(ImageError::NeedsRoot {
            why: "mmdebstrap's root mode and mkfs.ext4 -d keep the ownership of guest files only as root \
                  (run it with sudo; the image is cached for that user)",
        });
    }
    Ok(())
}

struct ScriptRun {
    success: bool,
    status: String,
    last_step: Option<String>,
    error: Option<String>,
    info: BTreeMap<String, String>,
    steps: Vec<StepTiming>,
}

fn run_script(
    dir: &Path,
    recipe_dir: &Path,
    agent_disk: &Path,
    bases: &Path,
    lock: &File,
    mut log: File,
    on: &mut dyn FnMut(BuildEvent),
) -> Result<ScriptRun, ImageError> {
    let script = recipe_dir.join("build.sh");
    // The lock file as stdin: every process of the build holds the lock with it, so
    // an orphaned build (hull killed) keeps its partial from being cleaned under it.
    let stdin = lock
        .try_clone()
        .map_err(ImageError::io(&script, "pass the lock"))?;
    let stderr = log
        .try_clone()
        .map_err(ImageError::io(&script, "open the log"))?;
    let mut child = Command::new("bash")
        .arg(&script)
        .arg(dir)
        .arg(agent_disk)
        .env("PATH", sbin_path())
        .env("HULL_GUEST_BASES", bases)
        .env(
            "HULL_USERLAND_MAX",
            crate::settings::get()
                .userland_max
                .unwrap_or(super::DEFAULT_USERLAND_MAX)
                .to_string(),
        )
        .stdin(Stdio::from(stdin))
        .stdout(Stdio::piped())
        .stderr(Stdio::from(stderr))
        .spawn()
        .map_err(ImageError::io(&script, "run the recipe"))?;
    let mut run = ScriptRun {
        success: false,
        status: String::new(),
        last_step: None,
        error: None,
        info: BTreeMap::new(),
        steps: Vec::new(),
    };
    let mut current: Option<(String, Instant)> = None;
    if let Some(out) = child.stdout.take() {
        let mut reader = BufReader::new(out);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            let n = (&mut reader)
                .take(MAX_LINE)
                .read_until(b'\n', &mut buf)
                .map_err(ImageError::io(&script, "read the recipe's output"))?;
            if n == 0 {
                break;
            }
            let line = String::from_utf8_lossy(&buf);
            let _ = log.write_all(format!("[hull] {}", line.trim_end()).as_bytes());
            let _ = log.write_all(b"\n");
            match parse_marker(&line) {
                Marker::Step { n, of, name } => {
                    if let Some((prev, t)) = current.take() {
                        run.steps.push(StepTiming {
                            name: prev,
                            seconds: t.elapsed().as_secs_f64(),
                        });
                    }
                    current = Some((name.clone(), Instant::now()));
                    run.last_step = Some(format!("{n}/{of} {name}"));
                    on(BuildEvent::Step { n, of, name });
                }
                Marker::Info { key, value } => {
                    if run.info.len() < MAX_INFO {
                        run.info.insert(key, value);
                    }
                }
                Marker::Error(m) => {
                    if run.error.is_none() {
                        run.error = Some(m);
                    }
                }
                Marker::Other(_) => {}
            }
        }
    }
    let status = child
        .wait()
        .map_err(ImageError::io(&script, "wait for the recipe"))?;
    if let Some((prev, t)) = current.take() {
        run.steps.push(StepTiming {
            name: prev,
            seconds: t.elapsed().as_secs_f64(),
        });
    }
    run.success = status.success();
    run.status = status.to_string();
    Ok(run)
}

/// `PATH` with the sbin directories the recipe's tools live in.
fn sbin_path() -> std::ffi::OsString {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
    for d in ["/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/bin", "/bin"] {
        if !dirs.iter().any(|x| x == Path::new(d)) {
            dirs.push(PathBuf::from(d));
        }
    }
    std::env::join_paths(dirs).unwrap_or(path)
}

fn write_manifest(dir: &Path, m: &Manifest) -> Result<(), ImageError> {
    let path = dir.join("manifest.json");
    let text = serde_json::to_vec_pretty(m).map_err(|e| ImageError::Invalid {
        dir: dir.to_path_buf(),
        reason: format!("cannot encode the manifest: {e}"),
    })?;
    super::private_dir::replace_in(dir, "manifest.json", &text)
        .map_err(ImageError::io(&path, "write"))
}

/// Rename the finished build to its id, replacing an old image of the same id
/// (only with `--force`; the caller holds the id's lock exclusively).
fn publish(cache: &Cache, dir: &Path, final_dir: &Path, id: &str) -> Result<(), ImageError> {
    sync_dir(dir);
    if final_dir.exists() {
        let old = cache
            .root()
            .join(format!("{id}.partial-{}-old", std::process::id()));
        std::fs::rename(final_dir, &old)
            .map_err(ImageError::io(final_dir, "move the old image aside"))?;
        std::fs::rename(dir, final_dir).map_err(ImageError::io(final_dir, "publish the image"))?;
        super::cache::remove_tree(&old)?;
    } else {
        std::fs::rename(dir, final_dir).map_err(ImageError::io(final_dir, "publish the image"))?;
    }
    sync_dir(cache.root());
    Ok(())
}

fn sync_dir(dir: &Path) {
    if let Ok(f) = File::open(dir) {
        let _ = f.sync_all();
    }
}

/// The last `n` lines of the log, indented, for an error message.
fn log_tail(path: &Path, n: usize) -> String {
    let Ok(mut f) = OpenOptions::new().read(true).open(path) else {
        return String::new();
    };
    let len = f.seek(SeekFrom::End(0)).unwrap_or(0);
    let start = len.saturating_sub(8192);
    let _ = f.seek(SeekFrom::Start(start));
    let mut buf = Vec::new();
    let _ = f.take(8192).read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|l| format!("    | {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_parse_and_reject_malformed_lines() {
        assert_eq!(
            parse_marker("@@step 2/7 kernel (vmlinux, modules)\n"),
            Marker::Step {
                n: 2,
                of: 7,
                name: "kernel (vmlinux, modules)".into()
            }
        );
        assert_eq!(
            parse_marker("@@info kernel_version=6.12.95+deb12-cloud-amd64"),
            Marker::Info {
                key: "kernel_version".into(),
                value: "6.12.95+deb12-cloud-amd64".into()
            }
        );
        assert_eq!(parse_marker("@@error boom"), Marker::Error("boom".into()));
        for bad in [
            "@@step 8/7 x",
            "@@step 0/7 x",
            "@@step x/7 y",
            "@@step 1/7",
            "@@info =v",
            "@@info a b=c",
        ] {
            assert!(matches!(parse_marker(bad), Marker::Other(_)), "{bad}");
        }
    }

    #[test]
    fn missing_tools_name_packages_and_one_install_line() {
        let dir = tempfile::tempdir().unwrap();
        let missing = missing_tools(dir.path().as_os_str());
        assert_eq!(missing.len(), TOOLS.len());
        let e = missing_tools_error(&missing).to_string();
        assert!(e.contains("mmdebstrap (package mmdebstrap)"), "{e}");
        assert!(e.contains("sudo apt-get install "), "{e}");
        assert!(e.contains("bookworm-backports"), "{e}");
        assert_eq!(
            e.matches("e2fsprogs").count(),
            3,
            "deduplicated in the install line: {e}"
        );
    }

    #[cfg(unix)]
    #[test]
    fn present_tools_are_not_reported() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        for (t, _) in TOOLS {
            let p = dir.path().join(t);
            std::fs::write(&p, b"#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        assert!(missing_tools(dir.path().as_os_str()).is_empty());
        std::fs::set_permissions(
            dir.path().join("zstd"),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        assert_eq!(
            missing_tools(dir.path().as_os_str()),
            vec![("zstd", "zstd")]
        );
    }

    /// A cache on a disk too small for a build is refused before it starts,
    /// naming the cache, its free space and the need.
    #[cfg(unix)]
    #[test]
    fn a_cache_without_room_is_refused_up_front() {
        let d = tempfile::tempdir().unwrap();
        check_space(d.path(), 1).unwrap();
        let e = check_space(d.path(), u64::MAX >> 21).unwrap_err();
        let m = e.to_string();
        assert!(m.contains(&d.path().display().to_string()), "{m}");
        assert!(m.contains("MiB free; a build needs about"), "{m}");
    }
}
