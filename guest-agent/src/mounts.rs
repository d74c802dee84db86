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
}

/// What one share mount does, decided before touching the system.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountPlan {
    pub tag: String,
    pub path: PathBuf,
    pub readonly: bool,
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
    })
}

/// Whether `path` is a mount point according to `mountinfo` text.
pub fn is_mount_point(mountinfo: &str, path: &Path) -> bool {
    mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|p| Path::new(&unescape(p)) == path)
}

fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = u32::from(b[i + 1] - b'0') * 64
                + u32::from(b[i + 2] - b'0') * 8
                + u32::from(b[i + 3] - b'0');
            out.push(u8::try_from(v).unwrap_or(b'?'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Mount one share as planned.
pub fn mount(p: &MountPlan) -> Result<(), MountError> {
    use rustix::mount::MountFlags;

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
    let mut flags = MountFlags::NOSUID | MountFlags::NODEV;
    if p.readonly {
        flags |= MountFlags::RDONLY;
    }
    rustix::mount::mount(p.tag.as_str(), &p.path, "virtiofs", flags, None).map_err(|e| {
        MountError::Mount {
            tag: p.tag.clone(),
            path: p.path.clone(),
            source: e.into(),
        }
    })?;
    if p.readonly {
        let st = rustix::fs::statvfs(&p.path).map_err(|e| MountError::Mount {
            tag: p.tag.clone(),
            path: p.path.clone(),
            source: e.into(),
        })?;
        if !st.f_flag.contains(rustix::fs::StatVfsMountFlags::RDONLY) {
            return Err(MountError::NotReadOnly {
                tag: p.tag.clone(),
                path: p.path.clone(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn share(path: &str) -> Share {
        Share {
            tag: "project".into(),
            guest_path: path.into(),
            container_path: "/home/u/p".into(),
            readonly: true,
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
}
