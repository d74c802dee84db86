//! Binding a Landlock plan to what is on disk, once, in hull.
//!
//! The plan names its rules by path (the lowering listed a split project's
//! entries); between planning and enforcement another run on the same
//! project, or anything that can write in it, can rename an entry or put a
//! symlink in its place. So hull, before the helper starts, opens every
//! rule's target exactly once: with `openat2(O_PATH)`, no symlink followed
//! anywhere on the way (`RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`), and
//! beneath the descriptor of the nearest enclosing rule it already opened
//! (`RESOLVE_BENEATH`: a split project's entries are opened beneath the
//! project's own descriptor, never by their whole path again). Each target
//! must still be of the type the plan lowered it as (a directory for a
//! directory's rights), and the Landlock ruleset is built here from those
//! descriptors: the helper receives the ruleset's descriptor and only
//! restricts itself with it. Nothing is reopened by path later.
//!
//! A target that is gone grants nothing (as before); a symlink where the
//! plan saw a file or directory, or a changed type, refuses the run with
//! the path: fail closed.
//!
//! One exception, by construction: with `--cow` the project is an overlay
//! that exists only in the child's mount namespace, so the rules at or
//! below it are handed to the helper as paths relative to its working
//! directory (the overlay's root, entered after the mounts) and opened
//! there the same way ([`Deferred`]).
//!
//! Not covered: hard links. A file the command may write could be a hard
//! link to one elsewhere on the same filesystem; the kernel's
//! `protected_hardlinks` keeps links to files the sandbox user does not
//! own from being made.

// A command can write the trees this module works on: no path-based
// filesystem call (clippy.toml).
#![deny(clippy::disallowed_methods)]

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use landlock::{
    Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, PathBeneath, Ruleset,
    RulesetAttr, RulesetCreatedAttr, Scope, ABI,
};
use rustix::fs::{Mode, OFlags, ResolveFlags};
use serde::{Deserialize, Serialize};

use super::landlock::LandlockError;
use crate::policy::lower::landlock::{LandlockPlan, Right};

/// A rule the helper adds itself, after the mounts: `rel` beneath its
/// working directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deferred {
    pub rel: PathBuf,
    /// `LANDLOCK_ACCESS_FS_*` bits, already limited to what the ruleset
    /// handles.
    pub access: u64,
    pub dir: bool,
}

/// The built ruleset and the rules left to the helper.
#[derive(Debug)]
pub struct Bound {
    pub ruleset: OwnedFd,
    pub deferred: Vec<Deferred>,
}

/// What the ruleset handles: every filesystem right of ABI 5 (the tier
/// needs ABI 6), connecting to unix sockets where the kernel mediates it,
/// TCP, and the scopes.
fn handled(allow_unix_sockets: bool) -> BitFlags<AccessFs> {
    let mut fs = AccessFs::from_all(ABI::V5);
    if allow_unix_sockets {
        fs |= AccessFs::ResolveUnix;
    }
    fs
}

fn access_of(rights: &[Right], allow_unix_sockets: bool) -> BitFlags<AccessFs> {
    let mut access = BitFlags::<AccessFs>::empty();
    for right in rights {
        access |= to_access(*right);
    }
    access & handled(allow_unix_sockets)
}

/// Whether rights can only be granted on a directory: the lowering gives a
/// directory `read_dir` always, a file never, so the rights say which type
/// the plan saw.
fn wants_dir(rights: &[Right]) -> bool {
    rights.iter().any(|r| {
        matches!(
            r,
            Right::ReadDir
                | Right::RemoveDir
                | Right::RemoveFile
                | Right::MakeDir
                | Right::MakeReg
                | Right::MakeSock
                | Right::MakeFifo
                | Right::MakeSym
                | Right::Refer
                | Right::ResolveUnix
        )
    })
}

/// Opens targets once each, beneath the nearest target already opened.
struct Opener {
    dirs: BTreeMap<PathBuf, OwnedFd>,
}

const SWAPPED_FOR_A_LINK: &str = "a symlink is on the way or in its place, where the plan \
     saw none (something renamed it since the plan was made); the command did not run";

const RESOLVE: ResolveFlags = ResolveFlags::NO_SYMLINKS.union(ResolveFlags::NO_MAGICLINKS);

impl Opener {
    fn open(&mut self, path: &Path, dir: bool) -> Result<Option<OwnedFd>, LandlockError> {
        let fail = |reason: String| LandlockError::Rule {
            path: path.display().to_string(),
            reason,
        };
        if !path.is_absolute() {
            return Err(fail("not an absolute path".into()));
        }
        // The deepest directory opened so far that holds `path`.
        // (A lookup per ancestor: a scan of the map's earlier entries made
        // binding /etc's hundred-odd entries quadratic.)
        let base = path
            .ancestors()
            .find_map(|a| self.dirs.get_key_value(a))
            .map(|(d, fd)| (d.clone(), fd));
        let opened = match &base {
            Some((d, fd)) => {
                let rel = path.strip_prefix(d).unwrap_or(path);
                let rel = if rel.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    rel
                };
                open_beneath(fd, rel)
            }
            None => crate::runtime::beneath::openat2(
                rustix::fs::CWD,
                path,
                OFlags::PATH | OFlags::CLOEXEC | OFlags::NOFOLLOW,
                Mode::empty(),
                RESOLVE,
            ),
        };
        let fd = match opened {
            Ok(fd) => fd,
            // Gone since planning: grants nothing.
            Err(rustix::io::Errno::NOENT) => return Ok(None),
            Err(rustix::io::Errno::LOOP) => return Err(fail(SWAPPED_FOR_A_LINK.into())),
            Err(rustix::io::Errno::XDEV) => {
                return Err(fail(
                    "it moved out from below its parent since the plan was made; the command \
                     did not run"
                        .into(),
                ))
            }
            Err(e) => return Err(fail(e.to_string())),
        };
        check_type(&fd, dir).map_err(fail)?;
        if dir {
            self.dirs.insert(
                path.to_path_buf(),
                fd.try_clone().map_err(|e| fail(e.to_string()))?,
            );
        }
        Ok(Some(fd))
    }
}

/// Builds the ruleset for `plan` (and the spares' rules, the proxy's port)
/// from descriptors opened once here. Rules at or below `in_child` are left
/// to the helper, relative to that directory.
pub fn bind(
    plan: &LandlockPlan,
    pools: &[std::sync::Arc<crate::spares::Pool>],
    allow_unix_sockets: bool,
    proxy_port: Option<u16>,
    in_child: Option<&Path>,
) -> Result<Bound, LandlockError> {
    let ruleset_err = |e: landlock::RulesetError| LandlockError::Ruleset(e.to_string());
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(ABI::V3))
        .map_err(ruleset_err)?
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(ABI::V5))
        .map_err(ruleset_err)?
        .handle_access(AccessNet::from_all(ABI::V4))
        .map_err(ruleset_err)?
        // Required: without it the command could stop hull (SIGSTOP).
        .set_compatibility(CompatLevel::HardRequirement)
        .scope(Scope::AbstractUnixSocket | Scope::Signal)
        .map_err(ruleset_err)?;
    if allow_unix_sockets {
        ruleset = ruleset
            .handle_access(AccessFs::ResolveUnix)
            .map_err(ruleset_err)?;
    }
    let mut created = ruleset.create().map_err(ruleset_err)?;
    let mut deferred = Vec::new();
    let mut opener = Opener {
        dirs: BTreeMap::new(),
    };
    let add = |created: landlock::RulesetCreated,
               fd: OwnedFd,
               path: &Path,
               access: BitFlags<AccessFs>|
     -> Result<landlock::RulesetCreated, LandlockError> {
        created
            .add_rule(PathBeneath::new(fd, access))
            .map_err(|e| LandlockError::Rule {
                path: path.display().to_string(),
                reason: e.to_string(),
            })
    };
    for r in &plan.rules {
        let dir = wants_dir(&r.rights);
        let access = access_of(&r.rights, allow_unix_sockets);
        if let Some(root) = in_child.filter(|root| r.path.starts_with(root)) {
            deferred.push(Deferred {
                rel: Path::new(".").join(r.path.strip_prefix(root).unwrap_or(Path::new(""))),
                access: access.bits(),
                dir,
            });
            continue;
        }
        if let Some(fd) = opener.open(&r.path, dir)? {
            created = add(created, fd, &r.path, access)?;
        }
    }
    // Every spare must carry its rule: the broker hands them out. They are
    // hull's own, opened beneath the pool's held descriptor.
    let (file_rights, dir_rights) = (
        crate::policy::lower::landlock::writable_rights(false),
        crate::policy::lower::landlock::writable_rights(true),
    );
    let (file_access, dir_access) = (
        access_of(&file_rights, allow_unix_sockets),
        access_of(&dir_rights, allow_unix_sockets),
    );
    for pool in pools {
        // Each spare through the descriptor the pool checked it by (or
        // made it with): its rule goes to that inode, found by no name.
        let fds = pool.take_rule_fds();
        let want = (pool.set().files + pool.set().dirs) as usize;
        if fds.len() != want {
            return Err(LandlockError::Rule {
                path: pool.set().dir.display().to_string(),
                reason: format!(
                    "{} of its {want} spares are held (the pool's rules are bound once)",
                    fds.len()
                ),
            });
        }
        for ((name, _), (is_dir, fd)) in pool.set().names().zip(fds) {
            let access = if is_dir { dir_access } else { file_access };
            created = created
                .add_rule(PathBeneath::new(fd, access))
                .map_err(|e| LandlockError::Rule {
                    path: pool.set().dir.join(&name).display().to_string(),
                    reason: e.to_string(),
                })?;
        }
    }
    if let Some(port) = proxy_port {
        created = created
            .add_rule(landlock::NetPort::new(port, AccessNet::ConnectTcp))
            .map_err(|e| {
                LandlockError::Ruleset(format!("the rule for the proxy's port {port}: {e}"))
            })?;
    }
    let ruleset: Option<OwnedFd> = created.into();
    let ruleset = ruleset.ok_or(LandlockError::NotEnforced(
        "the kernel made no ruleset".into(),
    ))?;
    Ok(Bound { ruleset, deferred })
}

/// In the helper, after its mounts: adds the deferred rules to the ruleset
/// `ruleset`, each opened beneath the working directory the same way hull
/// opens the others.
pub fn add_deferred(ruleset: &OwnedFd, deferred: &[Deferred]) -> Result<(), LandlockError> {
    let cwd = rustix::fs::open(
        ".",
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| LandlockError::Rule {
        path: "the working directory".into(),
        reason: e.to_string(),
    })?;
    for d in deferred {
        let fail = |reason: String| LandlockError::Rule {
            path: d.rel.display().to_string(),
            reason,
        };
        let fd = match open_beneath(&cwd, &d.rel) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT) => continue,
            Err(e) => return Err(fail(e.to_string())),
        };
        check_type(&fd, d.dir).map_err(fail)?;
        add_rule_raw(ruleset, &fd, d.access).map_err(|e| fail(e.to_string()))?;
    }
    Ok(())
}

/// Whether the target `fd` is open on is what the plan saw there: no
/// symlink, and a directory exactly when `dir`; else why not.
fn check_type(fd: &OwnedFd, dir: bool) -> Result<(), String> {
    let st = rustix::fs::fstat(fd).map_err(|e| e.to_string())?;
    let kind = rustix::fs::FileType::from_raw_mode(st.st_mode);
    if kind == rustix::fs::FileType::Symlink {
        return Err(SWAPPED_FOR_A_LINK.into());
    }
    let is_dir = kind == rustix::fs::FileType::Directory;
    if is_dir != dir {
        let name = |d: bool| if d { "directory" } else { "file" };
        return Err(format!(
            "the plan saw a {} there and found a {} (something replaced it since); the \
             command did not run",
            name(dir),
            name(is_dir),
        ));
    }
    Ok(())
}

/// `rel` beneath `dir`, as an `O_PATH` descriptor: no link followed, not
/// left through `..`.
fn open_beneath(dir: impl std::os::fd::AsFd, rel: &Path) -> rustix::io::Result<OwnedFd> {
    crate::runtime::beneath::openat2(
        dir,
        rel,
        OFlags::PATH | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
        RESOLVE | ResolveFlags::BENEATH,
    )
}

/// `struct landlock_path_beneath_attr` (packed, as the kernel declares it).
#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

const LANDLOCK_RULE_PATH_BENEATH: libc::c_int = 1;

/// Lets the command write beneath the directory `dir` is open on, as in
/// a writable root: a session's own `/tmp`, a tmpfs detached until the
/// child attaches it (a rule binds the directory itself, wherever it is
/// mounted, and everything below it in any path: what the command may not
/// write there must be covered by read-only mounts).
pub fn add_writable_dir(
    ruleset: &OwnedFd,
    dir: &OwnedFd,
    allow_unix_sockets: bool,
) -> std::io::Result<()> {
    let access = access_of(
        &crate::policy::lower::landlock::writable_rights(true),
        allow_unix_sockets,
    );
    add_rule_raw(ruleset, dir, access.bits())
}

/// Lets the command use the terminals of `pts`, a devpts of its own
/// (detached until the child attaches it at `/dev/pts` and binds its
/// `ptmx` over `/dev/ptmx`): open, read, write and the terminal ioctls,
/// on its `ptmx` and every `/dev/pts/N` it makes. Nothing else of the
/// host's terminals: those are another devpts.
pub fn add_pty(ruleset: &OwnedFd, pts: &OwnedFd) -> std::io::Result<()> {
    let file = AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::IoctlDev;
    let dir = file | AccessFs::ReadDir;
    add_rule_raw(ruleset, pts, (dir & handled(false)).bits())?;
    let ptmx = rustix::fs::openat(
        pts,
        "ptmx",
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    add_rule_raw(ruleset, &ptmx, (file & handled(false)).bits())
}

fn add_rule_raw(ruleset: &OwnedFd, parent: &OwnedFd, access: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let attr = PathBeneathAttr {
        allowed_access: access,
        parent_fd: parent.as_raw_fd(),
    };
    // SAFETY: landlock_add_rule reads one landlock_path_beneath_attr from
    // the pointer, which points at one, alive for the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset.as_raw_fd(),
            LANDLOCK_RULE_PATH_BENEATH,
            &attr as *const PathBeneathAttr,
            0u32,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Restricts the calling thread (the single-threaded helper) with
/// `ruleset`: no_new_privs first, as the kernel requires without
/// CAP_SYS_ADMIN.
pub fn restrict_self(ruleset: OwnedFd) -> Result<(), LandlockError> {
    use std::os::fd::AsRawFd;
    rustix::thread::set_no_new_privs(true)
        .map_err(|e| LandlockError::NotEnforced(format!("no_new_privs not set: {e}")))?;
    // SAFETY: landlock_restrict_self takes a descriptor and flags only.
    let r = unsafe { libc::syscall(libc::SYS_landlock_restrict_self, ruleset.as_raw_fd(), 0u32) };
    if r != 0 {
        return Err(LandlockError::NotEnforced(format!(
            "the kernel refused the ruleset: {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(())
}

pub(super) fn to_access(r: Right) -> BitFlags<AccessFs> {
    use landlock::AccessFs as A;
    match r {
        Right::Execute => A::Execute.into(),
        Right::WriteFile => A::WriteFile.into(),
        Right::ReadFile => A::ReadFile.into(),
        Right::ReadDir => A::ReadDir.into(),
        Right::RemoveDir => A::RemoveDir.into(),
        Right::RemoveFile => A::RemoveFile.into(),
        Right::MakeDir => A::MakeDir.into(),
        Right::MakeReg => A::MakeReg.into(),
        Right::MakeSock => A::MakeSock.into(),
        Right::MakeFifo => A::MakeFifo.into(),
        Right::MakeSym => A::MakeSym.into(),
        Right::Refer => A::Refer.into(),
        Right::Truncate => A::Truncate.into(),
        Right::IoctlDev => A::IoctlDev.into(),
        Right::ResolveUnix => A::ResolveUnix.into(),
    }
}

#[cfg(test)]
// Tests build their trees by path.
#[allow(clippy::disallowed_methods)]
mod tests {
    use super::*;
    use crate::policy::lower::landlock::{writable_rights, Rule};
    use std::os::unix::fs::MetadataExt;

    /// A project with `src/`, split (the project `read_dir`, `src` writable),
    /// and a directory outside every grant.
    fn world() -> (tempfile::TempDir, PathBuf, PathBuf, LandlockPlan) {
        let t = tempfile::tempdir().unwrap();
        let proj = t.path().join("proj");
        let outside = t.path().join("outside");
        std::fs::create_dir_all(proj.join("src")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        let plan = LandlockPlan {
            rules: vec![
                Rule {
                    path: proj.clone(),
                    rights: vec![Right::ReadDir],
                },
                Rule {
                    path: proj.join("src"),
                    rights: writable_rights(true),
                },
            ],
            notes: Vec::new(),
            closed: Vec::new(),
        };
        (t, proj, outside, plan)
    }

    #[test]
    fn a_target_swapped_for_a_link_after_planning_refuses_the_run() {
        let (_t, proj, outside, plan) = world();
        std::fs::remove_dir(proj.join("src")).unwrap();
        std::os::unix::fs::symlink(&outside, proj.join("src")).unwrap();
        // Control: opening the rule's path as the helper did before
        // (`PathFd::new`, which follows links) lands on the outside
        // directory, which the read-write rule would then have granted.
        let followed = landlock::PathFd::new(proj.join("src")).unwrap();
        let st = rustix::fs::fstat(&followed).unwrap();
        assert_eq!(st.st_ino, std::fs::metadata(&outside).unwrap().ino());
        let e = bind(&plan, &[], false, None, None).unwrap_err().to_string();
        assert!(
            e.contains(&proj.join("src").display().to_string()) && e.contains("symlink"),
            "{e}"
        );
    }

    #[test]
    fn a_link_above_a_target_refuses_the_run_too() {
        let (t, proj, outside, mut plan) = world();
        std::fs::create_dir_all(outside.join("deep")).unwrap();
        plan.rules.push(Rule {
            path: proj.join("src/deep"),
            rights: writable_rights(true),
        });
        plan.rules.remove(1);
        std::fs::remove_dir(proj.join("src")).unwrap();
        std::os::unix::fs::symlink(&outside, proj.join("src")).unwrap();
        assert!(bind(&plan, &[], false, None, None).is_err());
        drop(t);
    }

    #[test]
    fn a_target_of_another_type_refuses_the_run_and_a_gone_one_grants_nothing() {
        let (_t, proj, _outside, plan) = world();
        std::fs::remove_dir(proj.join("src")).unwrap();
        std::fs::write(proj.join("src"), "x").unwrap();
        let e = bind(&plan, &[], false, None, None).unwrap_err().to_string();
        assert!(e.contains("directory") && e.contains("file"), "{e}");
        std::fs::remove_file(proj.join("src")).unwrap();
        assert!(bind(&plan, &[], false, None, None).is_ok());
    }

    #[test]
    fn rules_on_the_overlay_are_left_to_the_helper_relative_to_its_directory() {
        let (_t, proj, _outside, plan) = world();
        let bound = bind(&plan, &[], false, None, Some(&proj)).unwrap();
        let rels: Vec<_> = bound.deferred.iter().map(|d| d.rel.clone()).collect();
        assert_eq!(rels, vec![PathBuf::from("."), PathBuf::from("./src")]);
        assert!(bound.deferred.iter().all(|d| d.dir && d.access != 0));
    }
}
