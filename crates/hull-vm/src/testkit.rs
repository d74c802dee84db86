#![cfg(target_os = "linux")]
//! Helpers for the tier-3 tests that boot real VMs.
//!
//! The tests need QEMU, virtiofsd, a guest kernel (the built image's
//! `vmlinux`, or `HULL_VM_KERNEL`) and a static busybox. They are built
//! with the `tier3` feature only, which declares that this machine has
//! them: a missing piece is then a failure with the reason.

use std::path::{Path, PathBuf};

const HOW: &str =
    "or build the tests without the `tier3` feature to declare that this machine lacks tier 3";

/// The guest kernel to boot.
pub fn kernel() -> PathBuf {
    match crate::accel::default_probe_kernel() {
        Some(k) if k.is_file() => k,
        Some(k) => panic!(
            "guest kernel {} does not exist; build the image (hull image build) or point HULL_VM_KERNEL at a vmlinux; {HOW}",
            k.display()
        ),
        None => panic!(
            "no guest kernel: build the image (hull image build) or point HULL_VM_KERNEL at a vmlinux (for example the 6.12 cloud kernel's); {HOW}"
        ),
    }
}

/// The tools, or a failure naming what is missing.
#[cfg(target_os = "linux")]
pub fn tools() -> crate::machine::Tools {
    let t = crate::machine::Tools::find().unwrap_or_else(|e| panic!("{e}; {HOW}"));
    if t.virtiofsd.is_none() {
        panic!("virtiofsd not found (PATH, /usr/libexec, ~/.cargo/bin); scripts/setup.sh --tier3 installs it; {HOW}");
    }
    t
}

/// A static busybox (Debian: busybox-static).
pub fn busybox() -> PathBuf {
    for p in ["/bin/busybox", "/usr/bin/busybox"] {
        let p = Path::new(p);
        if p.is_file() && is_static_elf(p) {
            return p.to_path_buf();
        }
    }
    panic!("no static busybox (apt-get install busybox-static; scripts/setup.sh --tier3); {HOW}");
}

/// An ELF without a PT_INTERP program header runs without a dynamic loader.
fn is_static_elf(p: &Path) -> bool {
    let Ok(b) = std::fs::read(p) else {
        return false;
    };
    if b.len() < 64 || &b[..4] != b"\x7fELF" || b[4] != 2 {
        return false;
    }
    let u16at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]) as usize;
    let u64at = |o: usize| {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[o..o + 8]);
        u64::from_le_bytes(a) as usize
    };
    let (phoff, phentsize, phnum) = (u64at(32), u16at(54), u16at(56));
    (0..phnum).all(|i| {
        let o = phoff + i * phentsize;
        o + 4 <= b.len() && u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]) != 3
    })
}

/// One entry of a newc cpio archive.
pub enum Entry<'a> {
    Dir(&'a str),
    File(&'a str, u32, Vec<u8>),
}

/// Writes a newc ("070701") cpio archive, as the kernel unpacks an initramfs.
pub fn newc(entries: &[Entry<'_>]) -> Vec<u8> {
    fn header(out: &mut Vec<u8>, ino: u32, mode: u32, size: usize, name: &str) {
        let fields = [
            ino,
            mode,
            0,
            0,
            1,
            0,
            size as u32,
            0,
            0,
            0,
            0,
            name.len() as u32 + 1,
            0,
        ];
        out.extend_from_slice(b"070701");
        for f in fields {
            out.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        out.extend_from_slice(name.as_bytes());
        out.push(0);
        while !out.len().is_multiple_of(4) {
            out.push(0);
        }
    }
    let mut out = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        let ino = i as u32 + 1;
        match e {
            Entry::Dir(name) => header(&mut out, ino, 0o040755, 0, name),
            Entry::File(name, mode, data) => {
                header(&mut out, ino, 0o100000 | mode, data.len(), name);
                out.extend_from_slice(data);
                while !out.len().is_multiple_of(4) {
                    out.push(0);
                }
            }
        }
    }
    header(&mut out, 0, 0, 0, "TRAILER!!!");
    out
}

/// Console markers the init wrapper prints.
pub const BOOTED: &str = "HULLTEST-BOOTED";
pub const END: &str = "HULLTEST-END";

/// Builds a busybox initramfs in `dir` whose init mounts proc, sys, dev,
/// runs `script` (sh), prints [`END`] and powers the VM off. `extra` files
/// are added as `(path, mode, bytes)`.
pub fn busybox_initramfs(dir: &Path, script: &str, extra: Vec<(String, u32, Vec<u8>)>) -> PathBuf {
    let bb = std::fs::read(busybox()).unwrap();
    let init = format!(
        "#!/bin/busybox sh\n\
         /bin/busybox --install -s /bin\n\
         export PATH=/bin\n\
         mount -t proc proc /proc\n\
         mount -t sysfs sys /sys\n\
         mount -t devtmpfs dev /dev\n\
         echo {BOOTED}\n\
         {script}\n\
         echo {END}\n\
         sync\n\
         echo o > /proc/sysrq-trigger\n\
         sleep 30\n"
    );
    let mut entries = vec![
        Entry::Dir("bin"),
        Entry::Dir("dev"),
        Entry::Dir("proc"),
        Entry::Dir("sys"),
        Entry::Dir("tmp"),
        Entry::Dir("mnt"),
        Entry::Dir("opt"),
        Entry::File("bin/busybox", 0o755, bb),
        Entry::File("init", 0o755, init.into_bytes()),
    ];
    // Parent dirs of the extra files first, each once.
    let mut dirs: Vec<String> = Vec::new();
    for (name, _, _) in &extra {
        let mut p = Path::new(name).parent();
        let mut chain = Vec::new();
        while let Some(d) = p.filter(|d| !d.as_os_str().is_empty()) {
            chain.push(d.to_string_lossy().into_owned());
            p = d.parent();
        }
        for d in chain.into_iter().rev() {
            if !dirs.contains(&d)
                && !["bin", "dev", "proc", "sys", "tmp", "mnt", "opt"].contains(&d.as_str())
            {
                dirs.push(d);
            }
        }
    }
    entries.extend(dirs.iter().map(|d| Entry::Dir(d)));
    entries.extend(extra.iter().map(|(n, m, d)| Entry::File(n, *m, d.clone())));
    let path = dir.join("initramfs.cpio");
    std::fs::write(&path, newc(&entries)).unwrap();
    path
}

/// The lines of the console log between [`BOOTED`] and [`END`].
pub fn script_output(console: &Path) -> String {
    let log = std::fs::read_to_string(console).unwrap_or_default();
    let Some(start) = log.find(BOOTED) else {
        panic!(
            "the guest never ran the test script; console log {}:\n{log}",
            console.display()
        );
    };
    let rest = &log[start + BOOTED.len()..];
    let Some(end) = rest.find(END) else {
        panic!(
            "the test script did not finish; console log {}:\n{log}",
            console.display()
        );
    };
    rest[..end].replace('\r', "")
}

/// The guest agent binary (`HULL_AGENT`, else the workspace's static
/// `target/x86_64-unknown-linux-musl/debug/hull-agent`), checked to be the
/// real agent.
pub fn agent_binary() -> PathBuf {
    let p = std::env::var_os("HULL_AGENT")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../target")
                .join(crate::image::STATIC_AGENT_TARGET)
                .join("debug/hull-agent")
        });
    let help = std::process::Command::new(&p)
        .arg("--help")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    if !help.contains("serve") {
        panic!(
            "{} is not the guest agent (build it: cargo build -p hull-agent --target x86_64-unknown-linux-musl, or set HULL_AGENT); {HOW}",
            p.display()
        );
    }
    p
}

/// `binary` and the shared libraries `ldd` lists for it, as initramfs
/// entries at the same paths (`opt/hull-agent` for the binary).
pub fn agent_files() -> Vec<(String, u32, Vec<u8>)> {
    let bin = agent_binary();
    let mut out = vec![(
        "opt/hull-agent".to_string(),
        0o755,
        std::fs::read(&bin).unwrap(),
    )];
    let ldd = std::process::Command::new("ldd")
        .arg(&bin)
        .output()
        .unwrap();
    for line in String::from_utf8_lossy(&ldd.stdout).lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)"
        let path = match line.split_once("=>") {
            Some((_, r)) => r.split_whitespace().next(),
            None => line
                .split_whitespace()
                .next()
                .filter(|p| p.starts_with('/')),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            let data = std::fs::read(p).unwrap();
            out.push((p.trim_start_matches('/').to_string(), 0o755, data));
        }
    }
    out
}
