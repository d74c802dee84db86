//! The probes: each one attack (or one write the policy allows) as a shell
//! script the sandboxed command runs, and what the host sees when it landed.
//! These are hull's escape probes, written once: `hull canary` runs them on
//! a user's machine and the test suite (`tests/tests/escape.rs`) asserts
//! their verdicts on every tier.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Output;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::decoy::{Decoy, Setup, DEVICE, SHM_DATA, SYSCTL};
use crate::tier::Tier;

/// Attack or positive check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Attack,
    Positive,
}

/// What hull's caller hands it: the descriptors a probe aims at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// Standard input from /dev/null, output to pipes.
    Plain,
    /// Also the decoy home open as descriptor 3 (as `3<DIR` or `flock DIR
    /// cmd` leave it): its magic link leads out of every mount namespace.
    Fd3Home,
    /// Standard output is the caller's log file, with what the caller wrote
    /// before the run in it.
    StdoutLog,
    /// The caller kills hull (SIGKILL) once the command has printed
    /// [`STARTED`]: what it left running must not act afterwards.
    KillsHull,
}

/// The line a probe of [`Caller::KillsHull`] (or of [`Others`] at
/// [`When::Started`]) prints once its command runs.
pub const STARTED: &str = "HULL-CANARY-STARTED";

/// Other runs of the same user on the same tier and project, the attacked
/// ones of a probe about runs reaching each other: `hull run` with
/// `script(decoy, i)` for each `i` below `runs`, one after another.
#[derive(Debug, Clone, Copy)]
pub struct Others {
    pub when: When,
    pub runs: u32,
    pub script: fn(&Decoy, u32) -> String,
}

/// How a probe shows its attack can land, so that a denial means something.
#[derive(Debug, Clone, Copy)]
pub enum Control {
    /// The attack, under tier `none`, must land.
    TierNone,
    /// The attack is on a mechanism of some tiers only (tier `none` has
    /// nothing like it, said by `why`): its first step must work on the
    /// tier itself.
    FirstStep { why: &'static str },
}

/// When a probe's [`Others`] run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// Beside the probe's command, once it printed [`STARTED`].
    Started,
    /// After the probe's run ended.
    Ended,
}

/// What the caller wrote to its log before the run.
pub fn earlier_log(d: &Decoy) -> String {
    format!("EARLIER-LOG-{}\n", d.secret)
}

/// One probe.
#[derive(Debug)]
pub struct Probe {
    pub id: &'static str,
    pub class: &'static str,
    pub kind: Kind,
    /// The class is about hull running as root (the command would own
    /// the target otherwise): n/a when hull is not root.
    pub needs_root: bool,
    pub setup: Setup,
    /// How long to wait after the run before looking (a process that
    /// outlived the run acts late).
    pub settle: Duration,
    /// A host file whose state the probe changes under its control: held
    /// locked (flock) across the probe's runs, so two canaries at once do
    /// not see each other's control.
    pub host_lock: Option<&'static str>,
    /// The control runs the script without hull: tier `none` ends the
    /// process tree too, which is what the probe is about.
    pub control_without_hull: bool,
    /// What hull's caller hands it besides the command line.
    pub caller: Caller,
    /// Other runs the probe's command attacks, if any.
    pub others: Option<Others>,
    pub control: Control,
    /// What the attack's first step did on the tier, from the command's
    /// output (`None`: it did not work there, so a denial proves nothing).
    pub first_step: Option<fn(&Output) -> Option<String>>,
    /// The command's environment beyond the policy's (`hull run --env`).
    pub env: fn(&Decoy) -> Vec<(String, String)>,
    /// Why the probe does not apply to a tier on this host, if it does not.
    pub unavailable: fn(&Decoy, Tier) -> Option<String>,
    pub script: fn(&Decoy, Tier) -> String,
    /// What the host saw, when the attack (or the allowed write) landed.
    pub landed: fn(&Decoy, &Output) -> Option<String>,
}

impl Probe {
    const fn attack(
        id: &'static str,
        class: &'static str,
        script: fn(&Decoy, Tier) -> String,
        landed: fn(&Decoy, &Output) -> Option<String>,
    ) -> Probe {
        Probe {
            id,
            class,
            kind: Kind::Attack,
            needs_root: false,
            setup: Setup::Project,
            settle: Duration::ZERO,
            host_lock: None,
            control_without_hull: false,
            unavailable: |_, _| None,
            caller: Caller::Plain,
            others: None,
            control: Control::TierNone,
            first_step: None,
            env: |_| Vec::new(),
            script,
            landed,
        }
    }

    const fn positive(mut self) -> Probe {
        self.kind = Kind::Positive;
        self
    }

    const fn with_env(mut self, env: fn(&Decoy) -> Vec<(String, String)>) -> Probe {
        self.env = env;
        self
    }

    const fn about_root(mut self) -> Probe {
        self.needs_root = true;
        self
    }
}

/// The argument of `outlive_hull`'s sleeping survivor: this decoy's alone
/// (its listener's port) while it exists.
fn survivor_mark(d: &Decoy) -> String {
    format!("9.{}", d.listener_port)
}

/// How many runs `swap_a_rule_target` attacks (each writes 8 times below
/// `src`: under tier `none` every write has about even odds of landing
/// outside, so the control never misses; each run binds its rules once).
const RACED_RUNS: u32 = 6;

/// Host processes that are `sleep <mark>`.
fn survivors(mark: &str) -> Vec<i32> {
    let want = format!("sleep\0{mark}\0");
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == want.as_bytes())
        })
        .collect()
}

fn secret_shown(d: &Decoy, o: &Output) -> Option<String> {
    said(o, &d.secret, "the secret was in the command's output")
}

/// `marker` in the command's output: for what the host cannot see
/// afterwards (a read, a watch, an attach), the command's own report.
fn said(o: &Output, marker: &str, what: &str) -> Option<String> {
    String::from_utf8_lossy(&o.stdout)
        .contains(marker)
        .then(|| what.to_string())
}

/// `<word> <n>` in the command's output with `n` > 0, as "n what".
fn counted(o: &Output, word: &str, what: &str) -> Option<String> {
    let out = String::from_utf8_lossy(&o.stdout);
    let n = out
        .lines()
        .filter_map(|l| l.strip_prefix(word)?.trim().parse::<u64>().ok())
        .next_back()?;
    (n > 0).then(|| format!("{n} {what}"))
}

/// Whether a host listener's counter saw anything since the reset.
fn arrived(n: &std::sync::atomic::AtomicUsize, what: &str) -> Option<String> {
    (n.swap(0, Ordering::AcqRel) > 0).then(|| what.to_string())
}

fn exists(p: &Path) -> Option<String> {
    std::fs::symlink_metadata(p)
        .is_ok()
        .then(|| format!("{} exists on the host", p.display()))
}

fn changed(p: &Path, was: &str) -> Option<String> {
    match std::fs::read_to_string(p) {
        Ok(now) if now == was => None,
        Ok(_) => Some(format!("{} was changed on the host", p.display())),
        Err(_) => Some(format!("{} is gone from the host", p.display())),
    }
}

fn setid_files(dir: &Path) -> Option<String> {
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let m = e.metadata().ok()?;
        if m.permissions().mode() & 0o6000 != 0 {
            return Some(format!(
                "{} has set-id bits ({:o}) on the host",
                e.path().display(),
                m.permissions().mode() & 0o7777
            ));
        }
    }
    None
}

/// The probes, in the order they run.
pub fn probes() -> Vec<Probe> {
    vec![
        // ---- reads and writes outside the grants
        Probe::attack(
            "read_outside_file",
            "read outside the grants",
            |d, _| format!("cat '{}/secret.txt'", d.outside.display()),
            secret_shown,
        ),
        Probe::attack(
            "read_home_key",
            "read outside the grants",
            |d, _| format!("cat '{}/.ssh/id_canary'", d.home.display()),
            secret_shown,
        ),
        Probe::attack(
            "list_home",
            "read outside the grants",
            |d, _| format!("ls -a '{}'", d.home.display()),
            |_, o| said(o, ".ssh", "the home's entries were listed"),
        ),
        Probe::attack(
            "proc_root",
            "read outside the grants",
            |d, _| {
                format!(
                    "for p in 1 self $PPID; do cat /proc/$p/root'{}/.ssh/id_canary'; done",
                    d.home.display()
                )
            },
            secret_shown,
        ),
        Probe::attack(
            "write_outside",
            "write outside the grants",
            |d, _| format!("echo canary > '{}/written'", d.outside.display()),
            |d, _| exists(&d.outside.join("written")),
        ),
        Probe::attack(
            "overwrite_outside",
            "write outside the grants",
            |d, _| format!("echo changed > '{}/secret.txt'", d.outside.display()),
            |d, _| changed(&d.outside.join("secret.txt"), &format!("{}\n", d.secret)),
        ),
        Probe::attack(
            "remove_outside",
            "write outside the grants",
            |d, _| format!("rm -f '{}/secret.txt'", d.outside.display()),
            |d, _| changed(&d.outside.join("secret.txt"), &format!("{}\n", d.secret)),
        ),
        Probe::attack(
            "metadata_outside",
            "metadata outside the grants",
            |d, _| {
                format!(
                    "f='{}/key'; chmod 0666 $f; touch -m -d 2001-01-01 $f; \
                     python3 -c 'import os; os.setxattr(\"'$f'\", \"user.hull\", b\"x\")'",
                    d.outside.display()
                )
            },
            |d, _| {
                let key = d.outside.join("key");
                let m = std::fs::metadata(&key).ok()?;
                if m.mode() & 0o7777 != 0o644 {
                    return Some(format!(
                        "its mode is now {:o} on the host",
                        m.mode() & 0o7777
                    ));
                }
                if m.mtime() < 1_000_000_000 + 86400 * 365 {
                    return Some("its modification time was set on the host".into());
                }
                xattr_set(&key).then(|| "an xattr was set on it on the host".into())
            },
        ),
        // ---- nothing of the command runs before its boundary
        Probe::attack(
            "helper_environment",
            "hull's own helpers",
            |_, _| "true".into(),
            |d, _| {
                let dropped: Vec<String> = std::fs::read_dir(d.root.join("drop"))
                    .ok()?
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect();
                (!dropped.is_empty()).then(|| {
                    format!(
                        "the dynamic loader of a process started with the command's \
                         environment wrote {} on the host",
                        dropped.join(", ")
                    )
                })
            },
        )
        .with_env(|d| {
            // glibc's loader writes its debug output to this file of any
            // process that starts with these variables: hull's helpers
            // before the boundary (anyone may write in the drop directory)
            // as much as the command.
            vec![
                ("LD_DEBUG".into(), "files".into()),
                (
                    "LD_DEBUG_OUTPUT".into(),
                    d.root.join("drop/ld").display().to_string(),
                ),
            ]
        }),
        // ---- what is protected inside the project
        Probe::attack(
            "protected_metadata",
            "protected paths",
            |_, _| {
                "for p in .git .git/config .hull vendor/ro; do chmod 0777 $p; \
                 touch -h -m -d 2001-01-01 $p; done; \
                 python3 -c 'import os, struct; os.setxattr(\".hull\", \"system.posix_acl_default\", \
                 struct.pack(\"<I\", 2) + b\"\".join(struct.pack(\"<HHI\", t, 7, 0xffffffff) \
                 for t in (1, 4, 0x20)))'"
                    .into()
            },
            |d, _| {
                for p in [".git", ".git/config", ".hull", "vendor/ro"] {
                    let path = d.project.join(p);
                    let m = std::fs::symlink_metadata(&path).ok()?;
                    if m.mode() & 0o777 == 0o777 {
                        return Some(format!("{p} is now mode 777 on the host"));
                    }
                    if m.mtime() < 1_000_000_000 + 86400 * 365 {
                        return Some(format!("{p}'s modification time was set on the host"));
                    }
                    if xattr_set(&path) {
                        return Some(format!("an xattr or ACL was set on {p} on the host"));
                    }
                }
                None
            },
        ),
        Probe::attack(
            "git_hook",
            "protected paths",
            |_, _| "mkdir -p .git/hooks; echo 'echo pwned' > .git/hooks/pre-commit".into(),
            |d, _| exists(&d.project.join(".git/hooks/pre-commit")),
        ),
        Probe::attack(
            "git_config",
            "protected paths",
            |_, _| "printf '[core]\\n\\tfsmonitor = touch pwned\\n' >> .git/config".into(),
            |d, _| {
                std::fs::read_to_string(d.project.join(".git/config"))
                    .ok()?
                    .contains("fsmonitor")
                    .then(|| ".git/config has the command's fsmonitor".into())
            },
        ),
        Probe::attack(
            "move_git",
            "protected paths",
            |_, _| "mv .git .git-moved || rm -rf .git".into(),
            |d, _| {
                exists(&d.project.join(".git-moved"))
                    .or_else(|| changed(&d.project.join(".git/HEAD"), "ref: refs/heads/main\n"))
            },
        ),
        Probe::attack(
            "hull_state",
            "protected paths",
            |_, _| "echo planted > .hull/planted".into(),
            |d, _| exists(&d.project.join(".hull/planted")),
        ),
        Probe {
            setup: Setup::Bare,
            ..Probe::attack(
                "protected_before_they_exist",
                "protected paths",
                |_, _| {
                    "mkdir -p .git/hooks; touch .git/hooks/x; mkdir -p .hull; touch .hull/x".into()
                },
                // A placeholder hull left is as bad: an empty .git makes
                // the project look like a repository.
                |d, _| exists(&d.project.join(".git")).or_else(|| exists(&d.project.join(".hull"))),
            )
        },
        Probe::attack(
            "nested_repository",
            "protected paths",
            |_, _| {
                "printf '[core]\\n\\tfsmonitor = touch pwned\\n' >> vendor/nested/.git/config"
                    .into()
            },
            |d, _| {
                changed(
                    &d.project.join("vendor/nested/.git/config"),
                    "[core]\n\tbare = false\n",
                )
            },
        ),
        Probe::attack(
            "git_config_targets",
            "protected paths",
            |_, _| {
                "echo 'touch pwned' >> .githooks/pre-commit; \
                 printf '[core]\\n\\tfsmonitor = true\\n' >> shared.gitconfig"
                    .into()
            },
            |d, _| {
                changed(
                    &d.project.join(".githooks/pre-commit"),
                    "#!/bin/sh\nexit 0\n",
                )
                .or_else(|| {
                    changed(
                        &d.project.join("shared.gitconfig"),
                        "[user]\n\tname = canary\n",
                    )
                })
            },
        ),
        Probe::attack(
            "nested_read_only_grant",
            "protected paths",
            |_, _| "echo evil > vendor/ro/code.txt; echo new > vendor/ro/new.txt".into(),
            |d, _| {
                changed(&d.project.join("vendor/ro/code.txt"), "vendored\n")
                    .or_else(|| exists(&d.project.join("vendor/ro/new.txt")))
            },
        ),
        Probe::attack(
            "rename_an_ancestor",
            "protected paths",
            |_, _| "mv vendor moved && mkdir -p vendor/ro && echo evil > vendor/ro/code.txt".into(),
            |d, _| changed(&d.project.join("vendor/ro/code.txt"), "vendored\n"),
        ),
        // ---- links
        Probe::attack(
            "symlink_made_inside",
            "links out of the project",
            |d, _| format!("ln -s '{}/secret.txt' lnk; cat lnk", d.outside.display()),
            secret_shown,
        ),
        Probe::attack(
            "symlink_planted",
            "links out of the project",
            |_, _| "cat src/link; echo new > src/dirlink/planted".into(),
            |d, o| secret_shown(d, o).or_else(|| exists(&d.outside.join("planted"))),
        ),
        Probe::attack(
            "hardlink_out",
            "links out of the project",
            |d, _| {
                format!(
                    "ln '{}/secret.txt' hl && cat hl && echo changed >> hl",
                    d.outside.display()
                )
            },
            |d, o| {
                secret_shown(d, o)
                    .or_else(|| changed(&d.outside.join("secret.txt"), &format!("{}\n", d.secret)))
            },
        ),
        // ---- what hull's caller has open
        Probe {
            caller: Caller::Fd3Home,
            control_without_hull: true,
            ..Probe::attack(
                "inherited_descriptor",
                "descriptors of hull's caller",
                |_, _| {
                    "cat /proc/self/fd/3/.ssh/id_canary; echo planted > /proc/self/fd/3/planted"
                        .into()
                },
                |d, o| secret_shown(d, o).or_else(|| exists(&d.home.join("planted"))),
            )
        },
        Probe {
            caller: Caller::StdoutLog,
            control_without_hull: true,
            ..Probe::attack(
                "stdout_file_reopened",
                "descriptors of hull's caller",
                // A relay pipe's write end reopens as its read end, which
                // blocks: hence the timeout.
                |_, _| {
                    "timeout 2 cat /proc/self/fd/1 >&2; (echo overwritten > /proc/self/fd/1) \
                     2>/dev/null; echo appended"
                        .into()
                },
                |d, o| {
                    if String::from_utf8_lossy(&o.stderr).contains(earlier_log(d).trim_end()) {
                        return Some("the command read what its caller wrote to its log".into());
                    }
                    // `o.stdout` is the log as it is now.
                    (!o.stdout.starts_with(earlier_log(d).as_bytes()))
                        .then(|| "the command truncated its caller's log".into())
                },
            )
        },
        // ---- what hull running as root must not hand the command
        Probe::attack(
            "root_only_file",
            "root-only files in a grant",
            |d, _| format!("cat '{}/root-only.txt'", d.shared.display()),
            secret_shown,
        )
        .about_root(),
        Probe::attack(
            "setid_bits",
            "set-id bits",
            |_, _| {
                "cp /bin/true src/suid; chmod 4755 src/suid; cp /bin/true src/sgid; \
                 chmod 2755 src/sgid; python3 -c 'import os; \
                 os.close(os.open(\"src/new\", os.O_CREAT | os.O_WRONLY, 0o4755)); \
                 os.mkdir(\"src/dir\", 0o2755)'"
                    .into()
            },
            |d, _| setid_files(&d.project.join("src")),
        ),
        Probe {
            host_lock: Some(SYSCTL),
            ..Probe::attack(
                "kernel_knob",
                "host kernel settings",
                |d, _| format!("echo {} > {SYSCTL}", d.sysctl_value() + 1),
                |d, _| d.sysctl_changed(),
            )
            .about_root()
        },
        Probe {
            host_lock: Some(DEVICE),
            ..Probe::attack(
                "device_node_mode",
                "host kernel settings",
                |_, _| format!("chmod 0600 {DEVICE}"),
                |d, _| d.device_changed(),
            )
            .about_root()
        },
        // ---- other host processes, IPC and sockets
        Probe::attack(
            "signal_host_process",
            "host processes",
            |d, t| format!("kill -TERM {}", d.victim_pid(t)),
            |d, _| d.victim_touched(),
        ),
        Probe::attack(
            "prlimit_host_process",
            "host processes",
            |d, t| {
                format!(
                    "python3 -c 'import resource; \
                     resource.prlimit({}, resource.RLIMIT_NOFILE, (7, 7))'",
                    d.victim_pid(t)
                )
            },
            |d, _| d.victim_touched(),
        ),
        Probe::attack(
            "host_process_environ",
            "host processes",
            |d, t| format!("cat /proc/{}/environ", d.victim_pid(t)),
            secret_shown,
        ),
        Probe::attack(
            "ptrace_host_process",
            "host processes",
            |d, t| {
                format!(
                    "python3 -c 'import ctypes; l = ctypes.CDLL(None); \
                     print(\"ATTACHED\" if l.ptrace(16, {}, 0, 0) == 0 else \"refused\")'",
                    d.victim_pid(t)
                )
            },
            |_, o| said(o, "ATTACHED", "the command attached to a host process"),
        ),
        Probe::attack(
            "host_sysv_shm",
            "host IPC",
            |d, _| {
                let key = d.shm.as_ref().map_or(0, |s| s.key);
                format!(
                    "python3 -c 'import ctypes, sys; l = ctypes.CDLL(None); \
                     l.shmat.restype = ctypes.c_void_p; i = l.shmget({key}, 0, 0); \
                     sys.exit(\"shmget failed\") if i < 0 else None; p = l.shmat(i, None, 0); \
                     sys.exit(\"shmat failed\") if p in (None, 2**64 - 1) else None; \
                     ctypes.memmove(p, b\"PWNED-IPC\", 9)'"
                )
            },
            |d, _| {
                let now = d.shm.as_ref()?.get();
                (&now != SHM_DATA).then(|| "the host's shared memory was written".into())
            },
        ),
        Probe::attack(
            "host_unix_socket",
            "host sockets under a grant",
            |d, _| {
                format!(
                    "python3 -c 'import socket, os\n\
                     def go(f):\n  try: f()\n  except OSError: pass\n\
                     def stream():\n  s = socket.socket(socket.AF_UNIX); s.settimeout(3); \
                     s.connect(\"{0}/host.sock\")\n\
                     def dgram():\n  socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\
                     .sendto(b\"x\", \"{0}/host.dgram\")\n\
                     def link():\n  os.symlink(\"{0}/host.sock\", \"l.sock\"); \
                     s = socket.socket(socket.AF_UNIX); s.connect(\"l.sock\")\n\
                     def abstract():\n  s = socket.socket(socket.AF_UNIX); s.settimeout(3); \
                     s.connect(\"\\0{1}\")\n\
                     go(stream); go(dgram); go(link); go(abstract)'",
                    d.shared.display(),
                    d.abstract_name
                )
            },
            |d, _| {
                arrived(
                    &d.unix_arrivals,
                    "the host's unix socket received from the command",
                )
            },
        ),
        Probe::attack(
            "tcp_host_loopback",
            "network",
            |d, _| {
                format!(
                    "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {}), 3)'",
                    d.listener_port
                )
            },
            |d, _| arrived(&d.connections, "the host's listener accepted a connection"),
        ),
        Probe {
            unavailable: |_, t| {
                (t == Tier::Vm).then(|| {
                    "tier 3's guest has a vsock space of its own, with no device to the \
                     host's (vsock_host covers it)"
                        .into()
                })
            },
            ..Probe::attack(
                "vsock_bind",
                "network",
                |_, _| {
                    "python3 -c 'import socket; s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM); \
                     s.bind((socket.VMADDR_CID_ANY, socket.VMADDR_PORT_ANY)); print(\"VSOCK-BOUND\")'"
                        .into()
                },
                |_, o| {
                    said(
                        o,
                        "VSOCK-BOUND",
                        "the command bound a socket in the host's vsock space",
                    )
                },
            )
        },
        Probe {
            unavailable: |d, _| {
                d.vsock_port.is_none().then(|| {
                    "this host's vsock space has no transport that reaches its own \
                     listeners (no vsock_loopback)"
                        .into()
                })
            },
            ..Probe::attack(
                "vsock_host",
                "network",
                |d, _| {
                    format!(
                    "python3 -c 'import socket; s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM); \
                     s.settimeout(3); s.connect((1, {}))'",
                    d.vsock_port.unwrap_or(0)
                )
                },
                |d, _| {
                    arrived(
                        &d.vsock_arrivals,
                        "the host's vsock listener accepted a connection",
                    )
                },
            )
        },
        Probe::attack(
            "inotify_outside",
            "watches outside the grants",
            |d, _| {
                format!(
                    "python3 -c 'import ctypes; l = ctypes.CDLL(None); fd = l.inotify_init1(0); \
                     print(\"WATCHING\" if l.inotify_add_watch(fd, b\"{}\", 0x100) >= 0 else \"refused\")'",
                    d.outside.display()
                )
            },
            |_, o| {
                said(
                    o,
                    "WATCHING",
                    "the command watched a directory outside its grants",
                )
            },
        ),
        Probe {
            settle: Duration::from_millis(1500),
            control_without_hull: true,
            ..Probe::attack(
                "outlive_the_run",
                "the process tree",
                |_, _| {
                    "setsid sh -c 'sleep 1; echo late > late.txt' </dev/null >/dev/null 2>&1 &"
                        .into()
                },
                |d, _| exists(&d.project.join("late.txt")),
            )
        },
        Probe {
            settle: Duration::from_millis(2500),
            control_without_hull: true,
            caller: Caller::KillsHull,
            ..Probe::attack(
                "outlive_hull",
                "the process tree",
                // hull is killed at the marker. A session leader of the
                // run's sleeps on (its argument marks it as this decoy's),
                // another writes into the project two seconds later,
                // unless they died with hull.
                |d, _| {
                    format!(
                        "setsid sleep {} </dev/null >/dev/null 2>&1 & \
                         setsid sh -c 'sleep 2; echo late > src/late.txt' </dev/null >/dev/null 2>&1 & \
                         echo {STARTED}; sleep 6 </dev/null >/dev/null 2>&1",
                        survivor_mark(d)
                    )
                },
                |d, _| {
                    let left = survivors(&survivor_mark(d));
                    if !left.is_empty() {
                        for pid in &left {
                            // SAFETY: kill(2) with integer arguments.
                            unsafe { libc::kill(*pid, libc::SIGKILL) };
                        }
                        return Some(format!(
                            "a process of the run still ran after hull was killed (pid {})",
                            left[0]
                        ));
                    }
                    exists(&d.project.join("src/late.txt"))
                },
            )
        },
        // ---- other runs
        Probe::attack(
            "other_run_cwd",
            "other runs",
            // A process of the uid the tier's command runs as (another run
            // of the same user, or of the sandbox user when hull is root),
            // whose working directory holds the secret.
            |d, t| {
                let pid = d.victim_pid(t);
                format!("cat /proc/{pid}/cwd/secret.txt; echo planted > /proc/{pid}/cwd/planted")
            },
            |d, o| secret_shown(d, o).or_else(|| exists(&d.outside.join("planted"))),
        ),
        Probe {
            others: Some(Others {
                when: When::Started,
                runs: RACED_RUNS,
                // The attacked run writes below `src` (the last one says
                // it is over).
                script: |_, i| {
                    let writes = format!(
                        "for j in 1 2 3 4 5 6 7 8; do echo a > src/raced-{i}-$j; done 2>/dev/null"
                    );
                    if i + 1 == RACED_RUNS {
                        format!("{writes}; touch raced.done")
                    } else {
                        writes
                    }
                },
            }),
            first_step: Some(|o| counted(o, "SWAPPED", "times src and the link were swapped")),
            unavailable: |_, t| {
                (t == Tier::Vm).then(|| {
                    "tier 3's grants are its shares, opened when its VM starts, and its \
                     guest resolves a link within its own tree"
                        .into()
                })
            },
            ..Probe::attack(
                "swap_a_rule_target",
                "other runs",
                // The project's `src` is swapped with a link to the drop
                // directory (outside every grant, writable by anyone) over
                // and over, while other runs of the same project start and
                // write below `src`: a rule of theirs bound to the path, not
                // to the directory the plan saw, lands outside.
                |d, _| {
                    format!(
                        "ln -s '{}' lnk && echo {STARTED} && /usr/bin/python3 -c '
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
end = time.time() + 30
n = 0
while time.time() < end and not os.path.exists(\"raced.done\"):
    n += libc.renameat2(-100, b\"src\", -100, b\"lnk\", 2) == 0
print(\"SWAPPED\", n)
'",
                        d.root.join("drop").display()
                    )
                },
                |d, _| {
                    let raced: Vec<String> = std::fs::read_dir(d.root.join("drop"))
                        .ok()?
                        .flatten()
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .filter(|n| n.starts_with("raced-"))
                        .collect();
                    (!raced.is_empty()).then(|| {
                        format!(
                            "another run's write below src landed outside the project: {}",
                            raced.join(", ")
                        )
                    })
                },
            )
        },
        // ---- hull's own state in the project
        Probe {
            others: Some(Others {
                when: When::Ended,
                runs: 1,
                script: |_, _| {
                    "for i in 1 2 3 4 5 6 7 8; do mkdir fresh$i; touch fresh$i.txt; done".into()
                },
            }),
            control: Control::FirstStep {
                why: "tier none keeps no pool of spares; the control is the attack's first \
                      step on the tier (the spares were written)",
            },
            first_step: Some(|o| counted(o, "PLANTED", "spares were written")),
            unavailable: |_, t| {
                (t != Tier::Landlock && t != Tier::None)
                    .then(|| "only the landlock tier keeps a pool of spares in the project".into())
            },
            ..Probe::attack(
                "planted_spare",
                "hull's state in the project",
                // Every spare the command reaches is written into, and its
                // pool's seal touched (its time was once trusted); the next
                // run's new directories and files, spares of that pool,
                // must come to it empty.
                |_, _| {
                    "n=0; for f in .hull/spares-*/c*/*; do \
                     if [ -d \"$f\" ]; then echo planted > \"$f/inside\" && n=$((n+1)); \
                     else echo planted >> \"$f\" && n=$((n+1)); fi; done 2>/dev/null; \
                     for s in .hull/spares-*/seal; do chmod 0644 \"$s\"; touch \"$s\"; done \
                     2>/dev/null; echo PLANTED $n"
                        .into()
                },
                |d, _| {
                    for i in 1..=8 {
                        let dir = d.project.join(format!("fresh{i}"));
                        if std::fs::read_dir(&dir).is_ok_and(|mut e| e.next().is_some()) {
                            return Some(format!(
                                "the next run's new fresh{i} held what this one planted"
                            ));
                        }
                        let file = d.project.join(format!("fresh{i}.txt"));
                        if std::fs::metadata(&file).is_ok_and(|m| m.len() > 0) {
                            return Some(format!(
                                "the next run's new fresh{i}.txt held what this one planted"
                            ));
                        }
                    }
                    None
                },
            )
        },
        // ---- what the policy allows must work, or the denials prove nothing
        Probe::attack(
            "mkdir_rmdir_loop",
            "allowed writes",
            // More top-level directories made and removed than the landlock
            // tier keeps spares for (64): each removal gives its spare back.
            |_, _| {
                "i=0; while [ $i -lt 200 ]; do mkdir loop.d && rmdir loop.d || exit 1; \
                 i=$((i + 1)); done; mkdir after && echo ok > after/f.txt"
                    .into()
            },
            |d, _| {
                (std::fs::read_to_string(d.project.join("after/f.txt")).ok()? == "ok\n"
                    && !d.project.join("loop.d").exists())
                .then(|| "200 top-level directories made and removed, then one more".into())
            },
        )
        .positive(),
        Probe::attack(
            "write_project",
            "allowed writes",
            |_, _| {
                "echo ok > top.txt && mkdir -m 0750 sub && echo ok > sub/f.txt && \
                 chmod 0700 top.txt && ulimit -n 64 && test \"$(ulimit -n)\" = 64 && \
                 echo ok > src/limits.txt"
                    .into()
            },
            |d, _| {
                let p = &d.project;
                let top = std::fs::read_to_string(p.join("top.txt")).ok()?;
                let sub = std::fs::read_to_string(p.join("sub/f.txt")).ok()?;
                let mode = std::fs::metadata(p.join("top.txt")).ok()?.mode() & 0o7777;
                (top == "ok\n"
                    && sub == "ok\n"
                    && mode == 0o700
                    && p.join("src/limits.txt").exists())
                .then(|| "the files, the mode and the command's own limit landed".into())
            },
        )
        .positive(),
        Probe::attack(
            "read_grants",
            "allowed reads",
            |d, _| {
                format!(
                    "cat input.txt '{}/public.txt' .git/HEAD vendor/ro/code.txt && \
                     head -c 4 /dev/zero | od -An -tx1",
                    d.shared.display()
                )
            },
            |d, o| {
                let out = String::from_utf8_lossy(&o.stdout);
                let all = [
                    d.secret.as_str(),
                    "public-data",
                    "refs/heads/main",
                    "vendored",
                    "00 00 00 00",
                ];
                all.iter().all(|s| out.contains(s)).then(|| {
                    "the project, its .git and read-only grant, a grant outside and /dev/zero \
                     were read"
                        .into()
                })
            },
        )
        .positive(),
    ]
}

#[cfg(target_os = "linux")]
fn xattr_set(p: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(p.as_os_str().as_bytes()) else {
        return false;
    };
    // The probes' own attribute, or a default ACL (none is made here).
    [c"user.hull", c"system.posix_acl_default"]
        .iter()
        .any(|name| {
            // SAFETY: both strings are NUL-terminated; a zero-size buffer only
            // asks for the value's size.
            let n =
                unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) };
            n >= 0
        })
}

#[cfg(not(target_os = "linux"))]
fn xattr_set(_: &Path) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_probe_has_a_distinct_id_and_both_kinds_exist() {
        let p = probes();
        let mut ids: Vec<&str> = p.iter().map(|p| p.id).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), p.len());
        assert!(p.iter().any(|p| p.kind == Kind::Positive));
        assert!(p.iter().filter(|p| p.kind == Kind::Attack).count() >= 30);
    }

    #[test]
    fn every_class_of_the_security_issues_has_a_probe() {
        let classes: Vec<&str> = probes().iter().map(|p| p.class).collect();
        for c in [
            "read outside the grants",
            "write outside the grants",
            "metadata outside the grants",
            "protected paths",
            "links out of the project",
            "root-only files in a grant",
            "set-id bits",
            "host kernel settings",
            "host processes",
            "host IPC",
            "host sockets under a grant",
            "network",
            "watches outside the grants",
            "the process tree",
            "descriptors of hull's caller",
            "hull's own helpers",
            "other runs",
            "hull's state in the project",
        ] {
            assert!(classes.contains(&c), "{c}");
        }
    }
}
