#![allow(clippy::expect_used, clippy::unwrap_used)]
//! Nothing of the command runs before its boundary is in place, and no run
//! reaches another (issue "Security 4"): each class is first shown to work
//! under tier `none`, then held on every native tier, asserting what the
//! host sees afterwards.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use hull_tests::{require_tier, show, World};

/// A directory anyone may write, outside every grant: what a helper running
/// the attacker's code before the boundary (as the sandbox user when hull
/// is root) could write, and the command inside it cannot.
fn open_drop() -> PathBuf {
    let d = tempfile::Builder::new()
        .prefix("hull-drop-")
        .tempdir_in("/var/tmp")
        .expect("tempdir")
        .keep();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    d
}

/// Removes the drop directory when the test ends, passed or not.
struct Removed(PathBuf);
impl Drop for Removed {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Builds, in the project, a library whose constructor says on stderr which
/// program loaded it and drops a file naming it in `drop`.
fn preload_library(w: &World, drop: &Path) -> PathBuf {
    let src = w.root.path().join("mark.c");
    std::fs::write(
        &src,
        format!(
            r#"#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
__attribute__((constructor)) static void mark(void) {{
    char exe[512];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n < 0 ? 0 : n] = 0;
    dprintf(2, "preloaded-in:%s\n", exe);
    char path[1024];
    snprintf(path, sizeof path, "{drop}/pid-%d", (int)getpid());
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd >= 0) {{ dprintf(fd, "%s\n", exe); close(fd); }}
}}
"#,
            drop = drop.display()
        ),
    )
    .expect("write mark.c");
    let lib = w.project.join("libmark.so");
    let st = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .status()
        .expect("cc (gcc) builds the test's library");
    assert!(st.success(), "cc failed");
    std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    lib
}

fn dropped(drop: &Path) -> Vec<String> {
    std::fs::read_dir(drop)
        .expect("read drop dir")
        .map(|e| {
            let e = e.expect("entry");
            format!(
                "{}: {}",
                e.file_name().to_string_lossy(),
                std::fs::read_to_string(e.path()).unwrap_or_default().trim()
            )
        })
        .collect()
}

/// `LD_PRELOAD` passed as the command's environment (`--env`, as a batch
/// job's or a session exec's `env` become) loads into the command only:
/// never into hull's Landlock helper or bwrap, which run before the
/// boundary (as the sandbox user when hull is root).
fn the_command_s_environment_reaches_no_helper(t: &str) {
    require_tier(t);
    let w = World::new();
    let drop = open_drop();
    let _gone = Removed(drop.clone());
    let lib = preload_library(&w, &drop);
    let env = format!("LD_PRELOAD={}", lib.display());

    // Control: under none nothing stands between the library and the host.
    let o = w.run("none", &["--env", &env], "true");
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert!(
        !dropped(&drop).is_empty(),
        "control: the library wrote nothing under none: {}",
        show(&o)
    );
    for e in std::fs::read_dir(&drop).expect("read") {
        std::fs::remove_file(e.expect("entry").path()).expect("rm");
    }

    let o = w.run(t, &["--env", &env], "echo \"LD_PRELOAD=$LD_PRELOAD\"");
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let stderr = String::from_utf8_lossy(&o.stderr);
    // The command still gets its variable, and the library acts inside.
    assert!(
        String::from_utf8_lossy(&o.stdout).contains(&env),
        "{}",
        show(&o)
    );
    let loaded: Vec<&str> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("preloaded-in:"))
        .collect();
    assert!(
        !loaded.is_empty(),
        "the command's own LD_PRELOAD did not load in it: {}",
        show(&o)
    );
    for exe in &loaded {
        assert!(
            !exe.ends_with("/hull") && !exe.ends_with("/bwrap"),
            "hull's helper {exe} loaded the command's LD_PRELOAD: {}",
            show(&o)
        );
    }
    assert_eq!(
        dropped(&drop),
        Vec::<String>::new(),
        "code of the command's ran outside its boundary: {}",
        show(&o)
    );
}

/// bwrap itself (which lives as long as the command) starts from hull's
/// environment: the command's variables are not in its `environ`, nor on
/// its command line (which every local user can read).
fn bwrap_holds_none_of_the_command_s_environment(t: &str) {
    require_tier(t);
    let w = World::new();
    let marker = "hull-env-probe-6d1e";
    let mut c = w.cmd(
        t,
        &["--env", &format!("ENV_PROBE_6D1E={marker}")],
        "echo up; exec sleep 30",
    );
    let mut child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.as_mut().expect("stdout")),
        &mut line,
    )
    .expect("read");
    assert_eq!(line.trim(), "up");
    let hull_pid = child.id() as i32;
    let mut seen = Vec::new();
    for e in std::fs::read_dir("/proc").expect("proc").flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let ppid: i32 = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().nth(1))
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        if ppid != hull_pid {
            continue;
        }
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
        if !exe.ends_with("bwrap") {
            continue;
        }
        let environ = std::fs::read(format!("/proc/{pid}/environ")).expect("environ");
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).expect("cmdline");
        seen.push(pid);
        for (what, bytes) in [("environment", &environ), ("command line", &cmdline)] {
            assert!(
                !String::from_utf8_lossy(bytes).contains(marker),
                "bwrap ({pid}) holds the command's variable in its {what}"
            );
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(!seen.is_empty(), "no bwrap found below hull ({hull_pid})");
}

macro_rules! tiers {
    (common: [$($case:ident),* $(,)?], bwrap: [$($b:ident),* $(,)?] $(,)?) => {
        #[cfg(feature = "landlock")]
        mod landlock { $( #[test] fn $case() { super::$case("landlock") } )* }
        #[cfg(feature = "bwrap")]
        mod bwrap {
            $( #[test] fn $case() { super::$case("bwrap") } )*
            $( #[test] fn $b() { super::$b("bwrap") } )*
        }
    };
}

tiers!(
    common: [the_command_s_environment_reaches_no_helper],
    bwrap: [bwrap_holds_none_of_the_command_s_environment],
);
