//! Lowering: the resolved policy turned into what one tier's mechanism
//! enforces. Pure functions of ([`Policy`](super::Policy), [`HostFs`](super::HostFs)).

pub mod appcontainer;
pub mod bwrap;
pub mod landlock;
pub mod plan;
pub mod restricted;
pub mod seatbelt;
pub mod vm;

/// Fixtures shared by the golden tests of every lowering.
#[cfg(test)]
pub mod testing {
    use std::path::PathBuf;

    use crate::policy::hostfs::FakeFs;
    use crate::policy::Vars;

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

    /// Compares `actual` with `orchestrator/tests/golden/NAME`; with
    /// `HULL_BLESS=1` writes it instead. A missing golden file fails.
    pub fn golden(name: &str, actual: &str) {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/golden")
            .join(name);
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
}
