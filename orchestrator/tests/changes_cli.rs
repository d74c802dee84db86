//! End-to-end: change sets made by a real kernel overlay (the mechanism
//! `--cow` runs use: the project as the read-only lower layer, the change
//! set's `upper/` as the upper one), read by the library and reviewed,
//! applied and discarded by the real `hull changes`.
//!
//! The overlay is mounted by `unshare -m` + `mount -t overlay` as root (CI
//! runs as root), or in a user namespace (`unshare -Urm`, `userxattr`)
//! otherwise; the commands run in the merged directory.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use hull::changes::{Baseline, ChangeSet, Marks, Op, Store};

struct World {
    root: tempfile::TempDir,
    project: PathBuf,
    outside: PathBuf,
    store: Store,
}

impl World {
    fn new() -> World {
        let root = tempfile::tempdir().unwrap();
        let project = root.path().join("project");
        let outside = root.path().join("outside");
        std::fs::create_dir_all(project.join(".git/hooks")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("victim"), "victim\n").unwrap();
        let store = Store::open(root.path().join("store"));
        World {
            root,
            project,
            outside,
            store,
        }
    }

    fn file(&self, rel: &str, text: &str) {
        let p = self.project.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    /// Runs `script` in a merged view of the project with a new change
    /// set as its upper layer; returns the finished set.
    fn cow(&self, script: &str) -> ChangeSet {
        self.cow_then(script, |_| {})
    }

    /// As [`cow`], with `meanwhile` run on the host after the command and
    /// before the scan (a change the project gets during the run).
    fn cow_then(&self, script: &str, meanwhile: impl FnOnce(&ChangeSet)) -> ChangeSet {
        // File times come from a coarse clock: what the test wrote in the
        // tick the run starts in would count as written during the run.
        std::thread::sleep(std::time::Duration::from_millis(30));
        let baseline = Baseline::capture(&self.project, &[]).unwrap();
        let root = rustix::process::geteuid().is_root();
        let marks = if root { Marks::Trusted } else { Marks::User };
        let mut set = self
            .store
            .create(
                &self.project,
                "test",
                &["sh".into(), "-c".into(), script.into()],
                marks,
            )
            .unwrap();
        let merged = self.root.path().join(format!("merged-{}", set.meta.id));
        std::fs::create_dir(&merged).unwrap();
        let opts = format!(
            "lowerdir={},upperdir={},workdir={},metacopy=off,index=off{}",
            self.project.display(),
            set.upper().display(),
            set.work().display(),
            if root {
                ",redirect_dir=off"
            } else {
                ",userxattr"
            }
        );
        let o = Command::new("timeout")
            .args(["30", "unshare", if root { "-m" } else { "-Urm" }])
            .args(["sh", "-ec"])
            .arg(format!(
                "mount -t overlay overlay -o {opts} \"$0\"; cd \"$0\"; {script}"
            ))
            .arg(&merged)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(o.status.success(), "overlay run: {}", show(&o));
        meanwhile(&set);
        set.finish(&baseline).unwrap();
        set
    }

    fn hull(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_hull"))
            .args(args)
            .env("HULL_CHANGES_DIR", self.store.root())
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }
}

fn show(o: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Every entry below `dir` (not `.git`): type, permission bits, and the
/// bytes of a file or the target of a link.
fn tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
        let mut names: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        for n in names {
            let p = dir.join(&n);
            let rel = p.strip_prefix(base).unwrap().display().to_string();
            if rel == ".git" {
                continue;
            }
            let m = std::fs::symlink_metadata(&p).unwrap();
            let mode = m.mode() & 0o7777;
            if m.file_type().is_symlink() {
                out.push(format!(
                    "{rel} -> {}",
                    std::fs::read_link(&p).unwrap().display()
                ));
            } else if m.is_dir() {
                out.push(format!("{rel}/ {mode:o}"));
                walk(base, &p, out);
            } else if m.is_file() {
                out.push(format!("{rel} {mode:o} {:?}", std::fs::read(&p).unwrap()));
            } else {
                out.push(format!("{rel} special"));
            }
        }
    }
    walk(dir, dir, &mut out);
    out
}

/// The project of the main case: files, a directory to delete, one to
/// replace, a script whose mode changes, a link.
fn seed(w: &World) {
    w.file("a.txt", "one\n");
    w.file("keep.txt", "kept\n");
    w.file("del.txt", "bye\n");
    w.file("gone/x", "x\n");
    w.file("gone/deep/y", "y\n");
    w.file("d/x", "dx\n");
    w.file("d/y", "dy\n");
    w.file("run.sh", "#!/bin/sh\necho hi\n");
    std::os::unix::fs::symlink("a.txt", w.project.join("link")).unwrap();
}

const SCRIPT: &str = "printf 'one\\ntwo\\n' > a.txt; \
     echo new > new.txt; mkdir -p nd/sub; echo f > nd/sub/f; \
     rm del.txt; rm -r gone; \
     rm -r d; mkdir d; echo z > d/z; \
     chmod 755 run.sh; \
     ln -s ../outside/victim out-link; ln -s .git/hooks hooks-link; ln -sfn keep.txt link; \
     printf 'bin\\000ary' > bin.dat; \
     mkfifo fifo";

#[test]
fn a_run_s_writes_are_listed_exactly_and_the_project_is_untouched() {
    let w = World::new();
    seed(&w);
    let before = tree(&w.project);
    // What the command saw, listed from inside the merged view.
    let seen = w.root.path().join("seen");
    let set = w.cow(&format!(
        "{SCRIPT}; ls -la > /dev/null; cp -a . {}",
        seen.display()
    ));
    assert_eq!(
        tree(&w.project),
        before,
        "the project changed under a cow run"
    );
    let got: Vec<(String, Op)> = set.changes.iter().map(|c| (c.path.clone(), c.op)).collect();
    let want: Vec<(String, Op)> = [
        ("a.txt", Op::Modified),
        ("bin.dat", Op::Added),
        ("d", Op::Mode),
        ("d/x", Op::Deleted),
        ("d/y", Op::Deleted),
        ("d/z", Op::Added),
        ("del.txt", Op::Deleted),
        ("fifo", Op::Refused),
        ("gone", Op::Deleted),
        ("hooks-link", Op::Added),
        ("link", Op::Modified),
        ("nd", Op::Added),
        ("nd/sub", Op::Added),
        ("nd/sub/f", Op::Added),
        ("new.txt", Op::Added),
        ("out-link", Op::Added),
        ("run.sh", Op::Mode),
    ]
    .iter()
    .map(|(p, o)| (p.to_string(), *o))
    .collect();
    // `d` was removed and made again: the same mode shows no mode change.
    let got: Vec<_> = got
        .into_iter()
        .filter(|(p, o)| !(p == "d" && *o == Op::Mode))
        .collect();
    let want: Vec<_> = want.into_iter().filter(|(p, _)| p != "d").collect();
    assert_eq!(got, want);
    let bin = set.changes.iter().find(|c| c.path == "bin.dat").unwrap();
    assert!(
        matches!(
            bin.after,
            Some(hull::changes::Node::File {
                binary: true,
                size: 7,
                ..
            })
        ),
        "{bin:?}"
    );
    let fifo = set.changes.iter().find(|c| c.path == "fifo").unwrap();
    assert!(
        fifo.reason.as_deref().unwrap().contains("a fifo"),
        "{fifo:?}"
    );

    // The CLI: list, show, diff.
    let id = set.meta.id.as_str();
    let o = w.hull(&["changes", "list", "--json"]);
    assert!(o.status.success(), "{}", show(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v[0]["id"], id);
    assert_eq!(v[0]["counts"]["added"], 8);
    let o = w.hull(&["changes", "show", id]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", show(&o));
    assert!(text.contains("M a.txt"), "{text}");
    assert!(
        text.contains("m run.sh  file 18 bytes, mode 644 -> 755"),
        "{text}"
    );
    assert!(
        text.contains("A out-link  symlink -> ../outside/victim"),
        "{text}"
    );
    assert!(text.contains("! fifo  a fifo"), "{text}");
    let o = w.hull(&["changes", "diff", id, "a.txt", "bin.dat"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", show(&o));
    assert!(text.contains("--- a/a.txt\n+++ b/a.txt\n"), "{text}");
    assert!(text.contains("\n one\n+two\n"), "{text}");
    assert!(
        text.contains("binary or large bin.dat: nothing -> 7 bytes sha256:"),
        "{text}"
    );
    assert!(!text.contains("new.txt"), "{text}");
    let o = w.hull(&["changes", "diff", id, "no/such"]);
    assert_eq!(o.status.code(), Some(125), "{}", show(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no change at or below no/such"));

    // Apply: the project becomes what the command saw (the fifo refused).
    let o = w.hull(&["changes", "apply", id]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("refused fifo: a fifo"));
    let mut want = tree(&seen);
    want.retain(|l| l != "fifo special");
    assert_eq!(tree(&w.project), want);
    // The links were made as links, never followed.
    assert_eq!(
        std::fs::read_link(w.project.join("hooks-link")).unwrap(),
        Path::new(".git/hooks")
    );
    assert_eq!(
        std::fs::read_to_string(w.outside.join("victim")).unwrap(),
        "victim\n"
    );
    assert_eq!(
        std::fs::read_dir(w.project.join(".git/hooks"))
            .unwrap()
            .count(),
        0
    );

    // Discard: gone.
    let o = w.hull(&["changes", "discard", id]);
    assert!(o.status.success(), "{}", show(&o));
    assert!(!set.dir.exists());
    let o = w.hull(&["changes", "show", id]);
    assert_eq!(o.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&o.stderr).contains(&format!("no change set {id}")));
}

#[test]
fn a_path_the_project_changed_during_the_run_is_a_conflict_and_left_alone() {
    let w = World::new();
    w.file("a.txt", "a\n");
    w.file("b.txt", "b\n");
    let set = w.cow_then("echo A > a.txt; echo B > b.txt", |_| {
        std::fs::write(w.project.join("b.txt"), "host edit\n").unwrap();
    });
    let id = set.meta.id.as_str();
    // All or nothing: nothing applied, the conflict named.
    let o = w.hull(&["changes", "apply", id]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("conflict: b.txt: changed in the project since the run started"),
        "{err}"
    );
    assert!(err.contains("nothing of change set"), "{err}");
    assert_eq!(
        std::fs::read_to_string(w.project.join("a.txt")).unwrap(),
        "a\n"
    );
    assert_eq!(
        std::fs::read_to_string(w.project.join("b.txt")).unwrap(),
        "host edit\n"
    );
    // Named paths: the others apply.
    let o = w.hull(&["changes", "apply", id, "a.txt"]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(
        std::fs::read_to_string(w.project.join("a.txt")).unwrap(),
        "A\n"
    );
    let o = w.hull(&["changes", "apply", id, "b.txt"]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert_eq!(
        std::fs::read_to_string(w.project.join("b.txt")).unwrap(),
        "host edit\n"
    );
}

#[test]
fn a_parent_replaced_by_a_symlink_is_never_written_through() {
    let w = World::new();
    w.file("sub/f", "f\n");
    let set = w.cow_then("echo new > sub/f; echo n > sub/g", |_| {
        // Planted after the run: sub now leads outside the project.
        std::fs::rename(w.project.join("sub"), w.root.path().join("old-sub")).unwrap();
        std::os::unix::fs::symlink(&w.outside, w.project.join("sub")).unwrap();
    });
    let o = w.hull(&["changes", "apply", &set.meta.id, "sub"]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("conflict: sub/f"), "{err}");
    let names: Vec<_> = std::fs::read_dir(&w.outside)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["victim"], "written through the planted link");
    assert_eq!(
        std::fs::read_to_string(w.outside.join("victim")).unwrap(),
        "victim\n"
    );
}

#[test]
fn git_and_hull_in_an_upper_layer_are_refused_and_untouched() {
    let w = World::new();
    w.file("a.txt", "a\n");
    let set = w.cow_then("echo A > a.txt", |set| {
        // What a guest that wrote past its masks would leave in the upper.
        std::fs::create_dir_all(set.upper().join(".git/hooks")).unwrap();
        std::fs::write(
            set.upper().join(".git/hooks/pre-commit"),
            "#!/bin/sh\nevil\n",
        )
        .unwrap();
        std::fs::set_permissions(
            set.upper().join(".git/hooks/pre-commit"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
    });
    let o = w.hull(&["changes", "apply", &set.meta.id]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("refused .git/hooks/pre-commit: inside .git or .hull"),
        "{out}"
    );
    assert!(!w.project.join(".git/hooks/pre-commit").exists());
    assert_eq!(
        std::fs::read_to_string(w.project.join("a.txt")).unwrap(),
        "A\n"
    );
}

/// What the run's policy protected inside the project (hidden or
/// read-only) is refused when the set is read, whatever the upper holds:
/// a write below it (a guest past its read-only binds would leave one),
/// and the deletion of a directory that holds it. The rest applies.
#[test]
fn paths_the_policy_protected_are_refused_on_the_host() {
    let w = World::new();
    w.file("a.txt", "a\n");
    w.file("secrets/key", "k\n");
    w.file("vendor/lib/x", "x\n");
    std::thread::sleep(std::time::Duration::from_millis(30));
    let baseline = Baseline::capture(&w.project, &[]).unwrap();
    let mut set = w.cow_then("echo A > a.txt && rm -r vendor", |set| {
        std::fs::create_dir_all(set.upper().join("secrets")).unwrap();
        std::fs::write(set.upper().join("secrets/new"), "planted\n").unwrap();
    });
    // As `hull run` records them before the command starts.
    set.protect(vec!["secrets".into(), "vendor/lib".into()])
        .unwrap();
    set.finish(&baseline).unwrap();
    let refused: Vec<&str> = set
        .changes
        .iter()
        .filter(|c| c.op == Op::Refused)
        .map(|c| c.path.as_str())
        .collect();
    assert!(refused.contains(&"secrets/new"), "{:?}", set.changes);
    assert!(refused.contains(&"vendor"), "{:?}", set.changes);
    let o = w.hull(&["changes", "apply", &set.meta.id]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("the run's policy protects secrets"),
        "{}",
        show(&o)
    );
    assert!(!w.project.join("secrets/new").exists());
    assert_eq!(
        std::fs::read_to_string(w.project.join("vendor/lib/x")).unwrap(),
        "x\n"
    );
    assert_eq!(
        std::fs::read_to_string(w.project.join("a.txt")).unwrap(),
        "A\n"
    );
}

/// `discard` makes the overlay's `work/work` removable without following
/// a link there (a guest could plant one in its share): the link's target
/// keeps its mode, and the set is gone.
#[test]
fn discard_follows_no_link_in_the_work_directory() {
    let w = World::new();
    w.file("a.txt", "a\n");
    let set = w.cow("echo A > a.txt");
    let target = w.root.path().join("host-dir");
    std::fs::create_dir(&target).unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755)).unwrap();
    let inner = set.work().join("work");
    std::fs::set_permissions(&inner, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::remove_dir_all(&inner).unwrap();
    std::os::unix::fs::symlink(&target, &inner).unwrap();
    let o = w.hull(&["changes", "discard", &set.meta.id]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert!(!set.dir.exists());
    let mode = std::fs::metadata(&target).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o755, "chmod went through the link");
    // The control: the same chmod by path goes through it.
    std::os::unix::fs::symlink(&target, w.root.path().join("link")).unwrap();
    std::fs::set_permissions(
        w.root.path().join("link"),
        std::fs::Permissions::from_mode(0o700),
    )
    .unwrap();
    let mode = std::fs::metadata(&target).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o700);
}

#[test]
fn two_change_sets_of_one_project_do_not_see_each_other() {
    let w = World::new();
    w.file("a.txt", "a\n");
    let first = w.cow("echo one > first.txt");
    let second = w.cow("test ! -e first.txt; echo two > second.txt");
    let paths = |s: &ChangeSet| s.changes.iter().map(|c| c.path.clone()).collect::<Vec<_>>();
    assert_eq!(paths(&first), ["first.txt"]);
    assert_eq!(paths(&second), ["second.txt"]);
    assert!(!w.project.join("first.txt").exists());
    let o = w.hull(&["changes", "list"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains(&first.meta.id) && text.contains(&second.meta.id),
        "{text}"
    );
}

/// Under a root-mounted overlay the command may set `user.*` xattrs
/// itself: a `user.overlay.opaque` it sets on a directory is not taken for
/// the overlay's mark (which would delete what the directory holds).
#[test]
fn marks_the_command_sets_itself_are_not_the_overlay_s() {
    if !rustix::process::geteuid().is_root() {
        panic!("this test mounts the overlay as root (trusted marks) and needs root");
    }
    let w = World::new();
    w.file("k/x", "x\n");
    let set = w.cow(
        "python3 -c \"import os; os.setxattr('k', 'user.overlay.opaque', b'y')\" && \
         python3 -c \"import os; print(os.getxattr('k', 'user.overlay.opaque'))\" && echo y > k/y",
    );
    let got: Vec<(String, Op)> = set.changes.iter().map(|c| (c.path.clone(), c.op)).collect();
    assert_eq!(got, [("k/y".to_string(), Op::Added)]);
}
