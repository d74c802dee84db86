//! A Landlock domain of its own for a helper that faces untrusted input
//! and runs unsandboxed otherwise (tier 3's QEMU, the network proxy).
//!
//! Runs reach each other through `/proc/PID/{cwd,root,mem,environ}` only
//! when the kernel's ptrace access check passes, and Landlock adds to it:
//! a process in a Landlock domain reaches only processes in that domain or
//! one nested in it. Every landlock run's command is in a domain of its
//! own, every bwrap run's in a pid namespace with its own `/proc`; hull's
//! helpers that run as the same sandbox user before any boundary are hull's
//! own code with hull's environment. The helpers left are those that parse
//! what a guest or a command sends for as long as the run lasts: a
//! compromised QEMU or proxy, as the sandbox user, could otherwise open any
//! run's `/proc/PID/root`. Each is given a domain of its own before it
//! executes: a ruleset that handles one right nobody needs here (making
//! block devices) and grants nothing, so it restricts nothing else, yet
//! puts the helper outside every run's reach and every run outside its.

use std::io;

/// `struct landlock_ruleset_attr` up to `handled_access_net` (ABI 4).
#[repr(C)]
struct RulesetAttr {
    handled_access_fs: u64,
    handled_access_net: u64,
}

const LANDLOCK_ACCESS_FS_MAKE_BLOCK: u64 = 1 << 11;

/// The Landlock ABI the running kernel supports (0 when none).
pub fn kernel_abi() -> i32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: landlock_create_ruleset(NULL, 0, VERSION) only returns the ABI
    // version number (or -1); it reads no memory.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    i32::try_from(r).unwrap_or(0).max(0)
}

/// Whether the kernel has Landlock at all.
pub fn supported() -> bool {
    kernel_abi() >= 1
}

/// In a forked child before exec: enters a domain of its own (sets
/// no_new_privs, which the kernel requires without CAP_SYS_ADMIN). Raw,
/// async-signal-safe system calls on stack memory only.
pub fn enter_in_child() -> io::Result<()> {
    let attr = RulesetAttr {
        handled_access_fs: LANDLOCK_ACCESS_FS_MAKE_BLOCK,
        handled_access_net: 0,
    };
    // SAFETY: the kernel reads `size_of::<RulesetAttr>()` bytes of `attr`,
    // alive for the call; prctl, landlock_restrict_self and close take
    // integers.
    unsafe {
        let fd = libc::syscall(
            libc::SYS_landlock_create_ruleset,
            &attr as *const RulesetAttr,
            std::mem::size_of::<RulesetAttr>(),
            0u32,
        );
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = fd as libc::c_int;
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
            || libc::syscall(libc::SYS_landlock_restrict_self, fd, 0u32) != 0
        {
            let e = io::Error::last_os_error();
            libc::close(fd);
            return Err(e);
        }
        libc::close(fd);
    }
    Ok(())
}

/// Gives `cmd` a domain of its own before it executes (see the module
/// comment); `what` names it in the warning a kernel without Landlock gets
/// (the helper then runs without one: the other boundaries stand, this one
/// is not there, and the user is told).
pub fn confine(cmd: &mut std::process::Command, what: &str) {
    if !supported() {
        static TOLD: std::sync::Once = std::sync::Once::new();
        TOLD.call_once(|| {
            tracing::warn!(
                "{what}: the kernel has no Landlock, so hull's helpers that face untrusted input \
                 run without a domain of their own: a compromised one could reach other runs' \
                 processes of the same user through /proc"
            )
        });
        return;
    }
    // SAFETY: `enter_in_child` makes raw, async-signal-safe system calls
    // on stack memory only.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(cmd, enter_in_child);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    /// Lists this process's working directory through `/proc`, as one run
    /// would reach another's project.
    fn list_our_cwd(confined: bool) -> std::process::Output {
        let mut c = std::process::Command::new("/bin/ls");
        c.arg(format!("/proc/{}/cwd/", std::process::id()));
        if confined {
            // SAFETY: `enter_in_child` is async-signal-safe.
            unsafe {
                c.pre_exec(enter_in_child);
            }
        }
        c.output().expect("cat")
    }

    #[test]
    fn a_helper_in_its_domain_reaches_no_other_process() {
        assert!(supported(), "this kernel has no Landlock");
        // Control: the same uid lists a process's working directory.
        assert!(list_our_cwd(false).status.success());
        let o = list_our_cwd(true);
        assert!(!o.status.success(), "listed through its domain");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("Permission denied"),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        // It still works otherwise: it reaches its own.
        let mut c = std::process::Command::new("/bin/ls");
        c.arg("/proc/self/cwd/");
        // SAFETY: as above.
        unsafe {
            c.pre_exec(enter_in_child);
        }
        assert!(c.output().expect("cat").status.success());
    }
}
