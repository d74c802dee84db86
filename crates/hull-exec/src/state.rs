//! Where hull keeps its own state beside the run dirs: the VMs of `hull vm
//! up` and the tier-3 image cache (the run dirs' root is
//! [`crate::runtime::runs_root`]).
//!
//! Every command's policy hides these ([`hidden`]); the code that owns each
//! directory asks here for its place, so the owner and the policy cannot
//! disagree on where it is.

use std::path::PathBuf;

/// The state of `hull vm up`'s VMs: `$HULL_VMS_DIR` when set, else
/// `hull-vms` beside the runs root.
pub fn vms_root() -> PathBuf {
    if let Some(d) = &crate::settings::get().vms_dir {
        return d.clone();
    }
    crate::runtime::runs_root()
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or_else(std::env::temp_dir)
        .join("hull-vms")
}

/// The user's cache directory for hull: `$XDG_CACHE_HOME/hull`, else
/// `~/.cache/hull` (`~/Library/Caches/hull` on macOS,
/// `%LOCALAPPDATA%\hull` on Windows); `None` when none of these variables
/// is set.
pub fn cache_root() -> Option<PathBuf> {
    if cfg!(windows) {
        return std::env::var_os("LOCALAPPDATA").map(|d| PathBuf::from(d).join("hull"));
    }
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|x| !x.is_empty()) {
        return Some(PathBuf::from(x).join("hull"));
    }
    let home = PathBuf::from(std::env::var_os("HOME")?);
    if cfg!(target_os = "macos") {
        Some(home.join("Library/Caches/hull"))
    } else {
        Some(home.join(".cache/hull"))
    }
}

/// The tier-3 image cache: `$HULL_IMAGE_CACHE`, else
/// `$XDG_CACHE_HOME/hull/images`, else `~/.cache/hull/images`
/// (`%LOCALAPPDATA%\hull\images` on Windows); `None` when none of these
/// variables is set.
pub fn image_cache_root() -> Option<PathBuf> {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(p) = &crate::settings::get().image_cache {
        return Some(p.clone());
    }
    if let Some(p) = env("XDG_CACHE_HOME") {
        return Some(p.join("hull").join("images"));
    }
    #[cfg(windows)]
    if let Some(p) = env("LOCALAPPDATA") {
        return Some(p.join("hull").join("images"));
    }
    env("HOME").map(|h| h.join(".cache").join("hull").join("images"))
}

/// hull's state that no command may see, whatever its policy grants: the
/// VMs' state and the image cache.
pub fn hidden() -> Vec<PathBuf> {
    std::iter::once(vms_root())
        .chain(image_cache_root())
        .collect()
}
