//! The Incus backend: the per-instance container cloned (or reused) and
//! checked isolated before and after it starts, shares attached as Incus
//! disk devices after a boot or injected into the running container after a
//! restore, and the link to its inner agent.

use std::io;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use hull_protocol::ConfigureSpec;

use crate::incus::{self, Config, ContainerRoot, Devices, Incus, IncusError};
use crate::mounts;

use super::kernel::{drop_caches, reseed_crng, set_cgroup_limits, set_clock, stop_incusd};
use super::{
    lock, Backend, SetupError, AGENT_DEVICE, AGENT_DIR, CONNECT_TIMEOUT, CREATE_TIMEOUT_S,
    CTL_DEVICE, CTL_IN_CONTAINER, INNER_SOCKET, SHARE_DEVICE_PREFIX, START_TIMEOUT_S,
};

/// How long incusd has to exit before a snapshot, then it is killed (under
/// emulation it took over 20 s to end its operations).
const INCUSD_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// The disk devices: one per share at its host path (read-only shares with
/// `readonly=true`), the control directory, and the agent's directory
/// read-only (the base container has it too: the inner agent is its init).
pub fn container_devices(spec: &ConfigureSpec, ctl_dir: &Path) -> Devices {
    let disk = |source: &str, path: &str, readonly: bool| {
        let mut d = std::collections::BTreeMap::new();
        d.insert("type".to_owned(), "disk".to_owned());
        d.insert("source".to_owned(), source.to_owned());
        d.insert("path".to_owned(), path.to_owned());
        if readonly {
            d.insert("readonly".to_owned(), "true".to_owned());
        }
        d
    };
    let mut devs = Devices::new();
    for s in &spec.shares {
        devs.insert(
            format!("{SHARE_DEVICE_PREFIX}{}", s.name()),
            disk(&s.source(), &s.container_path, s.readonly),
        );
    }
    devs.insert(
        CTL_DEVICE.to_owned(),
        disk(&ctl_dir.to_string_lossy(), CTL_IN_CONTAINER, false),
    );
    devs.insert(AGENT_DEVICE.to_owned(), disk(AGENT_DIR, AGENT_DIR, true));
    devs
}

/// Check a running container's `uid_map` (`/proc/<init>/uid_map` or `gid_map`):
/// container root is `root` and no range reaches guest id 0.
pub fn check_id_map(text: &str, root: u32) -> Result<(), String> {
    let mut saw_root = false;
    for line in text.lines() {
        let f: Vec<u64> = line
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        let [ns, host, count] = f[..] else {
            return Err(format!("malformed id map line {line:?}"));
        };
        if host == 0 {
            return Err("a range maps guest id 0 into the container".into());
        }
        if ns == 0 {
            if host != u64::from(root) {
                return Err(format!(
                    "container root is guest id {host}, expected {root}"
                ));
            }
            saw_root = true;
        }
        if count == 0 {
            return Err(format!("empty id map line {line:?}"));
        }
    }
    if saw_root {
        Ok(())
    } else {
        Err("container root is not mapped (not a user namespace?)".into())
    }
}

/// Container init `pid`'s uid and gid maps: container root is `root`, and no
/// range reaches guest id 0.
fn check_init_ids(name: &str, pid: u32, root: ContainerRoot) -> Result<(), SetupError> {
    let verr = |why: String| SetupError::Verify {
        name: name.to_owned(),
        why,
    };
    for (file, id) in [("uid_map", root.uid), ("gid_map", root.gid)] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/{file}"))
            .map_err(|e| verr(format!("cannot read /proc/{pid}/{file}: {e}")))?;
        check_id_map(&text, id).map_err(|w| verr(format!("{file}: {w}")))?;
    }
    Ok(())
}

/// Interface names in a `/proc/<pid>/net/dev` text.
pub fn interfaces(netdev: &str) -> Vec<String> {
    netdev
        .lines()
        .skip(2)
        .filter_map(|l| l.split_once(':'))
        .map(|(n, _)| n.trim().to_owned())
        .collect()
}

/// The real backend: incusd in the outer guest.
pub struct IncusBackend<T: incus::Transport> {
    incus: Incus<T>,
    not_ready: Option<String>,
    ctl_root: PathBuf,
    configured: Mutex<Option<Use>>,
}

/// What the one container of this VM is used for so far.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Use {
    /// Started without shares for a snapshot; exactly one later `Configure`
    /// (after a restore) may add shares to it. Its init pid and root ids
    /// were checked when it started (memory restored from the snapshot
    /// still holds them).
    Prepared {
        name: String,
        pid: u32,
        root: ContainerRoot,
    },
    /// Serving a run: its shares are fixed.
    Configured(String),
}

impl Use {
    fn name(&self) -> &str {
        match self {
            Use::Prepared { name: n, .. } | Use::Configured(n) => n,
        }
    }
}

impl<T: incus::Transport> std::fmt::Debug for IncusBackend<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IncusBackend")
            .field("ctl_root", &self.ctl_root)
            .field("configured", &*lock(&self.configured))
            .finish()
    }
}

impl<T: incus::Transport> IncusBackend<T> {
    pub fn new(incus: Incus<T>, not_ready: Option<String>, ctl_root: PathBuf) -> Self {
        IncusBackend {
            incus,
            not_ready,
            ctl_root,
            configured: Mutex::new(None),
        }
    }

    fn socket_of(&self, name: &str) -> PathBuf {
        self.ctl_root.join(name).join(INNER_SOCKET)
    }

    fn prepare_ctl_dir(&self, dir: &Path, root: ContainerRoot) -> Result<(), SetupError> {
        let err = |source: io::Error| SetupError::Control {
            path: dir.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(&self.ctl_root).map_err(err)?;
        match std::fs::create_dir(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                // A stale socket from an earlier start of a stopped container.
                match std::fs::remove_file(dir.join(INNER_SOCKET)) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(err(e)),
                }
            }
            Err(e) => return Err(err(e)),
        }
        rustix::fs::chown(
            dir,
            Some(rustix::fs::Uid::from_raw(root.uid)),
            Some(rustix::fs::Gid::from_raw(root.gid)),
        )
        .map_err(|e| err(e.into()))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(err)?;
        Ok(())
    }

    /// The one `Configure` of a prepared container after a restore: limits
    /// written to its cgroup, the shares attached to it as it runs, then a
    /// new link to its inner agent. No Incus call: each costs about half a
    /// second under emulation, and the container's Incus config (checked
    /// when it was prepared) is not changed.
    fn configure_prepared(
        &self,
        view: &ShareView,
        pid: u32,
        root: ContainerRoot,
    ) -> Result<(String, UnixStream), SetupError> {
        let name = view.spec.container.name.clone();
        let t0 = Instant::now();
        let verr = |why: String| SetupError::Verify {
            name: name.clone(),
            why,
        };
        check_init_ids(&name, pid, root)?;
        let netdev = std::fs::read_to_string(format!("/proc/{pid}/net/dev"))
            .map_err(|e| verr(format!("cannot read /proc/{pid}/net/dev: {e}")))?;
        let nics = interfaces(&netdev);
        if nics.iter().any(|n| n != "lo") {
            return Err(verr(format!("network interfaces besides lo: {nics:?}")));
        }
        let (spec, protected) = (&view.spec, &view.protect);
        set_cgroup_limits(pid, spec).map_err(|source| SetupError::Limits {
            name: name.clone(),
            source,
        })?;
        let binds: Vec<mounts::Bind> = spec
            .shares
            .iter()
            .map(|s| mounts::Bind {
                tag: s.name(),
                source: PathBuf::from(s.source()),
                target: PathBuf::from(&s.container_path),
                readonly: s.readonly,
                noexec: s.noexec,
            })
            .collect();
        mounts::inject(pid, (root.uid, root.gid), &binds)?;
        mounts::protect(pid, protected)?;
        tracing::info!(
            "limits set and {} shares attached in {:.3} s",
            binds.len(),
            t0.elapsed().as_secs_f64()
        );
        if let Some(net) = &spec.network {
            super::network::start(pid, net)?;
        }
        let stream = connect_retry(&self.socket_of(&name), CONNECT_TIMEOUT)?;
        *lock(&self.configured) = Some(Use::Configured(name.clone()));
        Ok((name, stream))
    }

    /// The running container's init pid, its id maps checked.
    fn verify_running(&self, name: &str, root: ContainerRoot) -> Result<u32, SetupError> {
        let pid = self.incus.init_pid(name).map_err(|e| SetupError::Verify {
            name: name.to_owned(),
            why: e.to_string(),
        })?;
        check_init_ids(name, pid, root)?;
        Ok(pid)
    }
}

/// The shares as the container gets them: with a `--cow` overlay, the
/// overlay (mounted here, in the guest) at the lower share's container
/// path instead of the share, writable, and the paths to bind read-only
/// over it.
struct ShareView {
    spec: ConfigureSpec,
    protect: Vec<PathBuf>,
}

impl ShareView {
    /// Mounts the overlay `spec` asks for, if any (after its shares).
    fn of(spec: &ConfigureSpec) -> Result<ShareView, SetupError> {
        let mut view = ShareView {
            spec: spec.clone(),
            protect: Vec::new(),
        };
        let Some(o) = &spec.overlay else {
            return Ok(view);
        };
        // `validate` checked it names one read-only share of its own.
        let Some(lower) = view.spec.shares.iter_mut().find(|s| s.tag == o.lower) else {
            return Err(SetupError::Mount(mounts::MountError::Overlay {
                lower: o.lower.clone(),
                what: "no share has this tag; the overlay would be mounted at",
                path: PathBuf::from(&o.guest_path),
                source: io::ErrorKind::NotFound.into(),
            }));
        };
        let merged = mounts::mount_overlay(o, &lower.guest_path)?;
        lower.guest_path = merged.to_string_lossy().into_owned();
        lower.readonly = false;
        view.protect = o.protect.iter().map(PathBuf::from).collect();
        Ok(view)
    }
}

fn connect_retry(path: &Path, timeout: Duration) -> Result<UnixStream, SetupError> {
    let start = Instant::now();
    loop {
        match UnixStream::connect(path) {
            Ok(s) => return Ok(s),
            Err(e) => {
                if start.elapsed() >= timeout {
                    return Err(SetupError::Connect {
                        path: path.to_path_buf(),
                        secs: timeout.as_secs(),
                        last: e.to_string(),
                    });
                }
            }
        }
        thread::sleep(Duration::from_millis(25));
    }
}

impl<T: incus::Transport> Backend for IncusBackend<T> {
    fn configure(&self, spec: &ConfigureSpec) -> Result<(String, UnixStream), SetupError> {
        let name = spec.container.name.clone();
        match lock(&self.configured).as_ref() {
            None => {}
            Some(Use::Prepared { name: p, .. }) if *p == name && !spec.prepare => {}
            Some(u) => {
                return Err(SetupError::AlreadyConfigured {
                    name: u.name().to_owned(),
                })
            }
        }
        if let Some(e) = &self.not_ready {
            // Maybe it came up late.
            self.incus
                .wait_ready(Duration::from_secs(5))
                .map_err(|_| SetupError::IncusNotReady(e.clone()))?;
        }
        set_clock(spec.clock_unix_ns).map_err(SetupError::Clock)?;
        if !spec.prepare {
            // Every VM restored from one snapshot starts with the same CRNG
            // state: mix in fresh bytes from the host (virtio-rng) before
            // anything runs (vmgenid reseeds too, where the kernel has it).
            reseed_crng();
        }
        for (i, share) in spec.shares.iter().enumerate() {
            // Packed shares have one device and one mount: the first mounts it.
            if spec.shares[..i].iter().all(|o| o.tag != share.tag) {
                mounts::mount(&mounts::plan(share)?)?;
            }
        }
        let view = ShareView::of(spec)?;
        let prepared = match lock(&self.configured).as_ref() {
            Some(Use::Prepared { pid, root, .. }) => Some((*pid, *root)),
            _ => None,
        };
        if let Some((pid, root)) = prepared {
            return self.configure_prepared(&view, pid, root);
        }
        let (spec, protected) = (&view.spec, &view.protect);
        let ctl_dir = self.ctl_root.join(&name);
        // No Incus limits: they are written to the container's cgroup once
        // it runs, on this path as after a restore ([`cgroup_limits`]).
        let config = Config::new();
        let devices = container_devices(spec, &ctl_dir);
        let create_err = |source| SetupError::Create {
            name: name.clone(),
            base: spec.container.base.clone(),
            source: Box::new(source),
        };
        let config_err = |source| SetupError::Config {
            name: name.clone(),
            source: Box::new(source),
        };
        let start_err = |source| SetupError::Start {
            name: name.clone(),
            source: Box::new(source),
        };
        let isolation_err = |e| SetupError::Isolation(Box::new(e));
        let existing = self.incus.instance(&name).map_err(create_err)?;
        let fresh = existing.is_none();
        if fresh {
            let req = incus::copy_request(&name, &spec.container.base, &config, &devices)
                .map_err(create_err)?;
            self.incus
                .call(&req, CREATE_TIMEOUT_S)
                .map_err(create_err)?;
        }
        let inst = self
            .incus
            .instance(&name)
            .map_err(create_err)?
            .ok_or_else(|| {
                create_err(IncusError::Malformed {
                    method: "GET",
                    path: format!("/1.0/instances/{name}"),
                    message: "the container vanished after its creation".into(),
                })
            })?;
        let root = incus::check_isolated(&inst, spec.container.uid, spec.container.gid)
            .map_err(isolation_err)?;
        if !inst.is_running() {
            self.prepare_ctl_dir(&ctl_dir, root)?;
        }
        if !fresh {
            // A container from the image: add the shares before it starts.
            let req = incus::patch_request(&name, &config, &devices).map_err(config_err)?;
            self.incus
                .call(&req, CREATE_TIMEOUT_S)
                .map_err(config_err)?;
            // Devices and limits changed: check again before anything runs in it.
            let inst = self
                .incus
                .instance(&name)
                .map_err(create_err)?
                .ok_or_else(|| SetupError::Verify {
                    name: name.clone(),
                    why: "the container vanished".into(),
                })?;
            incus::check_isolated(&inst, spec.container.uid, spec.container.gid)
                .map_err(isolation_err)?;
        }
        if !inst.is_running() {
            let req =
                incus::state_request(&name, "start", false, START_TIMEOUT_S).map_err(start_err)?;
            self.incus.call(&req, START_TIMEOUT_S).map_err(start_err)?;
        }
        let pid = self.verify_running(&name, root)?;
        set_cgroup_limits(pid, spec).map_err(|source| SetupError::Limits {
            name: name.clone(),
            source,
        })?;
        // Incus made the mount points; the way to them must let the
        // command's user through (the container's /root is 0700).
        mounts::reach(pid, (root.uid, root.gid), &spec.shares)?;
        mounts::protect(pid, protected)?;
        if let Some(net) = &spec.network {
            super::network::start(pid, net)?;
        }
        let stream = connect_retry(&self.socket_of(&name), CONNECT_TIMEOUT)?;
        if spec.prepare {
            // Less guest memory in the snapshot: every page the page cache
            // and incusd hold would be saved and restored.
            stop_incusd(INCUSD_GRACE);
            drop_caches();
            *lock(&self.configured) = Some(Use::Prepared {
                name: name.clone(),
                pid,
                root,
            });
        } else {
            *lock(&self.configured) = Some(Use::Configured(name.clone()));
        }
        Ok((name, stream))
    }

    fn reconnect(&self) -> Option<Result<UnixStream, SetupError>> {
        // A prepared container serves no session until a `Configure` adds
        // its shares (and the inner agent serves one link at a time).
        let name = match lock(&self.configured).as_ref()? {
            Use::Configured(n) => n.clone(),
            Use::Prepared { .. } => return None,
        };
        Some(connect_retry(
            &self.socket_of(&name),
            Duration::from_secs(5),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outer::test_spec;

    #[test]
    fn devices_put_shares_at_host_paths_and_spill_readonly() {
        let d = container_devices(&test_spec(), Path::new("/run/hull/ctl/hull-run"));
        let p = &d["hull-share-project"];
        assert_eq!(p["type"], "disk");
        assert_eq!(p["source"], "/mnt/hull/project");
        assert_eq!(p["path"], "/work/proj");
        assert!(!p.contains_key("readonly"));
        let s = &d["hull-share-spill"];
        assert_eq!(s["readonly"], "true");
        assert_eq!(s["path"], "/tmp/hull-runs/x/spill");
        assert_eq!(d["hull-ctl"]["source"], "/run/hull/ctl/hull-run");
        assert_eq!(d["hull-ctl"]["path"], CTL_IN_CONTAINER);
        let a = &d["hull-agent"];
        assert_eq!(
            (a["source"].as_str(), a["path"].as_str()),
            (AGENT_DIR, AGENT_DIR)
        );
        assert_eq!(a["readonly"], "true");
        assert_eq!(d.len(), 4);
        for n in d.keys() {
            assert!(incus::check_name("device", n).is_ok(), "{n}");
        }
    }

    #[test]
    fn net_dev_names_every_interface() {
        let t = "Inter-|   Receive\n face |bytes\n    lo: 0 0 0\n  eth0: 1 2 3\n";
        assert_eq!(interfaces(t), ["lo", "eth0"]);
        assert_eq!(interfaces("a\nb\n    lo: 0\n"), ["lo"]);
    }

    #[test]
    fn id_maps_must_not_reach_guest_root() {
        let ok = "         0    1000000       1000\n      1000       1000          1\n      1001    1001001  999998999\n";
        assert_eq!(check_id_map(ok, 1000000), Ok(()));
        assert!(check_id_map(ok, 1000).is_err());
        assert!(check_id_map("0 0 4294967295\n", 0).is_err());
        assert!(check_id_map("0 1000000 1000\n5 0 1\n", 1000000).is_err());
        assert!(check_id_map("1000 1000 1\n", 1000000).is_err());
        assert!(check_id_map("garbage\n", 1000000).is_err());
    }
}
