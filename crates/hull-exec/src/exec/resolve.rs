//! Whether the command's program can be started in the sandbox, checked by
//! hull before the sandbox starts: a program that is not there exits 127
//! and one that cannot be executed exits 126, as `env`, shells, `docker
//! run` and `podman run` do, with hull's one-line message, instead of the
//! tier's own failure (bwrap's `execvp` error exits 1, the same as the
//! command's own failure).
//!
//! The check follows the sandbox's view as the policy gives it: a candidate
//! counts only where a grant makes it visible (and no protection hides it),
//! and is executable only where a grant allows execution. It is a
//! diagnosis, not a boundary: the tier enforces the policy either way, and
//! a program that passes here but still fails to start is the tier's error.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::policy::{Access, Policy, Protection};

/// Exit code for a program that is not there.
pub const EXIT_NOT_FOUND: i32 = 127;
/// Exit code for a program that is there but cannot be executed.
pub const EXIT_NOT_EXECUTABLE: i32 = 126;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotRunnable {
    #[error(
        "{program}: command not found in the sandbox (tier {tier}; searched PATH={path}){hint}"
    )]
    NotFound {
        program: String,
        tier: &'static str,
        path: String,
        /// What the host has under that name and why the sandbox does
        /// not (`; on the host it is ...`), or empty.
        hint: String,
    },
    /// A link the sandbox shows that leads where the policy does not
    /// grant (a venv's `python` into `~/.pyenv`).
    #[error(
        "{program}: {link} leads to {target}, which is not in the sandbox (tier {tier}){hint}"
    )]
    LinkOut {
        program: String,
        tier: &'static str,
        link: PathBuf,
        target: PathBuf,
        hint: String,
    },
    #[error("{program}: no such file in the sandbox (tier {tier}: {at})")]
    NoSuchFile {
        program: String,
        tier: &'static str,
        at: PathBuf,
    },
    #[error("{program}: cannot be executed in the sandbox (tier {tier}: {at}: {why})")]
    NotExecutable {
        program: String,
        tier: &'static str,
        at: PathBuf,
        why: &'static str,
    },
    /// A script whose `#!` interpreter is not there (`missing`, 127, as
    /// bash has it) or cannot be executed (126).
    #[error("{program}: its interpreter {interpreter} (the #! line of {at}) {why} in the sandbox (tier {tier})")]
    Interpreter {
        program: String,
        tier: &'static str,
        at: PathBuf,
        interpreter: String,
        why: String,
        missing: bool,
    },
}

impl NotRunnable {
    pub fn exit_code(&self) -> i32 {
        match self {
            NotRunnable::NotFound { .. }
            | NotRunnable::NoSuchFile { .. }
            | NotRunnable::LinkOut { .. } => EXIT_NOT_FOUND,
            NotRunnable::NotExecutable { .. } => EXIT_NOT_EXECUTABLE,
            NotRunnable::Interpreter { missing: true, .. } => EXIT_NOT_FOUND,
            NotRunnable::Interpreter { missing: false, .. } => EXIT_NOT_EXECUTABLE,
        }
    }
}

/// What the sandbox shows of a host path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum View {
    Hidden,
    Visible(Access),
}

/// The view a policy gives: the deepest grant containing the path, unless a
/// hiding protection contains it. `None` (tier `none`) shows everything,
/// executable.
pub fn view_of(pol: Option<&Policy>, p: &Path) -> View {
    let Some(pol) = pol else {
        return View::Visible(Access::ReadExec);
    };
    if pol
        .protects
        .iter()
        .any(|x| x.protection == Protection::Hidden && p.starts_with(&x.path))
    {
        return View::Hidden;
    }
    pol.grants
        .iter()
        .filter(|g| p.starts_with(&g.path))
        .max_by_key(|g| g.path.as_os_str().len())
        .map_or(View::Hidden, |g| View::Visible(g.access))
}

/// A candidate as the sandbox would find it.
enum Found {
    Missing,
    /// There, but not executable, and why.
    Refused(&'static str),
    /// A script whose interpreter is missing or refused.
    Interpreter {
        path: PathBuf,
        found: Box<Found>,
    },
    /// A link the sandbox shows, leading where it shows nothing.
    LinkOut {
        link: PathBuf,
        target: PathBuf,
    },
    Runnable,
}

/// The sandbox as [`check`] sees it: what each host path shows, and
/// whether a path is exactly a grant's (a link there shows its target:
/// bwrap binds the target there, Landlock's rule is on its inode).
pub struct Sandbox<'a> {
    pub view: &'a dyn Fn(&Path) -> View,
    pub granted: &'a dyn Fn(&Path) -> bool,
}

impl std::fmt::Debug for Sandbox<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox").finish_non_exhaustive()
    }
}

/// How many links one lookup follows (the kernel's limit).
const MAX_LINKS: u32 = 40;

/// [`probe_file`], then the interpreter of a script (one level: the
/// kernel allows an interpreter that is a script itself, rarely used).
fn probe(sb: &Sandbox<'_>, at: &Path, cwd: &Path) -> Found {
    match probe_file(sb, at, 0) {
        Found::Runnable => {}
        other => return other,
    }
    let Some(interp) = script_interpreter(at) else {
        return Found::Runnable;
    };
    let path = cwd.join(&interp);
    match probe_file(sb, &path, 0) {
        Found::Runnable => Found::Runnable,
        found => Found::Interpreter {
            path: interp,
            found: Box::new(found),
        },
    }
}

/// The interpreter a regular file's `#!` line names. Read as a
/// diagnosis, never through a link (the path was resolved; a link put
/// there since is not followed), a FIFO or a device (not opened blocking,
/// and only a regular file is read).
fn script_interpreter(at: &Path) -> Option<PathBuf> {
    use rustix::fs::{Mode, OFlags};
    let real = std::fs::canonicalize(at).ok()?;
    let flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
    #[cfg(target_os = "linux")]
    let fd = rustix::fs::openat2(
        rustix::fs::CWD,
        &real,
        flags,
        Mode::empty(),
        rustix::fs::ResolveFlags::NO_SYMLINKS,
    )
    .ok()?;
    #[cfg(not(target_os = "linux"))]
    let fd = rustix::fs::open(&real, flags | OFlags::NOFOLLOW, Mode::empty()).ok()?;
    let interp = hull_protocol::shebang::interpreter_of(&std::fs::File::from(fd))?;
    Some(PathBuf::from(OsStr::from_bytes(&interp)))
}

fn probe_file(sb: &Sandbox<'_>, at: &Path, links: u32) -> Found {
    use std::os::unix::fs::PermissionsExt;
    let view = sb.view;
    let Ok(real) = std::fs::canonicalize(at) else {
        return Found::Missing;
    };
    // A grant of a link shows what it leads to (bwrap binds the target
    // there, Landlock's rule is on the target's inode), and a grant of the
    // target shows it through any visible link: hidden only when neither
    // path is visible. A link inside a grant that is not one itself
    // resolves in the sandbox: one level at a time, from where it is.
    // Never stricter than the tier, so a command the tier would start is
    // never refused here.
    let access = match (view(at), view(&real)) {
        (View::Hidden, View::Hidden) => return Found::Missing,
        (View::Visible(a), View::Hidden) => {
            let is_link = std::fs::symlink_metadata(at).is_ok_and(|m| m.file_type().is_symlink());
            if is_link && !(sb.granted)(at) && links < MAX_LINKS {
                let Ok(target) = std::fs::read_link(at) else {
                    return Found::Missing;
                };
                let next = at.parent().unwrap_or(Path::new("/")).join(&target);
                return match probe_file(sb, &next, links + 1) {
                    Found::Missing => Found::LinkOut {
                        link: at.to_path_buf(),
                        target: next,
                    },
                    other => other,
                };
            }
            a
        }
        (View::Hidden, View::Visible(a)) => a,
        (View::Visible(a), View::Visible(b)) => a.max(b),
    };
    let Ok(meta) = std::fs::metadata(&real) else {
        return Found::Missing;
    };
    if meta.is_dir() {
        return Found::Refused("a directory");
    }
    if meta.permissions().mode() & 0o111 == 0 {
        return Found::Refused("no execute permission");
    }
    if access == Access::Read {
        return Found::Refused("the policy grants it read-only, not read_exec");
    }
    Found::Runnable
}

/// Checks that `argv0` can be started with `path_var` (the command's
/// PATH) from `cwd`, in the sandbox `sb`; returns where it is found.
pub fn check(
    tier: &'static str,
    argv0: &OsStr,
    path_var: Option<&str>,
    cwd: &Path,
    sb: &Sandbox<'_>,
) -> Result<PathBuf, NotRunnable> {
    let program = argv0.to_string_lossy().into_owned();
    if argv0.as_bytes().contains(&b'/') {
        // Without the `./` steps: the message names the file.
        let at: PathBuf = cwd.join(argv0).components().collect();
        return match probe(sb, &at, cwd) {
            Found::Runnable => Ok(at),
            Found::Missing => Err(NotRunnable::NoSuchFile { program, tier, at }),
            Found::LinkOut { link, target } => Err(NotRunnable::LinkOut {
                program,
                tier,
                link,
                target,
                hint: String::new(),
            }),
            Found::Refused(why) => Err(NotRunnable::NotExecutable {
                program,
                tier,
                at,
                why,
            }),
            Found::Interpreter { path, found } => {
                Err(interpreter_error(program, tier, at, path, &found))
            }
        };
    }
    let path = path_var.unwrap_or("/usr/local/bin:/usr/bin:/bin");
    let mut refused = None;
    for dir in path.split(':') {
        // An empty entry is the working directory, as execvp has it.
        // An empty entry, and a relative one, are the working directory's
        // (execvp resolves them from there, not from where hull started).
        let at = cwd.join(dir).join(argv0);
        // execvp goes on after a candidate that fails (EACCES, and
        // ENOENT for a missing interpreter): the first such is named.
        match probe(sb, &at, cwd) {
            Found::Runnable => return Ok(at),
            Found::Missing => {}
            found => {
                refused.get_or_insert((at, found));
            }
        }
    }
    match refused {
        Some((
            at,
            Found::Interpreter {
                path: interp,
                found,
            },
        )) => Err(interpreter_error(program, tier, at, interp, &found)),
        Some((at, Found::Refused(why))) => Err(NotRunnable::NotExecutable {
            program,
            tier,
            at,
            why,
        }),
        Some((_, Found::LinkOut { link, target })) => Err(NotRunnable::LinkOut {
            program,
            tier,
            link,
            target,
            hint: String::new(),
        }),
        _ => Err(NotRunnable::NotFound {
            program,
            tier,
            path: path.to_string(),
            hint: String::new(),
        }),
    }
}

/// Where the host's own PATH search finds `argv0` (no policy: every path
/// visible), for saying what the sandbox hides. `None` for a path.
pub fn on_host(argv0: &OsStr, path_var: Option<&str>, cwd: &Path) -> Option<PathBuf> {
    if argv0.as_bytes().contains(&b'/') {
        return None;
    }
    let all = |_: &Path| View::Visible(Access::ReadExec);
    let any = |_: &Path| true;
    let host = Sandbox {
        view: &all,
        granted: &any,
    };
    let path = path_var.unwrap_or("/usr/local/bin:/usr/bin:/bin");
    path.split(':')
        .map(|dir| cwd.join(dir).join(argv0))
        .find(|at| matches!(probe_file(&host, at, 0), Found::Runnable))
}

/// Why `pol` hides the host path `p` (no grant holds it, or a deny does),
/// and which shipped profiles would show it, runnable: a clause for
/// hull's message.
pub fn why_hidden(pol: &Policy, p: &Path) -> String {
    let real = std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let hidden_by = pol.protects.iter().find(|x| {
        x.protection == Protection::Hidden && (p.starts_with(&x.path) || real.starts_with(&x.path))
    });
    let why = match hidden_by {
        Some(x) => format!("the policy hides {}", x.path.display()),
        None if real != p => format!(
            "it leads to {}, and the policy grants neither",
            real.display()
        ),
        None => "no grant of the policy holds it".to_string(),
    };
    let runs = |pol: &Policy| {
        [p, real.as_path()]
            .iter()
            .any(|q| view_of(Some(pol), q) == View::Visible(Access::ReadExec))
    };
    let profiles: Vec<&str> = crate::policy::profiles::PROFILES
        .iter()
        .filter(|(name, _)| {
            crate::policy::profiles::load(name)
                .ok()
                .and_then(|pf| crate::policy::resolve(&pf, &pol.vars).ok())
                .is_some_and(|shipped| runs(&shipped))
        })
        .map(|(name, _)| *name)
        .collect();
    let dir = p.parent().unwrap_or(p).display();
    match profiles.as_slice() {
        [] => format!("{why}; to run it, add \"{dir}\" to the policy's [fs] read_exec"),
        names => format!(
            "{why}; the shipped profile{} {} grant{} it (--policy {}), or add \"{dir}\" to [fs] read_exec",
            if names.len() == 1 { "" } else { "s" },
            names.join(", "),
            if names.len() == 1 { "s" } else { "" },
            names[0]
        ),
    }
}

fn interpreter_error(
    program: String,
    tier: &'static str,
    at: PathBuf,
    interp: PathBuf,
    found: &Found,
) -> NotRunnable {
    let (why, missing) = match found {
        Found::Refused(why) => (format!("cannot be executed ({why})"), false),
        _ => ("is not there".to_string(), true),
    };
    NotRunnable::Interpreter {
        program,
        tier,
        at,
        interpreter: interp.display().to_string(),
        why,
        missing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn file(p: &Path, mode: u32) {
        // A program, not a script: its interpreter is not in these views.
        std::fs::write(p, "\x7fELF").expect("write");
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }

    #[test]
    fn found_missing_and_refused_as_a_shell_says() {
        let d = tempfile::tempdir().expect("tempdir");
        let (bin, ro, hidden) = (
            d.path().join("bin"),
            d.path().join("ro"),
            d.path().join("h"),
        );
        for x in [&bin, &ro, &hidden] {
            std::fs::create_dir(x).expect("mkdir");
        }
        file(&bin.join("tool"), 0o755);
        file(&bin.join("plain"), 0o644);
        file(&ro.join("tool2"), 0o755);
        file(&hidden.join("secret"), 0o755);
        std::os::unix::fs::symlink(hidden.join("secret"), bin.join("link")).expect("symlink");
        std::os::unix::fs::symlink(hidden.join("secret"), bin.join("glink")).expect("symlink");
        std::os::unix::fs::symlink("tool", bin.join("near")).expect("symlink");
        let (b, r) = (bin.clone(), ro.clone());
        let view = move |p: &Path| {
            if p.starts_with(&b) {
                View::Visible(Access::ReadExec)
            } else if p.starts_with(&r) {
                View::Visible(Access::Read)
            } else {
                View::Hidden
            }
        };
        let path = format!("{}:{}:{}", ro.display(), bin.display(), hidden.display());
        // `glink` is a grant's own path: it shows its target.
        let glink = bin.join("glink");
        let granted = move |p: &Path| p == glink;
        let sb = Sandbox {
            view: &view,
            granted: &granted,
        };
        let check =
            |prog: &str| check("bwrap", OsStr::new(prog), Some(&path), d.path(), &sb).map(|_| ());
        assert_eq!(check("tool"), Ok(()));
        let e = check("nope").expect_err("not found");
        assert_eq!(e.exit_code(), 127);
        assert!(e
            .to_string()
            .contains("nope: command not found in the sandbox (tier bwrap"));
        // Hidden by the policy: as if not there; a grant of a link to it
        // shows it (as bwrap and Landlock do), a link inside a grant does
        // not (it dangles in bwrap, Landlock refuses its target), and a
        // link to a neighbour in the grant resolves.
        assert_eq!(check("secret").expect_err("hidden").exit_code(), 127);
        assert_eq!(check("glink"), Ok(()));
        let e = check("link").expect_err("a link out");
        assert_eq!(e.exit_code(), 127);
        assert!(
            e.to_string().contains("link leads to") && e.to_string().contains("h/secret"),
            "{e}"
        );
        assert_eq!(check("near"), Ok(()));
        assert_eq!(check("plain").expect_err("mode").exit_code(), 126);
        let e = check("tool2").expect_err("read-only grant");
        assert_eq!(e.exit_code(), 126);
        assert!(e.to_string().contains("read-only"), "{e}");
        let abs = bin.join("tool");
        assert_eq!(check(abs.to_str().expect("utf8")), Ok(()));
        assert_eq!(check("./bin").expect_err("a directory").exit_code(), 126);
        assert_eq!(check("./bin/none").expect_err("no file").exit_code(), 127);
        // A script whose interpreter is missing (127) or not executable
        // (126) names the interpreter; one whose interpreter runs runs.
        for (name, head, code, says) in [
            (
                "gone",
                "#!/no/such/interp -x\n",
                Some(127),
                "its interpreter /no/such/interp (the #! line of",
            ),
            (
                "ro",
                &format!("#!{}\n", ro.join("tool2").display()),
                Some(126),
                "read-only",
            ),
            (
                "ok",
                &format!("#! {} -e\n", bin.join("tool").display()),
                None,
                "",
            ),
        ] {
            let p = bin.join(name);
            std::fs::write(&p, head).expect("write");
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
            match code {
                Some(code) => {
                    let e = check(name).expect_err("bad interpreter");
                    assert_eq!(e.exit_code(), code, "{e}");
                    assert!(e.to_string().contains(says), "{e}");
                    let abs = p.to_str().expect("utf8").to_string();
                    assert_eq!(check(&abs).expect_err("bad interpreter").exit_code(), code);
                }
                None => assert_eq!(check(name), Ok(())),
            }
        }
    }
}
