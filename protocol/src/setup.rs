//! Tier-3 setup: what the host asks the outer agent to build (`Configure`)
//! and what it reports back (`Configured`).
//!
//! Guards against: names and paths that would be reinterpreted by Incus or the
//! mount code (names are restricted to a safe alphabet, paths must be
//! absolute, normalised and NUL-free), unbounded lists, and mapping container
//! root to guest root (uid or gid 0 is refused). It does not check that the
//! shares exist or that the host enforces read-only: the host does that.

use serde::{Deserialize, Serialize};

use crate::limits::{MAX_NAME, MAX_PATH, MAX_SHARES, MAX_SOFTWARE};

/// Longest virtiofs tag (the kernel's limit).
pub const MAX_TAG: usize = 36;

/// One virtiofs share, mounted in the guest and passed into the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Share {
    /// virtiofs tag the host's virtiofsd serves.
    pub tag: String,
    /// Where the outer agent mounts it in the guest.
    pub guest_path: String,
    /// Where it appears in the container (the same path as on the host).
    pub container_path: String,
    /// Mounted and passed read-only (already enforced by `virtiofsd --readonly` on the host).
    pub readonly: bool,
    /// When set, the container sees this directory of the mount rather
    /// than its root: read-only shares packed into one virtiofs device
    /// (one directory each, bound read-only on the host), which share one
    /// tag and mount. Digits and ASCII letters only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subdir: Option<String>,
    /// Programs may not be executed from it in the container (`noexec`):
    /// a `read` grant, where `read_exec` and `read_write` may.
    #[serde(default)]
    pub noexec: bool,
}

impl Share {
    /// The guest directory the container sees: the mount, or its
    /// [`Share::subdir`] (checked by [`ConfigureSpec::validate`]).
    pub fn source(&self) -> String {
        match &self.subdir {
            Some(d) => format!("{}/{d}", self.guest_path),
            None => self.guest_path.clone(),
        }
    }

    /// A name unique among the shares of a valid spec (the tag, and the
    /// subdir of a packed share).
    pub fn name(&self) -> String {
        match &self.subdir {
            Some(d) => format!("{}-{d}", self.tag),
            None => self.tag.clone(),
        }
    }
}

/// A `--cow` run's overlay: the guest mounts the writable share `tag` (its
/// `upper/` and `work/`), mounts an overlay of the read-only share `lower`
/// beneath them, and attaches that overlay at `lower`'s container path
/// instead of the share itself. The upper share is never attached to the
/// container. Each path of `protect` (inside the overlay's container path)
/// is then bound read-only onto itself in the container, as the host's
/// masks make it in the lower layer: what the command cannot write in an
/// ordinary run, it cannot write in its change set either.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverlaySpec {
    /// virtiofs tag of the writable share holding `upper/` and `work/`.
    pub tag: String,
    /// Where the outer agent mounts that share in the guest.
    pub guest_path: String,
    /// The tag of the read-only share that is the lower layer.
    pub lower: String,
    /// Container paths bound read-only onto themselves over the overlay.
    #[serde(default)]
    pub protect: Vec<String>,
}

/// Most paths in [`OverlaySpec::protect`].
pub const MAX_PROTECT: usize = 256;

/// The per-instance container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContainerSpec {
    /// Incus container name.
    pub name: String,
    /// The base to clone (container or snapshot, `base` or `base/snap`).
    pub base: String,
    /// Guest uid the commands run as, mapped into the container (never 0).
    pub uid: u32,
    /// Guest gid the commands run as (never 0).
    pub gid: u32,
    /// `limits.memory` in bytes.
    pub memory_bytes: Option<u64>,
    /// `limits.cpu`.
    pub cpus: Option<u32>,
    /// `limits.processes`.
    pub processes: Option<u32>,
}

/// The `Configure` payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigureSpec {
    pub shares: Vec<Share>,
    pub container: ContainerSpec,
    /// Host wall clock in nanoseconds since the Unix epoch: the guest sets its
    /// clock from it (a restored snapshot's clock is frozen).
    pub clock_unix_ns: u64,
    /// Snapshot preparation: start the container with no shares and keep it
    /// pristine; the VM is then saved, and each restore sends one ordinary
    /// `Configure` for the same container, which adds the shares and limits.
    #[serde(default)]
    pub prepare: bool,
    /// The run's network channel (net.mode = "allowlist"): the outer agent
    /// listens on the container's loopback and carries each connection over
    /// the [`crate::netmux::PORT_NAME`] port to hull's proxy. `None`: the
    /// container has no network at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkSpec>,
    /// `--cow`: the overlay shown at the project's path. `None`: the
    /// shares as they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlay: Option<OverlaySpec>,
}

/// Where the container's end of the network channel listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkSpec {
    /// The TCP port on the container's 127.0.0.1 (`HTTP_PROXY` points there).
    pub listen_port: u16,
}

/// The `Configured` payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Configured {
    /// The container that is now running the inner agent.
    pub container: String,
    /// The inner agent's `Hello.software`.
    pub inner_software: String,
}

impl ConfigureSpec {
    pub fn validate(&self) -> Result<(), String> {
        if self.shares.len() > MAX_SHARES {
            return Err(format!(
                "{} shares, more than {MAX_SHARES}",
                self.shares.len()
            ));
        }
        for (i, s) in self.shares.iter().enumerate() {
            check_tag(&s.tag).map_err(|r| format!("shares[{i}].tag {r}"))?;
            check_path(&s.guest_path).map_err(|r| format!("shares[{i}].guest_path {r}"))?;
            check_path(&s.container_path).map_err(|r| format!("shares[{i}].container_path {r}"))?;
            if let Some(d) = &s.subdir {
                check_subdir(d).map_err(|r| format!("shares[{i}].subdir {r}"))?;
                if !s.readonly {
                    return Err(format!(
                        "shares[{i}] has a subdir but is writable (only read-only shares are packed)"
                    ));
                }
            }
            for o in self.shares[..i].iter().filter(|o| o.tag == s.tag) {
                // One device, one mount: packed shares agree on both, and
                // each names a directory of its own.
                let packed = s.subdir.is_some()
                    && o.subdir.is_some()
                    && o.subdir != s.subdir
                    && o.guest_path == s.guest_path
                    && o.readonly == s.readonly;
                if !packed {
                    return Err(format!("shares[{i}].tag is used twice"));
                }
            }
        }
        if self.prepare && !self.shares.is_empty() {
            return Err(
                "a prepare configure takes no shares (they are added after restore)".into(),
            );
        }
        match self.network {
            Some(_) if self.prepare => {
                return Err(
                    "a prepare configure takes no network (it is added after restore)".into(),
                )
            }
            Some(NetworkSpec { listen_port: 0 }) => {
                return Err("network.listen_port must not be 0".into())
            }
            _ => {}
        }
        if let Some(o) = &self.overlay {
            self.validate_overlay(o)?;
        }
        self.container.validate()
    }

    /// The overlay names one read-only, unpacked share as its lower layer,
    /// its upper share has a tag and mount of its own, and every protected
    /// path lies strictly inside the lower share's container path.
    fn validate_overlay(&self, o: &OverlaySpec) -> Result<(), String> {
        if self.prepare {
            return Err("a prepare configure takes no overlay".into());
        }
        check_tag(&o.tag).map_err(|r| format!("overlay.tag {r}"))?;
        check_path(&o.guest_path).map_err(|r| format!("overlay.guest_path {r}"))?;
        if self
            .shares
            .iter()
            .any(|s| s.tag == o.tag || s.guest_path == o.guest_path)
        {
            return Err("overlay.tag or overlay.guest_path is also a share's".into());
        }
        let lower: Vec<&Share> = self.shares.iter().filter(|s| s.tag == o.lower).collect();
        let [lower] = lower.as_slice() else {
            return Err("overlay.lower names no share, or a packed one".into());
        };
        if !lower.readonly || lower.subdir.is_some() {
            return Err("overlay.lower must be a read-only share of its own".into());
        }
        if o.protect.len() > MAX_PROTECT {
            return Err(format!(
                "overlay.protect has {} paths, more than {MAX_PROTECT}",
                o.protect.len()
            ));
        }
        let root = std::path::Path::new(&lower.container_path);
        for (i, p) in o.protect.iter().enumerate() {
            check_path(p).map_err(|r| format!("overlay.protect[{i}] {r}"))?;
            let inside = std::path::Path::new(p)
                .strip_prefix(root)
                .is_ok_and(|rest| !rest.as_os_str().is_empty());
            if !inside {
                return Err(format!(
                    "overlay.protect[{i}] is not inside {}",
                    lower.container_path
                ));
            }
        }
        Ok(())
    }
}

impl ContainerSpec {
    pub fn validate(&self) -> Result<(), String> {
        check_name(&self.name).map_err(|r| format!("container.name {r}"))?;
        check_base(&self.base).map_err(|r| format!("container.base {r}"))?;
        if self.uid == 0 || self.gid == 0 {
            return Err(
                "container uid and gid must not be 0 (container root is never guest root)".into(),
            );
        }
        if self.cpus == Some(0) || self.processes == Some(0) || self.memory_bytes == Some(0) {
            return Err("container limits must be positive when given".into());
        }
        Ok(())
    }
}

impl Configured {
    pub fn validate(&self) -> Result<(), String> {
        check_name(&self.container).map_err(|r| format!("container {r}"))?;
        if self.inner_software.len() > MAX_SOFTWARE {
            return Err(format!(
                "inner_software is longer than {MAX_SOFTWARE} bytes"
            ));
        }
        Ok(())
    }
}

/// Incus instance names: letters, digits and `-`, starting with a letter.
fn check_name(s: &str) -> Result<(), &'static str> {
    if s.is_empty() || s.len() > MAX_NAME {
        return Err("must be 1 to 63 bytes");
    }
    if !s.starts_with(|c: char| c.is_ascii_alphabetic()) || s.ends_with('-') {
        return Err("must start with a letter and not end with '-'");
    }
    if !s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        return Err("may only contain ASCII letters, digits and '-'");
    }
    Ok(())
}

/// `name` or `name/snapshot`, each part an instance-style name.
fn check_base(s: &str) -> Result<(), &'static str> {
    let mut parts = s.splitn(2, '/');
    check_name(parts.next().unwrap_or(""))?;
    if let Some(snap) = parts.next() {
        check_name(snap)?;
    }
    Ok(())
}

fn check_tag(s: &str) -> Result<(), &'static str> {
    if s.is_empty() || s.len() > MAX_TAG {
        return Err("must be 1 to 36 bytes");
    }
    if !s
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
    {
        return Err("may only contain ASCII letters, digits, '-', '_' and '.'");
    }
    Ok(())
}

fn check_subdir(s: &str) -> Result<(), &'static str> {
    if s.is_empty() || s.len() > MAX_TAG {
        return Err("must be 1 to 36 bytes");
    }
    if !s.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err("may only contain ASCII letters and digits");
    }
    Ok(())
}

fn check_path(s: &str) -> Result<(), &'static str> {
    if !s.starts_with('/') {
        return Err("must be absolute");
    }
    if s.len() > MAX_PATH {
        return Err("is too long");
    }
    if s.contains('\0') {
        return Err("contains a NUL byte");
    }
    if s.split('/').any(|c| c == ".." || c == ".") {
        return Err("must not contain '.' or '..' components");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> ConfigureSpec {
        ConfigureSpec {
            shares: vec![Share {
                tag: "project".into(),
                guest_path: "/mnt/hull/project".into(),
                container_path: "/home/u/proj".into(),
                readonly: false,
                subdir: None,
                noexec: false,
            }],
            container: ContainerSpec {
                name: "hull-1234".into(),
                base: "base/ready".into(),
                uid: 1000,
                gid: 1000,
                memory_bytes: Some(512 << 20),
                cpus: Some(1),
                processes: Some(512),
            },
            clock_unix_ns: 1,
            prepare: false,
            network: None,
            overlay: None,
        }
    }

    #[test]
    fn an_overlay_covers_one_read_only_share_and_protects_inside_it() {
        let mut s = spec();
        s.shares[0].readonly = true;
        s.overlay = Some(OverlaySpec {
            tag: "hull7".into(),
            guest_path: "/mnt/hull/hull7".into(),
            lower: "project".into(),
            protect: vec!["/home/u/proj/.git".into(), "/home/u/proj/.hull".into()],
        });
        assert_eq!(s.validate(), Ok(()));
        // Without one the field is left out: an older agent reads it.
        assert!(!serde_json::to_string(&spec()).unwrap().contains("overlay"));
        for (i, bad) in [
            |x: &mut ConfigureSpec| x.shares[0].readonly = false,
            |x: &mut ConfigureSpec| x.overlay.as_mut().unwrap().lower = "other".into(),
            |x: &mut ConfigureSpec| x.overlay.as_mut().unwrap().tag = "project".into(),
            |x: &mut ConfigureSpec| {
                x.overlay.as_mut().unwrap().guest_path = "/mnt/hull/project".into()
            },
            |x: &mut ConfigureSpec| {
                x.overlay.as_mut().unwrap().protect = vec!["/home/u/proj".into()]
            },
            |x: &mut ConfigureSpec| {
                x.overlay.as_mut().unwrap().protect = vec!["/home/u/projx/.git".into()]
            },
            |x: &mut ConfigureSpec| {
                x.overlay.as_mut().unwrap().protect = vec!["/home/u/proj/../etc".into()]
            },
            |x: &mut ConfigureSpec| {
                x.overlay.as_mut().unwrap().protect = vec!["/home/u/proj/a".into(); 257]
            },
            |x: &mut ConfigureSpec| {
                x.shares.clear();
                x.prepare = true
            },
        ]
        .into_iter()
        .enumerate()
        {
            let mut t = s.clone();
            bad(&mut t);
            assert!(t.validate().is_err(), "case {i}: {t:?}");
        }
    }

    #[test]
    fn valid_spec_passes() {
        assert_eq!(spec().validate(), Ok(()));
    }

    #[test]
    fn rejects_bad_fields() {
        let mut s = spec();
        s.container.uid = 0;
        assert!(s.validate().is_err());
        let mut s = spec();
        s.shares[0].guest_path = "/mnt/../etc".into();
        assert!(s.validate().is_err());
        let mut s = spec();
        s.shares[0].container_path = "relative".into();
        assert!(s.validate().is_err());
        let mut s = spec();
        s.container.name = "1bad".into();
        assert!(s.validate().is_err());
        let mut s = spec();
        s.container.name = "a;rm".into();
        assert!(s.validate().is_err());
        let mut s = spec();
        s.shares[0].tag = "x".repeat(37);
        assert!(s.validate().is_err());
        let mut s = spec();
        s.shares.push(s.shares[0].clone());
        assert!(s.validate().is_err());
    }

    #[test]
    fn the_network_is_a_port_and_never_part_of_a_prepare() {
        let mut s = spec();
        s.network = Some(NetworkSpec { listen_port: 3128 });
        assert_eq!(s.validate(), Ok(()));
        let text = serde_json::to_string(&s).unwrap();
        assert!(
            text.contains("\"network\":{\"listen_port\":3128}"),
            "{text}"
        );
        s.network = Some(NetworkSpec { listen_port: 0 });
        assert!(s.validate().unwrap_err().contains("listen_port"));
        let mut s = spec();
        s.shares.clear();
        s.prepare = true;
        assert_eq!(s.validate(), Ok(()));
        s.network = Some(NetworkSpec { listen_port: 3128 });
        assert!(s.validate().unwrap_err().contains("network"));
        // Without one, the field is left out: an older agent reads it.
        let text = serde_json::to_string(&spec()).unwrap();
        assert!(!text.contains("network"), "{text}");
    }

    #[test]
    fn packed_shares_share_a_tag_only_read_only_and_each_with_its_own_dir() {
        let packed = |subdir: &str, container: &str| Share {
            tag: "hull3".into(),
            guest_path: "/mnt/hull/hull3".into(),
            container_path: container.into(),
            readonly: true,
            subdir: Some(subdir.into()),
            noexec: false,
        };
        let mut s = spec();
        s.shares.push(packed("0", "/a"));
        s.shares.push(packed("1", "/b"));
        assert_eq!(s.validate(), Ok(()));
        assert_eq!(s.shares[2].source(), "/mnt/hull/hull3/1");
        assert_eq!(s.shares[2].name(), "hull3-1");
        assert_eq!(s.shares[0].source(), "/mnt/hull/project");
        for (i, bad) in [
            |x: &mut Share| x.subdir = Some("0".into()),
            |x: &mut Share| x.subdir = None,
            |x: &mut Share| x.subdir = Some("..".into()),
            |x: &mut Share| x.subdir = Some("a/b".into()),
            |x: &mut Share| x.subdir = Some(String::new()),
            |x: &mut Share| x.guest_path = "/mnt/hull/other".into(),
            |x: &mut Share| x.readonly = false,
        ]
        .into_iter()
        .enumerate()
        {
            let mut t = s.clone();
            bad(&mut t.shares[2]);
            assert!(t.validate().is_err(), "case {i}: {:?}", t.shares[2]);
        }
    }
}
