//! What a host program needs of the guest's C library, read from its ELF
//! headers: the loader it names (`PT_INTERP`) and the newest `GLIBC_x.y`
//! symbol version it requires (`DT_VERNEED`).
//!
//! Tier 3 runs the host's toolchains that a policy grants (`~/.cargo/bin`,
//! a JDK, an nvm tree) inside a Debian container, whose glibc is the
//! image's. A program linked against a newer glibc than that, or against
//! another C library (musl's loader), would fail inside the container with
//! the loader's own message after the VM started; hull checks the command's
//! program before it starts anything and says why it cannot run.
//!
//! The file is untrusted input (it lies in the project or a grant): every
//! read is bounded, offsets are checked against the file's size, and a file
//! that is not a well-formed 64-bit little-endian ELF is simply not judged.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// The image's glibc: Debian bookworm (`images/build.sh`, `SUITE=bookworm`)
/// ships 2.36. Checked against the guest by the tier-3 tests.
pub const GUEST_GLIBC: (u32, u32) = (2, 36);

/// The loaders the image has.
pub const GUEST_LOADERS: &[&str] = &["/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-aarch64.so.1"];

/// Bounds on what is read of a program.
const MAX_PHDRS: usize = 256;
const MAX_DYNAMIC: u64 = 64 * 1024;
const MAX_STRTAB: u64 = 4 * 1024 * 1024;
const MAX_VERNEED: usize = 4096;

/// What a program needs (None fields: nothing found).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Needs {
    pub interp: Option<String>,
    pub glibc: Option<(u32, u32)>,
}

#[derive(Debug, thiserror::Error)]
pub enum LibcError {
    #[error(
        "tier vm: {program} needs glibc {}.{} (it asks for GLIBC_{}.{}), and the guest image \
         (Debian bookworm) has glibc {}.{}: it cannot run in the container. Use a build of it \
         for an older glibc (rustup's toolchains and most release binaries are), or run it \
         with --tier bwrap or --tier landlock",
        .needs.0, .needs.1, .needs.0, .needs.1, GUEST_GLIBC.0, GUEST_GLIBC.1
    )]
    NewerGlibc { program: PathBuf, needs: (u32, u32) },
    #[error(
        "tier vm: {program} is linked for the loader {interp}, which the guest image (Debian \
         bookworm, glibc) does not have: it cannot run in the container. Use a glibc build of \
         it, or run it with --tier bwrap or --tier landlock"
    )]
    ForeignLoader { program: PathBuf, interp: String },
}

/// Checks the program the command runs first, as the container would find
/// it (`argv[0]` through the command's `PATH`, relative names from `cwd`):
/// when it is a host file outside the system directories (which the image
/// has of its own), it must fit the image's C library.
pub fn check(
    argv0: &std::ffi::OsStr,
    path_var: Option<&str>,
    cwd: &Path,
    is_system: impl Fn(&Path) -> bool,
) -> Result<(), LibcError> {
    let Some(program) = resolve(argv0, path_var, cwd, &is_system) else {
        return Ok(());
    };
    let Ok(Some(needs)) = read(&program) else {
        return Ok(());
    };
    if let Some(interp) = needs.interp {
        if !GUEST_LOADERS.contains(&interp.as_str()) {
            return Err(LibcError::ForeignLoader { program, interp });
        }
    }
    match needs.glibc {
        Some(v) if v > GUEST_GLIBC => Err(LibcError::NewerGlibc { program, needs: v }),
        _ => Ok(()),
    }
}

/// The host file the container would execute for `argv0`, when it is not
/// the image's own.
fn resolve(
    argv0: &std::ffi::OsStr,
    path_var: Option<&str>,
    cwd: &Path,
    is_system: &impl Fn(&Path) -> bool,
) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    if argv0.as_bytes().contains(&b'/') {
        // Components drop the `.` of `./tool`.
        let p: PathBuf = cwd.join(argv0).components().collect();
        return (!is_system(&p) && p.is_file()).then_some(p);
    }
    for dir in path_var
        .unwrap_or("/usr/local/bin:/usr/bin:/bin")
        .split(':')
    {
        if dir.is_empty() {
            continue;
        }
        let dir = cwd.join(dir);
        let p = dir.join(argv0);
        if !p.is_file() {
            continue;
        }
        // The image's own, if it has one: not judged.
        return (!is_system(&dir)).then_some(p);
    }
    None
}

/// Reads what `path` needs; None when it is not a 64-bit little-endian ELF
/// (a script, another format) or its headers are not well formed.
pub fn read(path: &Path) -> std::io::Result<Option<Needs>> {
    use std::os::unix::fs::OpenOptionsExt;
    // Non-blocking: a FIFO swapped in does not hang hull.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    let meta = f.metadata()?;
    if !meta.is_file() {
        return Ok(None);
    }
    Ok(Elf {
        f: &f,
        size: meta.len(),
    }
    .needs())
}

struct Elf<'a> {
    f: &'a std::fs::File,
    size: u64,
}

struct Load {
    vaddr: u64,
    offset: u64,
    filesz: u64,
}

impl Elf<'_> {
    fn bytes(&self, offset: u64, len: u64) -> Option<Vec<u8>> {
        let end = offset.checked_add(len)?;
        if end > self.size {
            return None;
        }
        let mut buf = vec![0u8; usize::try_from(len).ok()?];
        self.f.read_exact_at(&mut buf, offset).ok()?;
        Some(buf)
    }

    fn needs(&self) -> Option<Needs> {
        let h = self.bytes(0, 64)?;
        if &h[..4] != b"\x7fELF" || h[4] != 2 || h[5] != 1 {
            return None; // not ELF64, or not little-endian
        }
        let phoff = u64le(&h, 32)?;
        let phentsize = u64::from(u16le(&h, 54)?);
        let phnum = usize::from(u16le(&h, 56)?);
        if phentsize < 56 || phnum > MAX_PHDRS {
            return None;
        }
        let mut interp = None;
        let mut dynamic = None;
        let mut loads = Vec::new();
        for i in 0..phnum as u64 {
            let ph = self.bytes(phoff.checked_add(i.checked_mul(phentsize)?)?, 56)?;
            let (kind, offset, vaddr, filesz) = (
                u32le(&ph, 0)?,
                u64le(&ph, 8)?,
                u64le(&ph, 16)?,
                u64le(&ph, 32)?,
            );
            match kind {
                1 => loads.push(Load {
                    vaddr,
                    offset,
                    filesz,
                }),
                2 => dynamic = Some((offset, filesz.min(MAX_DYNAMIC))),
                3 if filesz <= 4096 => {
                    let b = self.bytes(offset, filesz)?;
                    let end = b.iter().position(|c| *c == 0).unwrap_or(b.len());
                    interp = Some(String::from_utf8_lossy(&b[..end]).into_owned());
                }
                _ => {}
            }
        }
        let glibc = dynamic.and_then(|(off, len)| self.glibc(off, len, &loads));
        Some(Needs { interp, glibc })
    }

    /// The newest `GLIBC_x.y` the dynamic section's version needs name.
    fn glibc(&self, off: u64, len: u64, loads: &[Load]) -> Option<(u32, u32)> {
        let d = self.bytes(off, len)?;
        let (mut strtab, mut strsz, mut verneed, mut verneednum) = (None, None, None, None);
        for e in d.chunks_exact(16) {
            let (tag, val) = (u64le(e, 0)?, u64le(e, 8)?);
            match tag {
                0 => break,
                5 => strtab = Some(val),
                10 => strsz = Some(val),
                0x6fff_fffe => verneed = Some(val),
                0x6fff_ffff => verneednum = Some(val),
                _ => {}
            }
        }
        let to_offset = |vaddr: u64| {
            loads
                .iter()
                .find(|l| vaddr >= l.vaddr && vaddr - l.vaddr < l.filesz)
                .map(|l| l.offset + (vaddr - l.vaddr))
        };
        let strs = self.bytes(to_offset(strtab?)?, strsz?.min(MAX_STRTAB))?;
        let name = |at: u32| -> Option<&[u8]> {
            let rest = strs.get(at as usize..)?;
            let end = rest.iter().position(|c| *c == 0)?;
            Some(&rest[..end])
        };
        let mut newest: Option<(u32, u32)> = None;
        let mut at = to_offset(verneed?)?;
        let mut seen = 0usize;
        for _ in 0..verneednum?.min(MAX_VERNEED as u64) {
            let vn = self.bytes(at, 16)?;
            let (cnt, aux, next) = (u16le(&vn, 2)?, u32le(&vn, 8)?, u32le(&vn, 12)?);
            let mut a = at.checked_add(u64::from(aux))?;
            for _ in 0..cnt {
                seen += 1;
                if seen > MAX_VERNEED {
                    return newest;
                }
                let vna = self.bytes(a, 16)?;
                if let Some(v) = name(u32le(&vna, 8)?).and_then(glibc_version) {
                    newest = newest.max(Some(v));
                }
                let n = u32le(&vna, 12)?;
                if n == 0 {
                    break;
                }
                a = a.checked_add(u64::from(n))?;
            }
            if next == 0 {
                break;
            }
            at = at.checked_add(u64::from(next))?;
        }
        newest
    }
}

/// `GLIBC_2.34` → (2, 34); `GLIBC_2.2.5` → (2, 2); others None.
fn glibc_version(name: &[u8]) -> Option<(u32, u32)> {
    let v = std::str::from_utf8(name.strip_prefix(b"GLIBC_")?).ok()?;
    let mut parts = v.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

fn u16le(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32le(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64le(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A copy of the host's `true` whose newest GLIBC need is renamed to
    /// `GLIBC_2.99` (same length, so the ELF stays well formed).
    fn patched_true(dir: &Path) -> PathBuf {
        let mut b = std::fs::read("/bin/true").unwrap();
        let (v, _) = newest_token(&b);
        let at = b.windows(v.len()).position(|w| w == v.as_bytes()).unwrap();
        b[at..at + v.len()].copy_from_slice(b"GLIBC_2.99");
        let p = dir.join("tool");
        std::fs::write(&p, b).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    /// The newest `GLIBC_2.NN` string in `b` (two-digit minors only).
    fn newest_token(b: &[u8]) -> (String, (u32, u32)) {
        b.windows(10)
            .filter_map(|w| {
                let s = std::str::from_utf8(w).ok()?;
                let v = glibc_version(s.as_bytes())?;
                (s.len() == 10 && v.1 >= 10).then(|| (s.to_string(), v))
            })
            .max_by_key(|(_, v)| *v)
            .unwrap()
    }

    #[test]
    fn the_hosts_true_needs_this_hosts_glibc_at_most() {
        let n = read(Path::new("/bin/true")).unwrap().unwrap();
        assert!(
            GUEST_LOADERS.contains(&n.interp.as_deref().unwrap()),
            "{n:?}"
        );
        let b = std::fs::read("/bin/true").unwrap();
        assert_eq!(n.glibc, Some(newest_token(&b).1), "{n:?}");
    }

    #[test]
    fn a_newer_glibc_and_a_foreign_loader_are_refused_by_name() {
        let d = tempfile::tempdir().unwrap();
        let tool = patched_true(d.path());
        let n = read(&tool).unwrap().unwrap();
        assert_eq!(n.glibc, Some((2, 99)));
        let sys = |p: &Path| p.starts_with("/usr") || p.starts_with("/bin");
        let e = check("./tool".as_ref(), None, d.path(), sys).unwrap_err();
        let text = e.to_string();
        let program = tool.display().to_string();
        for want in [program.as_str(), "GLIBC_2.99", "2.36", "--tier bwrap"] {
            assert!(text.contains(want), "{want}: {text}");
        }
        // Found through PATH the same way; the system's own is not judged.
        let path = format!("/usr/bin:{}", d.path().display());
        assert!(check("tool".as_ref(), Some(&path), Path::new("/"), sys).is_err());
        assert!(check("true".as_ref(), Some(&path), Path::new("/"), sys).is_ok());
        // Not an ELF (a script), or a truncated one: not judged.
        std::fs::write(d.path().join("script"), "#!/bin/sh\n").unwrap();
        assert!(check("./script".as_ref(), None, d.path(), sys).is_ok());
        let b = std::fs::read(&tool).unwrap();
        std::fs::write(d.path().join("cut"), &b[..200]).unwrap();
        assert_eq!(read(&d.path().join("cut")).unwrap(), None);
        // A FIFO does not hang the check.
        let fifo = d.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path we own.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        assert_eq!(read(&fifo).unwrap(), None);
        assert!(check("./fifo".as_ref(), None, d.path(), sys).is_ok());
        // A loader the image does not have.
        let mut b = std::fs::read("/bin/true").unwrap();
        let l = b"/lib64/ld-linux-x86-64.so.2";
        if let Some(at) = b.windows(l.len()).position(|w| w == l) {
            b[at..at + l.len()].copy_from_slice(b"/lib/ld-musl-x86_64.so.1\0\0\0");
            std::fs::write(d.path().join("musl"), b).unwrap();
            let e = check("./musl".as_ref(), None, d.path(), sys).unwrap_err();
            assert!(e.to_string().contains("ld-musl"), "{e}");
        }
    }

    #[test]
    fn version_names() {
        assert_eq!(glibc_version(b"GLIBC_2.34"), Some((2, 34)));
        assert_eq!(glibc_version(b"GLIBC_2.2.5"), Some((2, 2)));
        assert_eq!(glibc_version(b"GLIBC_PRIVATE"), None);
        assert_eq!(glibc_version(b"GCC_3.0"), None);
    }
}
