//! A `copy` session's own workspace: a directory hull makes for the
//! session in the server's work dir, filled from the project the caller
//! names (or empty), which the session's commands work in and hull
//! removes when the session ends. Nobody uses git there on the host, so
//! its git metadata is the command's to change: the session runs with its
//! policy plus `fs.git = "writable"` (unless the policy says otherwise),
//! and `git init`, `commit` and `stash` work as in a container's workdir.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use super::sessions::Refusal;

/// The session's own directory (0700, the server's) with the workspace in
/// it (`work`, 0755: a container user an exec names reaches it too) and
/// the policy the session's runs use (`policy.toml`).
#[derive(Debug)]
pub struct OwnWorkspace {
    dir: PathBuf,
    pub work: PathBuf,
    pub policy: PathBuf,
    /// What the written policy makes of git metadata: writable, unless the
    /// caller's policy said read-only.
    pub git: crate::policy::GitMetadata,
}

impl OwnWorkspace {
    /// Makes `<root>/copy-<id>`, copies `source` into its `work` (links
    /// as links, modes and times kept; nothing followed), and writes
    /// `policy` there with git metadata writable.
    pub async fn make(
        root: &Path,
        id: &str,
        source: Option<&Path>,
        policy: &crate::policy::PolicyFile,
    ) -> Result<OwnWorkspace, Refusal> {
        let dir = root.join(format!("copy-{id}"));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| Refusal::new(500, format!("cannot create {}: {e}", dir.display())))?;
        let mut own = OwnWorkspace {
            work: dir.join("work"),
            policy: dir.join("policy.toml"),
            dir,
            git: crate::policy::GitMetadata::Writable,
        };
        match own.fill(source, policy).await {
            Ok(git) => {
                own.git = git;
                Ok(own)
            }
            Err(e) => {
                own.remove();
                Err(e)
            }
        }
    }

    /// Writes the policy and the copy; what the policy makes of git.
    async fn fill(
        &self,
        source: Option<&Path>,
        pf: &crate::policy::PolicyFile,
    ) -> Result<crate::policy::GitMetadata, Refusal> {
        let bad = |e: crate::policy::PolicyError| {
            Refusal::new(400, format!("policy {}: {e}", pf.source.name))
        };
        let text = pf.git_writable_text().map_err(bad)?;
        let git = crate::policy::PolicyFile::parse(&pf.source.name, &text)
            .and_then(|copy| copy.git_metadata())
            .map_err(bad)?;
        write_new(&self.policy, text.as_bytes())?;
        std::fs::DirBuilder::new()
            .mode(0o755)
            .create(&self.work)
            .map_err(|e| {
                Refusal::new(500, format!("cannot create {}: {e}", self.work.display()))
            })?;
        if let Some(src) = source {
            copy_tree(src, &self.work).await?;
            // hull's own things of the project (spare directories, its
            // masks' placeholders) are not the copy's.
            let hull = self.work.join(crate::policy::resolve::HULL_CONFIG_DIR);
            crate::runtime::remove_tree(&hull)
                .map_err(|e| Refusal::new(500, format!("cannot remove {}: {e}", hull.display())))?;
        }
        // Whatever mode the project's top had: the copy's own directory
        // (0700) keeps other host users out.
        std::fs::set_permissions(&self.work, std::fs::Permissions::from_mode(0o755)).map_err(
            |e| {
                Refusal::new(
                    500,
                    format!("cannot set the mode of {}: {e}", self.work.display()),
                )
            },
        )?;
        Ok(git)
    }

    /// Removes the session's directory, what its commands left included
    /// (no link followed). Only once nothing of the session runs.
    pub fn remove(&self) {
        if let Err(e) = crate::runtime::remove_tree(&self.dir) {
            tracing::warn!("hull serve: removing {}: {e}", self.dir.display());
        }
    }
}

/// A session's own policy file (its policy with a container image as the
/// userland: [`crate::policy::PolicyFile::with_image_text`]), in a 0700
/// directory of the server's, removed when the session ends.
#[derive(Debug)]
pub struct OwnPolicy {
    dir: PathBuf,
    pub policy: PathBuf,
}

impl OwnPolicy {
    /// Writes `text` as `<root>/policy-<id>/policy.toml`.
    pub fn make(root: &Path, id: &str, text: &str) -> Result<OwnPolicy, Refusal> {
        let dir = root.join(format!("policy-{id}"));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| Refusal::new(500, format!("cannot create {}: {e}", dir.display())))?;
        let own = OwnPolicy {
            policy: dir.join("policy.toml"),
            dir,
        };
        if let Err(e) = write_new(&own.policy, text.as_bytes()) {
            own.remove();
            return Err(e);
        }
        Ok(own)
    }

    /// Removes it (no link followed).
    pub fn remove(&self) {
        if let Err(e) = crate::runtime::remove_tree(&self.dir) {
            tracing::warn!("hull serve: removing {}: {e}", self.dir.display());
        }
    }
}

/// Writes a new file (never one that is there), mode 0600.
fn write_new(path: &Path, bytes: &[u8]) -> Result<(), Refusal> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(bytes))
        .map_err(|e| Refusal::new(500, format!("cannot write {}: {e}", path.display())))
}

/// Copies the tree `src` into the directory `dst` with `cp -a` (links
/// copied as links, never followed below `src`), from an environment hull
/// builds, never the server's.
async fn copy_tree(src: &Path, dst: &Path) -> Result<(), Refusal> {
    let out = tokio::process::Command::new("cp")
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("LC_ALL", "C")
        .arg("-a")
        .arg("--")
        .arg(src.join("."))
        .arg(dst)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .await
        .map_err(|e| Refusal::new(500, format!("cannot run cp to copy {}: {e}", src.display())))?;
    if !out.status.success() {
        let why = String::from_utf8_lossy(&out.stderr);
        let why: String = why.trim_end().chars().take(2000).collect();
        return Err(Refusal::new(
            500,
            format!(
                "cannot copy the project {} into the session's workspace {}: {why}",
                src.display(),
                dst.display()
            ),
        ));
    }
    Ok(())
}
