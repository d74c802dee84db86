//! Seatbelt lowering: the resolved policy as an SBPL profile for macOS
//! `/usr/bin/sandbox-exec`, with every host path passed as a `-D` parameter.
//!
//! The profile is deny-by-default. Reads, executes and writes are allowed
//! only under the policy's grants; protected paths are cut out of every allow
//! rule that covers them, by both `literal` and `subpath`, so a protected name
//! can be neither opened, created (`mkdir .hull`), renamed nor removed, even
//! before it exists. The directories above a protected path inside a writable
//! root are cut out of the write rule as literals, so the command cannot move
//! a protected path away by renaming its parent (creating and removing
//! entries inside those directories is checked on the entry's own path and
//! stays allowed). A policy grant that lies inside a protected path is
//! refused (the protection wins); only hull's own instance `tmp/` and
//! `spill/` are granted inside the runs mask, which is how one instance sees
//! its own run dir and never another's, although they share a parent.
//!
//! Rules exclude instead of relying on rule order, so the profile means the
//! same whatever precedence the Seatbelt compiler gives overlapping rules.
//!
//! What this protects against: a command that ignores `TMPDIR`, guesses
//! another instance's run dir, writes `.hull/` or `.git/hooks` in the project,
//! or opens a network socket (the policy's only network mode is `none`, and
//! no network rule is emitted; `(deny network*)` closes the profile).
//!
//! What it does not: Seatbelt matches resolved (real) paths, so the policy
//! must be canonicalized first (`/tmp` is `/private/tmp` on macOS). That is the
//! launcher's job (hull's `tier::seatbelt`); this lowering is pure. A hidden
//! name still appears in its parent's listing (only opening, stat and every
//! write are refused). Hard links: whether Seatbelt checks a hard link's
//! source path is not verified here (see `docs/tiers.md`).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Component, Path, PathBuf};

use serde::Serialize;

use crate::{Access, Grant, GrantOrigin, HostFs, NodeKind, Policy, Protect, Protection};

/// Symlinks followed before giving up (the kernel's `MAXSYMLINKS` is 32).
const MAX_SYMLINKS: usize = 32;

/// Why a policy's paths could not be resolved as macOS resolves them.
#[derive(Debug, thiserror::Error)]
pub enum CanonicalError {
    #[error("tier seatbelt: cannot canonicalize {path}: too many levels of symlinks")]
    SymlinkLoop { path: PathBuf },
    #[error("tier seatbelt: path {path} is not absolute")]
    NotAbsolute { path: PathBuf },
}

/// The lowered form: profile text plus the `-D NAME=PATH` parameters it uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SeatbeltProfile {
    /// SBPL text. Contains no host path from the policy, only `(param "NAME")`.
    pub text: String,
    /// Parameters in the order they are passed to `sandbox-exec -D`.
    pub params: Vec<(String, PathBuf)>,
}

impl SeatbeltProfile {
    /// The `-D` arguments, `NAME=PATH` each (paths are passed as OS strings).
    pub fn d_args(&self) -> Vec<std::ffi::OsString> {
        self.params
            .iter()
            .flat_map(|(k, v)| {
                let mut kv = std::ffi::OsString::from(format!("{k}="));
                kv.push(v.as_os_str());
                [std::ffi::OsString::from("-D"), kv]
            })
            .collect()
    }

    /// Text for `hull policy explain --tier seatbelt`: the parameters, then
    /// the profile.
    pub fn explain(&self) -> String {
        let mut out = String::from("; parameters (sandbox-exec -D NAME=PATH)\n");
        for (k, v) in &self.params {
            let _ = writeln!(out, ";   {k} = {}", v.display());
        }
        out.push_str(&self.text);
        out
    }
}

/// System paths a process needs to start on macOS (dyld, the shared cache,
/// libSystem and its data). Read and map-executable, never writable.
const SYSTEM_EXEC: &[&str] = &[
    "/usr/lib",
    "/System/Library",
    "/System/Volumes/Preboot/Cryptexes",
    "/private/var/db/dyld",
];
/// System data read at start-up: time zones (`/etc/localtime` points here).
const SYSTEM_READ: &[&str] = &["/private/var/db/timezone"];
/// Single files shells read: `/bin/sh` on macOS reads this symlink to choose
/// the shell it runs (the one the reference harness missed).
const SYSTEM_FILES: &[&str] = &["/private/var/select/sh"];
/// Directories whose metadata path walks and `realpath` need. `/tmp`, `/var`
/// and `/etc` are the root symlinks to `/private/...`.
const SYSTEM_METADATA: &[&str] = &[
    "/private",
    "/private/var",
    "/private/var/select",
    "/private/var/db",
    "/tmp",
    "/var",
    "/etc",
    "/dev",
];
/// Devices read and written (data and ioctl).
const DEVICES_RW: &[&str] = &["/dev/null", "/dev/tty", "/dev/dtracehelper"];
/// Devices only read.
const DEVICES_R: &[&str] = &["/dev/zero", "/dev/random", "/dev/urandom"];
/// Links to the process's own descriptors.
const DEVICE_FD_LINKS: &[&str] = &["/dev/stdin", "/dev/stdout", "/dev/stderr"];
/// sysctls read by shells, compilers and runtimes (CPU count, page size, OS
/// version). Names, not paths.
const SYSCTLS: &[&str] = &[
    "hw.activecpu",
    "hw.byteorder",
    "hw.cachelinesize_compat",
    "hw.cpufamily",
    "hw.cputype",
    "hw.l1dcachesize_compat",
    "hw.l2cachesize_compat",
    "hw.logicalcpu",
    "hw.logicalcpu_max",
    "hw.machine",
    "hw.memsize",
    "hw.model",
    "hw.ncpu",
    "hw.nperflevels",
    "hw.pagesize",
    "hw.pagesize_compat",
    "hw.physicalcpu",
    "hw.physicalcpu_max",
    "kern.argmax",
    "kern.hostname",
    "kern.maxfilesperproc",
    "kern.maxproc",
    "kern.osproductversion",
    "kern.osrelease",
    "kern.ostype",
    "kern.osversion",
    "kern.secure_kernel",
    "kern.usrstack64",
    "kern.version",
    "machdep.cpu.brand_string",
    "sysctl.proc_cputype",
    "vm.loadavg",
];
const SYSCTL_PREFIXES: &[&str] = &["hw.optional.", "hw.perflevel", "kern.proc.pid."];

/// The scope of an allow rule: a parameter (policy path) or a fixed system
/// path (a constant of this module, never policy input).
#[derive(Debug, Clone)]
enum Scope {
    Param(String),
    Fixed(&'static str),
}

impl Scope {
    fn sbpl(&self, kind: &str) -> String {
        match self {
            Scope::Param(name) => format!("({kind} (param \"{name}\"))"),
            Scope::Fixed(p) => format!("({kind} \"{p}\")"),
        }
    }
}

/// Parameter names, assigned deterministically: `GRANT_i` and `PROTECT_i`
/// follow the policy's own order; `PARENT_i` the order of first use.
#[derive(Debug, Default)]
struct Params {
    list: Vec<(String, PathBuf)>,
    parents: BTreeMap<PathBuf, String>,
}

impl Params {
    fn add(&mut self, name: String, path: &Path) -> String {
        self.list.push((name.clone(), path.to_path_buf()));
        name
    }

    fn parent(&mut self, path: &Path) -> String {
        if let Some(n) = self.parents.get(path) {
            return n.clone();
        }
        let name = format!("PARENT_{}", self.parents.len());
        self.parents.insert(path.to_path_buf(), name.clone());
        self.add(name.clone(), path);
        name
    }
}

/// Whether `inner` is `outer` or below it (component-wise).
fn within(inner: &Path, outer: &Path) -> bool {
    inner.starts_with(outer)
}

/// Strict ancestors of `path`, nearest first, without `/`.
fn ancestors(path: &Path) -> impl Iterator<Item = &Path> {
    path.ancestors()
        .skip(1)
        .filter(|a| a.parent().is_some() && !a.as_os_str().is_empty())
}

/// One `(allow OPS ...)` rule over a scope minus exclusions.
fn allow(out: &mut String, ops: &str, scope: &Scope, excluded: &[String]) {
    if excluded.is_empty() {
        let _ = writeln!(out, "(allow {ops} {})", scope.sbpl("subpath"));
        return;
    }
    let _ = write!(
        out,
        "(allow {ops}\n  (require-all {}",
        scope.sbpl("subpath")
    );
    for e in excluded {
        let _ = write!(out, "\n    {e}");
    }
    out.push_str("))\n");
}

fn not_literal(name: &str) -> String {
    format!("(require-not (literal (param \"{name}\")))")
}

fn not_subpath(name: &str) -> String {
    format!("(require-not (subpath (param \"{name}\")))")
}

/// Lowers a resolved (and, on macOS, canonicalized) policy to a profile.
/// `proxy`: the loopback port of the run's proxy, for `net.mode =
/// "allowlist"`; without one nothing of the network is allowed.
pub fn lower(policy: &Policy, proxy: Option<u16>) -> SeatbeltProfile {
    let mut params = Params::default();
    let grant_names: Vec<String> = policy
        .grants
        .iter()
        .enumerate()
        .map(|(i, g)| params.add(format!("GRANT_{i}"), &g.path))
        .collect();
    let protect_names: Vec<String> = policy
        .protects
        .iter()
        .enumerate()
        .map(|(i, p)| params.add(format!("PROTECT_{i}"), &p.path))
        .collect();

    let mut t = String::new();
    let _ = writeln!(t, "(version 1)");
    let _ = writeln!(
        t,
        "; hull seatbelt profile for policy {:?}. Generated by hull; every policy path is a -D parameter.",
        sanitize_comment(&policy.name)
    );
    t.push_str("(deny default)\n\n");

    t.push_str("; processes: fork, and signals and info only inside this sandbox\n");
    t.push_str("(allow process-fork)\n");
    t.push_str("(allow signal (target same-sandbox))\n");
    t.push_str("(allow process-info* (target same-sandbox))\n");
    t.push_str("(allow ipc-posix-sem)\n");
    t.push_str("; user and group names (getpwuid), as id, whoami and ls -l need\n");
    t.push_str("(allow mach-lookup (global-name \"com.apple.system.opendirectoryd.libinfo\"))\n");
    t.push_str("(allow sysctl-read");
    for s in SYSCTLS {
        let _ = write!(t, "\n  (sysctl-name \"{s}\")");
    }
    for s in SYSCTL_PREFIXES {
        let _ = write!(t, "\n  (sysctl-name-prefix \"{s}\")");
    }
    t.push_str(")\n\n");

    t.push_str("; system: what any process needs to start (dyld, shared cache, libSystem)\n");
    for p in SYSTEM_EXEC {
        let ex = hidden_exclusions(policy, &protect_names, Path::new(p));
        allow(
            &mut t,
            "file-read* file-map-executable",
            &Scope::Fixed(p),
            &ex,
        );
    }
    for p in SYSTEM_READ {
        let ex = hidden_exclusions(policy, &protect_names, Path::new(p));
        allow(&mut t, "file-read*", &Scope::Fixed(p), &ex);
    }
    t.push_str("; the shell selector /bin/sh reads, and / itself (getcwd, path walks)\n");
    t.push_str("(allow file-read*");
    for p in SYSTEM_FILES {
        let _ = write!(t, " (literal \"{p}\")");
    }
    t.push_str(" (literal \"/\"))\n");
    t.push_str("(allow file-read-metadata");
    for p in SYSTEM_METADATA {
        let _ = write!(t, "\n  (literal \"{p}\")");
    }
    t.push_str(")\n\n");

    t.push_str("; devices\n");
    t.push_str("(allow file-read* file-write-data file-ioctl");
    for d in DEVICES_RW {
        let _ = write!(t, " (literal \"{d}\")");
    }
    t.push_str(")\n(allow file-read*");
    for d in DEVICES_R.iter().chain(DEVICE_FD_LINKS) {
        let _ = write!(t, " (literal \"{d}\")");
    }
    t.push_str(")\n");
    t.push_str("(allow file-read* file-write-data (subpath \"/dev/fd\"))\n");
    t.push_str("; terminals: ioctl on the inherited tty (isatty, tcgetattr), ptys made inside\n");
    t.push_str("(allow file-ioctl (regex #\"^/dev/ttys[0-9]+$\"))\n");
    t.push_str("(allow pseudo-tty)\n");
    t.push_str("(allow file-read* file-write* file-ioctl (literal \"/dev/ptmx\"))\n");
    t.push_str(
        "(allow file-read* file-write*\n  (require-all (regex #\"^/dev/ttys[0-9]+$\") (extension \"com.apple.sandbox.pty\")))\n\n",
    );

    // Which grants are emitted: a policy grant inside a protection is refused.
    let emitted: Vec<bool> = policy
        .grants
        .iter()
        .map(|g| refused_by(policy, g).is_none())
        .collect();

    // Metadata of the directories above each grant (path walks, realpath).
    let mut parent_names: Vec<String> = Vec::new();
    for (g, _) in policy.grants.iter().zip(&emitted).filter(|(_, e)| **e) {
        for a in ancestors(&g.path) {
            let n = params.parent(a);
            if !parent_names.contains(&n) {
                parent_names.push(n);
            }
        }
    }
    if !parent_names.is_empty() {
        t.push_str("; metadata of the directories above each grant\n(allow file-read-metadata");
        for n in &parent_names {
            let _ = write!(t, "\n  (literal (param \"{n}\"))");
        }
        t.push_str(")\n\n");
    }

    t.push_str("; grants\n");
    for (i, g) in policy.grants.iter().enumerate() {
        let name = &grant_names[i];
        let _ = writeln!(
            t,
            "; {name}: {} ({})",
            g.access.as_str(),
            origin_str(&g.origin)
        );
        if let Some(pi) = refused_by(policy, g) {
            let _ = writeln!(
                t,
                "; {name} lies inside {} ({}): refused, the protection wins",
                protect_names[pi],
                policy.protects[pi].reason.as_str()
            );
            continue;
        }
        let scope = Scope::Param(name.clone());
        let hidden = hidden_exclusions(policy, &protect_names, &g.path);
        allow(&mut t, "file-read*", &scope, &hidden);
        if g.access >= Access::ReadExec {
            allow(&mut t, "process-exec file-map-executable", &scope, &hidden);
        }
        if g.access == Access::ReadWrite {
            let mut ex = Vec::new();
            for (pi, p) in policy.protects.iter().enumerate() {
                if within(&p.path, &g.path) {
                    ex.push(not_literal(&protect_names[pi]));
                    ex.push(not_subpath(&protect_names[pi]));
                }
            }
            // The directories from each protected path's parent up to this
            // root: not renamable or removable, so the protection cannot be
            // carried away with them.
            let mut guards: Vec<String> = Vec::new();
            for p in policy.protects.iter().filter(|p| within(&p.path, &g.path)) {
                for a in p.path.ancestors().skip(1) {
                    if !within(a, &g.path) {
                        break;
                    }
                    let n = params.parent(a);
                    if !guards.contains(&n) {
                        guards.push(n);
                    }
                }
            }
            ex.extend(guards.iter().map(|n| not_literal(n)));
            allow(&mut t, "file-write*", &scope, &ex);
        }
    }

    t.push_str("\n; protections (each is cut out of the rules above that cover it)\n");
    for (i, p) in policy.protects.iter().enumerate() {
        let covered = policy
            .grants
            .iter()
            .zip(&emitted)
            .any(|(g, e)| *e && within(&p.path, &g.path))
            || SYSTEM_EXEC
                .iter()
                .chain(SYSTEM_READ)
                .any(|s| within(&p.path, Path::new(s)));
        let _ = writeln!(
            t,
            "; {}: {} ({}){}",
            protect_names[i],
            protection_str(p.protection),
            p.reason.as_str(),
            if covered {
                ""
            } else {
                "; under no grant, so (deny default) refuses it"
            }
        );
    }
    match (policy.net.mode, proxy) {
        (crate::NetMode::Allowlist, Some(port)) => {
            // (deny default) refuses every other network operation (DNS
            // through mDNSResponder's socket included): the proxy resolves.
            let _ = writeln!(
                t,
                "\n; network: allowlist (the policy's net.mode): only hull's proxy, on loopback port {port}"
            );
            let _ = writeln!(
                t,
                "(allow network-outbound (remote ip \"localhost:{port}\"))"
            );
        }
        (crate::NetMode::Allowlist, None) => {
            t.push_str("\n; network: allowlist, but no proxy port: nothing is allowed\n");
            t.push_str("(deny network*)\n");
        }
        (crate::NetMode::None, _) => {
            t.push_str("\n; network: none (the policy's net.mode); no rule above allows any\n");
            t.push_str("(deny network*)\n");
        }
    }

    SeatbeltProfile {
        text: t,
        params: params.list,
    }
}

/// The protection a policy grant lies inside, if any. hull's own instance
/// dirs are granted on top of the runs mask and are never refused.
fn refused_by(policy: &Policy, g: &Grant) -> Option<usize> {
    if g.origin != GrantOrigin::Policy {
        return None;
    }
    policy
        .protects
        .iter()
        .position(|p| within(&g.path, &p.path))
}

/// Exclusions of the hidden protections inside `scope` (reads, exec, maps).
fn hidden_exclusions(policy: &Policy, names: &[String], scope: &Path) -> Vec<String> {
    let mut ex = Vec::new();
    for (pi, p) in policy.protects.iter().enumerate() {
        if p.protection == Protection::Hidden && within(&p.path, scope) {
            ex.push(not_literal(&names[pi]));
            ex.push(not_subpath(&names[pi]));
        }
    }
    ex
}

fn origin_str(o: &GrantOrigin) -> &'static str {
    match o {
        GrantOrigin::Policy => "policy",
        GrantOrigin::InstanceTmp => "instance tmp",
        GrantOrigin::InstanceSpill => "instance spill, read-only",
        GrantOrigin::ChangeSet => "the change set's upper directory, --cow",
        GrantOrigin::Agent => "hull's agent, read and execute",
    }
}

fn protection_str(p: Protection) -> &'static str {
    match p {
        Protection::Hidden => "hidden: no read, no write, no create, no rename",
        Protection::ReadOnly => "read-only: no write, no create, no rename, no unlink",
    }
}

/// A policy name in a comment: printable ASCII only, no newline.
fn sanitize_comment(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The policy with every path resolved as macOS resolves it: each grant to
/// its real path (and, when the granted path is itself a symlink, the link
/// read-only, for `lstat` and `readlink`); each protection at its real parent with
/// its own name kept (so a symlink there cannot be replaced), plus its real
/// target when it is a symlink. Pure over `fs`.
pub fn canonicalize(policy: &Policy, fs: &dyn HostFs) -> Result<Policy, CanonicalError> {
    let mut out = policy.clone();
    out.grants.clear();
    for g in &policy.grants {
        let real = canonical_path(&g.path, fs)?;
        let mut push = |path: PathBuf, access| {
            if !out.grants.iter().any(|x| x.path == path) {
                let mut n = g.clone();
                n.path = path;
                n.access = access;
                out.grants.push(n);
            }
        };
        push(real.clone(), g.access);
        // A granted path that is itself a symlink: the link is readable (lstat,
        // readlink) but never writable, or the command could replace the link
        // and plant a directory (with a `.hull/`) where hull looks next time.
        let written = canonical_parent(&g.path, fs)?;
        if written != real {
            push(written, Access::Read);
        }
    }
    out.protects.clear();
    for p in &policy.protects {
        let named = canonical_parent(&p.path, fs)?;
        let real = canonical_path(&p.path, fs)?;
        let mut add = |path: PathBuf| {
            if !out.protects.iter().any(|x| x.path == path) {
                out.protects.push(Protect {
                    path,
                    protection: p.protection,
                    reason: p.reason.clone(),
                });
            }
        };
        add(named.clone());
        if real != named {
            add(real);
        }
    }
    out.protects.sort_by(|a, b| a.path.cmp(&b.path));
    let v = &policy.vars;
    out.vars.project = canonical_path(&v.project, fs)?;
    out.vars.tmp = canonical_path(&v.tmp, fs)?;
    out.vars.spill = canonical_path(&v.spill, fs)?;
    out.vars.home = canonical_path(&v.home, fs)?;
    out.vars.runs = canonical_path(&v.runs, fs)?;
    Ok(out)
}

/// The parent resolved, the final name kept as written.
fn canonical_parent(path: &Path, fs: &dyn HostFs) -> Result<PathBuf, CanonicalError> {
    match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) => Ok(canonical_path(parent, fs)?.join(name)),
        _ => canonical_path(path, fs),
    }
}

/// `realpath` over [`HostFs`]: symlinks in every component are followed;
/// the part of the path that does not exist yet is appended as written.
pub fn canonical_path(path: &Path, fs: &dyn HostFs) -> Result<PathBuf, CanonicalError> {
    if !path.is_absolute() {
        return Err(CanonicalError::NotAbsolute {
            path: path.to_path_buf(),
        });
    }
    let mut pending: Vec<OsString> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some("..".into()),
            _ => None,
        })
        .rev()
        .collect();
    let mut out = PathBuf::from("/");
    let mut links = 0;
    let mut missing = false;
    while let Some(c) = pending.pop() {
        if c == ".." {
            out.pop();
            continue;
        }
        let next = out.join(&c);
        if missing {
            out = next;
            continue;
        }
        match fs.kind(&next) {
            NodeKind::Symlink(target) => {
                links += 1;
                if links > MAX_SYMLINKS {
                    return Err(CanonicalError::SymlinkLoop {
                        path: path.to_path_buf(),
                    });
                }
                if target.is_absolute() {
                    out = PathBuf::from("/");
                }
                for t in target.components().rev() {
                    match t {
                        Component::Normal(n) => pending.push(n.to_os_string()),
                        Component::ParentDir => pending.push("..".into()),
                        _ => {}
                    }
                }
            }
            NodeKind::Missing => {
                missing = true;
                out = next;
            }
            NodeKind::Dir | NodeKind::File => out = next,
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{profiles, resolve};

    /// A shipped policy resolved with fixed macOS variables and canonicalized
    /// over a fake filesystem with macOS's root symlinks, as the launcher
    /// does on a Mac: what the golden files are made from.
    fn policy(name: &str) -> Policy {
        let pf = profiles::load(name).unwrap();
        let p = resolve(&pf, &crate::lower::testing::mac_test_vars()).unwrap();
        canonicalize(&p, &crate::lower::testing::mac_test_fs()).unwrap()
    }

    fn param<'a>(p: &'a SeatbeltProfile, path: &str) -> Vec<&'a str> {
        p.params
            .iter()
            .filter(|(_, v)| v == Path::new(path))
            .map(|(k, _)| k.as_str())
            .collect()
    }

    /// Golden files: a change to the generated text shows up as a diff.
    /// `HULL_BLESS=1 cargo test -p hull-policy seatbelt` rewrites them.
    #[test]
    fn golden_profiles_for_shipped_policies() {
        for (name, _) in profiles::PROFILES {
            let p = lower(&policy(name), None);
            let got = p.explain();
            crate::lower::testing::golden(&format!("seatbelt-{name}.sb"), &got);
        }
    }

    #[test]
    fn no_policy_path_is_spliced_into_the_text() {
        for (name, _) in profiles::PROFILES {
            let pol = policy(name);
            let p = lower(&pol, None);
            for g in &pol.grants {
                let s = g.path.to_str().unwrap();
                if SYSTEM_METADATA.contains(&s) {
                    continue; // a root symlink (`/etc`), also a fixed system path
                }
                assert!(!p.text.contains(&format!("\"{s}\"")), "{name}: {s} in text");
            }
            for pr in &pol.protects {
                let s = pr.path.to_str().unwrap();
                assert!(!p.text.contains(&format!("\"{s}\"")), "{name}: {s} in text");
            }
            // every param the text uses is defined, and every one defined is used
            for (k, _) in &p.params {
                let used = p.text.contains(&format!("(param \"{k}\")"));
                let uncovered = p
                    .text
                    .lines()
                    .any(|l| l.starts_with(&format!("; {k}: ")) && l.ends_with("refuses it"));
                assert!(used || uncovered, "{name}: {k} unused");
            }
            let uses = p.text.matches("(param \"").count();
            assert!(uses > 0);
            for cap in p.text.split("(param \"").skip(1) {
                let k = &cap[..cap.find('"').unwrap()];
                assert!(
                    p.params.iter().any(|(n, _)| n == k),
                    "{name}: {k} undefined"
                );
            }
        }
    }

    /// `--cow` as the seeds design it for a tier with no overlay: the
    /// project readable and executable, never writable; the change set's
    /// upper directory writable. Golden: `seatbelt-default-cow.sb`.
    #[test]
    fn a_cow_view_makes_the_project_read_only_and_the_upper_writable() {
        let plain = policy("default");
        let upper = Path::new("/Users/u/.local/state/hull/changes/0123456789ab/upper");
        let pol = plain.cow_view(upper);
        let p = lower(&pol, None);
        let writes = |p: &SeatbeltProfile, path: &str| {
            param(p, path).iter().any(|k| {
                p.text.split("(allow file-write*").skip(1).any(|rule| {
                    rule.split("\n(")
                        .next()
                        .unwrap_or("")
                        .contains(&format!("(param \"{k}\")"))
                })
            })
        };
        assert!(
            writes(&lower(&plain, None), "/Users/u/proj"),
            "control: the project is writable without --cow"
        );
        assert!(!writes(&p, "/Users/u/proj"), "{}", p.explain());
        assert!(writes(&p, upper.to_str().unwrap()), "{}", p.explain());
        crate::lower::testing::golden("seatbelt-default-cow.sb", &p.explain());
    }

    /// `net.mode = "allowlist"`: one outbound rule, to the proxy's loopback
    /// port, and no `(deny network*)` after it (which would refuse it);
    /// without a port, nothing. Golden: `seatbelt-default-allowlist.sb`.
    #[test]
    fn an_allow_list_allows_only_the_proxy_on_loopback() {
        let mut pol = policy("default");
        pol.net.mode = crate::NetMode::Allowlist;
        let p = lower(&pol, Some(40123));
        let rules: Vec<&str> = p
            .text
            .lines()
            .filter(|l| l.contains("network") && !l.starts_with(';'))
            .collect();
        assert_eq!(
            rules,
            vec!["(allow network-outbound (remote ip \"localhost:40123\"))"]
        );
        crate::lower::testing::golden("seatbelt-default-allowlist.sb", &p.explain());
        let none = lower(&pol, None);
        assert!(none.text.contains("(deny network*)"));
        assert!(!none.text.contains("(allow network"));
    }

    #[test]
    fn deny_by_default_and_no_network() {
        let p = lower(&policy("default"), None);
        assert!(p.text.contains("(deny default)"));
        assert!(p.text.contains("(deny network*)"));
        assert!(!p.text.contains("(allow network"));
        assert!(!p.text.contains("(allow default)"));
        assert!(!p.text.contains("(allow file-read*)\n"), "no unscoped read");
        assert!(
            !p.text.contains("(allow file-write*)\n"),
            "no unscoped write"
        );
    }

    #[test]
    fn protected_names_are_cut_out_of_writes_by_literal_and_subpath() {
        let pol = policy("default");
        let p = lower(&pol, None);
        let hull = param(&p, "/Users/u/proj/.hull")[0];
        let git = param(&p, "/Users/u/proj/.git")[0];
        let proj = param(&p, "/Users/u/proj")[0];
        let write_rule = rule_for(&p.text, "file-write*", proj);
        for n in [hull, git] {
            assert!(write_rule.contains(&not_literal(n)), "{write_rule}");
            assert!(write_rule.contains(&not_subpath(n)), "{write_rule}");
        }
        // the project root is a guard: not renamable (it carries .hull)
        let guard = param(&p, "/Users/u/proj")
            .into_iter()
            .find(|n| n.starts_with("PARENT_"))
            .expect("project root guard");
        assert!(write_rule.contains(&not_literal(guard)), "{write_rule}");
        // .hull is hidden: cut out of reads too; .git is read-only: readable
        let read_rule = rule_for(&p.text, "file-read*", proj);
        assert!(read_rule.contains(&not_subpath(hull)), "{read_rule}");
        assert!(!read_rule.contains(&not_subpath(git)), "{read_rule}");
    }

    #[test]
    fn instance_tmp_writable_spill_read_only_other_instances_refused() {
        let pol = policy("default");
        let p = lower(&pol, None);
        let tmp = param(&p, "/private/var/folders/xy/T/hull-runs/ID/tmp")[0];
        let spill = param(&p, "/private/var/folders/xy/T/hull-runs/ID/spill")[0];
        assert!(p
            .text
            .contains(&format!("(allow file-write* (subpath (param \"{tmp}\")))")));
        assert!(p
            .text
            .contains(&format!("(allow file-read* (subpath (param \"{spill}\")))")));
        assert!(
            !rule_exists(&p.text, "file-write*", spill),
            "spill must not be writable"
        );
        assert!(
            !rule_exists(&p.text, "process-exec", spill),
            "spill must not be executable"
        );
        // the runs root is a protection and appears in no allow rule as a scope
        let runs: Vec<&str> = param(&p, "/private/var/folders/xy/T/hull-runs");
        let protect = runs.iter().find(|n| n.starts_with("PROTECT_")).unwrap();
        assert!(!p
            .text
            .contains(&format!("(subpath (param \"{protect}\")))\n")));
        for op in ["file-read*", "file-write*"] {
            assert!(!rule_exists(&p.text, op, protect));
        }
        // its metadata (as a parent of tmp) is readable, its listing is not
        let parent = runs.iter().find(|n| n.starts_with("PARENT_")).unwrap();
        let meta = p.text.split("(allow file-read-metadata").nth(2).unwrap();
        assert!(meta.contains(&format!("(literal (param \"{parent}\"))")));
    }

    #[test]
    fn shells_get_their_system_paths_and_devices() {
        let p = lower(&policy("readonly"), None);
        for s in [
            "(literal \"/private/var/select/sh\")",
            "(literal \"/\")",
            "(literal \"/dev/null\")",
            "(literal \"/dev/tty\")",
            "(literal \"/dev/urandom\")",
        ] {
            assert!(p.text.contains(s), "{s} missing");
        }
        // readonly: the project is not writable at all
        let proj = param(&p, "/Users/u/proj")
            .into_iter()
            .find(|n| n.starts_with("GRANT_"))
            .unwrap();
        assert!(!rule_exists(&p.text, "file-write*", proj));
        assert!(!rule_exists(&p.text, "process-exec", proj));
    }

    #[test]
    fn a_policy_grant_inside_a_protection_is_refused() {
        let mut pol = policy("default");
        pol.grants.push(Grant {
            path: "/private/etc/ssh/ssh_config".into(),
            access: Access::Read,
            origin: GrantOrigin::Policy,
        });
        let p = lower(&pol, None);
        let n = format!("GRANT_{}", pol.grants.len() - 1);
        assert!(p.text.contains(&format!("; {n} lies inside")), "{}", p.text);
        assert!(!rule_exists(&p.text, "file-read*", &n));
    }

    #[test]
    fn param_names_are_deterministic() {
        let a = lower(&policy("build"), None);
        let b = lower(&policy("build"), None);
        assert_eq!(a, b);
        assert_eq!(a.params[0].0, "GRANT_0");
        let d = a.d_args();
        assert_eq!(d[0], "-D");
        assert_eq!(d[1], "GRANT_0=/private/etc");
    }

    /// The allow rule for `op` whose scope is `(subpath (param NAME))`.
    fn rule_for<'a>(text: &'a str, op: &str, name: &str) -> &'a str {
        let scope = format!("(subpath (param \"{name}\"))");
        text.split("(allow ")
            .find(|r| r.starts_with(op) && r.contains(&scope))
            .unwrap_or_else(|| panic!("no {op} rule for {name}"))
    }

    fn rule_exists(text: &str, op: &str, name: &str) -> bool {
        let scope = format!("(subpath (param \"{name}\"))");
        text.split("(allow ").any(|r| {
            r.split_whitespace().any(|w| w == op) && r.contains(&scope) && {
                // the scope is the rule's own subject, not a require-not
                !r.contains(&format!("(require-not {scope}"))
            }
        })
    }
}
