//! What the outer agent asks of the guest kernel: the clock, power off, the
//! container's cgroup limits (one way after a boot and after a restore),
//! fresh entropy, dropped caches, the Incus daemon ended before a snapshot.

use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use hull_protocol::ConfigureSpec;

use crate::mounts;

pub(super) fn set_clock(unix_ns: u64) -> io::Result<()> {
    if unix_ns == 0 {
        return Ok(());
    }
    let ts = rustix::time::Timespec {
        tv_sec: (unix_ns / 1_000_000_000) as i64,
        tv_nsec: (unix_ns % 1_000_000_000) as i64,
    };
    rustix::time::clock_settime(rustix::time::ClockId::Realtime, ts)?;
    Ok(())
}

/// Flushes every share mounted under the share root (`syncfs`), so writes
/// still in the guest's page cache reach the host, then powers off. Returns
/// only if the power-off was refused.
pub(super) fn power_off() {
    let t0 = Instant::now();
    for p in mounts::mounted_shares() {
        match std::fs::File::open(&p) {
            Ok(f) => {
                if let Err(e) = rustix::fs::syncfs(&f) {
                    tracing::warn!("syncfs {}: {e}", p.display());
                }
            }
            Err(e) => tracing::warn!("open {}: {e}", p.display()),
        }
    }
    tracing::info!(
        "shares flushed in {:.3} s; powering off",
        t0.elapsed().as_secs_f64()
    );
    if let Err(e) = rustix::system::reboot(rustix::system::RebootCommand::PowerOff) {
        tracing::error!("power off refused: {e}; the guest's init takes over");
    }
}

/// The cgroup v2 files and values for the spec's limits: `memory.max` (and
/// no swap), `pids.max`, `cpu.max` (a CPU-time quota of `cpus` whole CPUs).
/// The one way limits are applied, after a boot as after a restore.
pub fn cgroup_limits(spec: &ConfigureSpec) -> Vec<(&'static str, String)> {
    let c = &spec.container;
    let mut v = Vec::new();
    if let Some(m) = c.memory_bytes {
        v.push(("memory.max", m.to_string()));
        v.push(("memory.swap.max", "0".to_string()));
    }
    if let Some(n) = c.processes {
        v.push(("pids.max", n.to_string()));
    }
    if let Some(n) = c.cpus {
        v.push(("cpu.max", format!("{} 100000", u64::from(n) * 100_000)));
    }
    v
}

/// Why the container's limits could not be set.
#[derive(Debug, thiserror::Error)]
pub enum LimitError {
    #[error("cannot read /proc/{pid}/cgroup")]
    Read {
        pid: u32,
        #[source]
        source: std::io::Error,
    },
    #[error("container init {pid} is not in a cgroup v2 hierarchy")]
    NotV2 { pid: u32 },
    #[error("container init {pid} is in cgroup {cgroup}, not an Incus payload")]
    NotPayload { pid: u32, cgroup: String },
    #[error("cannot write {value} to {path}")]
    Write {
        path: std::path::PathBuf,
        value: String,
        #[source]
        source: std::io::Error,
    },
}

/// Writes [`cgroup_limits`] into the cgroup of container init `pid` (the
/// container's delegated root: with `nsdelegate`, container root cannot
/// change these files of its own namespace root).
pub(super) fn set_cgroup_limits(pid: u32, spec: &ConfigureSpec) -> Result<(), LimitError> {
    let limits = cgroup_limits(spec);
    if limits.is_empty() {
        return Ok(());
    }
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .map_err(|source| LimitError::Read { pid, source })?;
    let rel = text
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or(LimitError::NotV2 { pid })?;
    if !rel.starts_with("/lxc.payload.") || rel.contains("..") {
        return Err(LimitError::NotPayload {
            pid,
            cgroup: rel.to_string(),
        });
    }
    let dir = Path::new("/sys/fs/cgroup").join(rel.trim_start_matches('/'));
    for (file, value) in limits {
        let p = dir.join(file);
        if file == "memory.swap.max" && !p.exists() {
            continue;
        }
        if let Err(source) = std::fs::write(&p, &value) {
            return Err(LimitError::Write {
                path: p,
                value,
                source,
            });
        }
    }
    Ok(())
}

/// Mixes 64 bytes from the host's virtio-rng into the guest's pool (best
/// effort: the pool is never made weaker by a failed read).
pub(super) fn reseed_crng() {
    use std::io::{Read, Write};
    let mut buf = [0u8; 64];
    let got = std::fs::File::open("/dev/hwrng").and_then(|mut f| f.read_exact(&mut buf));
    match got {
        Ok(()) => {
            if let Err(e) = std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/urandom")
                .and_then(|mut f| f.write_all(&buf))
            {
                tracing::warn!("cannot mix host entropy into /dev/urandom: {e}");
            }
        }
        Err(e) => tracing::warn!("cannot read /dev/hwrng for a reseed: {e}"),
    }
}

/// Ends the Incus daemon before a snapshot is saved (best effort, said
/// in the log): a restored run makes no Incus call (the prepared
/// container is configured directly, [`super::container`]), and incusd's
/// 60-odd MiB would otherwise be saved and loaded with every restore. On
/// SIGTERM incusd exits and leaves its running containers alone (their
/// `lxc monitor` is a process of its own), and one that does not exit
/// within `grace` is killed: its database is not read again in the
/// snapshot's life (each restore's disk is a throwaway overlay). The boot
/// path keeps incusd: it never snapshots.
pub(super) fn stop_incusd(grace: Duration) {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    use rustix::process::{pidfd_open, pidfd_send_signal, Pid, PidfdFlags, Signal};
    let t0 = Instant::now();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return;
    };
    let mut stopped = 0;
    for e in procs.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let Some(pid) = Pid::from_raw(pid) else {
            continue;
        };
        // Pinned first, then named: a pid reused in between is not signalled.
        let Ok(fd) = pidfd_open(pid, PidfdFlags::empty()) else {
            continue;
        };
        // The daemon only: a container's `lxc monitor` is incusd's binary
        // too (`forkstart`, its argv rewritten), and keeps the container.
        let cmdline =
            std::fs::read(format!("/proc/{}/cmdline", pid.as_raw_nonzero())).unwrap_or_default();
        let mut argv = cmdline.split(|b| *b == 0);
        let daemon = argv.next() == Some(INCUSD.as_bytes())
            && argv
                .next()
                .is_none_or(|a| a.is_empty() || a.starts_with(b"--"));
        let exe = std::fs::read_link(format!("/proc/{}/exe", pid.as_raw_nonzero()));
        if !daemon || !exe.is_ok_and(|p| p == Path::new(INCUSD)) {
            continue;
        }
        if let Err(e) = pidfd_send_signal(&fd, Signal::TERM) {
            tracing::warn!("cannot stop incusd (pid {pid:?}) before the snapshot: {e}");
            continue;
        }
        let mut fds = [PollFd::new(&fd, PollFlags::IN)];
        let t = Timespec {
            tv_sec: grace.as_secs() as i64,
            tv_nsec: i64::from(grace.subsec_nanos()),
        };
        if !matches!(poll(&mut fds, Some(&t)), Ok(n) if n > 0) {
            tracing::warn!("incusd did not exit within {grace:?} of SIGTERM; killing it");
            let _ = pidfd_send_signal(&fd, Signal::KILL);
        }
        stopped += 1;
    }
    tracing::info!(
        "incusd stopped before the snapshot ({stopped} daemon) in {:.3} s",
        t0.elapsed().as_secs_f64()
    );
}

/// Where Debian's incus package puts the daemon.
const INCUSD: &str = "/usr/libexec/incus/incusd";

/// `sync; echo 3 > /proc/sys/vm/drop_caches` (best effort).
pub(super) fn drop_caches() {
    rustix::fs::sync();
    if let Err(e) = std::fs::write("/proc/sys/vm/drop_caches", b"3\n") {
        tracing::warn!("cannot drop the page cache before the snapshot: {e}");
    }
}

/// The container's peak memory while one command runs: its top cgroup's
/// `memory.peak` (`/lxc.payload.<name>`, found from a process in it),
/// opened and reset for this reader alone (Linux 6.12: a write resets the
/// peak seen through that open file), read when the command ends. None
/// where the kernel or the cgroup cannot tell (the run goes on without).
pub(super) struct MemoryPeak(std::fs::File);

impl MemoryPeak {
    pub(super) fn start(pid: u32) -> Option<MemoryPeak> {
        use std::io::Write;
        let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        let rel = text.lines().find_map(|l| l.strip_prefix("0::"))?;
        let top = rel.trim_start_matches('/').split('/').next()?;
        if !top.starts_with("lxc.payload.") || top.contains("..") {
            return None;
        }
        let path = Path::new("/sys/fs/cgroup").join(top).join("memory.peak");
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .ok()?;
        f.write_all(b"reset\n").ok()?;
        Some(MemoryPeak(f))
    }

    /// Bytes, the most the container held since [`MemoryPeak::start`].
    pub(super) fn read(&self) -> Option<u64> {
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; 32];
        let n = self.0.read_at(&mut buf, 0).ok()?;
        std::str::from_utf8(&buf[..n]).ok()?.trim().parse().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outer::test_spec;

    #[test]
    fn cgroup_limits_follow_the_test_spec() {
        let mut s = test_spec();
        assert_eq!(
            cgroup_limits(&s),
            [
                ("memory.max", (512u64 << 20).to_string()),
                ("memory.swap.max", "0".to_string()),
                ("cpu.max", "100000 100000".to_string()),
            ]
        );
        s.container.processes = Some(64);
        s.container.memory_bytes = None;
        s.container.cpus = None;
        assert_eq!(cgroup_limits(&s), [("pids.max", "64".to_string())]);
    }
}
