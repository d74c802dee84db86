//! The create broker of the landlock tier: new entries directly in a
//! writable directory that was split around protected paths.
//!
//! The command's filter stops every call that creates, removes, renames or
//! links a directory entry (opens only with `O_CREAT` or `O_TMPFILE`). The
//! broker reads the path once, resolves its parent directory as the command
//! would, and when that parent is not a split directory lets the kernel run
//! the call (`SECCOMP_USER_NOTIF_FLAG_CONTINUE`): Landlock still decides
//! it, so a path changed after the check gains nothing. When it is one, the
//! broker performs the call itself, on its own descriptor of that
//! directory and with the one name it read:
//!
//! - a new file or directory is a spare from the run's pool
//!   ([`crate::spares`]) renamed into place with `RENAME_NOREPLACE`
//!   and given the mode the call asked for (less the command's umask); an
//!   open returns a descriptor of it, added to the command's table
//!   (`SECCOMP_IOCTL_NOTIF_ADDFD`);
//! - a symlink is made, a name removed, or two names in that directory
//!   renamed, by hull; a removed spare file goes back to the pool for a
//!   later create (once nothing holds it open);
//! - a name that is, or holds, a protected path (`.git`, `.hull`, a
//!   narrower grant; ASCII case ignored, for case-folding filesystems) is
//!   refused with EACCES, as Landlock refuses it;
//! - a rename or hard link between that directory and another fails with
//!   EXDEV, as across filesystems (tools copy instead): moving an inode
//!   without a rule of its own into the directory would leave it
//!   unwritable, and moving one out is the kernel's to check;
//! - a removed spare directory that is empty goes back to the pool too, so
//!   a `mkdir`/`rmdir` loop does not use it up;
//! - when the pool is used up, a create fails with EDQUOT, said once.

use std::ffi::{CString, OsStr};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rustix::fs::{AtFlags, Mode, OFlags, RenameFlags};

use super::{err, Task, MAX_PATH};
use crate::spares::Pool;

/// A split writable directory the broker creates in.
#[derive(Debug)]
pub struct Split {
    pub path: PathBuf,
    dir: OwnedFd,
    dev: u64,
    ino: u64,
    /// The protected paths below it.
    around: Vec<PathBuf>,
    pool: Arc<Pool>,
}

impl Split {
    /// Opens `path` (a directory hull resolved from the policy).
    pub fn open(path: &Path, around: Vec<PathBuf>, pool: Arc<Pool>) -> std::io::Result<Split> {
        let dir = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let st = rustix::fs::fstat(&dir)?;
        Ok(Split {
            path: path.to_path_buf(),
            dir,
            dev: st.st_dev,
            ino: st.st_ino,
            around,
            pool,
        })
    }

    /// Whether the command may not create, remove or rename `name` here.
    fn protects(&self, name: &[u8]) -> bool {
        let child = self.path.join(OsStr::from_bytes(name));
        self.around.iter().any(|p| {
            p.starts_with(&child)
                || p.strip_prefix(&self.path)
                    .ok()
                    .and_then(|rel| rel.components().next())
                    .is_some_and(|c| c.as_os_str().as_bytes().eq_ignore_ascii_case(name))
        })
    }
}

/// What the create broker serves: the split directories of one run.
#[derive(Debug)]
pub struct Creates {
    splits: Vec<Split>,
    exhausted: AtomicBool,
}

impl Creates {
    pub fn new(splits: Vec<Split>) -> Creates {
        Creates {
            splits,
            exhausted: AtomicBool::new(false),
        }
    }

    /// The error of a create beyond the pool (`what`: "files" or
    /// "directories"), said once per run.
    fn used_up(&self, d: &Split, what: &str) -> std::io::Error {
        if !self.exhausted.swap(true, Ordering::AcqRel) {
            let set = d.pool.set();
            tracing::warn!(
                "tier landlock: hull prepared {} new files and {} new directories for the \
                 command to create directly in {} (split to keep {} protected), and all the {what} \
                 are used; further ones there fail with \"Disk quota exceeded\". Create them in a \
                 subdirectory, or use --tier bwrap",
                set.files,
                set.dirs,
                d.path.display(),
                d.around
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        err(libc::EDQUOT)
    }
}

/// How a stopped call is answered.
pub(super) enum Answer {
    /// The kernel runs it (Landlock decides).
    Continue,
    /// It returns this value.
    Value(i64),
    /// Already answered (a descriptor was sent with the answer).
    Sent,
}

/// A call, decoded.
enum Call {
    Open {
        dirfd: RawFd,
        path: CString,
        flags: i32,
        mode: u32,
    },
    Mkdir {
        dirfd: RawFd,
        path: CString,
        mode: u32,
    },
    Mknod {
        dirfd: RawFd,
        path: CString,
        mode: u32,
    },
    Symlink {
        target: CString,
        dirfd: RawFd,
        path: CString,
    },
    Link {
        newdirfd: RawFd,
        new: CString,
    },
    Unlink {
        dirfd: RawFd,
        path: CString,
        rmdir: bool,
    },
    Rename {
        olddirfd: RawFd,
        old: CString,
        newdirfd: RawFd,
        new: CString,
        flags: u32,
    },
}

fn decode(t: &Task<'_>, nr: i64, a: &[u64; 6]) -> std::io::Result<Call> {
    let s = |addr: u64| t.string(addr, MAX_PATH);
    let fd = |v: u64| v as i32;
    let cwd = libc::AT_FDCWD;
    Ok(match nr {
        libc::SYS_openat => Call::Open {
            dirfd: fd(a[0]),
            path: s(a[1])?,
            flags: a[2] as i32,
            mode: a[3] as u32,
        },
        libc::SYS_mkdirat => Call::Mkdir {
            dirfd: fd(a[0]),
            path: s(a[1])?,
            mode: a[2] as u32,
        },
        libc::SYS_mknodat => Call::Mknod {
            dirfd: fd(a[0]),
            path: s(a[1])?,
            mode: a[2] as u32,
        },
        libc::SYS_symlinkat => Call::Symlink {
            target: s(a[0])?,
            dirfd: fd(a[1]),
            path: s(a[2])?,
        },
        libc::SYS_linkat => Call::Link {
            newdirfd: fd(a[2]),
            new: s(a[3])?,
        },
        libc::SYS_unlinkat => Call::Unlink {
            dirfd: fd(a[0]),
            path: s(a[1])?,
            rmdir: a[2] as i32 & libc::AT_REMOVEDIR != 0,
        },
        libc::SYS_renameat2 => Call::Rename {
            olddirfd: fd(a[0]),
            old: s(a[1])?,
            newdirfd: fd(a[2]),
            new: s(a[3])?,
            flags: a[4] as u32,
        },
        #[cfg(target_arch = "x86_64")]
        libc::SYS_open => Call::Open {
            dirfd: cwd,
            path: s(a[0])?,
            flags: a[1] as i32,
            mode: a[2] as u32,
        },
        #[cfg(target_arch = "x86_64")]
        libc::SYS_creat => Call::Open {
            dirfd: cwd,
            path: s(a[0])?,
            flags: libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC,
            mode: a[1] as u32,
        },
        #[cfg(target_arch = "x86_64")]
        libc::SYS_mkdir => Call::Mkdir {
            dirfd: cwd,
            path: s(a[0])?,
            mode: a[1] as u32,
        },
        #[cfg(target_arch = "x86_64")]
        libc::SYS_mknod => Call::Mknod {
            dirfd: cwd,
            path: s(a[0])?,
            mode: a[1] as u32,
        },
        #[cfg(target_arch = "x86_64")]
        libc::SYS_symlink => Call::Symlink {
            target: s(a[0])?,
            dirfd: cwd,
            path: s(a[1])?,
        },
        #[cfg(target_arch = "x86_64")]
        libc::SYS_link => Call::Link {
            newdirfd: cwd,
            new: s(a[1])?,
        },
        #[cfg(target_arch = "x86_64")]
        libc::SYS_unlink => Call::Unlink {
            dirfd: cwd,
            path: s(a[0])?,
            rmdir: false,
        },
        #[cfg(target_arch = "x86_64")]
        libc::SYS_rmdir => Call::Unlink {
            dirfd: cwd,
            path: s(a[0])?,
            rmdir: true,
        },
        #[cfg(target_arch = "x86_64")]
        libc::SYS_rename => Call::Rename {
            olddirfd: cwd,
            old: s(a[0])?,
            newdirfd: cwd,
            new: s(a[1])?,
            flags: 0,
        },
        #[cfg(target_arch = "x86_64")]
        libc::SYS_renameat => Call::Rename {
            olddirfd: fd(a[0]),
            old: s(a[1])?,
            newdirfd: fd(a[2]),
            new: s(a[3])?,
            flags: 0,
        },
        _ => return Err(err(libc::ENOSYS)),
    })
}

/// Whether the call with this number is one [`Task::create`] answers.
pub(super) fn is_create_call(nr: i64) -> bool {
    #[cfg(target_arch = "x86_64")]
    if nr == libc::SYS_open {
        return true;
    }
    nr == libc::SYS_openat || crate::seccomp::create_calls().iter().any(|(_, n)| *n == nr)
}

/// A path split into the directory part and its last component. `dir_ok`:
/// trailing slashes are allowed (they name a directory) and dropped.
/// None when the last component is empty, `.` or `..` (the kernel's own
/// error is then the right one).
fn split_last(path: &[u8], dir_ok: bool) -> Option<(&[u8], &[u8])> {
    let mut p = path;
    while dir_ok && p.len() > 1 && p.ends_with(b"/") {
        p = &p[..p.len() - 1];
    }
    let (dir, name) = match p.iter().rposition(|b| *b == b'/') {
        Some(0) => (&p[..1], &p[1..]),
        Some(i) => (&p[..i], &p[i + 1..]),
        None => (&p[..0], p),
    };
    if name.is_empty() || name == b"." || name == b".." {
        return None;
    }
    Some((dir, name))
}

/// The permission bits a new entry gets: asked for, less the umask; never
/// set-id (the landlock filter refuses those before they get here).
fn new_mode(asked: u32, umask: u32, dir: bool) -> u32 {
    let keep = if dir { 0o1777 } else { 0o777 };
    asked & keep & !umask
}

impl Task<'_> {
    /// Answers a create-family call (see the module documentation).
    pub(super) fn create(&self, req: &libc::seccomp_notif, c: &Creates) -> std::io::Result<Answer> {
        let call = decode(self, req.data.nr as i64, &req.data.args)?;
        match call {
            Call::Open {
                dirfd,
                path,
                flags,
                mode,
            } => self.open_in_split(c, dirfd, &path, flags, mode),
            Call::Mkdir { dirfd, path, mode } => {
                let Some((d, name, _)) = self.locate(c, dirfd, path.as_bytes(), true) else {
                    return Ok(Answer::Continue);
                };
                if exists(d, name) {
                    return Err(err(libc::EEXIST));
                }
                if d.protects(name) {
                    return Err(err(libc::EACCES));
                }
                let spare = d
                    .pool
                    .take_dir()
                    .ok_or_else(|| c.used_up(d, "directories"))?;
                let fd = rustix::fs::openat(
                    d.pool.dir(),
                    spare.as_str(),
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )?;
                rustix::fs::fchmod(
                    &fd,
                    Mode::from_raw_mode(new_mode(mode, self.umask()?, true)),
                )?;
                self.valid()?;
                self.place(d, &spare, name)?;
                d.pool.handed(rustix::fs::fstat(&fd)?.st_ino);
                Ok(Answer::Value(0))
            }
            Call::Mknod { dirfd, path, mode } => {
                let Some((d, name, _)) = self.locate(c, dirfd, path.as_bytes(), false) else {
                    return Ok(Answer::Continue);
                };
                let kind = mode & libc::S_IFMT;
                if kind != 0 && kind != libc::S_IFREG {
                    // FIFOs, sockets and devices: not from the pool.
                    return Err(err(libc::EACCES));
                }
                if exists(d, name) {
                    return Err(err(libc::EEXIST));
                }
                if d.protects(name) {
                    return Err(err(libc::EACCES));
                }
                let spare = d.pool.take_file().ok_or_else(|| c.used_up(d, "files"))?;
                let fd = self.open_spare(d, &spare, libc::O_RDONLY)?;
                rustix::fs::fchmod(
                    &fd,
                    Mode::from_raw_mode(new_mode(mode, self.umask()?, false)),
                )?;
                self.valid()?;
                self.place(d, &spare, name)?;
                d.pool.handed(rustix::fs::fstat(&fd)?.st_ino);
                Ok(Answer::Value(0))
            }
            Call::Symlink {
                target,
                dirfd,
                path,
            } => {
                let Some((d, name, _)) = self.locate(c, dirfd, path.as_bytes(), false) else {
                    return Ok(Answer::Continue);
                };
                if exists(d, name) {
                    return Err(err(libc::EEXIST));
                }
                if d.protects(name) {
                    return Err(err(libc::EACCES));
                }
                self.valid()?;
                rustix::fs::symlinkat(target.as_c_str(), &d.dir, name)?;
                if let Some((u, g)) = d.pool.owner() {
                    rustix::fs::chownat(
                        &d.dir,
                        name,
                        Some(rustix::fs::Uid::from_raw(u)),
                        Some(rustix::fs::Gid::from_raw(g)),
                        AtFlags::SYMLINK_NOFOLLOW,
                    )?;
                }
                Ok(Answer::Value(0))
            }
            Call::Link { newdirfd, new } => {
                match self.locate(c, newdirfd, new.as_bytes(), false) {
                    // The linked inode has no rule of its own there.
                    Some(_) => Err(err(libc::EXDEV)),
                    None => Ok(Answer::Continue),
                }
            }
            Call::Unlink { dirfd, path, rmdir } => {
                let Some((d, name, _)) = self.locate(c, dirfd, path.as_bytes(), rmdir) else {
                    return Ok(Answer::Continue);
                };
                if d.protects(name) {
                    return Err(err(libc::EACCES));
                }
                self.valid()?;
                if rmdir {
                    if !d.pool.recycle_dir(&d.dir, name)? {
                        rustix::fs::unlinkat(&d.dir, name, AtFlags::REMOVEDIR)?;
                    }
                } else if !d.pool.recycle(&d.dir, name)? {
                    rustix::fs::unlinkat(&d.dir, name, AtFlags::empty())?;
                }
                Ok(Answer::Value(0))
            }
            Call::Rename {
                olddirfd,
                old,
                newdirfd,
                new,
                flags,
            } => {
                let from = self.locate(c, olddirfd, old.as_bytes(), true);
                let to = self.locate(c, newdirfd, new.as_bytes(), true);
                let (from, to) = match (from, to) {
                    (None, None) => return Ok(Answer::Continue),
                    (Some(f), Some(t)) if std::ptr::eq(f.0, t.0) => ((f.0, f.1), (t.0, t.1)),
                    // Into or out of the split directory: copy instead.
                    _ => return Err(err(libc::EXDEV)),
                };
                let d = from.0;
                if d.protects(from.1) || d.protects(to.1) {
                    return Err(err(libc::EACCES));
                }
                let flags = RenameFlags::from_bits(flags)
                    .filter(|f| (RenameFlags::NOREPLACE | RenameFlags::EXCHANGE).contains(*f))
                    .ok_or_else(|| err(libc::EINVAL))?;
                for (path, name) in [(&old, from.1), (&new, to.1)] {
                    // "name/" names a directory only.
                    if path.as_bytes().ends_with(b"/") && exists(d, name) && !is_dir(d, name) {
                        return Err(err(libc::ENOTDIR));
                    }
                }
                self.valid()?;
                rustix::fs::renameat_with(&d.dir, from.1, &d.dir, to.1, flags)?;
                Ok(Answer::Value(0))
            }
        }
    }

    fn open_in_split(
        &self,
        c: &Creates,
        dirfd: RawFd,
        path: &CString,
        flags: i32,
        mode: u32,
    ) -> std::io::Result<Answer> {
        const O_TMPFILE_BIT: i32 = libc::O_TMPFILE & !libc::O_DIRECTORY;
        if flags & O_TMPFILE_BIT != 0 {
            // An unnamed file in the directory, which Landlock refuses:
            // say the filesystem cannot (callers fall back to a named one).
            return match self.directory(c, dirfd, path.as_bytes()) {
                Some(_) => Err(err(libc::EOPNOTSUPP)),
                None => Ok(Answer::Continue),
            };
        }
        if flags & (libc::O_DIRECTORY | libc::O_PATH) != 0 {
            return Ok(Answer::Continue);
        }
        let Some((d, name, view)) = self.locate(c, dirfd, path.as_bytes(), false) else {
            return Ok(Answer::Continue);
        };
        if exists(d, name) {
            // Opens what is there: Landlock decides (a file of the
            // project, a spare placed earlier).
            return if flags & libc::O_EXCL != 0 {
                Err(err(libc::EEXIST))
            } else {
                Ok(Answer::Continue)
            };
        }
        if d.protects(name) {
            return Err(err(libc::EACCES));
        }
        let spare = d.pool.take_file().ok_or_else(|| c.used_up(d, "files"))?;
        let keep = libc::O_ACCMODE
            | libc::O_APPEND
            | libc::O_NONBLOCK
            | libc::O_DSYNC
            | libc::O_SYNC
            | libc::O_DIRECT
            | libc::O_NOATIME
            | libc::O_LARGEFILE;
        let ino =
            rustix::fs::statat(d.pool.dir(), spare.as_str(), AtFlags::SYMLINK_NOFOLLOW)?.st_ino;
        self.valid()?;
        match self.place(d, &spare, name) {
            Ok(()) => {}
            // Made meanwhile (another process of the command).
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                return if flags & libc::O_EXCL != 0 {
                    Err(e)
                } else {
                    Ok(Answer::Continue)
                };
            }
            Err(e) => return Err(e),
        }
        // Opened where the command sees it, so that what it later does
        // through the descriptor (fchmod, futimens) passes the same owner
        // checks as on a file it opened itself; and only if it is still
        // the spare just placed (the command may rename entries there).
        let flags_now =
            OFlags::from_bits_retain((flags & keep) as u32) | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(&view, name, flags_now, Mode::empty())?;
        if rustix::fs::fstat(&fd)?.st_ino != ino {
            return Err(err(libc::EAGAIN));
        }
        d.pool.handed(ino);
        rustix::fs::fchmod(
            &fd,
            Mode::from_raw_mode(new_mode(mode, self.umask()?, false)),
        )?;
        self.send_fd(fd.as_fd(), flags & libc::O_CLOEXEC != 0)?;
        Ok(Answer::Sent)
    }

    fn open_spare(&self, d: &Split, spare: &str, flags: i32) -> std::io::Result<OwnedFd> {
        let flags = OFlags::from_bits_retain(flags as u32) | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        Ok(rustix::fs::openat(
            d.pool.dir(),
            spare,
            flags,
            Mode::empty(),
        )?)
    }

    /// Renames spare `spare` to `name` in `d`, never over an entry.
    fn place(&self, d: &Split, spare: &str, name: &[u8]) -> std::io::Result<()> {
        rustix::fs::renameat_with(d.pool.dir(), spare, &d.dir, name, RenameFlags::NOREPLACE)?;
        Ok(())
    }

    /// Adds `fd` to the command's table and answers the call with its
    /// number, in one step.
    fn send_fd(&self, fd: std::os::fd::BorrowedFd<'_>, cloexec: bool) -> std::io::Result<()> {
        let mut add = libc::seccomp_notif_addfd {
            id: self.id,
            flags: libc::SECCOMP_ADDFD_FLAG_SEND as u32,
            srcfd: fd.as_raw_fd() as u32,
            newfd: 0,
            newfd_flags: if cloexec { libc::O_CLOEXEC as u32 } else { 0 },
        };
        // SAFETY: the ioctl reads one seccomp_notif_addfd we own.
        let r = unsafe {
            libc::ioctl(
                self.listener.as_raw_fd(),
                libc::SECCOMP_IOCTL_NOTIF_ADDFD,
                &mut add as *mut libc::seccomp_notif_addfd,
            )
        };
        if r < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// The command's umask, from `/proc/TID/status`.
    #[allow(clippy::disallowed_methods)] // procfs: the kernel's, of a task the pending notification pins
    fn umask(&self) -> std::io::Result<u32> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid))?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("Umask:"))
            .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
            .ok_or_else(|| err(libc::ESRCH))
    }

    /// The split directory `path`'s parent is, with the last component;
    /// None when it is not one (or cannot be resolved: the kernel then
    /// says why).
    fn locate<'c, 'p>(
        &self,
        c: &'c Creates,
        dirfd: RawFd,
        path: &'p [u8],
        dir_ok: bool,
    ) -> Option<(&'c Split, &'p [u8], OwnedFd)> {
        let (dir, name) = split_last(path, dir_ok)?;
        let (d, view) = self.directory(c, dirfd, dir)?;
        Some((d, name, view))
    }

    /// The split directory `dir` (relative to `dirfd` as the command
    /// resolves it) is, if any, with a descriptor of it as the command sees
    /// it (through its own mounts: when hull is root, the idmapped ones).
    fn directory<'c>(
        &self,
        c: &'c Creates,
        dirfd: RawFd,
        dir: &[u8],
    ) -> Option<(&'c Split, OwnedFd)> {
        use rustix::fs::openat;
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let base: OwnedFd = if dir.first() == Some(&b'/') {
            openat(
                rustix::fs::CWD,
                format!("/proc/{}/root", self.pid),
                flags,
                Mode::empty(),
            )
            .ok()?
        } else if dirfd == libc::AT_FDCWD {
            openat(
                rustix::fs::CWD,
                format!("/proc/{}/cwd", self.pid),
                flags,
                Mode::empty(),
            )
            .ok()?
        } else {
            self.fd(dirfd).ok()?
        };
        let rel = trim_leading_slashes(dir);
        let target = if rel.is_empty() {
            base
        } else {
            openat(&base, OsStr::from_bytes(rel), flags, Mode::empty()).ok()?
        };
        let st = rustix::fs::fstat(&target).ok()?;
        let d = c
            .splits
            .iter()
            .find(|d| d.dev == st.st_dev && d.ino == st.st_ino)?;
        Some((d, target))
    }
}

fn trim_leading_slashes(p: &[u8]) -> &[u8] {
    let n = p.iter().take_while(|b| **b == b'/').count();
    &p[n..]
}

fn exists(d: &Split, name: &[u8]) -> bool {
    rustix::fs::statat(&d.dir, name, AtFlags::SYMLINK_NOFOLLOW).is_ok()
}

fn is_dir(d: &Split, name: &[u8]) -> bool {
    rustix::fs::statat(&d.dir, name, AtFlags::SYMLINK_NOFOLLOW)
        .map(|st| {
            rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Directory
        })
        .unwrap_or(false)
}

#[cfg(test)]
// Tests build their trees by path.
#[allow(clippy::disallowed_methods)]
mod tests {
    use super::*;

    #[test]
    fn the_last_component_is_split_off() {
        let s = |p: &str, d| {
            split_last(p.as_bytes(), d).map(|(a, b)| {
                (
                    String::from_utf8_lossy(a).into_owned(),
                    String::from_utf8_lossy(b).into_owned(),
                )
            })
        };
        let pair = |a: &str, b: &str| Some((a.to_string(), b.to_string()));
        assert_eq!(s("out.txt", false), pair("", "out.txt"));
        assert_eq!(s("/p/out.txt", false), pair("/p", "out.txt"));
        assert_eq!(s("/out", false), pair("/", "out"));
        assert_eq!(s("a/b/c", false), pair("a/b", "c"));
        assert_eq!(s("target/", true), pair("", "target"));
        assert_eq!(s("target//", true), pair("", "target"));
        assert_eq!(s("target/", false), None, "a file named with a slash");
        for p in ["", ".", "..", "a/..", "a/.", "/"] {
            assert_eq!(s(p, true), None, "{p}");
        }
    }

    #[test]
    fn modes_lose_the_umask_and_set_id_bits() {
        assert_eq!(new_mode(0o666, 0o022, false), 0o644);
        assert_eq!(new_mode(0o6777, 0o002, false), 0o775);
        assert_eq!(new_mode(0o1777, 0o022, true), 0o1755);
        assert_eq!(new_mode(0o2777, 0o022, true), 0o755);
    }

    #[test]
    fn protected_names_and_their_ancestors_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let hull = d.path().join(".hull");
        std::fs::create_dir(&hull).unwrap();
        let pool = Arc::new(Pool::create(&hull, "t", None, 1, 1, false).unwrap());
        let p = d.path();
        let split = Split::open(
            p,
            vec![p.join(".git"), p.join(".hull"), p.join("vendor/lib")],
            pool,
        )
        .unwrap();
        for name in [".git", ".GIT", ".Hull", ".hull", "vendor", "VENDOR"] {
            assert!(split.protects(name.as_bytes()), "{name}");
        }
        for name in [
            "target",
            "git",
            ".gitignore",
            "vendor2",
            "out.txt",
            ".hull2",
        ] {
            assert!(!split.protects(name.as_bytes()), "{name}");
        }
    }
}
