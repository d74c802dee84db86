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
use std::path::{Component, Path, PathBuf};
use std::process::Command;

use crate::exec::CommandSpec;
use crate::policy::lower::seatbelt::{lower, SeatbeltProfile};
use crate::policy::{HostFs, NodeKind, Policy, Protect};
#[cfg(target_os = "macos")]
use crate::tier::probe::Helper;
use crate::tier::probe::Probe;
use crate::tier::Tier;

/// The only `sandbox-exec` hull runs.
pub const SANDBOX_EXEC: &str = "/usr/bin/sandbox-exec";

/// Symlinks followed before giving up (the kernel's `MAXSYMLINKS` is 32).
const MAX_SYMLINKS: usize = 32;

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
    #[error("tier seatbelt: cannot canonicalize {path}: too many levels of symlinks")]
    SymlinkLoop { path: PathBuf },
    #[error("tier seatbelt: path {path} is not absolute")]
    NotAbsolute { path: PathBuf },
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
            os: crate::tier::Os::current().map_or("unknown", |o| o.as_str()),
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

/// The policy with every path resolved as macOS resolves it: each grant to
/// its real path (and, when the granted path is itself a symlink, the link
/// read-only, for `lstat` and `readlink`); each protection at its real parent with
/// its own name kept (so a symlink there cannot be replaced), plus its real
/// target when it is a symlink. Pure over `fs`.
pub fn canonicalize(policy: &Policy, fs: &dyn HostFs) -> Result<Policy, SeatbeltError> {
    let mut out = policy.clone();
    out.grants.clear();
    for g in &policy.grants {
        let real = canonical_path(&g.path, fs)?;
        let mut push = |path: PathBuf, access| {
            if !out.grants.iter().any(|x| x.path == path) {
                let mut n = g.clone();
                n.path = path;
                n.access = access;
                out.grants.push(n);
            }
        };
        push(real.clone(), g.access);
        // A granted path that is itself a symlink: the link is readable (lstat,
        // readlink) but never writable, or the command could replace the link
        // and plant a directory (with a `.hull/`) where hull looks next time.
        let written = canonical_parent(&g.path, fs)?;
        if written != real {
            push(written, crate::policy::Access::Read);
        }
    }
    out.protects.clear();
    for p in &policy.protects {
        let named = canonical_parent(&p.path, fs)?;
        let real = canonical_path(&p.path, fs)?;
        let mut add = |path: PathBuf| {
            if !out.protects.iter().any(|x| x.path == path) {
                out.protects.push(Protect {
                    path,
                    protection: p.protection,
                    reason: p.reason.clone(),
                });
            }
        };
        add(named.clone());
        if real != named {
            add(real);
        }
    }
    out.protects.sort_by(|a, b| a.path.cmp(&b.path));
    let v = &policy.vars;
    out.vars.project = canonical_path(&v.project, fs)?;
    out.vars.tmp = canonical_path(&v.tmp, fs)?;
    out.vars.spill = canonical_path(&v.spill, fs)?;
    out.vars.home = canonical_path(&v.home, fs)?;
    out.vars.runs = canonical_path(&v.runs, fs)?;
    Ok(out)
}

/// The parent resolved, the final name kept as written.
fn canonical_parent(path: &Path, fs: &dyn HostFs) -> Result<PathBuf, SeatbeltError> {
    match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) => Ok(canonical_path(parent, fs)?.join(name)),
        _ => canonical_path(path, fs),
    }
}

/// `realpath` over [`HostFs`]: symlinks in every component are followed;
/// the part of the path that does not exist yet is appended as written.
pub fn canonical_path(path: &Path, fs: &dyn HostFs) -> Result<PathBuf, SeatbeltError> {
    if !path.is_absolute() {
        return Err(SeatbeltError::NotAbsolute {
            path: path.to_path_buf(),
        });
    }
    let mut pending: Vec<OsString> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some("..".into()),
            _ => None,
        })
        .rev()
        .collect();
    let mut out = PathBuf::from("/");
    let mut links = 0;
    let mut missing = false;
    while let Some(c) = pending.pop() {
        if c == ".." {
            out.pop();
            continue;
        }
        let next = out.join(&c);
        if missing {
            out = next;
            continue;
        }
        match fs.kind(&next) {
            NodeKind::Symlink(target) => {
                links += 1;
                if links > MAX_SYMLINKS {
                    return Err(SeatbeltError::SymlinkLoop {
                        path: path.to_path_buf(),
                    });
                }
                if target.is_absolute() {
                    out = PathBuf::from("/");
                }
                for t in target.components().rev() {
                    match t {
                        Component::Normal(n) => pending.push(n.to_os_string()),
                        Component::ParentDir => pending.push("..".into()),
                        _ => {}
                    }
                }
            }
            NodeKind::Missing => {
                missing = true;
                out = next;
            }
            NodeKind::Dir | NodeKind::File => out = next,
        }
    }
    Ok(out)
}

/// A fake filesystem with macOS's root symlinks and the directories the
/// golden tests use (`/tmp`, `/var`, `/etc` point into `/private`).
#[cfg(test)]
pub(crate) fn mac_test_fs() -> crate::policy::hostfs::FakeFs {
    crate::policy::hostfs::FakeFs::new()
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
#[cfg(test)]
pub(crate) fn mac_test_vars() -> crate::policy::Vars {
    crate::policy::Vars {
        project: "/Users/u/proj".into(),
        tmp: "/var/folders/xy/T/hull-runs/ID/tmp".into(),
        spill: "/var/folders/xy/T/hull-runs/ID/spill".into(),
        home: "/Users/u".into(),
        runs: "/var/folders/xy/T/hull-runs".into(),
    }
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
            Err(SeatbeltError::SymlinkLoop { .. })
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
        };
        let e = launch(&pol, &spec).unwrap_err();
        assert!(e.to_string().contains("needs macOS"), "{e}");
    }
}
