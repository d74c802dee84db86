//! Tier 3 on Windows with Hyper-V: the outer VM as an HCS compute system,
//! the agent over Hyper-V sockets, the shares over Plan 9.
//!
//! Why the Host Compute Service (HCS, `computecore.dll`) and not the Hyper-V
//! PowerShell module (see `docs/architecture.md, "macOS and Windows"` for the long form):
//! HCS boots a Linux kernel and initrd directly (`LinuxKernelDirect`, as WSL2
//! and Linux containers on Windows do), so the same `vmlinux`/initrd the QEMU
//! backend boots is used, with no UEFI firmware or boot loader in the image;
//! a compute system created with `ShouldTerminateOnLastHandleClosed` dies
//! with hull's handle, so a crashed hull leaves no VM behind (PowerShell VMs
//! are persistent VMMS objects); Plan 9 shares and the Hyper-V socket service
//! table are part of the same JSON document (no registry writes under
//! `GuestCommunicationServices`, no SMB server or credentials); the document
//! is plain data, golden-tested here; and there is no PowerShell start-up
//! (about a second) or text output to parse. Both need the user to be an
//! administrator or in "Hyper-V Administrators".
//!
//! The pieces:
//! - [`ComputeSystemSpec`] and [`document`]: the HCS schema 2.1 document
//!   (pure, golden-tested): kernel direct boot, memory, processors, one SCSI
//!   disk (a fixed VHD, see [`vhd`]), Plan 9 shares, a Hyper-V socket service
//!   for the agent, the serial console on a named pipe, **no network
//!   adapter**.
//! - Shares: Hyper-V has no virtiofs. HCS's Plan 9 server serves each share
//!   over a Hyper-V socket; the guest dials `AF_VSOCK` host port
//!   [`PLAN9_PORT`] and mounts `9p` with `trans=fd` ([`guest_mount`]).
//!   Read-only shares carry the Plan 9 `ReadOnly` flag, enforced by the host's
//!   server (not by the guest mount). Protected paths inside a writable share
//!   cannot be masked by the Plan 9 server: they are covered by deny ACEs for
//!   the VM's account (`NT VIRTUAL MACHINE\{id}`, [`vm_account_sid`]) on the
//!   host, and masked again by the outer agent below the container.
//!   Whether the Plan 9 server's file access is checked against the VM's
//!   account is not verified (no Windows host here): until it is, treat those
//!   protections as guest-enforced (the container boundary), weaker than the
//!   host-side masks of virtiofsd on Linux. `docs/tiers.md` says so.
//! - Agent: the guest agent connects out over `AF_VSOCK` to the host, port
//!   [`AGENT_PORT`]; on the host that is the Hyper-V socket service GUID
//!   [`vsock_service_id`]`(AGENT_PORT)`, bound to this VM's runtime id only
//!   ([`hvsock`], Windows only). The frames are `hull-protocol`'s, the same as
//!   over virtio-serial.
//! - [`hcs`] (Windows only): create, start, query, terminate, close.
//!
//! What this protects against: the command's host access beyond the shares
//! (a VM boundary, as with QEMU). What it does not: bugs in Hyper-V's Plan 9
//! server or VM worker reachable from the guest; see above for masks.

#[cfg(windows)]
pub mod hcs;
#[cfg(windows)]
pub mod hvsock;
pub mod vhd;

use std::fmt;

use serde::Serialize;
use serde_json::{json, Value};

use crate::policy::lower::appcontainer::WinPath;

/// The vsock port the guest agent dials on the host.
pub const AGENT_PORT: u32 = 0x4855_4c4c; // "HULL"
/// The vsock port of HCS's Plan 9 server (one port; shares differ by name).
pub const PLAN9_PORT: u32 = 564;
/// Plan 9 share flags (HCS schema).
pub const PLAN9_READ_ONLY: u32 = 0x1;
pub const PLAN9_LINUX_METADATA: u32 = 0x4;
pub const PLAN9_CASE_SENSITIVE: u32 = 0x8;
/// The 9p message size the guest mounts with.
pub const PLAN9_MSIZE: u32 = 65536;
/// At most this many shares per VM (as on the QEMU backend).
pub const MAX_SHARES: usize = 32;

/// Errors of the Hyper-V backend.
#[derive(Debug, thiserror::Error)]
pub enum HyperVError {
    #[error("tier vm (Hyper-V) needs Windows")]
    WrongOs,
    #[error("tier vm (Hyper-V): bad GUID {0:?}")]
    BadGuid(String),
    #[error("tier vm (Hyper-V): share {name:?}: {message}")]
    Share { name: String, message: String },
    #[error("tier vm (Hyper-V): more than {MAX_SHARES} shares")]
    TooManyShares,
    #[error("tier vm (Hyper-V): {call} failed: {message}")]
    Os { call: &'static str, message: String },
}

/// A GUID, stored as the 128-bit number its text form spells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Guid(pub u128);

impl Guid {
    /// Parses `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (braces allowed).
    pub fn parse(s: &str) -> Result<Guid, HyperVError> {
        let t = s.trim_start_matches('{').trim_end_matches('}');
        let parts: Vec<&str> = t.split('-').collect();
        let lens = [8, 4, 4, 4, 12];
        if parts.len() != 5
            || parts
                .iter()
                .zip(lens)
                .any(|(p, l)| p.len() != l || !p.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            return Err(HyperVError::BadGuid(s.to_string()));
        }
        u128::from_str_radix(&parts.concat(), 16)
            .map(Guid)
            .map_err(|_| HyperVError::BadGuid(s.to_string()))
    }

    /// The four 32-bit words of the GUID's in-memory (little-endian fields)
    /// layout, as SIDs built from GUIDs use them.
    pub fn sid_words(self) -> [u32; 4] {
        let d1 = (self.0 >> 96) as u32;
        let d2 = (self.0 >> 80) as u16;
        let d3 = (self.0 >> 64) as u16;
        let d4 = (self.0 as u64).to_be_bytes();
        let mut b = [0u8; 16];
        b[0..4].copy_from_slice(&d1.to_le_bytes());
        b[4..6].copy_from_slice(&d2.to_le_bytes());
        b[6..8].copy_from_slice(&d3.to_le_bytes());
        b[8..16].copy_from_slice(&d4);
        let w = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        [w(0), w(4), w(8), w(12)]
    }
}

impl Serialize for Guid {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl fmt::Display for Guid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = self.0;
        write!(
            f,
            "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
            (v >> 96) as u32,
            (v >> 80) as u16,
            (v >> 64) as u16,
            (v >> 48) as u16,
            v & 0xffff_ffff_ffff
        )
    }
}

/// The Hyper-V socket service id of vsock port `port` (the documented
/// template `PPPPPPPP-FACB-11E6-BD58-64006A7986D3`).
pub fn vsock_service_id(port: u32) -> Guid {
    Guid((u128::from(port) << 96) | 0x0000_0000_facb_11e6_bd58_6400_6a79_86d3)
}

/// The SID of a VM's account (`NT VIRTUAL MACHINE\{id}`):
/// `S-1-5-83-1-` and the GUID as four 32-bit words.
pub fn vm_account_sid(vm: Guid) -> String {
    let w = vm.sid_words();
    format!("S-1-5-83-1-{}-{}-{}-{}", w[0], w[1], w[2], w[3])
}

/// One Plan 9 share.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Plan9Share {
    /// Share name and 9p `aname` (letters, digits, `-`).
    pub name: String,
    pub host_path: WinPath,
    pub read_only: bool,
    /// Where the outer agent mounts it in the guest.
    pub guest_path: String,
    /// Protected paths inside (host paths), masked as described above.
    pub masks: Vec<WinPath>,
}

/// One SCSI disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Disk {
    /// A fixed VHD (raw image plus footer) or a VHDX.
    pub path: WinPath,
    pub read_only: bool,
}

/// Everything the compute system document is made of.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ComputeSystemSpec {
    /// The compute system id: the instance's UUID.
    pub id: Guid,
    pub kernel: WinPath,
    pub initrd: Option<WinPath>,
    pub cmdline: String,
    pub memory_mb: u64,
    pub cpus: u32,
    pub disks: Vec<Disk>,
    pub shares: Vec<Plan9Share>,
    /// The user's SID (`S-1-5-21-...`): the only one, with SYSTEM, allowed
    /// to bind and connect the agent's socket service.
    pub user_sid: String,
}

impl ComputeSystemSpec {
    /// The named pipe the guest's first serial port is connected to.
    pub fn console_pipe(&self) -> String {
        format!("\\\\.\\pipe\\hull-{}-console", self.id)
    }

    fn check(&self) -> Result<(), HyperVError> {
        if self.shares.len() > MAX_SHARES {
            return Err(HyperVError::TooManyShares);
        }
        let sid_ok = self.user_sid.starts_with("S-1-")
            && self.user_sid[4..]
                .bytes()
                .all(|b| b.is_ascii_digit() || b == b'-');
        if !sid_ok {
            return Err(HyperVError::Share {
                name: "agent".into(),
                message: format!("user SID {:?} is not a SID", self.user_sid),
            });
        }
        for (i, s) in self.shares.iter().enumerate() {
            let bad = |m: &str| HyperVError::Share {
                name: s.name.clone(),
                message: m.to_string(),
            };
            if s.name.is_empty()
                || s.name.len() > 64
                || !s
                    .name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            {
                return Err(bad("name must be 1-64 letters, digits or -"));
            }
            if self.shares[..i].iter().any(|o| o.name == s.name) {
                return Err(bad("duplicate name"));
            }
            if !s.guest_path.starts_with('/') || s.guest_path.contains(['\n', ',', '\0']) {
                return Err(bad("guest path must be absolute, without commas"));
            }
        }
        Ok(())
    }
}

/// The HCS schema 2.1 document for `CreateComputeSystem`.
pub fn document(spec: &ComputeSystemSpec) -> Result<Value, HyperVError> {
    spec.check()?;
    // Only the user and SYSTEM may bind the agent's service on the host or
    // connect to it; wildcard binds are refused, so the listener must name
    // this VM's runtime id.
    let sd = format!("D:P(A;;FA;;;SY)(A;;FA;;;{})", spec.user_sid);
    let mut scsi = serde_json::Map::new();
    let mut attachments = serde_json::Map::new();
    for (i, d) in spec.disks.iter().enumerate() {
        attachments.insert(
            i.to_string(),
            json!({"Type": "VirtualDisk", "Path": d.path.as_str(), "ReadOnly": d.read_only}),
        );
    }
    scsi.insert("0".into(), json!({ "Attachments": attachments }));
    let shares: Vec<Value> = spec
        .shares
        .iter()
        .map(|s| {
            let mut flags = PLAN9_LINUX_METADATA | PLAN9_CASE_SENSITIVE;
            if s.read_only {
                flags |= PLAN9_READ_ONLY;
            }
            json!({
                "Name": s.name,
                "AccessName": s.name,
                "Path": s.host_path.as_str(),
                "Port": PLAN9_PORT,
                "Flags": flags,
            })
        })
        .collect();
    let mut direct = json!({
        "KernelFilePath": spec.kernel.as_str(),
        "KernelCmdLine": spec.cmdline,
    });
    if let Some(i) = &spec.initrd {
        direct["InitRdPath"] = json!(i.as_str());
    }
    let service = vsock_service_id(AGENT_PORT).to_string();
    Ok(json!({
        "SchemaVersion": {"Major": 2, "Minor": 1},
        "Owner": "hull",
        "ShouldTerminateOnLastHandleClosed": true,
        "VirtualMachine": {
            "StopOnReset": true,
            "Chipset": {"LinuxKernelDirect": direct},
            "ComputeTopology": {
                "Memory": {"SizeInMB": spec.memory_mb, "AllowOvercommit": true},
                "Processor": {"Count": spec.cpus},
            },
            "Devices": {
                "Scsi": scsi,
                "Plan9": {"Shares": shares},
                "HvSocket": {
                    "HvSocketConfig": {
                        "ServiceTable": {
                            service: {
                                "BindSecurityDescriptor": sd,
                                "ConnectSecurityDescriptor": sd,
                                "AllowWildcardBinds": false,
                            }
                        }
                    }
                },
                "ComPorts": {"0": {"NamedPipe": spec.console_pipe()}},
            },
        },
    }))
}

/// The guest side of one share, for the outer agent: dial `AF_VSOCK` CID 2
/// (the host) port [`PLAN9_PORT`], then `mount -t 9p` with these options on
/// the connected descriptor `fd`. `ro` is added for read-only shares (the
/// host enforces it regardless).
pub fn guest_mount(share: &Plan9Share, fd: i32) -> String {
    let mut o = format!(
        "trans=fd,rfdno={fd},wfdno={fd},msize={PLAN9_MSIZE},aname={},version=9p2000.L,access=client",
        share.name
    );
    if share.read_only {
        o.push_str(",ro");
    }
    o
}

/// Probes the Hyper-V backend: HCS answers. Off Windows: "needs Windows".
pub fn probe() -> (bool, String) {
    #[cfg(windows)]
    {
        hcs::probe()
    }
    #[cfg(not(windows))]
    {
        (false, "needs Windows".to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(s: &str) -> WinPath {
        WinPath::parse_str(s).unwrap()
    }

    fn spec() -> ComputeSystemSpec {
        ComputeSystemSpec {
            id: Guid::parse("6f1c2a3b-4d5e-4f60-8172-93a4b5c6d7e8").unwrap(),
            kernel: w("C:\\Users\\u\\AppData\\Local\\hull\\images\\abc\\vmlinux"),
            initrd: Some(w(
                "C:\\Users\\u\\AppData\\Local\\hull\\images\\abc\\initrd.img",
            )),
            cmdline: "console=ttyS0 quiet panic=-1 root=/dev/sda rw".into(),
            memory_mb: 2048,
            cpus: 2,
            disks: vec![Disk {
                path: w("C:\\Users\\u\\AppData\\Local\\hull\\runs\\6f1c\\root.vhd"),
                read_only: false,
            }],
            shares: vec![
                Plan9Share {
                    name: "project".into(),
                    host_path: w("C:\\Users\\u\\proj"),
                    read_only: false,
                    guest_path: "/mnt/hull/project".into(),
                    masks: vec![
                        w("C:\\Users\\u\\proj\\.hull"),
                        w("C:\\Users\\u\\proj\\.git"),
                    ],
                },
                Plan9Share {
                    name: "spill".into(),
                    host_path: w("C:\\Users\\u\\AppData\\Local\\Temp\\hull-runs\\id1\\spill"),
                    read_only: true,
                    guest_path: "/mnt/hull/spill".into(),
                    masks: vec![],
                },
            ],
            user_sid: "S-1-5-21-1-2-3-1001".into(),
        }
    }

    #[test]
    fn golden_compute_system_document() {
        let doc = serde_json::to_string_pretty(&document(&spec()).unwrap()).unwrap() + "\n";
        crate::policy::lower::testing::golden_in(
            std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden")),
            "hyperv-compute-system.json",
            &doc,
        );
    }

    #[test]
    fn no_network_adapter_read_only_flag_and_agent_service() {
        let doc = document(&spec()).unwrap();
        let dev = &doc["VirtualMachine"]["Devices"];
        assert!(dev.get("NetworkAdapters").is_none(), "the VM has no NIC");
        let shares = dev["Plan9"]["Shares"].as_array().unwrap();
        assert_eq!(shares[0]["Flags"].as_u64().unwrap() & 1, 0);
        assert_eq!(
            shares[1]["Flags"].as_u64().unwrap() & 1,
            1,
            "spill is read-only on the host"
        );
        let table = &dev["HvSocket"]["HvSocketConfig"]["ServiceTable"];
        let svc = &table[vsock_service_id(AGENT_PORT).to_string()];
        assert_eq!(svc["AllowWildcardBinds"], false);
        assert!(svc["ConnectSecurityDescriptor"]
            .as_str()
            .unwrap()
            .contains("S-1-5-21-1-2-3-1001"));
        assert_eq!(doc["ShouldTerminateOnLastHandleClosed"], true);
    }

    #[test]
    fn bad_specs_are_refused() {
        let mut s = spec();
        s.shares[1].name = "project".into();
        assert!(document(&s).is_err());
        let mut s = spec();
        s.shares[0].guest_path = "/mnt/a,b".into();
        assert!(document(&s).is_err());
        let mut s = spec();
        s.user_sid = "S-1-5-21-1)(A;;FA;;;WD".into();
        assert!(document(&s).is_err(), "no SDDL injection through the SID");
    }

    #[test]
    fn guids_and_sids() {
        let g = Guid::parse("{6F1C2A3B-4D5E-4F60-8172-93A4B5C6D7E8}").unwrap();
        assert_eq!(g.to_string(), "6f1c2a3b-4d5e-4f60-8172-93a4b5c6d7e8");
        assert!(Guid::parse("6f1c2a3b-4d5e-4f60-8172").is_err());
        assert!(Guid::parse("zf1c2a3b-4d5e-4f60-8172-93a4b5c6d7e8").is_err());
        assert_eq!(
            vsock_service_id(5000).to_string(),
            "00001388-facb-11e6-bd58-64006a7986d3"
        );
        // words of the in-memory GUID: Data1, Data3:Data2, then Data4 bytes
        let w = g.sid_words();
        assert_eq!(w[0], 0x6f1c2a3b);
        assert_eq!(w[1], 0x4f604d5e);
        assert_eq!(w[2], u32::from_le_bytes([0x81, 0x72, 0x93, 0xa4]));
        assert!(vm_account_sid(g).starts_with("S-1-5-83-1-1864116795-"));
    }

    #[test]
    fn guest_mount_options() {
        let s = spec();
        let o = guest_mount(&s.shares[1], 7);
        assert!(o.starts_with("trans=fd,rfdno=7,wfdno=7,msize=65536,aname=spill"));
        assert!(o.ends_with(",ro"));
        assert!(!guest_mount(&s.shares[0], 7).contains(",ro"));
    }

    #[cfg(not(windows))]
    #[test]
    fn off_windows_the_probe_says_needs_windows() {
        assert_eq!(probe(), (false, "needs Windows".to_string()));
    }
}
