#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]
// The escape matrix and the end-to-end tests drive the Linux tiers (bubblewrap,
// Landlock, tier 3 on QEMU): off Linux this crate is empty, and type-checks.
#![cfg(target_os = "linux")]
// Test code: a failed expectation is a failed test.
//! Real workloads, run natively and on every tier compiled in (landlock,
//! bwrap, and tier 3 with the `tier3` feature), each asserting the same
//! exit status and the same key output as the native run: a Debian source
//! package's configure, make and its own tests (zlib); a Python package's
//! own test suite (idna); a Node project whose dependency's postinstall
//! script runs inside, by `npm rebuild` (esbuild); a Rust crate with a
//! vendored dependency and a C build script (`cargo build --offline`).
//!
//! The sources are fetched once by the test setup and cached
//! (`hull_tests::workloads`); the runs have no network (`[net] mode =
//! "none"`, the default profile's), and the native run uses none.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use hull_tests::{require_tier, show, workloads, World};

/// How a workload runs: its script, its policy's additions to the default
/// profile, and what it must print.
struct Workload {
    /// The shell script, run in the project. It prints the key output on
    /// stdout (build logs go to files, shown on stderr when it fails).
    script: &'static str,
    /// `[env.set]` entries (`${TMP}` is the run's private directory).
    env: Vec<(&'static str, String)>,
    /// Host variables passed besides the default profile's.
    pass: Vec<&'static str>,
    /// Directories granted read+exec besides the default profile's.
    read_exec: Vec<PathBuf>,
    /// The container userland of `tests/fixtures/vm-userland.toml` (node,
    /// npm) on tier 3, instead of the default one.
    vm_userland: bool,
    /// The `--timeout` of a tier-3 run, in seconds (TCG emulation here);
    /// the native tiers get 50 s, inside the test runner's minute.
    vm_secs: u32,
    /// Exactly what the script prints on stdout, on every tier.
    expect: &'static str,
}

/// The system's own programs first: the host's PATH may start with a
/// per-user shim (pyenv's python3) that is not granted.
const SYSTEM_PATH: &str = "/usr/bin:/bin";

impl Workload {
    /// The default profile with this workload's additions.
    fn policy(&self) -> String {
        let mut text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../policies/default.toml"
        ))
        .expect("policies/default.toml");
        let mut grants = String::new();
        for d in &self.read_exec {
            grants.push_str(&format!("{:?}, ", d.to_str().expect("utf8")));
        }
        let mut pass = String::new();
        for p in &self.pass {
            pass.push_str(&format!("{p:?}, "));
        }
        text = text
            .replace("read_exec = [", &format!("read_exec = [{grants}"))
            .replace("pass = [", &format!("pass = [{pass}"))
            .replace("memory = \"4GiB\"", "memory = \"2GiB\"");
        assert!(
            text.trim_end().ends_with("HOME = \"${TMP}\""),
            "policies/default.toml no longer ends with its [env.set]: {text}"
        );
        text.push('\n');
        for (k, v) in self.env_set() {
            text.push_str(&format!("{k} = {v:?}\n"));
        }
        if self.vm_userland {
            let userland = std::fs::read_to_string(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/fixtures/vm-userland.toml"
            ))
            .expect("tests/fixtures/vm-userland.toml");
            let vm = userland
                .find("\n[vm]")
                .expect("vm-userland.toml has a [vm] section");
            text.push('\n');
            text.push_str(&userland[vm..]);
        }
        text
    }

    /// `[env.set]` beyond HOME: PATH unless the workload sets its own.
    fn env_set(&self) -> Vec<(&'static str, String)> {
        let mut set = self.env.clone();
        if !set.iter().any(|(k, _)| *k == "PATH") {
            set.push(("PATH", SYSTEM_PATH.to_string()));
        }
        set
    }

    /// Runs the workload in `w`'s project on `tier` (`native`: plain `sh`,
    /// no hull, with the environment the policy gives the command).
    fn run(&self, w: &World, tier: &str) -> Output {
        if tier == "native" {
            return self.native(w);
        }
        require_tier(tier);
        let pol = w.root.path().join("workload.toml");
        std::fs::write(&pol, self.policy()).expect("write policy");
        let secs = if tier == "vm" {
            format!("{}s", self.vm_secs)
        } else {
            "50s".to_string()
        };
        w.run(
            tier,
            &["--policy", pol.to_str().expect("utf8"), "--timeout", &secs],
            self.script,
        )
    }

    fn native(&self, w: &World) -> Output {
        let tmp = w.root.path().join("native-tmp");
        std::fs::create_dir_all(&tmp).expect("mkdir");
        let tmp_s = tmp.to_str().expect("utf8");
        let mut c = Command::new("timeout");
        c.args(["50", "sh", "-c", self.script])
            .current_dir(&w.project)
            .env_clear();
        let default_pass = [
            "LANG", "LC_ALL", "LC_CTYPE", "TERM", "TZ", "USER", "LOGNAME",
        ];
        for k in default_pass.iter().chain(self.pass.iter()) {
            if let Some(v) = std::env::var_os(k) {
                c.env(k, v);
            }
        }
        c.env("HOME", &tmp).env("TMPDIR", &tmp);
        for (k, v) in self.env_set() {
            c.env(k, v.replace("${TMP}", tmp_s));
        }
        c.stdin(Stdio::null()).output().expect("run sh")
    }
}

/// Runs `wl` on `tier` and asserts exit 0 and exactly the expected output.
fn check(wl: &Workload, w: &World, tier: &str) {
    let o = wl.run(w, tier);
    assert_eq!(o.status.code(), Some(0), "{tier}: {}", show(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        wl.expect,
        "{tier}: {}",
        show(&o)
    );
}

/// A Debian source package (bookworm's zlib, upstream plus Debian's
/// changes): its own configure, a parallel make, and its own test suite
/// (`make test` builds and runs the example and minigzip programs). The
/// static library lands in the project.
fn a_debian_source_package_configures_builds_and_passes_its_tests(t: &str) {
    let w = World::new();
    workloads::zlib(&w.project);
    let wl = Workload {
        script: "./configure --static >build.log 2>&1 && make -j\"$(nproc)\" >>build.log 2>&1 \
                 && make test >test.log 2>&1; rc=$?; \
                 [ $rc -eq 0 ] || tail -n 40 build.log test.log >&2; \
                 grep 'zlib.*test OK' test.log; exit $rc",
        env: vec![],
        pass: vec![],
        read_exec: vec![],
        vm_userland: false,
        vm_secs: 200,
        expect: "\t\t*** zlib test OK ***\n\t\t*** zlib 64-bit test OK ***\n",
    };
    assert!(!w.project.join("libz.a").exists());
    check(&wl, &w, t);
    assert!(w.project.join("libz.a").is_file(), "libz.a did not land");
}

/// A Python package's own test suite (idna 3.7's unittest suite, 6256
/// tests, with the Unicode test data it ships), by the system's python3.
fn a_python_package_passes_its_own_test_suite(t: &str) {
    let w = World::new();
    workloads::idna(&w.project);
    let wl = Workload {
        script: "python3 -m unittest discover -s tests -t . 2>test.log; rc=$?; \
                 sed -n 's/^\\(Ran [0-9]* tests\\) in .*/\\1/p; /^OK/p; /^FAILED/p' test.log; \
                 [ $rc -eq 0 ] || tail -n 40 test.log >&2; exit $rc",
        env: vec![],
        pass: vec![],
        read_exec: vec![],
        vm_userland: false,
        vm_secs: 150,
        expect: "Ran 6256 tests\nOK\n",
    };
    check(&wl, &w, t);
}

/// A Node project whose dependency (esbuild) has a postinstall script: the
/// dependencies were installed with `--ignore-scripts` outside, and
/// `npm rebuild` runs the script inside. The script's effect is the proof
/// it ran: it replaces the JavaScript launcher `bin/esbuild` with the
/// native binary (so the file starts with ELF afterwards, on the host too);
/// then esbuild bundles the project and node runs the bundle.
fn a_node_project_s_postinstall_script_runs_by_npm_rebuild(t: &str) {
    let w = World::new();
    workloads::node(&w.project);
    let launcher = w.project.join("node_modules/esbuild/bin/esbuild");
    let head = |p: &Path| {
        let b = std::fs::read(p).expect("read bin/esbuild");
        b[..4.min(b.len())].to_vec()
    };
    assert_eq!(head(&launcher), b"#!/u", "installed without its scripts");
    let wl = Workload {
        script: "npm rebuild --foreground-scripts >rebuild.log 2>&1 \
                 || { cat rebuild.log >&2; exit 1; }; \
                 printf 'bin/esbuild: '; head -c 4 node_modules/esbuild/bin/esbuild | tail -c 3; echo; \
                 ./node_modules/.bin/esbuild --version && \
                 ./node_modules/.bin/esbuild src/app.js --bundle --platform=node \
                 --log-level=warning --outfile=dist/app.js && node dist/app.js",
        env: vec![],
        pass: vec![],
        read_exec: vec![],
        vm_userland: true,
        vm_secs: 200,
        expect: "bin/esbuild: ELF\n0.19.12\nhello hull from a bundle\n",
    };
    check(&wl, &w, t);
    assert_eq!(
        head(&launcher),
        b"\x7fELF",
        "the postinstall's binary landed"
    );
    assert!(w.project.join("dist/app.js").is_file());
}

/// A crate whose build script compiles C (the compiler and `ar` as
/// grandchildren) with a vendored dependency builds offline with the
/// host's Rust toolchain, granted read+exec as the build profile grants
/// it, and the program runs; `target/` lands in the project.
fn a_rust_crate_with_a_c_build_script_builds_offline(t: &str) {
    let w = World::new();
    w.git_init();
    workloads::rust_crate(&w.project);
    let (rustup, cargo) = hull_tests::host_rust();
    let bin = cargo.join("bin");
    let wl = Workload {
        script: "cargo build --offline -q && ./target/debug/cbuild",
        env: vec![
            ("RUSTUP_HOME", rustup.to_str().expect("utf8").to_string()),
            ("CARGO_HOME", "${TMP}/cargo".to_string()),
            ("PATH", format!("{}:{SYSTEM_PATH}", bin.display())),
        ],
        pass: vec!["RUSTUP_TOOLCHAIN"],
        read_exec: vec![rustup.clone(), bin.clone()],
        vm_userland: false,
        // rustc emulated: about 100 s under TCG.
        vm_secs: 260,
        expect: "hello from C: 42\n",
    };
    check(&wl, &w, t);
    assert!(w.project.join("target/debug/cbuild").is_file());
}

macro_rules! tiers {
    ($($case:ident),* $(,)?) => {
        mod native { $( #[test] fn $case() { super::$case("native") } )* }
        #[cfg(feature = "landlock")]
        mod landlock { $( #[test] fn $case() { super::$case("landlock") } )* }
        #[cfg(feature = "bwrap")]
        mod bwrap { $( #[test] fn $case() { super::$case("bwrap") } )* }
        #[cfg(feature = "tier3")]
        mod vm { $( #[test] fn $case() { super::$case("vm") } )* }
    };
}

tiers!(
    a_debian_source_package_configures_builds_and_passes_its_tests,
    a_python_package_passes_its_own_test_suite,
    a_node_project_s_postinstall_script_runs_by_npm_rebuild,
    a_rust_crate_with_a_c_build_script_builds_offline,
);
