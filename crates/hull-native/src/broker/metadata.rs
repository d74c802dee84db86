//! The metadata broker of the landlock tier.
//!
//! Landlock does not mediate chmod, chown, utimes or extended attributes,
//! and a command running as the caller owns the caller's files everywhere:
//! it could make `~/.ssh/id_ed25519` world-readable or add an ACL entry to
//! it. When hull is root the command is the sandbox user, but the idmapped
//! writable roots show it as the owner of everything in them, protected
//! paths included (`.git/hooks`, `.hull`, a `deny`ed secret): the same
//! holds there, so the broker serves both. The command's seccomp filter stops every such call
//! (`SECCOMP_RET_USER_NOTIF`, `hull_seccomp::build_broker`) and this thread,
//! in hull, answers it: it resolves the call's file itself (the command's
//! descriptors fetched with `pidfd_getfd`, its cwd through `/proc`), checks
//! the file lies inside a writable root and outside every protection, and
//! then performs the change itself on that descriptor. The command's memory
//! is read once, so changing the path after the check changes nothing, and
//! a symlink planted to point outside resolves to a file outside, which is
//! refused (EPERM). hull acts with the command's uid and no capability (as
//! the caller, or, when hull is root, on a worker thread that took the
//! command's credentials), so the kernel's own permission checks are the
//! same.

use std::ffi::{CString, OsStr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::{err, proc_fd, Task, MAX_PATH};
use crate::policy::{Access, Grant, Policy, Protect, Protection};

/// Longest xattr name and value (XATTR_NAME_MAX, XATTR_SIZE_MAX).
const MAX_XATTR_NAME: usize = 255;
const MAX_XATTR_VALUE: usize = 65536;

/// Where the command may change metadata: the deepest policy entry above a
/// path decides (a writable grant allows; a narrower grant or any
/// protection refuses).
#[derive(Debug, Clone, Default)]
pub struct Scope {
    entries: Vec<(PathBuf, bool)>,
    /// Devices wholly the command's own: a session's own `/tmp` and
    /// `/var/tmp` (tmpfs hull made for it, which its mount namespace
    /// alone shows).
    own_devices: Vec<u64>,
}

impl Scope {
    /// Where the command may change metadata: its writable roots, less
    /// every narrower grant and protection.
    pub fn of(policy: &Policy) -> Scope {
        Scope::built(policy, |g| g.access == Access::ReadWrite, |_| false)
    }

    /// What the command may see at all: every grant, less the hidden
    /// protections (a read-only one stays visible).
    pub fn visible(policy: &Policy) -> Scope {
        Scope::built(policy, |_| true, |p| p.protection != Protection::Hidden)
    }

    /// One entry per grant and protection of `policy`, canonical, allowing
    /// what `grant` and `protect` say.
    // The policy's own paths, resolved once before the command starts, to
    // compare with the paths the kernel gives for the command's files.
    #[allow(clippy::disallowed_methods)]
    fn built(
        policy: &Policy,
        grant: impl Fn(&Grant) -> bool,
        protect: impl Fn(&Protect) -> bool,
    ) -> Scope {
        let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        let grants = policy.grants.iter().map(|g| (canon(&g.path), grant(g)));
        let protects = policy.protects.iter().map(|p| (canon(&p.path), protect(p)));
        Scope {
            entries: grants.chain(protects).collect(),
            own_devices: Vec::new(),
        }
    }

    /// Also allows every file on the devices `devs`: a session's own
    /// scratch tmpfs, whose files the kernel names by paths of the
    /// command's mount namespace, not hull's.
    pub fn with_own_devices(mut self, devs: &[u64]) -> Scope {
        self.own_devices = devs.to_vec();
        self
    }

    /// Whether the file `file` is open on, named `path` by the kernel in
    /// hull's view, is in scope: on one of the command's own devices, or
    /// at an absolute path [`Scope::allows`].
    pub fn allows_file(&self, file: BorrowedFd<'_>, path: &Path) -> bool {
        if !self.own_devices.is_empty() {
            if let Ok(st) = rustix::fs::fstat(file) {
                if self.own_devices.contains(&st.st_dev) {
                    return true;
                }
            }
        }
        path.is_absolute() && self.allows(path)
    }

    pub fn allows(&self, path: &Path) -> bool {
        let mut best: Option<(usize, bool)> = None;
        for (p, allow) in &self.entries {
            if !path.starts_with(p) {
                continue;
            }
            let depth = p.components().count();
            best = match best {
                // At equal depth a refusal wins.
                Some((d, a)) if d > depth || (d == depth && !a) => Some((d, a)),
                _ => Some((depth, *allow)),
            };
        }
        best.is_some_and(|(_, a)| a)
    }
}

/// The file a call names.
pub(super) enum Target {
    Fd(RawFd),
    At {
        dirfd: RawFd,
        path: CString,
        follow: bool,
        empty_path: bool,
    },
}

/// What a call changes.
enum Op {
    Chmod(u32),
    Chown(u32, u32),
    SetXattr {
        name: CString,
        value: Vec<u8>,
        flags: i32,
    },
    RemoveXattr(CString),
    /// None: now.
    Times(Option<[libc::timespec; 2]>),
}

impl Task<'_> {
    /// A NUL-terminated string at `addr`, at most `max` bytes.
    pub(super) fn string(&self, addr: u64, max: usize) -> std::io::Result<CString> {
        if addr == 0 {
            return Err(err(libc::EFAULT));
        }
        let mut out = Vec::new();
        let mut at = addr;
        while out.len() < max {
            // Up to the end of the page: the next may be unmapped.
            let room = 4096 - (at % 4096) as usize;
            let chunk = self.read(at, room.min(max - out.len()))?;
            if chunk.is_empty() {
                return Err(err(libc::EFAULT));
            }
            if let Some(i) = chunk.iter().position(|b| *b == 0) {
                out.extend_from_slice(&chunk[..i]);
                return CString::new(out).map_err(|_| err(libc::EINVAL));
            }
            at += chunk.len() as u64;
            out.extend_from_slice(&chunk);
        }
        Err(err(libc::ENAMETOOLONG))
    }

    fn timespecs(&self, addr: u64) -> std::io::Result<Option<[libc::timespec; 2]>> {
        if addr == 0 {
            return Ok(None);
        }
        let b = self.read(addr, 32)?;
        if b.len() < 32 {
            return Err(err(libc::EFAULT));
        }
        let w = |i: usize| i64::from_ne_bytes(b[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
        Ok(Some([
            libc::timespec {
                tv_sec: w(0),
                tv_nsec: w(1),
            },
            libc::timespec {
                tv_sec: w(2),
                tv_nsec: w(3),
            },
        ]))
    }

    /// `struct timeval[2]` (utimes, futimesat) as timespecs.
    fn timevals(&self, addr: u64) -> std::io::Result<Option<[libc::timespec; 2]>> {
        Ok(self.timespecs(addr)?.map(|t| {
            t.map(|x| libc::timespec {
                tv_sec: x.tv_sec,
                tv_nsec: x.tv_nsec.saturating_mul(1000),
            })
        }))
    }

    /// `struct utimbuf` (utime): access and modification seconds.
    fn utimbuf(&self, addr: u64) -> std::io::Result<Option<[libc::timespec; 2]>> {
        if addr == 0 {
            return Ok(None);
        }
        let b = self.read(addr, 16)?;
        if b.len() < 16 {
            return Err(err(libc::EFAULT));
        }
        let w = |i: usize| i64::from_ne_bytes(b[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
        let ts = |s| libc::timespec {
            tv_sec: s,
            tv_nsec: 0,
        };
        Ok(Some([ts(w(0)), ts(w(1))]))
    }

    /// Opens the file `target` names, as the process would resolve it: an
    /// absolute path in the process's root (`/proc/TID/root`), a relative
    /// one from its cwd or descriptor; no magic link is followed but the
    /// process's own `/proc/self/fd/N`, which names its descriptor N. A
    /// file off the process's mounts is refused: EACCES.
    pub(super) fn resolve(&self, target: &Target) -> std::io::Result<OwnedFd> {
        use crate::runtime::beneath::openat2;
        use rustix::fs::{openat, Mode, OFlags, ResolveFlags};
        let (dirfd, path, follow, empty_path) = match target {
            Target::Fd(n) => return self.fd(*n),
            Target::At {
                dirfd,
                path,
                follow,
                empty_path,
            } => (*dirfd, path.as_bytes(), *follow, *empty_path),
        };
        if let Some(n) = own_descriptor(path).filter(|_| follow) {
            return self.fd(n);
        }
        let dir = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let root = || {
            openat(
                rustix::fs::CWD,
                format!("/proc/{}/root", self.pid),
                dir,
                Mode::empty(),
            )
        };
        let in_root = ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS;
        let (base, rel, resolve) = if path.first() == Some(&b'/') {
            // Absolute: the directory plays no part.
            let rel = &path[path.iter().take_while(|b| **b == b'/').count()..];
            (root()?, rel, in_root)
        } else if dirfd == libc::AT_FDCWD {
            let cwd = openat(
                rustix::fs::CWD,
                format!("/proc/{}/cwd", self.pid),
                dir,
                Mode::empty(),
            )?;
            (cwd, path, ResolveFlags::NO_MAGICLINKS)
        } else {
            (self.fd(dirfd)?, path, ResolveFlags::NO_MAGICLINKS)
        };
        if rel.is_empty() {
            if !empty_path && path.is_empty() {
                return Err(err(libc::ENOENT));
            }
            return self.in_view_or_refused(base, path);
        }
        let mut flags = OFlags::PATH | OFlags::CLOEXEC;
        if !follow {
            flags |= OFlags::NOFOLLOW;
        }
        let rel = OsStr::from_bytes(rel);
        let file = openat2(&base, rel, flags, Mode::empty(), resolve)?;
        if self.in_view(&file)? {
            return Ok(file);
        }
        if resolve.contains(ResolveFlags::IN_ROOT) {
            return self.in_view_or_refused(file, path);
        }
        // An absolute link met on the relative walk was resolved from
        // hull's root, not the process's (it has a mount namespace of its
        // own): walk again in its root, from the base's path as the process
        // sees it. Whatever moves meanwhile, the walk stays in its root.
        let at = rustix::fs::readlinkat(rustix::fs::CWD, proc_fd(base.as_fd()), Vec::new())?;
        let at = at.as_bytes();
        if at.first() != Some(&b'/') {
            return Err(err(libc::EACCES));
        }
        let mut full = std::path::PathBuf::from(OsStr::from_bytes(&at[1..]));
        full.push(rel);
        let file = openat2(&root()?, &full, flags, Mode::empty(), in_root)?;
        self.in_view_or_refused(file, path)
    }

    /// `file` when it lies on the process's own mounts ([`Task::in_view`]);
    /// else EACCES.
    fn in_view_or_refused(&self, file: OwnedFd, path: &[u8]) -> std::io::Result<OwnedFd> {
        if self.in_view(&file)? {
            return Ok(file);
        }
        tracing::debug!(path = %String::from_utf8_lossy(path), "broker: refused a path that resolved off the command's mounts");
        Err(err(libc::EACCES))
    }

    /// Answers a metadata call: performed when its file lies in `scope`.
    /// With `as_command` (hull is root; only on a worker thread, which this
    /// changes for good) the file is resolved and changed with the
    /// command's credentials.
    pub(super) fn metadata(
        &self,
        req: &libc::seccomp_notif,
        scope: &Scope,
        as_command: bool,
    ) -> std::io::Result<()> {
        let (target, op) = decode(self, req.data.nr as i64, &req.data.args)?;
        if as_command {
            super::become_on_this_thread(&super::identity(self.pid)?)?;
        }
        let fd = self.resolve(&target)?;
        self.valid()?;
        let link = rustix::fs::readlinkat(rustix::fs::CWD, proc_fd(fd.as_fd()), Vec::new())?;
        let path = Path::new(OsStr::from_bytes(link.as_bytes()));
        if !scope.allows_file(fd.as_fd(), path) {
            tracing::debug!(path = %path.display(), "broker: refused a metadata change outside the writable roots");
            return Err(err(libc::EPERM));
        }
        perform(fd.as_fd(), &op)
    }
}

/// N, when `path` is `/proc/self/fd/N` or `/proc/thread-self/fd/N`: the
/// caller's own descriptor (hull resolving it would reach its own).
fn own_descriptor(path: &[u8]) -> Option<RawFd> {
    let n = path
        .strip_prefix(b"/proc/self/fd/")
        .or_else(|| path.strip_prefix(b"/proc/thread-self/fd/"))?;
    if n.is_empty() || n.len() > 9 || !n.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(n).ok()?.parse().ok()
}

fn decode(task: &Task<'_>, nr: i64, a: &[u64; 6]) -> std::io::Result<(Target, Op)> {
    let path = |addr: u64| task.string(addr, MAX_PATH);
    let at = |dirfd: u64, addr: u64, follow: bool, empty_path: bool| -> std::io::Result<Target> {
        Ok(Target::At {
            dirfd: dirfd as i32,
            path: path(addr)?,
            follow,
            empty_path,
        })
    };
    let cwd = libc::AT_FDCWD as u64;
    let nofollow = |flags: u64| flags & libc::AT_SYMLINK_NOFOLLOW as u64 != 0;
    let empty = |flags: u64| flags & libc::AT_EMPTY_PATH as u64 != 0;
    let xattr = |name: u64, value: u64, size: u64, flags: u64| -> std::io::Result<Op> {
        if size as usize > MAX_XATTR_VALUE {
            return Err(err(libc::E2BIG));
        }
        let value = if size == 0 {
            Vec::new()
        } else {
            let v = task.read(value, size as usize)?;
            if v.len() != size as usize {
                return Err(err(libc::EFAULT));
            }
            v
        };
        Ok(Op::SetXattr {
            name: task.string(name, MAX_XATTR_NAME + 1)?,
            value,
            flags: flags as i32,
        })
    };
    let remove = |name: u64| -> std::io::Result<Op> {
        Ok(Op::RemoveXattr(task.string(name, MAX_XATTR_NAME + 1)?))
    };
    let mode = |m: u64| Op::Chmod(m as u32 & 0o7777);
    let owner = |u: u64, g: u64| Op::Chown(u as u32, g as u32);
    Ok(match nr {
        libc::SYS_fchmod => (Target::Fd(a[0] as i32), mode(a[1])),
        libc::SYS_fchmodat => (at(a[0], a[1], true, false)?, mode(a[2])),
        libc::SYS_fchmodat2 => (at(a[0], a[1], !nofollow(a[3]), empty(a[3]))?, mode(a[2])),
        libc::SYS_fchown => (Target::Fd(a[0] as i32), owner(a[1], a[2])),
        libc::SYS_fchownat => (
            at(a[0], a[1], !nofollow(a[4]), empty(a[4]))?,
            owner(a[2], a[3]),
        ),
        libc::SYS_setxattr => (at(cwd, a[0], true, false)?, xattr(a[1], a[2], a[3], a[4])?),
        libc::SYS_lsetxattr => (at(cwd, a[0], false, false)?, xattr(a[1], a[2], a[3], a[4])?),
        libc::SYS_fsetxattr => (Target::Fd(a[0] as i32), xattr(a[1], a[2], a[3], a[4])?),
        libc::SYS_removexattr => (at(cwd, a[0], true, false)?, remove(a[1])?),
        libc::SYS_lremovexattr => (at(cwd, a[0], false, false)?, remove(a[1])?),
        libc::SYS_fremovexattr => (Target::Fd(a[0] as i32), remove(a[1])?),
        libc::SYS_utimensat => {
            let target = if a[1] == 0 {
                Target::Fd(a[0] as i32) // futimens
            } else {
                at(a[0], a[1], !nofollow(a[3]), empty(a[3]))?
            };
            (target, Op::Times(task.timespecs(a[2])?))
        }
        #[cfg(target_arch = "x86_64")]
        libc::SYS_chmod => (at(cwd, a[0], true, false)?, mode(a[1])),
        #[cfg(target_arch = "x86_64")]
        libc::SYS_chown => (at(cwd, a[0], true, false)?, owner(a[1], a[2])),
        #[cfg(target_arch = "x86_64")]
        libc::SYS_lchown => (at(cwd, a[0], false, false)?, owner(a[1], a[2])),
        #[cfg(target_arch = "x86_64")]
        libc::SYS_utime => (at(cwd, a[0], true, false)?, Op::Times(task.utimbuf(a[1])?)),
        #[cfg(target_arch = "x86_64")]
        libc::SYS_utimes => (at(cwd, a[0], true, false)?, Op::Times(task.timevals(a[1])?)),
        #[cfg(target_arch = "x86_64")]
        libc::SYS_futimesat => (
            at(a[0], a[1], true, false)?,
            Op::Times(task.timevals(a[2])?),
        ),
        _ => return Err(err(libc::ENOSYS)),
    })
}

/// Performs `op` on the file `fd` refers to (an `O_PATH` descriptor or a
/// duplicate of the command's own).
fn perform(fd: BorrowedFd<'_>, op: &Op) -> std::io::Result<()> {
    let is_link = rustix::fs::fstat(fd)
        .map(|st| rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Symlink)
        .unwrap_or(false);
    let via = CString::new(proc_fd(fd)).map_err(|_| err(libc::EINVAL))?;
    let check = |r: libc::c_int| {
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    match op {
        Op::Chmod(mode) => {
            if is_link {
                return Err(err(libc::EOPNOTSUPP));
            }
            // SAFETY: a NUL-terminated path we own; integer mode.
            check(unsafe { libc::chmod(via.as_ptr(), *mode as libc::mode_t) })
        }
        Op::Chown(uid, gid) => {
            // SAFETY: an fd we own and an empty C string; integer ids.
            check(unsafe {
                libc::fchownat(
                    fd.as_raw_fd(),
                    c"".as_ptr(),
                    *uid,
                    *gid,
                    libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
                )
            })
        }
        Op::SetXattr { name, value, flags } => {
            if is_link {
                return Err(err(libc::EPERM));
            }
            // SAFETY: NUL-terminated strings and a buffer we own, with its length.
            check(unsafe {
                libc::setxattr(
                    via.as_ptr(),
                    name.as_ptr(),
                    value.as_ptr().cast(),
                    value.len(),
                    *flags,
                )
            })
        }
        Op::RemoveXattr(name) => {
            if is_link {
                return Err(err(libc::EPERM));
            }
            // SAFETY: NUL-terminated strings we own.
            check(unsafe { libc::removexattr(via.as_ptr(), name.as_ptr()) })
        }
        Op::Times(times) => {
            let ptr = match times {
                Some(t) => t.as_ptr(),
                None => std::ptr::null(),
            };
            // SAFETY: a path we own; `ptr` is null or two timespecs we own.
            check(unsafe { libc::utimensat(libc::AT_FDCWD, via.as_ptr(), ptr, 0) })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_callers_own_descriptors_are_told_from_other_paths() {
        assert_eq!(own_descriptor(b"/proc/self/fd/3"), Some(3));
        assert_eq!(own_descriptor(b"/proc/thread-self/fd/12"), Some(12));
        for other in [
            &b"/proc/self/fd/"[..],
            b"/proc/self/fd/3/x",
            b"/proc/self/fd/-1",
            b"/proc/self/fd/9999999999",
            b"/proc/1/fd/3",
            b"proc/self/fd/3",
        ] {
            assert_eq!(
                own_descriptor(other),
                None,
                "{}",
                String::from_utf8_lossy(other)
            );
        }
    }

    #[test]
    fn the_deepest_entry_decides() {
        let s = Scope {
            own_devices: Vec::new(),
            entries: vec![
                (PathBuf::from("/home/u"), false),
                (PathBuf::from("/home/u/p"), true),
                (PathBuf::from("/home/u/p/.git"), false),
                (PathBuf::from("/home/u/p/vendor"), false),
                (PathBuf::from("/home/u/p/vendor/scratch"), true),
                (PathBuf::from("/tmp/r"), false),
                (PathBuf::from("/tmp/r/i/tmp"), true),
            ],
        };
        for (p, want) in [
            ("/home/u/p/src/a.c", true),
            ("/home/u/p", true),
            ("/home/u/.ssh/id", false),
            ("/home/u/p/.git/config", false),
            ("/home/u/p/vendor/lib.rs", false),
            ("/home/u/p/vendor/scratch/x", true),
            ("/home/u/pp", false),
            ("/tmp/r/other/tmp/x", false),
            ("/tmp/r/i/tmp/x", true),
            ("/etc/passwd", false),
        ] {
            assert_eq!(s.allows(Path::new(p)), want, "{p}");
        }
    }
}
