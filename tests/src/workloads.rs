//! The sources of the real workloads (`tests/tests/workloads.rs`), fetched
//! once from the package registries and the Debian mirror this machine
//! uses, and cached under `$XDG_CACHE_HOME/hull-tests/workloads` (else
//! `~/.cache/...`): a test copies its workload from there into its project,
//! so the runs themselves need no network. Every fetch is pinned (a Debian
//! source package authenticated by apt, an sdist by its sha256, npm
//! packages by the lock file's integrity hashes, crates by Cargo.lock).
//! A lock file serialises the test processes that fill the cache.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::copy_tree;

/// `$XDG_CACHE_HOME/hull-tests/workloads`, else `~/.cache/...`.
pub fn cache_root() -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .expect("XDG_CACHE_HOME or HOME");
    cache.join("hull-tests/workloads")
}

/// The fixtures of this crate.
fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name)
}

/// `cache_root()/name`, made once: `fill(scratch, out)` creates the tree
/// `out` (its scratch directory is removed after), which is then renamed
/// into place, so a half-made tree is never used.
fn cached(name: &str, fill: impl FnOnce(&Path, &Path)) -> PathBuf {
    let root = cache_root();
    let dir = root.join(name);
    if dir.is_dir() {
        return dir;
    }
    std::fs::create_dir_all(&root).expect("create the workload cache");
    let lock = std::fs::File::create(root.join(format!("{name}.lock"))).expect("lock file");
    lock.lock().expect("lock the workload cache");
    if !dir.is_dir() {
        let scratch = root.join(format!("{name}.tmp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&scratch);
        std::fs::create_dir_all(&scratch).expect("scratch dir");
        let out = scratch.join("out");
        fill(&scratch, &out);
        std::fs::rename(&out, &dir).expect("move the workload into the cache");
        let _ = std::fs::remove_dir_all(&scratch);
    }
    dir
}

/// `program` under `timeout secs`: a setup step never hangs a test.
fn timed(secs: u32, program: &str) -> Command {
    let mut c = Command::new("timeout");
    c.arg(secs.to_string()).arg(program);
    c
}

/// Runs a setup command to completion (stdin empty), and fails naming
/// `what` with its output unless it succeeds.
fn setup(what: &str, cmd: &mut Command) {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{what} (the test setup fetches each workload once): {cmd:?} exited {:?}\n{}\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The Debian source package `zlib` of bookworm, unpacked by dpkg-source
/// (upstream tarball and Debian's changes), copied into `dest`. apt fetches
/// it from the mirror of the host's own apt sources, through a private
/// sources list and state (the host's apt is left alone), checking the
/// files against the signed Sources index.
pub fn zlib(dest: &Path) {
    let tree = cached("zlib-bookworm", |scratch, out| {
        let helper = Path::new(env!("CARGO_MANIFEST_DIR")).join("../images/apt-mirror.sh");
        let o = Command::new("bash")
            .arg("-c")
            .arg(". \"$0\" && host_apt_uri bookworm")
            .arg(&helper)
            .output()
            .expect("run images/apt-mirror.sh");
        let mirror = String::from_utf8_lossy(&o.stdout).trim().to_string();
        assert!(
            !mirror.is_empty(),
            "no apt source of this host serves Debian bookworm (looked in /etc/apt): \
             the zlib workload's source package comes from the host's mirror"
        );
        let apt = scratch.join("apt");
        for d in ["lists/partial", "cache/archives/partial", "dl"] {
            std::fs::create_dir_all(apt.join(d)).expect("mkdir");
        }
        std::fs::write(
            apt.join("sources.list"),
            format!("deb-src {mirror} bookworm main\n"),
        )
        .expect("write sources.list");
        let opts = |c: &mut Command| {
            c.args([
                "-q",
                "-o",
                "APT::Sandbox::User=root",
                "-o",
                "Debug::NoLocking=1",
            ])
            .arg("-o")
            .arg(format!(
                "Dir::Etc::SourceList={}",
                apt.join("sources.list").display()
            ))
            .args(["-o", "Dir::Etc::SourceParts=/nonexistent"])
            .arg("-o")
            .arg(format!("Dir::State::Lists={}", apt.join("lists").display()))
            .arg("-o")
            .arg(format!("Dir::Cache={}", apt.join("cache").display()));
        };
        let mut update = timed(300, "apt-get");
        opts(&mut update);
        setup("apt-get update (deb-src)", update.arg("update"));
        let mut source = timed(300, "apt-get");
        opts(&mut source);
        setup(
            "apt-get source zlib",
            source
                .args(["source", "--download-only", "zlib"])
                .current_dir(apt.join("dl")),
        );
        let dsc = std::fs::read_dir(apt.join("dl"))
            .expect("read dl")
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|e| e == "dsc"))
            .expect("apt-get source left a .dsc");
        setup(
            "dpkg-source -x",
            timed(120, "dpkg-source").arg("-x").arg(&dsc).arg(out),
        );
    });
    copy_tree(&tree, dest);
}

/// The sdist of `idna` 3.7 (a pure-Python package whose sdist carries its
/// own unittest suite and data), by its sha256, unpacked into `dest`.
pub fn idna(dest: &Path) {
    const REQ: &str = "idna==3.7 \
        --hash=sha256:028ff3aadf0609c1fd278d8ea3089299412a7a8b9bd005dd08b9f8285bcb5cfc\n";
    let tree = cached("idna-3.7", |scratch, out| {
        std::fs::write(scratch.join("req.txt"), REQ).expect("write req.txt");
        setup(
            "pip download idna",
            timed(300, "python3")
                .args([
                    "-m",
                    "pip",
                    "download",
                    "-q",
                    "--no-deps",
                    "--no-binary",
                    ":all:",
                ])
                .args(["--require-hashes", "-r", "req.txt", "-d", "dl"])
                .current_dir(scratch),
        );
        setup(
            "unpack idna",
            timed(60, "tar")
                .args(["xzf", "dl/idna-3.7.tar.gz"])
                .current_dir(scratch),
        );
        std::fs::rename(scratch.join("idna-3.7"), out).expect("rename");
    });
    copy_tree(&tree, dest);
}

/// `tests/fixtures/workloads/node` (a project that bundles its code with
/// esbuild) with its dependencies installed by `npm ci --ignore-scripts`
/// from the lock file: esbuild's own postinstall script has not run (its
/// `bin/esbuild` is still the JavaScript launcher); `npm rebuild` runs it.
pub fn node(dest: &Path) {
    let src = fixture("workloads/node");
    let tree = cached("node-esbuild-0.19.12", |_, out| {
        copy_tree(&src, out);
        setup(
            "npm ci --ignore-scripts",
            timed(300, "npm")
                .args(["ci", "--ignore-scripts", "--no-audit", "--no-fund"])
                .current_dir(out),
        );
    });
    copy_tree(&tree, dest);
}

/// `tests/fixtures/c-build-crate` (a crate whose build script compiles C
/// with `cc`) in `dest` with its dependencies vendored into `dest/vendor/`,
/// ready for `cargo build --offline`. The vendored sources are fetched once
/// from the registry cargo is configured with, at the versions the
/// fixture's Cargo.lock pins (the cache is keyed by that lock file).
pub fn rust_crate(dest: &Path) {
    use std::hash::{Hash, Hasher};
    let src = fixture("c-build-crate");
    let lockfile = std::fs::read(src.join("Cargo.lock")).expect("the fixture's Cargo.lock");
    let mut h = std::collections::hash_map::DefaultHasher::new();
    lockfile.hash(&mut h);
    let vendor = cached(
        &format!("c-build-crate-vendor-{:016x}", h.finish()),
        |scratch, out| {
            let tmp = scratch.join("crate");
            copy_tree(&src, &tmp);
            // Without the vendored-sources config: `vendor/` is not there yet.
            std::fs::remove_dir_all(tmp.join(".cargo")).expect("rm .cargo");
            setup(
                "cargo vendor",
                timed(300, "cargo")
                    .args(["vendor", "--locked", "--versioned-dirs", "vendor"])
                    .current_dir(&tmp),
            );
            std::fs::rename(tmp.join("vendor"), out).expect("move vendor/");
        },
    );
    copy_tree(&src, dest);
    copy_tree(&vendor, &dest.join("vendor"));
}
