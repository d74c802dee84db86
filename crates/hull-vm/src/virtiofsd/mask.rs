//! The protected paths of a writable share: each bound read-only onto
//! itself (or masked with an empty read-only tmpfs or file) in a private
//! mount namespace virtiofsd starts in, and a placeholder for one that does
//! not exist yet. Security-critical: what the guest can never write.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use super::{MaskKind, VirtiofsdSpec};
use crate::runtime::placeholder::{self, Held, Wanted};

use super::process::VirtiofsdError;
/// Checks that `mask` lies below `share` with no symlink on the way.
fn check_mask_path(tag: &str, share: &Path, mask: &Path) -> Result<(), VirtiofsdError> {
    let rel = mask
        .strip_prefix(share)
        .ok()
        .filter(|r| !r.as_os_str().is_empty())
        .ok_or_else(|| VirtiofsdError::MaskOutside {
            tag: tag.to_string(),
            path: mask.to_path_buf(),
            share: share.to_path_buf(),
        })?;
    let mut p = share.to_path_buf();
    for c in rel.components() {
        match c {
            Component::Normal(n) => p.push(n),
            _ => {
                return Err(VirtiofsdError::MaskOutside {
                    tag: tag.to_string(),
                    path: mask.to_path_buf(),
                    share: share.to_path_buf(),
                })
            }
        }
        if let Ok(m) = fs::symlink_metadata(&p) {
            if m.file_type().is_symlink() {
                return Err(VirtiofsdError::SymlinkMask {
                    tag: tag.to_string(),
                    path: mask.to_path_buf(),
                    what: if p == mask {
                        "a symlink"
                    } else {
                        "below a symlink"
                    },
                    share: share.to_path_buf(),
                });
            }
        }
    }
    Ok(())
}

/// Placeholders for protected paths that do not exist yet: an empty
/// directory (or file) the mask is mounted on, with missing parents.
/// Held while virtiofsd runs and removed after it is gone when no other
/// run or VM uses them (`runtime::placeholder`).
pub(super) fn hold_placeholders(spec: &VirtiofsdSpec) -> Result<Held, VirtiofsdError> {
    for m in &spec.masks {
        check_mask_path(&spec.tag, &spec.shared_dir, &m.path)?;
    }
    if spec.readonly && spec.overlay != Some(super::OverlayRole::Lower) {
        // Nothing can be created through a read-only share.
        return Ok(Held::default());
    }
    // Every mask: one the plan found there may be another run's
    // placeholder, which this one must hold too (`Wanted::seen`).
    let wanted: Vec<Wanted> = spec
        .masks
        .iter()
        .map(|m| Wanted {
            path: m.path.clone(),
            root: spec.shared_dir.clone(),
            dir: !m.placeholder_is_file,
            seen: fs::symlink_metadata(&m.path).is_ok(),
        })
        .collect();
    placeholder::hold(&wanted, &crate::runtime::runs_root()).map_err(|source| {
        VirtiofsdError::Placeholder {
            tag: spec.tag.clone(),
            source,
        }
    })
}

/// Makes the view of a spec that packs read-only shares: its `shared_dir`
/// and one empty directory in it per bind, each checked to lie directly in
/// the view and each source to be a directory (not a link to one).
pub(super) fn prepare_view(spec: &VirtiofsdSpec) -> Result<(), VirtiofsdError> {
    if spec.views.is_empty() {
        return Ok(());
    }
    let io_err = |what: &str| {
        let (tag, what) = (spec.tag.clone(), what.to_string());
        move |source| VirtiofsdError::Io { tag, what, source }
    };
    if !spec.readonly || !spec.masks.is_empty() {
        return Err(io_err("assemble its view")(io::Error::other(
            "only a read-only share without masks can be a view",
        )));
    }
    fs::create_dir_all(&spec.shared_dir).map_err(io_err("create its view"))?;
    // Real directories only, never a link to one: a mount follows links.
    let real_dir = |p: &Path| fs::symlink_metadata(p).is_ok_and(|m| m.is_dir());
    if !real_dir(&spec.shared_dir) {
        return Err(VirtiofsdError::NotADir {
            tag: spec.tag.clone(),
            path: spec.shared_dir.clone(),
        });
    }
    for v in &spec.views {
        if v.at.parent() != Some(spec.shared_dir.as_path()) {
            return Err(VirtiofsdError::MaskOutside {
                tag: spec.tag.clone(),
                path: v.at.clone(),
                share: spec.shared_dir.clone(),
            });
        }
        if !real_dir(&v.source) {
            return Err(VirtiofsdError::NotADir {
                tag: spec.tag.clone(),
                path: v.source.clone(),
            });
        }
        match fs::create_dir(&v.at) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && real_dir(&v.at) => {}
            Err(e) => return Err(io_err("create a directory of its view")(e)),
        }
    }
    Ok(())
}

/// Mounts prepared before the fork, applied in the child before exec.
pub(super) struct MountPlan {
    userns: bool,
    uid_map: CString,
    gid_map: CString,
    ops: Vec<MountOp>,
}

enum MountOp {
    /// Bind `src` onto `dst`, then remount it read-only keeping `flags`.
    BindRo {
        src: CString,
        dst: CString,
        flags: libc::c_ulong,
    },
    /// An empty read-only tmpfs over the directory `dst`.
    EmptyDir { dst: CString },
    /// `dst` bound onto itself (writable as before): a mount point.
    Pin { dst: CString },
}

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path has a NUL byte"))
}

/// The mount flags of the mount holding `p` that a user namespace may
/// not clear (they must be repeated on a remount).
fn locked_flags(p: &Path) -> io::Result<libc::c_ulong> {
    let c = cstr(p)?;
    // SAFETY: statvfs writes into the zeroed struct we own; `c` is a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let f = st.f_flag;
    let mut out: libc::c_ulong = 0;
    for (st_flag, ms_flag) in [
        (libc::ST_NOSUID, libc::MS_NOSUID),
        (libc::ST_NODEV, libc::MS_NODEV),
        (libc::ST_NOEXEC, libc::MS_NOEXEC),
        (libc::ST_NOATIME, libc::MS_NOATIME),
        (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
        (libc::ST_RELATIME, libc::MS_RELATIME),
    ] {
        if f & st_flag != 0 {
            out |= ms_flag;
        }
    }
    Ok(out)
}

impl MountPlan {
    pub(super) fn new(spec: &VirtiofsdSpec, dir: &Path) -> io::Result<MountPlan> {
        // SAFETY: geteuid/getegid have no preconditions.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        MountPlan::for_ids(spec, dir, uid, gid)
    }

    /// The plan for a process running as `uid`/`gid` (non-root: in a
    /// user namespace of its own, mapping only itself).
    fn for_ids(spec: &VirtiofsdSpec, dir: &Path, uid: u32, gid: u32) -> io::Result<MountPlan> {
        let mut ops = Vec::new();
        // A view: each granted directory bound read-only onto its empty
        // directory (made by [`prepare_view`]). Never writable, whatever
        // the spec says: only read-only shares are packed.
        for v in &spec.views {
            ops.push(MountOp::BindRo {
                src: cstr(&v.source)?,
                dst: cstr(&v.at)?,
                flags: locked_flags(&v.source)?,
            });
        }
        if !spec.views.is_empty() {
            // Then the view itself, with the binds in it, read-only too: the
            // guest can create nothing in the run directory either.
            let view = cstr(&spec.shared_dir)?;
            ops.push(MountOp::BindRo {
                src: view.clone(),
                dst: view,
                flags: locked_flags(&spec.shared_dir)?,
            });
        }
        // Pins first: every directory between the share's root and a
        // mask becomes a mount point of its own, which the guest cannot
        // rename (EBUSY). Renaming an ancestor of a mount is allowed and
        // would let it recreate the masked path unmasked.
        if !spec.readonly {
            let mut pins: Vec<&Path> = Vec::new();
            for m in &spec.masks {
                for a in m.path.ancestors().skip(1) {
                    if a == spec.shared_dir || !a.starts_with(&spec.shared_dir) {
                        break;
                    }
                    if !pins.contains(&a) {
                        pins.push(a);
                    }
                }
            }
            pins.sort_by_key(|p| p.components().count());
            for p in pins {
                if fs::symlink_metadata(p).is_ok_and(|m| m.is_dir()) {
                    ops.push(MountOp::Pin { dst: cstr(p)? });
                }
            }
        }
        let mut empty_file: Option<PathBuf> = None;
        for m in &spec.masks {
            let meta = match fs::symlink_metadata(&m.path) {
                Ok(meta) => meta,
                // Only in a read-only share (writable ones got a
                // placeholder): nothing to hide, and nothing can create it.
                Err(e) if e.kind() == io::ErrorKind::NotFound && spec.readonly => continue,
                Err(e) => return Err(e),
            };
            if meta.file_type().is_symlink() {
                return Err(io::Error::other(format!(
                    "{} became a symlink",
                    m.path.display()
                )));
            }
            let dst = cstr(&m.path)?;
            match m.kind {
                MaskKind::ReadOnly => ops.push(MountOp::BindRo {
                    src: dst.clone(),
                    dst,
                    flags: locked_flags(&m.path)?,
                }),
                MaskKind::Hidden if meta.is_dir() => ops.push(MountOp::EmptyDir { dst }),
                MaskKind::Hidden => {
                    let f = match &empty_file {
                        Some(f) => f.clone(),
                        None => {
                            // Mode 0: a hidden file fails as denied in the
                            // guest, as on the other tiers, never reads
                            // as empty.
                            let f = dir.join("vfs-empty");
                            match fs::remove_file(&f) {
                                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                                _ => {}
                            }
                            fs::write(&f, b"")?;
                            fs::set_permissions(
                                &f,
                                std::os::unix::fs::PermissionsExt::from_mode(0o000),
                            )?;
                            empty_file = Some(f.clone());
                            f
                        }
                    };
                    ops.push(MountOp::BindRo {
                        src: cstr(&f)?,
                        dst,
                        flags: locked_flags(&m.path)?,
                    });
                }
            }
        }
        Ok(MountPlan {
            userns: uid != 0,
            uid_map: CString::new(format!("0 {uid} 1")).map_err(io::Error::other)?,
            gid_map: CString::new(format!("0 {gid} 1")).map_err(io::Error::other)?,
            ops,
        })
    }

    /// Runs in the child between fork and exec: async-signal-safe calls only.
    pub(super) fn apply(&self) -> io::Result<()> {
        // SAFETY: plain system calls on C strings owned by `self`,
        // which outlives the call; no allocation.
        unsafe {
            let flags = if self.userns {
                libc::CLONE_NEWUSER | libc::CLONE_NEWNS
            } else {
                libc::CLONE_NEWNS
            };
            if libc::unshare(flags) != 0 {
                return Err(io::Error::last_os_error());
            }
            if self.userns {
                crate::exec::spawn::map_ids_in_child(
                    self.uid_map.as_bytes(),
                    self.gid_map.as_bytes(),
                )?;
            }
            if libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_SLAVE,
                std::ptr::null(),
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            for op in &self.ops {
                match op {
                    MountOp::BindRo { src, dst, flags } => {
                        if libc::mount(
                            src.as_ptr(),
                            dst.as_ptr(),
                            std::ptr::null(),
                            libc::MS_BIND | libc::MS_REC,
                            std::ptr::null(),
                        ) != 0
                        {
                            return Err(io::Error::last_os_error());
                        }
                        if libc::mount(
                            std::ptr::null(),
                            dst.as_ptr(),
                            std::ptr::null(),
                            libc::MS_BIND
                                | libc::MS_REMOUNT
                                | libc::MS_RDONLY
                                | libc::MS_NOSUID
                                | libc::MS_NODEV
                                | flags,
                            std::ptr::null(),
                        ) != 0
                        {
                            return Err(io::Error::last_os_error());
                        }
                    }
                    MountOp::Pin { dst } => {
                        if libc::mount(
                            dst.as_ptr(),
                            dst.as_ptr(),
                            std::ptr::null(),
                            libc::MS_BIND,
                            std::ptr::null(),
                        ) != 0
                        {
                            return Err(io::Error::last_os_error());
                        }
                    }
                    MountOp::EmptyDir { dst } => {
                        if libc::mount(
                            c"tmpfs".as_ptr(),
                            dst.as_ptr(),
                            c"tmpfs".as_ptr(),
                            libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                            c"size=4k,mode=0000".as_ptr().cast(),
                        ) != 0
                        {
                            return Err(io::Error::last_os_error());
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::virtiofsd::SandboxMode;
    use std::process::Command;

    /// A view packs read-only grants: inside the namespace each is readable
    /// at its directory and nothing can be written through it, even by
    /// root; on the host the view stays empty (no mount leaks out).
    #[test]
    fn a_view_binds_each_grant_read_only_and_only_in_its_namespace() {
        use std::os::unix::process::CommandExt;
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            panic!("this test mounts in a mount namespace of its own and needs root (tests run as root here)");
        }
        let d = tempfile::tempdir().unwrap();
        let (a, b) = (d.path().join("a"), d.path().join("b"));
        fs::create_dir_all(&a).unwrap();
        fs::create_dir_all(&b).unwrap();
        fs::write(a.join("f"), b"from a\n").unwrap();
        fs::write(b.join("g"), b"from b\n").unwrap();
        let view = d.path().join("view-hull3");
        let mut spec = VirtiofsdSpec {
            tag: "hull3".into(),
            shared_dir: view.clone(),
            socket: d.path().join("s.sock"),
            readonly: true,
            sandbox: SandboxMode::Namespace,
            translate: None,
            masks: Vec::new(),
            views: vec![
                super::super::ViewBind {
                    source: a.clone(),
                    at: view.join("0"),
                },
                super::super::ViewBind {
                    source: b.clone(),
                    at: view.join("1"),
                },
            ],
            overlay: None,
        };
        prepare_view(&spec).unwrap();
        let plan = MountPlan::for_ids(&spec, d.path(), 0, 0).unwrap();
        assert!(!plan.userns);
        let script = format!(
            "cd {}; cat 0/f 1/g; echo evil >> 0/f && echo WRITTEN; touch 1/new && echo CREATED; \
             mkdir 2 && echo VIEW-WRITTEN; true",
            view.display()
        );
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c").arg(script);
        // SAFETY: as in `spawn_once`: system calls only, on prepared data.
        unsafe {
            cmd.pre_exec(move || plan.apply());
        }
        let out = cmd.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stdout, "from a\nfrom b\n", "stderr: {stderr}");
        assert!(stderr.contains("Read-only file system"), "{stderr}");
        assert_eq!(fs::read(a.join("f")).unwrap(), b"from a\n");
        assert!(!b.join("new").exists());
        assert!(!view.join("2").exists());
        for at in ["0", "1"] {
            let n = fs::read_dir(view.join(at)).unwrap().count();
            assert_eq!(n, 0, "view/{at} shows a mount on the host");
        }
        // A grant that became a link, or a bind outside the view, is refused.
        std::os::unix::fs::symlink(&a, d.path().join("link")).unwrap();
        spec.views[1].source = d.path().join("link");
        assert!(matches!(
            prepare_view(&spec),
            Err(VirtiofsdError::NotADir { .. })
        ));
        spec.views[1].source = b.clone();
        fs::remove_dir(view.join("1")).unwrap();
        std::os::unix::fs::symlink(d.path(), view.join("1")).unwrap();
        assert!(
            prepare_view(&spec).is_err(),
            "a link planted where a grant is bound"
        );
        fs::remove_file(view.join("1")).unwrap();
        spec.views[1].at = d.path().join("elsewhere");
        assert!(matches!(
            prepare_view(&spec),
            Err(VirtiofsdError::MaskOutside { .. })
        ));
        spec.views[1].at = view.join("1");
        spec.readonly = false;
        assert!(prepare_view(&spec).is_err(), "a writable view");
    }

    /// The masks as an unprivileged user would get them: a user
    /// namespace mapping only that user, the same read-only binds and
    /// empty tmpfs. Checked with a real process writing through them.
    #[test]
    fn masks_hold_for_an_unprivileged_user_in_its_own_namespace() {
        use std::os::unix::fs::PermissionsExt;
        use std::os::unix::process::CommandExt;
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            panic!("this test switches to uid 65534 and needs root (tests run as root here)");
        }
        let d = tempfile::tempdir().unwrap();
        fs::set_permissions(d.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let share = d.path().join("p");
        fs::create_dir_all(share.join(".git")).unwrap();
        fs::create_dir_all(share.join(".hull")).unwrap();
        fs::write(share.join(".git/config"), b"[core]\n").unwrap();
        fs::write(share.join(".hull/policy.toml"), b"secret\n").unwrap();
        for p in [
            &share,
            &share.join(".git"),
            &share.join(".git/config"),
            &share.join(".hull"),
        ] {
            std::os::unix::fs::chown(p, Some(65534), Some(65534)).unwrap();
        }
        let spec = VirtiofsdSpec {
            tag: "p".into(),
            shared_dir: share.clone(),
            socket: d.path().join("s.sock"),
            readonly: false,
            sandbox: SandboxMode::Namespace,
            translate: Some((1000, 1000)),
            masks: vec![
                super::super::HostMask {
                    path: share.join(".git"),
                    kind: MaskKind::ReadOnly,
                    placeholder_is_file: false,
                },
                super::super::HostMask {
                    path: share.join(".hull"),
                    kind: MaskKind::Hidden,
                    placeholder_is_file: false,
                },
            ],
            views: Vec::new(),
            overlay: None,
        };
        let plan = MountPlan::for_ids(&spec, d.path(), 65534, 65534).unwrap();
        assert!(plan.userns);
        let script = format!(
            "cd {}; echo evil >> .git/config && echo GIT-WRITTEN; ls -A .hull | wc -l; \
             cat .hull/policy.toml && echo HULL-READ; echo ok > new && echo NEW-OK; id -u",
            share.display()
        );
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c").arg(script).uid(65534).gid(65534);
        // SAFETY: as in `start_once`: system calls only, on prepared data.
        // The uid switch made the process non-dumpable, which a real
        // unprivileged hull never is; undo that so /proc/self/uid_map
        // stays writable for it, as it is for a real non-root user.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
                plan.apply()
            });
        }
        let out = cmd.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            stdout,
            "0\nNEW-OK\n0\n",
            "stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(fs::read(share.join(".git/config")).unwrap(), b"[core]\n");
        assert_eq!(fs::read(share.join("new")).unwrap(), b"ok\n");
    }

    #[test]
    fn masks_must_be_below_the_share_without_symlinks() {
        let d = tempfile::tempdir().unwrap();
        let share = d.path().join("p");
        fs::create_dir_all(share.join("real")).unwrap();
        std::os::unix::fs::symlink("/etc", share.join("link")).unwrap();
        assert!(check_mask_path("p", &share, &share.join("real/.git")).is_ok());
        assert!(check_mask_path("p", &share, &share.join("missing/.git")).is_ok());
        assert!(matches!(
            check_mask_path("p", &share, &share.join("link")),
            Err(VirtiofsdError::SymlinkMask {
                what: "a symlink",
                ..
            })
        ));
        assert!(matches!(
            check_mask_path("p", &share, &share.join("link/shadow")),
            Err(VirtiofsdError::SymlinkMask {
                what: "below a symlink",
                ..
            })
        ));
        assert!(matches!(
            check_mask_path("p", &share, Path::new("/etc/x")),
            Err(VirtiofsdError::MaskOutside { .. })
        ));
        assert!(matches!(
            check_mask_path("p", &share, &share),
            Err(VirtiofsdError::MaskOutside { .. })
        ));
    }
}
