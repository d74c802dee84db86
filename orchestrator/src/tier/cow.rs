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
}

/// The overlay's mount options: `project` below, `set_dir/layers/upper` above
/// (work directory `set_dir/layers/work`), no redirects, metacopy, index or
/// inode-number mixing (a renamed directory is a copy and a whiteout,
/// which `changes::scan` reads as such); `userxattr` in a user namespace
/// (where the kernel itself makes no redirects).
fn options(project: &Path, set_dir: &Path, userxattr: bool) -> Result<String, CowError> {
    let crate::changes::Layers { upper, work, .. } = crate::changes::Layers::of(set_dir);
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

/// The overlay of a `--cow` run, prepared before the fork and mounted over
/// the project's own path in the child.
#[derive(Debug)]
pub struct Overlay {
    target: CString,
    options: CString,
}

impl Overlay {
    /// The overlay of `project` with the change set in `set_dir`
    /// (`userxattr` in a user namespace). The upper layer's top, the merged
    /// view's top, already has the project's mode (`run::start_cow`).
    pub fn prepare(project: &Path, set_dir: &Path, userxattr: bool) -> Result<Overlay, CowError> {
        let nul = || CowError::Nul {
            path: project.to_path_buf(),
        };
        let options = options(project, set_dir, userxattr)?;
        Ok(Overlay {
            target: CString::new(project.as_os_str().as_bytes()).map_err(|_| nul())?,
            options: CString::new(options).map_err(|_| nul())?,
        })
    }

    /// Makes (and drops) a detached overlay with the same options, here, as
    /// the child will mount it: what the filesystems refuse shows before
    /// the run (as root; in a user namespace the child's mount is the
    /// first try).
    pub fn try_here(&self) -> std::io::Result<()> {
        use rustix::mount::{
            fsconfig_create, fsconfig_set_string, fsmount, fsopen, FsMountFlags, FsOpenFlags,
            MountAttrFlags,
        };
        let fs = fsopen("overlay", FsOpenFlags::FSOPEN_CLOEXEC)?;
        let text = self.options.to_string_lossy();
        // No value holds `,` ([`options`] refuses such paths).
        for kv in text.split(',') {
            match kv.split_once('=') {
                Some((k, v)) => fsconfig_set_string(&fs, k, v)?,
                None => rustix::mount::fsconfig_set_flag(&fs, kv)?,
            }
        }
        fsconfig_create(&fs)?;
        let _tree = fsmount(
            &fs,
            FsMountFlags::FSMOUNT_CLOEXEC,
            MountAttrFlags::MOUNT_ATTR_NOSUID | MountAttrFlags::MOUNT_ATTR_NODEV,
        )?;
        Ok(())
    }

    /// In the child, in a mount namespace of its own: mounts the overlay
    /// over the project. One raw system call.
    pub fn mount_in_child(&self) -> std::io::Result<()> {
        // SAFETY: mount(2) with NUL-terminated strings `self` owns.
        let r = unsafe {
            libc::mount(
                c"overlay".as_ptr(),
                self.target.as_ptr(),
                c"overlay".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                self.options.as_ptr().cast(),
            )
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

/// The child's steps when hull is not root, prepared before the fork.
#[derive(Debug)]
pub struct UserOverlay {
    uid_map: CString,
    gid_map: CString,
    overlay: Overlay,
}

impl UserOverlay {
    /// Prepares the overlay of `project` with the change set in `set_dir`.
    pub fn prepare(project: &Path, set_dir: &Path) -> Result<UserOverlay, CowError> {
        let uid = rustix::process::getuid().as_raw();
        let gid = rustix::process::getgid().as_raw();
        let map = |id: u32| {
            CString::new(format!("{id} {id} 1\n")).map_err(|_| CowError::Nul {
                path: project.to_path_buf(),
            })
        };
        Ok(UserOverlay {
            uid_map: map(uid)?,
            gid_map: map(gid)?,
            overlay: Overlay::prepare(project, set_dir, true)?,
        })
    }

    /// In the child, before bwrap is executed: the user and mount
    /// namespaces, the id maps, the overlay. Raw system calls only.
    pub fn apply_in_child(&self) -> std::io::Result<()> {
        // SAFETY: integer flags; NUL-terminated strings `self` owns or
        // static ones.
        unsafe {
            if libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            write_file(c"/proc/self/setgroups", c"deny")?;
            write_file(c"/proc/self/uid_map", &self.uid_map)?;
            write_file(c"/proc/self/gid_map", &self.gid_map)?;
        }
        super::identity::make_mounts_private()?;
        self.overlay.mount_in_child()
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
            "lowerdir=/p,upperdir=/s/1/layers/upper,workdir=/s/1/layers/work,redirect_dir=off,metacopy=off,index=off,xino=off"
        );
        assert_eq!(
            options(Path::new("/p"), Path::new("/s"), true).unwrap(),
            "lowerdir=/p,upperdir=/s/layers/upper,workdir=/s/layers/work,metacopy=off,index=off,xino=off,userxattr"
        );
        for bad in ["/a,b", "/a:b", "/a\\b"] {
            assert!(matches!(
                options(Path::new(bad), Path::new("/s"), false),
                Err(CowError::Path { .. })
            ));
        }
    }
}
