//! Lowering for tier 2 on Linux: the bubblewrap argv.
//!
//! The sandbox root is an empty tmpfs, remounted read-only at the end; only
//! granted paths are bound into it (read-only unless `read_write`), protected
//! paths are covered by an empty read-only dir or file (hidden) or re-bound
//! read-only on top of their writable parent. Every namespace is unshared
//! (network and pid included), the session is new (no TIOCSTI into the
//! caller's terminal), bwrap dies with hull, and every capability is dropped
//! even when hull runs as root.
//!
//! Not enforced by bwrap: the difference between `read` and `read_exec`
//! (bind mounts here carry no per-path `noexec`); see docs/tiers.md.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::plan::{self, FsPlan, Placeholder, PlanError, Step};
use crate::{Access, HostFs, NodeKind, Policy};

/// The empty nodes protections are masked with (made by the runtime, in the
/// instance dir, mode 0: reading one is "Permission denied").
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Masks {
    pub empty_dir: PathBuf,
    pub empty_file: PathBuf,
}

/// Kernel interfaces of /proc that stay read-only (the read-only paths of
/// Docker's default profile): sysctls (`kernel.core_pattern` runs a program
/// as host root), sysrq, IRQ affinity, bus and filesystem knobs.
pub const PROC_READ_ONLY: &[&str] = &[
    "/proc/sys",
    "/proc/sysrq-trigger",
    "/proc/irq",
    "/proc/bus",
    "/proc/fs",
];

/// What `bwrap` is given, between the binary and `--`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BwrapPlan {
    pub args: Vec<OsString>,
    pub placeholders: Vec<Placeholder>,
    /// [`plan::FsPlan::found`].
    #[serde(skip)]
    pub found: Vec<Placeholder>,
    pub notes: Vec<String>,
    /// The host paths bwrap binds in (the sources of the policy's binds and
    /// masks), with whether each is bound writable: what a command running
    /// as another uid must be able to reach (`tier::identity`).
    #[serde(skip)]
    pub sources: Vec<BindSource>,
}

/// A host path bwrap binds into the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindSource {
    pub path: PathBuf,
    pub writable: bool,
}

/// The directories a session's sandbox has of its own
/// ([`BwrapPlan::with_private_tmp`]).
pub const PRIVATE_TMP: &[&str] = &["/tmp", "/var/tmp"];

impl BwrapPlan {
    /// Gives the sandbox a `/tmp` and a `/var/tmp` of its own: a fresh
    /// tmpfs each (mode 1777, at most `size` bytes), mounted before every
    /// grant, so a grant below them (a project in `/tmp`) is bound on top,
    /// and gone with the sandbox's mount namespace. A session's sandbox
    /// (`hull run --session-leader`), where commands write `/tmp` as on
    /// any machine. A policy that grants `/tmp` itself binds it over.
    pub fn with_private_tmp(&mut self, size: u64) {
        let at = self
            .args
            .windows(2)
            .position(|w| w[0] == "--dev")
            .map_or(self.args.len(), |i| i + 2);
        let mut extra: Vec<OsString> = Vec::new();
        for dir in PRIVATE_TMP {
            extra.extend(
                ["--perms", "1777", "--size"]
                    .map(OsString::from)
                    .into_iter()
                    .chain([size.to_string().into(), "--tmpfs".into(), (*dir).into()]),
            );
        }
        self.args.splice(at..at, extra);
    }

    /// The argv as one shell-like line per option, for `hull policy explain`.
    pub fn display_lines(&self) -> Vec<String> {
        let mut lines: Vec<String> = Vec::new();
        for a in &self.args {
            let s = a.to_string_lossy();
            if s.starts_with("--") || lines.is_empty() {
                lines.push(s.into_owned());
            } else if let Some(last) = lines.last_mut() {
                last.push(' ');
                last.push_str(&s);
            }
        }
        lines
    }
}

/// A container image as the sandbox's `/` (`hull run --tier bwrap
/// --image REF`): its tree, unpacked by hull into its image cache.
pub struct ImageRoot<'a> {
    pub tree: &'a Path,
    /// How the tree's directories are listed.
    pub fs: &'a dyn HostFs,
    /// The uid and gid the command has in the sandbox (the image's
    /// `User`); none: the caller's.
    pub ids: Option<(u32, u32)>,
    /// Where the sandbox sees the project (the image's `WorkingDir`,
    /// checked by [`crate::check_project_at`]); none: at its host path.
    pub project_at: Option<&'a Path>,
}

impl std::fmt::Debug for ImageRoot<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageRoot")
            .field("tree", &self.tree)
            .finish()
    }
}

/// Lowers a policy to bwrap arguments. `cwd` is where the command starts.
pub fn lower(
    policy: &Policy,
    fs: &dyn HostFs,
    masks: &Masks,
    cwd: &Path,
) -> Result<BwrapPlan, PlanError> {
    lower_with(policy, fs, masks, cwd, None)
}

/// Lowers a policy to bwrap arguments over a container image: the image's
/// tree is `/` (read-only, as the host's directories are on a plain run),
/// with the project (its protections inside it as on any run), the
/// instance's directories and a `/tmp` and `/var/tmp` of the sandbox's own
/// bound on top. The policy's other grants name the host's files, which
/// the image replaces: they are not bound (a note says which).
pub fn lower_on_image(
    policy: &Policy,
    fs: &dyn HostFs,
    masks: &Masks,
    cwd: &Path,
    image: &ImageRoot<'_>,
) -> Result<BwrapPlan, PlanError> {
    let mut plan = lower_with(policy, fs, masks, cwd, Some(image))?;
    plan.with_private_tmp(IMAGE_TMP_SIZE);
    if let Some((uid, gid)) = image.ids {
        // bwrap maps the caller's ids to these in its user namespace.
        let at = plan
            .args
            .iter()
            .position(|a| a == "--unshare-user")
            .map_or(0, |i| i + 1);
        let ids = [
            "--uid".into(),
            uid.to_string().into(),
            "--gid".into(),
            gid.to_string().into(),
        ];
        plan.args.splice(at..at, ids);
    }
    Ok(plan)
}

/// The size of an image sandbox's own `/tmp` and `/var/tmp`, each.
pub const IMAGE_TMP_SIZE: u64 = 1 << 30;

/// What an image sandbox keeps of the policy's plan: the project and what
/// hull itself grants (the instance's directories, a change set, a
/// session's agent).
fn kept_roots(policy: &Policy) -> Vec<PathBuf> {
    let mut kept = vec![policy.vars.project.clone()];
    kept.extend(
        policy
            .grants
            .iter()
            .filter(|g| g.origin != crate::GrantOrigin::Policy)
            .map(|g| g.path.clone()),
    );
    kept
}

/// The binds of the image's tree below `dir` (a path in the sandbox):
/// each entry bound read-only (a link made as it is, an empty directory
/// made on the root instead of bound), except where a destination of the
/// plan lies (`tops`: the outermost ones): at one, nothing (the plan's
/// mount is there); above one, the entry bound whole when every
/// destination below it is a directory of the image all the way down (the
/// plan's mounts go over those), else a directory of the sandbox's root
/// with the image's entries bound inside it, one level down.
fn image_binds(
    image: &ImageRoot<'_>,
    dir: &Path,
    tops: &[&PathBuf],
    a: &mut Args,
    notes: &mut Vec<String>,
) {
    let rel = dir.strip_prefix("/").unwrap_or(dir);
    for (name, kind) in image.fs.entries(&image.tree.join(rel)) {
        let dest = dir.join(&name);
        let source = image.tree.join(rel).join(&name);
        // bwrap makes these two.
        if dir == Path::new("/") && (name == "proc" || name == "dev") {
            continue;
        }
        if tops.iter().any(|d| **d == dest) {
            continue;
        }
        let below: Vec<&&PathBuf> = tops.iter().filter(|d| d.starts_with(&dest)).collect();
        if !below.is_empty() {
            if kind != NodeKind::Dir {
                notes.push(format!(
                    "image: {} is not a directory in the image; the sandbox has the \
                     project's directories there instead",
                    dest.display()
                ));
                continue;
            }
            if below.iter().all(|d| dir_all_the_way(image, &dest, d)) {
                a.two("--ro-bind", &source, &dest);
            } else {
                a.opt("--dir", &dest);
                image_binds(image, &dest, tops, a, notes);
            }
            continue;
        }
        match kind {
            NodeKind::Dir if image.fs.children(&source).is_empty() => a.opt("--dir", &dest),
            NodeKind::Dir | NodeKind::File => a.two("--ro-bind", &source, &dest),
            NodeKind::Symlink(target) => a.two("--symlink", &target, &dest),
            NodeKind::Missing => {}
        }
    }
}

/// Whether every component of `path` from `from` (both in the sandbox) is
/// a directory in the image, no link among them.
fn dir_all_the_way(image: &ImageRoot<'_>, from: &Path, path: &Path) -> bool {
    let Ok(rest) = path.strip_prefix(from) else {
        return false;
    };
    let mut at = image.tree.join(from.strip_prefix("/").unwrap_or(from));
    rest.components().all(|c| {
        at.push(c);
        image.fs.kind(&at) == NodeKind::Dir
    })
}

fn lower_with(
    policy: &Policy,
    fs: &dyn HostFs,
    masks: &Masks,
    cwd: &Path,
    image: Option<&ImageRoot<'_>>,
) -> Result<BwrapPlan, PlanError> {
    let FsPlan {
        mut steps,
        mut placeholders,
        mut found,
        mut notes,
    } = plan::plan(policy, fs)?;
    let kept = kept_roots(policy);
    // Where a host path of the plan is in the sandbox: the project (and
    // what lies in it) may be elsewhere on an image.
    let at = image.and_then(|i| i.project_at);
    let project = &policy.vars.project;
    let dest = |p: &Path| -> PathBuf {
        match (at, p.strip_prefix(project)) {
            (Some(at), Ok(rest)) if rest.as_os_str().is_empty() => at.to_path_buf(),
            (Some(at), Ok(rest)) => at.join(rest),
            _ => p.to_path_buf(),
        }
    };
    if let Some(at) = at {
        crate::check_project_at(at).map_err(|why| PlanError::ProjectAt {
            at: at.to_path_buf(),
            why,
        })?;
    }
    if image.is_some() {
        let inside = |p: &Path| kept.iter().any(|k| p.starts_with(k));
        // Notes on the host's paths the image replaces say nothing here.
        notes.retain(|n| kept.iter().any(|k| n.contains(&*k.to_string_lossy())));
        let dropped: Vec<String> = policy
            .grants
            .iter()
            .filter(|g| !inside(&g.path))
            .map(|g| g.path.display().to_string())
            .collect();
        if !dropped.is_empty() {
            notes.push(format!(
                "image: the image is the userland; these grants name the host's files and are \
                 not bound: {}",
                dropped.join(" ")
            ));
        }
        steps.retain(|s| inside(s.path()));
        placeholders.retain(|p| inside(&p.path));
        found.retain(|p| inside(&p.path));
    }
    let mut a = Args::default();
    a.flag("--die-with-parent");
    a.flag("--new-session");
    a.flag("--unshare-all");
    a.flag("--unshare-user");
    a.flag("--cap-drop");
    a.flag("ALL");
    a.opt("--hostname", "hull");
    // A fresh tmpfs root is bwrap's default; /proc and a minimal /dev on it.
    a.opt("--proc", "/proc");
    a.opt("--dev", "/dev");
    // The kernel's knobs in the new /proc read-only: a command that is uid 0
    // passes the owner check on a 0644 sysctl without any capability.
    for p in PROC_READ_ONLY {
        a.two("--ro-bind-try", p, p);
    }
    let mut sources = Vec::new();
    if let Some(image) = image {
        let mut dests: Vec<PathBuf> = steps.iter().map(|s| dest(s.path())).collect();
        dests.extend(PRIVATE_TMP.iter().map(PathBuf::from));
        dests.push(dest(cwd));
        let tops: Vec<&PathBuf> = dests
            .iter()
            .filter(|d| !dests.iter().any(|o| o != *d && d.starts_with(o)))
            .collect();
        image_binds(image, Path::new("/"), &tops, &mut a, &mut notes);
        // Reached as a whole by a command that is another uid: its
        // entries are bound from it.
        sources.push(BindSource {
            path: image.tree.to_path_buf(),
            writable: false,
        });
    }
    let mut source = |path: &Path, writable: bool| {
        sources.push(BindSource {
            path: path.to_path_buf(),
            writable,
        })
    };
    for s in &steps {
        match s {
            Step::Grant { path, access, .. } => {
                let op = match access {
                    Access::ReadWrite => "--bind",
                    Access::Read | Access::ReadExec => "--ro-bind",
                };
                source(path, *access == Access::ReadWrite);
                a.two(op, path, dest(path));
            }
            Step::Symlink { path, target } => a.two("--symlink", target, dest(path)),
            Step::Hide { path, dir, .. } => {
                let mask = if *dir {
                    &masks.empty_dir
                } else {
                    &masks.empty_file
                };
                source(mask, false);
                a.two("--ro-bind", mask, dest(path));
            }
            Step::ReadOnly { path, .. } => {
                source(path, false);
                a.two("--ro-bind", path, dest(path))
            }
            // A mount point cannot be renamed (EBUSY): the protection
            // below it stays where it is. Inside a writable root, so the
            // sandbox user reaches it through that root's mount.
            Step::Pin { path } => a.two("--bind", path, dest(path)),
        }
    }
    a.opt("--remount-ro", "/");
    a.opt("--chdir", dest(cwd));
    Ok(BwrapPlan {
        args: a.0,
        placeholders,
        found,
        notes,
        sources,
    })
}

#[derive(Default)]
struct Args(Vec<OsString>);

impl Args {
    fn flag(&mut self, f: &str) {
        self.0.push(f.into());
    }
    fn opt(&mut self, f: &str, v: impl AsRef<std::ffi::OsStr>) {
        self.0.push(f.into());
        self.0.push(v.as_ref().to_os_string());
    }
    fn two(&mut self, f: &str, x: impl AsRef<std::ffi::OsStr>, y: impl AsRef<std::ffi::OsStr>) {
        self.0.push(f.into());
        self.0.push(x.as_ref().to_os_string());
        self.0.push(y.as_ref().to_os_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hostfs::FakeFs;
    use crate::lower::testing::{golden, host, vars};
    use crate::{profiles, resolve};

    fn masks() -> Masks {
        Masks {
            empty_dir: "/tmp/hull-runs/ID/mask/dir".into(),
            empty_file: "/tmp/hull-runs/ID/mask/file".into(),
        }
    }

    fn lowered(profile: &str, fs: &FakeFs) -> BwrapPlan {
        let pf = profiles::load(profile).unwrap();
        let p = resolve(&pf, &vars()).unwrap();
        lower(&p, fs, &masks(), &vars().project).unwrap()
    }

    /// A session's `/tmp` and `/var/tmp` are mounted before any grant, so
    /// a project below `/tmp` is bound on top of them.
    #[test]
    fn a_private_tmp_comes_before_every_grant() {
        let mut plan = lowered("default", &host());
        plan.with_private_tmp(1 << 20);
        let lines = plan.display_lines();
        let at = |l: &str| lines.iter().position(|x| x == l).unwrap();
        let tmp = at("--tmpfs /tmp");
        assert_eq!(lines[tmp - 2..tmp], ["--perms 1777", "--size 1048576"]);
        assert!(at("--dev /dev") < tmp);
        assert!(tmp < at("--tmpfs /var/tmp"));
        let first_bind = lines
            .iter()
            .position(|l| l.starts_with("--bind ") || l.starts_with("--ro-bind /usr"))
            .unwrap();
        assert!(at("--tmpfs /var/tmp") < first_bind, "{lines:#?}");
    }

    /// On an image, `/` is the image's tree: its entries bound read-only,
    /// links made as they are, the project with its protections and the
    /// instance's directories bound on top, `/tmp` the sandbox's own; the
    /// host's system directories and the policy's grants outside the
    /// project are not there.
    #[test]
    fn on_an_image_the_tree_is_root_and_the_project_is_bound_on_top() {
        let tree = FakeFs::new()
            .dir("/t/usr/bin")
            .symlink("/t/bin", "usr/bin")
            .file("/t/etc/os-release")
            .dir("/t/mnt")
            .dir("/t/tmp")
            .dir("/t/var/tmp")
            .dir("/t/var/lib")
            .file("/t/work/old/x")
            .dir("/t/proc")
            .dir("/t/dev")
            .file("/t/work/readme");
        let pf = profiles::load("default").unwrap();
        let p = resolve(&pf, &vars()).unwrap();
        let image = ImageRoot {
            tree: Path::new("/t"),
            fs: &tree,
            ids: Some((1500, 1600)),
            project_at: None,
        };
        let plan = lower_on_image(&p, &host(), &masks(), &vars().project, &image).unwrap();
        let lines = plan.display_lines();
        let has = |l: &str| lines.iter().any(|x| x == l);
        let at = |l: &str| {
            lines
                .iter()
                .position(|x| x == l)
                .unwrap_or_else(|| panic!("{l}: {lines:#?}"))
        };
        for l in [
            "--ro-bind /t/usr /usr",
            "--symlink usr/bin /bin",
            "--ro-bind /t/etc /etc",
            // /var/tmp is a directory of the image: /var is bound whole,
            // the sandbox's /var/tmp mounted over it.
            "--ro-bind /t/var /var",
            // An empty directory is made, not bound.
            "--dir /mnt",
            "--dir /work",
            "--ro-bind /t/work/old /work/old",
            "--ro-bind /t/work/readme /work/readme",
            "--bind /work/proj /work/proj",
            "--ro-bind /work/proj/.git /work/proj/.git",
            "--tmpfs /tmp",
            "--tmpfs /var/tmp",
            "--remount-ro /",
            "--uid 1500",
            "--gid 1600",
        ] {
            assert!(has(l), "{l}: {lines:#?}");
        }
        // The image's own /tmp, /var/tmp, /proc, /dev and the project's
        // place are not bound from it; the host's directories are not there.
        for l in [
            "--ro-bind /t/tmp /tmp",
            "--ro-bind /t/var/tmp /var/tmp",
            "--ro-bind /t/var/lib /var/lib",
            "--ro-bind /t/mnt /mnt",
            "--ro-bind /t/proc /proc",
            "--ro-bind /t/dev /dev",
            "--ro-bind /usr /usr",
            "--ro-bind /etc/ssl /etc/ssl",
        ] {
            assert!(!has(l), "{l}: {lines:#?}");
        }
        assert!(!lines.iter().any(|l| l.contains("/home/u")), "{lines:#?}");
        // The image first, the project over it.
        assert!(at("--dir /work") < at("--bind /work/proj /work/proj"));
        assert!(at("--ro-bind /t/usr /usr") < at("--bind /work/proj /work/proj"));
        assert!(
            plan.notes
                .iter()
                .any(|n| n.contains("not bound") && n.contains("/usr /bin")),
            "{:?}",
            plan.notes
        );
        // The image's tree is a source the sandbox user must reach.
        assert!(plan
            .sources
            .iter()
            .any(|s| s.path == Path::new("/t") && !s.writable));
    }

    /// An image's `WorkingDir`: the project (its protections with it) is
    /// bound there and the command starts there; sources stay the host's.
    #[test]
    fn on_an_image_the_project_may_be_at_its_working_dir() {
        let tree = FakeFs::new().dir("/t/usr/bin").dir("/t/testbed/old");
        let pf = profiles::load("default").unwrap();
        let p = resolve(&pf, &vars()).unwrap();
        let image = |at: &'static str| ImageRoot {
            tree: Path::new("/t"),
            fs: &tree,
            ids: None,
            project_at: Some(Path::new(at)),
        };
        let cwd = vars().project.join("src");
        let plan = lower_on_image(&p, &host(), &masks(), &cwd, &image("/testbed")).unwrap();
        let lines = plan.display_lines();
        for l in [
            "--bind /work/proj /testbed",
            "--ro-bind /work/proj/.git /testbed/.git",
            "--chdir /testbed/src",
        ] {
            assert!(lines.iter().any(|x| x == l), "{l}: {lines:#?}");
        }
        // The image's own /testbed is under the project, not bound.
        assert!(
            !lines.iter().any(|l| l.contains("/t/testbed")),
            "{lines:#?}"
        );
        assert!(
            !lines.iter().any(|l| l.ends_with(" /work/proj")),
            "{lines:#?}"
        );
        let e = lower_on_image(&p, &host(), &masks(), &cwd, &image("/etc")).unwrap_err();
        assert!(e.to_string().contains("/etc"), "{e}");
    }

    #[test]
    fn golden_shipped_profiles() {
        for name in ["default", "readonly", "build"] {
            let plan = lowered(name, &host());
            let mut text = plan.display_lines().join("\n");
            text.push_str("\n# placeholders\n");
            for p in &plan.placeholders {
                text.push_str(&format!("{}\n", p.path.display()));
            }
            text.push_str("# notes\n");
            for n in &plan.notes {
                text.push_str(&format!("{n}\n"));
            }
            golden(&format!("bwrap-{name}.txt"), &text);
        }
    }

    #[test]
    fn protections_come_after_the_writable_bind_and_own_dirs_after_the_runs_mask() {
        let plan = lowered("default", &host());
        let l = plan.display_lines();
        let pos = |s: &str| {
            l.iter()
                .position(|x| x == s)
                .unwrap_or_else(|| panic!("{s} not in {l:#?}"))
        };
        assert!(
            pos("--bind /work/proj /work/proj") < pos("--ro-bind /work/proj/.git /work/proj/.git")
        );
        assert!(
            pos("--bind /work/proj /work/proj")
                < pos("--ro-bind /tmp/hull-runs/ID/mask/dir /work/proj/.hull")
        );
        assert_eq!(l.last().unwrap(), "--chdir /work/proj");
        assert!(l.contains(&"--unshare-all".to_string()));
        assert!(l.contains(&"--new-session".to_string()));
    }

    #[test]
    fn missing_hull_dir_gets_a_placeholder() {
        let plan = lowered("default", &host());
        assert!(plan
            .placeholders
            .iter()
            .any(|p| p.path == Path::new("/work/proj/.hull")));
    }

    #[test]
    fn project_containing_the_runs_dir_masks_other_instances() {
        let mut v = vars();
        v.project = "/tmp".into();
        let pf = profiles::load("default").unwrap();
        let p = resolve(&pf, &v).unwrap();
        let plan = lower(&p, &host(), &masks(), Path::new("/tmp")).unwrap();
        let l = plan.display_lines();
        let mask = l
            .iter()
            .position(|x| x == "--ro-bind /tmp/hull-runs/ID/mask/dir /tmp/hull-runs")
            .unwrap();
        let own = l
            .iter()
            .position(|x| x == "--bind /tmp/hull-runs/ID/tmp /tmp/hull-runs/ID/tmp")
            .unwrap();
        assert!(mask < own, "{l:#?}");
    }

    #[test]
    fn a_grant_through_a_link_planted_in_the_project_is_refused() {
        let fs = host()
            .symlink("/work/proj/sub", "/elsewhere")
            .dir("/elsewhere/cache");
        let pf = crate::PolicyFile::parse(
            "p.toml",
            "version = 1\n[fs]\nread_write = [\"${PROJECT}\", \"sub/cache\"]\n",
        )
        .unwrap();
        let p = resolve(&pf, &vars()).unwrap();
        let e = lower(&p, &fs, &masks(), Path::new("/work/proj")).unwrap_err();
        assert!(
            matches!(&e, PlanError::CrossesSymlink(c) if c.link == Path::new("/work/proj/sub")),
            "{e}"
        );
        // The same grant outside any writable root is the host's business.
        let pf = crate::PolicyFile::parse(
            "p.toml",
            "version = 1\n[fs]\nread = [\"/work/proj/sub/cache\"]\n",
        )
        .unwrap();
        let p = resolve(&pf, &vars()).unwrap();
        lower(&p, &fs, &masks(), Path::new("/work/proj")).unwrap();
    }

    #[test]
    fn a_symlinked_protected_path_fails_closed() {
        let fs = host().symlink("/work/proj/.git", "/elsewhere");
        let pf = profiles::load("default").unwrap();
        let p = resolve(&pf, &vars()).unwrap();
        let e = lower(&p, &fs, &masks(), Path::new("/work/proj")).unwrap_err();
        assert!(e.to_string().contains("/work/proj/.git"), "{e}");
    }
}
