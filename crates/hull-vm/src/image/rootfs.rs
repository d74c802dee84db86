//! `[vm] rootfs`: a whole container userland from a tarball (for example
//! exported from a container image), checked before use and rewritten into
//! the tarball the image build imports.
//!
//! The tarball is the user's, not hull's, and may be hostile. Nothing of it
//! is unpacked or run on the host: it is read as a stream, every entry is
//! checked, and a new tarball is written from the checked entries with
//! fresh headers (so extended attributes, file capabilities among them, do
//! not pass) and without set-uid or set-gid bits (cleared, counted: every
//! distribution ships `su` and `passwd`), plus the pieces every container of the image needs: the
//! `hull` user (uid/gid 1000, what commands run as), `/opt/hull` (the
//! agent disk's mount point), an empty `/etc/resolv.conf`. The guest's
//! Incus unpacks it inside the VM.
//!
//! Refused, naming the entry: absolute paths and `..` components, device
//! nodes outside `/dev` (those under it are left out: LXC makes the
//! container's `/dev`) and fifos, hard links to anything but
//! an earlier regular file of the tarball, relative symbolic links that
//! climb above the tree's root, an entry listed twice, entries under
//! `opt/hull`, more than [`MAX_ENTRIES`] entries or [`MAX_UNPACKED`] bytes,
//! a metadata entry (GNU long name, PAX header) over
//! [`hull_oci::tar_guard::MAX_METADATA_ENTRY`] (the tar crate reads those whole into memory: the
//! reader below it follows the block layout and refuses one by its header)
//! and a PAX record that sets an entry's size.
//! Absolute symbolic links stay: inside the container they resolve in its
//! own root.

use std::collections::HashSet;
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read};
use std::path::{Path, PathBuf};

/// The largest tarball read.
pub const MAX_TARBALL: u64 = 8 << 30;
/// The most bytes of file contents a rootfs may hold (the guest's pool is
/// 8 GiB and holds the default image too).
pub const MAX_UNPACKED: u64 = 6 << 30;
/// The most entries a rootfs may hold.
pub const MAX_ENTRIES: usize = 500_000;
/// The longest `/etc/passwd` or `/etc/group` read (they are rewritten).
const MAX_ACCOUNTS_FILE: u64 = 1 << 20;
/// Where the guest mounts the agent disk in the container.
const AGENT_MOUNT: &str = "opt/hull";

/// Why a rootfs tarball is refused.
#[derive(Debug, thiserror::Error)]
pub enum RootfsError {
    #[error("[vm] rootfs {path}: cannot {what}: {source}")]
    Io {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("[vm] rootfs {path}: entry {entry:?}: {why}; refused")]
    Entry {
        path: PathBuf,
        entry: String,
        why: String,
    },
    #[error("[vm] rootfs {path}: {why}; refused")]
    Invalid { path: PathBuf, why: String },
    #[error("[vm] rootfs {path} changed while it was read (sha256 {was} when checked, {now} now)")]
    Changed {
        path: PathBuf,
        was: String,
        now: String,
    },
}

/// What [`check`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    /// sha256 (hex) of the tarball's bytes.
    pub sha256: String,
    pub entries: usize,
    /// Bytes of file contents.
    pub bytes: u64,
    /// Device nodes under `/dev` left out.
    pub dropped: usize,
    /// Files whose set-uid or set-gid bit was cleared.
    pub cleared: usize,
}

/// Checks the tarball at `path` entry by entry and returns its digest.
pub fn check(path: &Path) -> Result<Checked, RootfsError> {
    walk(path, open(path)?, None)
}

/// [`check`] of a tarball already opened by [`open`] from `path`.
pub fn check_opened(path: &Path, f: File) -> Result<Checked, RootfsError> {
    walk(path, f, None)
}

/// Opens the tarball at `path` for reading, without waiting and without
/// following a link: a fifo would block the open until a writer came, and
/// a link may be swapped between two opens. The one descriptor returned is
/// checked a regular file of at most [`MAX_TARBALL`] bytes (by `fstat`);
/// it is what is stamped, hashed and read.
pub fn open(path: &Path) -> Result<File, RootfsError> {
    let invalid = |why: String| RootfsError::Invalid {
        path: path.to_path_buf(),
        why,
    };
    let mut o = std::fs::OpenOptions::new();
    o.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_NOCTTY);
    }
    let f = match o.open(path) {
        Ok(f) => f,
        #[cfg(unix)]
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(invalid(
                "a symbolic link (name the tarball itself: hull does not follow links to it)"
                    .into(),
            ))
        }
        Err(source) => {
            return Err(RootfsError::Io {
                path: path.to_path_buf(),
                what: "open",
                source,
            })
        }
    };
    let meta = f.metadata().map_err(|source| RootfsError::Io {
        path: path.to_path_buf(),
        what: "read the type of",
        source,
    })?;
    if !meta.is_file() {
        return Err(invalid(format!(
            "not a regular file (a {})",
            file_kind(&meta.file_type())
        )));
    }
    if meta.len() > MAX_TARBALL {
        return Err(invalid(format!(
            "{} bytes, more than the {} GiB a rootfs tarball may have",
            meta.len(),
            MAX_TARBALL >> 30
        )));
    }
    Ok(f)
}

fn file_kind(t: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "fifo";
        }
        if t.is_socket() {
            return "socket";
        }
        if t.is_char_device() || t.is_block_device() {
            return "device";
        }
    }
    if t.is_dir() {
        "directory"
    } else {
        "special file"
    }
}

/// Checks the tarball again and writes the container's import tarball
/// (plain tar) to `out`; refuses a tarball whose digest is not `sha256`
/// any more (changed since the image id was computed from it).
pub fn convert(path: &Path, sha256: &str, out: &Path) -> Result<Checked, RootfsError> {
    let io_out = |what| {
        let out = out.to_path_buf();
        move |source| RootfsError::Io {
            path: out.clone(),
            what,
            source,
        }
    };
    let f = File::create(out).map_err(io_out("create the converted tarball"))?;
    let mut builder = tar::Builder::new(BufWriter::new(f));
    builder.mode(tar::HeaderMode::Complete);
    let checked = walk(path, open(path)?, Some(&mut builder))?;
    let w = builder
        .into_inner()
        .map_err(io_out("write the converted tarball"))?;
    w.into_inner()
        .map_err(|e| e.into_error())
        .and_then(|f| f.sync_all())
        .map_err(io_out("write the converted tarball"))?;
    if checked.sha256 != sha256 {
        let _ = std::fs::remove_file(out);
        return Err(RootfsError::Changed {
            path: path.to_path_buf(),
            was: sha256.to_string(),
            now: checked.sha256,
        });
    }
    Ok(checked)
}

type Out<'a> = Option<&'a mut tar::Builder<BufWriter<File>>>;

/// Checks the tarball `f` (opened by [`open`] from `path`) entry by
/// entry, writing the converted entries to `out`.
fn walk(path: &Path, f: File, mut out: Out<'_>) -> Result<Checked, RootfsError> {
    let io_err = |what| {
        let path = path.to_path_buf();
        move |source| RootfsError::Io {
            path: path.clone(),
            what,
            source,
        }
    };
    let refuse = |entry: &str, why: String| RootfsError::Entry {
        path: path.to_path_buf(),
        entry: entry.to_string(),
        why,
    };
    let invalid = |why: String| RootfsError::Invalid {
        path: path.to_path_buf(),
        why,
    };
    // Hashes what passes, and refuses a metadata entry the tar crate
    // would read whole into memory before it is read.
    let mut hashing = hull_oci::TarGuard::new(BufReader::new(f).take(MAX_TARBALL));
    let mut seen: HashSet<String> = HashSet::new();
    let mut files: HashSet<String> = HashSet::new();
    let mut bytes = 0u64;
    let mut dropped = 0usize;
    let mut cleared = 0usize;
    // Every symbolic link's path (nothing may lie under one).
    let mut links: HashSet<String> = HashSet::new();
    // Links at the top of the tree (`bin -> usr/bin`), to find /bin/sh.
    let mut top_links: std::collections::HashMap<String, String> = Default::default();
    {
        let mut archive = tar::Archive::new(&mut hashing);
        for entry in archive.entries().map_err(io_err("read"))? {
            let mut entry = entry.map_err(io_err("read an entry of"))?;
            let raw = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
            let name = normalise(&raw).map_err(|why| refuse(&raw, why))?;
            if name.is_empty() {
                // The root itself ("./"): the container's root is Incus's.
                continue;
            }
            if seen.len() >= MAX_ENTRIES {
                return Err(invalid(format!("more than {MAX_ENTRIES} entries")));
            }
            if !seen.insert(name.clone()) {
                return Err(refuse(&raw, "listed twice".into()));
            }
            // Nothing may be unpacked through a link: an unpacker that
            // follows `etc -> /` would write outside the container's root.
            if let Some(link) = ancestors(&name).find(|a| links.contains(*a)) {
                return Err(refuse(
                    &raw,
                    format!("lies under {link:?}, a symbolic link of the tarball"),
                ));
            }
            if name == AGENT_MOUNT || name.starts_with(&format!("{AGENT_MOUNT}/")) {
                return Err(refuse(
                    &raw,
                    format!("/{AGENT_MOUNT} is where the guest mounts hull's agent"),
                ));
            }
            let header = entry.header();
            let mode = header.mode().map_err(io_err("read a mode in"))?;
            // Every distribution ships set-id programs (su, passwd,
            // mount): their bits are cleared, so none raises a command's
            // privileges (as the tier-3 seccomp filter refuses to set them).
            if mode & 0o6000 != 0 {
                cleared += 1;
            }
            let uid = header.uid().map_err(io_err("read an owner in"))?;
            let gid = header.gid().map_err(io_err("read a group in"))?;
            let mtime = header.mtime().unwrap_or(0);
            let kind = header.entry_type();
            let size = entry.size();
            // A name hull writes: what lands there is hull's own, whatever
            // the tarball has (a hard link named `etc/passwd` to a file of
            // its choosing would pass every check on the link's target).
            if let Some(owned) = hull_owned(&name) {
                let refuse_kind = |what: &str| {
                    refuse(
                        &raw,
                        format!(
                            "{what} where hull writes {} (it must be a {})",
                            owned.what(),
                            owned.needs()
                        ),
                    )
                };
                let regular = matches!(kind, tar::EntryType::Regular | tar::EntryType::Continuous);
                match owned {
                    Owned::Dir(_) if kind == tar::EntryType::Directory => {}
                    Owned::Accounts(..) if regular => {}
                    Owned::Own(_)
                        if regular
                            || matches!(kind, tar::EntryType::Symlink | tar::EntryType::Link) => {}
                    _ => return Err(refuse_kind(kind_name(kind))),
                }
                if regular {
                    bytes = bytes.saturating_add(size);
                }
                let Some(out) = out.as_deref_mut() else {
                    continue;
                };
                match owned {
                    Owned::Dir(id) => {
                        let mut h = self::header(tar::EntryType::Directory, 0o755, id, 0);
                        out.append_data(&mut h, &name, io::empty())
                    }
                    Owned::Accounts(line, id_field) => {
                        let mut text = String::new();
                        (&mut entry)
                            .take(MAX_ACCOUNTS_FILE)
                            .read_to_string(&mut text)
                            .map_err(|e| refuse(&raw, format!("not readable text: {e}")))?;
                        let body = with_hull_account(&text, line, id_field);
                        let mut h =
                            self::header(tar::EntryType::Regular, 0o644, 0, body.len() as u64);
                        out.append_data(&mut h, &name, body.as_bytes())
                    }
                    Owned::Own(body) => {
                        let mut h =
                            self::header(tar::EntryType::Regular, 0o644, 0, body.len() as u64);
                        out.append_data(&mut h, &name, body.as_bytes())
                    }
                }
                .map_err(io_err("write an entry of"))?;
                continue;
            }
            let mut h = tar::Header::new_gnu();
            h.set_mode(mode & 0o777);
            h.set_uid(uid);
            h.set_gid(gid);
            h.set_mtime(mtime);
            match kind {
                tar::EntryType::Regular | tar::EntryType::Continuous => {
                    bytes = bytes.saturating_add(size);
                    if bytes > MAX_UNPACKED {
                        return Err(invalid(format!(
                            "more than {} GiB of file contents",
                            MAX_UNPACKED >> 30
                        )));
                    }
                    files.insert(name.clone());
                    let Some(out) = out.as_deref_mut() else {
                        continue;
                    };
                    h.set_entry_type(tar::EntryType::Regular);
                    h.set_size(size);
                    out.append_data(&mut h, &name, &mut entry)
                        .map_err(io_err("copy an entry of"))?;
                }
                tar::EntryType::Directory => {
                    if let Some(out) = out.as_deref_mut() {
                        h.set_entry_type(tar::EntryType::Directory);
                        h.set_size(0);
                        out.append_data(&mut h, &name, io::empty())
                            .map_err(io_err("write an entry of"))?;
                    }
                }
                tar::EntryType::Symlink => {
                    let target = entry
                        .link_name_bytes()
                        .map(|t| String::from_utf8_lossy(&t).into_owned())
                        .unwrap_or_default();
                    check_symlink(&name, &target).map_err(|why| refuse(&raw, why))?;
                    links.insert(name.clone());
                    if !name.contains('/') {
                        top_links.insert(name.clone(), target.clone());
                    }
                    if let Some(out) = out.as_deref_mut() {
                        h.set_entry_type(tar::EntryType::Symlink);
                        h.set_size(0);
                        out.append_link(&mut h, &name, &target)
                            .map_err(io_err("write an entry of"))?;
                    }
                }
                tar::EntryType::Link => {
                    let target = entry
                        .link_name_bytes()
                        .map(|t| String::from_utf8_lossy(&t).into_owned())
                        .unwrap_or_default();
                    let target = normalise(&target)
                        .map_err(|why| refuse(&raw, format!("a hard link whose target {why}")))?;
                    if !files.contains(&target) {
                        return Err(refuse(
                            &raw,
                            format!(
                                "a hard link to {target:?}, which is not an earlier regular file of the tarball"
                            ),
                        ));
                    }
                    files.insert(name.clone());
                    if let Some(out) = out.as_deref_mut() {
                        h.set_entry_type(tar::EntryType::Link);
                        h.set_size(0);
                        out.append_link(&mut h, &name, &target)
                            .map_err(io_err("write an entry of"))?;
                    }
                }
                // Exports of container images and debootstraps carry
                // /dev/null and friends; the container's /dev is made by
                // LXC, so those are left out. Anywhere else: refused.
                tar::EntryType::Char | tar::EntryType::Block if name.starts_with("dev/") => {
                    dropped += 1;
                }
                tar::EntryType::Char | tar::EntryType::Block => {
                    return Err(refuse(&raw, "a device node outside /dev".into()))
                }
                tar::EntryType::Fifo => return Err(refuse(&raw, "a fifo".into())),
                other => {
                    return Err(refuse(
                        &raw,
                        format!("an entry of type {other:?}, which a rootfs does not need"),
                    ))
                }
            }
        }
    }
    // The rest of the file (tar padding) counts in the digest too.
    io::copy(&mut hashing, &mut io::sink()).map_err(io_err("read"))?;
    // /bin may be a link to usr/bin (merged /usr).
    let bin = match top_links.get("bin").map(|t| t.trim_matches('/')) {
        Some("usr/bin") => "usr/bin/sh",
        _ => "bin/sh",
    };
    if !seen.contains(bin) {
        return Err(invalid(
            "no /bin/sh (the container's commands and checks run through it)".into(),
        ));
    }
    if let Some(out) = out {
        add_missing(out, &seen).map_err(io_err("write an entry of"))?;
    }
    let sha256 = hashing.sha256();
    Ok(Checked {
        sha256,
        entries: seen.len(),
        bytes,
        dropped,
        cleared,
    })
}

/// A name whose contents hull writes, whatever the tarball has there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owned {
    /// An accounts file: its `hull` line, and which field holds the id.
    Accounts(&'static str, usize),
    /// A file whose contents are the container's own.
    Own(&'static str),
    /// A directory hull needs, owned by this id.
    Dir(u64),
}

impl Owned {
    fn what(self) -> &'static str {
        match self {
            Owned::Accounts(..) => "the container's accounts",
            Owned::Own(_) => "the container's own file",
            Owned::Dir(_) => "a directory of the container",
        }
    }
    fn needs(self) -> &'static str {
        match self {
            Owned::Accounts(..) => "regular file, which hull rewrites",
            Owned::Own(_) => "file, which hull replaces",
            Owned::Dir(_) => "directory",
        }
    }
}

const PASSWD_LINE: &str = "hull:x:1000:1000:hull:/home/hull:/bin/sh";
const GROUP_LINE: &str = "hull:x:1000:";

fn hull_owned(name: &str) -> Option<Owned> {
    Some(match name {
        "etc/passwd" => Owned::Accounts(PASSWD_LINE, 2),
        "etc/group" => Owned::Accounts(GROUP_LINE, 2),
        "etc/resolv.conf" => Owned::Own(""),
        "etc/hostname" => Owned::Own("hull-ct\n"),
        "etc" | "opt" | "home" => Owned::Dir(0),
        "home/hull" => Owned::Dir(1000),
        _ => return None,
    })
}

fn kind_name(kind: tar::EntryType) -> &'static str {
    match kind {
        tar::EntryType::Regular | tar::EntryType::Continuous => "a regular file",
        tar::EntryType::Directory => "a directory",
        tar::EntryType::Symlink => "a symbolic link",
        tar::EntryType::Link => "a hard link",
        tar::EntryType::Char | tar::EntryType::Block => "a device node",
        tar::EntryType::Fifo => "a fifo",
        _ => "an entry of another type",
    }
}

/// `text` with only the lines that cannot be read as `hull` or id 1000,
/// then `line`. Lines are judged as glibc's `nss_files` reads them (leading
/// blanks skipped, ids through `strtoul`: `01000`, `+1000`, ` 1000` and
/// wrapped negatives are 1000): a line glibc would read is kept only when
/// its name is not `hull`, not a NIS `+`/`-` entry, and its id is plain
/// decimal other than 1000. Blank lines and comments stay; anything else
/// is dropped.
fn with_hull_account(text: &str, line: &str, id_field: usize) -> String {
    let mut out = String::with_capacity(text.len() + line.len() + 1);
    for l in text.lines() {
        let body = l.trim_start_matches(|c: char| c.is_ascii_whitespace() || c == '\x0b');
        let ignored = body.is_empty() || body.starts_with('#');
        let kept = (ignored && !l.contains('\0')) || plain_account(l, id_field);
        if !kept {
            continue;
        }
        out.push_str(l);
        out.push('\n');
    }
    out.push_str(line);
    out.push('\n');
    out
}

/// A line in the form hull keeps: no NUL, a name of letters, digits, `_`,
/// `.`, `-` and `$` starting with a letter, digit or `_` (so no blank
/// glibc would skip, vertical tabs included, and no NIS `+`/`-` entry),
/// not `hull`, the id plain decimal and not 1000.
fn plain_account(l: &str, id_field: usize) -> bool {
    let fields: Vec<&str> = l.split(':').collect();
    let (Some(name), Some(id)) = (fields.first(), fields.get(id_field)) else {
        return false;
    };
    let plain_id = !id.is_empty()
        && id.bytes().all(|b| b.is_ascii_digit())
        && (*id == "0" || !id.starts_with('0'))
        && id.parse::<u32>().is_ok_and(|n| n != 1000);
    let plain_name = name.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.-$".contains(c));
    !l.contains('\0') && plain_name && *name != "hull" && plain_id
}

/// What every container of the image needs and the tarball lacks.
fn add_missing(out: &mut tar::Builder<BufWriter<File>>, seen: &HashSet<String>) -> io::Result<()> {
    let dir = |out: &mut tar::Builder<BufWriter<File>>, name: &str, id: u64| {
        let mut h = self::header(tar::EntryType::Directory, 0o755, id, 0);
        out.append_data(&mut h, name, io::empty())
    };
    let file = |out: &mut tar::Builder<BufWriter<File>>, name: &str, body: &str| {
        let mut h = header(tar::EntryType::Regular, 0o644, 0, body.len() as u64);
        out.append_data(&mut h, name, body.as_bytes())
    };
    for d in ["etc", "opt", "home"] {
        if !seen.contains(d) {
            dir(out, d, 0)?;
        }
    }
    dir(out, AGENT_MOUNT, 0)?;
    if !seen.contains("home/hull") {
        dir(out, "home/hull", 1000)?;
    }
    for (name, line) in [("etc/passwd", PASSWD_LINE), ("etc/group", GROUP_LINE)] {
        if !seen.contains(name) {
            file(out, name, &format!("{line}\n"))?;
        }
    }
    for name in ["etc/resolv.conf", "etc/hostname"] {
        if !seen.contains(name) {
            if let Some(Owned::Own(body)) = hull_owned(name) {
                file(out, name, body)?;
            }
        }
    }
    Ok(())
}

/// A header of hull's own: owner and group `id`, time 0.
fn header(kind: tar::EntryType, mode: u32, id: u64, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_uid(id);
    h.set_gid(id);
    h.set_mtime(0);
    h.set_size(size);
    h
}

/// The proper ancestors of a normalised path: `a/b/c` gives `a`, `a/b`.
fn ancestors(name: &str) -> impl Iterator<Item = &str> {
    name.match_indices('/').map(move |(i, _)| &name[..i])
}

/// A tarball path as a relative path without `.` components: `./usr/` is
/// `usr`, the root is empty. Refuses absolute paths, `..` and NUL.
fn normalise(raw: &str) -> Result<String, String> {
    if raw.starts_with('/') {
        return Err("is absolute".into());
    }
    if raw.contains('\0') {
        return Err("holds a NUL byte".into());
    }
    let mut parts = Vec::new();
    for c in raw.split('/') {
        match c {
            "" | "." => {}
            ".." => return Err("has a `..` component".into()),
            c => parts.push(c),
        }
    }
    Ok(parts.join("/"))
}

/// A symbolic link at `name` to `target`: a relative target must stay in
/// the tree when resolved from the link's directory.
fn check_symlink(name: &str, target: &str) -> Result<(), String> {
    if target.is_empty() || target.contains('\0') {
        return Err("a symbolic link with an empty or NUL target".into());
    }
    if target.starts_with('/') {
        return Ok(());
    }
    let mut depth: i64 = name.split('/').count() as i64 - 1;
    for c in target.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                depth -= 1;
                if depth < 0 {
                    return Err(format!(
                        "a symbolic link to {target:?}, which climbs above the tree's root"
                    ));
                }
            }
            _ => depth += 1,
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::image::hex;
    use sha2::{Digest, Sha256};

    /// Builds a tarball of raw entries: (path, type, mode, link target, contents).
    /// One raw entry: path, type, mode, link target, contents.
    pub(crate) type Raw = (
        &'static str,
        tar::EntryType,
        u32,
        &'static str,
        &'static [u8],
    );

    pub(crate) fn tarball(dir: &Path, entries: &[Raw]) -> PathBuf {
        let p = dir.join("rootfs.tar");
        let mut b = tar::Builder::new(File::create(&p).unwrap());
        for (path, kind, mode, link, data) in entries {
            let mut h = header(*kind, *mode, 0, data.len() as u64);
            // Raw names, so that hostile ones ("/x", "a/../b") reach the tarball.
            let name = h.as_gnu_mut().unwrap();
            name.name[..path.len()].copy_from_slice(path.as_bytes());
            if !link.is_empty() {
                name.linkname[..link.len()].copy_from_slice(link.as_bytes());
            }
            h.set_cksum();
            b.append(&h, *data).unwrap();
        }
        b.finish().unwrap();
        p
    }

    use tar::EntryType as T;

    pub(crate) fn base() -> Vec<Raw> {
        vec![
            ("./", T::Directory, 0o755, "", b""),
            ("./bin/", T::Directory, 0o755, "", b""),
            ("./bin/busybox", T::Regular, 0o755, "", b"\x7fELF"),
            ("./bin/sh", T::Symlink, 0o777, "busybox", b""),
            ("./etc/", T::Directory, 0o755, "", b""),
            (
                "./etc/passwd",
                T::Regular,
                0o644,
                "",
                b"root:x:0:0:root:/root:/bin/sh\nold:x:1000:1000::/home/old:/bin/sh\n",
            ),
            (
                "./etc/resolv.conf",
                T::Symlink,
                0o777,
                "../run/resolv.conf",
                b"",
            ),
            ("./usr/", T::Directory, 0o755, "", b""),
            ("./usr/bin/", T::Directory, 0o755, "", b""),
            ("./usr/bin/env", T::Link, 0o755, "bin/busybox", b""),
            (
                "./usr/bin/abs",
                T::Symlink,
                0o777,
                "/../../bin/busybox",
                b"",
            ),
            ("./dev/", T::Directory, 0o755, "", b""),
            ("./dev/null", T::Char, 0o666, "", b""),
            ("./usr/bin/su", T::Regular, 0o4755, "", b"su"),
            ("./usr/bin/wall", T::Regular, 0o2755, "", b"wall"),
        ]
    }

    /// A sound tarball converts: entries kept, the hull account replacing
    /// any account with id 1000, resolv.conf the container's own, the
    /// agent's mount point and the home added; the digest is the file's.
    #[test]
    fn a_sound_rootfs_converts_with_the_hull_account() {
        let d = tempfile::tempdir().unwrap();
        let p = tarball(d.path(), &base());
        let c = check(&p).unwrap();
        let want = hex(&Sha256::digest(std::fs::read(&p).unwrap()));
        assert_eq!(c.sha256, want);
        let out = d.path().join("out.tar");
        convert(&p, &c.sha256, &out).unwrap();
        let mut got = std::collections::BTreeMap::new();
        let mut a = tar::Archive::new(File::open(&out).unwrap());
        for e in a.entries().unwrap() {
            let mut e = e.unwrap();
            let name = e.path().unwrap().to_string_lossy().into_owned();
            let mut body = String::new();
            let _ = e.read_to_string(&mut body);
            let link = e
                .link_name()
                .unwrap()
                .map(|l| l.to_string_lossy().into_owned());
            let mode = e.header().mode().unwrap();
            assert_eq!(mode & 0o7000, 0, "{name}: mode {mode:o}");
            got.insert(
                name,
                (
                    e.header().entry_type(),
                    e.header().uid().unwrap(),
                    body,
                    link,
                ),
            );
        }
        assert_eq!(
            got["etc/passwd"].2,
            "root:x:0:0:root:/root:/bin/sh\nhull:x:1000:1000:hull:/home/hull:/bin/sh\n"
        );
        assert_eq!(got["etc/group"].2, "hull:x:1000:\n");
        assert_eq!(got["etc/resolv.conf"].0, T::Regular);
        assert_eq!(got["etc/resolv.conf"].2, "");
        assert_eq!(got["opt/hull"].0, T::Directory);
        assert_eq!(
            (got["home/hull"].0, got["home/hull"].1),
            (T::Directory, 1000)
        );
        assert_eq!(got["bin/sh"].3.as_deref(), Some("busybox"));
        assert_eq!(got["usr/bin/env"].3.as_deref(), Some("bin/busybox"));
        assert_eq!(got["bin/busybox"].2, "\u{7f}ELF");
        // /dev's nodes are left out, counted.
        assert_eq!(c.dropped, 1);
        // Set-id bits are cleared, the programs kept.
        assert_eq!(c.cleared, 2);
        assert_eq!(got["usr/bin/su"].2, "su");
        assert!(!got.contains_key("dev/null") && got.contains_key("dev"));
        // A tarball changed since its digest was taken is refused.
        let e = convert(&p, &"0".repeat(64), &out).unwrap_err();
        assert!(matches!(e, RootfsError::Changed { .. }), "{e}");
        assert!(!out.exists());
    }

    /// Whatever the tarball has at a name hull writes, what lands there is
    /// a regular file (or directory) hull wrote: an account file that is a
    /// hard link, a directory or a link is refused by name; a resolver
    /// file that is a hard link is replaced; hull's files are root's, 0644,
    /// and the home hull's, whatever owner and mode the tarball gave.
    #[test]
    fn what_hull_writes_is_its_own_whatever_the_tarball_has_there() {
        let without =
            |name: &str| -> Vec<Raw> { base().into_iter().filter(|e| e.0 != name).collect() };
        let planted: &'static [u8] = b"hull:x:0:0:root:/root:/bin/sh\n";
        for (extra, why) in [
            (
                vec![
                    ("./etc/planted", T::Regular, 0o644, "", planted),
                    ("./etc/passwd", T::Link, 0o644, "etc/planted", b"" as &[u8]),
                ],
                "a hard link",
            ),
            (
                vec![("./etc/group", T::Link, 0o644, "bin/busybox", b"")],
                "a hard link",
            ),
            (
                vec![("./etc/group/", T::Directory, 0o755, "", b"")],
                "a directory",
            ),
            (
                vec![("./home", T::Regular, 0o644, "", b"x")],
                "a regular file",
            ),
            (
                vec![
                    ("./home/", T::Directory, 0o755, "", b""),
                    ("./home/hull", T::Symlink, 0o777, "/root", b""),
                ],
                "a symbolic link",
            ),
        ] {
            let d = tempfile::tempdir().unwrap();
            let mut entries = without("./etc/passwd");
            entries.extend(extra);
            if !entries.iter().any(|e| e.0 == "./etc/passwd") {
                entries.push(base().into_iter().find(|e| e.0 == "./etc/passwd").unwrap());
            }
            let e = check(&tarball(d.path(), &entries)).unwrap_err().to_string();
            assert!(e.contains(why) && e.contains("hull writes"), "{why}: {e}");
        }
        // Replaced, with hull's own owner and mode.
        let d = tempfile::tempdir().unwrap();
        let mut entries = without("./etc/resolv.conf");
        entries.extend([
            (
                "./etc/resolv.conf",
                T::Link,
                0o644,
                "bin/busybox",
                b"" as &[u8],
            ),
            ("./home/", T::Directory, 0o755, "", b""),
            ("./home/hull/", T::Directory, 0o700, "", b""),
        ]);
        let p = tarball(d.path(), &entries);
        // The tarball's passwd is the hull user's own, writable by all.
        let mut raw = std::fs::read(&p).unwrap();
        let at = raw.windows(12).position(|w| w == b"./etc/passwd").unwrap();
        let mut h = tar::Header::new_old();
        h.as_mut_bytes().copy_from_slice(&raw[at..at + 512]);
        h.set_mode(0o666);
        h.set_uid(1000);
        h.set_cksum();
        raw[at..at + 512].copy_from_slice(h.as_bytes());
        std::fs::write(&p, &raw).unwrap();
        let c = check(&p).unwrap();
        let out = d.path().join("out.tar");
        convert(&p, &c.sha256, &out).unwrap();
        let mut a = tar::Archive::new(File::open(&out).unwrap());
        let mut seen = std::collections::BTreeMap::new();
        for e in a.entries().unwrap() {
            let mut e = e.unwrap();
            let name = e.path().unwrap().to_string_lossy().into_owned();
            let h = e.header();
            let got = (h.entry_type(), h.uid().unwrap(), h.mode().unwrap());
            let mut body = Vec::new();
            e.read_to_end(&mut body).unwrap();
            seen.insert(name, (got, body));
        }
        assert_eq!(
            seen["etc/resolv.conf"],
            ((T::Regular, 0, 0o644), Vec::new())
        );
        assert_eq!(seen["etc/passwd"].0, (T::Regular, 0, 0o644));
        assert_eq!(seen["home/hull"].0, (T::Directory, 1000, 0o755));
    }

    /// A fifo named as the rootfs is refused at once (it was opened
    /// before its type was checked: the open blocked until a writer came);
    /// so is a symbolic link, and what it names is not read.
    #[cfg(unix)]
    #[test]
    fn a_fifo_or_a_link_as_the_rootfs_is_refused_without_waiting() {
        let d = tempfile::tempdir().unwrap();
        let fifo = d.path().join("fifo.tar");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let real = tarball(d.path(), &base());
        let link = d.path().join("link.tar");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        // The control: the tarball itself checks.
        check(&real).unwrap();
        for (p, why) in [(fifo, "not a regular file"), (link, "a symbolic link")] {
            let (tx, rx) = std::sync::mpsc::channel();
            let q = p.clone();
            std::thread::spawn(move || {
                let _ = tx.send(check(&q).map(|_| ()).map_err(|e| e.to_string()));
            });
            let got = rx
                .recv_timeout(std::time::Duration::from_secs(10))
                .unwrap_or_else(|_| panic!("{}: still waiting after 10 s", p.display()));
            let e = got.unwrap_err();
            assert!(
                e.contains(why) && e.contains(&p.display().to_string()),
                "{e}"
            );
        }
    }

    /// Each hostile entry is refused, naming it.
    #[test]
    fn hostile_entries_are_refused_by_name() {
        let cases: Vec<(Raw, &str)> = vec![
            (("/etc/shadow", T::Regular, 0o644, "", b"x"), "is absolute"),
            (("./usr/../../x", T::Regular, 0o644, "", b"x"), "`..`"),
            (
                ("./usr/sda", T::Block, 0o600, "", b""),
                "a device node outside /dev",
            ),
            (
                ("./mem", T::Char, 0o600, "", b""),
                "a device node outside /dev",
            ),
            (("./run/fifo", T::Fifo, 0o600, "", b""), "a fifo"),
            (
                ("./usr/bin/h", T::Link, 0o644, "/etc/shadow", b""),
                "is absolute",
            ),
            (
                ("./usr/bin/h", T::Link, 0o644, "usr/none", b""),
                "not an earlier regular file",
            ),
            (
                ("./usr/bin/h", T::Link, 0o644, "etc/passwd", b""),
                "not an earlier regular file",
            ),
            (
                ("./usr/bin/up", T::Symlink, 0o777, "../../../etc", b""),
                "climbs above",
            ),
            (
                ("./bin/busybox", T::Regular, 0o755, "", b"x"),
                "listed twice",
            ),
            (
                ("./opt/hull/hull-agent", T::Regular, 0o755, "", b"x"),
                "hull's agent",
            ),
            // Nothing under a link of the tarball is unpacked.
            (
                ("./usr/bin/abs/x", T::Regular, 0o644, "", b"x"),
                "a symbolic link of the tarball",
            ),
            (("./opt", T::Symlink, 0o777, "/", b""), "where hull writes"),
            (
                ("./etc/group", T::Symlink, 0o777, "/etc/passwd", b""),
                "where hull writes",
            ),
        ];
        for (bad, why) in cases {
            let d = tempfile::tempdir().unwrap();
            let mut entries = base();
            entries.push(bad);
            let p = tarball(d.path(), &entries);
            let e = check(&p).unwrap_err();
            let msg = e.to_string();
            assert!(msg.contains(why) && msg.contains(bad.0), "{}: {msg}", bad.0);
        }
        // Metadata the tar crate would read whole into memory is refused
        // by its size first; a PAX size record is refused too.
        let long_name: &'static [u8] = vec![b'a'; 1 << 20].leak();
        for (meta, why) in [
            (
                ("././@LongLink", T::GNULongName, 0o644, "", long_name),
                "metadata entry",
            ),
            (
                ("pax", T::XHeader, 0o644, "", &b"20 size=99999999999\n"[..]),
                "sets an entry's size",
            ),
        ] {
            let d = tempfile::tempdir().unwrap();
            let mut entries = base();
            entries.push(meta);
            entries.push(("./last", T::Regular, 0o644, "", b"x"));
            let e = check(&tarball(d.path(), &entries)).unwrap_err().to_string();
            assert!(e.contains(why), "{e}");
        }
        // No shell: refused as a whole.
        let d = tempfile::tempdir().unwrap();
        let p = tarball(d.path(), &[("./etc/", T::Directory, 0o755, "", b"")]);
        assert!(check(&p).unwrap_err().to_string().contains("no /bin/sh"));
        // Not a tarball at all.
        std::fs::write(d.path().join("junk"), vec![7u8; 4096]).unwrap();
        assert!(check(&d.path().join("junk")).is_err());
    }
}

/// The accounts hull writes, read back by the C library the container's
/// programs use: hostile lines (indented, zero-padded, signed, wrapped
/// ids) must not give another account the name `hull` or its id.
#[cfg(test)]
#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod glibc_tests {
    use super::tests::{base, tarball, Raw};
    use super::*;
    use tar::EntryType as T;

    /// (name, id) of every entry glibc's own parser reads from `path`
    /// (`fgetpwent_r`/`fgetgrent_r`: the line parser of `nss_files`).
    fn glibc_entries(path: &Path, group: bool) -> Vec<(String, u32)> {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path and mode; the stream is
        // closed below and used by this thread only.
        let f = unsafe { libc::fopen(c.as_ptr(), c"r".as_ptr()) };
        assert!(!f.is_null(), "fopen {}", path.display());
        let mut out = Vec::new();
        let mut buf = vec![0 as libc::c_char; 1 << 16];
        loop {
            // SAFETY: the records and the buffer outlive each call; a
            // result pointer, when set, points into them.
            let (rc, name, id) = unsafe {
                if group {
                    let mut g: libc::group = std::mem::zeroed();
                    let mut r: *mut libc::group = std::ptr::null_mut();
                    let rc = libc::fgetgrent_r(f, &mut g, buf.as_mut_ptr(), buf.len(), &mut r);
                    if rc != 0 || r.is_null() {
                        (rc, String::new(), 0)
                    } else {
                        let n = std::ffi::CStr::from_ptr(g.gr_name).to_string_lossy();
                        (0, n.into_owned(), g.gr_gid)
                    }
                } else {
                    let mut p: libc::passwd = std::mem::zeroed();
                    let mut r: *mut libc::passwd = std::ptr::null_mut();
                    let rc = libc::fgetpwent_r(f, &mut p, buf.as_mut_ptr(), buf.len(), &mut r);
                    if rc != 0 || r.is_null() {
                        (rc, String::new(), 0)
                    } else {
                        let n = std::ffi::CStr::from_ptr(p.pw_name).to_string_lossy();
                        (0, n.into_owned(), p.pw_uid)
                    }
                }
            };
            if rc != 0 {
                break;
            }
            out.push((name, id));
        }
        // SAFETY: the stream fopen returned, closed once.
        unsafe { libc::fclose(f) };
        out
    }

    const HOSTILE: &[u8] = b"root:x:0:0:root:/root:/bin/sh\n \
hull:x:0:0:a:/root:/bin/sh\n\
\thull:x:0:0:b:/root:/bin/sh\n\
zero:x:01000:0::/:/bin/sh\n\
plus:x:+1000:0::/:/bin/sh\n\
space:x: 1000:0::/:/bin/sh\n\
neg:x:-18446744073709550616:0::/:/bin/sh\n\
\x0bhull:x:0:0:vt:/root:/bin/sh\n\
#hull:x:0:0:comment:/:/bin/sh\n\
daemon:x:1:1::/:/bin/sh\n";

    /// The converted `etc/passwd` and `etc/group` of a tarball whose own
    /// hold `hostile`, as glibc reads them.
    type Accounts = Vec<(String, u32)>;

    fn converted(hostile: &'static [u8]) -> (Accounts, Accounts) {
        let d = tempfile::tempdir().unwrap();
        let mut entries: Vec<Raw> = base()
            .into_iter()
            .filter(|e| e.0 != "./etc/passwd")
            .collect();
        entries.push(("./etc/passwd", T::Regular, 0o644, "", hostile));
        entries.push(("./etc/group", T::Regular, 0o644, "", hostile));
        let p = tarball(d.path(), &entries);
        let c = check(&p).unwrap();
        let out = d.path().join("out.tar");
        convert(&p, &c.sha256, &out).unwrap();
        let mut a = tar::Archive::new(File::open(&out).unwrap());
        let x = d.path().join("x");
        std::fs::create_dir(&x).unwrap();
        for e in a.entries().unwrap() {
            let mut e = e.unwrap();
            let name = e.path().unwrap().to_string_lossy().into_owned();
            if name == "etc/passwd" || name == "etc/group" {
                let mut body = Vec::new();
                e.read_to_end(&mut body).unwrap();
                std::fs::write(x.join(&name[4..]), body).unwrap();
            }
        }
        (
            glibc_entries(&x.join("passwd"), false),
            glibc_entries(&x.join("group"), true),
        )
    }

    #[test]
    fn no_account_but_hull_s_own_is_hull_or_has_its_id_as_glibc_reads_them() {
        let (passwd, group) = converted(HOSTILE);
        for (what, entries) in [("passwd", &passwd), ("group", &group)] {
            // The control: glibc reads lines of the kind kept.
            assert!(
                entries.iter().any(|e| e == &("root".to_string(), 0)),
                "{what}: {entries:?}"
            );
            let hull: Vec<_> = entries
                .iter()
                .filter(|(n, id)| n == "hull" || *id == 1000)
                .collect();
            assert_eq!(
                hull,
                vec![&("hull".to_string(), 1000)],
                "{what}: glibc reads {entries:?}"
            );
        }
    }
}
