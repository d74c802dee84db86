//! Tier 2 on macOS: `/usr/bin/sandbox-exec` with the profile
//! [`lower`](crate::policy::lower::seatbelt::lower) generates.
//!
//! The launcher canonicalizes the policy first (Seatbelt matches real paths:
//! `/tmp`, `/var` and `/etc` are symlinks to `/private/...` on macOS), lowers
//! it, checks that the profile loads, and returns the `sandbox-exec` command
//! for the shared executor to spawn. The binary is always the absolute
//! `/usr/bin/sandbox-exec`, never one found on `PATH`. A profile that does not
//! load is an error ([`SeatbeltError::ProfileRejected`]); nothing reruns the
//! command without it.
//!
//! What this protects against: everything the profile refuses (see the
//! lowering's module docs), for the command and every process it starts
//! (Seatbelt is inherited across fork and exec and cannot be lifted).
//! What it does not: Apple marks `sandbox-exec` deprecated; it still ships
//! and works on current macOS, and the probe says when it does not. The
//! profile is checked by golden tests on Linux; running it is verified only
//! on a Mac (the probe and the escape suite there).

use std::ffi::OsString;
use std::path::Path;
use std::process::Command;

use crate::exec::CommandSpec;
pub use crate::policy::lower::seatbelt::{canonical_path, canonicalize, CanonicalError};
use crate::policy::lower::seatbelt::{lower, SeatbeltProfile};
use crate::policy::{HostFs, Policy};
#[cfg(target_os = "macos")]
use crate::probe::Helper;
use crate::probe::Probe;
use crate::Tier;

/// The only `sandbox-exec` hull runs.
pub const SANDBOX_EXEC: &str = "/usr/bin/sandbox-exec";

/// Errors of the seatbelt tier. Each names the tier and the missing piece.
#[derive(Debug, thiserror::Error)]
pub enum SeatbeltError {
    #[error("tier seatbelt needs macOS (this is {os})")]
    WrongOs { os: &'static str },
    #[error("tier seatbelt: {SANDBOX_EXEC} is missing or not executable: {source}")]
    Missing {
        #[source]
        source: std::io::Error,
    },
    #[error("tier seatbelt: the profile for policy {policy:?} did not load; the command was not run: {stderr}")]
    ProfileRejected { policy: String, stderr: String },
    #[error(transparent)]
    Canonical(#[from] CanonicalError),
    #[error("tier seatbelt: empty command")]
    EmptyCommand,
}

/// Probes the tier: `sandbox-exec` exists at its absolute path and applies a
/// trivial profile. On another OS: "needs macOS".
pub fn probe() -> Probe {
    #[cfg(target_os = "macos")]
    {
        imp::probe()
    }
    #[cfg(not(target_os = "macos"))]
    {
        Probe::wrong_os(Tier::Seatbelt)
    }
}

/// The `sandbox-exec` command that runs `spec` under `policy`, for the shared
/// executor to spawn (it streams, times out and kills). The environment is
/// exactly `spec.env`; the working directory is `spec.cwd`, canonicalized.
pub fn launch(policy: &Policy, spec: &CommandSpec) -> Result<Command, SeatbeltError> {
    #[cfg(not(target_os = "macos"))]
    {
        let _ = (policy, spec);
        Err(SeatbeltError::WrongOs {
            os: crate::Os::current().map_or("unknown", |o| o.as_str()),
        })
    }
    #[cfg(target_os = "macos")]
    {
        let fs = crate::policy::RealFs;
        let canonical = canonicalize(policy, &fs)?;
        let profile = lower(&canonical, None);
        imp::check_loads(&canonical.name, &profile)?;
        let cwd = canonical_path(&spec.cwd, &fs)?;
        command(&profile, spec, &cwd)
    }
}

/// The profile `launch` would use, for `hull policy explain --tier seatbelt`
/// (canonicalized against this host's filesystem).
pub fn explain(policy: &Policy, fs: &dyn HostFs) -> Result<SeatbeltProfile, SeatbeltError> {
    Ok(lower(&canonicalize(policy, fs)?, None))
}

/// `sandbox-exec -p PROFILE -D K=V ... -- argv`, with a clean environment.
pub fn command(
    profile: &SeatbeltProfile,
    spec: &CommandSpec,
    cwd: &Path,
) -> Result<Command, SeatbeltError> {
    if spec.argv.is_empty() {
        return Err(SeatbeltError::EmptyCommand);
    }
    let mut c = Command::new(SANDBOX_EXEC);
    c.args(sandbox_exec_args(profile, &spec.argv));
    c.env_clear();
    c.envs(spec.env.iter().map(|(k, v)| (k, v)));
    c.current_dir(cwd);
    Ok(c)
}

/// The arguments after `sandbox-exec`: `-p TEXT`, the `-D` pairs, `--`, argv.
pub fn sandbox_exec_args(profile: &SeatbeltProfile, argv: &[OsString]) -> Vec<OsString> {
    let mut a: Vec<OsString> = vec!["-p".into(), profile.text.clone().into()];
    a.extend(profile.d_args());
    a.push("--".into());
    a.extend(argv.iter().cloned());
    a
}

#[cfg(target_os = "macos")]
mod imp {
    use std::process::{Command, Stdio};

    use super::*;

    pub fn probe() -> Probe {
        let path = Path::new(SANDBOX_EXEC);
        if let Err(e) = std::fs::metadata(path) {
            return Probe::unavailable(Tier::Seatbelt, format!("{SANDBOX_EXEC} is missing: {e}"));
        }
        let out = Command::new(SANDBOX_EXEC)
            .args(["-p", "(version 1)(allow default)", "/usr/bin/true"])
            .env_clear()
            .stdin(Stdio::null())
            .output();
        match out {
            Ok(o) if o.status.success() => Probe::available(
                Tier::Seatbelt,
                format!("{SANDBOX_EXEC} applies profiles"),
                vec![Helper {
                    name: "sandbox-exec".into(),
                    path: SANDBOX_EXEC.into(),
                    version: "system".into(),
                }],
            ),
            Ok(o) => Probe::unavailable(
                Tier::Seatbelt,
                format!(
                    "{SANDBOX_EXEC} cannot apply a trivial profile ({}): {}",
                    o.status,
                    String::from_utf8_lossy(&o.stderr).trim()
                ),
            ),
            Err(e) => Probe::unavailable(Tier::Seatbelt, format!("cannot run {SANDBOX_EXEC}: {e}")),
        }
    }

    /// Compiles and applies the profile once with `/usr/bin/true` (allowed
    /// for this check only), so a profile that does not load is an error
    /// before the command is started, never a silent non-run.
    pub fn check_loads(policy: &str, profile: &SeatbeltProfile) -> Result<(), SeatbeltError> {
        let mut check = profile.clone();
        check.text.push_str(
            "(allow process-exec file-read* file-map-executable (literal \"/usr/bin/true\"))\n",
        );
        let out = Command::new(SANDBOX_EXEC)
            .args(sandbox_exec_args(&check, &["/usr/bin/true".into()]))
            .env_clear()
            .current_dir("/")
            .stdin(Stdio::null())
            .output()
            .map_err(|source| SeatbeltError::Missing { source })?;
        if out.status.success() {
            Ok(())
        } else {
            Err(SeatbeltError::ProfileRejected {
                policy: policy.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::hostfs::FakeFs;
    use crate::policy::lower::testing::{mac_test_fs, mac_test_vars};
    use std::path::PathBuf;

    #[test]
    fn root_symlinks_resolve_to_private() {
        let fs = mac_test_fs();
        let c = |p: &str| canonical_path(Path::new(p), &fs).unwrap();
        assert_eq!(c("/tmp/x"), PathBuf::from("/private/tmp/x"));
        assert_eq!(
            c("/var/folders/xy/T/hull-runs/ID/tmp"),
            PathBuf::from("/private/var/folders/xy/T/hull-runs/ID/tmp")
        );
        assert_eq!(c("/etc/ssh"), PathBuf::from("/private/etc/ssh"));
        // a missing tail is kept as written
        assert_eq!(
            c("/Users/u/proj/.hull"),
            PathBuf::from("/Users/u/proj/.hull")
        );
        assert_eq!(c("/usr/bin"), PathBuf::from("/usr/bin"));
    }

    #[test]
    fn symlink_loops_are_errors() {
        let fs = FakeFs::new().symlink("/a", "/b").symlink("/b", "/a");
        assert!(matches!(
            canonical_path(Path::new("/a/x"), &fs),
            Err(CanonicalError::SymlinkLoop { .. })
        ));
    }

    /// The same resolution on the real filesystem, with real symlinks.
    #[cfg(unix)]
    #[test]
    fn canonical_path_matches_the_kernel_on_real_symlinks() {
        let d = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(d.path()).unwrap();
        std::fs::create_dir_all(root.join("private/tmp/run")).unwrap();
        std::os::unix::fs::symlink("private/tmp", root.join("tmp")).unwrap();
        std::os::unix::fs::symlink("../tmp/run", root.join("private/rel")).unwrap();
        for p in ["tmp/run", "private/rel", "tmp/run/missing/deeper"] {
            let got = canonical_path(&root.join(p), &crate::policy::RealFs).unwrap();
            let existing = got
                .ancestors()
                .find(|a| a.exists())
                .map(|a| std::fs::canonicalize(a).unwrap())
                .unwrap();
            assert!(got.starts_with(&existing), "{p}: {got:?} vs {existing:?}");
            assert!(
                got.starts_with(root.join("private/tmp/run")),
                "{p}: {got:?}"
            );
        }
    }

    #[test]
    fn protected_symlinks_are_protected_by_name_and_by_target() {
        use crate::policy::{profiles, resolve};
        let vars = mac_test_vars();
        let pol = resolve(&profiles::load("default").unwrap(), &vars).unwrap();
        let fs = mac_test_fs().symlink("/Users/u/proj/.hull", "/Users/u/elsewhere");
        let c = canonicalize(&pol, &fs).unwrap();
        let prot: Vec<_> = c
            .protects
            .iter()
            .map(|p| p.path.to_str().unwrap())
            .collect();
        assert!(prot.contains(&"/Users/u/proj/.hull"), "{prot:?}");
        assert!(prot.contains(&"/Users/u/elsewhere"), "{prot:?}");
        assert!(prot.contains(&"/private/etc/ssh"), "{prot:?}");
        assert!(
            prot.contains(&"/private/var/folders/xy/T/hull-runs"),
            "{prot:?}"
        );
        let grants: Vec<_> = c.grants.iter().map(|g| g.path.to_str().unwrap()).collect();
        assert!(grants.contains(&"/private/etc"), "{grants:?}");
        assert!(grants.contains(&"/etc"), "the link itself: {grants:?}");
        // a granted symlink is never writable as a link: the project may be
        // a symlink, and replacing it would plant a new project (and .hull)
        let fs = mac_test_fs()
            .symlink("/Users/u/link", "/Users/u/proj")
            .dir("/Users/u/proj");
        let mut p2 = pol.clone();
        p2.grants.push(crate::policy::Grant {
            path: "/Users/u/link".into(),
            access: crate::policy::Access::ReadWrite,
            origin: crate::policy::GrantOrigin::Policy,
        });
        let c2 = canonicalize(&p2, &fs).unwrap();
        let link = c2
            .grants
            .iter()
            .find(|g| g.path == Path::new("/Users/u/link"))
            .unwrap();
        assert_eq!(link.access, crate::policy::Access::Read);
        assert!(grants.contains(&"/private/var/folders/xy/T/hull-runs/ID/tmp"));
        assert_eq!(
            c.vars.runs,
            PathBuf::from("/private/var/folders/xy/T/hull-runs")
        );
    }

    #[test]
    fn command_uses_the_absolute_binary_and_params_not_splicing() {
        let profile = SeatbeltProfile {
            text: "(version 1)(deny default)(allow file-read* (subpath (param \"GRANT_0\")))"
                .into(),
            params: vec![("GRANT_0".into(), "/Users/u/proj dir".into())],
        };
        let spec = CommandSpec {
            argv: vec!["/bin/sh".into(), "-c".into(), "echo hi".into()],
            cwd: "/Users/u/proj dir".into(),
            env: vec![("PATH".into(), "/usr/bin:/bin".into())],
            timeout: None,
            user: None,
        };
        let c = command(&profile, &spec, Path::new("/Users/u/proj dir")).unwrap();
        assert_eq!(c.get_program(), SANDBOX_EXEC);
        let args: Vec<_> = c.get_args().map(|a| a.to_str().unwrap()).collect();
        assert_eq!(
            args,
            [
                "-p",
                profile.text.as_str(),
                "-D",
                "GRANT_0=/Users/u/proj dir",
                "--",
                "/bin/sh",
                "-c",
                "echo hi"
            ]
        );
        let envs: Vec<_> = c.get_envs().collect();
        assert_eq!(envs.len(), 1);
        let empty = CommandSpec {
            argv: vec![],
            ..spec
        };
        assert!(matches!(
            command(&profile, &empty, Path::new("/")),
            Err(SeatbeltError::EmptyCommand)
        ));
    }

    #[cfg(not(target_os = "macos"))]
    #[test]
    fn off_macos_the_probe_says_needs_macos_and_launch_refuses() {
        let p = probe();
        assert!(!p.available);
        assert_eq!(p.reason, "needs macOS");
        let pol = crate::policy::resolve(
            &crate::policy::profiles::load("default").unwrap(),
            &crate::policy::Vars {
                project: "/p".into(),
                tmp: "/r/ID/tmp".into(),
                spill: "/r/ID/spill".into(),
                home: "/h".into(),
                runs: "/r".into(),
            },
        )
        .unwrap();
        let spec = CommandSpec {
            argv: vec!["/bin/true".into()],
            cwd: "/p".into(),
            env: vec![],
            timeout: None,
            user: None,
        };
        let e = launch(&pol, &spec).unwrap_err();
        assert!(e.to_string().contains("needs macOS"), "{e}");
    }
}
