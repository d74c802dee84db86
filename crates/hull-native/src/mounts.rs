//! The raw calls of the new mount API that the switch to the sandbox user
//! (`identity`) and a copy-on-write run's overlay (`cow`) make: detached
//! copies of mounts (`open_tree`), their attributes (`mount_setattr`),
//! attaching them (`move_mount`), and opening a path below a directory
//! with no link followed (`openat2`). The calls a child makes between
//! clone and exec allocate nothing and take no lock.

use std::ffi::CStr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

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
pub(super) fn cloned_tree(
    path: &CStr,
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
pub(super) fn set_attrs(
    tree: &OwnedFd,
    attr_set: u64,
    userns: Option<&OwnedFd>,
) -> std::io::Result<()> {
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

/// Makes the detached tree `tree` read-only, nosuid and nodev. One raw
/// system call.
pub(super) fn set_read_only(tree: &OwnedFd) -> std::io::Result<()> {
    set_attrs(
        tree,
        MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        None,
    )
}

/// A detached copy of the one mount `target` (a descriptor) lies on, from
/// `target` down (no submounts). One raw system call.
pub(super) fn clone_of(target: &OwnedFd) -> std::io::Result<OwnedFd> {
    // SAFETY: the empty path with AT_EMPTY_PATH names `target` itself;
    // open_tree returns a new descriptor.
    let t = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            target.as_raw_fd(),
            c"".as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as u32 | libc::AT_EMPTY_PATH as u32,
        )
    };
    if t < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(t as RawFd) })
}

/// Attaches the detached tree `tree` onto `target` (a descriptor). One raw
/// system call.
pub(super) fn attach(tree: &OwnedFd, target: &OwnedFd) -> std::io::Result<()> {
    // SAFETY: both descriptors, empty paths.
    let moved = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            target.as_raw_fd(),
            c"".as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    };
    if moved != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Attaches the detached tree `tree` onto the path `target`. One raw
/// system call.
pub(super) fn attach_at(tree: &OwnedFd, target: &CStr) -> std::io::Result<()> {
    // SAFETY: a descriptor and a NUL-terminated path the caller owns.
    let moved = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if moved != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Attaches the devpts `pts` at `/dev/pts` and binds its `ptmx` over
/// `/dev/ptmx` (a session's own terminals). Two raw system calls.
pub(super) fn attach_pts(pts: &OwnedFd) -> std::io::Result<()> {
    attach_at(pts, c"/dev/pts")?;
    // SAFETY: mount(2) of two NUL-terminated static paths, a bind.
    let r = unsafe {
        libc::mount(
            c"/dev/pts/ptmx".as_ptr(),
            c"/dev/ptmx".as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The directory `path` (O_PATH), the last component not followed if it
/// is a link. One raw system call.
pub(super) fn open_dir(path: &CStr) -> std::io::Result<OwnedFd> {
    // SAFETY: open of a NUL-terminated path the caller owns.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `rel` below `root` (O_PATH), with no link followed on the way or at
/// the end and no step above `root`: a link there is an error (ELOOP, or
/// EXDEV for `..` out). One raw system call.
pub(super) fn open_beneath(root: &OwnedFd, rel: &CStr) -> std::io::Result<OwnedFd> {
    let how = OpenHow {
        flags: (libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve: RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS,
    };
    // EAGAIN: a rename or mount elsewhere while a `..` was walked; the
    // walk is made again, as `runtime::beneath::openat2` does (a raw call
    // here: the child between fork and exec allocates nothing).
    let mut tries = 1;
    let fd = loop {
        // SAFETY: `how` is a valid, correctly sized open_how; `rel` is
        // NUL-terminated.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                root.as_raw_fd(),
                rel.as_ptr(),
                &how as *const OpenHow,
                std::mem::size_of::<OpenHow>(),
            )
        };
        if fd >= 0 {
            break fd;
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EAGAIN) || tries >= crate::runtime::beneath::SETTLE_TRIES
        {
            return Err(e);
        }
        tries += 1;
    };
    // SAFETY: openat2 returned a new descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
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
