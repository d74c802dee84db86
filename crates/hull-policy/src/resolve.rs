//! Resolve a [`PolicyFile`] for one hull instance: expand `${PROJECT}`,
//! `${TMP}`, `${SPILL}`, `${HOME}`; make relative paths relative to the
//! project (refusing any that climb out of it); add the instance's own tmp
//! (read-write) and spill (read-only); add the protections every policy has.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use super::file::{PolicyError, PolicyFile};
use super::{
    Access, EnvPolicy, GitMetadata, Grant, GrantOrigin, Limits, Policy, Protect, ProtectReason,
    Protection,
};

/// Names protected inside every writable root (besides the instance tmp).
pub const HULL_CONFIG_DIR: &str = ".hull";
pub const GIT_DIR: &str = ".git";
/// Shell startup files protected when they sit inside a writable root.
pub const SHELL_RC_FILES: &[&str] = &[
    ".bashrc",
    ".bash_profile",
    ".bash_login",
    ".bash_logout",
    ".profile",
    ".zshrc",
    ".zshenv",
    ".zprofile",
    ".zlogin",
    ".config/fish/config.fish",
];

/// The variables a policy is resolved with. All absolute.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Vars {
    pub project: PathBuf,
    pub tmp: PathBuf,
    pub spill: PathBuf,
    pub home: PathBuf,
    /// The directory holding every instance's run dir (`<tmp>/hull-runs`).
    pub runs: PathBuf,
}

/// A resolve error is a policy error located in the file.
pub type ResolveError = PolicyError;

/// Resolves a parsed policy for one instance.
pub fn resolve(pf: &PolicyFile, vars: &Vars) -> Result<Policy, ResolveError> {
    let mut grants = Vec::new();
    let mut protects = Vec::new();
    for (key, i, entry) in pf.path_entries() {
        let k = format!("{key}[{i}]");
        let path =
            expand_path(entry.get_ref(), vars).map_err(|m| pf.error_at(entry.span(), &k, m))?;
        match key {
            "fs.read" => grants.push(grant(path, Access::Read)),
            "fs.read_exec" => grants.push(grant(path, Access::ReadExec)),
            "fs.read_write" => {
                if let Some(k_if) = kernel_interface_overlap(&path) {
                    return Err(pf.error_at(
                        entry.span(),
                        &k,
                        format!(
                            "{} would make {k_if} writable: the kernel's interfaces are never \
                             writable to a command (grant it read-only, or a narrower path)",
                            path.display()
                        ),
                    ));
                }
                grants.push(grant(path, Access::ReadWrite))
            }
            _ => protects.push(Protect {
                path,
                protection: Protection::Hidden,
                reason: ProtectReason::PolicyDeny,
            }),
        }
    }

    // Protections inside every writable root the policy grants.
    let roots: Vec<PathBuf> = grants
        .iter()
        .filter(|g| g.access == Access::ReadWrite)
        .map(|g| g.path.clone())
        .collect();
    // A root whose git metadata is the command's (`fs.git = "writable"`) is
    // a copy nobody uses on the host: it is the command's whole, hull keeps
    // no `.hull` there either (git's `stash -u` and `clean` would trip on
    // its mask, which nobody may read).
    let git = pf.git_metadata()?;
    if git == GitMetadata::ReadOnly {
        for root in &roots {
            protects.push(Protect {
                path: root.join(HULL_CONFIG_DIR),
                protection: Protection::Hidden,
                reason: ProtectReason::HullConfig,
            });
            protects.push(Protect {
                path: root.join(GIT_DIR),
                protection: Protection::ReadOnly,
                reason: ProtectReason::GitMetadata,
            });
        }
    }
    for rc in SHELL_RC_FILES {
        let p = vars.home.join(rc);
        if roots.iter().any(|r| p.starts_with(r)) {
            protects.push(Protect {
                path: p,
                protection: Protection::ReadOnly,
                reason: ProtectReason::ShellRc,
            });
        }
    }
    // Other instances' run dirs are never visible, whatever the grants.
    protects.push(Protect {
        path: vars.runs.clone(),
        protection: Protection::Hidden,
        reason: ProtectReason::OtherInstances,
    });
    // The instance's own dirs, granted after (on top of) the runs mask.
    grants.push(Grant {
        path: vars.tmp.clone(),
        access: Access::ReadWrite,
        origin: GrantOrigin::InstanceTmp,
    });
    grants.push(Grant {
        path: vars.spill.clone(),
        access: Access::Read,
        origin: GrantOrigin::InstanceSpill,
    });
    dedup_grants(&mut grants);
    protects.sort_by(|a, b| a.path.cmp(&b.path).then(a.protection.cmp(&b.protection)));
    protects.dedup_by(|a, b| a.path == b.path);

    let limits = resolve_limits(pf)?;
    let mut set = BTreeMap::new();
    for (k, v) in &pf.env.set {
        let value = expand_vars(v.get_ref(), vars)
            .map_err(|m| pf.error_at(v.span(), &format!("env.set.{k}"), m))?;
        set.insert(k.clone(), value);
    }
    let env = EnvPolicy {
        pass: pf.env.pass.iter().map(|s| s.get_ref().clone()).collect(),
        set,
    };
    Ok(Policy {
        name: pf.source.name.clone(),
        grants,
        protects,
        git,
        net: pf.net_policy()?,
        limits,
        env,
        vm: pf.vm_policy()?,
        vars: vars.clone(),
    })
}

/// The kernel's own interfaces: a writable grant over one of them (sysctls,
/// sysrq, cgroup and device knobs) hands the command the host's kernel.
const KERNEL_INTERFACES: &[&str] = &["/proc", "/sys"];

/// The kernel interface `path` is, lies in or contains, if any.
fn kernel_interface_overlap(path: &Path) -> Option<&'static str> {
    KERNEL_INTERFACES
        .iter()
        .copied()
        .find(|k| path.starts_with(k) || Path::new(k).starts_with(path))
}

fn grant(path: PathBuf, access: Access) -> Grant {
    Grant {
        path,
        access,
        origin: GrantOrigin::Policy,
    }
}

/// Keeps one grant per path: the widest access wins (a path listed as both
/// read and read_write is read_write), but the instance's own entries keep
/// their origin and access (spill is read-only whatever the policy says).
fn dedup_grants(grants: &mut Vec<Grant>) {
    let mut out: Vec<Grant> = Vec::new();
    for g in grants.drain(..) {
        if let Some(prev) = out.iter_mut().find(|p| p.path == g.path) {
            if g.origin != GrantOrigin::Policy {
                *prev = g;
            } else if prev.origin == GrantOrigin::Policy && g.access > prev.access {
                prev.access = g.access;
            }
        } else {
            out.push(g);
        }
    }
    *grants = out;
}

fn resolve_limits(pf: &PolicyFile) -> Result<Limits, PolicyError> {
    let l = &pf.limits;
    let wall_time = match &l.wall_time {
        None => None,
        Some(s) => Some(
            parse_duration(s.get_ref())
                .map_err(|m| pf.error_at(s.span(), "limits.wall_time", m))?,
        ),
    };
    let memory = match &l.memory {
        None => None,
        Some(s) => {
            Some(parse_bytes(s.get_ref()).map_err(|m| pf.error_at(s.span(), "limits.memory", m))?)
        }
    };
    if let Some(p) = &l.pids {
        if *p.get_ref() == 0 {
            return Err(pf.error_at(p.span(), "limits.pids", "must be at least 1".into()));
        }
    }
    if let Some(c) = &l.cpus {
        if *c.get_ref() == 0 {
            return Err(pf.error_at(c.span(), "limits.cpus", "must be at least 1".into()));
        }
    }
    Ok(Limits {
        wall_time,
        memory,
        pids: l.pids.as_ref().map(|p| *p.get_ref()),
        cpus: l.cpus.as_ref().map(|c| *c.get_ref()),
    })
}

/// `90s`, `10m`, `1h 30m` (humantime).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| {
        format!("{s:?} is not a duration ({e}); write for example \"90s\" or \"10m\"")
    })?;
    if d.is_zero() {
        return Err("must be longer than zero".into());
    }
    Ok(d)
}

/// `512MiB`, `2GiB`, `1G`, `4096` (bytes).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size; write for example \"512MiB\" or \"2GiB\""))?;
    let mul: u64 = match unit.trim() {
        "" | "B" => 1,
        "K" | "KiB" | "k" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        "T" | "TiB" => 1 << 40,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {s:?}; use KiB, MiB, GiB"
            ))
        }
    };
    let v = n
        .checked_mul(mul)
        .ok_or_else(|| format!("{s:?} is too large"))?;
    if v == 0 {
        return Err("must be larger than zero".into());
    }
    Ok(v)
}

/// Expands `${VAR}` references; unknown variables are errors.
pub fn expand_vars(s: &str, vars: &Vars) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = s;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| format!("unclosed ${{ in {s:?}"))?;
        let name = &after[..end];
        let val = match name {
            "PROJECT" => &vars.project,
            "TMP" => &vars.tmp,
            "SPILL" => &vars.spill,
            "HOME" => &vars.home,
            other => {
                return Err(format!(
                    "unknown variable ${{{other}}}; known: ${{PROJECT}}, ${{TMP}}, ${{SPILL}}, ${{HOME}}"
                ))
            }
        };
        out.push_str(&val.to_string_lossy());
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Expands variables, then makes the path absolute and normal. A relative
/// path is relative to the project and may not climb out of it; `..` is not
/// allowed in absolute paths either (write the path you mean).
pub fn expand_path(s: &str, vars: &Vars) -> Result<PathBuf, String> {
    if s.is_empty() {
        return Err("empty path".into());
    }
    if s.starts_with('~') {
        return Err(format!("{s:?}: write ${{HOME}} instead of ~"));
    }
    let expanded = expand_vars(s, vars)?;
    let p = Path::new(&expanded);
    let relative = !p.is_absolute();
    let mut out = if relative {
        vars.project.clone()
    } else {
        PathBuf::new()
    };
    let base_depth = out.components().count();
    for c in p.components() {
        match c {
            // An absolute path keeps its root (and, on Windows, its drive).
            Component::Prefix(_) | Component::RootDir => out.push(c.as_os_str()),
            Component::CurDir => {}
            Component::Normal(n) => out.push(n),
            Component::ParentDir => {
                if !relative {
                    return Err(format!("{s:?}: `..` is not allowed in a policy path"));
                }
                if out.components().count() <= base_depth {
                    return Err(format!(
                        "{s:?} escapes the project {}",
                        vars.project.display()
                    ));
                }
                out.pop();
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PolicyFile;

    pub fn vars() -> Vars {
        Vars {
            project: "/work/proj".into(),
            tmp: "/tmp/hull-runs/ID/tmp".into(),
            spill: "/tmp/hull-runs/ID/spill".into(),
            home: "/home/u".into(),
            runs: "/tmp/hull-runs".into(),
        }
    }

    #[test]
    fn relative_paths_are_under_project_and_may_not_escape() {
        let v = vars();
        assert_eq!(
            expand_path("build", &v).unwrap(),
            PathBuf::from("/work/proj/build")
        );
        assert_eq!(
            expand_path("a/../b", &v).unwrap(),
            PathBuf::from("/work/proj/b")
        );
        assert!(expand_path("../x", &v).unwrap_err().contains("escapes"));
        assert!(expand_path("a/../../x", &v).is_err());
        assert!(expand_path("/usr/../etc", &v).is_err());
        assert!(expand_path("~/.ssh", &v).is_err());
    }

    #[test]
    fn variables_expand_and_unknown_ones_fail() {
        let v = vars();
        assert_eq!(
            expand_path("${HOME}/.cargo", &v).unwrap(),
            PathBuf::from("/home/u/.cargo")
        );
        assert!(expand_path("${NOPE}/x", &v)
            .unwrap_err()
            .contains("unknown variable"));
    }

    #[test]
    fn writable_roots_get_protections_and_instance_dirs_are_added() {
        let pf = PolicyFile::parse(
            "p",
            "version = 1\n[fs]\nread_write = [\"${PROJECT}\"]\nread = [\"${SPILL}\"]\n",
        )
        .unwrap();
        let p = resolve(&pf, &vars()).unwrap();
        let prot: Vec<_> = p
            .protects
            .iter()
            .map(|p| p.path.to_str().unwrap())
            .collect();
        assert!(prot.contains(&"/work/proj/.hull"));
        assert!(prot.contains(&"/work/proj/.git"));
        assert!(prot.contains(&"/tmp/hull-runs"));
        let spill = p
            .grants
            .iter()
            .find(|g| g.origin == GrantOrigin::InstanceSpill)
            .unwrap();
        assert_eq!(spill.access, Access::Read);
        // the policy listed spill as read: it stays one read-only grant
        assert_eq!(
            p.grants.iter().filter(|g| g.path == vars().spill).count(),
            1
        );
    }

    /// `fs.git`: read-only unless the policy says writable (then neither
    /// `.git` nor `.hull` is protected: the root is the command's whole);
    /// any other value is an error at its line naming the key.
    #[test]
    fn git_metadata_is_read_only_unless_the_policy_says_writable() {
        let text = |git: &str| format!("version = 1\n[fs]\nread_write = [\"${{PROJECT}}\"]\n{git}");
        let protected = |p: &Policy| {
            p.protects
                .iter()
                .any(|x| x.path == Path::new("/work/proj/.git"))
        };
        for (git, want) in [
            ("", GitMetadata::ReadOnly),
            ("git = \"read-only\"\n", GitMetadata::ReadOnly),
            ("git = \"writable\"\n", GitMetadata::Writable),
        ] {
            let p = resolve(&PolicyFile::parse("p", &text(git)).unwrap(), &vars()).unwrap();
            assert_eq!(p.git, want, "{git}");
            assert_eq!(protected(&p), want == GitMetadata::ReadOnly, "{git}");
            assert_eq!(
                p.protects
                    .iter()
                    .any(|x| x.path == Path::new("/work/proj/.hull")),
                want == GitMetadata::ReadOnly,
                "{git}"
            );
        }
        let e = resolve(
            &PolicyFile::parse("p", &text("git = \"rw\"\n")).unwrap(),
            &vars(),
        )
        .unwrap_err();
        assert_eq!((e.key.as_str(), e.line), ("fs.git", 4), "{e}");
        assert!(e.message.contains("\"writable\""), "{e}");
    }

    #[test]
    fn the_kernel_interfaces_are_never_writable() {
        for path in ["/proc/sys", "/sys/fs/cgroup", "/proc", "/"] {
            let text = format!("version = 1\n[fs]\nread_write = [\"{path}\"]\n");
            let pf = PolicyFile::parse("p.toml", &text).unwrap();
            let e = resolve(&pf, &vars()).unwrap_err().to_string();
            assert!(e.contains("never writable"), "{path}: {e}");
            assert!(e.contains("fs.read_write[0]"), "{path}: {e}");
        }
        // Read-only is fine, and so is a writable path beside them.
        let pf = PolicyFile::parse(
            "p.toml",
            "version = 1\n[fs]\nread = [\"/proc/cpuinfo\", \"/sys\"]\nread_write = [\"/procfs-cache\"]\n",
        )
        .unwrap();
        resolve(&pf, &vars()).unwrap();
    }

    #[test]
    fn spill_stays_read_only_even_if_the_policy_says_read_write() {
        let pf =
            PolicyFile::parse("p", "version = 1\n[fs]\nread_write = [\"${SPILL}\"]\n").unwrap();
        let p = resolve(&pf, &vars()).unwrap();
        let g: Vec<_> = p.grants.iter().filter(|g| g.path == vars().spill).collect();
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].access, Access::Read);
    }

    #[test]
    fn bad_path_error_names_key_and_line() {
        let pf = PolicyFile::parse(
            "p.toml",
            "version = 1\n[fs]\nread = [\n \"/ok\",\n \"../up\",\n]\n",
        )
        .unwrap();
        let e = resolve(&pf, &vars()).unwrap_err();
        assert_eq!((e.line, e.key.as_str()), (5, "fs.read[1]"), "{e}");
    }

    #[test]
    fn sizes_and_durations() {
        assert_eq!(parse_bytes("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_bytes("512MiB").unwrap(), 512 << 20);
        assert!(parse_bytes("lots").is_err());
        assert_eq!(parse_duration("10m").unwrap(), Duration::from_secs(600));
        assert!(parse_duration("soon").is_err());
    }
}
