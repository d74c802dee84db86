//! The overlay of a copy-on-write run on bwrap (`hull run --cow`): its
//! mount options, and, when hull is not root, the user namespace it is
//! mounted in.
//!
//! As root, `identity::Switch::with_overlay` mounts the overlay in the
//! child's private mount namespace before the switch to the sandbox user.
//! As a user, the child first enters a user namespace of its own, mapping
//! only the caller's uid and gid to themselves (no other id exists there,
//! and the caller's capabilities in it reach nothing the caller could not
//! already reach), and a mount namespace owned by it; mounts the overlay
//! there (an unprivileged overlay, Linux 5.11+, with `userxattr`: its
//! whiteouts and opaque marks are `user.overlay.*`); then executes bwrap,
//! which makes its own user namespace inside as it does on every run. The
//! host's mounts never see the overlay.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum CowError {
    #[error("tier bwrap: --cow: the path {path} holds a character an overlay's options cannot carry (`,`, `:` or `\\`); move the project or run without --cow")]
    Path { path: PathBuf },
    #[error("tier bwrap: --cow: {path} contains a NUL byte")]
    Nul { path: PathBuf },
    #[error("tier bwrap: --cow: cannot read {path}: {source}")]
    Inspect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The overlay's mount options: `project` below, `set_dir/upper` above
/// (work directory `set_dir/work`), no redirects, metacopy, index or
/// inode-number mixing (a renamed directory is a copy and a whiteout,
/// which `changes::scan` reads as such); `userxattr` in a user namespace
/// (where the kernel itself makes no redirects).
pub fn options(project: &Path, set_dir: &Path, userxattr: bool) -> Result<String, CowError> {
    let (upper, work) = (set_dir.join("upper"), set_dir.join("work"));
    for p in [project, upper.as_path(), work.as_path()] {
        let bad = p
            .as_os_str()
            .as_bytes()
            .iter()
            .any(|b| matches!(b, b',' | b':' | b'\\'));
        if bad {
            return Err(CowError::Path {
                path: p.to_path_buf(),
            });
        }
    }
    // In a user namespace redirects are never followed nor made
    // (`redirect_dir=nofollow` is implied; naming another is refused).
    Ok(format!(
        "lowerdir={},upperdir={},workdir={},{}metacopy=off,index=off,xino=off{}",
        project.display(),
        upper.display(),
        work.display(),
        if userxattr { "" } else { "redirect_dir=off," },
        if userxattr { ",userxattr" } else { "" }
    ))
}

/// The child's steps when hull is not root, prepared before the fork.
#[derive(Debug)]
pub struct UserOverlay {
    uid_map: CString,
    gid_map: CString,
    target: CString,
    options: CString,
}

impl UserOverlay {
    /// Prepares the overlay of `project` with the change set in `set_dir`;
    /// the upper layer's top takes the project's mode (it is the merged
    /// view's top).
    pub fn prepare(project: &Path, set_dir: &Path) -> Result<UserOverlay, CowError> {
        let nul = |p: &Path| CowError::Nul {
            path: p.to_path_buf(),
        };
        let mode = std::fs::metadata(project)
            .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777)
            .map_err(|source| CowError::Inspect {
                path: project.to_path_buf(),
                source,
            })?;
        let upper = set_dir.join("upper");
        std::fs::set_permissions(&upper, std::os::unix::fs::PermissionsExt::from_mode(mode))
            .map_err(|source| CowError::Inspect {
                path: upper.clone(),
                source,
            })?;
        let uid = rustix::process::getuid().as_raw();
        let gid = rustix::process::getgid().as_raw();
        Ok(UserOverlay {
            uid_map: CString::new(format!("{uid} {uid} 1\n")).map_err(|_| nul(project))?,
            gid_map: CString::new(format!("{gid} {gid} 1\n")).map_err(|_| nul(project))?,
            target: CString::new(project.as_os_str().as_bytes()).map_err(|_| nul(project))?,
            options: CString::new(options(project, set_dir, true)?).map_err(|_| nul(project))?,
        })
    }

    /// In the child, before bwrap is executed: the user and mount
    /// namespaces, the id maps, the overlay. Raw system calls only.
    pub fn apply_in_child(&self) -> std::io::Result<()> {
        let err = std::io::Error::last_os_error;
        // SAFETY: integer flags; NUL-terminated strings `self` owns or
        // static ones; buffers written by length.
        unsafe {
            if libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) != 0 {
                return Err(err());
            }
            write_file(c"/proc/self/setgroups", c"deny")?;
            write_file(c"/proc/self/uid_map", &self.uid_map)?;
            write_file(c"/proc/self/gid_map", &self.gid_map)?;
            if libc::mount(
                c"none".as_ptr(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ) != 0
            {
                return Err(err());
            }
            if libc::mount(
                c"overlay".as_ptr(),
                self.target.as_ptr(),
                c"overlay".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                self.options.as_ptr().cast(),
            ) != 0
            {
                return Err(err());
            }
        }
        Ok(())
    }
}

/// Writes `text` to the file `path` (open, write, close). Async-signal-safe.
///
/// # Safety
/// Raw system calls on NUL-terminated strings.
unsafe fn write_file(path: &std::ffi::CStr, text: &std::ffi::CStr) -> std::io::Result<()> {
    // SAFETY: see the function's contract.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let bytes = text.to_bytes();
        let n = libc::write(fd, bytes.as_ptr().cast(), bytes.len());
        let e = std::io::Error::last_os_error();
        libc::close(fd);
        if n != bytes.len() as isize {
            return Err(e);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_refuse_what_they_cannot_carry() {
        let o = options(Path::new("/p"), Path::new("/s/1"), false).unwrap();
        assert_eq!(
            o,
            "lowerdir=/p,upperdir=/s/1/upper,workdir=/s/1/work,redirect_dir=off,metacopy=off,index=off,xino=off"
        );
        assert_eq!(
            options(Path::new("/p"), Path::new("/s"), true).unwrap(),
            "lowerdir=/p,upperdir=/s/upper,workdir=/s/work,metacopy=off,index=off,xino=off,userxattr"
        );
        for bad in ["/a,b", "/a:b", "/a\\b"] {
            assert!(matches!(
                options(Path::new(bad), Path::new("/s"), false),
                Err(CowError::Path { .. })
            ));
        }
    }
}
