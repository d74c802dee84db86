//! The seccomp filters of the Linux process tiers, as data: one entry per
//! syscall with the reason it is refused.
//!
//! Refused calls fail with EPERM (not a kill), so a program probing for a
//! feature sees it missing. What this does not cover: syscalls of other ABIs
//! (i386 compat calls fail the architecture check and kill the process; the
//! x32 ABI is off in Debian kernels unless booted with `syscall.x32=y`).

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("building the seccomp filter failed: {0}")]
    Build(String),
    #[error("installing the seccomp filter failed: {0}")]
    Apply(String),
}

/// Which tier the filter is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// bwrap: namespaces already isolate the network.
    Bwrap,
    /// landlock: no namespaces, so IP sockets are refused here; unix sockets
    /// only when Landlock itself mediates connecting to them.
    Landlock { allow_unix_sockets: bool },
}

/// Refused unconditionally, with the reason.
pub const DENIED: &[(&str, i64)] = &[
    (
        "ptrace: inspect or control other processes",
        libc::SYS_ptrace,
    ),
    (
        "process_vm_readv: read another process's memory",
        libc::SYS_process_vm_readv,
    ),
    (
        "process_vm_writev: write another process's memory",
        libc::SYS_process_vm_writev,
    ),
    (
        "io_uring_setup: io_uring bypasses syscall filtering",
        libc::SYS_io_uring_setup,
    ),
    ("io_uring_enter", libc::SYS_io_uring_enter),
    ("io_uring_register", libc::SYS_io_uring_register),
    ("mount: change the filesystem view", libc::SYS_mount),
    ("umount2", libc::SYS_umount2),
    ("pivot_root", libc::SYS_pivot_root),
    ("move_mount", libc::SYS_move_mount),
    ("open_tree", libc::SYS_open_tree),
    ("fsopen", libc::SYS_fsopen),
    ("fsconfig", libc::SYS_fsconfig),
    ("fsmount", libc::SYS_fsmount),
    ("fspick", libc::SYS_fspick),
    ("mount_setattr", libc::SYS_mount_setattr),
    ("bpf: load kernel programs", libc::SYS_bpf),
    (
        "perf_event_open: kernel and side-channel observation",
        libc::SYS_perf_event_open,
    ),
    (
        "userfaultfd: a classic kernel exploit primitive",
        libc::SYS_userfaultfd,
    ),
    (
        "keyctl: the kernel keyring is not namespaced",
        libc::SYS_keyctl,
    ),
    ("add_key", libc::SYS_add_key),
    ("request_key", libc::SYS_request_key),
    ("kexec_load", libc::SYS_kexec_load),
    ("kexec_file_load", libc::SYS_kexec_file_load),
    ("init_module: load kernel modules", libc::SYS_init_module),
    ("finit_module", libc::SYS_finit_module),
    ("delete_module", libc::SYS_delete_module),
    (
        "unshare: new namespaces inside the sandbox",
        libc::SYS_unshare,
    ),
    ("setns: join other namespaces", libc::SYS_setns),
    (
        "personality: disable ASLR and similar",
        libc::SYS_personality,
    ),
    ("acct", libc::SYS_acct),
    ("swapon", libc::SYS_swapon),
    ("swapoff", libc::SYS_swapoff),
    ("reboot", libc::SYS_reboot),
    (
        "open_by_handle_at: open files by handle, bypassing paths",
        libc::SYS_open_by_handle_at,
    ),
    ("name_to_handle_at", libc::SYS_name_to_handle_at),
];

const TIOCSTI: u64 = 0x5412;
const TIOCLINUX: u64 = 0x541C;
const CLONE_NS_FLAGS: &[u64] = &[
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWNET as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWCGROUP as u64,
];

fn cond(arg: u8, op: SeccompCmpOp, v: u64) -> Result<SeccompCondition, SeccompError> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Qword, op, v)
        .map_err(|e| SeccompError::Build(e.to_string()))
}

fn rule(conds: Vec<SeccompCondition>) -> Result<SeccompRule, SeccompError> {
    SeccompRule::new(conds).map_err(|e| SeccompError::Build(e.to_string()))
}

/// Builds the BPF program for a profile.
pub fn build(profile: Profile) -> Result<BpfProgram, SeccompError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for (_, nr) in DENIED {
        rules.insert(*nr, Vec::new());
    }
    // Injecting keystrokes into a terminal hull's caller reads.
    rules.insert(
        libc::SYS_ioctl,
        vec![
            rule(vec![cond(1, SeccompCmpOp::MaskedEq(0xffff_ffff), TIOCSTI)?])?,
            rule(vec![cond(
                1,
                SeccompCmpOp::MaskedEq(0xffff_ffff),
                TIOCLINUX,
            )?])?,
        ],
    );
    // clone with namespace flags; clone3 hides its flags behind a pointer,
    // so it is refused outright (libc falls back to clone on ENOSYS).
    let mut clone_rules = Vec::new();
    for f in CLONE_NS_FLAGS {
        clone_rules.push(rule(vec![cond(0, SeccompCmpOp::MaskedEq(*f), *f)?])?);
    }
    rules.insert(libc::SYS_clone, clone_rules);
    if let Profile::Landlock { allow_unix_sockets } = profile {
        let mut socket_rules = vec![rule(vec![cond(
            0,
            SeccompCmpOp::Ne,
            libc::AF_UNIX as u64,
        )?])?];
        if !allow_unix_sockets {
            socket_rules.push(rule(vec![cond(
                0,
                SeccompCmpOp::Eq,
                libc::AF_UNIX as u64,
            )?])?);
        }
        rules.insert(libc::SYS_socket, socket_rules);
    }
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|e| {
        SeccompError::Build(format!("architecture {}: {e}", std::env::consts::ARCH))
    })?;
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(|e| SeccompError::Build(e.to_string()))?;
    let mut prog: BpfProgram = filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| SeccompError::Build(e.to_string()))?;
    // clone3 -> ENOSYS, prepended so it wins over the EPERM default.
    prepend_clone3_enosys(&mut prog);
    Ok(prog)
}

/// Prepends, after the architecture check: x32-ABI syscall numbers are
/// refused (EPERM), and clone3 fails with ENOSYS so libc falls back to clone,
/// whose flags the filter can see.
fn prepend_clone3_enosys(prog: &mut BpfProgram) {
    use seccompiler::sock_filter;
    const BPF_LD_W_ABS: u16 = 0x20;
    const BPF_JEQ_K: u16 = 0x15;
    const BPF_JGE_K: u16 = 0x35;
    const BPF_RET_K: u16 = 0x06;
    const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    let ins = [
        sock_filter {
            code: BPF_LD_W_ABS,
            jt: 0,
            jf: 0,
            k: 0,
        },
        sock_filter {
            code: BPF_JGE_K,
            jt: 2,
            jf: 0,
            k: X32_SYSCALL_BIT,
        },
        sock_filter {
            code: BPF_JEQ_K,
            jt: 0,
            jf: 2,
            k: libc::SYS_clone3 as u32,
        },
        sock_filter {
            code: BPF_RET_K,
            jt: 0,
            jf: 0,
            k: SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
        },
        sock_filter {
            code: BPF_RET_K,
            jt: 0,
            jf: 0,
            k: SECCOMP_RET_ERRNO | libc::EPERM as u32,
        },
    ];
    // seccompiler starts with a 3-instruction architecture check
    // (load arch, jump-if-equal, kill); insert after it.
    let at = 3.min(prog.len());
    for (i, x) in ins.into_iter().enumerate() {
        prog.insert(at + i, x);
    }
}

/// The program as the bytes `bwrap --seccomp FD` reads (struct sock_filter, native order).
pub fn to_bytes(prog: &BpfProgram) -> Vec<u8> {
    let mut out = Vec::with_capacity(prog.len() * 8);
    for f in prog {
        out.extend_from_slice(&f.code.to_ne_bytes());
        out.push(f.jt);
        out.push(f.jf);
        out.extend_from_slice(&f.k.to_ne_bytes());
    }
    out
}

/// Installs the filter on the calling thread (needs no_new_privs first).
pub fn apply(prog: &BpfProgram) -> Result<(), SeccompError> {
    seccompiler::apply_filter(prog).map_err(|e| SeccompError::Apply(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_build_for_every_profile() {
        for p in [
            Profile::Bwrap,
            Profile::Landlock {
                allow_unix_sockets: true,
            },
            Profile::Landlock {
                allow_unix_sockets: false,
            },
        ] {
            let prog = build(p).unwrap();
            assert!(prog.len() > DENIED.len(), "{p:?}");
            assert_eq!(to_bytes(&prog).len(), prog.len() * 8);
        }
    }
}
