//! The overlay of a copy-on-write run on bwrap and landlock (`hull run
//! --cow`): its mount options, the mounts that cover the project's
//! protected paths in it (landlock), and, when hull is not root, the user
//! namespace it is mounted in.
//!
//! As root, `identity::Switch::with_overlay` mounts the overlay in the
//! child's private mount namespace before the switch to the sandbox user.
//! As a user, the child first enters a user namespace of its own, mapping
//! only the caller's uid and gid to themselves (no other id exists there,
//! and the caller's capabilities in it reach nothing the caller could not
//! already reach), and a mount namespace owned by it; mounts the overlay
//! there (an unprivileged overlay, Linux 5.11+, with `userxattr`: its
//! whiteouts and opaque marks are `user.overlay.*`) and, on landlock, the
//! covers; then executes bwrap, which makes its own user namespace inside
//! as it does on every run, or landlock's helper, which drops every
//! capability it has there before it applies its rules. The host's mounts
//! never see the overlay.

use std::ffi::CString;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::mounts;

#[derive(Debug, thiserror::Error)]
pub enum CowError {
    #[error("tier {tier}: --cow: the path {path} holds a character an overlay's options cannot carry (`,`, `:` or `\\`); move the project or run without --cow")]
    Path { tier: &'static str, path: PathBuf },
    #[error("tier {tier}: --cow: {path} contains a NUL byte")]
    Nul { tier: &'static str, path: PathBuf },
    #[error("tier {tier}: --cow: {path} is a symbolic link on the way to a protected path of the project; hull will not cover a path through a link; the command did not run")]
    Symlink { tier: &'static str, path: PathBuf },
    #[error("tier {tier}: --cow: cannot {what} {path}: {source}; the command did not run")]
    Cover {
        tier: &'static str,
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The overlay's mount options: `project` below, `set_dir/layers/upper` above
/// (work directory `set_dir/layers/work`), no redirects, metacopy, index or
/// inode-number mixing (a renamed directory is a copy and a whiteout,
/// which `changes::scan` reads as such); `userxattr` in a user namespace
/// (where the kernel itself makes no redirects).
fn options(
    tier: &'static str,
    project: &Path,
    set_dir: &Path,
    userxattr: bool,
) -> Result<String, CowError> {
    let crate::changes::Layers { upper, work, .. } = crate::changes::Layers::of(set_dir);
    for p in [project, upper.as_path(), work.as_path()] {
        let bad = p
            .as_os_str()
            .as_bytes()
            .iter()
            .any(|b| matches!(b, b',' | b':' | b'\\'));
        if bad {
            return Err(CowError::Path {
                tier,
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
    pub fn prepare(
        tier: &'static str,
        project: &Path,
        set_dir: &Path,
        userxattr: bool,
    ) -> Result<Overlay, CowError> {
        let nul = || CowError::Nul {
            tier,
            path: project.to_path_buf(),
        };
        let options = options(tier, project, set_dir, userxattr)?;
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

/// How a protected path of the project is covered in a `--cow` overlay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cover {
    /// An empty read-only directory or file over it (`.hull`, `deny`).
    Hide,
    /// Itself, bound read-only (`.git`, a read-only grant).
    ReadOnly,
}

/// When the empty trees that hide paths are detached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detach {
    /// In hull, from the host's mounts (hull is root).
    Now,
    /// In the child, in the user namespace it makes (hull is not root: only
    /// there may it copy a mount).
    InChild,
}

/// The covers of a `--cow` overlay on landlock (Landlock cannot hide an
/// entry of a directory it lets the command write without splitting the
/// directory), prepared in hull: the project's path, and for each
/// protected path its path below the project and what goes over it.
#[derive(Debug)]
pub struct Covers {
    root: CString,
    items: Vec<(CString, Source)>,
}

/// What covers one protected path.
#[derive(Debug)]
enum Source {
    /// A read-only empty tree detached in hull.
    Tree(OwnedFd),
    /// The empty directory or file at this path, copied read-only in the
    /// child (early, into the slot, by [`Covers::detach_empties_in_child`]
    /// where the path is covered by then).
    Empty(CString, std::sync::atomic::AtomicI32),
    /// The path itself, bound read-only in the child (where the overlay
    /// exists).
    Itself,
}

impl Covers {
    /// The covers of `protected` (paths inside `project`, with how) for
    /// tier `tier`. A path that is not there is left alone (what the
    /// command makes there lands in the change set, and a change to a
    /// protected path is never applied); a symbolic link on the way to one
    /// refuses the run, naming it. Hidden paths get the run's empty
    /// directory or file (`empty_dir`, `empty_file`), detached as `detach`
    /// says.
    pub fn prepare(
        tier: &'static str,
        project: &Path,
        protected: &[(PathBuf, Cover)],
        empty_dir: &Path,
        empty_file: &Path,
        detach: Detach,
    ) -> Result<Covers, CowError> {
        let cstr = |p: &Path| {
            CString::new(p.as_os_str().as_bytes()).map_err(|_| CowError::Nul {
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
                        return Err(CowError::Cover {
                            tier,
                            what: "inspect",
                            path: at,
                            source,
                        })
                    }
                    Ok(m) if m.file_type().is_symlink() => {
                        return Err(CowError::Symlink { tier, path: at })
                    }
                    Ok(_) => {}
                }
            }
            let source = match cover {
                Cover::ReadOnly => Source::Itself,
                Cover::Hide => {
                    let is_dir = std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir());
                    let empty = cstr(if is_dir { empty_dir } else { empty_file })?;
                    match detach {
                        Detach::InChild => {
                            Source::Empty(empty, std::sync::atomic::AtomicI32::new(-1))
                        }
                        Detach::Now => {
                            let failed = |source| CowError::Cover {
                                tier,
                                what: "make the cover of",
                                path: path.clone(),
                                source,
                            };
                            let t = mounts::cloned_tree(&empty, None)
                                .map_err(|(_, source)| failed(source))?;
                            mounts::set_read_only(&t).map_err(failed)?;
                            Source::Tree(t)
                        }
                    }
                }
            };
            items.push((cstr(rel)?, source));
        }
        Ok(Covers {
            root: cstr(project)?,
            items,
        })
    }

    /// In the child, while the empty directory and file the hidden paths
    /// get are still reachable by their paths (before a session's own
    /// `/tmp` covers the run's directory): their read-only copies, kept for
    /// [`Covers::apply_in_child`]. Raw system calls only.
    pub(crate) fn detach_empties_in_child(&self) -> std::io::Result<()> {
        for (_, source) in &self.items {
            if let Source::Empty(path, early) = source {
                let t = mounts::cloned_tree(path, None).map_err(|(_, e)| e)?;
                mounts::set_read_only(&t)?;
                let old = early.swap(
                    std::os::fd::IntoRawFd::into_raw_fd(t),
                    std::sync::atomic::Ordering::Relaxed,
                );
                if old >= 0 {
                    // SAFETY: a descriptor an earlier call stored.
                    drop(unsafe { OwnedFd::from_raw_fd(old) });
                }
            }
        }
        Ok(())
    }

    /// In the child, after the overlay is mounted over the project: each
    /// path opened below the overlay's root without following any link (a
    /// link the project holds there fails the run), covered, and left
    /// read-only. Raw system calls only.
    pub(super) fn apply_in_child(&self) -> std::io::Result<()> {
        let root = mounts::open_dir(&self.root)?;
        for (rel, source) in &self.items {
            let target = mounts::open_beneath(&root, rel)?;
            let own;
            let cover = match source {
                Source::Tree(t) => t,
                Source::Empty(path, early) => {
                    own = match early.swap(-1, std::sync::atomic::Ordering::Relaxed) {
                        // SAFETY: the descriptor `detach_empties_in_child`
                        // stored, owned by nobody else since the swap.
                        raw if raw >= 0 => unsafe { OwnedFd::from_raw_fd(raw) },
                        _ => {
                            let t = mounts::cloned_tree(path, None).map_err(|(_, e)| e)?;
                            mounts::set_read_only(&t)?;
                            t
                        }
                    };
                    &own
                }
                Source::Itself => {
                    own = mounts::clone_of(&target)?;
                    mounts::set_read_only(&own)?;
                    &own
                }
            };
            mounts::attach(cover, &target)?;
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
    covers: Option<Covers>,
    cwd: Option<CString>,
}

impl UserOverlay {
    /// Prepares the overlay of `project` with the change set in `set_dir`.
    pub fn prepare(
        tier: &'static str,
        project: &Path,
        set_dir: &Path,
    ) -> Result<UserOverlay, CowError> {
        let uid = rustix::process::getuid().as_raw();
        let gid = rustix::process::getgid().as_raw();
        let map = |id: u32| {
            CString::new(format!("{id} {id} 1\n")).map_err(|_| CowError::Nul {
                tier,
                path: project.to_path_buf(),
            })
        };
        Ok(UserOverlay {
            uid_map: map(uid)?,
            gid_map: map(gid)?,
            overlay: Overlay::prepare(tier, project, set_dir, true)?,
            covers: None,
            cwd: None,
        })
    }

    /// Covers the project's protected paths in the overlay (landlock;
    /// bwrap binds its own).
    pub fn with_covers(mut self, covers: Covers) -> UserOverlay {
        self.covers = Some(covers);
        self
    }

    /// Makes the child enter `dir` again once the overlay is there (for a
    /// command started in the project; bwrap sets its own).
    pub fn with_cwd(mut self, tier: &'static str, dir: &Path) -> Result<UserOverlay, CowError> {
        let c = CString::new(dir.as_os_str().as_bytes()).map_err(|_| CowError::Nul {
            tier,
            path: dir.to_path_buf(),
        })?;
        self.cwd = Some(c);
        Ok(self)
    }

    /// In the child, before bwrap or landlock's helper is executed: the
    /// user and mount namespaces, the id maps, the overlay, the covers, the
    /// working directory. Raw system calls only.
    pub fn apply_in_child(&self) -> std::io::Result<()> {
        // SAFETY: unshare takes integer flags.
        if unsafe { libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        crate::exec::spawn::map_ids_in_child(self.uid_map.as_bytes(), self.gid_map.as_bytes())?;
        mounts::make_mounts_private()?;
        self.overlay.mount_in_child()?;
        if let Some(c) = &self.covers {
            c.apply_in_child()?;
        }
        if let Some(cwd) = &self.cwd {
            // SAFETY: chdir to a NUL-terminated path `self` owns.
            if unsafe { libc::chdir(cwd.as_ptr()) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_refuse_what_they_cannot_carry() {
        let o = options("bwrap", Path::new("/p"), Path::new("/s/1"), false).unwrap();
        assert_eq!(
            o,
            "lowerdir=/p,upperdir=/s/1/layers/upper,workdir=/s/1/layers/work,redirect_dir=off,metacopy=off,index=off,xino=off"
        );
        assert_eq!(
            options("bwrap", Path::new("/p"), Path::new("/s"), true).unwrap(),
            "lowerdir=/p,upperdir=/s/layers/upper,workdir=/s/layers/work,metacopy=off,index=off,xino=off,userxattr"
        );
        for bad in ["/a,b", "/a:b", "/a\\b"] {
            assert!(matches!(
                options("bwrap", Path::new(bad), Path::new("/s"), false),
                Err(CowError::Path { .. })
            ));
        }
    }
}
