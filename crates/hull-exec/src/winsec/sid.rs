//! SIDs hull derives (AppContainer package SIDs, capability SIDs, well-known
//! SIDs), owned with the right deallocator, and wide strings.

use std::ffi::{c_void, OsStr};
use std::os::windows::ffi::OsStrExt;

use windows_sys::Win32::Foundation::{GetLastError, LocalFree, ERROR_ALREADY_EXISTS};
use windows_sys::Win32::Security::Authorization::{ConvertSidToStringSidW, ConvertStringSidToSidW};
use windows_sys::Win32::Security::Isolation::{
    CreateAppContainerProfile, DeleteAppContainerProfile, DeriveAppContainerSidFromAppContainerName,
};
use windows_sys::Win32::Security::{
    CopySid, CreateWellKnownSid, DeriveCapabilitySidsFromName, FreeSid, GetLengthSid, IsValidSid,
    PSID, WELL_KNOWN_SID_TYPE,
};

use crate::policy::lower::appcontainer::Trustee;

/// A NUL-terminated UTF-16 string.
pub fn wide(s: impl AsRef<OsStr>) -> Vec<u16> {
    s.as_ref().encode_wide().chain(std::iter::once(0)).collect()
}

/// A SID in memory hull owns (copied out of whatever the API allocated, so
/// there is one way to free it: drop).
#[derive(Debug, Clone)]
pub struct Sid(Vec<u8>);

impl Sid {
    pub fn as_psid(&self) -> PSID {
        self.0.as_ptr() as PSID
    }

    /// Copies a SID the caller keeps ownership of.
    ///
    /// # Safety
    /// `p` must point to a valid SID for the duration of the call.
    pub unsafe fn copy_from(p: PSID) -> Result<Sid, String> {
        // SAFETY: the caller guarantees `p` is a valid SID.
        if unsafe { IsValidSid(p) } == 0 {
            return Err("invalid SID".into());
        }
        // SAFETY: `p` is valid (checked above).
        let len = unsafe { GetLengthSid(p) };
        let mut buf = vec![0u8; len as usize];
        // SAFETY: `buf` has `len` bytes, the length GetLengthSid reported.
        if unsafe { CopySid(len, buf.as_mut_ptr() as PSID, p) } == 0 {
            return Err(last_error("CopySid"));
        }
        Ok(Sid(buf))
    }

    /// A well-known SID (`WinLowLabelSid`, `WinLocalSystemSid`, ...).
    pub fn well_known(kind: WELL_KNOWN_SID_TYPE) -> Result<Sid, String> {
        let mut size: u32 = 68; // SECURITY_MAX_SID_SIZE
        let mut buf = vec![0u8; size as usize];
        // SAFETY: `buf` holds `size` bytes; no domain SID is needed for
        // these types (null is allowed).
        let ok = unsafe {
            CreateWellKnownSid(
                kind,
                std::ptr::null_mut(),
                buf.as_mut_ptr() as PSID,
                &mut size,
            )
        };
        if ok == 0 {
            return Err(last_error("CreateWellKnownSid"));
        }
        buf.truncate(size as usize);
        Ok(Sid(buf))
    }

    /// Parses the `S-1-...` form.
    pub fn from_string(s: &str) -> Result<Sid, String> {
        let w = wide(s);
        let mut p: PSID = std::ptr::null_mut();
        // SAFETY: `w` is NUL-terminated; `p` receives a LocalAlloc'd SID.
        if unsafe { ConvertStringSidToSidW(w.as_ptr(), &mut p) } == 0 {
            return Err(last_error("ConvertStringSidToSidW"));
        }
        // SAFETY: `p` is a valid SID from the call.
        let out = unsafe { Sid::copy_from(p) };
        // SAFETY: LocalAlloc'd by the call; freed once.
        unsafe { LocalFree(p) };
        out
    }

    /// The `S-1-...` form.
    pub fn to_string_sid(&self) -> Result<String, String> {
        let mut out: *mut u16 = std::ptr::null_mut();
        // SAFETY: `self` is a valid SID; `out` receives a LocalAlloc'd string.
        if unsafe { ConvertSidToStringSidW(self.as_psid(), &mut out) } == 0 {
            return Err(last_error("ConvertSidToStringSidW"));
        }
        // SAFETY: `out` is a NUL-terminated UTF-16 string from the call above.
        let s = unsafe { from_wide_ptr(out) };
        // SAFETY: `out` was allocated by LocalAlloc and is freed once.
        unsafe { LocalFree(out as *mut c_void) };
        Ok(s)
    }
}

/// Reads a NUL-terminated UTF-16 string.
///
/// # Safety
/// `p` must be null or point to a NUL-terminated UTF-16 string.
pub unsafe fn from_wide_ptr(p: *const u16) -> String {
    if p.is_null() {
        return String::new();
    }
    let mut n = 0usize;
    // SAFETY: the string is NUL-terminated (caller), so every read up to and
    // including the NUL is in bounds.
    while unsafe { *p.add(n) } != 0 {
        n += 1;
    }
    // SAFETY: `n` u16s were just read from `p`.
    String::from_utf16_lossy(unsafe { std::slice::from_raw_parts(p, n) })
}

/// `GetLastError` as text, naming the call.
pub fn last_error(call: &str) -> String {
    // SAFETY: GetLastError has no preconditions.
    let code = unsafe { GetLastError() };
    format!("{call}: {}", std::io::Error::from_raw_os_error(code as i32))
}

/// The package SID of an AppContainer profile, creating the profile if it
/// does not exist yet.
pub fn appcontainer_sid(name: &str, create: bool) -> Result<Sid, String> {
    let wname = wide(name);
    let mut sid: PSID = std::ptr::null_mut();
    if create {
        let desc = wide("hull sandbox workspace");
        // SAFETY: the strings are NUL-terminated and live across the call; no
        // capabilities are passed (null, 0); `sid` receives a SID to FreeSid.
        let hr = unsafe {
            CreateAppContainerProfile(
                wname.as_ptr(),
                wname.as_ptr(),
                desc.as_ptr(),
                std::ptr::null(),
                0,
                &mut sid,
            )
        };
        let already = (0x8007_0000u32 | ERROR_ALREADY_EXISTS) as i32;
        if hr >= 0 {
            // SAFETY: on success `sid` is a valid SID from the call.
            let out = unsafe { Sid::copy_from(sid) };
            // SAFETY: the profile APIs allocate the SID for FreeSid; freed once.
            unsafe { FreeSid(sid) };
            return out;
        }
        if hr != already {
            return Err(format!(
                "CreateAppContainerProfile({name}): HRESULT 0x{:08x}",
                hr as u32
            ));
        }
    }
    // SAFETY: `wname` is NUL-terminated; `sid` receives a SID to FreeSid.
    let hr = unsafe { DeriveAppContainerSidFromAppContainerName(wname.as_ptr(), &mut sid) };
    if hr < 0 {
        return Err(format!(
            "DeriveAppContainerSidFromAppContainerName({name}): HRESULT 0x{:08x}",
            hr as u32
        ));
    }
    // SAFETY: on success `sid` is a valid SID.
    let out = unsafe { Sid::copy_from(sid) };
    // SAFETY: allocated for FreeSid by the call; freed once.
    unsafe { FreeSid(sid) };
    out
}

/// The capability SID of a capability name (`DeriveCapabilitySidsFromName`).
pub fn capability_sid(name: &str) -> Result<Sid, String> {
    let wname = wide(name);
    let mut groups: *mut PSID = std::ptr::null_mut();
    let mut ngroups: u32 = 0;
    let mut caps: *mut PSID = std::ptr::null_mut();
    let mut ncaps: u32 = 0;
    // SAFETY: `wname` is NUL-terminated; the four out-pointers are valid and
    // receive LocalAlloc'd arrays of LocalAlloc'd SIDs.
    let ok = unsafe {
        DeriveCapabilitySidsFromName(
            wname.as_ptr(),
            &mut groups,
            &mut ngroups,
            &mut caps,
            &mut ncaps,
        )
    };
    if ok == 0 {
        return Err(last_error("DeriveCapabilitySidsFromName"));
    }
    let out = if ncaps >= 1 && !caps.is_null() {
        // SAFETY: `caps` holds `ncaps` >= 1 valid SIDs.
        unsafe { Sid::copy_from(*caps) }
    } else {
        Err(format!(
            "DeriveCapabilitySidsFromName({name}) returned no capability SID"
        ))
    };
    // SAFETY: every element and both arrays were LocalAlloc'd by the call,
    // and each is freed exactly once here.
    unsafe {
        for (arr, n) in [(groups, ngroups), (caps, ncaps)] {
            if !arr.is_null() {
                for i in 0..n as usize {
                    LocalFree(*arr.add(i));
                }
                LocalFree(arr as *mut c_void);
            }
        }
    }
    out
}

/// The SID of a plan trustee.
pub fn trustee_sid(t: &Trustee) -> Result<Sid, String> {
    match t {
        Trustee::Package(n) => appcontainer_sid(n, true),
        Trustee::Capability(n) => capability_sid(n),
    }
}

/// Deletes an AppContainer profile (the probe's own).
pub fn delete_appcontainer(name: &str) {
    let w = wide(name);
    // SAFETY: `w` is NUL-terminated; failure (already gone) is harmless.
    unsafe { DeleteAppContainerProfile(w.as_ptr()) };
}
