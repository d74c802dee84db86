//! Mounting the host's virtiofs shares in the outer guest, before they are passed
//! into the container as Incus disk devices.
//!
//! Guards against: mounting over guest system directories (every share goes under
//! [`SHARE_ROOT`]), stacking a share on an existing mount, set-uid or device files
//! from the host taking effect (`nosuid,nodev` always), and a read-only share that
//! the kernel mounted writable (checked with `statvfs` after mounting). The guest
//! mount is not the read-only boundary: guest root can remount it; the boundary is
//! the host's `virtiofsd --readonly` (and the container's `readonly=true` device).

use std::path::{Component, Path, PathBuf};

use hull_protocol::Share;

/// Guest directory every share is mounted under.
pub const SHARE_ROOT: &str = "/mnt/hull";

#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("share {tag}: guest path {path} is not below {SHARE_ROOT}")]
    OutsideRoot { tag: String, path: PathBuf },
    #[error("share {tag}: cannot create mount point {path}")]
    Mkdir {
        tag: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("share {tag}: {path} is already a mount point")]
    Busy { tag: String, path: PathBuf },
    #[error("share {tag}: mount -t virtiofs {tag} {path} failed (is a vhost-user-fs device with this tag attached?)")]
    Mount {
        tag: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("share {tag}: {path} was to be read-only but is mounted writable")]
    NotReadOnly { tag: String, path: PathBuf },
    #[error("cannot read /proc/self/mountinfo")]
    MountInfo(#[source] std::io::Error),
    #[error("overlay over share {lower}: {what} {path}")]
    Overlay {
        lower: String,
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What one share mount does, decided before touching the system.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountPlan {
    pub tag: String,
    pub path: PathBuf,
    pub readonly: bool,
    pub noexec: bool,
}

/// Check a share against the guest layout.
pub fn plan(share: &Share) -> Result<MountPlan, MountError> {
    let path = PathBuf::from(&share.guest_path);
    let below = path
        .strip_prefix(SHARE_ROOT)
        .ok()
        .filter(|rest| !rest.as_os_str().is_empty())
        .map(|rest| rest.components().all(|c| matches!(c, Component::Normal(_))))
        .unwrap_or(false);
    if !below {
        return Err(MountError::OutsideRoot {
            tag: share.tag.clone(),
            path,
        });
    }
    Ok(MountPlan {
        tag: share.tag.clone(),
        path,
        readonly: share.readonly,
        // A packed mount serves grants of both kinds: each one's bind
        // into the container carries its own `noexec`.
        noexec: share.noexec && share.subdir.is_none(),
    })
}

/// The mount points below [`SHARE_ROOT`] (the mounted shares).
pub fn mounted_shares() -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    shares_in(&info)
}

/// [`mounted_shares`] of a `mountinfo` text.
pub fn shares_in(mountinfo: &str) -> Vec<PathBuf> {
    mount_points(mountinfo)
        .filter(|p| p.starts_with(SHARE_ROOT) && p != Path::new(SHARE_ROOT))
        .collect()
}

/// Whether `path` is a mount point according to `mountinfo` text.
pub fn is_mount_point(mountinfo: &str, path: &Path) -> bool {
    mount_points(mountinfo).any(|p| p == path)
}

/// The mount points of a `mountinfo` text (field 5, unescaped).
fn mount_points(mountinfo: &str) -> impl Iterator<Item = PathBuf> + '_ {
    mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape(p)))
}

/// `nosuid,nodev` always, read-only for a read-only share, and `noexec`
/// for one whose programs may not run (a `read` grant).
fn share_flags(readonly: bool, noexec: bool) -> rustix::mount::MountFlags {
    use rustix::mount::MountFlags;
    let mut flags = MountFlags::NOSUID | MountFlags::NODEV;
    if readonly {
        flags |= MountFlags::RDONLY;
    }
    if noexec {
        flags |= MountFlags::NOEXEC;
    }
    flags
}

/// Makes the mount at `path` `noexec`, keeping every flag it has (a bind
/// remount sets the flags it is given and clears the others).
fn add_noexec(path: &Path) -> std::io::Result<()> {
    use rustix::fs::StatVfsMountFlags as St;
    use rustix::mount::MountFlags as Ms;
    let have = rustix::fs::statvfs(path)?.f_flag;
    let mut flags = Ms::BIND | Ms::NOEXEC;
    for (st, ms) in [
        (St::RDONLY, Ms::RDONLY),
        (St::NOSUID, Ms::NOSUID),
        (St::NODEV, Ms::NODEV),
        (St::NOATIME, Ms::NOATIME),
        (St::NODIRATIME, Ms::NODIRATIME),
        (St::RELATIME, Ms::RELATIME),
    ] {
        if have.contains(st) {
            flags |= ms;
        }
    }
    rustix::mount::mount_remount(path, flags, "")?;
    Ok(())
}

/// Whether the mount at `path` is `noexec` (`statvfs`).
fn is_no_exec(path: &Path) -> std::io::Result<bool> {
    let st = rustix::fs::statvfs(path)?;
    Ok(st.f_flag.contains(rustix::fs::StatVfsMountFlags::NOEXEC))
}

/// Whether the mount at `path` is read-only (`statvfs`).
fn is_read_only(path: &Path) -> std::io::Result<bool> {
    let st = rustix::fs::statvfs(path)?;
    Ok(st.f_flag.contains(rustix::fs::StatVfsMountFlags::RDONLY))
}

use hull_protocol::mountinfo::unescape;

/// Mount one share as planned.
pub fn mount(p: &MountPlan) -> Result<(), MountError> {
    std::fs::create_dir_all(&p.path).map_err(|source| MountError::Mkdir {
        tag: p.tag.clone(),
        path: p.path.clone(),
        source,
    })?;
    let info = std::fs::read_to_string("/proc/self/mountinfo").map_err(MountError::MountInfo)?;
    if is_mount_point(&info, &p.path) {
        return Err(MountError::Busy {
            tag: p.tag.clone(),
            path: p.path.clone(),
        });
    }
    let mount_err = |source: std::io::Error| MountError::Mount {
        tag: p.tag.clone(),
        path: p.path.clone(),
        source,
    };
    rustix::mount::mount(
        p.tag.as_str(),
        &p.path,
        "virtiofs",
        share_flags(p.readonly, p.noexec),
        None,
    )
    .map_err(|e| mount_err(e.into()))?;
    if p.readonly && !is_read_only(&p.path).map_err(mount_err)? {
        return Err(MountError::NotReadOnly {
            tag: p.tag.clone(),
            path: p.path.clone(),
        });
    }
    Ok(())
}

/// overlayfs's `statfs` magic.
const OVERLAYFS_SUPER_MAGIC: u64 = 0x794c_7630;

/// `--cow`: mounts the writable share of `o` (its `upper/` and `work/`,
/// `nosuid,nodev`) and an overlay of the read-only share mounted at
/// `lower` beneath them, at `<o.guest_path>.merged`; returns that path.
///
/// The overlay keeps its marks (whiteouts aside: opaque directories) in
/// `user.overlay.*` (`userxattr`), the one xattr namespace the host's
/// virtiofsd lets through for this share, and the one `changes::scan`
/// reads on the host. Redirects are neither made nor followed (implied by
/// `userxattr`: a renamed directory is a copy and a deletion), no
/// metacopy, no index, no inode-number mixing. The command never sees the
/// upper share itself, only the overlay.
pub fn mount_overlay(o: &hull_protocol::OverlaySpec, lower: &str) -> Result<PathBuf, MountError> {
    let upper_share = Share {
        tag: o.tag.clone(),
        guest_path: o.guest_path.clone(),
        container_path: o.guest_path.clone(),
        readonly: false,
        subdir: None,
        noexec: false,
    };
    mount(&plan(&upper_share)?)?;
    let merged = PathBuf::from(format!("{}.merged", o.guest_path));
    let err = |what: &'static str, path: &Path| {
        let (lower, path) = (o.lower.clone(), path.to_path_buf());
        move |source: std::io::Error| MountError::Overlay {
            lower,
            what,
            path,
            source,
        }
    };
    let (upper, work) = (
        Path::new(&o.guest_path).join("upper"),
        Path::new(&o.guest_path).join("work"),
    );
    for d in [&upper, &work] {
        let meta = std::fs::symlink_metadata(d).map_err(err("cannot stat", d))?;
        if !meta.is_dir() {
            return Err(err("not a directory:", d)(
                std::io::ErrorKind::NotADirectory.into(),
            ));
        }
    }
    std::fs::create_dir_all(&merged).map_err(err("cannot create", &merged))?;
    let info = std::fs::read_to_string("/proc/self/mountinfo").map_err(MountError::MountInfo)?;
    if is_mount_point(&info, &merged) {
        return Err(err("already mounted:", &merged)(
            std::io::ErrorKind::AlreadyExists.into(),
        ));
    }
    let options = std::ffi::CString::new(overlay_options(lower, &upper, &work)).map_err(|_| {
        err("a NUL byte in the options for", &merged)(std::io::ErrorKind::InvalidInput.into())
    })?;
    rustix::mount::mount(
        "overlay",
        &merged,
        "overlay",
        share_flags(false, false),
        options.as_c_str(),
    )
    .map_err(|e| err("cannot mount the overlay at", &merged)(e.into()))?;
    let fs = rustix::fs::statfs(&merged).map_err(|e| err("cannot statfs", &merged)(e.into()))?;
    if fs.f_type as u64 != OVERLAYFS_SUPER_MAGIC {
        return Err(err("not an overlay:", &merged)(
            std::io::ErrorKind::Other.into(),
        ));
    }
    Ok(merged)
}

/// The overlay's mount options (the paths are hull's own: `/mnt/hull/...`,
/// no `,`, `:` or `\\`).
pub fn overlay_options(lower: &str, upper: &Path, work: &Path) -> String {
    format!(
        "lowerdir={lower},upperdir={},workdir={},userxattr,metacopy=off,index=off,xino=off",
        upper.display(),
        work.display()
    )
}

/// Binds each of `paths` in the container whose init is `pid` read-only
/// onto itself (`nosuid,nodev`), checked after: what the host masks in an
/// overlay's lower layer stays unwritable in the merged view. Call only
/// for a pristine container: the paths are resolved in it as guest root,
/// before anything ran there (what they show is the lower layer, whose
/// protected paths the host refused to mask when they were links).
pub fn protect(pid: u32, paths: &[PathBuf]) -> Result<(), InjectError> {
    let paths = paths.to_vec();
    in_mount_ns(pid, move || {
        for p in &paths {
            bind_read_only(p).map_err(|source| InjectError::Protect {
                path: p.clone(),
                source,
            })?;
            if !is_read_only(p).map_err(|source| InjectError::Protect {
                path: p.clone(),
                source,
            })? {
                return Err(InjectError::Protect {
                    path: p.clone(),
                    source: std::io::Error::other("still writable after the read-only bind"),
                });
            }
        }
        Ok(())
    })
}

/// `p` bound read-only onto itself (`open_tree` of the path itself, never
/// of a link's target, then `move_mount` onto it).
fn bind_read_only(p: &Path) -> std::io::Result<()> {
    use rustix::mount::{
        move_mount, open_tree, MountFlags, MountPropagationFlags, MoveMountFlags, OpenTreeFlags,
    };
    let meta = std::fs::symlink_metadata(p)?;
    if meta.file_type().is_symlink() {
        return Err(std::io::Error::other("a symlink"));
    }
    let tree = open_tree(
        rustix::fs::CWD,
        p,
        OpenTreeFlags::OPEN_TREE_CLONE
            | OpenTreeFlags::OPEN_TREE_CLOEXEC
            | OpenTreeFlags::AT_SYMLINK_NOFOLLOW,
    )?;
    move_mount(
        &tree,
        "",
        rustix::fs::CWD,
        p,
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
    )?;
    rustix::mount::mount_change(p, MountPropagationFlags::PRIVATE)?;
    rustix::mount::mount_remount(p, MountFlags::BIND | share_flags(true, false), "")?;
    Ok(())
}

/// One share to attach to a running container: the guest mount `source`
/// appears at `target` in the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bind {
    pub tag: String,
    pub source: PathBuf,
    pub target: PathBuf,
    pub readonly: bool,
    pub noexec: bool,
}

/// Why a share could not be attached to the running container.
#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    #[error("share {tag}: cannot clone the guest mount {path} (open_tree)")]
    Clone {
        tag: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot enter the mount namespace of container init {pid}")]
    Enter {
        pid: u32,
        #[source]
        source: std::io::Error,
    },
    #[error("share {tag}: cannot attach it at {path} in the container")]
    Attach {
        tag: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("share {tag}: {path} was to be read-only in the container but is writable")]
    NotReadOnly { tag: String, path: PathBuf },
    #[error("share {tag}: {path} was to be noexec in the container (a `read` grant) but is not")]
    NotNoExec { tag: String, path: PathBuf },
    #[error("share {tag}: the command's user cannot be let through to {path}")]
    Reach {
        tag: String,
        path: PathBuf,
        #[source]
        source: ReachError,
    },
    #[error("cannot keep {path} read-only in the container's overlay")]
    Protect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the mount thread failed: {0}")]
    Thread(String),
}

/// Attaches each share's guest mount to the container whose init is `pid`,
/// at its container path, `nosuid,nodev` (and read-only for read-only
/// shares): the tree is cloned in the guest (`open_tree`), then a thread
/// that entered the container's mount namespace moves it into place
/// (`move_mount`) and remounts it with the flags. What Incus's disk device
/// hotplug does, without a helper process per device (a second each under
/// emulation). Call only for a pristine container (nothing has run in it,
/// so no path on the way to a target was planted): the targets are created
/// as guest root.
///
/// A read-only share stays read-only against container root too: the
/// virtiofs superblock was mounted read-only by guest root, which container
/// root cannot change; and the host's `virtiofsd --readonly` refuses every
/// write whatever the guest does.
///
/// `root` is container root's guest uid and gid: the container's rootfs may
/// be an idmapped mount where guest root has no id, so mount points are
/// created as container root.
pub fn inject(pid: u32, root: (u32, u32), binds: &[Bind]) -> Result<(), InjectError> {
    use rustix::mount::{open_tree, OpenTreeFlags};
    let mut trees = Vec::new();
    for b in binds {
        let fd = open_tree(
            rustix::fs::CWD,
            &b.source,
            OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
        )
        .map_err(|e| InjectError::Clone {
            tag: b.tag.clone(),
            path: b.source.clone(),
            source: e.into(),
        })?;
        trees.push((b.clone(), fd));
    }
    in_mount_ns(pid, move || {
        for (b, fd) in &trees {
            attach(b, std::os::fd::AsFd::as_fd(fd), root)?;
        }
        Ok(())
    })
}

/// Runs `f` on a thread that entered the mount namespace of `pid` (with
/// `/` its root and cwd).
fn in_mount_ns<T: Send + 'static>(
    pid: u32,
    f: impl FnOnce() -> Result<T, InjectError> + Send + 'static,
) -> Result<T, InjectError> {
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/mnt"))
        .map_err(|source| InjectError::Enter { pid, source })?;
    // setns(CLONE_NEWNS) changes the calling thread's root and cwd: do it in
    // a thread of its own that first stops sharing them with the others.
    std::thread::Builder::new()
        .name("container-mounts".into())
        .spawn(move || -> Result<T, InjectError> {
            use rustix::thread::{LinkNameSpaceType, UnshareFlags};
            use std::os::fd::AsFd;
            // SAFETY: CLONE_FS only unshares this thread's root, cwd and umask
            // from the other threads; it owns no references into them.
            unsafe { rustix::thread::unshare_unsafe(UnshareFlags::FS) }.map_err(|e| {
                InjectError::Enter {
                    pid,
                    source: e.into(),
                }
            })?;
            rustix::thread::move_into_link_name_space(ns.as_fd(), Some(LinkNameSpaceType::Mount))
                .map_err(|e| InjectError::Enter {
                pid,
                source: e.into(),
            })?;
            rustix::process::chdir("/").map_err(|e| InjectError::Enter {
                pid,
                source: e.into(),
            })?;
            f()
        })
        .map_err(|e| InjectError::Thread(e.to_string()))?
        .join()
        .map_err(|_| InjectError::Thread("it panicked".into()))?
}

/// Lets the command's user through to each share of a container Incus set
/// up (after a boot): [`make_reachable`] for each target, as container root;
/// and makes a `noexec` share `noexec` there (Incus's bind of the guest
/// mount drops the flag), checked after.
pub fn reach(pid: u32, root: (u32, u32), shares: &[Share]) -> Result<(), InjectError> {
    let targets: Vec<(String, PathBuf, bool)> = shares
        .iter()
        .map(|s| (s.name(), PathBuf::from(&s.container_path), s.noexec))
        .collect();
    in_mount_ns(pid, move || {
        for (tag, path, noexec) in &targets {
            as_fs_ids(root, || make_reachable(path)).map_err(|source| InjectError::Reach {
                tag: tag.clone(),
                path: path.clone(),
                source,
            })?;
            let attach_err = |source: std::io::Error| InjectError::Attach {
                tag: tag.clone(),
                path: path.clone(),
                source,
            };
            if *noexec && !is_no_exec(path).map_err(attach_err)? {
                add_noexec(path).map_err(attach_err)?;
            }
            if *noexec && !is_no_exec(path).map_err(attach_err)? {
                return Err(InjectError::NotNoExec {
                    tag: tag.clone(),
                    path: path.clone(),
                });
            }
        }
        Ok(())
    })
}

/// FUSE's `statfs` magic: a virtiofs share, a host directory.
const FUSE_SUPER_MAGIC: u64 = 0x6573_5546;

/// Lets the command's user (not container root) reach `target`, a share's
/// mount point: each directory strictly above it in the container gets
/// search permission for others (o+x; never read or write), as the
/// container's `/root` (0700) would stop it. A directory of a share (a
/// host directory, where the host's modes rule) ends the walk unchanged.
/// Walked from `/` with `O_NOFOLLOW`: a link on the way fails the setup
/// instead of redirecting the change. Run as container root.
pub fn make_reachable(target: &Path) -> Result<(), ReachError> {
    use rustix::fs::{open, Mode, OFlags};
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let root = open("/", flags, Mode::empty()).map_err(ReachError::open(Path::new("/")))?;
    reachable_below(root, target)
}

/// Why a directory on the way to a share could not be let through.
#[derive(Debug, thiserror::Error)]
pub enum ReachError {
    #[error("{} is not a plain absolute path", .0.display())]
    NotPlain(PathBuf),
    #[error("cannot open {} (a link or no directory on the way is refused)", .path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot {what} {}", .path.display())]
    Dir {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl ReachError {
    fn open(path: &Path) -> impl FnOnce(rustix::io::Errno) -> ReachError {
        let path = path.to_path_buf();
        move |e| ReachError::Open {
            path,
            source: e.into(),
        }
    }

    fn at(what: &'static str, path: &Path) -> impl FnOnce(rustix::io::Errno) -> ReachError {
        let path = path.to_path_buf();
        move |e| ReachError::Dir {
            what,
            path,
            source: e.into(),
        }
    }
}

/// [`make_reachable`] with `root` as `/`.
fn reachable_below(root: std::os::fd::OwnedFd, target: &Path) -> Result<(), ReachError> {
    use rustix::fs::{fchmod, fstat, fstatfs, openat, Mode, OFlags};
    let mut names = Vec::new();
    for c in target.components() {
        match c {
            Component::RootDir => {}
            Component::Normal(n) => names.push(n),
            _ => return Err(ReachError::NotPlain(target.to_path_buf())),
        }
    }
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut dir = root;
    let mut at = PathBuf::from("/");
    for name in names.iter().take(names.len().saturating_sub(1)) {
        at.push(name);
        let next = openat(&dir, *name, flags, Mode::empty()).map_err(ReachError::open(&at))?;
        let fs = fstatfs(&next).map_err(ReachError::at("statfs", &at))?;
        if fs.f_type as u64 == FUSE_SUPER_MAGIC {
            return Ok(());
        }
        let st = fstat(&next).map_err(ReachError::at("stat", &at))?;
        let mode = st.st_mode & 0o7777;
        if mode & 0o001 == 0 {
            fchmod(&next, Mode::from_raw_mode(mode | 0o001))
                .map_err(ReachError::at("chmod o+x", &at))?;
        }
        dir = next;
    }
    Ok(())
}

/// Runs `f` with this thread's filesystem ids set to `ids`, then back to 0.
fn as_fs_ids<T>(ids: (u32, u32), f: impl FnOnce() -> T) -> T {
    // SAFETY: setfsuid/setfsgid are raw syscalls that change only the calling
    // thread's filesystem ids (no glibc broadcast to other threads); they
    // take plain integers and cannot fail in a way that corrupts memory.
    unsafe {
        libc::syscall(libc::SYS_setfsgid, ids.1 as libc::c_long);
        libc::syscall(libc::SYS_setfsuid, ids.0 as libc::c_long);
    }
    let r = f();
    // SAFETY: as above; back to guest root's ids (capabilities return with them).
    unsafe {
        libc::syscall(libc::SYS_setfsuid, 0 as libc::c_long);
        libc::syscall(libc::SYS_setfsgid, 0 as libc::c_long);
    }
    r
}

fn attach(
    b: &Bind,
    tree: std::os::fd::BorrowedFd<'_>,
    root: (u32, u32),
) -> Result<(), InjectError> {
    use rustix::mount::{move_mount, MountFlags, MountPropagationFlags, MoveMountFlags};
    let err = |source: std::io::Error| InjectError::Attach {
        tag: b.tag.clone(),
        path: b.target.clone(),
        source,
    };
    as_fs_ids(root, || std::fs::create_dir_all(&b.target)).map_err(err)?;
    as_fs_ids(root, || make_reachable(&b.target)).map_err(|source| InjectError::Reach {
        tag: b.tag.clone(),
        path: b.target.clone(),
        source,
    })?;
    move_mount(
        tree,
        "",
        rustix::fs::CWD,
        &b.target,
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
    )
    .map_err(|e| err(e.into()))?;
    // Nothing mounted below it later propagates back to the guest.
    rustix::mount::mount_change(&b.target, MountPropagationFlags::PRIVATE)
        .map_err(|e| err(e.into()))?;
    rustix::mount::mount_remount(
        &b.target,
        MountFlags::BIND | share_flags(b.readonly, b.noexec),
        "",
    )
    .map_err(|e| err(e.into()))?;
    if b.readonly && !is_read_only(&b.target).map_err(err)? {
        return Err(InjectError::NotReadOnly {
            tag: b.tag.clone(),
            path: b.target.clone(),
        });
    }
    if b.noexec && !is_no_exec(&b.target).map_err(err)? {
        return Err(InjectError::NotNoExec {
            tag: b.tag.clone(),
            path: b.target.clone(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_are_the_mounts_below_the_root() {
        let info = "22 1 0:21 / / rw - ext4 /dev/vda rw\n\
                    30 22 0:30 / /mnt/hull rw - tmpfs t rw\n\
                    31 30 0:31 / /mnt/hull/hull0 rw - virtiofs hull0 rw\n\
                    32 30 0:32 / /mnt/hull/hull1 ro - virtiofs hull1 ro\n\
                    33 22 0:33 / /mnt/hullx rw - tmpfs t rw\n";
        assert_eq!(
            shares_in(info),
            [
                PathBuf::from("/mnt/hull/hull0"),
                PathBuf::from("/mnt/hull/hull1")
            ]
        );
    }

    fn share(path: &str) -> Share {
        Share {
            tag: "project".into(),
            guest_path: path.into(),
            container_path: "/home/u/p".into(),
            readonly: true,
            subdir: None,
            noexec: false,
        }
    }

    #[test]
    fn shares_go_below_the_share_root_only() {
        let p = plan(&share("/mnt/hull/project")).unwrap();
        assert_eq!(p.path, Path::new("/mnt/hull/project"));
        assert!(p.readonly);
        for bad in [
            "/mnt/hull",
            "/mnt/hull/",
            "/etc",
            "/mnt/hullx/a",
            "/mnt/hull/../etc",
            "/mnt/hull/a/../../etc",
        ] {
            assert!(
                matches!(plan(&share(bad)), Err(MountError::OutsideRoot { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn mount_points_are_found_with_escapes() {
        let info = "36 35 0:40 / /mnt/hull/my\\040proj rw - virtiofs project rw\n";
        assert!(is_mount_point(info, Path::new("/mnt/hull/my proj")));
        assert!(!is_mount_point(info, Path::new("/mnt/hull/my")));
    }

    #[test]
    fn the_way_to_a_share_gets_search_permission_only() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        let set = |p: &Path, m: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
        };
        std::fs::create_dir_all(d.path().join("root/proj")).unwrap();
        set(&d.path().join("root"), 0o700);
        set(&d.path().join("root/proj"), 0o700);
        let root = || {
            rustix::fs::open(
                d.path(),
                rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY,
                rustix::fs::Mode::empty(),
            )
            .unwrap()
        };
        reachable_below(root(), Path::new("/root/proj")).unwrap();
        // The way gains o+x and nothing else; the mount point is untouched.
        assert_eq!(mode(&d.path().join("root")), 0o701);
        assert_eq!(mode(&d.path().join("root/proj")), 0o700);
        // A link on the way is refused, and what it points to is unchanged.
        std::fs::create_dir(d.path().join("elsewhere")).unwrap();
        set(&d.path().join("elsewhere"), 0o700);
        std::os::unix::fs::symlink(d.path().join("elsewhere"), d.path().join("home")).unwrap();
        let e = reachable_below(root(), Path::new("/home/u/proj")).unwrap_err();
        assert!(e.to_string().contains("/home"), "{e}");
        assert_eq!(mode(&d.path().join("elsewhere")), 0o700);
        assert!(reachable_below(root(), Path::new("/a/../etc")).is_err());
    }
}
