//! The HCS calls (Windows only): create, start, query, terminate and close a
//! compute system, and grant it access to its files.

use std::ffi::c_void;
use std::time::Duration;

use windows_sys::Win32::Foundation::LocalFree;
use windows_sys::Win32::System::HostComputeSystem::{
    HcsCloseComputeSystem, HcsCloseOperation, HcsCreateComputeSystem, HcsCreateOperation,
    HcsGetComputeSystemProperties, HcsGetServiceProperties, HcsGrantVmAccess,
    HcsStartComputeSystem, HcsTerminateComputeSystem, HcsWaitForOperationResult, HCS_OPERATION,
    HCS_SYSTEM,
};

use super::hvsock::{HvListener, HvStream};
use super::{vm_account_sid, vsock_service_id, ComputeSystemSpec, Guid, HyperVError, AGENT_PORT};

fn wide(s: &str) -> Vec<u16> {
    s.encode_utf16().chain(std::iter::once(0)).collect()
}

/// Takes ownership of a string HCS allocated (LocalAlloc) and frees it.
///
/// # Safety
/// `p` must be null or a NUL-terminated UTF-16 string from HCS.
unsafe fn take(p: *mut u16) -> String {
    if p.is_null() {
        return String::new();
    }
    let mut n = 0usize;
    // SAFETY: NUL-terminated (caller), so each read up to the NUL is in bounds.
    while unsafe { *p.add(n) } != 0 {
        n += 1;
    }
    // SAFETY: `n` u16s were just read from `p`.
    let s = String::from_utf16_lossy(unsafe { std::slice::from_raw_parts(p, n) });
    // SAFETY: HCS result documents are LocalAlloc'd; freed once.
    unsafe { LocalFree(p as *mut c_void) };
    s
}

fn hr(call: &'static str, hr: i32, doc: &str) -> Result<(), HyperVError> {
    if hr >= 0 {
        Ok(())
    } else {
        Err(HyperVError::Os {
            call,
            message: format!("HRESULT 0x{:08x} {doc}", hr as u32),
        })
    }
}

/// One synchronous HCS operation.
struct Op(HCS_OPERATION);

impl Op {
    fn new() -> Result<Op, HyperVError> {
        // SAFETY: no context and no callback: a synchronous operation.
        let op = unsafe { HcsCreateOperation(std::ptr::null(), None) };
        if op.is_null() {
            return Err(HyperVError::Os {
                call: "HcsCreateOperation",
                message: "returned null".into(),
            });
        }
        Ok(Op(op))
    }

    fn wait(&self, call: &'static str, timeout: Duration) -> Result<String, HyperVError> {
        let mut doc: *mut u16 = std::ptr::null_mut();
        let ms = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX);
        // SAFETY: `self.0` is a live operation; `doc` receives an owned string.
        let r = unsafe { HcsWaitForOperationResult(self.0, ms, &mut doc) };
        // SAFETY: `doc` is null or an HCS-allocated string.
        let text = unsafe { take(doc) };
        hr(call, r, &text)?;
        Ok(text)
    }
}

impl Drop for Op {
    fn drop(&mut self) {
        // SAFETY: the operation is owned and closed once.
        unsafe { HcsCloseOperation(self.0) };
    }
}

/// A running compute system; terminated and closed on drop (and, with
/// `ShouldTerminateOnLastHandleClosed`, by Windows if hull dies).
#[derive(Debug)]
pub struct ComputeSystem {
    handle: HCS_SYSTEM,
    pub id: Guid,
}

// SAFETY: an HCS_SYSTEM handle may be used from any thread (HCS calls are
// thread-safe); the value owns it exclusively.
unsafe impl Send for ComputeSystem {}

/// How long an HCS operation may take before it counts as failed.
pub const OP_TIMEOUT: Duration = Duration::from_secs(120);

impl ComputeSystem {
    /// Creates (does not start) the compute system described by `spec`.
    pub fn create(spec: &ComputeSystemSpec) -> Result<ComputeSystem, HyperVError> {
        let doc = super::document(spec)?.to_string();
        let id = wide(&spec.id.to_string());
        let wdoc = wide(&doc);
        let op = Op::new()?;
        let mut handle: HCS_SYSTEM = std::ptr::null_mut();
        // SAFETY: the strings are NUL-terminated and live across the call; no
        // security descriptor (default); `handle` receives the system handle.
        let r = unsafe {
            HcsCreateComputeSystem(
                id.as_ptr(),
                wdoc.as_ptr(),
                op.0,
                std::ptr::null(),
                &mut handle,
            )
        };
        hr("HcsCreateComputeSystem", r, "")?;
        let cs = ComputeSystem {
            handle,
            id: spec.id,
        };
        op.wait("HcsCreateComputeSystem", OP_TIMEOUT)?;
        Ok(cs)
    }

    pub fn start(&self) -> Result<(), HyperVError> {
        let op = Op::new()?;
        // SAFETY: live handle and operation; no options.
        let r = unsafe { HcsStartComputeSystem(self.handle, op.0, std::ptr::null()) };
        hr("HcsStartComputeSystem", r, "")?;
        op.wait("HcsStartComputeSystem", OP_TIMEOUT).map(|_| ())
    }

    /// The runtime id the agent's socket listener binds to.
    pub fn runtime_id(&self) -> Result<Guid, HyperVError> {
        let op = Op::new()?;
        let q = wide("{\"PropertyTypes\":[]}");
        // SAFETY: live handle and operation; `q` is NUL-terminated.
        let r = unsafe { HcsGetComputeSystemProperties(self.handle, op.0, q.as_ptr()) };
        hr("HcsGetComputeSystemProperties", r, "")?;
        let doc = op.wait("HcsGetComputeSystemProperties", OP_TIMEOUT)?;
        let v: serde_json::Value = serde_json::from_str(&doc).map_err(|e| HyperVError::Os {
            call: "HcsGetComputeSystemProperties",
            message: format!("bad JSON: {e}"),
        })?;
        Guid::parse(v["RuntimeId"].as_str().unwrap_or_default())
    }

    /// Stops the VM at once.
    pub fn terminate(&self) -> Result<(), HyperVError> {
        let op = Op::new()?;
        // SAFETY: live handle and operation; no options.
        let r = unsafe { HcsTerminateComputeSystem(self.handle, op.0, std::ptr::null()) };
        hr("HcsTerminateComputeSystem", r, "")?;
        op.wait("HcsTerminateComputeSystem", OP_TIMEOUT).map(|_| ())
    }
}

impl Drop for ComputeSystem {
    fn drop(&mut self) {
        let _ = self.terminate();
        // SAFETY: the handle is owned and closed once.
        unsafe { HcsCloseComputeSystem(self.handle) };
    }
}

/// Grants the compute system `id` access to a file it opens (kernel, initrd,
/// disk): `HcsGrantVmAccess` adds an ACE for the VM's account.
pub fn grant_vm_access(id: Guid, path: &str) -> Result<(), HyperVError> {
    let wid = wide(&id.to_string());
    let wpath = wide(path);
    // SAFETY: both strings are NUL-terminated and live across the call.
    let r = unsafe { HcsGrantVmAccess(wid.as_ptr(), wpath.as_ptr()) };
    hr("HcsGrantVmAccess", r, path)
}

/// HCS answers a service query: the backend can be used by this user.
pub fn probe() -> (bool, String) {
    let q = wide("{\"PropertyTypes\":[\"Basic\"]}");
    let mut out: *mut u16 = std::ptr::null_mut();
    // SAFETY: `q` is NUL-terminated; `out` receives an owned string.
    let r = unsafe { HcsGetServiceProperties(q.as_ptr(), &mut out) };
    // SAFETY: `out` is null or an HCS-allocated string.
    let text = unsafe { take(out) };
    if r >= 0 {
        (true, "Host Compute Service answers".into())
    } else {
        (
            false,
            format!(
                "Host Compute Service unavailable (HRESULT 0x{:08x}): enable Hyper-V and join \"Hyper-V Administrators\" {text}",
                r as u32
            ),
        )
    }
}

/// Boots the VM of `spec` and returns it with the agent's connection:
/// grant the VM its files, deny it the protected paths of its shares, create
/// it, bind the agent listener to its runtime id (before it starts, so the
/// agent's first connection finds it), start it, and wait at most
/// `agent_deadline` for the agent. Any failure drops (terminates) the VM.
pub fn boot(
    spec: &ComputeSystemSpec,
    agent_deadline: Duration,
) -> Result<(ComputeSystem, HvStream), HyperVError> {
    let os = |call: &'static str| {
        move |e: std::io::Error| HyperVError::Os {
            call,
            message: e.to_string(),
        }
    };
    for p in std::iter::once(&spec.kernel)
        .chain(spec.initrd.iter())
        .chain(spec.disks.iter().map(|d| &d.path))
    {
        grant_vm_access(spec.id, p.as_str())?;
    }
    let vm_sid = vm_account_sid(spec.id);
    for s in spec.shares.iter().filter(|s| !s.read_only) {
        for m in &s.masks {
            if std::fs::symlink_metadata(m.as_str()).is_ok() {
                crate::winsec::deny_all_for_sid(m.as_str(), &vm_sid).map_err(|message| {
                    HyperVError::Share {
                        name: s.name.clone(),
                        message: format!("deny ACE on {m}: {message}"),
                    }
                })?;
            }
        }
    }
    let cs = ComputeSystem::create(spec)?;
    let runtime = cs.runtime_id()?;
    let listener =
        HvListener::bind(runtime, vsock_service_id(AGENT_PORT)).map_err(os("bind(AF_HYPERV)"))?;
    cs.start()?;
    let stream = listener
        .accept_timeout(runtime, agent_deadline)
        .map_err(os("accept(AF_HYPERV)"))?;
    Ok((cs, stream))
}
