//! Which accelerator QEMU uses on this host, and why.
//!
//! KVM is chosen only when it really works: a `/dev/kvm` that opens is not
//! enough (this development host has a paravirtual nested KVM on which a
//! stock guest kernel hangs, or QEMU aborts setting an MSR with `-cpu host`).
//! So the probe boots the guest image's kernel under `-accel kvm` with the
//! same CPU model the VM uses, no root disk and `panic=-1 -no-reboot`: a
//! working KVM gets the kernel to its "cannot mount root" panic and QEMU
//! exits by itself within seconds; a broken one hangs or aborts. The verdict
//! is cached under the user's cache dir, keyed by QEMU's version, the host
//! kernel release and the guest kernel file (path, size, modification time),
//! so it is measured once per combination.
//!
//! HVF is used on macOS when `kern.hv_support` says so, WHPX on Windows when
//! QEMU lists it; everything else runs under TCG emulation. The choice and
//! its reason are shown by `hull probe`. `HULL_VM_ACCEL=tcg|kvm|hvf|whpx`
//! forces a choice (reason says so); a forced accelerator that does not work
//! fails at VM start, it never silently becomes another.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use super::qemu::Accel;

/// The accelerator chosen, and why, in plain words.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AccelChoice {
    pub accel: Accel,
    pub reason: String,
}

/// How long a KVM probe boot may take before KVM counts as broken.
pub const KVM_PROBE_DEADLINE: Duration = Duration::from_secs(15);

/// Probes with the default QEMU and the default guest image's kernel.
pub fn probe_accel() -> AccelChoice {
    let qemu = super::qemu::find_qemu(super::qemu::Arch::host());
    let kernel = default_probe_kernel();
    probe_accel_with(qemu.as_deref(), kernel.as_deref(), cache_dir().as_deref())
}

/// Probes with an explicit QEMU, guest kernel and cache dir (tests, `hull probe`).
pub fn probe_accel_with(
    qemu: Option<&Path>,
    kernel: Option<&Path>,
    cache: Option<&Path>,
) -> AccelChoice {
    if let Some(forced) = forced() {
        return forced;
    }
    let Some(qemu) = qemu else {
        return AccelChoice {
            accel: Accel::Tcg,
            reason: format!(
                "{} not found; tier vm needs QEMU",
                super::qemu::Arch::host().qemu_binary()
            ),
        };
    };
    imp::probe(qemu, kernel, cache)
}

fn forced() -> Option<AccelChoice> {
    let v = crate::settings::get().vm_accel.clone()?;
    let accel = match v.as_str() {
        "tcg" => Accel::Tcg,
        "kvm" => Accel::Kvm,
        "hvf" => Accel::Hvf,
        "whpx" => Accel::Whpx,
        _ => {
            return Some(AccelChoice {
                accel: Accel::Tcg,
                reason: format!("HULL_VM_ACCEL={v:?} is not tcg, kvm, hvf or whpx; using tcg"),
            })
        }
    };
    Some(AccelChoice {
        accel,
        reason: format!("forced by HULL_VM_ACCEL={v}"),
    })
}

/// The user's cache dir for hull ([`crate::state::cache_root`]).
pub fn cache_dir() -> Option<PathBuf> {
    crate::state::cache_root()
}

/// The kernel to probe KVM with: `HULL_VM_KERNEL`, else the newest built
/// image's `vmlinux` under `<cache>/images/*/`.
pub fn default_probe_kernel() -> Option<PathBuf> {
    if let Some(k) = &crate::settings::get().vm_kernel {
        return Some(k.clone());
    }
    let dir = cache_dir()?.join("images");
    let mut best: Option<(std::time::SystemTime, PathBuf)> = None;
    for e in std::fs::read_dir(dir).ok()?.filter_map(|e| e.ok()) {
        let k = e.path().join("vmlinux");
        if let Ok(m) = std::fs::metadata(&k) {
            let t = m.modified().unwrap_or(std::time::UNIX_EPOCH);
            if best.as_ref().is_none_or(|(bt, _)| t > *bt) {
                best = Some((t, k));
            }
        }
    }
    best.map(|(_, k)| k)
}

/// A cached verdict.
#[cfg(target_os = "linux")]
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq, Eq)]
struct Verdict {
    key: String,
    works: bool,
    detail: String,
}

#[cfg(target_os = "linux")]
mod imp {
    use super::*;
    use sha2::{Digest, Sha256};
    use std::process::{Command, Stdio};

    pub(super) fn probe(qemu: &Path, kernel: Option<&Path>, cache: Option<&Path>) -> AccelChoice {
        let tcg = |reason: String| AccelChoice {
            accel: Accel::Tcg,
            reason,
        };
        if !Path::new("/dev/kvm").exists() {
            return tcg("no /dev/kvm (no hardware virtualization, or the kvm module is not loaded); using TCG emulation".into());
        }
        if let Err(e) = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/kvm")
        {
            return tcg(format!(
                "/dev/kvm cannot be opened ({e}); add the user to group kvm. Using TCG emulation"
            ));
        }
        if !qemu_has_kvm(qemu) {
            return tcg(format!(
                "{} has no KVM accelerator; using TCG emulation",
                qemu.display()
            ));
        }
        let Some(kernel) = kernel else {
            return tcg("/dev/kvm opens, but KVM is not verified yet: no guest kernel to boot (build the image: hull image build); using TCG emulation".into());
        };
        let key = match cache_key(qemu, kernel) {
            Some(k) => k,
            None => {
                return tcg(format!(
                    "cannot read the guest kernel {}; using TCG emulation",
                    kernel.display()
                ))
            }
        };
        let cache_file = cache.map(|c| c.join("accel").join(format!("kvm-{}.json", &key[..16])));
        let cached = cache_file
            .as_ref()
            .and_then(|f| std::fs::read(f).ok())
            .and_then(|b| serde_json::from_slice::<Verdict>(&b).ok())
            .filter(|v| v.key == key);
        let verdict = match cached {
            Some(v) => v,
            None => {
                let (works, detail) = boot_probe(qemu, kernel);
                let v = Verdict { key, works, detail };
                if let Some(f) = &cache_file {
                    if let Some(d) = f.parent() {
                        let _ = std::fs::create_dir_all(d);
                    }
                    if let Ok(text) = serde_json::to_vec(&v) {
                        let tmp = f.with_extension("tmp");
                        if std::fs::write(&tmp, text).is_ok() {
                            let _ = std::fs::rename(&tmp, f);
                        }
                    }
                }
                v
            }
        };
        if verdict.works {
            AccelChoice {
                accel: Accel::Kvm,
                reason: format!("KVM works: {}", verdict.detail),
            }
        } else {
            tcg(format!(
                "/dev/kvm exists but KVM does not boot a guest here ({}); using TCG emulation",
                verdict.detail
            ))
        }
    }

    /// A private temp dir for one probe boot, removed on drop.
    struct ProbeDir(PathBuf);

    impl ProbeDir {
        fn create() -> std::io::Result<ProbeDir> {
            use std::os::unix::fs::DirBuilderExt;
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
            let p =
                std::env::temp_dir().join(format!("hull-kvm-probe-{}-{nanos}", std::process::id()));
            std::fs::DirBuilder::new().mode(0o700).create(&p)?;
            Ok(ProbeDir(p))
        }

        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for ProbeDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn qemu_has_kvm(qemu: &Path) -> bool {
        crate::qemu_facts::of(qemu).kvm
    }

    fn cache_key(qemu: &Path, kernel: &Path) -> Option<String> {
        let m = std::fs::metadata(kernel).ok()?;
        let mtime = m
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let qv = crate::qemu_facts::of(qemu).version.unwrap_or_default();
        let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let mut h = Sha256::new();
        for part in [
            qemu.display().to_string(),
            qv,
            host.trim().to_string(),
            kernel.display().to_string(),
            m.len().to_string(),
            mtime.to_string(),
        ] {
            h.update(part.as_bytes());
            h.update([0]);
        }
        Some(
            h.finalize()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>(),
        )
    }

    /// Boots `kernel` under KVM without a root disk; true when it reached
    /// its root-mount panic and QEMU exited by itself.
    pub(super) fn boot_probe(qemu: &Path, kernel: &Path) -> (bool, String) {
        let dir = ProbeDir::create();
        let dir = match &dir {
            Ok(d) => d,
            Err(e) => return (false, format!("cannot create a temp dir: {e}")),
        };
        let console = dir.path().join("console.log");
        let mut cmd = Command::new(qemu);
        cmd.args([
            "-accel",
            "kvm",
            "-cpu",
            "host",
            "-M",
            "pc",
            "-nodefaults",
            "-no-user-config",
            "-display",
            "none",
            "-no-reboot",
            "-nic",
            "none",
            "-m",
            "256M",
            "-smp",
            "1",
            "-append",
            "console=ttyS0 panic=-1 hull.kvm-probe",
        ])
        .arg("-kernel")
        .arg(kernel)
        .arg("-serial")
        .arg(format!("file:{}", console.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
        crate::proc::tie_to_parent(&mut cmd);
        let mut p = match crate::proc::Supervised::spawn(cmd, "kvm-probe", dir.path()) {
            Ok(p) => p,
            Err(e) => return (false, e.to_string()),
        };
        let stderr = p.take_stderr();
        let status = p.wait_timeout(KVM_PROBE_DEADLINE);
        p.kill();
        let mut err = String::new();
        if let Some(mut s) = stderr {
            use std::io::Read;
            let _ = (&mut s).take(4096).read_to_string(&mut err);
        }
        let log = crate::proc::log_tail(&console, 64 * 1024);
        let panicked = log.contains("Kernel panic");
        match status {
            Some(s) if s.success() && panicked => (
                true,
                format!(
                    "a guest kernel booted under -accel kvm -cpu host ({})",
                    kernel.display()
                ),
            ),
            Some(s) => (
                false,
                format!(
                    "QEMU exited with {s} during a probe boot: {}",
                    err.lines().last().unwrap_or("no message").trim()
                ),
            ),
            None => (
                false,
                format!(
                    "a probe boot of {} made no progress in {}s (console: {})",
                    kernel.display(),
                    KVM_PROBE_DEADLINE.as_secs(),
                    if log.is_empty() { "empty" } else { "stalled" }
                ),
            ),
        }
    }
}

#[cfg(target_os = "macos")]
mod imp {
    use super::*;

    pub(super) fn probe(
        _qemu: &Path,
        _kernel: Option<&Path>,
        _cache: Option<&Path>,
    ) -> AccelChoice {
        let out = std::process::Command::new("/usr/sbin/sysctl")
            .args(["-n", "kern.hv_support"])
            .output();
        match out {
            Ok(o) if String::from_utf8_lossy(&o.stdout).trim() == "1" => AccelChoice {
                accel: Accel::Hvf,
                reason: "Hypervisor.framework available (kern.hv_support=1)".into(),
            },
            _ => AccelChoice {
                accel: Accel::Tcg,
                reason: "Hypervisor.framework unavailable (kern.hv_support is not 1); using TCG emulation".into(),
            },
        }
    }
}

#[cfg(windows)]
mod imp {
    use super::*;

    pub(super) fn probe(qemu: &Path, _kernel: Option<&Path>, _cache: Option<&Path>) -> AccelChoice {
        let listed = std::process::Command::new(qemu)
            .args(["-accel", "help"])
            .output()
            .is_ok_and(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .any(|l| l.trim() == "whpx")
            });
        if listed {
            AccelChoice {
                accel: Accel::Whpx,
                reason: "QEMU lists the Windows Hypervisor Platform accelerator".into(),
            }
        } else {
            AccelChoice {
                accel: Accel::Tcg,
                reason: "QEMU has no WHPX accelerator (enable the Windows Hypervisor Platform feature); using TCG emulation".into(),
            }
        }
    }
}

#[cfg(not(any(target_os = "linux", target_os = "macos", windows)))]
mod imp {
    use super::*;

    pub(super) fn probe(
        _qemu: &Path,
        _kernel: Option<&Path>,
        _cache: Option<&Path>,
    ) -> AccelChoice {
        AccelChoice {
            accel: Accel::Tcg,
            reason: "no hardware accelerator support for this OS; using TCG emulation".into(),
        }
    }
}

#[cfg(test)]
#[cfg(all(target_os = "linux", feature = "tier3"))]
mod tests {
    use super::*;

    /// The real probe on this host, once (a probe boot that makes no
    /// progress spins a host core for its whole deadline). MACHINE.md:
    /// /dev/kvm exists here but a guest kernel does not boot under it, so
    /// the answer must be TCG with a reason that says the probe boot
    /// failed; on a host with working KVM, KVM. The verdict is cached: the
    /// second probe boots nothing and says the same.
    #[test]
    fn probe_on_this_host_boots_for_real_and_caches() {
        let Some(qemu) = crate::qemu::find_qemu(crate::qemu::Arch::host()) else {
            panic!(
                "qemu-system-x86_64 not found: tier 3 tests need QEMU (scripts/setup.sh --tier3)"
            );
        };
        let kernel = crate::testkit::kernel();
        let cache = tempfile::tempdir().unwrap();
        let first = probe_accel_with(Some(&qemu), Some(&kernel), Some(cache.path()));
        let entries: Vec<_> = std::fs::read_dir(cache.path().join("accel"))
            .unwrap()
            .collect();
        assert_eq!(entries.len(), 1, "verdict cached");
        let t = std::time::Instant::now();
        let again = probe_accel_with(Some(&qemu), Some(&kernel), Some(cache.path()));
        assert_eq!(first, again);
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "the cached verdict booted again"
        );
        if Path::new("/dev/kvm").exists() && first.accel != Accel::Kvm {
            assert!(
                first.reason.contains("does not boot a guest"),
                "{}",
                first.reason
            );
        }
    }

    #[test]
    fn no_kernel_means_kvm_unverified() {
        let Some(qemu) = crate::qemu::find_qemu(crate::qemu::Arch::host()) else {
            panic!(
                "qemu-system-x86_64 not found: tier 3 tests need QEMU (scripts/setup.sh --tier3)"
            );
        };
        let c = probe_accel_with(Some(&qemu), None, None);
        assert_eq!(c.accel, Accel::Tcg);
        if Path::new("/dev/kvm").exists() {
            assert!(c.reason.contains("not verified"), "{}", c.reason);
        }
    }
}
