//! A user named in an exec (`Exec.user`), looked up in the agent's own
//! `/etc/passwd`: the container's, which the inner agent (its init) sees as
//! its root.
//!
//! The file is whatever the container's root made of it; the agent is that
//! root too, so nothing is gained by lying in it, but it may be anything:
//! it is opened without following a link and without blocking (a FIFO
//! there would stall the session), must be a regular file of at most
//! [`MAX_PASSWD`] bytes, and is parsed line by line, a malformed line
//! skipped. No NSS: the container's own users are those of its files.

use std::io::Read;
use std::path::Path;

use rustix::fs::{Mode, OFlags, ResolveFlags, CWD};

/// The largest `/etc/passwd` read.
pub const MAX_PASSWD: u64 = 4 << 20;

/// What an exec runs as, from a `passwd` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: String,
}

impl User {
    /// `HOME`, `USER` and `LOGNAME` for the command, as a login gives them.
    pub fn env(&self) -> [(String, String); 3] {
        [
            ("HOME".into(), self.home.clone()),
            ("USER".into(), self.name.clone()),
            ("LOGNAME".into(), self.name.clone()),
        ]
    }
}

#[derive(Debug, thiserror::Error)]
pub enum UserError {
    #[error("no user {name} in {file}")]
    Unknown { name: String, file: String },
    #[error("cannot read {file} to find user {name}: {why}")]
    Unreadable {
        name: String,
        file: String,
        why: String,
    },
}

/// Looks `name` up in `passwd` (the agent's `/etc/passwd`).
pub fn lookup(passwd: &Path, name: &str) -> Result<User, UserError> {
    let file = passwd.display().to_string();
    let unreadable = |why: String| UserError::Unreadable {
        name: name.to_string(),
        file: file.clone(),
        why,
    };
    let fd = rustix::fs::openat2(
        CWD,
        passwd,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
        ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(|e| unreadable(std::io::Error::from(e).to_string()))?;
    let st = rustix::fs::fstat(&fd).map_err(|e| unreadable(std::io::Error::from(e).to_string()))?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(unreadable("not a regular file".into()));
    }
    let mut text = Vec::new();
    std::fs::File::from(fd)
        .take(MAX_PASSWD + 1)
        .read_to_end(&mut text)
        .map_err(|e| unreadable(e.to_string()))?;
    if text.len() as u64 > MAX_PASSWD {
        return Err(unreadable(format!("larger than {MAX_PASSWD} bytes")));
    }
    find(&text, name).ok_or_else(|| UserError::Unknown {
        name: name.to_string(),
        file,
    })
}

/// The first well-formed line of `text` for `name`.
fn find(text: &[u8], name: &str) -> Option<User> {
    text.split(|b| *b == b'\n').find_map(|line| {
        let line = std::str::from_utf8(line).ok()?;
        let f: Vec<&str> = line.split(':').collect();
        if f.len() != 7 || f[0] != name {
            return None;
        }
        Some(User {
            name: f[0].to_string(),
            uid: f[2].parse().ok()?,
            gid: f[3].parse().ok()?,
            home: if f[5].starts_with('/') { f[5] } else { "/" }.to_string(),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\n\
        broken:x:zero:0::/:/bin/sh\n\
        +nis\n\
        hull:x:1000:1000:,,,:/home/hull:/bin/sh\n\
        rel:x:1001:1001::relative:/bin/sh\n\
        hull:x:5:5::/other:/bin/sh\n";

    #[test]
    fn a_user_is_its_first_well_formed_line() {
        let t = PASSWD.as_bytes();
        assert_eq!(
            find(t, "root"),
            Some(User {
                name: "root".into(),
                uid: 0,
                gid: 0,
                home: "/root".into()
            })
        );
        assert_eq!(find(t, "hull").map(|u| (u.uid, u.gid)), Some((1000, 1000)));
        assert_eq!(find(t, "broken"), None);
        assert_eq!(find(t, "+nis"), None);
        assert_eq!(find(t, "nobody"), None);
        assert_eq!(find(t, "rel").map(|u| u.home), Some("/".into()));
    }

    #[test]
    fn passwd_is_read_only_as_a_bounded_regular_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("passwd");
        std::fs::write(&p, PASSWD).unwrap();
        assert_eq!(lookup(&p, "hull").unwrap().uid, 1000);
        let e = lookup(&p, "nobody").unwrap_err().to_string();
        assert!(
            e.contains("no user nobody in") && e.contains("passwd"),
            "{e}"
        );
        // A link is not followed, a FIFO does not block, a huge file is refused.
        let l = d.path().join("link");
        std::os::unix::fs::symlink(&p, &l).unwrap();
        assert!(matches!(
            lookup(&l, "hull"),
            Err(UserError::Unreadable { .. })
        ));
        let f = d.path().join("fifo");
        rustix::fs::mknodat(CWD, &f, rustix::fs::FileType::Fifo, Mode::from(0o600), 0).unwrap();
        let e = lookup(&f, "hull").unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        let big = d.path().join("big");
        std::fs::File::create(&big)
            .unwrap()
            .set_len(MAX_PASSWD + 1)
            .unwrap();
        let e = lookup(&big, "hull").unwrap_err().to_string();
        assert!(e.contains("larger than"), "{e}");
    }
}
