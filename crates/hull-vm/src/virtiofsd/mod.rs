//! One virtiofsd per share, started and supervised by hull.
//!
//! What this protects against, on the host side (a compromised guest kernel
//! cannot undo any of it):
//! - writes to read-only shares: `--readonly` makes virtiofsd refuse every
//!   write with EROFS, also after a guest `mount -o remount,rw`;
//! - the guest reaching outside the share: `--sandbox=namespace` (pivot_root
//!   into the share, new pid/net namespaces) and `--seccomp=kill`; `chroot`
//!   only when namespaces are impossible, and then with a warning;
//! - writes to protected paths inside a writable share (`.git`, `.hull`,
//!   policy `deny` entries): virtiofsd starts in a private mount namespace
//!   where hull has bind-mounted each protected path read-only onto itself
//!   (or masked it with an empty read-only tmpfs or file). virtiofsd's own
//!   sandbox clones that tree recursively, so the guest sees the masks and
//!   cannot remove them. A protected path that does not exist yet gets an
//!   empty placeholder on the host first (removed again when the share ends,
//!   if still empty), so the guest cannot create it either;
//! - host-root ownership leaking in: ids are translated (`--translate-uid`,
//!   `--translate-gid`) so the files virtiofsd sees as uid/gid 0 appear as
//!   [`GUEST_UID`](super::GUEST_UID) in the guest, the unprivileged uid the
//!   container runs commands as.
//!
//! What it does not: a protected path that is a symlink, or lies below a
//! symlink inside the share, cannot be masked (a mount follows the link); it
//! is refused (fail closed). Writes are write-through (`--cache=auto`, no
//! `--writeback`): what the command wrote is on the host when it exits, but
//! host-side changes may take up to a second to show in the guest.
//!
//! Read-only grants beyond the snapshot's slots are packed into one
//! virtiofsd over a view: an empty directory in the run directory with each
//! grant bound read-only onto a subdirectory, in virtiofsd's private mount
//! namespace (nothing is mounted in the host's). virtiofsd runs
//! `--readonly` over it as over any read-only share.
//!
//! Here: the spec and its argv (pure). In [`process`]: starting virtiofsd
//! and supervising it. In [`mask`]: the protected-path masks and their
//! placeholders, mounted between fork and exec.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde::Serialize;

/// How virtiofsd isolates itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SandboxMode {
    /// Mount, pid and network namespaces, pivot_root into the share.
    Namespace,
    /// chroot into the share (root only); weaker, used only when namespaces fail.
    Chroot,
}

impl SandboxMode {
    pub fn name(self) -> &'static str {
        match self {
            SandboxMode::Namespace => "namespace",
            SandboxMode::Chroot => "chroot",
        }
    }
}

/// How a protected path inside a share is masked in virtiofsd's mount namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MaskKind {
    /// Bind-mounted read-only onto itself: readable, never writable.
    ReadOnly,
    /// Covered by an empty read-only directory or file.
    Hidden,
}

/// A protected path inside a share.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostMask {
    /// Absolute host path, below the share's `shared_dir`.
    pub path: PathBuf,
    pub kind: MaskKind,
    /// When missing, the placeholder to create: a file (shell rc files) or a dir.
    pub placeholder_is_file: bool,
}

/// A host directory bound read-only into a view (the `shared_dir` of a
/// spec that packs several read-only shares into one virtiofsd).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ViewBind {
    /// The granted host directory.
    pub source: PathBuf,
    /// An empty directory below the spec's `shared_dir` it is bound onto.
    pub at: PathBuf,
}

/// The part a share plays in a `--cow` run's overlay in the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OverlayRole {
    /// The project, read-only beneath the overlay: its protected paths
    /// that are missing get placeholders as in a writable share (the
    /// guest binds each read-only over the overlay, so the command cannot
    /// create them in its change set either); submounts (the masks) are
    /// not announced, as overlayfs cannot look up through them.
    Lower,
    /// The change set's `upper/` and `work/`: the one share with xattrs,
    /// and only `user.overlay.*` (the overlay's marks, mounted with
    /// `userxattr`); every other name is refused to the guest and hidden
    /// from it.
    Upper,
}

/// The `--xattrmap` of an overlay's upper share: `user.overlay.*` passes
/// both ways, anything else is refused (EPERM) and hidden.
pub const UPPER_XATTRMAP: &str = ":ok:client:user.overlay.:::ok:server::user.overlay.::bad:all:::";

/// Everything one virtiofsd is started with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VirtiofsdSpec {
    pub tag: String,
    pub shared_dir: PathBuf,
    pub socket: PathBuf,
    pub readonly: bool,
    pub sandbox: SandboxMode,
    /// The guest uid and gid the files virtiofsd sees as owned by uid and
    /// gid 0 appear as (the command's own shares); `None` shows every id as
    /// it is on the host (a host root file is then nobody's in the
    /// container, read as "others").
    pub translate: Option<(u32, u32)>,
    pub masks: Vec<HostMask>,
    /// When not empty, `shared_dir` is a view hull assembles: these
    /// directories bound read-only (and `nosuid,nodev`) onto empty
    /// directories of it in virtiofsd's private mount namespace. Only for a
    /// read-only spec without masks.
    pub views: Vec<ViewBind>,
    /// Its part in a `--cow` overlay, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlay: Option<OverlayRole>,
}

/// virtiofsd's `squash-guest` entries that write every guest id but `id`
/// as 0 (virtiofsd's ranges end before `u32::MAX`, the id a chown leaves
/// as it is).
fn squash_others(id: u32) -> Vec<String> {
    let mut v = Vec::new();
    if id > 0 {
        v.push(format!("squash-guest:0:0:{id}"));
    }
    if id < u32::MAX - 1 {
        v.push(format!("squash-guest:{}:0:{}", id + 1, u32::MAX - id - 1));
    }
    v
}

impl VirtiofsdSpec {
    /// virtiofsd's arguments (without the program name).
    pub fn argv(&self) -> Vec<OsString> {
        let mut a: Vec<OsString> = Vec::new();
        let mut kv = |k: &str, v: &OsString| {
            let mut s = OsString::from(k);
            s.push(v);
            a.push(s);
        };
        kv("--socket-path=", &self.socket.clone().into_os_string());
        kv("--shared-dir=", &self.shared_dir.clone().into_os_string());
        kv("--sandbox=", &self.sandbox.name().into());
        kv("--seccomp=", &"kill".into());
        // Write-through data cache with short metadata timeouts: writes land
        // on the host before the guest's write(2) returns.
        kv("--cache=", &"auto".into());
        // Files virtiofsd sees as 0 (host root, or the host user inside
        // virtiofsd's user namespace) appear as the guest's command uid.
        // Every other guest id writes as 0 too: what the container's root
        // or another user of it makes (a session's `user=`) is the host
        // owner's, never a host id nobody chose (the container's root is
        // guest uid 1000000, which may be some host user's).
        if let Some((uid, gid)) = self.translate {
            for (flag, id) in [("--translate-uid=", uid), ("--translate-gid=", gid)] {
                kv(flag, &format!("map:{id}:0:1").into());
                for squash in squash_others(id) {
                    kv(flag, &squash.into());
                }
            }
        }
        // No device nodes from the guest: mknod of a block or character
        // device on the host would give whoever reaches the share that
        // device. (Fifos, sockets and an overlay's whiteouts, a character
        // device 0/0, need no CAP_MKNOD.)
        kv("--modcaps=", &"-mknod".into());
        match self.overlay {
            Some(OverlayRole::Upper) => {
                kv("--xattrmap=", &UPPER_XATTRMAP.into());
                kv("--xattr", &OsString::new());
            }
            // overlayfs refuses to look up through an automount, which is
            // what the guest makes of an announced submount (the masks
            // are mounts): the lower layer shows them as plain directories.
            Some(OverlayRole::Lower) => kv("--no-announce-submounts", &OsString::new()),
            None => {}
        }
        kv("--log-level=", &"info".into());
        if self.readonly {
            a.push("--readonly".into());
        }
        a
    }
}

/// Finds virtiofsd: `HULL_VIRTIOFSD`, `PATH`, `/usr/libexec/virtiofsd`,
/// `/usr/lib/qemu/virtiofsd`, `~/.cargo/bin/virtiofsd`. Absolute path.
pub fn find_virtiofsd() -> Option<PathBuf> {
    if let Some(p) = &crate::settings::get().virtiofsd {
        return p.is_absolute().then(|| p.clone());
    }
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.push("/usr/libexec".into());
    dirs.push("/usr/lib/qemu".into());
    if let Some(home) = std::env::var_os("HOME") {
        dirs.push(Path::new(&home).join(".cargo/bin"));
    }
    super::qemu::find_in(&dirs, "virtiofsd")
}

/// `virtiofsd 1.14.0`.
pub fn version(bin: &Path) -> Option<String> {
    let out = std::process::Command::new(bin)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

#[cfg(target_os = "linux")]
mod mask;
#[cfg(target_os = "linux")]
mod process;

#[cfg(target_os = "linux")]
pub use process::*;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_argv() {
        let spec = VirtiofsdSpec {
            tag: "spill".into(),
            shared_dir: "/tmp/hull-runs/ID/spill".into(),
            socket: "/tmp/hull-runs/ID/vfs-spill.sock".into(),
            readonly: true,
            sandbox: SandboxMode::Namespace,
            translate: Some((1000, 1000)),
            masks: vec![],
            views: vec![],
            overlay: None,
        };
        let got: Vec<String> = spec
            .argv()
            .into_iter()
            .map(|s| s.into_string().unwrap())
            .collect();
        assert_eq!(
            got,
            [
                "--socket-path=/tmp/hull-runs/ID/vfs-spill.sock",
                "--shared-dir=/tmp/hull-runs/ID/spill",
                "--sandbox=namespace",
                "--seccomp=kill",
                "--cache=auto",
                "--translate-uid=map:1000:0:1",
                "--translate-uid=squash-guest:0:0:1000",
                "--translate-uid=squash-guest:1001:0:4294966294",
                "--translate-gid=map:1000:0:1",
                "--translate-gid=squash-guest:0:0:1000",
                "--translate-gid=squash-guest:1001:0:4294966294",
                "--modcaps=-mknod",
                "--log-level=info",
                "--readonly",
            ]
        );
        let mut rw = spec.clone();
        rw.readonly = false;
        rw.sandbox = SandboxMode::Chroot;
        let got: Vec<String> = rw
            .argv()
            .into_iter()
            .map(|s| s.into_string().unwrap())
            .collect();
        assert!(!got.iter().any(|a| a == "--readonly"));
        assert!(got.iter().any(|a| a == "--sandbox=chroot"));
        // xattrs on no share but an overlay's upper, and only its marks.
        assert!(!got.iter().any(|a| a.starts_with("--xattr")));
        rw.overlay = Some(OverlayRole::Upper);
        let got: Vec<String> = rw
            .argv()
            .into_iter()
            .map(|s| s.into_string().unwrap())
            .collect();
        assert!(got.iter().any(|a| a == "--xattr"));
        assert!(got.contains(&format!("--xattrmap={UPPER_XATTRMAP}")));
        assert!(got.iter().any(|a| a == "--modcaps=-mknod"));
    }
}
