//! Who the command is on the host when hull runs as root.
//!
//! A command running as host uid 0 passes every owner check without any
//! capability: it can write root-owned sysctl and cgroup files, read 0600
//! root files inside a granted system directory, change the mode of the
//! host's device nodes, and leave root-owned files behind. So when hull's
//! euid is 0, the process tiers (landlock, bwrap) run the command as the
//! unprivileged system user [`SANDBOX_USER`] (no supplementary groups), and
//! it reaches what the policy grants through mounts made in a private mount
//! namespace of the child, just before it drops root:
//!
//! - each writable root, and hull's own instance dirs and masks, are
//!   re-mounted on themselves with an idmapping that shows their on-disk
//!   owner as the sandbox user: what the command creates is stored as that
//!   owner's (the caller's tree stays the caller's);
//! - each directory above a grant that the sandbox user cannot search (a
//!   0700 home or run directory) is covered by a fresh tmpfs holding only
//!   empty mount points down to the grants below it, so path lookup works
//!   and nothing else of that directory is there (on the landlock tier,
//!   which shows the rest of the host, a sibling of the project in a 0700
//!   home would otherwise be reachable for chmod, utimes and xattrs, which
//!   Landlock does not mediate);
//! - a read-only grant below such a tmpfs is mounted onto it as it is, with
//!   the host's ids;
//! - everything else (the system directories) is seen as "others": 0600
//!   root files stay unreadable, kernel knobs and device nodes unchangeable.
//!
//! Every re-mount is cloned from the host's mounts and checked in hull
//! before the child starts (a filesystem without idmapped mounts fails the
//! run there, naming the path); the child only attaches them. They exist
//! only in the child's mount namespace; the host sees none of them, and
//! they carry nosuid and nodev. When hull is not root nothing here applies:
//! the command already runs as the caller.
//!
//! What this does not cover: the sandbox user is one uid for every run, so
//! `limits.pids` (RLIMIT_NPROC) counts the processes of every concurrent
//! run together; set-id bits (refused by seccomp) would still be stored as
//! the owner's.

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::mounts;

pub use crate::sandbox_user::{hull_is_root, Ids, NAME as SANDBOX_USER};

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("tier {tier}: {source}")]
    User {
        tier: &'static str,
        #[source]
        source: crate::sandbox_user::SandboxUserError,
    },
    #[error(
        "tier {tier}: cannot inspect {path} (needed to grant it to `{SANDBOX_USER}`): {source}"
    )]
    Inspect {
        tier: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("tier {tier}: path {path} contains a NUL byte")]
    Nul { tier: &'static str, path: PathBuf },
    #[error(transparent)]
    Cow(#[from] crate::cow::CowError),
    #[error("tier {tier}: --cow: cannot mount an overlay of {project} with its upper layer in {upper} (the upper layer's filesystem must support overlayfs upper layers: ext4, xfs, btrfs, tmpfs; set HULL_CHANGES_DIR to a directory on one): {source}; the command did not run")]
    Overlay {
        tier: &'static str,
        project: PathBuf,
        upper: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("tier {tier}: cannot create the user namespace for an idmapped mount: {source}")]
    Userns {
        tier: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("tier {tier}: cannot {step} {path} as an idmapped mount for `{SANDBOX_USER}` (the filesystem must support idmapped mounts, Linux 5.12+; ext4, xfs, btrfs and tmpfs do): {source}; the command did not run")]
    Mount {
        tier: &'static str,
        step: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// One path re-mounted on itself with an idmapping: the detached,
/// idmapped copy of its mount made in the parent, attached in the child.
#[derive(Debug)]
struct Remount {
    cpath: CString,
    tree: OwnedFd,
    /// A [`Remap::Private`] tmpfs: the command writes there.
    private: bool,
}

/// What the child does before it execs: prepared in the parent (all
/// allocation, file inspection and every mount that can fail on the
/// filesystem happen here, reported with their path), applied in the child
/// with raw system calls only.
#[derive(Debug)]
pub struct Switch {
    tier: &'static str,
    user: Ids,
    remounts: Vec<Remount>,
    /// Entered again once the mounts are in place (the child's working
    /// directory, set before the mounts, still names the mount below).
    cwd: Option<CString>,
    /// `--cow`: the copy-on-write view of the project, mounted over its
    /// path after the re-mounts: its lower layer the project (as re-mounted
    /// for the sandbox user), its upper layer a change set's `upper/`. The
    /// host's mounts never see it.
    overlay: Option<crate::cow::Overlay>,
    /// `--cow` on landlock: what covers the project's protected paths in
    /// the overlay (Landlock cannot hide an entry of a directory it lets
    /// the command write without splitting it), attached after the overlay.
    cow_masks: Option<crate::cow::Covers>,
    /// What covers the paths below a [`Remap::Private`] tmpfs that the
    /// command may not write ([`Switch::with_private_covers`]).
    private_covers: Vec<crate::cow::Covers>,
    /// A devpts of the command's own ([`Switch::with_private_pts`]),
    /// attached at `/dev/pts` last, its `ptmx` bound over `/dev/ptmx`.
    pts: Option<OwnedFd>,
}

/// A path the command is given, whether it must be writable, and whether
/// it is the command's own (a writable root, or hull's instance dirs and
/// masks): shown as the sandbox user's. Other read-only grants keep the
/// host's ids, so the sandbox user reads in them only what others may.
#[derive(Debug, Clone)]
pub struct Grant {
    pub path: PathBuf,
    pub writable: bool,
    pub own: bool,
}

impl Grant {
    /// `--cow`: the change set's directory, which must be there in the
    /// child's mount namespace (below a 0700 directory it is mounted into
    /// the skeleton) for the overlay's upper layer; no sandbox binds it or
    /// grants it, so the command never sees it.
    pub fn change_set(set_dir: &Path) -> Grant {
        Grant {
            path: set_dir.to_path_buf(),
            writable: false,
            own: false,
        }
    }
}

/// Can `user` (no supplementary groups) get `bits` (octal rwx, 0-7) on a
/// file with this metadata, as the kernel's owner/group/other check would?
fn allowed(m: &std::fs::Metadata, user: Ids, bits: u32) -> bool {
    let mode = m.mode();
    let granted = if m.uid() == user.uid {
        (mode >> 6) & 7
    } else if m.gid() == user.gid {
        (mode >> 3) & 7
    } else {
        mode & 7
    };
    granted & bits == bits
}

/// One mount of the command's view, made over a host path.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Remap {
    /// A fresh tmpfs (root's, 0755) over a directory the sandbox user
    /// cannot search (a 0700 home), holding only the empty mount points
    /// down to the grants below it (relative paths, parents first; true for
    /// a directory): path lookup works, and nothing else of the directory
    /// is there to read, chmod or touch.
    Skeleton(Vec<(PathBuf, bool)>),
    /// A fresh tmpfs, mode 1777 ([`PrivateTmp`]), over one of the
    /// command's own scratch directories (`/tmp`, `/var/tmp` of a
    /// session's sandbox: [`Switch::prepare_with_private`]), holding the
    /// mount points of the grants below it as a skeleton does: the host's
    /// directory is not there, and what the command writes there is gone
    /// with its mount namespace.
    Private(Vec<(PathBuf, bool)>),
    /// Shown with `owner`'s ids as the sandbox user's: the command's own (a
    /// writable root, hull's instance dirs); what it creates there is
    /// stored as `owner`'s.
    As(Ids),
    /// A plain copy with the host's ids: a grant below a skeleton, which
    /// must be mounted to be there at all.
    Host,
}

/// The mounts that give `user` the grants, in the order to make them
/// (parents first).
#[cfg(test)]
fn remount_paths(
    tier: &'static str,
    user: Ids,
    grants: &[Grant],
    private: &[PathBuf],
) -> Result<Vec<(PathBuf, Remap)>, IdentityError> {
    Ok(remount_plan(tier, user, grants, private)?.0)
}

/// Each grant's device and inode as [`remount_plan`] saw it: what a clone
/// taken by its path must be.
type Seen = std::collections::HashMap<PathBuf, (u64, u64)>;

/// [`remount_paths`], and what each grant was when it was looked at.
fn remount_plan(
    tier: &'static str,
    user: Ids,
    grants: &[Grant],
    private: &[PathBuf],
) -> Result<(Vec<(PathBuf, Remap)>, Seen), IdentityError> {
    let inspect = |p: &Path| match std::fs::symlink_metadata(p) {
        Ok(m) => Ok(Some(m)),
        // Missing grants are skipped by the lowering (noted there).
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(IdentityError::Inspect {
            tier,
            path: p.to_path_buf(),
            source,
        }),
    };
    let mut present = Vec::new();
    let mut seen = Seen::new();
    for g in grants {
        if let Some(m) = inspect(&g.path)? {
            seen.insert(g.path.clone(), (m.dev(), m.ino()));
            present.push((g, m));
        }
    }
    present.sort_by(|(a, _), (b, _)| depth_then_path(&a.path, &b.path));
    let mut out: Vec<(PathBuf, Remap)> = private
        .iter()
        .map(|p| (p.clone(), Remap::Private(Vec::new())))
        .collect();
    for (g, m) in present {
        // Every directory above the grant must be searchable in the view.
        let mut above: Vec<&Path> = g.path.ancestors().skip(1).collect();
        above.reverse();
        for a in above.into_iter().filter(|a| *a != Path::new("/")) {
            let searchable = match covering(&out, a) {
                Some(Remap::Skeleton(_) | Remap::Private(_) | Remap::As(_)) => true,
                Some(Remap::Host) | None => match inspect(a)? {
                    Some(am) => allowed(&am, user, 0o1),
                    None => true,
                },
            };
            if !searchable {
                out.push((a.to_path_buf(), Remap::Skeleton(Vec::new())));
            }
        }
        let remap = if g.own {
            Some(Remap::As(Ids {
                uid: m.uid(),
                gid: m.gid(),
            }))
        } else if matches!(
            covering(&out, &g.path),
            Some(Remap::Skeleton(_) | Remap::Private(_))
        ) {
            Some(Remap::Host)
        } else {
            None
        };
        if let Some(r) = remap {
            if !out.iter().any(|(p, _)| *p == g.path) {
                point_in_skeleton(&mut out, &g.path, m.is_dir());
                out.push((g.path.clone(), r));
            }
        }
    }
    out.sort_by(|(a, _), (b, _)| depth_then_path(a, b));
    Ok((out, seen))
}

fn depth_then_path(a: &Path, b: &Path) -> std::cmp::Ordering {
    (a.components().count(), a).cmp(&(b.components().count(), b))
}

/// The deepest planned mount at or above `p`.
fn covering<'a>(out: &'a [(PathBuf, Remap)], p: &Path) -> Option<&'a Remap> {
    out.iter()
        .filter(|(m, _)| p.starts_with(m))
        .max_by_key(|(m, _)| m.components().count())
        .map(|(_, r)| r)
}

/// When the deepest mount above `p` is a skeleton, adds the mount points
/// from it down to `p` (a directory or a file).
fn point_in_skeleton(out: &mut [(PathBuf, Remap)], p: &Path, is_dir: bool) {
    let Some((root, Remap::Skeleton(points) | Remap::Private(points))) = out
        .iter_mut()
        .filter(|(m, _)| p.starts_with(m) && m != p)
        .max_by_key(|(m, _)| m.components().count())
    else {
        return;
    };
    let Ok(rel) = p.strip_prefix(&*root) else {
        return;
    };
    let mut acc = PathBuf::new();
    let n = rel.components().count();
    for (i, c) in rel.components().enumerate() {
        acc.push(c);
        let dir = i + 1 < n || is_dir;
        if !points.iter().any(|(q, _)| *q == acc) {
            points.push((acc.clone(), dir));
        }
    }
}

impl Switch {
    /// Prepares the switch to the sandbox user for `grants`: every path to
    /// re-mount is cloned and idmapped now, from the host's own mounts (a
    /// clone taken inside an idmapped mount could not be idmapped again).
    pub fn prepare(tier: &'static str, grants: &[Grant]) -> Result<Switch, IdentityError> {
        Switch::prepare_with_private(tier, grants, Vec::new())
    }

    /// [`Switch::prepare`], and each of `private` ([`private_tmp`])
    /// mounted over its directory, a writable tmpfs of the command's own
    /// ([`Remap::Private`]); the grants below it are mounted on it. Its root, detached, is [`Switch::private_roots`] until the
    /// child attaches it. What the grants and protections below it do not
    /// let the command write must then be covered by mounts
    /// ([`Switch::with_private_covers`]): a Landlock rule that lets it
    /// write the tmpfs lets it write everything mounted below.
    pub fn prepare_with_private(
        tier: &'static str,
        grants: &[Grant],
        mut private: Vec<PrivateTmp>,
    ) -> Result<Switch, IdentityError> {
        let user = crate::sandbox_user::lookup("the command")
            .map_err(|source| IdentityError::User { tier, source })?;
        let dirs: Vec<PathBuf> = private.iter().map(|p| p.path.clone()).collect();
        let (paths, seen) = remount_plan(tier, user, grants, &dirs)?;
        let mut userns: Vec<(Ids, OwnedFd)> = Vec::new();
        let mut remounts = Vec::new();
        for (path, remap) in paths {
            let cpath =
                CString::new(path.as_os_str().as_bytes()).map_err(|_| IdentityError::Nul {
                    tier,
                    path: path.clone(),
                })?;
            let mount_err = |(step, source)| IdentityError::Mount {
                tier,
                step,
                path: path.clone(),
                source,
            };
            let is_private = matches!(remap, Remap::Private(_));
            // Host and As are clones of the grant at `path`; the others are
            // hull's own trees.
            let cloned = matches!(remap, Remap::Host | Remap::As(_));
            let tree = match remap {
                Remap::Skeleton(points) => skeleton_tree(&points).map_err(mount_err)?,
                Remap::Private(points) => {
                    let Some(i) = private.iter().position(|p| p.path == path) else {
                        return Err(mount_err((
                            "find the tmpfs made for",
                            std::io::Error::other("none was made"),
                        )));
                    };
                    let tree = private.swap_remove(i).tree;
                    add_points(&tree, &points).map_err(mount_err)?;
                    tree
                }
                Remap::Host => mounts::cloned_tree(&cpath, None).map_err(mount_err)?,
                Remap::As(owner) => {
                    let i = match userns.iter().position(|(o, _)| *o == owner) {
                        Some(i) => i,
                        None => {
                            let fd = idmap_userns(owner, user)
                                .map_err(|source| IdentityError::Userns { tier, source })?;
                            userns.push((owner, fd));
                            userns.len() - 1
                        }
                    };
                    mounts::cloned_tree(&cpath, Some(&userns[i].1)).map_err(mount_err)?
                }
            };
            // A grant cloned by its path must be what the plan saw there:
            // one moved into its place since (by a sandbox that can write
            // a parent of it) is refused, not mounted as the grant.
            if let Some(id) = seen.get(&path).filter(|_| cloned) {
                let now = rustix::fs::fstat(&tree).map(|st| (st.st_dev, st.st_ino));
                if now.as_ref() != Ok(id) {
                    return Err(mount_err((
                        "mount the grant (it was moved since hull planned the run)",
                        std::io::Error::from_raw_os_error(libc::ESTALE),
                    )));
                }
            }
            remounts.push(Remount {
                cpath,
                tree,
                private: is_private,
            });
        }
        // The user namespaces may go: each idmapped tree holds its own.
        Ok(Switch {
            tier,
            user,
            remounts,
            cwd: None,
            overlay: None,
            cow_masks: None,
            private_covers: Vec::new(),
            pts: None,
        })
    }

    /// Gives the command terminals of its own (a session's shell tools
    /// open a pseudo-terminal): a fresh devpts instance (ptmx mode 0666,
    /// nosuid, noexec), attached at `/dev/pts` in the child with its
    /// `ptmx` bound over `/dev/ptmx`, so `posix_openpt` makes a terminal
    /// there and the host's terminals are not in the command's view. Its
    /// root, detached, is [`Switch::pts_root`] until then: the Landlock
    /// rules that let the command use it are opened on it.
    pub fn with_private_pts(mut self) -> Result<Switch, IdentityError> {
        let tree = devpts_tree().map_err(|(step, source)| IdentityError::Mount {
            tier: self.tier,
            step,
            path: PathBuf::from(PTS),
            source,
        })?;
        self.pts = Some(tree);
        Ok(self)
    }

    /// The root of [`Switch::with_private_pts`]'s devpts, if any.
    pub fn pts_root(&self) -> Option<&OwnedFd> {
        self.pts.as_ref()
    }

    /// The roots of the [`Remap::Private`] tmpfs, detached until the child
    /// attaches them: what a Landlock rule that lets the command write
    /// there is opened on.
    pub fn private_roots(&self) -> impl Iterator<Item = &OwnedFd> {
        self.remounts.iter().filter(|r| r.private).map(|r| &r.tree)
    }

    /// Covers, in the child, what lies below a [`Remap::Private`] tmpfs
    /// and the command may not write (each protection, each grant that is
    /// not writable): mounts enforce them there, not Landlock, whose rule
    /// for the tmpfs covers all below it.
    pub fn with_private_covers(mut self, covers: Vec<crate::cow::Covers>) -> Switch {
        self.private_covers = covers;
        self
    }

    /// `--cow`: shows the command `project` through an overlay whose upper
    /// layer is `set_dir/layers/upper` (work directory `set_dir/layers/work`). The
    /// project must be among the grants (re-mounted for the sandbox user).
    /// The overlay is tried once now,
    /// on the host's own paths (a filesystem that cannot hold an upper
    /// layer fails here, naming it), then mounted in the child.
    pub fn with_overlay(mut self, project: &Path, set_dir: &Path) -> Result<Switch, IdentityError> {
        let tier = self.tier;
        let upper = crate::changes::Layers::of(set_dir).upper;
        let overlay = crate::cow::Overlay::prepare(tier, project, set_dir, false)?;
        overlay
            .try_here()
            .map_err(|source| IdentityError::Overlay {
                tier,
                project: project.to_path_buf(),
                upper: upper.clone(),
                source,
            })?;
        // The upper layer's top is the merged view's top: the sandbox
        // user's. Below it the overlay stores what the command makes as the
        // command's uid (the mounter, root, makes the work directory), and
        // copies up the project's entries with their ids as the re-mounted
        // project shows them: the sandbox user's. Nothing of the set is
        // reachable from the sandbox but through the overlay.
        std::os::unix::fs::chown(&upper, Some(self.user.uid), Some(self.user.gid)).map_err(
            |source| IdentityError::Inspect {
                tier,
                path: upper,
                source,
            },
        )?;
        self.overlay = Some(overlay);
        Ok(self)
    }

    /// `--cow` on landlock: covers each of `protected` (paths inside
    /// `project`, with how) in the overlay ([`crate::cow::Covers`]);
    /// the empty trees that hide paths are detached now, from the host's
    /// mounts.
    pub fn with_cow_masks(
        mut self,
        project: &Path,
        protected: &[(PathBuf, crate::cow::Cover)],
        empty_dir: &Path,
        empty_file: &Path,
    ) -> Result<Switch, IdentityError> {
        self.cow_masks = Some(crate::cow::Covers::prepare(
            self.tier,
            project,
            protected,
            empty_dir,
            empty_file,
            crate::cow::Detach::Now,
        )?);
        Ok(self)
    }

    /// Makes the child enter `dir` again after the mounts (for commands
    /// started with a working directory of their own; bwrap sets its own).
    pub fn with_cwd(mut self, dir: &Path) -> Result<Switch, IdentityError> {
        let c = CString::new(dir.as_os_str().as_bytes()).map_err(|_| IdentityError::Nul {
            tier: self.tier,
            path: dir.to_path_buf(),
        })?;
        self.cwd = Some(c);
        Ok(self)
    }

    /// In the child: a private mount namespace with the idmapped trees on
    /// their paths, parents first. Raw system calls only.
    fn mount_all(&self) -> std::io::Result<()> {
        // SAFETY: unshare takes integer flags.
        if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        mounts::make_mounts_private()?;
        for r in &self.remounts {
            mounts::attach_at(&r.tree, &r.cpath)?;
        }
        if let Some(o) = &self.overlay {
            o.mount_in_child()?;
        }
        if let Some(m) = &self.cow_masks {
            m.apply_in_child()?;
        }
        for c in &self.private_covers {
            c.apply_in_child()?;
        }
        if let Some(pts) = &self.pts {
            mounts::attach_pts(pts)?;
        }
        Ok(())
    }

    /// In the child, before exec: makes the mounts, then becomes the
    /// sandbox user (no supplementary groups; the kernel clears every
    /// capability on the change from uid 0). Async-signal-safe.
    pub fn apply_in_child(&self) -> std::io::Result<()> {
        self.mount_all()?;
        if let Some(cwd) = &self.cwd {
            // SAFETY: chdir to a NUL-terminated path `self` owns.
            if unsafe { libc::chdir(cwd.as_ptr()) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        let Ids { uid, gid } = self.user;
        // Raw system calls, not glibc's wrappers: those change every thread
        // glibc believes the process has and wait for each, and a child
        // started by clone3 (exec::spawn) inherits the parent's list of
        // threads that are not there: it would wait forever. The child has
        // one thread, so the kernel's per-thread change is the process's.
        // SAFETY: integer-only credential calls (setgroups with a null list
        // of length 0).
        unsafe {
            if libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) != 0
                || libc::syscall(libc::SYS_setresgid, gid, gid, gid) != 0
                || libc::syscall(libc::SYS_setresuid, uid, uid, uid) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

/// Where a session's own devpts goes.
const PTS: &str = "/dev/pts";

/// A fresh detached devpts instance: its `ptmx` open to anyone (each
/// terminal made is its maker's), at most 256 terminals, nosuid and noexec.
fn devpts_tree() -> Result<OwnedFd, (&'static str, std::io::Error)> {
    use rustix::mount::{
        fsconfig_create, fsconfig_set_string, fsmount, fsopen, FsMountFlags, FsOpenFlags,
        MountAttrFlags,
    };
    let step = |what: &'static str| move |e: rustix::io::Errno| (what, std::io::Error::from(e));
    let fs = fsopen("devpts", FsOpenFlags::FSOPEN_CLOEXEC).map_err(step("make a devpts for"))?;
    fsconfig_set_string(&fs, "ptmxmode", "0666").map_err(step("make a devpts for"))?;
    fsconfig_set_string(&fs, "mode", "0620").map_err(step("make a devpts for"))?;
    // Bounded: every instance but the host's first draws on one count
    // (kernel.pty.max less its reserve).
    fsconfig_set_string(&fs, "max", "256").map_err(step("make a devpts for"))?;
    fsconfig_create(&fs).map_err(step("make a devpts for"))?;
    fsmount(
        &fs,
        FsMountFlags::FSMOUNT_CLOEXEC,
        MountAttrFlags::MOUNT_ATTR_NOSUID | MountAttrFlags::MOUNT_ATTR_NOEXEC,
    )
    .map_err(step("mount a devpts for"))
}

/// A detached tmpfs (root's, 0755, nosuid, nodev; the sandbox user can
/// change nothing in it) holding `points`: empty directories and files,
/// parents first.
fn skeleton_tree(points: &[(PathBuf, bool)]) -> Result<OwnedFd, (&'static str, std::io::Error)> {
    let tree = tmpfs_tree(None)?;
    add_points(&tree, points)?;
    Ok(tree)
}

/// A fresh detached tmpfs (nosuid, nodev): root's, 0755 and 64 KiB, or,
/// with `private`, mode 1777 and at most that many bytes (the command's
/// own scratch, [`Remap::Private`]).
fn tmpfs_tree(private: Option<u64>) -> Result<OwnedFd, (&'static str, std::io::Error)> {
    use rustix::mount::{
        fsconfig_create, fsconfig_set_string, fsmount, fsopen, FsMountFlags, FsOpenFlags,
        MountAttrFlags,
    };
    let step = |what: &'static str| move |e: rustix::io::Errno| (what, std::io::Error::from(e));
    let fs = fsopen("tmpfs", FsOpenFlags::FSOPEN_CLOEXEC).map_err(step("make a tmpfs for"))?;
    let (mode, size) = match private {
        Some(bytes) => ("1777", bytes.max(1 << 20).to_string()),
        None => ("0755", "64k".to_string()),
    };
    fsconfig_set_string(&fs, "mode", mode).map_err(step("make a tmpfs for"))?;
    fsconfig_set_string(&fs, "size", &size).map_err(step("make a tmpfs for"))?;
    fsconfig_create(&fs).map_err(step("make a tmpfs for"))?;
    fsmount(
        &fs,
        FsMountFlags::FSMOUNT_CLOEXEC,
        MountAttrFlags::MOUNT_ATTR_NOSUID | MountAttrFlags::MOUNT_ATTR_NODEV,
    )
    .map_err(step("mount a tmpfs for"))
}

/// Makes the empty mount points `points` (relative, parents first; true
/// for a directory) in the detached tmpfs `tree`.
fn add_points(
    tree: &OwnedFd,
    points: &[(PathBuf, bool)],
) -> Result<(), (&'static str, std::io::Error)> {
    use rustix::fs::{mkdirat, openat, Mode, OFlags};
    let step = |what: &'static str| move |e: rustix::io::Errno| (what, std::io::Error::from(e));
    for (p, dir) in points {
        if *dir {
            mkdirat(tree, p, Mode::from_raw_mode(0o755))
                .map_err(step("make a mount point in the tmpfs over"))?;
        } else {
            openat(
                tree,
                p,
                OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o444),
            )
            .map_err(step("make a mount point in the tmpfs over"))?;
        }
    }
    Ok(())
}

/// One of a session's own scratch directories (`/tmp`, `/var/tmp`) on
/// landlock when hull is root: a fresh tmpfs, made before the run, that
/// [`Switch::prepare_with_private`] mounts over `path` in the child. Its
/// device tells the broker a file is the command's own scratch.
#[derive(Debug)]
pub struct PrivateTmp {
    pub path: PathBuf,
    tree: OwnedFd,
    pub dev: u64,
}

/// Makes the tmpfs of each of `dirs` (a directory, and the most bytes it
/// holds).
pub fn private_tmp(
    tier: &'static str,
    dirs: &[(PathBuf, u64)],
) -> Result<Vec<PrivateTmp>, IdentityError> {
    dirs.iter()
        .map(|(path, size)| {
            let mount_err = |(step, source)| IdentityError::Mount {
                tier,
                step,
                path: path.clone(),
                source,
            };
            let tree = tmpfs_tree(Some(*size)).map_err(mount_err)?;
            let st = rustix::fs::fstat(&tree)
                .map_err(|e| mount_err(("inspect the tmpfs for", e.into())))?;
            Ok(PrivateTmp {
                path: path.clone(),
                tree,
                dev: st.st_dev,
            })
        })
        .collect()
}

/// A user namespace whose id maps show `owner` as `user`: the idmapping of
/// a mount that lets `user` act as the owner of what it covers.
fn idmap_userns(owner: Ids, user: Ids) -> std::io::Result<OwnedFd> {
    let (ready_r, ready_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    let (done_r, done_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    // SAFETY: the child makes raw system calls only (unshare, write, read,
    // _exit) on descriptors opened before the fork.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: see above; the buffers are stack bytes.
        unsafe {
            // Our copies of the parent's ends: with `done_w` open here the
            // read below would never see end of file.
            libc::close(ready_r.as_raw_fd());
            libc::close(done_w.as_raw_fd());
            let ok: u8 = if libc::unshare(libc::CLONE_NEWUSER) == 0 {
                1
            } else {
                0
            };
            libc::write(ready_w.as_raw_fd(), (&ok as *const u8).cast(), 1);
            let mut b = 0u8;
            libc::read(done_r.as_raw_fd(), (&mut b as *mut u8).cast(), 1);
            libc::_exit(0);
        }
    }
    drop(ready_w);
    drop(done_r);
    let result = (|| {
        let mut b = [0u8; 1];
        let n = rustix::io::read(&ready_r, &mut b)?;
        if n != 1 || b[0] != 1 {
            return Err(std::io::Error::other(
                "the helper child could not unshare a user namespace",
            ));
        }
        std::fs::write(
            format!("/proc/{pid}/uid_map"),
            format!("{} {} 1\n", owner.uid, user.uid),
        )?;
        std::fs::write(
            format!("/proc/{pid}/gid_map"),
            format!("{} {} 1\n", owner.gid, user.gid),
        )?;
        let f = std::fs::File::open(format!("/proc/{pid}/ns/user"))?;
        Ok(OwnedFd::from(f))
    })();
    drop(done_w);
    let mut status = 0;
    // SAFETY: reaps the child forked above.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mounts_what_the_sandbox_user_must_reach_parents_first() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let closed = dir.path().join("closed");
        let open = closed.join("open");
        let proj = closed.join("proj");
        std::fs::create_dir_all(&open).unwrap();
        std::fs::create_dir_all(proj.join(".git")).unwrap();
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let me = std::fs::metadata(&closed).unwrap();
        let owner = Ids {
            uid: me.uid(),
            gid: me.gid(),
        };
        let user = Ids {
            uid: 64_000,
            gid: 64_000,
        };
        let grant = |path: &Path, writable| Grant {
            path: path.to_path_buf(),
            writable,
            own: writable,
        };
        let grants = [
            grant(&open, false),
            grant(&open.join("missing"), true),
            grant(&proj, true),
            grant(&proj.join(".git"), false),
        ];
        let got = remount_paths("bwrap", user, &grants, &[]).unwrap();
        // `closed` (0700, another owner) gets a skeleton with the mount
        // points of the two grants below it; the read-only `open` keeps the
        // host's ids, the project is the owner's, and so is its read-only
        // .git (no mount of its own); the missing grant is skipped.
        assert_eq!(
            got,
            vec![
                (
                    closed.clone(),
                    Remap::Skeleton(vec![("open".into(), true), ("proj".into(), true)])
                ),
                (open, Remap::Host),
                (proj, Remap::As(owner)),
            ]
        );
    }
}
