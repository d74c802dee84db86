//! Starting the sandboxed process: restricted token, Job Object, private
//! desktop, and `CreateProcess*` with an attribute list (security
//! capabilities for AppContainer, an explicit inherited-handle list).

use std::ffi::c_void;

use windows_sys::Win32::Foundation::{
    CloseHandle, LocalFree, SetHandleInformation, GENERIC_ALL, HANDLE, HANDLE_FLAG_INHERIT,
    INVALID_HANDLE_VALUE, WAIT_OBJECT_0,
};
use windows_sys::Win32::Security::Authorization::{
    ConvertStringSecurityDescriptorToSecurityDescriptorW, SetEntriesInAclW, EXPLICIT_ACCESS_W,
    SDDL_REVISION_1, SET_ACCESS, TRUSTEE_IS_SID, TRUSTEE_IS_UNKNOWN, TRUSTEE_W,
};
use windows_sys::Win32::Security::{
    CreateRestrictedToken, GetTokenInformation, SetTokenInformation, TokenDefaultDacl, TokenGroups,
    TokenIntegrityLevel, TokenUser, WinLocalSystemSid, WinLowLabelSid, ACL, DISABLE_MAX_PRIVILEGE,
    LUA_TOKEN, NO_INHERITANCE, PSECURITY_DESCRIPTOR, SECURITY_ATTRIBUTES, SECURITY_CAPABILITIES,
    SID_AND_ATTRIBUTES, TOKEN_ADJUST_DEFAULT, TOKEN_ADJUST_SESSIONID, TOKEN_ASSIGN_PRIMARY,
    TOKEN_DEFAULT_DACL, TOKEN_DUPLICATE, TOKEN_GROUPS, TOKEN_MANDATORY_LABEL, TOKEN_QUERY,
    TOKEN_USER, WRITE_RESTRICTED,
};
use windows_sys::Win32::System::Console::{
    GetStdHandle, STD_ERROR_HANDLE, STD_INPUT_HANDLE, STD_OUTPUT_HANDLE,
};
use windows_sys::Win32::System::JobObjects::{
    AssignProcessToJobObject, CreateJobObjectW, JobObjectBasicUIRestrictions,
    JobObjectExtendedLimitInformation, SetInformationJobObject, JOBOBJECT_BASIC_UI_RESTRICTIONS,
    JOBOBJECT_EXTENDED_LIMIT_INFORMATION, JOB_OBJECT_LIMIT_ACTIVE_PROCESS,
    JOB_OBJECT_LIMIT_DIE_ON_UNHANDLED_EXCEPTION, JOB_OBJECT_LIMIT_JOB_MEMORY,
    JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE, JOB_OBJECT_UILIMIT_DESKTOP,
    JOB_OBJECT_UILIMIT_DISPLAYSETTINGS, JOB_OBJECT_UILIMIT_EXITWINDOWS,
    JOB_OBJECT_UILIMIT_GLOBALATOMS, JOB_OBJECT_UILIMIT_HANDLES, JOB_OBJECT_UILIMIT_READCLIPBOARD,
    JOB_OBJECT_UILIMIT_SYSTEMPARAMETERS, JOB_OBJECT_UILIMIT_WRITECLIPBOARD,
};
use windows_sys::Win32::System::StationsAndDesktops::{CloseDesktop, CreateDesktopW, HDESK};
use windows_sys::Win32::System::Threading::{
    CreateProcessAsUserW, CreateProcessW, DeleteProcThreadAttributeList, GetCurrentProcess,
    GetExitCodeProcess, InitializeProcThreadAttributeList, OpenProcessToken, ResumeThread,
    TerminateProcess, UpdateProcThreadAttribute, WaitForSingleObject, CREATE_SUSPENDED,
    CREATE_UNICODE_ENVIRONMENT, EXTENDED_STARTUPINFO_PRESENT, INFINITE,
    LPPROC_THREAD_ATTRIBUTE_LIST, PROCESS_INFORMATION, PROC_THREAD_ATTRIBUTE_HANDLE_LIST,
    PROC_THREAD_ATTRIBUTE_SECURITY_CAPABILITIES, STARTF_USESTDHANDLES, STARTUPINFOEXW,
};

use crate::winsec::sid::{last_error, wide, Sid};

const SE_GROUP_INTEGRITY: u32 = 0x0000_0020;
const SE_GROUP_LOGON_ID: u32 = 0xC000_0000;
/// All desktop rights (`DESKTOP_*` 0x01FF) plus standard rights.
const DESKTOP_ALL: u32 = 0x000F_01FF;

/// A handle closed on drop.
#[derive(Debug)]
pub struct Owned(pub HANDLE);

impl Drop for Owned {
    fn drop(&mut self) {
        if !self.0.is_null() && self.0 != INVALID_HANDLE_VALUE {
            // SAFETY: the handle is owned by this value and closed once.
            unsafe { CloseHandle(self.0) };
        }
    }
}

/// Reads a variable-size token information class into an aligned buffer.
fn token_info(token: HANDLE, class: i32) -> Result<Vec<u64>, String> {
    let mut needed: u32 = 0;
    // SAFETY: a size query (null buffer, length 0) only writes `needed`.
    unsafe { GetTokenInformation(token, class, std::ptr::null_mut(), 0, &mut needed) };
    if needed == 0 {
        return Err(last_error("GetTokenInformation(size)"));
    }
    let mut buf = vec![0u64; (needed as usize).div_ceil(8)];
    // SAFETY: `buf` holds at least `needed` bytes and is 8-byte aligned, as
    // the TOKEN_* structures need.
    let ok = unsafe {
        GetTokenInformation(
            token,
            class,
            buf.as_mut_ptr() as *mut c_void,
            needed,
            &mut needed,
        )
    };
    if ok == 0 {
        return Err(last_error("GetTokenInformation"));
    }
    Ok(buf)
}

/// The current process token with the rights restriction needs.
fn own_token() -> Result<Owned, String> {
    let mut h: HANDLE = std::ptr::null_mut();
    let want = TOKEN_DUPLICATE
        | TOKEN_QUERY
        | TOKEN_ASSIGN_PRIMARY
        | TOKEN_ADJUST_DEFAULT
        | TOKEN_ADJUST_SESSIONID;
    // SAFETY: the pseudo-handle of the current process is always valid.
    if unsafe { OpenProcessToken(GetCurrentProcess(), want, &mut h) } == 0 {
        return Err(last_error("OpenProcessToken"));
    }
    Ok(Owned(h))
}

fn user_and_logon(token: HANDLE) -> Result<(Sid, Sid), String> {
    let u = token_info(token, TokenUser)?;
    // SAFETY: the buffer holds a TOKEN_USER written by the call.
    let user = unsafe { Sid::copy_from((*(u.as_ptr() as *const TOKEN_USER)).User.Sid)? };
    let g = token_info(token, TokenGroups)?;
    let groups = g.as_ptr() as *const TOKEN_GROUPS;
    // SAFETY: the buffer holds a TOKEN_GROUPS with GroupCount entries that
    // follow the count in the same buffer.
    let logon = unsafe {
        let n = (*groups).GroupCount as usize;
        let first = std::ptr::addr_of!((*groups).Groups) as *const SID_AND_ATTRIBUTES;
        (0..n)
            .map(|i| *first.add(i))
            .find(|g| g.Attributes & SE_GROUP_LOGON_ID == SE_GROUP_LOGON_ID)
            .map(|g| Sid::copy_from(g.Sid))
    };
    match logon {
        Some(s) => Ok((user, s?)),
        None => Err("the token has no logon SID".into()),
    }
}

/// The tier-1 token: restricted copy of our own, write-restricted to
/// `restricting` plus the logon SID, Low integrity, default DACL granting
/// the user, SYSTEM and `dacl_cap`.
pub fn restricted_token(restricting: &[Sid], dacl_cap: &Sid) -> Result<Owned, String> {
    let base = own_token()?;
    let (user, logon) = user_and_logon(base.0)?;
    let mut sids: Vec<SID_AND_ATTRIBUTES> = restricting
        .iter()
        .chain(std::iter::once(&logon))
        .map(|s| SID_AND_ATTRIBUTES {
            Sid: s.as_psid(),
            Attributes: 0,
        })
        .collect();
    let mut new: HANDLE = std::ptr::null_mut();
    // SAFETY: `base` is a valid token; `sids` points to valid SIDs owned by
    // `restricting` and `logon`, which outlive the call; nothing is disabled
    // or deleted explicitly (DISABLE_MAX_PRIVILEGE removes all privileges but
    // SeChangeNotifyPrivilege).
    let ok = unsafe {
        CreateRestrictedToken(
            base.0,
            DISABLE_MAX_PRIVILEGE | LUA_TOKEN | WRITE_RESTRICTED,
            0,
            std::ptr::null(),
            0,
            std::ptr::null(),
            sids.len() as u32,
            sids.as_mut_ptr(),
            &mut new,
        )
    };
    if ok == 0 {
        return Err(last_error("CreateRestrictedToken"));
    }
    let token = Owned(new);

    let low = Sid::well_known(WinLowLabelSid)?;
    let label = TOKEN_MANDATORY_LABEL {
        Label: SID_AND_ATTRIBUTES {
            Sid: low.as_psid(),
            Attributes: SE_GROUP_INTEGRITY,
        },
    };
    // SAFETY: `label` and the SID it points to live across the call; the
    // length covers the structure (the SID is referenced, not inlined).
    let ok = unsafe {
        SetTokenInformation(
            token.0,
            TokenIntegrityLevel,
            &label as *const _ as *const c_void,
            std::mem::size_of::<TOKEN_MANDATORY_LABEL>() as u32,
        )
    };
    if ok == 0 {
        return Err(last_error("SetTokenInformation(TokenIntegrityLevel)"));
    }

    let system = Sid::well_known(WinLocalSystemSid)?;
    let entries: Vec<EXPLICIT_ACCESS_W> = [&user, &system, dacl_cap]
        .iter()
        .map(|s| EXPLICIT_ACCESS_W {
            grfAccessPermissions: GENERIC_ALL,
            grfAccessMode: SET_ACCESS,
            grfInheritance: NO_INHERITANCE,
            Trustee: TRUSTEE_W {
                pMultipleTrustee: std::ptr::null_mut(),
                MultipleTrusteeOperation: 0,
                TrusteeForm: TRUSTEE_IS_SID,
                TrusteeType: TRUSTEE_IS_UNKNOWN,
                ptstrName: s.as_psid() as *mut u16,
            },
        })
        .collect();
    let mut acl: *mut ACL = std::ptr::null_mut();
    // SAFETY: `entries` holds valid EXPLICIT_ACCESS_W with live SIDs; no old
    // ACL; `acl` receives a LocalAlloc'd ACL freed below.
    let rc = unsafe {
        SetEntriesInAclW(
            entries.len() as u32,
            entries.as_ptr(),
            std::ptr::null(),
            &mut acl,
        )
    };
    if rc != 0 {
        return Err(format!(
            "SetEntriesInAclW(default dacl): {}",
            std::io::Error::from_raw_os_error(rc as i32)
        ));
    }
    let dd = TOKEN_DEFAULT_DACL { DefaultDacl: acl };
    // SAFETY: `dd` points to a valid ACL for the duration of the call.
    let ok = unsafe {
        SetTokenInformation(
            token.0,
            TokenDefaultDacl,
            &dd as *const _ as *const c_void,
            std::mem::size_of::<TOKEN_DEFAULT_DACL>() as u32,
        )
    };
    // SAFETY: `acl` was LocalAlloc'd by SetEntriesInAclW; the token keeps its
    // own copy; freed once.
    unsafe { LocalFree(acl as *mut c_void) };
    if ok == 0 {
        return Err(last_error("SetTokenInformation(TokenDefaultDacl)"));
    }
    Ok(token)
}

/// A Job Object that kills its tree when the last handle closes.
pub fn job(memory: Option<u64>, processes: Option<u64>, ui: bool) -> Result<Owned, String> {
    // SAFETY: no attributes, no name: a new anonymous job.
    let h = unsafe { CreateJobObjectW(std::ptr::null(), std::ptr::null()) };
    if h.is_null() {
        return Err(last_error("CreateJobObjectW"));
    }
    let job = Owned(h);
    // SAFETY: the structure is plain data; zero is its documented default.
    let mut info: JOBOBJECT_EXTENDED_LIMIT_INFORMATION = unsafe { std::mem::zeroed() };
    info.BasicLimitInformation.LimitFlags =
        JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE | JOB_OBJECT_LIMIT_DIE_ON_UNHANDLED_EXCEPTION;
    if let Some(m) = memory {
        info.BasicLimitInformation.LimitFlags |= JOB_OBJECT_LIMIT_JOB_MEMORY;
        info.JobMemoryLimit = usize::try_from(m).unwrap_or(usize::MAX);
    }
    if let Some(p) = processes {
        info.BasicLimitInformation.LimitFlags |= JOB_OBJECT_LIMIT_ACTIVE_PROCESS;
        info.BasicLimitInformation.ActiveProcessLimit = u32::try_from(p).unwrap_or(u32::MAX);
    }
    // SAFETY: `info` is a valid structure of the size passed.
    let ok = unsafe {
        SetInformationJobObject(
            job.0,
            JobObjectExtendedLimitInformation,
            &info as *const _ as *const c_void,
            std::mem::size_of::<JOBOBJECT_EXTENDED_LIMIT_INFORMATION>() as u32,
        )
    };
    if ok == 0 {
        return Err(last_error("SetInformationJobObject(limits)"));
    }
    if ui {
        let r = JOBOBJECT_BASIC_UI_RESTRICTIONS {
            UIRestrictionsClass: JOB_OBJECT_UILIMIT_DESKTOP
                | JOB_OBJECT_UILIMIT_DISPLAYSETTINGS
                | JOB_OBJECT_UILIMIT_EXITWINDOWS
                | JOB_OBJECT_UILIMIT_GLOBALATOMS
                | JOB_OBJECT_UILIMIT_HANDLES
                | JOB_OBJECT_UILIMIT_READCLIPBOARD
                | JOB_OBJECT_UILIMIT_SYSTEMPARAMETERS
                | JOB_OBJECT_UILIMIT_WRITECLIPBOARD,
        };
        // SAFETY: `r` is a valid structure of the size passed.
        let ok = unsafe {
            SetInformationJobObject(
                job.0,
                JobObjectBasicUIRestrictions,
                &r as *const _ as *const c_void,
                std::mem::size_of::<JOBOBJECT_BASIC_UI_RESTRICTIONS>() as u32,
            )
        };
        if ok == 0 {
            return Err(last_error("SetInformationJobObject(ui)"));
        }
    }
    Ok(job)
}

/// A desktop closed on drop.
#[derive(Debug)]
pub struct Desktop(HDESK, pub Vec<u16>);

impl Drop for Desktop {
    fn drop(&mut self) {
        // SAFETY: the desktop handle is owned by this value and closed once.
        unsafe { CloseDesktop(self.0) };
    }
}

/// A private desktop in the current window station, usable only by the
/// user, SYSTEM and `sandbox` (the package or capability SID). Whether the
/// sandboxed process also needs an ACE on the window station is not
/// verified (no Windows host here).
pub fn private_desktop(name: &str, sandbox: &Sid) -> Result<Desktop, String> {
    let (user, _) = user_and_logon(own_token()?.0)?;
    // SIDs in string form come from ConvertSidToStringSidW only.
    // Labelled Low: both sandboxed identities run at Low integrity, and a
    // Medium label (the default) would refuse them every write-type access.
    let sddl = format!(
        "D:P(A;;GA;;;{})(A;;GA;;;SY)(A;;GA;;;{})S:(ML;;NW;;;LW)",
        user.to_string_sid()?,
        sandbox.to_string_sid()?
    );
    let wsddl = wide(&sddl);
    let mut sd: PSECURITY_DESCRIPTOR = std::ptr::null_mut();
    // SAFETY: `wsddl` is NUL-terminated; `sd` receives a LocalAlloc'd SD.
    let ok = unsafe {
        ConvertStringSecurityDescriptorToSecurityDescriptorW(
            wsddl.as_ptr(),
            SDDL_REVISION_1,
            &mut sd,
            std::ptr::null_mut(),
        )
    };
    if ok == 0 {
        return Err(last_error(
            "ConvertStringSecurityDescriptorToSecurityDescriptorW(desktop)",
        ));
    }
    let sa = SECURITY_ATTRIBUTES {
        nLength: std::mem::size_of::<SECURITY_ATTRIBUTES>() as u32,
        lpSecurityDescriptor: sd,
        bInheritHandle: 0,
    };
    let wname = wide(name);
    // SAFETY: `wname` is NUL-terminated; no device or mode; `sa` and its SD
    // are valid across the call.
    let h = unsafe {
        CreateDesktopW(
            wname.as_ptr(),
            std::ptr::null(),
            std::ptr::null(),
            0,
            DESKTOP_ALL,
            &sa,
        )
    };
    // SAFETY: `sd` was LocalAlloc'd by the conversion; the desktop keeps its
    // own copy; freed once.
    unsafe { LocalFree(sd) };
    if h.is_null() {
        return Err(last_error("CreateDesktopW"));
    }
    Ok(Desktop(h, wname))
}

/// How the child is created.
pub enum Identity<'a> {
    /// AppContainer: package SID plus capability SIDs.
    AppContainer {
        package: &'a Sid,
        capabilities: &'a [Sid],
    },
    /// A restricted primary token.
    Token(&'a Owned),
}

/// An initialized attribute list, deleted on drop.
struct AttrList {
    buf: Vec<u64>,
}

impl AttrList {
    fn new(count: u32) -> Result<AttrList, String> {
        let mut size: usize = 0;
        // SAFETY: a size query with a null list only writes `size`.
        unsafe { InitializeProcThreadAttributeList(std::ptr::null_mut(), count, 0, &mut size) };
        if size == 0 {
            return Err(last_error("InitializeProcThreadAttributeList(size)"));
        }
        let mut buf = vec![0u64; size.div_ceil(8)];
        // SAFETY: `buf` holds at least `size` bytes, 8-byte aligned.
        let ok = unsafe {
            InitializeProcThreadAttributeList(
                buf.as_mut_ptr() as LPPROC_THREAD_ATTRIBUTE_LIST,
                count,
                0,
                &mut size,
            )
        };
        if ok == 0 {
            return Err(last_error("InitializeProcThreadAttributeList"));
        }
        Ok(AttrList { buf })
    }

    fn ptr(&mut self) -> LPPROC_THREAD_ATTRIBUTE_LIST {
        self.buf.as_mut_ptr() as LPPROC_THREAD_ATTRIBUTE_LIST
    }

    /// # Safety
    /// `value` must stay valid and unmoved until the list is dropped.
    unsafe fn set(&mut self, attr: u32, value: *const c_void, size: usize) -> Result<(), String> {
        // SAFETY: the list is initialized; the caller keeps `value` alive.
        let ok = unsafe {
            UpdateProcThreadAttribute(
                self.ptr(),
                0,
                attr as usize,
                value,
                size,
                std::ptr::null_mut(),
                std::ptr::null(),
            )
        };
        if ok == 0 {
            return Err(last_error("UpdateProcThreadAttribute"));
        }
        Ok(())
    }
}

impl Drop for AttrList {
    fn drop(&mut self) {
        // SAFETY: the list was initialized in `new` and is deleted once.
        unsafe { DeleteProcThreadAttributeList(self.ptr()) };
    }
}

/// Starts `cmdline` suspended with `identity`, assigns it to `job`, resumes
/// it, waits, and returns its exit code. If it cannot be put in the job it
/// is terminated before it ran a single instruction.
pub fn run(
    identity: Identity<'_>,
    cmdline: &str,
    cwd: &std::path::Path,
    desktop: Option<&Desktop>,
    job: &Owned,
) -> Result<u32, String> {
    // The three standard handles, inheritable, each listed once.
    let mut handles: Vec<HANDLE> = Vec::new();
    for which in [STD_INPUT_HANDLE, STD_OUTPUT_HANDLE, STD_ERROR_HANDLE] {
        // SAFETY: GetStdHandle has no preconditions.
        let h = unsafe { GetStdHandle(which) };
        if !h.is_null() && h != INVALID_HANDLE_VALUE && !handles.contains(&h) {
            // SAFETY: `h` is a valid handle of this process.
            unsafe { SetHandleInformation(h, HANDLE_FLAG_INHERIT, HANDLE_FLAG_INHERIT) };
            handles.push(h);
        }
    }
    let mut attrs = AttrList::new(2)?;
    let caps_attrs: Vec<SID_AND_ATTRIBUTES>;
    let sec_caps: SECURITY_CAPABILITIES;
    if let Identity::AppContainer {
        package,
        capabilities,
    } = &identity
    {
        caps_attrs = capabilities
            .iter()
            .map(|c| SID_AND_ATTRIBUTES {
                Sid: c.as_psid(),
                Attributes: 0x0000_0004, // SE_GROUP_ENABLED
            })
            .collect();
        sec_caps = SECURITY_CAPABILITIES {
            AppContainerSid: package.as_psid(),
            Capabilities: caps_attrs.as_ptr() as *mut SID_AND_ATTRIBUTES,
            CapabilityCount: caps_attrs.len() as u32,
            Reserved: 0,
        };
        // SAFETY: `sec_caps` and `caps_attrs` live until after CreateProcess
        // and the list is dropped after them (declared before `attrs` drops).
        unsafe {
            attrs.set(
                PROC_THREAD_ATTRIBUTE_SECURITY_CAPABILITIES,
                &sec_caps as *const _ as *const c_void,
                std::mem::size_of::<SECURITY_CAPABILITIES>(),
            )?;
        }
    }
    if !handles.is_empty() {
        // SAFETY: `handles` lives until after CreateProcess.
        unsafe {
            attrs.set(
                PROC_THREAD_ATTRIBUTE_HANDLE_LIST,
                handles.as_ptr() as *const c_void,
                handles.len() * std::mem::size_of::<HANDLE>(),
            )?;
        }
    }
    // SAFETY: plain data; zero is the documented default.
    let mut si: STARTUPINFOEXW = unsafe { std::mem::zeroed() };
    si.StartupInfo.cb = std::mem::size_of::<STARTUPINFOEXW>() as u32;
    si.StartupInfo.dwFlags = STARTF_USESTDHANDLES;
    // SAFETY: GetStdHandle has no preconditions.
    unsafe {
        si.StartupInfo.hStdInput = GetStdHandle(STD_INPUT_HANDLE);
        si.StartupInfo.hStdOutput = GetStdHandle(STD_OUTPUT_HANDLE);
        si.StartupInfo.hStdError = GetStdHandle(STD_ERROR_HANDLE);
    }
    if let Some(d) = desktop {
        si.StartupInfo.lpDesktop = d.1.as_ptr() as *mut u16;
    }
    si.lpAttributeList = attrs.ptr();
    let mut cmd = wide(cmdline);
    let wcwd = wide(cwd.as_os_str());
    // SAFETY: plain data, filled by CreateProcess.
    let mut pi: PROCESS_INFORMATION = unsafe { std::mem::zeroed() };
    let flags = EXTENDED_STARTUPINFO_PRESENT | CREATE_SUSPENDED | CREATE_UNICODE_ENVIRONMENT;
    let ok = match &identity {
        // SAFETY: `cmd` is a mutable NUL-terminated buffer as CreateProcessW
        // requires; `si` (with its attribute list) and `wcwd` outlive the
        // call; the environment is inherited (null).
        Identity::AppContainer { .. } => unsafe {
            CreateProcessW(
                std::ptr::null(),
                cmd.as_mut_ptr(),
                std::ptr::null(),
                std::ptr::null(),
                1,
                flags,
                std::ptr::null(),
                wcwd.as_ptr(),
                &si.StartupInfo,
                &mut pi,
            )
        },
        // SAFETY: as above, with a primary token that is a restricted copy
        // of our own (no SE_ASSIGNPRIMARYTOKEN privilege is needed for that).
        Identity::Token(t) => unsafe {
            CreateProcessAsUserW(
                t.0,
                std::ptr::null(),
                cmd.as_mut_ptr(),
                std::ptr::null(),
                std::ptr::null(),
                1,
                flags,
                std::ptr::null(),
                wcwd.as_ptr(),
                &si.StartupInfo,
                &mut pi,
            )
        },
    };
    if ok == 0 {
        return Err(last_error("CreateProcess"));
    }
    let process = Owned(pi.hProcess);
    let thread = Owned(pi.hThread);
    // SAFETY: both handles are valid (just created).
    if unsafe { AssignProcessToJobObject(job.0, process.0) } == 0 {
        let e = last_error("AssignProcessToJobObject");
        // SAFETY: the suspended process never ran; it is ended here.
        unsafe { TerminateProcess(process.0, 1) };
        return Err(e);
    }
    // SAFETY: the thread handle is valid; it was created suspended.
    if unsafe { ResumeThread(thread.0) } == u32::MAX {
        let e = last_error("ResumeThread");
        // SAFETY: as above.
        unsafe { TerminateProcess(process.0, 1) };
        return Err(e);
    }
    drop(thread);
    // SAFETY: the process handle is valid.
    if unsafe { WaitForSingleObject(process.0, INFINITE) } != WAIT_OBJECT_0 {
        return Err(last_error("WaitForSingleObject"));
    }
    let mut code: u32 = 0;
    // SAFETY: the process has ended; `code` receives its exit code.
    if unsafe { GetExitCodeProcess(process.0, &mut code) } == 0 {
        return Err(last_error("GetExitCodeProcess"));
    }
    Ok(code)
}
