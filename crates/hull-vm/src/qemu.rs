//! QEMU's command line, built from typed values.
//!
//! What this protects against: a VM with more than it needs. The argv has no
//! default devices (`-nodefaults`, `-no-user-config`), no network card at all
//! (`-nic none`, no netdev), no display, a seccomp sandbox where the QEMU build
//! has one (`-sandbox on` denying obsolete syscalls, privilege changes,
//! spawning and resource control), and only the devices named here: virtio
//! serial for the agent, vhost-user-fs for each share, virtio-blk for disks,
//! virtio-rng for entropy. Values that reach QEMU's option parser are escaped
//! (`,` doubled), so a path cannot smuggle another option in.
//!
//! What it does not: decide what is shared (that is
//! [`policy::lower::vm`](crate::policy::lower::vm)) or check that the files
//! exist (the machine start does, and names the missing one).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde::Serialize;

/// The hardware accelerator QEMU runs the guest with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Accel {
    /// Linux KVM.
    Kvm,
    /// Emulation; works everywhere, about 10-20x slower.
    Tcg,
    /// macOS Hypervisor.framework.
    Hvf,
    /// Windows Hypervisor Platform.
    Whpx,
}

impl Accel {
    pub fn name(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
            Accel::Hvf => "hvf",
            Accel::Whpx => "whpx",
        }
    }

    /// The `-accel` value.
    fn accel_arg(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
            Accel::Hvf => "hvf",
            // WHPX's in-kernel irqchip is unreliable with Linux guests.
            Accel::Whpx => "whpx,kernel-irqchip=off",
        }
    }

    /// The `-cpu` model: the host's CPU where the accelerator passes it
    /// through, the widest emulated one under TCG.
    fn cpu(self) -> &'static str {
        match self {
            Accel::Kvm | Accel::Hvf => "host",
            Accel::Tcg => "max",
            // WHPX does not support `-cpu host` in every QEMU build.
            Accel::Whpx => "qemu64",
        }
    }
}

impl std::fmt::Display for Accel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Guest architecture; selects the QEMU binary, machine type and console.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Arch {
    X86_64,
    Aarch64,
}

impl Arch {
    /// The architecture this hull was built for.
    pub const fn host() -> Arch {
        if cfg!(target_arch = "aarch64") {
            Arch::Aarch64
        } else {
            Arch::X86_64
        }
    }

    /// The QEMU system emulator's file name.
    pub fn qemu_binary(self) -> &'static str {
        match self {
            Arch::X86_64 => "qemu-system-x86_64",
            Arch::Aarch64 => "qemu-system-aarch64",
        }
    }

    fn machine(self) -> &'static str {
        match self {
            // `pc` measured fastest here; microvm hangs with Debian kernels.
            Arch::X86_64 => "pc",
            Arch::Aarch64 => "virt",
        }
    }

    /// The kernel's name for the first serial port.
    pub fn console(self) -> &'static str {
        match self {
            Arch::X86_64 => "ttyS0",
            Arch::Aarch64 => "ttyAMA0",
        }
    }
}

/// How guest RAM is backed. vhost-user (virtiofsd) needs RAM it can map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MemBackend {
    /// Linux `memfd` shared with the vhost-user backends.
    Memfd,
    /// POSIX shared memory (QEMU 9.1+ on macOS and the BSDs).
    Shm,
    /// Private RAM: no vhost-user devices possible.
    Private,
}

impl MemBackend {
    /// The shared backend this host's QEMU has.
    pub fn for_host(os: crate::os::Os) -> MemBackend {
        match os {
            crate::os::Os::Linux => MemBackend::Memfd,
            crate::os::Os::Macos => MemBackend::Shm,
            crate::os::Os::Windows => MemBackend::Private,
        }
    }
}

/// A disk image attached as virtio-blk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Disk {
    pub path: PathBuf,
    pub format: DiskFormat,
    /// Read-only to the guest (enforced by QEMU, on the host).
    pub readonly: bool,
    /// Writes go to a temporary overlay QEMU discards at exit.
    pub snapshot: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DiskFormat {
    Raw,
    Qcow2,
}

impl DiskFormat {
    fn name(self) -> &'static str {
        match self {
            DiskFormat::Raw => "raw",
            DiskFormat::Qcow2 => "qcow2",
        }
    }
}

/// One virtiofs share: the tag the guest mounts and the vhost-user socket
/// its virtiofsd listens on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FsShare {
    pub tag: String,
    pub socket: PathBuf,
}

/// Start paused, waiting for a migration stream (snapshot restore).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Incoming {
    /// `-incoming defer`: the stream is named later with QMP `migrate-incoming`.
    Defer,
}

/// Everything QEMU is started with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MachineConfig {
    /// Shown in `ps` and in QEMU's own messages.
    pub name: String,
    pub arch: Arch,
    pub accel: Accel,
    pub mem_backend: MemBackend,
    pub memory_mib: u32,
    pub cpus: u32,
    pub kernel: PathBuf,
    pub initrd: Option<PathBuf>,
    /// Kernel command line after the console and panic settings hull adds.
    pub cmdline: String,
    pub disks: Vec<Disk>,
    pub shares: Vec<FsShare>,
    /// Unix socket QEMU listens on for the agent's virtio-serial port.
    pub agent_socket: PathBuf,
    /// Unix socket QEMU listens on for the network channel's port
    /// (`hull_protocol::netmux`): every VM has it, so a snapshot restores
    /// into any run; hull connects to it only for a run with an allow list.
    pub net_socket: PathBuf,
    /// Unix socket QEMU listens on for QMP.
    pub qmp_socket: PathBuf,
    /// Whether to pass `-sandbox on,...` (the QEMU build supports it).
    pub sandbox: bool,
    pub incoming: Option<Incoming>,
    /// `-run-with user=`: the user QEMU switches to after its setup.
    pub run_as: Option<String>,
}

/// The virtio-serial port name the guest agent opens (`/sys/class/virtio-ports/*/name`).
pub const AGENT_PORT_NAME: &str = "agent.0";

/// Largest guest memory hull configures (sanity bound on policy values).
pub const MAX_MEMORY_MIB: u32 = 1 << 20;
/// Largest vCPU count hull configures.
pub const MAX_CPUS: u32 = 256;

/// A configuration QEMU must not be started with.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ArgvError {
    #[error("tier vm: {what} {value:?} contains a control character; refusing to pass it to QEMU")]
    ControlChar { what: &'static str, value: String },
    #[error("tier vm: {what} {path} is not valid UTF-8; QEMU options need UTF-8 paths")]
    NotUtf8 { what: &'static str, path: PathBuf },
    #[error("tier vm: share tag {0:?} is not 1-36 characters of [a-z0-9_-]")]
    BadTag(String),
    #[error("tier vm: share tag {0:?} appears twice")]
    DuplicateTag(String),
    #[error("tier vm: {0} virtiofs shares need shared guest memory, which QEMU on this OS lacks")]
    SharesNeedSharedMemory(usize),
    #[error("tier vm: memory {0} MiB is outside 64..={MAX_MEMORY_MIB} MiB")]
    Memory(u32),
    #[error("tier vm: cpus {0} is outside 1..={MAX_CPUS}")]
    Cpus(u32),
}

/// Escapes a value for QEMU's `key=value,...` option syntax.
fn opt(value: &str) -> String {
    value.replace(',', ",,")
}

fn path_str<'a>(what: &'static str, p: &'a Path) -> Result<&'a str, ArgvError> {
    let s = p.to_str().ok_or_else(|| ArgvError::NotUtf8 {
        what,
        path: p.to_path_buf(),
    })?;
    no_control(what, s)?;
    Ok(s)
}

fn no_control(what: &'static str, s: &str) -> Result<(), ArgvError> {
    if s.chars().any(char::is_control) {
        return Err(ArgvError::ControlChar {
            what,
            value: s.to_string(),
        });
    }
    Ok(())
}

/// A virtiofs tag: short, lowercase, no separators QEMU or mount would parse.
pub fn valid_tag(tag: &str) -> bool {
    (1..=36).contains(&tag.len())
        && tag
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

impl MachineConfig {
    /// The full kernel command line: console and panic-to-exit (unless
    /// `cmdline` sets them itself), then `cmdline`.
    pub fn kernel_cmdline(&self) -> String {
        let words: Vec<&str> = self.cmdline.split_whitespace().collect();
        let mut out: Vec<String> = Vec::new();
        if !words.iter().any(|w| w.starts_with("console=")) {
            out.push(format!("console={}", self.arch.console()));
        }
        if !words.iter().any(|w| w.starts_with("panic=")) {
            out.push("panic=-1".into());
        }
        out.extend(words.iter().map(|w| w.to_string()));
        out.join(" ")
    }

    /// QEMU's arguments (without the program name).
    pub fn argv(&self) -> Result<Vec<OsString>, ArgvError> {
        if !(64..=MAX_MEMORY_MIB).contains(&self.memory_mib) {
            return Err(ArgvError::Memory(self.memory_mib));
        }
        if !(1..=MAX_CPUS).contains(&self.cpus) {
            return Err(ArgvError::Cpus(self.cpus));
        }
        if !self.shares.is_empty() && self.mem_backend == MemBackend::Private {
            return Err(ArgvError::SharesNeedSharedMemory(self.shares.len()));
        }
        no_control("name", &self.name)?;
        no_control("kernel command line", &self.cmdline)?;
        let cmdline = self.kernel_cmdline();
        no_control("kernel command line", &cmdline)?;

        let mut a: Vec<String> = Vec::new();
        let mut push = |items: &[&str]| a.extend(items.iter().map(|s| s.to_string()));
        push(&["-name", &format!("{},debug-threads=on", opt(&self.name))]);
        push(&["-nodefaults", "-no-user-config", "-display", "none"]);
        push(&["-no-reboot", "-nic", "none"]);
        if self.sandbox {
            // With `-run-with user=` QEMU's own set*id calls must pass the
            // filter (it installs it first); it then has no capability left
            // to regain anything with them.
            let elevate = if self.run_as.is_some() {
                "allow"
            } else {
                "deny"
            };
            push(&[
                "-sandbox",
                &format!(
                    "on,obsolete=deny,elevateprivileges={elevate},spawn=deny,resourcecontrol=deny"
                ),
            ]);
        }
        if let Some(user) = &self.run_as {
            push(&["-run-with", &format!("user={}", opt(user))]);
        }
        let accel = match (self.accel, &self.incoming) {
            // QEMU 10.0's multi-threaded TCG can abort (iotlb_to_section
            // assertion) when a vCPU touches MMIO while another reprograms
            // the memory map, as a booting guest does (PCI BARs): boots run
            // every vCPU on one thread. A restored guest's map is settled.
            (Accel::Tcg, None) if self.cpus > 1 => "tcg,thread=single",
            (a, _) => a.accel_arg(),
        };
        push(&["-M", self.arch.machine(), "-accel", accel]);
        push(&["-cpu", self.accel.cpu()]);
        let mem = self.memory_mib.to_string();
        let smp = self.cpus.to_string();
        push(&["-m", &format!("{mem}M"), "-smp", &smp]);
        match self.mem_backend {
            MemBackend::Memfd => push(&[
                "-object",
                &format!("memory-backend-memfd,id=mem,size={mem}M,share=on"),
                "-numa",
                "node,memdev=mem",
            ]),
            MemBackend::Shm => push(&[
                "-object",
                &format!("memory-backend-shm,id=mem,size={mem}M,share=on"),
                "-numa",
                "node,memdev=mem",
            ]),
            MemBackend::Private => {}
        }
        let kernel = path_str("kernel", &self.kernel)?;
        push(&["-kernel", kernel]);
        if let Some(initrd) = &self.initrd {
            let initrd = path_str("initrd", initrd)?;
            push(&["-initrd", initrd]);
        }
        push(&["-append", &cmdline]);

        // Console: the first serial port, on QEMU's stdout, which hull
        // copies to the console log up to a cap (the guest chooses what it
        // writes there). Its input is /dev/null.
        push(&[
            "-chardev",
            "stdio,id=console,signal=off",
            "-serial",
            "chardev:console",
        ]);
        // QMP control socket.
        let qmp = path_str("QMP socket", &self.qmp_socket)?;
        push(&[
            "-chardev",
            &format!("socket,id=qmp,path={},server=on,wait=off", opt(qmp)),
            "-mon",
            "chardev=qmp,mode=control",
        ]);
        // Entropy, so the guest's getrandom() does not wait under emulation.
        push(&[
            "-object",
            "rng-random,id=rng0,filename=/dev/urandom",
            "-device",
            "virtio-rng-pci,rng=rng0",
        ]);
        // A VM generation id: a VM restored from a snapshot gets a new one
        // (`guid=auto` is drawn per QEMU start), and the guest kernel reseeds
        // its CRNG when it changes, so restores do not share random state.
        if self.arch == Arch::X86_64 {
            push(&["-device", "vmgenid,guid=auto"]);
        }
        // Agent channel: one virtio-serial port on a unix socket.
        let agent = path_str("agent socket", &self.agent_socket)?;
        push(&[
            "-device",
            "virtio-serial-pci,id=vser0",
            "-chardev",
            &format!("socket,id=agent,path={},server=on,wait=off", opt(agent)),
            "-device",
            &format!("virtserialport,bus=vser0.0,chardev=agent,name={AGENT_PORT_NAME}"),
        ]);
        // The network channel: a second port on the same bus.
        let net = path_str("network channel socket", &self.net_socket)?;
        push(&[
            "-chardev",
            &format!("socket,id=net,path={},server=on,wait=off", opt(net)),
            "-device",
            &format!(
                "virtserialport,bus=vser0.0,chardev=net,name={}",
                hull_protocol::netmux::PORT_NAME
            ),
        ]);
        for (i, d) in self.disks.iter().enumerate() {
            let p = path_str("disk", &d.path)?;
            let mut drive = format!(
                "file={},if=none,id=disk{i},format={}",
                opt(p),
                d.format.name()
            );
            if d.readonly {
                drive.push_str(",readonly=on");
            }
            if d.snapshot {
                drive.push_str(",snapshot=on");
            }
            push(&[
                "-drive",
                &drive,
                "-device",
                &format!("virtio-blk-pci,drive=disk{i}"),
            ]);
        }
        let mut tags: Vec<&str> = Vec::new();
        for (i, s) in self.shares.iter().enumerate() {
            if !valid_tag(&s.tag) {
                return Err(ArgvError::BadTag(s.tag.clone()));
            }
            if tags.contains(&s.tag.as_str()) {
                return Err(ArgvError::DuplicateTag(s.tag.clone()));
            }
            tags.push(&s.tag);
            let sock = path_str("virtiofs socket", &s.socket)?;
            push(&[
                "-chardev",
                &format!("socket,id=fs{i},path={}", opt(sock)),
                "-device",
                &format!("vhost-user-fs-pci,chardev=fs{i},tag={}", s.tag),
            ]);
        }
        match self.incoming {
            None => {}
            Some(Incoming::Defer) => push(&["-incoming", "defer"]),
        }
        Ok(a.into_iter().map(OsString::from).collect())
    }
}

/// The sandbox option hull asks for; used to probe whether QEMU has it.
pub const SANDBOX_ARG: &str =
    "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny";

/// Asks QEMU whether it was built with seccomp support for `-sandbox`:
/// QEMU parses `-sandbox` before `-version` and fails on an unknown option
/// group, so `qemu -sandbox on,... -version` succeeding means it has it.
pub fn probe_sandbox(qemu: &Path) -> bool {
    std::process::Command::new(qemu)
        .args(["-sandbox", SANDBOX_ARG, "-version"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether `qemu -accel help` lists `kvm`.
pub fn probe_kvm(qemu: &Path) -> bool {
    std::process::Command::new(qemu)
        .args(["-accel", "help"])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .is_ok_and(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .any(|l| l.trim() == "kvm")
        })
}

/// `QEMU emulator version 10.0.2 (...)` -> the whole first line; each ask
/// starts QEMU (`qemu_facts` keeps the answer across runs).
pub fn version(qemu: &Path) -> Option<String> {
    let out = std::process::Command::new(qemu)
        .arg("-version")
        .stdin(std::process::Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .map(|l| l.trim().to_string())
}

/// Finds the QEMU binary for `arch`: `HULL_QEMU` if set, else `PATH`,
/// else the usual install locations. Returns an absolute path.
pub fn find_qemu(arch: Arch) -> Option<PathBuf> {
    if let Some(p) = &crate::settings::get().qemu {
        return p.is_absolute().then(|| p.clone());
    }
    let name = arch.qemu_binary();
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.extend(
        ["/usr/bin", "/usr/local/bin", "/opt/homebrew/bin"]
            .iter()
            .map(PathBuf::from),
    );
    find_in(&dirs, name)
}

/// The first absolute `dir/name` that is an executable file.
pub(crate) fn find_in(dirs: &[PathBuf], name: &str) -> Option<PathBuf> {
    let exe = if cfg!(windows) {
        format!("{name}.exe")
    } else {
        name.to_string()
    };
    dirs.iter()
        .filter(|d| d.is_absolute())
        .map(|d| d.join(&exe))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    match std::fs::metadata(p) {
        Ok(m) if m.is_file() => {
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                m.permissions().mode() & 0o111 != 0
            }
            #[cfg(not(unix))]
            {
                true
            }
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(accel: Accel, arch: Arch, backend: MemBackend) -> MachineConfig {
        MachineConfig {
            name: "hull-ID".into(),
            arch,
            accel,
            mem_backend: backend,
            memory_mib: 1024,
            cpus: 2,
            kernel: "/cache/img/vmlinux".into(),
            initrd: Some("/cache/img/initrd.img".into()),
            cmdline: "root=/dev/vda ro quiet".into(),
            disks: vec![Disk {
                path: "/cache/img/root.img".into(),
                format: DiskFormat::Raw,
                readonly: true,
                snapshot: false,
            }],
            shares: if backend == MemBackend::Private {
                vec![]
            } else {
                vec![
                    FsShare {
                        tag: "project".into(),
                        socket: "/run/ID/vfs-project.sock".into(),
                    },
                    FsShare {
                        tag: "spill".into(),
                        socket: "/run/ID/vfs-spill.sock".into(),
                    },
                ]
            },
            agent_socket: "/run/ID/agent.sock".into(),
            net_socket: "/run/ID/net.sock".into(),
            qmp_socket: "/run/ID/qmp.sock".into(),
            sandbox: true,
            incoming: None,
            run_as: None,
        }
    }

    fn joined(c: &MachineConfig) -> String {
        c.argv()
            .unwrap()
            .iter()
            .map(|s| s.to_str().unwrap().to_string())
            .collect::<Vec<_>>()
            .join("\n")
    }

    const COMMON_TAIL: &str = "-chardev
stdio,id=console,signal=off
-serial
chardev:console
-chardev
socket,id=qmp,path=/run/ID/qmp.sock,server=on,wait=off
-mon
chardev=qmp,mode=control
-object
rng-random,id=rng0,filename=/dev/urandom
-device
virtio-rng-pci,rng=rng0
-device
vmgenid,guid=auto
-device
virtio-serial-pci,id=vser0
-chardev
socket,id=agent,path=/run/ID/agent.sock,server=on,wait=off
-device
virtserialport,bus=vser0.0,chardev=agent,name=agent.0
-chardev
socket,id=net,path=/run/ID/net.sock,server=on,wait=off
-device
virtserialport,bus=vser0.0,chardev=net,name=net.0
-drive
file=/cache/img/root.img,if=none,id=disk0,format=raw,readonly=on
-device
virtio-blk-pci,drive=disk0";

    const SHARES: &str = "
-chardev
socket,id=fs0,path=/run/ID/vfs-project.sock
-device
vhost-user-fs-pci,chardev=fs0,tag=project
-chardev
socket,id=fs1,path=/run/ID/vfs-spill.sock
-device
vhost-user-fs-pci,chardev=fs1,tag=spill";

    #[test]
    fn golden_tcg_linux() {
        let want = format!(
            "-name
hull-ID,debug-threads=on
-nodefaults
-no-user-config
-display
none
-no-reboot
-nic
none
-sandbox
on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny
-M
pc
-accel
tcg,thread=single
-cpu
max
-m
1024M
-smp
2
-object
memory-backend-memfd,id=mem,size=1024M,share=on
-numa
node,memdev=mem
-kernel
/cache/img/vmlinux
-initrd
/cache/img/initrd.img
-append
console=ttyS0 panic=-1 root=/dev/vda ro quiet
{COMMON_TAIL}{SHARES}"
        );
        assert_eq!(
            joined(&config(Accel::Tcg, Arch::X86_64, MemBackend::Memfd)),
            want
        );
    }

    #[test]
    fn golden_kvm_linux() {
        let got = joined(&config(Accel::Kvm, Arch::X86_64, MemBackend::Memfd));
        assert!(got.contains("\n-accel\nkvm\n-cpu\nhost\n"), "{got}");
        assert!(got.contains("memory-backend-memfd,id=mem,size=1024M,share=on"));
        assert!(got.ends_with(SHARES.trim_start_matches('\n')));
    }

    #[test]
    fn golden_hvf_macos_aarch64() {
        let got = joined(&config(Accel::Hvf, Arch::Aarch64, MemBackend::Shm));
        let want_head = "-name
hull-ID,debug-threads=on
-nodefaults
-no-user-config
-display
none
-no-reboot
-nic
none
-sandbox
on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny
-M
virt
-accel
hvf
-cpu
host
-m
1024M
-smp
2
-object
memory-backend-shm,id=mem,size=1024M,share=on
-numa
node,memdev=mem
-kernel
/cache/img/vmlinux
-initrd
/cache/img/initrd.img
-append
console=ttyAMA0 panic=-1 root=/dev/vda ro quiet
";
        assert!(got.starts_with(want_head), "{got}");
        assert!(got.ends_with(SHARES.trim_start_matches('\n')));
    }

    #[test]
    fn golden_whpx_windows() {
        let mut c = config(Accel::Whpx, Arch::X86_64, MemBackend::Private);
        c.sandbox = false;
        let want = format!(
            "-name
hull-ID,debug-threads=on
-nodefaults
-no-user-config
-display
none
-no-reboot
-nic
none
-M
pc
-accel
whpx,kernel-irqchip=off
-cpu
qemu64
-m
1024M
-smp
2
-kernel
/cache/img/vmlinux
-initrd
/cache/img/initrd.img
-append
console=ttyS0 panic=-1 root=/dev/vda ro quiet
{COMMON_TAIL}"
        );
        assert_eq!(joined(&c), want);
    }

    #[test]
    fn never_a_network_device() {
        for accel in [Accel::Kvm, Accel::Tcg, Accel::Hvf, Accel::Whpx] {
            let got = joined(&config(accel, Arch::X86_64, MemBackend::Memfd));
            assert!(got.contains("\n-nic\nnone\n"));
            assert!(got.contains("-nodefaults"));
            for bad in ["netdev", "virtio-net", "e1000", "user,", "tap", "-net\n"] {
                assert!(!got.contains(bad), "{accel}: {bad} in {got}");
            }
        }
    }

    #[test]
    fn run_as_drops_to_the_user_and_lets_qemu_do_it() {
        let mut c = config(Accel::Tcg, Arch::X86_64, MemBackend::Memfd);
        let got = joined(&c);
        assert!(got.contains("elevateprivileges=deny"), "{got}");
        assert!(!got.contains("-run-with"), "{got}");
        c.run_as = Some("hull-sandbox".into());
        let got = joined(&c);
        assert!(got.contains("\n-run-with\nuser=hull-sandbox\n"), "{got}");
        assert!(got.contains("elevateprivileges=allow"), "{got}");
    }

    #[test]
    fn incoming_defer_and_snapshot_disk() {
        let mut c = config(Accel::Tcg, Arch::X86_64, MemBackend::Memfd);
        c.incoming = Some(Incoming::Defer);
        c.disks[0].readonly = false;
        c.disks[0].snapshot = true;
        c.disks[0].format = DiskFormat::Qcow2;
        let got = joined(&c);
        assert!(got.ends_with("\n-incoming\ndefer"), "{got}");
        // A restored guest runs a TCG thread per vCPU; a boot, one for all.
        assert!(got.contains("\n-accel\ntcg\n"), "{got}");
        assert!(got.contains("file=/cache/img/root.img,if=none,id=disk0,format=qcow2,snapshot=on"));
    }

    #[test]
    fn commas_in_paths_are_escaped_and_control_chars_refused() {
        let mut c = config(Accel::Tcg, Arch::X86_64, MemBackend::Memfd);
        c.qmp_socket = "/run/a,b=c/qmp.sock".into();
        let got = joined(&c);
        assert!(got.contains("socket,id=qmp,path=/run/a,,b=c/qmp.sock,server=on,wait=off"));
        c.cmdline = "quiet\ninit=/bin/sh".into();
        assert!(matches!(c.argv(), Err(ArgvError::ControlChar { .. })));
    }

    #[test]
    fn bad_tags_sizes_and_backends_are_errors() {
        let mut c = config(Accel::Tcg, Arch::X86_64, MemBackend::Memfd);
        c.shares[1].tag = "project".into();
        assert_eq!(c.argv(), Err(ArgvError::DuplicateTag("project".into())));
        c.shares[1].tag = "a,b".into();
        assert_eq!(c.argv(), Err(ArgvError::BadTag("a,b".into())));
        let mut c = config(Accel::Tcg, Arch::X86_64, MemBackend::Memfd);
        c.mem_backend = MemBackend::Private;
        assert_eq!(c.argv(), Err(ArgvError::SharesNeedSharedMemory(2)));
        let mut c = config(Accel::Tcg, Arch::X86_64, MemBackend::Memfd);
        c.memory_mib = 8;
        assert_eq!(c.argv(), Err(ArgvError::Memory(8)));
        c.memory_mib = 512;
        c.cpus = 0;
        assert_eq!(c.argv(), Err(ArgvError::Cpus(0)));
    }

    #[test]
    fn console_and_panic_are_added_once() {
        let mut c = config(Accel::Tcg, Arch::X86_64, MemBackend::Memfd);
        c.cmdline = "console=ttyS0 quiet panic=-1 root=/dev/vda".into();
        assert_eq!(
            c.kernel_cmdline(),
            "console=ttyS0 quiet panic=-1 root=/dev/vda"
        );
        c.cmdline = "  root=/dev/vda  ".into();
        assert_eq!(c.kernel_cmdline(), "console=ttyS0 panic=-1 root=/dev/vda");
    }

    #[test]
    fn tags() {
        assert!(valid_tag("project"));
        assert!(valid_tag("ro-3"));
        assert!(!valid_tag(""));
        assert!(!valid_tag("Project"));
        assert!(!valid_tag("a b"));
        assert!(!valid_tag(&"x".repeat(37)));
    }
}
