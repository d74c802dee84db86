//! The seccomp filters of hull's Linux sandboxes, as data: one entry per
//! syscall with the reason it is refused. The host's process tiers
//! (landlock, bwrap) and the tier-3 guest agent, which starts the command
//! inside the container, build theirs here, so a rule such as "no set-id
//! mode bits" is written once for every tier.
//!
//! Refused calls fail with EPERM (not a kill), so a program probing for a
//! feature sees it missing. What this does not cover: syscalls of other ABIs
//! (i386 compat calls fail the architecture check and kill the process; the
//! x32 ABI is off in Debian kernels unless booted with `syscall.x32=y`).
#![cfg(target_os = "linux")]

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
    /// bwrap: namespaces already isolate the network; socket families are an
    /// allowlist (unix, inet and inet6 for the sandbox's own loopback,
    /// netlink route).
    Bwrap,
    /// landlock: IP sockets are refused here unless the command has a
    /// network namespace of its own (`inet`: the policy's allow list, where
    /// only hull's proxy listens, on its loopback); unix sockets as
    /// [`UnixSockets`] says.
    Landlock {
        unix: UnixSockets,
        /// inet and inet6 sockets, and netlink route, allowed: the command
        /// is in a network namespace of its own.
        inet: bool,
        /// The metadata calls go to hull's broker ([`build_broker`]); the
        /// calls it cannot decode are refused here.
        broker: bool,
    },
    /// hull's network proxy (`hull __net-proxy`), which parses what the
    /// command sends: a parser bug must give no more than its sockets.
    /// Nothing is executed, no namespace, mount, trace or keyring; sockets
    /// of the families name resolution and its connections need (unix,
    /// inet, inet6, netlink route).
    Proxy,
    /// The command inside the tier-3 container, started by the guest agent:
    /// only what the container's own boundary (an unprivileged Incus
    /// container under LXC's seccomp policy) does not cover: set-id mode
    /// bits, which land on the host through virtiofs.
    Guest,
}

/// Unix sockets on the landlock tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnixSockets {
    /// Every unix `socket()`, and datagram pairs, refused: nothing mediates
    /// a connect to a host service's socket.
    Refused,
    /// Allowed: Landlock itself mediates connecting to them (ABI 9).
    Landlock,
    /// Stream and seqpacket sockets allowed, datagram ones refused (a send
    /// may name any socket); every `connect` goes to hull's broker
    /// ([`build_broker`] with `connect`), which allows pathname sockets in
    /// the writable roots only.
    Brokered,
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

/// SysV IPC: without an IPC namespace (the landlock tier) these reach the
/// host's segments, queues and semaphore sets; refused there.
pub fn sysv_ipc_calls() -> Vec<(&'static str, i64)> {
    vec![
        ("shmget", libc::SYS_shmget),
        ("shmat", libc::SYS_shmat),
        ("shmctl", libc::SYS_shmctl),
        ("shmdt", libc::SYS_shmdt),
        ("msgget", libc::SYS_msgget),
        ("msgsnd", libc::SYS_msgsnd),
        ("msgrcv", libc::SYS_msgrcv),
        ("msgctl", libc::SYS_msgctl),
        ("semget", libc::SYS_semget),
        ("semop", libc::SYS_semop),
        ("semtimedop", libc::SYS_semtimedop),
        ("semctl", libc::SYS_semctl),
    ]
}

/// Calls that fail with ENOSYS (not EPERM) so libc and runtimes fall back
/// to a form the filter can inspect: clone3 hides its flags and openat2 its
/// mode behind a pointer.
pub const ENOSYS: &[(&str, i64)] = &[
    (
        "clone3: flags behind a pointer (libc falls back to clone)",
        libc::SYS_clone3,
    ),
    (
        "openat2: mode behind a pointer (callers fall back to openat)",
        libc::SYS_openat2,
    ),
];

/// Socket families the bwrap tier allows; every other family (vsock,
/// packet, bluetooth, alg, ...) is refused.
const BWRAP_SOCKET_FAMILIES: &[i32] = &[
    libc::AF_UNIX,
    libc::AF_INET,
    libc::AF_INET6,
    libc::AF_NETLINK,
];

/// The set-id bits: a file carrying them, left in a writable root, runs with
/// its owner's or group's identity for whoever on the host executes it.
const SETID_BITS: &[u64] = &[libc::S_ISUID as u64, libc::S_ISGID as u64];

/// Calls that set a mode, with the index of the mode argument and, for the
/// open family, the index of the flags argument (the mode counts only with
/// O_CREAT or O_TMPFILE).
fn mode_setting_calls() -> Vec<(i64, u8, Option<u8>)> {
    let mut calls = vec![
        (libc::SYS_fchmod, 1, None),
        (libc::SYS_fchmodat, 2, None),
        (libc::SYS_fchmodat2, 2, None),
        (libc::SYS_openat, 3, Some(2)),
        (libc::SYS_mkdirat, 2, None),
        (libc::SYS_mknodat, 2, None),
    ];
    #[cfg(target_arch = "x86_64")]
    calls.extend([
        (libc::SYS_chmod, 1, None),
        (libc::SYS_open, 2, Some(1)),
        (libc::SYS_creat, 1, None),
        (libc::SYS_mkdir, 1, None),
        (libc::SYS_mknod, 1, None),
    ]);
    calls
}

/// Rules refusing a set-id bit in the mode argument of every call that sets
/// one (chmod, open with O_CREAT or O_TMPFILE, mkdir, mknod).
/// O_TMPFILE includes O_DIRECTORY; its own bit is what marks a creation.
const O_TMPFILE_BIT: u64 = (libc::O_TMPFILE & !libc::O_DIRECTORY) as u64;

fn setid_rules(rules: &mut BTreeMap<i64, Vec<SeccompRule>>) -> Result<(), SeccompError> {
    for (nr, mode_arg, flags_arg) in mode_setting_calls() {
        let mut list = Vec::new();
        for bit in SETID_BITS {
            let mode = cond(mode_arg, SeccompCmpOp::MaskedEq(*bit), *bit)?;
            match flags_arg {
                None => list.push(rule(vec![mode])?),
                Some(f) => {
                    for creating in [libc::O_CREAT as u64, O_TMPFILE_BIT] {
                        list.push(rule(vec![
                            cond(f, SeccompCmpOp::MaskedEq(creating), creating)?,
                            cond(mode_arg, SeccompCmpOp::MaskedEq(*bit), *bit)?,
                        ])?);
                    }
                }
            }
        }
        rules.insert(nr, list);
    }
    Ok(())
}

/// Rules refusing every socket family outside `allowed`, and netlink
/// protocols other than route.
fn socket_family_rules(allowed: &[i32]) -> Result<Vec<SeccompRule>, SeccompError> {
    let not_allowed = allowed
        .iter()
        .map(|f| cond(0, SeccompCmpOp::Ne, *f as u64))
        .collect::<Result<Vec<_>, _>>()?;
    let mut list = vec![rule(not_allowed)?];
    if allowed.contains(&libc::AF_NETLINK) {
        list.push(rule(vec![
            cond(0, SeccompCmpOp::Eq, libc::AF_NETLINK as u64)?,
            cond(2, SeccompCmpOp::Ne, libc::NETLINK_ROUTE as u64)?,
        ])?);
    }
    Ok(list)
}

/// Unix datagram sockets (SOCK_RAW is one too): a send may name any
/// pathname socket as its destination, in `sendto` or `sendmsg`, whose
/// address a filter cannot see. Even a socketpair's end can, so both calls
/// refuse them; stream and seqpacket sockets reach a pathname only through
/// `connect`, which the connect broker answers ([`build_connect_broker`]).
fn unix_datagram_rules() -> Result<Vec<SeccompRule>, SeccompError> {
    const SOCK_TYPE_MASK: u64 = 0xf;
    [libc::SOCK_DGRAM, libc::SOCK_RAW]
        .iter()
        .map(|t| {
            rule(vec![
                cond(0, SeccompCmpOp::Eq, libc::AF_UNIX as u64)?,
                cond(1, SeccompCmpOp::MaskedEq(SOCK_TYPE_MASK), *t as u64)?,
            ])
        })
        .collect()
}

const TIOCSTI: u64 = 0x5412;
const TIOCLINUX: u64 = 0x541C;
/// Sets the line discipline: N_NULL left on the caller's terminal makes
/// every later read and write on it fail, after hull is gone.
const TIOCSETD: u64 = 0x5423;
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
    if profile == Profile::Guest {
        setid_rules(&mut rules)?;
        return finish(rules);
    }
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
            rule(vec![cond(
                1,
                SeccompCmpOp::MaskedEq(0xffff_ffff),
                TIOCSETD,
            )?])?,
        ],
    );
    // Resource limits of another process (a busy host process killed by
    // RLIMIT_CPU, hull's own RLIMIT_NOFILE lowered to blind its sweep):
    // prlimit64 only on the caller itself (pid 0).
    rules.insert(
        libc::SYS_prlimit64,
        vec![rule(vec![cond(0, SeccompCmpOp::Ne, 0)?])?],
    );
    // clone with namespace flags; clone3 hides its flags behind a pointer,
    // so it is refused outright (libc falls back to clone on ENOSYS).
    let mut clone_rules = Vec::new();
    for f in CLONE_NS_FLAGS {
        clone_rules.push(rule(vec![cond(0, SeccompCmpOp::MaskedEq(*f), *f)?])?);
    }
    rules.insert(libc::SYS_clone, clone_rules);
    if profile == Profile::Proxy {
        rules.insert(libc::SYS_execve, Vec::new());
        rules.insert(libc::SYS_execveat, Vec::new());
        rules.insert(
            libc::SYS_socket,
            socket_family_rules(BWRAP_SOCKET_FAMILIES)?,
        );
        rules.insert(
            libc::SYS_socketpair,
            socket_family_rules(BWRAP_SOCKET_FAMILIES)?,
        );
        return finish(rules);
    }
    setid_rules(&mut rules)?;
    if profile == Profile::Bwrap {
        let mut socket = socket_family_rules(BWRAP_SOCKET_FAMILIES)?;
        socket.extend(unix_datagram_rules()?);
        rules.insert(libc::SYS_socket, socket);
        let mut pair = socket_family_rules(BWRAP_SOCKET_FAMILIES)?;
        pair.extend(unix_datagram_rules()?);
        rules.insert(libc::SYS_socketpair, pair);
    }
    if let Profile::Landlock { .. } = profile {
        for (_, nr) in sysv_ipc_calls() {
            rules.insert(nr, Vec::new());
        }
        // fanotify marks report names in what Landlock would not let the
        // command list; inotify goes to the broker instead.
        rules.insert(libc::SYS_fanotify_init, Vec::new());
    }
    if let Profile::Landlock { broker: true, .. } = profile {
        for nr in XATTRAT_CALLS {
            rules.insert(*nr, Vec::new());
        }
    }
    if let Profile::Landlock { unix, inet, .. } = profile {
        let mut socket_rules = if inet {
            socket_family_rules(BWRAP_SOCKET_FAMILIES)?
        } else {
            vec![rule(vec![cond(
                0,
                SeccompCmpOp::Ne,
                libc::AF_UNIX as u64,
            )?])?]
        };
        match unix {
            UnixSockets::Refused => {
                socket_rules.push(rule(vec![cond(
                    0,
                    SeccompCmpOp::Eq,
                    libc::AF_UNIX as u64,
                )?])?);
                rules.insert(libc::SYS_socketpair, unix_datagram_rules()?);
            }
            UnixSockets::Landlock => {}
            UnixSockets::Brokered => {
                socket_rules.extend(unix_datagram_rules()?);
                rules.insert(libc::SYS_socketpair, unix_datagram_rules()?);
            }
        }
        rules.insert(libc::SYS_socket, socket_rules);
    }
    finish(rules)
}

/// Compiles the rules: what matches fails with EPERM, the rest is allowed.
fn finish(rules: BTreeMap<i64, Vec<SeccompRule>>) -> Result<BpfProgram, SeccompError> {
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
    // clone3, openat2 -> ENOSYS, prepended so they win over the EPERM default.
    prepend_enosys(&mut prog);
    Ok(prog)
}

/// Prepends, after the architecture check: x32-ABI syscall numbers are
/// refused (EPERM), and the calls of [`ENOSYS`] fail with ENOSYS so libc
/// falls back to calls whose arguments the filter can see.
fn prepend_enosys(prog: &mut BpfProgram) {
    use seccompiler::sock_filter;
    const BPF_LD_W_ABS: u16 = 0x20;
    const BPF_JEQ_K: u16 = 0x15;
    const BPF_JGE_K: u16 = 0x35;
    const BPF_RET_K: u16 = 0x06;
    const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    let n = ENOSYS.len();
    let ins = |code, jt, jf, k| sock_filter { code, jt, jf, k };
    // load nr; x32 -> EPERM; each ENOSYS call -> ENOSYS; else fall through.
    let mut block = vec![
        ins(BPF_LD_W_ABS, 0, 0, 0),
        ins(BPF_JGE_K, (n + 2) as u8, 0, X32_SYSCALL_BIT),
    ];
    for (i, (_, nr)) in ENOSYS.iter().enumerate() {
        // Matching jumps to the ENOSYS return, just past the last compare.
        block.push(ins(BPF_JEQ_K, (n - i) as u8, 0, *nr as u32));
    }
    // No match: skip both returns.
    block.push(ins(0x05, 0, 0, 2)); // BPF_JMP | BPF_JA
    block.push(ins(
        BPF_RET_K,
        0,
        0,
        SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
    ));
    block.push(ins(BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | libc::EPERM as u32));
    // seccompiler starts with a 3-instruction architecture check
    // (load arch, jump-if-equal, kill); insert after it.
    let at = 3.min(prog.len());
    for (i, x) in block.into_iter().enumerate() {
        prog.insert(at + i, x);
    }
}

/// Calls that change a file's mode, owner, times or extended attributes.
/// Landlock does not mediate them, and a command running as the caller owns
/// the caller's files everywhere: on the landlock tier, when hull is not
/// root, they go to hull's broker ([`build_broker`]), which performs them
/// itself only on files inside the writable roots.
pub fn metadata_calls() -> Vec<(&'static str, i64)> {
    let mut calls = vec![
        ("fchmod", libc::SYS_fchmod),
        ("fchmodat", libc::SYS_fchmodat),
        ("fchmodat2", libc::SYS_fchmodat2),
        ("fchown", libc::SYS_fchown),
        ("fchownat", libc::SYS_fchownat),
        ("setxattr", libc::SYS_setxattr),
        ("lsetxattr", libc::SYS_lsetxattr),
        ("fsetxattr", libc::SYS_fsetxattr),
        ("removexattr", libc::SYS_removexattr),
        ("lremovexattr", libc::SYS_lremovexattr),
        ("fremovexattr", libc::SYS_fremovexattr),
        ("utimensat", libc::SYS_utimensat),
    ];
    #[cfg(target_arch = "x86_64")]
    calls.extend([
        ("chmod", libc::SYS_chmod),
        ("chown", libc::SYS_chown),
        ("lchown", libc::SYS_lchown),
        ("utime", libc::SYS_utime),
        ("utimes", libc::SYS_utimes),
        ("futimesat", libc::SYS_futimesat),
    ]);
    calls
}

/// The *xattrat calls of Linux 6.13 (x86_64 numbers), which the broker
/// does not decode: refused with EPERM by the landlock filter when the
/// broker is on (setxattr and friends remain).
#[cfg(target_arch = "x86_64")]
pub const XATTRAT_CALLS: &[i64] = &[463, 464, 465, 466];
#[cfg(not(target_arch = "x86_64"))]
pub const XATTRAT_CALLS: &[i64] = &[];

/// The landlock broker's filter: `inotify_add_watch` (Landlock does not
/// mediate watches) and, with `metadata` (hull is not root), every call of
/// [`metadata_calls`] stop and wait for the listener's answer
/// (`SECCOMP_RET_USER_NOTIF`); the rest is allowed. Installed beside
/// [`build`]'s filter, whose EPERM takes precedence (a set-id chmod never
/// reaches the broker).
///
/// With `connect`, every `connect` stops too (unix sockets brokered).
///
/// With `creates` (a writable directory was split around protected paths,
/// `hull::tier::broker::create`), the calls that create, remove, rename or
/// link a directory entry stop too: [`create_calls`], and the open family
/// only with `O_CREAT` or `O_TMPFILE`, so a plain open never waits.
pub fn build_broker(
    metadata: bool,
    creates: bool,
    connect: bool,
) -> Result<BpfProgram, SeccompError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    rules.insert(libc::SYS_inotify_add_watch, Vec::new());
    if connect {
        // Unix sockets brokered (`UnixSockets::Brokered`): every connect.
        rules.insert(libc::SYS_connect, Vec::new());
    }
    if metadata {
        for (_, nr) in metadata_calls() {
            rules.insert(nr, Vec::new());
        }
    }
    if creates {
        for (_, nr) in create_calls() {
            rules.insert(nr, Vec::new());
        }
        for (nr, flags_arg) in creating_opens() {
            let mut list = Vec::new();
            for creating in [libc::O_CREAT as u64, O_TMPFILE_BIT] {
                list.push(rule(vec![SeccompCondition::new(
                    flags_arg,
                    SeccompCmpArgLen::Dword,
                    SeccompCmpOp::MaskedEq(creating),
                    creating,
                )
                .map_err(|e| SeccompError::Build(e.to_string()))?])?);
            }
            rules.insert(nr, list);
        }
    }
    notifying_rules(rules)
}

/// Calls that create, remove, rename or link a directory entry, always
/// (the open family is in [`creating_opens`]).
pub fn create_calls() -> Vec<(&'static str, i64)> {
    let mut calls = vec![
        ("mkdirat", libc::SYS_mkdirat),
        ("mknodat", libc::SYS_mknodat),
        ("symlinkat", libc::SYS_symlinkat),
        ("linkat", libc::SYS_linkat),
        ("unlinkat", libc::SYS_unlinkat),
        ("renameat2", libc::SYS_renameat2),
    ];
    #[cfg(target_arch = "x86_64")]
    calls.extend([
        ("creat", libc::SYS_creat),
        ("mkdir", libc::SYS_mkdir),
        ("mknod", libc::SYS_mknod),
        ("symlink", libc::SYS_symlink),
        ("link", libc::SYS_link),
        ("unlink", libc::SYS_unlink),
        ("rmdir", libc::SYS_rmdir),
        ("rename", libc::SYS_rename),
        ("renameat", libc::SYS_renameat),
    ]);
    calls
}

/// The open calls, with the index of their flags argument: they create
/// only with `O_CREAT` or `O_TMPFILE` (`openat2` is refused outright).
fn creating_opens() -> Vec<(i64, u8)> {
    let mut calls = vec![(libc::SYS_openat, 2)];
    #[cfg(target_arch = "x86_64")]
    calls.push((libc::SYS_open, 1));
    calls
}

/// The connect broker's filter (bwrap): every `connect` waits for hull's
/// answer. A bind mount that is read-only still lets a command connect to
/// a host service's socket under it, and the network namespace does not
/// cover pathname sockets; hull resolves the address in the command's own
/// view and connects only to sockets on a writable mount. Every connect
/// stops here, whatever its family: which socket a descriptor number names
/// can change between a check and the kernel's own call.
pub fn build_connect_broker() -> Result<BpfProgram, SeccompError> {
    notifying([libc::SYS_connect])
}

/// A filter whose `calls` stop with `SECCOMP_RET_USER_NOTIF`; the rest is
/// allowed.
fn notifying(calls: impl IntoIterator<Item = i64>) -> Result<BpfProgram, SeccompError> {
    notifying_rules(calls.into_iter().map(|nr| (nr, Vec::new())).collect())
}

/// A filter whose calls matching `rules` stop with
/// `SECCOMP_RET_USER_NOTIF`; the rest is allowed.
fn notifying_rules(rules: BTreeMap<i64, Vec<SeccompRule>>) -> Result<BpfProgram, SeccompError> {
    const SECCOMP_RET_TRAP: u32 = 0x0003_0000;
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|e| {
        SeccompError::Build(format!("architecture {}: {e}", std::env::consts::ARCH))
    })?;
    // seccompiler has no user-notification action: build with Trap, then
    // turn exactly those returns into USER_NOTIF.
    let filter = SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Trap, arch)
        .map_err(|e| SeccompError::Build(e.to_string()))?;
    let mut prog: BpfProgram = filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| SeccompError::Build(e.to_string()))?;
    let mut n = 0;
    for ins in &mut prog {
        // BPF_RET | BPF_K
        if ins.code == 0x06 && ins.k == SECCOMP_RET_TRAP {
            ins.k = libc::SECCOMP_RET_USER_NOTIF;
            n += 1;
        }
    }
    if n == 0 {
        return Err(SeccompError::Build(
            "the broker filter has no notifying return".into(),
        ));
    }
    Ok(prog)
}

/// Installs `prog` on the calling thread with a listener, and returns the
/// listener (close-on-exec). Needs no_new_privs first.
pub fn apply_with_listener(prog: &BpfProgram) -> Result<std::os::fd::OwnedFd, SeccompError> {
    use std::os::fd::FromRawFd;
    let fd = Raw::new(prog).apply_with_listener_in_child();
    if fd < 0 {
        return Err(SeccompError::Apply(
            std::io::Error::last_os_error().to_string(),
        ));
    }
    // SAFETY: the kernel just returned this descriptor to us.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
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

/// A program in the kernel's own types, built before a fork, to install in
/// the child with [`Raw::apply_in_child`] (no allocation after the fork).
#[derive(Debug)]
pub struct Raw(Vec<libc::sock_filter>);

impl Raw {
    pub fn new(prog: &BpfProgram) -> Raw {
        Raw(prog
            .iter()
            .map(|f| libc::sock_filter {
                code: f.code,
                jt: f.jt,
                jf: f.jf,
                k: f.k,
            })
            .collect())
    }

    /// Installs the filter on the calling thread with a listener and
    /// returns the listener (close-on-exec), or -1 with errno set.
    /// Async-signal-safe: one seccomp(2) on memory prepared before the
    /// fork. Needs no_new_privs first.
    pub fn apply_with_listener_in_child(&self) -> std::os::fd::RawFd {
        let prog = libc::sock_fprog {
            len: self.0.len() as libc::c_ushort,
            filter: self.0.as_ptr().cast_mut(),
        };
        // SAFETY: `prog` points at `self.0`, alive for the call; the kernel
        // copies the program and returns a new descriptor or -1.
        unsafe {
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                libc::SECCOMP_FILTER_FLAG_NEW_LISTENER,
                &prog as *const libc::sock_fprog,
            ) as std::os::fd::RawFd
        }
    }

    /// Installs the filter on the calling thread; returns false (errno
    /// set) when the kernel refused it. Async-signal-safe: one prctl(2)
    /// on memory prepared before the fork. Needs no_new_privs first.
    pub fn apply_in_child(&self) -> bool {
        let prog = libc::sock_fprog {
            len: self.0.len() as libc::c_ushort,
            filter: self.0.as_ptr().cast_mut(),
        };
        // SAFETY: `prog` points at `self.0`, alive for the call; the kernel
        // copies the program.
        unsafe {
            libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER as libc::c_ulong,
                &prog as *const libc::sock_fprog,
            ) == 0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_build_for_every_profile() {
        for p in [
            Profile::Guest,
            Profile::Bwrap,
            Profile::Landlock {
                unix: UnixSockets::Landlock,
                inet: false,
                broker: true,
            },
            Profile::Landlock {
                unix: UnixSockets::Refused,
                inet: true,
                broker: false,
            },
            Profile::Proxy,
        ] {
            let prog = build(p).unwrap();
            if let Profile::Landlock { broker: true, .. } = p {
                let b = build_broker(true, true, true).unwrap();
                let notifying = b
                    .iter()
                    .filter(|i| i.code == 0x06 && i.k == libc::SECCOMP_RET_USER_NOTIF)
                    .count();
                assert!(notifying >= 1, "{b:?}");
            }
            if p != Profile::Guest {
                assert!(prog.len() > DENIED.len(), "{p:?}");
            }
            assert_eq!(to_bytes(&prog).len(), prog.len() * 8);
        }
    }

    /// The proxy's filter, for real on a thread of its own: nothing is
    /// executed and no namespace made; TCP sockets, a UDP socket for name
    /// resolution and a unix socket pair still work, a raw packet socket
    /// does not.
    #[test]
    fn the_proxy_filter_leaves_it_its_sockets_only() {
        let raw = Raw::new(&build(Profile::Proxy).unwrap());
        std::thread::spawn(move || {
            // SAFETY: prctl with integer arguments.
            let r = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
            assert_eq!(r, 0);
            assert!(raw.apply_in_child(), "{}", std::io::Error::last_os_error());
            let errno = || std::io::Error::last_os_error().raw_os_error();
            // SAFETY: execve of a valid path with empty argv/envp; the
            // filter answers first.
            let r = unsafe {
                let argv: [*const libc::c_char; 1] = [std::ptr::null()];
                libc::execve(c"/bin/true".as_ptr(), argv.as_ptr(), argv.as_ptr())
            };
            assert_eq!((r, errno()), (-1, Some(libc::EPERM)));
            // SAFETY: unshare with a flag; refused before it acts.
            let r = unsafe { libc::unshare(libc::CLONE_NEWNET) };
            assert_eq!((r, errno()), (-1, Some(libc::EPERM)));
            std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            std::os::unix::net::UnixStream::pair().unwrap();
            // SAFETY: socket(2) with integer arguments.
            let r = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) };
            assert_eq!((r, errno()), (-1, Some(libc::EPERM)));
            // Threads still start (clone3 falls back to clone).
            std::thread::spawn(|| 7).join().unwrap();
        })
        .join()
        .unwrap();
    }

    /// The broker's filter with `creates`, for real on a thread of its own:
    /// a plain open runs without stopping, an open with O_CREAT and a
    /// mkdir stop and take the listener's answer.
    #[test]
    fn the_create_broker_filter_stops_creates_only() {
        let prog = build_broker(false, true, false).unwrap();
        let dir = std::env::temp_dir().join(format!("hull-seccomp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("existing"), "x").unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let d = dir.clone();
        let t = std::thread::spawn(move || {
            // SAFETY: prctl with integer arguments.
            let r = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
            assert_eq!(r, 0);
            let listener = apply_with_listener(&prog).unwrap();
            tx.send(listener).unwrap();
            let errno = |r: bool| {
                if r {
                    0
                } else {
                    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
                }
            };
            let plain = std::fs::File::open(d.join("existing")).is_ok();
            let c = std::ffi::CString::new(d.join("new").into_os_string().into_encoded_bytes())
                .unwrap();
            // SAFETY: a NUL-terminated path we own.
            let fd = unsafe { libc::open(c.as_ptr(), libc::O_CREAT | libc::O_WRONLY, 0o600) };
            let created = errno(fd >= 0);
            // SAFETY: as above.
            let made = errno(unsafe { libc::mkdir(c.as_ptr(), 0o700) } == 0);
            (plain, created, made)
        });
        let listener = rx.recv().unwrap();
        let mut seen = Vec::new();
        for _ in 0..2 {
            let mut pfd = libc::pollfd {
                fd: std::os::fd::AsRawFd::as_raw_fd(&listener),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one pollfd we own.
            let n = unsafe { libc::poll(&mut pfd, 1, 10_000) };
            assert_eq!(n, 1, "no notification");
            // SAFETY: zeroed seccomp_notif is valid; the ioctl fills it.
            let mut req: libc::seccomp_notif = unsafe { std::mem::zeroed() };
            // SAFETY: the ioctl writes one seccomp_notif into `req`.
            let r = unsafe {
                libc::ioctl(
                    std::os::fd::AsRawFd::as_raw_fd(&listener),
                    libc::SECCOMP_IOCTL_NOTIF_RECV,
                    &mut req as *mut libc::seccomp_notif,
                )
            };
            assert_eq!(r, 0);
            seen.push(req.data.nr as i64);
            let mut resp = libc::seccomp_notif_resp {
                id: req.id,
                val: 0,
                error: -libc::EROFS,
                flags: 0,
            };
            // SAFETY: the ioctl reads one seccomp_notif_resp.
            unsafe {
                libc::ioctl(
                    std::os::fd::AsRawFd::as_raw_fd(&listener),
                    libc::SECCOMP_IOCTL_NOTIF_SEND,
                    &mut resp as *mut libc::seccomp_notif_resp,
                )
            };
        }
        let (plain, created, made) = t.join().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(plain, "a plain open must not stop");
        assert_eq!(
            (created, made),
            (libc::EROFS, libc::EROFS),
            "answered by the listener"
        );
        assert!(
            !seen.is_empty()
                && seen.iter().all(|nr| [
                    libc::SYS_openat,
                    libc::SYS_open,
                    libc::SYS_mkdir,
                    libc::SYS_mkdirat
                ]
                .contains(nr)),
            "{seen:?}"
        );
    }

    /// The landlock filter for real, on a thread of its own: a terminal's
    /// line discipline, another process's limits and SysV IPC are refused;
    /// the thread's own limits are not.
    #[test]
    fn the_landlock_filter_refuses_what_reaches_other_processes() {
        let raw = Raw::new(
            &build(Profile::Landlock {
                unix: UnixSockets::Refused,
                inet: false,
                broker: false,
            })
            .unwrap(),
        );
        let (mut master, mut slave) = (0, 0);
        // SAFETY: openpty writes two descriptors; the rest may be null.
        let r = unsafe {
            libc::openpty(
                &mut master,
                &mut slave,
                std::ptr::null_mut(),
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        assert_eq!(r, 0);
        let parent = std::process::id() as libc::pid_t;
        std::thread::spawn(move || {
            // SAFETY: prctl with integer arguments.
            let r = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
            assert_eq!(r, 0);
            assert!(raw.apply_in_child(), "{}", std::io::Error::last_os_error());
            let errno = || std::io::Error::last_os_error().raw_os_error();
            let ldisc: libc::c_int = 0;
            // SAFETY: TIOCSETD reads one int we own.
            let r = unsafe { libc::ioctl(slave, 0x5423, &ldisc as *const libc::c_int) };
            assert_eq!((r, errno()), (-1, Some(libc::EPERM)), "TIOCSETD");
            let mut lim = libc::rlimit64 {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: prlimit64 reads nothing (new is null) and writes `lim`.
            let r =
                unsafe { libc::prlimit64(parent, libc::RLIMIT_NOFILE, std::ptr::null(), &mut lim) };
            assert_eq!((r, errno()), (-1, Some(libc::EPERM)), "prlimit64 of a pid");
            // SAFETY: as above, on the caller itself.
            let r = unsafe { libc::prlimit64(0, libc::RLIMIT_NOFILE, std::ptr::null(), &mut lim) };
            assert_eq!(r, 0, "prlimit64 of itself");
            // SAFETY: shmget with integer arguments.
            let r = unsafe { libc::shmget(libc::IPC_PRIVATE, 4096, 0o600) };
            assert_eq!((r, errno()), (-1, Some(libc::EPERM)), "shmget");
            // SAFETY: fanotify_init with integer arguments (FAN_REPORT_FID,
            // which an unprivileged caller may use).
            let r = unsafe { libc::fanotify_init(0x200, 0) };
            assert_eq!((r, errno()), (-1, Some(libc::EPERM)), "fanotify_init");
        })
        .join()
        .unwrap();
        // SAFETY: our own descriptors.
        unsafe {
            libc::close(master);
            libc::close(slave);
        }
    }

    /// IP sockets on landlock for real: refused without a network namespace
    /// of the command's own, allowed with one (`inet`), where families
    /// outside unix, inet, inet6 and netlink route stay refused.
    #[test]
    fn landlock_ip_sockets_follow_the_network_namespace() {
        for inet in [false, true] {
            let raw = Raw::new(
                &build(Profile::Landlock {
                    unix: UnixSockets::Landlock,
                    inet,
                    broker: false,
                })
                .unwrap(),
            );
            std::thread::spawn(move || {
                // SAFETY: prctl with integer arguments.
                let r = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
                assert_eq!(r, 0);
                assert!(raw.apply_in_child(), "{}", std::io::Error::last_os_error());
                let open = |family, ty, proto| {
                    // SAFETY: socket with integer arguments; closed at once.
                    let r = unsafe { libc::socket(family, ty, proto) };
                    let e = std::io::Error::last_os_error().raw_os_error();
                    if r >= 0 {
                        // SAFETY: the descriptor just made.
                        unsafe { libc::close(r) };
                        Ok(())
                    } else {
                        Err(e)
                    }
                };
                for (family, ty) in [
                    (libc::AF_INET, libc::SOCK_STREAM),
                    (libc::AF_INET6, libc::SOCK_STREAM | libc::SOCK_CLOEXEC),
                    (libc::AF_INET, libc::SOCK_DGRAM),
                ] {
                    let got = open(family, ty, 0);
                    if inet {
                        assert_eq!(got, Ok(()), "inet {family} {ty}");
                    } else {
                        assert_eq!(got, Err(Some(libc::EPERM)), "no inet {family} {ty}");
                    }
                }
                assert_eq!(open(libc::AF_UNIX, libc::SOCK_STREAM, 0), Ok(()));
                assert_eq!(
                    open(libc::AF_PACKET, libc::SOCK_DGRAM, 0),
                    Err(Some(libc::EPERM)),
                    "packet, inet {inet}"
                );
                assert_eq!(
                    open(libc::AF_NETLINK, libc::SOCK_RAW, libc::NETLINK_AUDIT),
                    Err(Some(libc::EPERM)),
                    "netlink audit, inet {inet}"
                );
            })
            .join()
            .unwrap();
        }
    }

    /// Unix datagram sockets for real: refused by socket(2) and
    /// socketpair(2) on bwrap and on landlock with brokered unix sockets,
    /// by socketpair(2) on landlock refusing them (which refuses every unix
    /// socket(2) there); stream and seqpacket pairs still work, and stream
    /// sockets where unix sockets are not refused.
    #[test]
    fn unix_datagram_sockets_are_refused() {
        for profile in [
            Profile::Bwrap,
            Profile::Landlock {
                unix: UnixSockets::Refused,
                inet: false,
                broker: false,
            },
            Profile::Landlock {
                unix: UnixSockets::Brokered,
                inet: false,
                broker: true,
            },
        ] {
            let streams = !matches!(
                profile,
                Profile::Landlock {
                    unix: UnixSockets::Refused,
                    ..
                }
            );
            let raw = Raw::new(&build(profile).unwrap());
            std::thread::spawn(move || {
                // SAFETY: prctl with integer arguments.
                let r = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
                assert_eq!(r, 0);
                assert!(raw.apply_in_child(), "{}", std::io::Error::last_os_error());
                let errno = || std::io::Error::last_os_error().raw_os_error();
                let mut sv = [0; 2];
                for ty in [
                    libc::SOCK_DGRAM,
                    libc::SOCK_RAW,
                    libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                ] {
                    // SAFETY: socketpair writes two ints into `sv`.
                    let r = unsafe { libc::socketpair(libc::AF_UNIX, ty, 0, sv.as_mut_ptr()) };
                    assert_eq!(
                        (r, errno()),
                        (-1, Some(libc::EPERM)),
                        "{profile:?} pair {ty}"
                    );
                    // SAFETY: socket with integer arguments.
                    let r = unsafe { libc::socket(libc::AF_UNIX, ty, 0) };
                    assert_eq!((r, errno()), (-1, Some(libc::EPERM)), "{profile:?} {ty}");
                }
                for ty in [libc::SOCK_STREAM, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC] {
                    // SAFETY: socket with integer arguments; closed at once.
                    let r = unsafe { libc::socket(libc::AF_UNIX, ty, 0) };
                    assert_eq!(r >= 0, streams, "{profile:?} {ty}: {:?}", errno());
                    if r >= 0 {
                        // SAFETY: the descriptor just made.
                        unsafe { libc::close(r) };
                    }
                    // SAFETY: as above.
                    let r = unsafe { libc::socketpair(libc::AF_UNIX, ty, 0, sv.as_mut_ptr()) };
                    assert_eq!(r, 0, "{profile:?} pair {ty}: {:?}", errno());
                    // SAFETY: the two descriptors just made.
                    unsafe {
                        libc::close(sv[0]);
                        libc::close(sv[1]);
                    }
                }
            })
            .join()
            .unwrap();
        }
        let b = build_connect_broker().unwrap();
        assert!(b
            .iter()
            .any(|i| i.code == 0x06 && i.k == libc::SECCOMP_RET_USER_NOTIF));
    }

    /// The set-id rules for real: on a thread of its own (a filter binds
    /// the thread that installs it and what it starts), as the guest agent
    /// installs it.
    #[test]
    fn the_guest_filter_refuses_setid_bits_and_nothing_else() {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        std::fs::write(&f, b"x").unwrap();
        let raw = Raw::new(&build(Profile::Guest).unwrap());
        let d = dir.path().to_path_buf();
        let file = f.clone();
        std::thread::spawn(move || {
            let f = file;
            // SAFETY: prctl with integer arguments.
            let r = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
            assert_eq!(r, 0);
            assert!(raw.apply_in_child(), "{}", std::io::Error::last_os_error());
            let mode = |m| std::fs::Permissions::from_mode(m);
            for m in [0o4755, 0o2755, 0o6755] {
                let e = std::fs::set_permissions(&f, mode(m)).unwrap_err();
                assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{m:o}");
            }
            std::fs::set_permissions(&f, mode(0o700)).unwrap();
            let e = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o4755)
                .open(d.join("g"))
                .unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EPERM));
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o755)
                .open(d.join("h"))
                .unwrap();
            let mut b = std::fs::DirBuilder::new();
            std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o2755);
            let e = b.create(d.join("sub")).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EPERM));
            // SAFETY: openat2 with a null `how` fails either way; the
            // filter answers first.
            let r =
                unsafe { libc::syscall(libc::SYS_openat2, libc::AT_FDCWD, c"/".as_ptr(), 0, 0) };
            assert_eq!(r, -1);
            assert_eq!(
                std::io::Error::last_os_error().raw_os_error(),
                Some(libc::ENOSYS)
            );
        })
        .join()
        .unwrap();
        assert_eq!(
            std::fs::metadata(&f).unwrap().permissions().mode() & 0o7777,
            0o700
        );
        assert!(!dir.path().join("g").exists());
        assert!(!dir.path().join("sub").exists());
    }
}
