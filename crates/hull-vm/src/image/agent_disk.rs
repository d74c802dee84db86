//! The guest agent's disk: a small read-only ext4 holding one file,
//! `hull-agent`, attached to every tier-3 VM as its second virtio-blk
//! (`/dev/vdb`). The guest mounts it read-only at `/opt/hull` and the run
//! container sees the same directory read-only, so one binary is the outer
//! agent (the guest's) and the inner one (the container's init).
//!
//! Keeping the agent off the Debian image means the image id names the
//! recipe alone: a new hull build (debug or release, any commit) makes a
//! new agent disk (under a second) and a new snapshot (a boot, about a
//! minute under TCG), never a new image (minutes of mmdebstrap).
//!
//! The disk is named after the agent's sha256 (`agent-<16 hex>.ext4`), made
//! in a temporary file and linked into place only where no disk is (the
//! first maker wins), so a reader sees a complete disk or none, and a disk
//! is never replaced under a VM or a snapshot that uses it: a snapshot
//! holds the guest's cached view of that very file, and a second `mkfs`
//! of the same agent differs in its UUID and checksums. A snapshot records
//! the disk's [`AgentDisk::stamp`] too, so a disk made again (removed by
//! hand) makes its snapshots stale. Its file is owned by root (a guest uid
//! could otherwise own the container's init) and mode 0755.
//!
//! Protects against: a disk of another agent being attached (the name
//! hashes the bytes; snapshots record the same hash), a half-written disk,
//! and the guest changing it (QEMU opens it read-only, the guest mounts it
//! read-only). Trusts the image cache as the image does (it must be
//! private: [`super::Cache::check_private`]); unlike the image's files it is
//! not digest-checked before use (hull makes it and never writes it again).

use super::hex;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use super::ImageError;

/// The ext4 label of the agent disk.
pub const LABEL: &str = "hullagent";
/// The agent's file name on the disk (`/opt/hull/hull-agent` in the guest).
pub const FILE: &str = "hull-agent";
/// Where the guest and the container mount the disk.
pub const GUEST_DIR: &str = "/opt/hull";

/// An agent disk that exists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentDisk {
    pub path: PathBuf,
    /// sha256 (hex) of the agent binary on it.
    pub sha256: String,
    /// Which file this disk is (`<inode>-<mtime ns>`; empty while it does not
    /// exist): a disk made again gets another.
    pub stamp: String,
}

/// The disk file name for an agent of hash `sha256`.
pub fn file_name(sha256: &str) -> String {
    format!("agent-{}.ext4", &sha256[..16.min(sha256.len())])
}

/// The agent disk in `dir` for the agent binary at `agent`, made first when
/// missing.
pub fn ensure(dir: &Path, agent: &Path) -> Result<AgentDisk, ImageError> {
    locate(dir, agent, true)
}

/// Where the agent disk in `dir` for `agent` is (it may not exist): for
/// callers that only look, like `hull probe`.
pub fn locate_only(dir: &Path, agent: &Path) -> Result<AgentDisk, ImageError> {
    locate(dir, agent, false)
}

fn locate(dir: &Path, agent: &Path, make_it: bool) -> Result<AgentDisk, ImageError> {
    let bytes = super::read_agent(agent)?;
    let sha256 = hex(&Sha256::digest(&bytes));
    let path = dir.join(file_name(&sha256));
    if make_it && !path.is_file() {
        make(dir, &path, &bytes)?;
    }
    let stamp = stamp(&path);
    Ok(AgentDisk {
        path,
        sha256,
        stamp,
    })
}

fn stamp(path: &Path) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        fs::metadata(path)
            .map(|m| format!("{}-{}{:09}", m.ino(), m.mtime(), m.mtime_nsec()))
            .unwrap_or_default()
    }
    #[cfg(not(unix))]
    {
        fs::metadata(path)
            .and_then(|m| m.modified())
            .map(|t| format!("{t:?}"))
            .unwrap_or_default()
    }
}

/// Writes the ext4 for `bytes` to `dest` (through a temporary file beside it).
fn make(dir: &Path, dest: &Path, bytes: &[u8]) -> Result<(), ImageError> {
    let pid = std::process::id();
    let stage = dir.join(format!(".agent-stage-{pid}"));
    let tmp = dir.join(format!(".agent-disk-{pid}.ext4"));
    let _ = fs::remove_dir_all(&stage);
    let _ = fs::remove_file(&tmp);
    let r = make_in(&stage, &tmp, bytes).and_then(|()| match fs::hard_link(&tmp, dest) {
        // Another hull made it first: theirs stays (a VM may use it).
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        r => r.map_err(ImageError::io(dest, "link the agent disk into place")),
    });
    let _ = fs::remove_dir_all(&stage);
    let _ = fs::remove_file(&tmp);
    r
}

fn make_in(stage: &Path, tmp: &Path, bytes: &[u8]) -> Result<(), ImageError> {
    fs::create_dir(stage).map_err(ImageError::io(stage, "create"))?;
    let file = stage.join(FILE);
    {
        let mut f = fs::File::create(&file).map_err(ImageError::io(&file, "create"))?;
        f.write_all(bytes)
            .map_err(ImageError::io(&file, "write the agent"))?;
    }
    set_mode(&file, 0o755)?;
    // Room for the file, its block maps and ext4's own metadata.
    let mib = (bytes.len() as u64 * 9 / 8 + (4 << 20)).div_ceil(1 << 20);
    let mut mkfs = Command::new(tool("mkfs.ext4"));
    mkfs.args(["-q", "-F", "-t", "ext4", "-L", LABEL, "-m", "0", "-N", "32"])
        .args(["-O", "^has_journal,^resize_inode", "-E", "root_owner=0:0"])
        .arg("-d")
        .arg(stage)
        .arg(tmp)
        .arg(format!("{mib}M"));
    run(&mut mkfs, tmp)?;
    if !is_root() {
        // mkfs copies the owner of the staged file: the caller's uid.
        let mut fix = Command::new(tool("debugfs"));
        fix.arg("-w")
            .args(["-R", &format!("set_inode_field /{FILE} uid 0")])
            .arg(tmp);
        run(&mut fix, tmp)?;
        let mut fix = Command::new(tool("debugfs"));
        fix.arg("-w")
            .args(["-R", &format!("set_inode_field /{FILE} gid 0")])
            .arg(tmp);
        run(&mut fix, tmp)?;
    }
    set_mode(tmp, 0o444)
}

fn is_root() -> bool {
    #[cfg(unix)]
    return crate::sandbox_user::hull_is_root();
    #[cfg(not(unix))]
    false
}

/// `name` from root's sbin directories when the caller's PATH lacks them.
fn tool(name: &str) -> PathBuf {
    ["/usr/sbin", "/sbin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(name))
}

fn run(cmd: &mut Command, disk: &Path) -> Result<(), ImageError> {
    let shown = format!("{cmd:?}");
    let out = match cmd.output() {
        Ok(o) => o,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ImageError::MissingTools {
                list: format!(
                    "{} (makes the guest agent's disk)",
                    cmd.get_program().to_string_lossy()
                ),
                install: "sudo apt-get install e2fsprogs".into(),
            })
        }
        Err(e) => return Err(ImageError::io(disk, "make the agent disk")(e)),
    };
    if out.status.success() {
        return Ok(());
    }
    Err(ImageError::AgentDisk {
        path: disk.to_path_buf(),
        cmd: shown,
        why: format!(
            "{}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ),
    })
}

fn set_mode(path: &Path, mode: u32) -> Result<(), ImageError> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(path, fs::Permissions::from_mode(mode))
            .map_err(ImageError::io(path, "set the mode of"))?;
    }
    #[cfg(not(unix))]
    let _ = (path, mode);
    Ok(())
}

/// The agent disks in `dir`, newest first (by modification time).
pub fn list(dir: &Path) -> Vec<(PathBuf, std::time::SystemTime)> {
    let mut v: Vec<(PathBuf, std::time::SystemTime)> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            let n = e.file_name();
            let n = n.to_string_lossy();
            n.starts_with("agent-") && n.ends_with(".ext4")
        })
        .filter_map(|e| Some((e.path(), e.metadata().ok()?.modified().ok()?)))
        .collect();
    v.sort_by_key(|d| std::cmp::Reverse(d.1));
    v
}

#[cfg(test)]
#[cfg(target_os = "linux")]
mod tests {
    use super::*;

    fn fake_agent(dir: &Path, tail: &[u8]) -> PathBuf {
        let mut elf = vec![0u8; 64];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[4] = 2;
        elf[5] = 1;
        elf[16] = 3;
        elf[18] = 62;
        elf.extend_from_slice(tail);
        let p = dir.join(format!("agent-{}", tail.len()));
        fs::write(&p, &elf).unwrap();
        p
    }

    /// The disk holds the agent's bytes, root-owned and executable, is
    /// named by its hash and read-only; a second call reuses it and another
    /// agent gets another disk.
    #[test]
    fn the_disk_holds_the_agent_root_owned_and_is_reused() {
        let d = tempfile::tempdir().unwrap();
        let agent = fake_agent(d.path(), b"one");
        let disk = ensure(d.path(), &agent).unwrap();
        let want = hex(&Sha256::digest(fs::read(&agent).unwrap()));
        assert_eq!(disk.sha256, want);
        assert_eq!(
            disk.path,
            d.path().join(format!("agent-{}.ext4", &want[..16]))
        );
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            fs::metadata(&disk.path).unwrap().permissions().mode() & 0o777,
            0o444
        );
        let out = Command::new(tool("debugfs"))
            .args(["-R", &format!("stat /{FILE}")])
            .arg(&disk.path)
            .output()
            .unwrap();
        let stat = String::from_utf8_lossy(&out.stdout);
        assert!(stat.contains("Mode:  0755"), "{stat}");
        assert!(stat.contains("User:     0   Group:     0"), "{stat}");
        let dumped = d.path().join("dumped");
        let out = Command::new(tool("debugfs"))
            .args(["-R", &format!("dump /{FILE} {}", dumped.display())])
            .arg(&disk.path)
            .output()
            .unwrap();
        assert!(out.status.success());
        assert_eq!(fs::read(&dumped).unwrap(), fs::read(&agent).unwrap());
        assert!(!disk.stamp.is_empty());
        assert_eq!(ensure(d.path(), &agent).unwrap(), disk, "made again");
        // A disk that is there is never replaced (a snapshot holds its view).
        make(d.path(), &disk.path, &fs::read(&agent).unwrap()).unwrap();
        assert_eq!(ensure(d.path(), &agent).unwrap(), disk, "replaced");
        // One made again after a removal is another disk.
        fs::remove_file(&disk.path).unwrap();
        let again = ensure(d.path(), &agent).unwrap();
        assert_eq!(again.path, disk.path);
        assert_ne!(again.stamp, disk.stamp);
        let other = ensure(d.path(), &fake_agent(d.path(), b"two!")).unwrap();
        assert_ne!(other.path, disk.path);
        assert_eq!(list(d.path()).len(), 2);
        let leftovers: Vec<_> = fs::read_dir(d.path())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }

    #[test]
    fn a_non_agent_gets_no_disk() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("script");
        fs::write(&p, b"#!/bin/sh\n").unwrap();
        assert!(matches!(
            ensure(d.path(), &p),
            Err(ImageError::AgentNotLinux { .. })
        ));
        assert!(list(d.path()).is_empty());
    }
}
