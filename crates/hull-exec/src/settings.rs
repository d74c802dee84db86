//! hull's `HULL_*` environment variables, read once, in one place: the
//! table is `docs/settings.md` (a test keeps the two together). Library
//! code asks [`get`] instead of reading the environment itself.
//!
//! Not here: `HULL_LOG` (the log filter, read where logging starts) and
//! `HULL_INSTANCE` (a `hull run` and `hull read` option that clap reads).

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

/// Every setting, as the environment gave it (empty values are unset).
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// `HULL_RUNS_DIR`: where instance directories live.
    pub runs_dir: Option<PathBuf>,
    /// `HULL_VMS_DIR`: the state of `hull vm up`'s VMs.
    pub vms_dir: Option<PathBuf>,
    /// `HULL_CHANGES_DIR`: where the change sets of `--cow` runs are kept.
    pub changes_dir: Option<PathBuf>,
    /// `HULL_IMAGE_CACHE`: where tier-3 images are built and kept.
    pub image_cache: Option<PathBuf>,
    /// `HULL_IMAGE_CACHE_MAX`: the size the image cache is brought back
    /// under after a build (`40GiB`, or bytes); `None` when unset or bad.
    pub image_cache_max: Option<u64>,
    /// `HULL_USERLAND_MAX`: the most a container userland's packages may
    /// take to download, and installed (`5GiB`, or bytes); `None` when
    /// unset or bad.
    pub userland_max: Option<u64>,
    /// `HULL_AGENT`: the guest agent binary.
    pub agent: Option<PathBuf>,
    /// `HULL_QEMU`, `HULL_VIRTIOFSD`: the helpers' binaries.
    pub qemu: Option<PathBuf>,
    pub virtiofsd: Option<PathBuf>,
    /// `HULL_VM_IMAGE`: an image directory to use instead of the cache's.
    pub vm_image: Option<PathBuf>,
    /// `HULL_VM_KERNEL`: the kernel the KVM probe boots.
    pub vm_kernel: Option<PathBuf>,
    /// `HULL_VM_ACCEL`: the accelerator asked for (checked where it is
    /// used, which says what it does with a bad value).
    pub vm_accel: Option<String>,
    /// `HULL_VM_BOOT_TIMEOUT`: seconds, when a whole number.
    pub vm_boot_timeout: Option<Duration>,
    /// `HULL_VM_SNAPSHOT=off|0|no`: boot every tier-3 run.
    pub vm_snapshot_off: bool,
    /// `HULL_RUNS_MAX_AGE`: how long an idle run dir's spill and logs are
    /// kept (`24h`, `30m`); `None` when unset or bad.
    pub runs_max_age: Option<Duration>,
    /// `HULL_RUNS_KEEP`: how many idle run dirs are kept at most.
    pub runs_keep: Option<usize>,
}

impl Settings {
    /// Reads the settings from `var` (the process environment in [`get`]).
    pub fn from(var: impl Fn(&str) -> Option<OsString>) -> Settings {
        let path = |k: &str| var(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        let text = |k: &str| {
            var(k)
                .filter(|v| !v.is_empty())
                .map(|v| v.to_string_lossy().into_owned())
        };
        Settings {
            runs_dir: path("HULL_RUNS_DIR"),
            vms_dir: path("HULL_VMS_DIR"),
            changes_dir: path("HULL_CHANGES_DIR"),
            image_cache: path("HULL_IMAGE_CACHE"),
            image_cache_max: text("HULL_IMAGE_CACHE_MAX")
                .and_then(|s| crate::policy::resolve::parse_bytes(&s).ok()),
            userland_max: text("HULL_USERLAND_MAX")
                .and_then(|s| crate::policy::resolve::parse_bytes(&s).ok()),
            agent: path("HULL_AGENT"),
            qemu: path("HULL_QEMU"),
            virtiofsd: path("HULL_VIRTIOFSD"),
            vm_image: path("HULL_VM_IMAGE"),
            vm_kernel: path("HULL_VM_KERNEL"),
            vm_accel: text("HULL_VM_ACCEL"),
            vm_boot_timeout: text("HULL_VM_BOOT_TIMEOUT")
                .and_then(|s| s.trim().parse().ok())
                .map(Duration::from_secs),
            vm_snapshot_off: matches!(
                text("HULL_VM_SNAPSHOT").as_deref(),
                Some("off" | "0" | "no")
            ),
            runs_max_age: text("HULL_RUNS_MAX_AGE")
                .and_then(|s| crate::policy::resolve::parse_duration(&s).ok()),
            runs_keep: text("HULL_RUNS_KEEP").and_then(|s| s.trim().parse().ok()),
        }
    }
}

/// The settings of this process, read from its environment the first time.
pub fn get() -> &'static Settings {
    static S: OnceLock<Settings> = OnceLock::new();
    S.get_or_init(|| Settings::from(|k| std::env::var_os(k)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_is_unset_and_values_parse() {
        let env = [
            ("HULL_RUNS_DIR", ""),
            ("HULL_QEMU", "/opt/q"),
            ("HULL_VM_BOOT_TIMEOUT", "90"),
            ("HULL_VM_SNAPSHOT", "off"),
            ("HULL_IMAGE_CACHE_MAX", "20GiB"),
        ];
        let s = Settings::from(|k| {
            env.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| OsString::from(v))
        });
        assert_eq!(s.runs_dir, None);
        assert_eq!(s.qemu, Some(PathBuf::from("/opt/q")));
        assert_eq!(s.vm_boot_timeout, Some(Duration::from_secs(90)));
        assert!(s.vm_snapshot_off);
        assert_eq!(s.image_cache_max, Some(20 << 30));
        let s = Settings::from(|k| (k == "HULL_VM_BOOT_TIMEOUT").then(|| "soon".into()));
        assert_eq!(s.vm_boot_timeout, None);
        assert!(!s.vm_snapshot_off);
    }
}
