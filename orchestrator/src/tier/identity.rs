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
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

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
    #[error("tier {tier}: --cow: {path} is a symbolic link on the way to a protected path of the project; hull will not cover a path through a link; the command did not run")]
    CowSymlink { tier: &'static str, path: PathBuf },
    #[error(transparent)]
    Cow(#[from] crate::tier::cow::CowError),
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
    overlay: Option<crate::tier::cow::Overlay>,
    /// `--cow` on landlock: what covers the project's protected paths in
    /// the overlay (Landlock cannot hide an entry of a directory it lets
    /// the command write without splitting it), attached after the overlay.
    cow_masks: Option<CowMasks>,
}

/// How a protected path of the project is covered in a `--cow` overlay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cover {
    /// An empty read-only directory or file over it (`.hull`, `deny`).
    Hide,
    /// Itself, bound read-only (`.git`, a read-only grant).
    ReadOnly,
}

/// The covers of a `--cow` overlay, prepared in the parent: the project's
/// path, and for each protected path there its path below the project and
/// a detached read-only empty tree (to hide it) or none (bound read-only
/// onto itself in the child, where the overlay exists).
#[derive(Debug)]
struct CowMasks {
    root: CString,
    items: Vec<(CString, Option<OwnedFd>)>,
}

impl CowMasks {
    /// In the child, after the overlay is mounted: each path opened below
    /// the overlay's root without following any link (a link the project
    /// holds there fails the run), covered, and left read-only. Raw system
    /// calls only.
    fn apply_in_child(&self) -> std::io::Result<()> {
        let err = std::io::Error::last_os_error;
        // SAFETY: open of a NUL-terminated path `self` owns.
        let root = unsafe {
            libc::open(
                self.root.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
            )
        };
        if root < 0 {
            return Err(err());
        }
        // SAFETY: a new descriptor owned by nobody else.
        let root = unsafe { OwnedFd::from_raw_fd(root) };
        for (rel, tree) in &self.items {
            let how = OpenHow {
                flags: (libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC) as u64,
                mode: 0,
                resolve: RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS,
            };
            // SAFETY: `how` is a valid, correctly sized open_how; `rel` is
            // NUL-terminated.
            let target = unsafe {
                libc::syscall(
                    libc::SYS_openat2,
                    root.as_raw_fd(),
                    rel.as_ptr(),
                    &how as *const OpenHow,
                    std::mem::size_of::<OpenHow>(),
                )
            };
            if target < 0 {
                return Err(err());
            }
            // SAFETY: openat2 returned a new descriptor owned by nobody else.
            let target = unsafe { OwnedFd::from_raw_fd(target as RawFd) };
            let own;
            let cover = match tree {
                Some(t) => t,
                None => {
                    // SAFETY: the empty path with AT_EMPTY_PATH names
                    // `target` itself; open_tree returns a new descriptor.
                    let t = unsafe {
                        libc::syscall(
                            libc::SYS_open_tree,
                            target.as_raw_fd(),
                            c"".as_ptr(),
                            OPEN_TREE_CLONE | libc::O_CLOEXEC as u32 | libc::AT_EMPTY_PATH as u32,
                        )
                    };
                    if t < 0 {
                        return Err(err());
                    }
                    // SAFETY: a new descriptor owned by nobody else.
                    own = unsafe { OwnedFd::from_raw_fd(t as RawFd) };
                    set_read_only(&own)?;
                    &own
                }
            };
            // SAFETY: attaches the detached tree `cover` onto `target`, both
            // descriptors, empty paths.
            let moved = unsafe {
                libc::syscall(
                    libc::SYS_move_mount,
                    cover.as_raw_fd(),
                    c"".as_ptr(),
                    target.as_raw_fd(),
                    c"".as_ptr(),
                    MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
                )
            };
            if moved != 0 {
                return Err(err());
            }
        }
        Ok(())
    }
}

/// Makes the detached tree `tree` read-only, nosuid and nodev. One raw
/// system call.
fn set_read_only(tree: &OwnedFd) -> std::io::Result<()> {
    set_attrs(
        tree,
        MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        None,
    )
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
fn remount_paths(
    tier: &'static str,
    user: Ids,
    grants: &[Grant],
) -> Result<Vec<(PathBuf, Remap)>, IdentityError> {
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
    for g in grants {
        if let Some(m) = inspect(&g.path)? {
            present.push((g, m));
        }
    }
    present.sort_by(|(a, _), (b, _)| depth_then_path(&a.path, &b.path));
    let mut out: Vec<(PathBuf, Remap)> = Vec::new();
    for (g, m) in present {
        // Every directory above the grant must be searchable in the view.
        let mut above: Vec<&Path> = g.path.ancestors().skip(1).collect();
        above.reverse();
        for a in above.into_iter().filter(|a| *a != Path::new("/")) {
            let searchable = match covering(&out, a) {
                Some(Remap::Skeleton(_) | Remap::As(_)) => true,
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
        } else if matches!(covering(&out, &g.path), Some(Remap::Skeleton(_))) {
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
    Ok(out)
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
    let Some((root, Remap::Skeleton(points))) = out
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
        let user = crate::sandbox_user::lookup("the command")
            .map_err(|source| IdentityError::User { tier, source })?;
        let paths = remount_paths(tier, user, grants)?;
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
            let tree = match remap {
                Remap::Skeleton(points) => skeleton_tree(&points).map_err(mount_err)?,
                Remap::Host => cloned_tree(&cpath, None).map_err(mount_err)?,
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
                    cloned_tree(&cpath, Some(&userns[i].1)).map_err(mount_err)?
                }
            };
            remounts.push(Remount { cpath, tree });
        }
        // The user namespaces may go: each idmapped tree holds its own.
        Ok(Switch {
            tier,
            user,
            remounts,
            cwd: None,
            overlay: None,
            cow_masks: None,
        })
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
        let overlay = crate::tier::cow::Overlay::prepare(project, set_dir, false)?;
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
    /// `project`, with how) in the overlay. A path that is not there is
    /// left alone (what the command makes there lands in the change set,
    /// and a change to a protected path is never applied); a symbolic link
    /// on the way to one refuses the run, naming it. Hidden paths get the
    /// run's empty directory or file (`empty_dir`, `empty_file`).
    pub fn with_cow_masks(
        mut self,
        project: &Path,
        protected: &[(PathBuf, Cover)],
        empty_dir: &Path,
        empty_file: &Path,
    ) -> Result<Switch, IdentityError> {
        let tier = self.tier;
        let cstr = |p: &Path| {
            CString::new(p.as_os_str().as_bytes()).map_err(|_| IdentityError::Nul {
                tier,
                path: p.to_path_buf(),
            })
        };
        let mut items = Vec::new();
        'each: for (path, cover) in protected {
            let Ok(rel) = path.strip_prefix(project) else {
                continue;
            };
            if rel.as_os_str().is_empty() {
                continue;
            }
            let mut at = project.to_path_buf();
            for c in rel.components() {
                at.push(c);
                match std::fs::symlink_metadata(&at) {
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue 'each,
                    Err(source) => {
                        return Err(IdentityError::Inspect {
                            tier,
                            path: at,
                            source,
                        })
                    }
                    Ok(m) if m.file_type().is_symlink() => {
                        return Err(IdentityError::CowSymlink { tier, path: at })
                    }
                    Ok(_) => {}
                }
            }
            let tree = match cover {
                Cover::ReadOnly => None,
                Cover::Hide => {
                    let is_dir = std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir());
                    let source = cstr(if is_dir { empty_dir } else { empty_file })?;
                    let t = cloned_tree(&source, None).map_err(|(what, source)| {
                        IdentityError::Inspect {
                            tier,
                            path: path.clone(),
                            source: std::io::Error::new(
                                source.kind(),
                                format!("{what} the cover: {source}"),
                            ),
                        }
                    })?;
                    set_read_only(&t).map_err(|source| IdentityError::Inspect {
                        tier,
                        path: path.clone(),
                        source,
                    })?;
                    Some(t)
                }
            };
            items.push((cstr(rel)?, tree));
        }
        self.cow_masks = Some(CowMasks {
            root: cstr(project)?,
            items,
        });
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
        let err = std::io::Error::last_os_error;
        // SAFETY: unshare takes integer flags.
        if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
            return Err(err());
        }
        make_mounts_private()?;
        for r in &self.remounts {
            // SAFETY: attaches the detached tree (a descriptor `self` owns)
            // onto the NUL-terminated path `self` owns.
            let moved = unsafe {
                libc::syscall(
                    libc::SYS_move_mount,
                    r.tree.as_raw_fd(),
                    c"".as_ptr(),
                    libc::AT_FDCWD,
                    r.cpath.as_ptr(),
                    MOVE_MOUNT_F_EMPTY_PATH,
                )
            };
            if moved != 0 {
                return Err(err());
            }
        }
        if let Some(o) = &self.overlay {
            o.mount_in_child()?;
        }
        if let Some(m) = &self.cow_masks {
            m.apply_in_child()?;
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

/// A detached tmpfs (root's, 0755, nosuid, nodev; the sandbox user can
/// change nothing in it) holding `points`: empty directories and files,
/// parents first.
fn skeleton_tree(points: &[(PathBuf, bool)]) -> Result<OwnedFd, (&'static str, std::io::Error)> {
    use rustix::fs::{mkdirat, openat, Mode, OFlags};
    use rustix::mount::{
        fsconfig_create, fsconfig_set_string, fsmount, fsopen, FsMountFlags, FsOpenFlags,
        MountAttrFlags,
    };
    let step = |what: &'static str| move |e: rustix::io::Errno| (what, std::io::Error::from(e));
    let fs = fsopen("tmpfs", FsOpenFlags::FSOPEN_CLOEXEC).map_err(step("make a tmpfs for"))?;
    fsconfig_set_string(&fs, "mode", "0755").map_err(step("make a tmpfs for"))?;
    fsconfig_set_string(&fs, "size", "64k").map_err(step("make a tmpfs for"))?;
    fsconfig_create(&fs).map_err(step("make a tmpfs for"))?;
    let tree = fsmount(
        &fs,
        FsMountFlags::FSMOUNT_CLOEXEC,
        MountAttrFlags::MOUNT_ATTR_NOSUID | MountAttrFlags::MOUNT_ATTR_NODEV,
    )
    .map_err(step("mount a tmpfs for"))?;
    for (p, dir) in points {
        if *dir {
            mkdirat(&tree, p, Mode::from_raw_mode(0o755))
                .map_err(step("make a mount point in the tmpfs over"))?;
        } else {
            openat(
                &tree,
                p,
                OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o444),
            )
            .map_err(step("make a mount point in the tmpfs over"))?;
        }
    }
    Ok(tree)
}

/// In a child that has a mount namespace of its own: every mount private,
/// so that nothing it mounts propagates back to the host's. One raw
/// system call.
pub(super) fn make_mounts_private() -> std::io::Result<()> {
    // SAFETY: mount(2) with integer flags and static NUL-terminated strings.
    let r = unsafe {
        libc::mount(
            c"none".as_ptr(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A detached copy of the mounts at `path` (submounts included), nosuid and
/// nodev, whose ids are shown through `userns`'s mapping when one is given;
/// on failure, the step and error.
fn cloned_tree(
    path: &CString,
    userns: Option<&OwnedFd>,
) -> Result<OwnedFd, (&'static str, std::io::Error)> {
    // SAFETY: `path` is NUL-terminated; open_tree returns a new descriptor.
    let tree = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            path.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as u32 | AT_RECURSIVE | AT_SYMLINK_NOFOLLOW,
        )
    };
    if tree < 0 {
        return Err(("clone", std::io::Error::last_os_error()));
    }
    // SAFETY: open_tree returned a new descriptor owned by nobody else.
    let tree = unsafe { OwnedFd::from_raw_fd(tree as RawFd) };
    let idmap = if userns.is_some() {
        MOUNT_ATTR_IDMAP
    } else {
        0
    };
    set_attrs(&tree, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | idmap, userns)
        .map_err(|e| ("idmap", e))?;
    Ok(tree)
}

/// Sets `attr_set` on the detached tree `tree` and everything below it,
/// with `userns` for an idmapping. One raw system call.
fn set_attrs(tree: &OwnedFd, attr_set: u64, userns: Option<&OwnedFd>) -> std::io::Result<()> {
    let attr = MountAttr {
        attr_set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.map_or(0, |u| u.as_raw_fd() as u64),
    };
    // SAFETY: `attr` is a valid, correctly sized mount_attr; the empty path
    // with AT_EMPTY_PATH names `tree` itself.
    let set = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            (libc::AT_EMPTY_PATH as u32) | AT_RECURSIVE,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if set != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

const OPEN_TREE_CLONE: u32 = 1;
const AT_RECURSIVE: u32 = 0x8000;
const AT_SYMLINK_NOFOLLOW: u32 = 0x100;
const MOVE_MOUNT_F_EMPTY_PATH: u32 = 0x4;
const MOVE_MOUNT_T_EMPTY_PATH: u32 = 0x40;
const MOUNT_ATTR_RDONLY: u64 = 0x1;
const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
const RESOLVE_NO_SYMLINKS: u64 = 0x04;
const RESOLVE_BENEATH: u64 = 0x08;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

/// `struct open_how` of linux/openat2.h.
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// `struct mount_attr` of linux/mount.h.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
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
        let got = remount_paths("bwrap", user, &grants).unwrap();
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
