//! Unpacking a flattened image into a tree: what is made, with which
//! owner and mode, and what is refused without anything landing outside.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used)]

use std::os::fd::OwnedFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use hull_oci::Limits;

/// One tar entry, its name written as it is (`..` and all).
fn entry(
    b: &mut tar::Builder<Vec<u8>>,
    kind: tar::EntryType,
    name: &str,
    mode: u32,
    body: &[u8],
    link: Option<&str>,
) {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(body.len() as u64);
    h.set_uid(1234);
    h.set_gid(1234);
    h.set_mtime(1_000_000_000);
    h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
    if let Some(l) = link {
        h.as_old_mut().linkname[..l.len()].copy_from_slice(l.as_bytes());
    }
    h.set_cksum();
    b.append(&h, body).unwrap();
}

fn tar_of(f: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    f(&mut b);
    b.into_inner().unwrap()
}

fn dir_fd(p: &Path) -> OwnedFd {
    std::fs::File::open(p).unwrap().into()
}

const LIMITS: Limits = Limits {
    entries: 1000,
    bytes: 1 << 20,
};

#[test]
fn a_tree_is_made_as_the_image_says_with_our_owner_and_safe_modes() {
    use tar::EntryType as T;
    let t = tar_of(|b| {
        entry(b, T::Directory, "./", 0o755, b"", None);
        entry(b, T::Directory, "./usr/", 0o755, b"", None);
        entry(b, T::Directory, "./usr/bin/", 0o755, b"", None);
        entry(
            b,
            T::Regular,
            "./usr/bin/hello",
            0o4755,
            b"#!/bin/sh\necho hi\n",
            None,
        );
        entry(b, T::Regular, "usr/bin/open", 0o666, b"old", None);
        // A later entry replaces an earlier one.
        entry(b, T::Regular, "usr/bin/open", 0o666, b"new", None);
        entry(
            b,
            T::Link,
            "usr/bin/hello2",
            0o755,
            b"",
            Some("usr/bin/hello"),
        );
        entry(b, T::Symlink, "bin", 0o777, b"", Some("usr/bin"));
        entry(b, T::Directory, "etc/", 0o755, b"", None);
        entry(
            b,
            T::Symlink,
            "etc/shadow-link",
            0o777,
            b"",
            Some("/etc/shadow"),
        );
        entry(b, T::Directory, "tmp/", 0o1777, b"", None);
        entry(b, T::Directory, "root/", 0o700, b"", None);
        entry(b, T::Directory, "dev/", 0o755, b"", None);
        entry(b, T::Char, "dev/null", 0o666, b"", None);
    });
    let out = tempfile::tempdir().unwrap();
    let root = out.path().join("tree");
    std::fs::create_dir(&root).unwrap();
    let done = hull_oci::unpack(&t[..], dir_fd(&root), LIMITS).unwrap();
    assert_eq!((done.entries, done.skipped), (14, 1), "{done:?}");
    let me = rustix::process::geteuid().as_raw();
    let meta = |p: &str| std::fs::symlink_metadata(root.join(p)).unwrap();
    let hello = meta("usr/bin/hello");
    // No set-id bit, the owner is who unpacked it, its time the image's.
    assert_eq!(hello.permissions().mode() & 0o7777, 0o755);
    assert_eq!((hello.uid(), hello.mtime()), (me, 1_000_000_000));
    assert_eq!(meta("usr/bin/open").permissions().mode() & 0o777, 0o644);
    assert_eq!(std::fs::read(root.join("usr/bin/open")).unwrap(), b"new");
    assert_eq!(meta("usr/bin/hello2").ino(), hello.ino());
    assert_eq!(
        std::fs::read_link(root.join("bin")).unwrap(),
        Path::new("usr/bin")
    );
    assert_eq!(
        std::fs::read_link(root.join("etc/shadow-link")).unwrap(),
        Path::new("/etc/shadow")
    );
    // No group or other write anywhere; directories keep the owner's rwx.
    assert_eq!(meta("tmp").permissions().mode() & 0o7777, 0o755);
    assert_eq!(meta("root").permissions().mode() & 0o7777, 0o700);
    assert_eq!(meta("").permissions().mode() & 0o7777, 0o755);
    assert!(!root.join("dev/null").exists());
    // The tree goes, links and all, nothing followed.
    let parent = dir_fd(out.path());
    hull_oci::unpack::remove_at(&parent, std::ffi::OsStr::new("tree")).unwrap();
    assert!(!root.exists());
}

/// Entries whose directories come later or never (a layer holding
/// `usr/local/bin/x` alone; flattening that keeps an upper layer's `usr`
/// entry after the lower layer's `usr/bin`): the directories are made,
/// 0755 unless an entry names their mode, as `tar` does; buildah's layered
/// images are written so.
#[test]
fn directories_an_entry_needs_are_made_when_they_come_later_or_never() {
    use tar::EntryType as T;
    let t = tar_of(|b| {
        entry(b, T::Regular, "usr/bin/sh", 0o755, b"sh", None);
        entry(b, T::Regular, "usr/local/bin/hello", 0o755, b"hi", None);
        entry(b, T::Directory, "./usr/", 0o750, b"", None);
    });
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("tree");
    std::fs::create_dir(&root).unwrap();
    hull_oci::unpack(&t[..], dir_fd(&root), LIMITS).unwrap();
    assert_eq!(std::fs::read(root.join("usr/bin/sh")).unwrap(), b"sh");
    assert_eq!(
        std::fs::read(root.join("usr/local/bin/hello")).unwrap(),
        b"hi"
    );
    let mode = |p: &str| {
        std::fs::metadata(root.join(p))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    };
    assert_eq!(mode("usr"), 0o750);
    assert_eq!(mode("usr/bin"), 0o755);
    assert_eq!(mode("usr/local/bin"), 0o755);
}

#[test]
fn hostile_entries_are_refused_and_nothing_lands_outside() {
    use tar::EntryType as T;
    let out = tempfile::tempdir().unwrap();
    let outside = out.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let link_target = outside.to_str().unwrap().to_string();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "a file through a link",
            tar_of(|b| {
                entry(b, T::Symlink, "escape", 0o777, b"", Some(&link_target));
                entry(b, T::Regular, "escape/pwned", 0o644, b"x", None);
            }),
            "is not a directory of the image",
        ),
        (
            "a directory through a link",
            tar_of(|b| {
                entry(b, T::Symlink, "escape", 0o777, b"", Some(&link_target));
                entry(b, T::Directory, "escape/d/", 0o755, b"", None);
            }),
            "is not a directory of the image",
        ),
        (
            "climbing out",
            tar_of(|b| entry(b, T::Regular, "a/../../pwned", 0o644, b"x", None)),
            "`..`",
        ),
        (
            "an absolute path",
            tar_of(|b| entry(b, T::Regular, "/tmp/pwned", 0o644, b"x", None)),
            "absolute",
        ),
        (
            "a hard link to what is outside",
            tar_of(|b| entry(b, T::Link, "h", 0o644, b"", Some("../outside/secret"))),
            "`..`",
        ),
        (
            "a hard link through a link",
            tar_of(|b| {
                entry(b, T::Symlink, "escape", 0o777, b"", Some(&link_target));
                entry(b, T::Link, "h", 0o644, b"", Some("escape/secret"));
            }),
            "is not a directory of the image",
        ),
        (
            "a hard link to a link",
            tar_of(|b| {
                entry(b, T::Symlink, "l", 0o777, b"", Some("/etc/shadow"));
                entry(b, T::Link, "h", 0o644, b"", Some("l"));
            }),
            "not a regular file",
        ),
        (
            "a device node outside /dev",
            tar_of(|b| entry(b, T::Block, "sda", 0o666, b"", None)),
            "a device node outside /dev",
        ),
        (
            "a fifo",
            tar_of(|b| entry(b, T::Fifo, "f", 0o666, b"", None)),
            "Fifo",
        ),
        (
            "a file replacing a link to outside, then written through it",
            tar_of(|b| {
                entry(
                    b,
                    T::Symlink,
                    "f",
                    0o777,
                    b"",
                    Some(&format!("{link_target}/secret")),
                );
                entry(b, T::Regular, "f", 0o644, b"mine", None);
            }),
            "",
        ),
    ];
    std::fs::write(outside.join("secret"), b"secret").unwrap();
    for (what, t, why) in cases {
        let root = out.path().join("tree");
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir(&root).unwrap();
        let r = hull_oci::unpack(&t[..], dir_fd(&root), LIMITS);
        if why.is_empty() {
            // Allowed: the link is replaced by the file, never written through.
            r.unwrap();
            assert_eq!(std::fs::read(root.join("f")).unwrap(), b"mine", "{what}");
        } else {
            let e = r.unwrap_err().to_string();
            assert!(e.contains(why), "{what}: {e}");
        }
        let mut left: Vec<_> = std::fs::read_dir(&outside)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        left.sort();
        assert_eq!(left, ["secret"], "{what}");
        assert_eq!(
            std::fs::read(outside.join("secret")).unwrap(),
            b"secret",
            "{what}"
        );
    }
}

#[test]
fn more_than_the_limits_is_refused() {
    use tar::EntryType as T;
    let t = tar_of(|b| {
        for i in 0..20 {
            entry(b, T::Regular, &format!("f{i}"), 0o644, &[0; 100], None);
        }
    });
    let out = tempfile::tempdir().unwrap();
    let run = |limits| {
        let root = out.path().join(format!("t{}", rand_name()));
        std::fs::create_dir(&root).unwrap();
        hull_oci::unpack(&t[..], dir_fd(&root), limits).map_err(|e| e.to_string())
    };
    let e = run(Limits {
        entries: 10,
        bytes: 1 << 20,
    })
    .unwrap_err();
    assert!(e.contains("more than 10 entries"), "{e}");
    let e = run(Limits {
        entries: 100,
        bytes: 1000,
    })
    .unwrap_err();
    assert!(e.contains("more than 1000 bytes"), "{e}");
    assert!(run(Limits {
        entries: 100,
        bytes: 2000
    })
    .is_ok());
}

fn rand_name() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::SeqCst)
}
