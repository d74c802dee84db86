//! An image config's `User` (`NAME`, `UID`, `NAME:GROUP`, `UID:GID`) as
//! the ids a sandbox on the unpacked image runs its command as: names are
//! looked up in the image's own `/etc/passwd` and `/etc/group`, read from
//! the tree with every link resolved inside it (`RESOLVE_IN_ROOT`), never
//! the host's.

use std::io::Read;
use std::os::fd::AsFd;

use rustix::fs::{Mode, OFlags, ResolveFlags};

/// The most of `/etc/passwd` or `/etc/group` read.
const MAX_DB: u64 = 1 << 20;

/// The ids `user` names in the image whose tree is `root`.
pub fn resolve_user(root: &impl AsFd, user: &str) -> Result<(u32, u32), String> {
    let (who, group) = match user.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (user, None),
    };
    if who.is_empty() {
        return Err(format!("User {user:?} names no user"));
    }
    let passwd = || read_db(root, "etc/passwd");
    // name:x:uid:gid:...
    let by = |db: &str, name: &str| -> Option<(u32, u32)> {
        db.lines().find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.len() >= 4 && f[0] == name)
                .then(|| Some((f[2].parse().ok()?, f[3].parse().ok()?)))?
        })
    };
    let (uid, primary) = match who.parse::<u32>() {
        Ok(uid) => {
            // A number: its primary group when the image names it.
            let primary = passwd().ok().and_then(|db| {
                db.lines().find_map(|l| {
                    let f: Vec<&str> = l.split(':').collect();
                    (f.len() >= 4 && f[2].parse() == Ok(uid)).then(|| f[3].parse().ok())?
                })
            });
            (uid, primary.unwrap_or(uid))
        }
        Err(_) => by(&passwd()?, who)
            .ok_or_else(|| format!("User {who:?} is not in the image's /etc/passwd"))?,
    };
    let gid = match group {
        None => primary,
        Some(g) => match g.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => read_db(root, "etc/group")?
                .lines()
                .find_map(|l| {
                    let f: Vec<&str> = l.split(':').collect();
                    (f.len() >= 3 && f[0] == g).then(|| f[2].parse().ok())?
                })
                .ok_or_else(|| format!("group {g:?} is not in the image's /etc/group"))?,
        },
    };
    Ok((uid, gid))
}

fn read_db(root: &impl AsFd, name: &str) -> Result<String, String> {
    let fd = rustix::fs::openat2(
        root,
        name,
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NONBLOCK,
        Mode::empty(),
        ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS | ResolveFlags::NO_XDEV,
    )
    .map_err(|e| format!("the image's /{name}: {e}"))?;
    let mut text = String::new();
    std::fs::File::from(fd)
        .take(MAX_DB)
        .read_to_string(&mut text)
        .map_err(|e| format!("the image's /{name}: {e}"))?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_is_looked_up_in_the_image_never_the_host() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("etc")).unwrap();
        std::fs::write(
            t.path().join("etc/passwd"),
            "root:x:0:0::/root:/bin/sh\napp:x:1500:1600::/home/app:/bin/sh\n",
        )
        .unwrap();
        std::fs::write(t.path().join("etc/group"), "root:x:0:\nstaff:x:50:\n").unwrap();
        let root = std::fs::File::open(t.path()).unwrap();
        let r = |u: &str| resolve_user(&root, u);
        assert_eq!(r("app"), Ok((1500, 1600)));
        assert_eq!(r("root"), Ok((0, 0)));
        assert_eq!(r("1500"), Ok((1500, 1600)));
        assert_eq!(r("4242"), Ok((4242, 4242)));
        assert_eq!(r("app:staff"), Ok((1500, 50)));
        assert_eq!(r("app:7"), Ok((1500, 7)));
        assert!(r("nobody")
            .unwrap_err()
            .contains("not in the image's /etc/passwd"));
        assert!(r("app:wheel")
            .unwrap_err()
            .contains("not in the image's /etc/group"));
        // A link to the host's passwd is resolved inside the tree.
        std::fs::remove_file(t.path().join("etc/passwd")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", t.path().join("etc/passwd")).unwrap();
        assert!(
            r("root").unwrap_err().contains("/etc/passwd"),
            "{:?}",
            r("root")
        );
    }
}
