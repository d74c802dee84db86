//! Applying and checking ACEs and mandatory labels on files and directories.

use std::ffi::c_void;

use windows_sys::Win32::Foundation::{LocalFree, ERROR_SUCCESS};
use windows_sys::Win32::Security::Authorization::{
    ConvertStringSecurityDescriptorToSecurityDescriptorW, GetNamedSecurityInfoW, SetEntriesInAclW,
    SetNamedSecurityInfoW, DENY_ACCESS, EXPLICIT_ACCESS_W, GRANT_ACCESS, REVOKE_ACCESS,
    SDDL_REVISION_1, SE_FILE_OBJECT, TRUSTEE_IS_SID, TRUSTEE_IS_UNKNOWN, TRUSTEE_W,
};
use windows_sys::Win32::Security::{
    EqualSid, GetAce, GetSecurityDescriptorSacl, ACCESS_ALLOWED_ACE, ACE_HEADER, ACL,
    DACL_SECURITY_INFORMATION, INHERITED_ACE, LABEL_SECURITY_INFORMATION, NO_INHERITANCE,
    PSECURITY_DESCRIPTOR, PSID, SUB_CONTAINERS_AND_OBJECTS_INHERIT,
};

use super::sid::{wide, Sid};
use crate::policy::lower::appcontainer::Inherit;
use crate::policy::lower::restricted::{Integrity, LabelPolicy};

const ACCESS_ALLOWED_ACE_TYPE: u8 = 0;
const ACCESS_DENIED_ACE_TYPE: u8 = 1;

/// The three ways a plan changes a DACL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Allow(u32),
    Deny(u32),
    /// Remove every allow ACE of the trustee.
    Strip,
}

fn inherit_flags(path: &str, inherit: Inherit) -> u32 {
    let is_dir = std::fs::metadata(path).is_ok_and(|m| m.is_dir());
    match inherit {
        Inherit::Tree if is_dir => SUB_CONTAINERS_AND_OBJECTS_INHERIT,
        _ => NO_INHERITANCE,
    }
}

/// The DACL of `path`, with the security descriptor that owns it.
struct Dacl {
    sd: PSECURITY_DESCRIPTOR,
    acl: *mut ACL,
}

impl Drop for Dacl {
    fn drop(&mut self) {
        if !self.sd.is_null() {
            // SAFETY: `sd` was LocalAlloc'd by GetNamedSecurityInfoW; freed once.
            unsafe { LocalFree(self.sd) };
        }
    }
}

fn read_dacl(path: &str) -> Result<Dacl, String> {
    let w = wide(path);
    let mut acl: *mut ACL = std::ptr::null_mut();
    let mut sd: PSECURITY_DESCRIPTOR = std::ptr::null_mut();
    // SAFETY: `w` is NUL-terminated; only the DACL is asked for; `acl` points
    // into `sd`, which we own and free in Drop.
    let rc = unsafe {
        GetNamedSecurityInfoW(
            w.as_ptr(),
            SE_FILE_OBJECT,
            DACL_SECURITY_INFORMATION,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &mut acl,
            std::ptr::null_mut(),
            &mut sd,
        )
    };
    if rc != ERROR_SUCCESS {
        return Err(format!(
            "GetNamedSecurityInfoW: {}",
            std::io::Error::from_raw_os_error(rc as i32)
        ));
    }
    Ok(Dacl { sd, acl })
}

/// Whether `path` has an explicit (not inherited) ACE of `kind` for `sid`
/// whose mask includes `mask`.
pub fn has_ace(path: &str, sid: &Sid, deny: bool, mask: u32) -> Result<bool, String> {
    let d = read_dacl(path)?;
    if d.acl.is_null() {
        return Ok(false); // a null DACL: no explicit ACE at all
    }
    // SAFETY: `d.acl` is a valid ACL owned by `d.sd`, alive for this scope.
    let count = unsafe { (*d.acl).AceCount } as u32;
    let want = if deny {
        ACCESS_DENIED_ACE_TYPE
    } else {
        ACCESS_ALLOWED_ACE_TYPE
    };
    for i in 0..count {
        let mut ace: *mut c_void = std::ptr::null_mut();
        // SAFETY: `i` < AceCount; `ace` receives a pointer into the ACL.
        if unsafe { GetAce(d.acl, i, &mut ace) } == 0 {
            continue;
        }
        // SAFETY: every ACE starts with an ACE_HEADER.
        let h: ACE_HEADER = unsafe { *(ace as *const ACE_HEADER) };
        if h.AceType != want || (h.AceFlags as u32 & INHERITED_ACE) != 0 {
            continue;
        }
        let a = ace as *const ACCESS_ALLOWED_ACE;
        // SAFETY: allowed and denied ACEs share ACCESS_ALLOWED_ACE's layout:
        // header, mask, then the SID starting at SidStart.
        let (ace_mask, sid_ptr) = unsafe { ((*a).Mask, std::ptr::addr_of!((*a).SidStart) as PSID) };
        // SAFETY: both SIDs are valid for the duration of the call.
        if ace_mask & mask == mask && unsafe { EqualSid(sid_ptr, sid.as_psid()) } != 0 {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Applies one change to the DACL of `path` (merged with what is there).
pub fn apply(path: &str, sid: &Sid, change: Change, inherit: Inherit) -> Result<(), String> {
    let d = read_dacl(path)?;
    let (mode, mask) = match change {
        Change::Allow(m) => (GRANT_ACCESS, m),
        Change::Deny(m) => (DENY_ACCESS, m),
        Change::Strip => (REVOKE_ACCESS, 0),
    };
    let ea = EXPLICIT_ACCESS_W {
        grfAccessPermissions: mask,
        grfAccessMode: mode,
        grfInheritance: inherit_flags(path, inherit),
        Trustee: TRUSTEE_W {
            pMultipleTrustee: std::ptr::null_mut(),
            MultipleTrusteeOperation: 0,
            TrusteeForm: TRUSTEE_IS_SID,
            TrusteeType: TRUSTEE_IS_UNKNOWN,
            ptstrName: sid.as_psid() as *mut u16,
        },
    };
    let mut new_acl: *mut ACL = std::ptr::null_mut();
    // SAFETY: one valid EXPLICIT_ACCESS_W whose SID outlives the call; the old
    // ACL is owned by `d`; `new_acl` receives a LocalAlloc'd ACL.
    let rc = unsafe { SetEntriesInAclW(1, &ea, d.acl, &mut new_acl) };
    if rc != ERROR_SUCCESS {
        return Err(format!(
            "SetEntriesInAclW: {}",
            std::io::Error::from_raw_os_error(rc as i32)
        ));
    }
    let w = wide(path);
    // SAFETY: `w` is NUL-terminated, `new_acl` is a valid ACL; only the DACL
    // is set (owner, group and SACL untouched).
    let rc = unsafe {
        SetNamedSecurityInfoW(
            w.as_ptr(),
            SE_FILE_OBJECT,
            DACL_SECURITY_INFORMATION,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            new_acl,
            std::ptr::null(),
        )
    };
    // SAFETY: `new_acl` was LocalAlloc'd by SetEntriesInAclW; freed once.
    unsafe { LocalFree(new_acl as *mut c_void) };
    if rc != ERROR_SUCCESS {
        return Err(format!(
            "SetNamedSecurityInfoW: {}",
            std::io::Error::from_raw_os_error(rc as i32)
        ));
    }
    Ok(())
}

/// The SDDL of a mandatory label ACE. Built from fixed tokens only.
pub fn label_sddl(level: Integrity, policy: LabelPolicy, tree: bool) -> String {
    let mut p = String::new();
    if policy.no_read_up {
        p.push_str("NR");
    }
    if policy.no_write_up {
        p.push_str("NW");
    }
    if policy.no_execute_up {
        p.push_str("NX");
    }
    let lvl = match level {
        Integrity::Low => "LW",
        Integrity::Medium => "ME",
    };
    let flags = if tree { "OICI" } else { "" };
    format!("S:(ML;{flags};{p};;;{lvl})")
}

/// Sets the mandatory label of `path` (needs `WRITE_OWNER`: the user owns
/// their files; labels above the caller's own level are refused by Windows).
pub fn set_label(
    path: &str,
    level: Integrity,
    policy: LabelPolicy,
    inherit: Inherit,
) -> Result<(), String> {
    let tree = inherit == Inherit::Tree && std::fs::metadata(path).is_ok_and(|m| m.is_dir());
    let sddl = wide(label_sddl(level, policy, tree));
    let mut sd: PSECURITY_DESCRIPTOR = std::ptr::null_mut();
    // SAFETY: `sddl` is NUL-terminated; `sd` receives a LocalAlloc'd SD.
    let ok = unsafe {
        ConvertStringSecurityDescriptorToSecurityDescriptorW(
            sddl.as_ptr(),
            SDDL_REVISION_1,
            &mut sd,
            std::ptr::null_mut(),
        )
    };
    if ok == 0 {
        return Err(super::sid::last_error(
            "ConvertStringSecurityDescriptorToSecurityDescriptorW",
        ));
    }
    let mut present = 0;
    let mut defaulted = 0;
    let mut sacl: *mut ACL = std::ptr::null_mut();
    // SAFETY: `sd` is a valid SD from the call above; `sacl` points into it.
    let ok = unsafe { GetSecurityDescriptorSacl(sd, &mut present, &mut sacl, &mut defaulted) };
    let result = if ok == 0 || present == 0 {
        Err(super::sid::last_error("GetSecurityDescriptorSacl"))
    } else {
        let w = wide(path);
        // SAFETY: `w` is NUL-terminated; `sacl` is valid while `sd` lives;
        // only the label is set.
        let rc = unsafe {
            SetNamedSecurityInfoW(
                w.as_ptr(),
                SE_FILE_OBJECT,
                LABEL_SECURITY_INFORMATION,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null(),
                sacl,
            )
        };
        if rc == ERROR_SUCCESS {
            Ok(())
        } else {
            Err(format!(
                "SetNamedSecurityInfoW(label): {}",
                std::io::Error::from_raw_os_error(rc as i32)
            ))
        }
    };
    // SAFETY: `sd` was LocalAlloc'd by the conversion; freed once, after the
    // last use of `sacl`.
    unsafe { LocalFree(sd) };
    result
}
