//! A landlock session's own `/tmp`, `/var/tmp` and terminals when hull is
//! not root.
//!
//! As root hull makes the session's tmpfs and devpts in its own mount
//! namespace and the child attaches them (`identity::Switch`). A user may
//! make neither there, so a helper process makes them in a user namespace
//! of its own (hull's uid and gid mapped to themselves, nothing else), in
//! which a tmpfs and a devpts may be mounted, and hands back the detached
//! trees and the namespace. hull then binds the Landlock rules to the trees'
//! roots and tells the broker their devices, as it does as root; the
//! child joins that user namespace, makes a mount namespace of its own,
//! and puts the trees over `/tmp`, `/var/tmp` and `/dev/pts`, with each
//! grant that lies below a private directory (a project in `/tmp`, the
//! instance's home) cloned from the host's view first and mounted again at
//! its own path in the tmpfs, and what the command may not write there
//! covered by mounts ([`crate::cow::Covers`]), since the rule that lets
//! it write the tmpfs reaches everything mounted below.
//!
//! The command's capabilities in that user namespace go with the child's
//! setup (`drop_caps`, no new privileges) before Landlock and its filters
//! apply; it owns nothing there that it does not own on the host, and the
//! namespace's ids are its own.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};

use crate::cow::Covers;
use crate::identity::IdentityError;

/// One private directory: where it goes and its tmpfs.
#[derive(Debug)]
struct Scratch {
    path: CString,
    tree: OwnedFd,
    dev: u64,
}

/// The helper's work for one directory, prepared before its fork.
struct Plan {
    size: CString,
    /// Mount points (relative, parents first) and whether each is a
    /// directory.
    points: Vec<(CString, bool)>,
}

/// What the child attaches, prepared in hull ([`UserScratch::prepare`]).
#[derive(Debug)]
pub struct UserScratch {
    tier: &'static str,
    /// The helper's user namespace, which the child joins.
    userns: OwnedFd,
    dirs: Vec<Scratch>,
    pts: OwnedFd,
    /// Each grant below a private directory (outermost only): cloned in
    /// the child before the tmpfs covers it, then attached at its path.
    below: Vec<Below>,
    covers: Vec<Covers>,
    cwd: CString,
}

/// A grant below a private directory: its path, what it was when hull
/// planned the run (device and inode: the clone the child takes by path
/// must be that), and the clone until it is attached.
#[derive(Debug)]
struct Below {
    path: CString,
    id: (u64, u64),
    clone: AtomicI32,
}

impl UserScratch {
    /// Makes the tmpfs of each of `dirs` (a directory and the most bytes it
    /// holds), with a mount point for each of `below` (present paths
    /// strictly inside one of them; the outermost are mounted), and a
    /// devpts. `cwd`: where the child goes once the mounts are made.
    pub fn prepare(
        tier: &'static str,
        dirs: &[(PathBuf, u64)],
        below: &[PathBuf],
        cwd: &Path,
    ) -> Result<UserScratch, IdentityError> {
        let cstr = |p: &Path| {
            CString::new(p.as_os_str().as_bytes()).map_err(|_| IdentityError::Mount {
                tier,
                step: "name",
                path: p.to_path_buf(),
                source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
            })
        };
        let mut outer: Vec<&PathBuf> = below
            .iter()
            .filter(|b| !below.iter().any(|a| a != *b && b.starts_with(a)))
            .collect();
        outer.sort_by_key(|p| (p.components().count(), p.to_path_buf()));
        outer.dedup();
        let mut plans = Vec::new();
        for (dir, size) in dirs {
            let mut points: Vec<(CString, bool)> = Vec::new();
            for b in outer
                .iter()
                .filter(|b| b.starts_with(dir) && b.as_path() != dir.as_path())
            {
                let is_dir = std::fs::symlink_metadata(b).is_ok_and(|m| m.is_dir());
                let rel = b.strip_prefix(dir).unwrap_or(b);
                let n = rel.components().count();
                let mut acc = PathBuf::new();
                for (i, c) in rel.components().enumerate() {
                    acc.push(c);
                    let point = cstr(&acc)?;
                    if !points.iter().any(|(p, _)| *p == point) {
                        points.push((point, i + 1 < n || is_dir));
                    }
                }
            }
            plans.push(Plan {
                size: CString::new((*size).max(1 << 20).to_string()).unwrap_or_default(),
                points,
            });
        }
        let made = helper::make(&plans).map_err(|(step, source)| IdentityError::Mount {
            tier,
            step,
            path: dirs
                .first()
                .map_or_else(|| PathBuf::from("/tmp"), |(p, _)| p.clone()),
            source,
        })?;
        let mut scratch = Vec::new();
        for ((dir, _), tree) in dirs.iter().zip(made.trees) {
            let dev = rustix::fs::fstat(&tree)
                .map_err(|e| IdentityError::Mount {
                    tier,
                    step: "inspect the tmpfs for",
                    path: dir.clone(),
                    source: e.into(),
                })?
                .st_dev;
            scratch.push(Scratch {
                path: cstr(dir)?,
                tree,
                dev,
            });
        }
        Ok(UserScratch {
            tier,
            userns: made.userns,
            dirs: scratch,
            pts: made.pts,
            below: outer
                .iter()
                .filter(|b| {
                    dirs.iter()
                        .any(|(d, _)| b.starts_with(d) && b.as_path() != d.as_path())
                })
                .map(|b| {
                    use std::os::unix::fs::MetadataExt;
                    // Not followed: a link there is refused, not mounted.
                    let m =
                        std::fs::symlink_metadata(b).map_err(|source| IdentityError::Mount {
                            tier,
                            step: "inspect the grant below",
                            path: b.to_path_buf(),
                            source,
                        })?;
                    if m.file_type().is_symlink() {
                        return Err(IdentityError::Mount {
                            tier,
                            step: "mount the grant below (a symbolic link) at",
                            path: b.to_path_buf(),
                            source: std::io::Error::from_raw_os_error(libc::ELOOP),
                        });
                    }
                    Ok(Below {
                        path: cstr(b)?,
                        id: (m.dev(), m.ino()),
                        clone: AtomicI32::new(-1),
                    })
                })
                .collect::<Result<_, IdentityError>>()?,
            covers: Vec::new(),
            cwd: cstr(cwd)?,
        })
    }

    /// What must be covered below the private directories (made with
    /// [`crate::cow::Detach::InChild`]).
    pub fn with_covers(mut self, covers: Vec<Covers>) -> UserScratch {
        self.covers = covers;
        self
    }

    /// The tmpfs roots, detached until the child attaches them: what a
    /// Landlock rule that lets the command write there is bound to.
    pub fn roots(&self) -> impl Iterator<Item = &OwnedFd> {
        self.dirs.iter().map(|d| &d.tree)
    }

    /// The tmpfs devices: the command's own files for the broker.
    pub fn devices(&self) -> Vec<u64> {
        self.dirs.iter().map(|d| d.dev).collect()
    }

    /// The devpts root, detached until the child attaches it.
    pub fn pts_root(&self) -> &OwnedFd {
        &self.pts
    }

    /// The tier, for messages.
    pub fn tier(&self) -> &'static str {
        self.tier
    }

    /// In the child, first of its steps: joins the helper's user
    /// namespace, makes a mount namespace of its own, and makes the mounts.
    /// Raw system calls only, on memory prepared before the fork.
    pub fn apply_in_child(&self) -> std::io::Result<()> {
        let last = || std::io::Error::last_os_error();
        // SAFETY: setns and unshare take a descriptor and integer flags.
        unsafe {
            if libc::setns(self.userns.as_raw_fd(), libc::CLONE_NEWUSER) != 0 {
                return Err(last());
            }
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                return Err(last());
            }
        }
        crate::mounts::make_mounts_private()?;
        // The grants below, and the covers' empty trees, while the host's
        // view is still there to copy them from.
        for b in &self.below {
            let tree = crate::mounts::cloned_tree(&b.path, None).map_err(|(_, e)| e)?;
            // What the path led to now must be what hull planned for: a
            // directory moved there since (by another sandbox that can
            // write a parent of it) would be mounted with the tmpfs's
            // rule, writable.
            // SAFETY: fstat into a zeroed stat on a descriptor we own.
            let same = unsafe {
                let mut st: libc::stat = std::mem::zeroed();
                libc::fstat(std::os::fd::AsRawFd::as_raw_fd(&tree), &mut st) == 0
                    && (st.st_dev, st.st_ino) == b.id
            };
            if !same {
                return Err(std::io::Error::from_raw_os_error(libc::ESTALE));
            }
            b.clone.store(tree_into_raw(tree), Ordering::Relaxed);
        }
        for c in &self.covers {
            c.detach_empties_in_child()?;
        }
        for d in &self.dirs {
            crate::mounts::attach_at(&d.tree, &d.path)?;
        }
        for b in &self.below {
            let raw = b.clone.swap(-1, Ordering::Relaxed);
            if raw < 0 {
                return Err(std::io::Error::from_raw_os_error(libc::EBADF));
            }
            // SAFETY: the descriptor the loop above stored, owned by
            // nobody else since the swap.
            let tree = unsafe { OwnedFd::from_raw_fd(raw) };
            crate::mounts::attach_at(&tree, &b.path)?;
        }
        for c in &self.covers {
            c.apply_in_child()?;
        }
        crate::mounts::attach_pts(&self.pts)?;
        // SAFETY: chdir to a NUL-terminated path `self` owns: the working
        // directory as the new mounts show it.
        if unsafe { libc::chdir(self.cwd.as_ptr()) } != 0 {
            return Err(last());
        }
        Ok(())
    }
}

fn tree_into_raw(tree: OwnedFd) -> RawFd {
    std::os::fd::IntoRawFd::into_raw_fd(tree)
}

/// The helper process that makes the trees in a user namespace of its own.
mod helper {
    use super::*;

    pub(super) struct Made {
        pub userns: OwnedFd,
        pub trees: Vec<OwnedFd>,
        pub pts: OwnedFd,
    }

    const FSCONFIG_SET_STRING: libc::c_uint = 1;
    const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
    const FSOPEN_CLOEXEC: libc::c_uint = 1;
    const FSMOUNT_CLOEXEC: libc::c_uint = 1;
    const MOUNT_ATTR_NOSUID: libc::c_uint = 0x2;
    const MOUNT_ATTR_NODEV: libc::c_uint = 0x4;
    const MOUNT_ATTR_NOEXEC: libc::c_uint = 0x8;

    /// The steps the helper reports a failure at (index into this list).
    const STEPS: [&str; 6] = [
        "make a user namespace for",
        "map the ids of the user namespace for",
        "make a tmpfs for",
        "make a mount point in the tmpfs over",
        "make a devpts for",
        "hand over the trees for",
    ];

    /// Forks the helper, which makes a tmpfs per plan and a devpts, and
    /// sends them and its user namespace back; waits for it.
    pub(super) fn make(plans: &[Plan]) -> Result<Made, (&'static str, std::io::Error)> {
        let uid = rustix::process::getuid().as_raw();
        let gid = rustix::process::getgid().as_raw();
        let uid_map = format!("{uid} {uid} 1\n");
        let gid_map = format!("{gid} {gid} 1\n");
        let (ours, theirs) = rustix::net::socketpair(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::SEQPACKET,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        )
        .map_err(|e| (STEPS[5], std::io::Error::from(e)))?;
        // SAFETY: fork(2) in a process that may have other threads: the
        // child runs `child` only (raw system calls on memory made before
        // the fork, no allocation, no lock) and ends with _exit.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err((STEPS[0], std::io::Error::last_os_error()));
        }
        if pid == 0 {
            drop(ours);
            let code = match child(plans, uid_map.as_bytes(), gid_map.as_bytes(), &theirs) {
                Ok(()) => 0,
                Err((step, errno)) => {
                    let report = [step as i32, errno];
                    // SAFETY: send of 8 stack bytes on our socket.
                    unsafe {
                        libc::send(
                            theirs.as_raw_fd(),
                            report.as_ptr().cast(),
                            std::mem::size_of_val(&report),
                            0,
                        );
                    }
                    1
                }
            };
            // SAFETY: ends the helper without running the parent's atexit
            // handlers or destructors.
            unsafe { libc::_exit(code) };
        }
        drop(theirs);
        let mut got = Vec::new();
        let mut failed = None;
        for _ in 0..plans.len() + 2 {
            match receive(&ours) {
                Ok(Message::Fd(fd)) => got.push(fd),
                Ok(Message::Failed(step, errno)) => {
                    failed = Some((
                        STEPS.get(step as usize).copied().unwrap_or(STEPS[5]),
                        std::io::Error::from_raw_os_error(errno),
                    ));
                    break;
                }
                Err(e) => {
                    failed = Some((STEPS[5], e));
                    break;
                }
            }
        }
        let status = crate::exec::spawn::wait(pid);
        if let Some(f) = failed {
            return Err(f);
        }
        if !status.as_ref().is_ok_and(|s| s.success()) {
            return Err((
                STEPS[5],
                std::io::Error::other(format!("the helper ended with {status:?}")),
            ));
        }
        let pts = got
            .pop()
            .ok_or((STEPS[5], std::io::Error::other("no devpts")))?;
        let userns = got
            .pop()
            .ok_or((STEPS[5], std::io::Error::other("no user namespace")))?;
        Ok(Made {
            userns,
            trees: got,
            pts,
        })
    }

    enum Message {
        Fd(OwnedFd),
        Failed(i32, i32),
    }

    /// One message of the helper: a descriptor, or the step it failed at.
    fn receive(sock: &OwnedFd) -> std::io::Result<Message> {
        let mut data = [0i32; 2];
        let mut space = [0u8; 64];
        let mut iov = [libc::iovec {
            iov_base: data.as_mut_ptr().cast(),
            iov_len: std::mem::size_of_val(&data),
        }];
        // SAFETY: a zeroed msghdr is valid; its pointers are set below to
        // buffers that outlive the call.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = 1;
        msg.msg_control = space.as_mut_ptr().cast();
        msg.msg_controllen = space.len() as _;
        // SAFETY: recvmsg into the buffers above.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: CMSG_FIRSTHDR on the msghdr recvmsg filled.
        let cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
        if !cmsg.is_null() {
            // SAFETY: a control message the kernel wrote into `space`.
            let (level, kind) = unsafe { ((*cmsg).cmsg_level, (*cmsg).cmsg_type) };
            if level == libc::SOL_SOCKET && kind == libc::SCM_RIGHTS {
                let mut fd: RawFd = -1;
                // SAFETY: SCM_RIGHTS data holds at least one descriptor;
                // read unaligned into a local.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        libc::CMSG_DATA(cmsg),
                        (&mut fd as *mut RawFd).cast(),
                        std::mem::size_of::<RawFd>(),
                    );
                }
                // SAFETY: a descriptor the kernel installed for us.
                return Ok(Message::Fd(unsafe { OwnedFd::from_raw_fd(fd) }));
            }
        }
        if n as usize == std::mem::size_of_val(&data) {
            return Ok(Message::Failed(data[0], data[1]));
        }
        Err(std::io::Error::other("the helper ended without a word"))
    }

    /// The helper's work; on failure, the step and errno.
    fn child(
        plans: &[Plan],
        uid_map: &[u8],
        gid_map: &[u8],
        sock: &OwnedFd,
    ) -> Result<(), (usize, i32)> {
        let errno = || std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        // SAFETY: unshare with integer flags.
        if unsafe { libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) } != 0 {
            return Err((0, errno()));
        }
        crate::exec::spawn::map_ids_in_child(uid_map, gid_map)
            .map_err(|e| (1, e.raw_os_error().unwrap_or(0)))?;
        for plan in plans {
            let tree = fs_tree(
                c"tmpfs",
                &[(c"mode", c"1777"), (c"size", plan.size.as_c_str())],
                MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
            )
            .map_err(|e| (2, e))?;
            for (point, dir) in &plan.points {
                // SAFETY: mkdirat/openat below a descriptor we own, with
                // NUL-terminated relative paths made before the fork.
                let made = unsafe {
                    if *dir {
                        libc::mkdirat(tree, point.as_ptr(), 0o755)
                    } else {
                        let fd = libc::openat(
                            tree,
                            point.as_ptr(),
                            libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_CLOEXEC,
                            0o444,
                        );
                        if fd >= 0 {
                            libc::close(fd);
                        }
                        fd.min(0)
                    }
                };
                if made != 0 {
                    return Err((3, errno()));
                }
            }
            send(sock, tree).map_err(|e| (5, e))?;
        }
        // SAFETY: open of a static NUL-terminated path.
        let userns = unsafe { libc::open(c"/proc/self/ns/user".as_ptr(), libc::O_RDONLY) };
        if userns < 0 {
            return Err((0, errno()));
        }
        send(sock, userns).map_err(|e| (5, e))?;
        let pts = fs_tree(
            c"devpts",
            &[(c"ptmxmode", c"0666"), (c"mode", c"0620"), (c"max", c"256")],
            MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC,
        )
        .map_err(|e| (4, e))?;
        send(sock, pts).map_err(|e| (5, e))
    }

    /// A detached mount of a new `fs` with `options`; the errno on failure.
    fn fs_tree(
        fs: &std::ffi::CStr,
        options: &[(&std::ffi::CStr, &std::ffi::CStr)],
        attrs: libc::c_uint,
    ) -> Result<RawFd, i32> {
        let errno = || std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        // SAFETY: the new mount API's calls on NUL-terminated strings that
        // outlive them and descriptors they return.
        unsafe {
            let ctx = libc::syscall(libc::SYS_fsopen, fs.as_ptr(), FSOPEN_CLOEXEC);
            if ctx < 0 {
                return Err(errno());
            }
            let ctx = ctx as RawFd;
            for (k, v) in options {
                if libc::syscall(
                    libc::SYS_fsconfig,
                    ctx,
                    FSCONFIG_SET_STRING,
                    k.as_ptr(),
                    v.as_ptr(),
                    0,
                ) != 0
                {
                    return Err(errno());
                }
            }
            if libc::syscall(
                libc::SYS_fsconfig,
                ctx,
                FSCONFIG_CMD_CREATE,
                std::ptr::null::<libc::c_char>(),
                std::ptr::null::<libc::c_void>(),
                0,
            ) != 0
            {
                return Err(errno());
            }
            let tree = libc::syscall(libc::SYS_fsmount, ctx, FSMOUNT_CLOEXEC, attrs);
            if tree < 0 {
                return Err(errno());
            }
            Ok(tree as RawFd)
        }
    }

    /// Sends `fd` alone in one message; the errno on failure.
    fn send(sock: &OwnedFd, fd: RawFd) -> Result<(), i32> {
        // Room for one descriptor's control message, aligned for cmsghdr.
        #[repr(C)]
        struct Space {
            _align: [libc::cmsghdr; 0],
            bytes: [u8; 32],
        }
        let mut space = Space {
            _align: [],
            bytes: [0; 32],
        };
        let mut byte = [b'f'];
        let mut iov = [libc::iovec {
            iov_base: byte.as_mut_ptr().cast(),
            iov_len: 1,
        }];
        // SAFETY: a zeroed msghdr is valid; its pointers are set to stack
        // buffers that outlive sendmsg; CMSG_* compute within `space`.
        unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = iov.as_mut_ptr();
            msg.msg_iovlen = 1;
            msg.msg_control = space.bytes.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) as _;
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
            std::ptr::copy_nonoverlapping(
                (&fd as *const RawFd).cast::<u8>(),
                libc::CMSG_DATA(cmsg),
                std::mem::size_of::<RawFd>(),
            );
            if libc::sendmsg(sock.as_raw_fd(), &msg, 0) < 0 {
                return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `scratch.apply_in_child()` then `then` in a forked child; its
    /// exit code (the errno on failure).
    fn in_child(scratch: &UserScratch, then: &std::ffi::CStr) -> i32 {
        // SAFETY: the child makes raw calls only (the step, access, _exit).
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let code = match scratch.apply_in_child() {
                // SAFETY: access(2) of a NUL-terminated path.
                Ok(()) => match unsafe { libc::access(then.as_ptr(), libc::F_OK) } {
                    0 => 0,
                    _ => 99,
                },
                Err(e) => e.raw_os_error().unwrap_or(98),
            };
            // SAFETY: ends the child without the parent's handlers.
            unsafe { libc::_exit(code) };
        }
        let st = crate::exec::spawn::wait(pid).expect("wait");
        std::os::unix::process::ExitStatusExt::into_raw(st) >> 8
    }

    /// A grant below a session's private directory is mounted there only
    /// if it is still what hull planned for: one moved into its place
    /// since is refused (ESTALE), not mounted under the tmpfs's writable
    /// rule. The control: unmoved, it is there, its marker with it.
    #[test]
    fn a_grant_moved_after_the_plan_is_not_mounted() {
        let t = tempfile::tempdir().expect("tempdir");
        let private = t.path().join("private");
        let grant = private.join("g");
        std::fs::create_dir_all(&grant).expect("mkdir");
        std::fs::write(grant.join("marker"), "x").expect("marker");
        let plan = || {
            UserScratch::prepare(
                "landlock",
                &[(private.clone(), 1 << 20)],
                std::slice::from_ref(&grant),
                &grant,
            )
            .expect("prepare")
        };
        let marker = CString::new(grant.join("marker").as_os_str().as_bytes()).expect("path");
        assert_eq!(in_child(&plan(), &marker), 0, "the control");
        let scratch = plan();
        std::fs::rename(&grant, private.join("old")).expect("rename");
        std::fs::create_dir(&grant).expect("mkdir");
        std::fs::write(grant.join("marker"), "planted").expect("planted");
        assert_eq!(in_child(&scratch, &marker), libc::ESTALE);
    }
}
