//! Lowering: the resolved policy turned into what one tier's mechanism
//! enforces. Pure functions of ([`Policy`](super::Policy), [`HostFs`](super::HostFs)).

pub mod appcontainer;
pub mod bwrap;
pub mod landlock;
pub mod plan;
pub mod restricted;
pub mod seatbelt;
pub mod vm;

/// Fixtures shared by the golden tests of every lowering (and, with the
/// `testkit` feature, by the tests of the crates that launch them).
#[cfg(any(test, feature = "testkit"))]
#[allow(clippy::unwrap_used, clippy::expect_used)] // test fixtures: a failure is the test's
pub mod testing {
    use std::path::{Path, PathBuf};

    use crate::hostfs::FakeFs;
    use crate::{profiles, resolve, Policy, Vars};

    /// The variables every golden test resolves with.
    pub fn vars() -> Vars {
        Vars {
            project: "/work/proj".into(),
            tmp: "/tmp/hull-runs/ID/tmp".into(),
            spill: "/tmp/hull-runs/ID/spill".into(),
            home: "/home/u".into(),
            runs: "/tmp/hull-runs".into(),
        }
    }

    /// A Debian-like host with merged /usr, a project with a git repo.
    pub fn host() -> FakeFs {
        FakeFs::new()
            .dir("/usr/bin")
            .dir("/usr/lib")
            .symlink("/bin", "usr/bin")
            .symlink("/sbin", "usr/sbin")
            .symlink("/lib", "usr/lib")
            .symlink("/lib64", "usr/lib64")
            .dir("/etc/ssl")
            .file("/etc/shadow")
            .dir("/etc/ssh")
            .dir("/opt")
            .dir("/home/u/.ssh")
            .dir("/home/u/.cargo/registry")
            .dir("/home/u/.rustup")
            .dir("/home/u/.cargo/bin")
            .file("/home/u/.cargo/credentials.toml")
            .dir("/work/proj/src")
            .dir("/work/proj/.git/hooks")
            .file("/work/proj/.git/config")
            .dir("/tmp/hull-runs/ID/tmp")
            .dir("/tmp/hull-runs/ID/spill")
            .dir("/tmp/hull-runs/OTHER/tmp")
    }

    /// Compares `actual` with `crates/hull-policy/tests/golden/NAME`; with
    /// `HULL_BLESS=1` writes it instead. A missing golden file fails.
    pub fn golden(name: &str, actual: &str) {
        golden_in(
            &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden"),
            name,
            actual,
        )
    }

    /// [`golden`] with the golden files in `dir`.
    pub fn golden_in(dir: &Path, name: &str, actual: &str) {
        let path = dir.join(name);
        if std::env::var_os("HULL_BLESS").is_some() {
            std::fs::create_dir_all(path.parent().expect("golden dir")).expect("mkdir golden");
            std::fs::write(&path, actual).expect("write golden");
            return;
        }
        let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "golden file {} missing ({e}); run with HULL_BLESS=1 to create it, then review it",
                path.display()
            )
        });
        assert_eq!(
            expected, actual,
            "lowered output differs from {}; if intended, rerun with HULL_BLESS=1 and review the diff",
            path.display()
        );
    }

    /// Resolves a shipped profile for a Windows host, on any host: resolved
    /// with POSIX stand-ins for `C:\Users\u` (the resolver's path rules are
    /// the host's), then every stand-in path rewritten to its Windows form.
    /// Linux-shaped entries (`/usr`, `/etc/shadow`) stay as they are, which is
    /// what they are on Windows: no Windows path.
    pub fn windows_policy(name: &str) -> Policy {
        let vars = crate::Vars {
            project: "/Users/u/proj".into(),
            tmp: "/Users/u/AppData/Local/Temp/hull-runs/id1/tmp".into(),
            spill: "/Users/u/AppData/Local/Temp/hull-runs/id1/spill".into(),
            home: "/Users/u".into(),
            runs: "/Users/u/AppData/Local/Temp/hull-runs".into(),
        };
        let mut p = resolve(&profiles::load(name).unwrap(), &vars).unwrap();
        let win = |path: &Path| -> std::path::PathBuf {
            let s = path.to_str().unwrap();
            if s.starts_with("/Users/") {
                format!("C:{}", s.replace('/', "\\")).into()
            } else {
                path.to_path_buf()
            }
        };
        for g in &mut p.grants {
            g.path = win(&g.path);
        }
        for pr in &mut p.protects {
            pr.path = win(&pr.path);
        }
        p.vars.project = win(&p.vars.project);
        p.vars.tmp = win(&p.vars.tmp);
        p.vars.spill = win(&p.vars.spill);
        p.vars.home = win(&p.vars.home);
        p.vars.runs = win(&p.vars.runs);
        p
    }

    /// A fake filesystem with macOS's root symlinks and the directories the
    /// golden tests use (`/tmp`, `/var`, `/etc` point into `/private`).
    pub fn mac_test_fs() -> FakeFs {
        FakeFs::new()
            .symlink("/tmp", "private/tmp")
            .symlink("/var", "private/var")
            .symlink("/etc", "private/etc")
            .dir("/private/tmp")
            .dir("/private/etc/ssh")
            .dir("/private/var/folders/xy/T/hull-runs/ID/tmp")
            .dir("/private/var/folders/xy/T/hull-runs/ID/spill")
            .dir("/Users/u/proj")
            .dir("/usr/bin")
    }

    /// The variables hull resolves with on a Mac (`TMPDIR` under `/var/folders`).
    pub fn mac_test_vars() -> Vars {
        Vars {
            project: "/Users/u/proj".into(),
            tmp: "/var/folders/xy/T/hull-runs/ID/tmp".into(),
            spill: "/var/folders/xy/T/hull-runs/ID/spill".into(),
            home: "/Users/u".into(),
            runs: "/var/folders/xy/T/hull-runs".into(),
        }
    }
}
