//! The unprivileged host user hull's helpers and commands run as when hull
//! itself runs as root: the process tiers' command (`tier::identity`) and
//! tier 3's QEMU (`vm::qemu`). A leaf module: it knows the user, nothing of
//! who uses it.
//!
//! One system user made once by `scripts/setup.sh`, rather than a uid hull
//! picks: tools inside the sandbox look their uid up (`id`, `whoami`, git),
//! and an administrator sees in `ps` whose processes these are. A missing
//! user is an error that names the command creating it; hull never falls
//! back to running as root.

use std::path::PathBuf;

/// The user's name.
pub const NAME: &str = "hull-sandbox";

/// The command that creates [`NAME`] (`scripts/setup.sh` runs it).
pub const CREATE: &str = "useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin hull-sandbox";

const PASSWD: &str = "/etc/passwd";

#[derive(Debug, thiserror::Error)]
pub enum SandboxUserError {
    #[error("{what}: hull runs as root, so it runs as the unprivileged user `{NAME}`, which does not exist; create it with `{CREATE}` (scripts/setup.sh does)")]
    Missing { what: &'static str },
    #[error(
        "{what}: user `{NAME}` has uid 0 or gid 0 in {PASSWD}; it must be an unprivileged user"
    )]
    Privileged { what: &'static str },
    #[error("{what}: cannot read {path} to find `{NAME}`: {source}")]
    Passwd {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A uid and gid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ids {
    pub uid: u32,
    pub gid: u32,
}

/// Whether hull runs as root (what it starts must then change identity).
#[cfg(unix)]
pub fn hull_is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Finds [`NAME`] in `/etc/passwd`; `what` names the tier or helper that
/// needs it, for the error.
pub fn lookup(what: &'static str) -> Result<Ids, SandboxUserError> {
    let text = std::fs::read_to_string(PASSWD).map_err(|source| SandboxUserError::Passwd {
        what,
        path: PASSWD.into(),
        source,
    })?;
    let ids = find(&text, NAME).ok_or(SandboxUserError::Missing { what })?;
    if ids.uid == 0 || ids.gid == 0 {
        return Err(SandboxUserError::Privileged { what });
    }
    Ok(ids)
}

/// `name:pw:uid:gid:...` lines; the first entry for `name` wins.
fn find(passwd: &str, name: &str) -> Option<Ids> {
    passwd.lines().find_map(|line| {
        let mut f = line.split(':');
        if f.next()? != name {
            return None;
        }
        let _pw = f.next()?;
        let uid = f.next()?.parse().ok()?;
        let gid = f.next()?.parse().ok()?;
        Some(Ids { uid, gid })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_user_in_passwd() {
        let passwd =
            "root:x:0:0::/root:/bin/sh\nhull-sandbox:x:998:997::/nonexistent:/usr/sbin/nologin\n";
        assert_eq!(
            find(passwd, "hull-sandbox"),
            Some(Ids { uid: 998, gid: 997 })
        );
        assert_eq!(find(passwd, "hull"), None);
        assert_eq!(find("hull-sandbox:x:notanumber:1::", "hull-sandbox"), None);
    }
}
