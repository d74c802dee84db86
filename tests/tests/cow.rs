#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]
// The escape matrix and the end-to-end tests drive the Linux tiers (bubblewrap,
// Landlock, tier 3 on QEMU): off Linux this crate is empty, and type-checks.
#![cfg(target_os = "linux")]
// Test code: a failed expectation is a failed test.
//! Copy-on-write runs (`hull run --cow`) end to end, with the real `hull`:
//! the project stays as it was, the command's writes are kept as a change
//! set, `hull changes` lists, applies and discards it. bwrap, landlock
//! and vm run them (as root, as CI does; the same assertions, module per
//! tier), bwrap and landlock as a user too.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use hull_tests::{require_tier, show, World};

/// Every entry of `dir` but `.git` and `.hull`: type, mode, path, link
/// target, and each file's sha256: what the command saw, printed inside,
/// and what the project holds, printed on the host.
const LISTING: &str = "find . -path ./.git -prune -o -path ./.hull -prune -o -printf '%y %m %p %l\\n' | sort; \
     find . -path ./.git -prune -o -path ./.hull -prune -o -type f -print | sort | xargs -r sha256sum";

fn listing(dir: &Path) -> String {
    let o = Command::new("sh")
        .args(["-c", LISTING])
        .current_dir(dir)
        .output()
        .expect("sh");
    assert!(o.status.success());
    String::from_utf8(o.stdout).unwrap()
}

/// The change set ID a `--cow` run named on stderr.
fn kept_id(o: &Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr);
    let line = err
        .lines()
        .find(|l| l.starts_with("hull: changes kept as "))
        .unwrap_or_else(|| panic!("no change set named: {}", show(o)));
    line["hull: changes kept as ".len()..]
        .split(';')
        .next()
        .unwrap()
        .to_string()
}

fn changes(w: &World, args: &[&str]) -> Output {
    w.hull()
        .arg("changes")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("hull changes")
}

fn seed(w: &World) {
    let p = &w.project;
    std::fs::write(p.join("a.txt"), "one\n").unwrap();
    std::fs::write(p.join("del.txt"), "bye\n").unwrap();
    std::fs::create_dir_all(p.join("gone/deep")).unwrap();
    std::fs::write(p.join("gone/deep/y"), "y\n").unwrap();
    std::fs::write(p.join("run.sh"), "#!/bin/sh\n").unwrap();
    std::fs::write(w.outside.join("victim"), hull_tests::VICTIM).unwrap();
}

/// A run that adds, modifies and deletes files and directories, changes a
/// mode, makes links (out of the project, at `.git/hooks`) and a binary
/// file leaves the project as it was and lists exactly those changes;
/// applied, the project is what the command saw; discarded, it is gone.
fn a_cow_run_is_kept_apart_listed_applied_and_discarded(tier: &str) {
    require_tier(tier);
    let w = World::new();
    w.git_init();
    seed(&w);
    let before = listing(&w.project);
    let victim = w.outside.join("victim");
    let script = format!(
        "printf 'one\\ntwo\\n' > a.txt && echo new > new.txt && mkdir -p nd/sub && echo f > nd/sub/f \
         && rm del.txt && rm -r gone && chmod 755 run.sh && ln -s {} out-link \
         && ln -s .git/hooks hooks-link && printf 'bin\\000ary' > bin.dat && {LISTING}",
        victim.display()
    );
    let o = w.run(tier, &["--cow"], &script);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let seen = String::from_utf8(o.stdout.clone()).unwrap();
    assert!(seen.contains("f 755 ./run.sh"), "{seen}");
    assert_eq!(
        listing(&w.project),
        before,
        "the project changed under --cow"
    );
    let id = kept_id(&o);

    let s = changes(&w, &["show", &id, "--json"]);
    assert!(s.status.success(), "{}", show(&s));
    let v: serde_json::Value = serde_json::from_slice(&s.stdout).unwrap();
    let got: Vec<String> = v["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            format!(
                "{} {}",
                c["op"].as_str().unwrap(),
                c["path"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            "modified a.txt",
            "added bin.dat",
            "deleted del.txt",
            "deleted gone",
            "added hooks-link",
            "added nd",
            "added nd/sub",
            "added nd/sub/f",
            "added new.txt",
            "added out-link",
            "mode run.sh",
        ]
    );
    let bin = v["changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["path"] == "bin.dat")
        .unwrap();
    assert_eq!(bin["after"]["binary"], true, "{bin}");

    let a = changes(&w, &["apply", &id]);
    assert_eq!(a.status.code(), Some(0), "{}", show(&a));
    assert_eq!(
        listing(&w.project),
        seen,
        "applied, the project is not what the command saw"
    );
    // Links were made, not followed.
    assert_eq!(
        std::fs::read_link(w.project.join("out-link")).unwrap(),
        victim
    );
    assert_eq!(
        std::fs::read_to_string(&victim).unwrap(),
        hull_tests::VICTIM
    );
    assert!(std::fs::read_dir(w.project.join(".git/hooks"))
        .unwrap()
        .all(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .ends_with(".sample")));

    let d = changes(&w, &["discard", &id]);
    assert!(d.status.success(), "{}", show(&d));
    let s = changes(&w, &["show", &id]);
    assert_eq!(s.status.code(), Some(125), "{}", show(&s));
    assert!(String::from_utf8_lossy(&s.stderr).contains(&format!("no change set {id}")));
}

/// Two `--cow` runs of one project: the second does not see the first's
/// writes, and each keeps its own.
fn two_cow_runs_do_not_see_each_other(tier: &str) {
    require_tier(tier);
    let w = World::new();
    let result = w.root.path().join("result.json");
    let one = w.run(
        tier,
        &["--cow", "--json-result", result.to_str().unwrap()],
        "echo 1 > first.txt",
    );
    assert_eq!(one.status.code(), Some(0), "{}", show(&one));
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&result).unwrap()).unwrap();
    assert_eq!(
        doc["changes"].as_str(),
        Some(kept_id(&one).as_str()),
        "{doc}"
    );
    let two = w.run(
        tier,
        &["--cow"],
        "test ! -e first.txt && echo 2 > second.txt",
    );
    assert_eq!(
        two.status.code(),
        Some(0),
        "the second run saw the first's write: {}",
        show(&two)
    );
    assert!(!w.project.join("first.txt").exists());
    for (o, path) in [(&one, "first.txt"), (&two, "second.txt")] {
        let s = changes(&w, &["show", &kept_id(o), "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&s.stdout).unwrap();
        let paths: Vec<&str> = v["changes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["path"].as_str().unwrap())
            .collect();
        assert_eq!(paths, [path]);
    }
}

/// A path the project changes while the run goes on is a conflict: the
/// apply changes nothing, names it, and the other path applies when named.
fn a_path_changed_during_the_run_is_a_conflict(tier: &str) {
    require_tier(tier);
    let w = World::new();
    std::fs::write(w.project.join("a.txt"), "a\n").unwrap();
    std::fs::write(w.project.join("b.txt"), "b\n").unwrap();
    let mut c = hull_tests::started(w.cmd(
        tier,
        &["--cow"],
        "echo A > a.txt; echo B > b.txt; echo started; sleep 2",
    ));
    std::fs::write(w.project.join("b.txt"), "host edit\n").unwrap();
    let status = c.wait().unwrap();
    assert!(status.success(), "{status:?}");
    let list = changes(&w, &["list", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
    let id = v[0]["id"].as_str().unwrap().to_string();
    let a = changes(&w, &["apply", &id]);
    assert_eq!(a.status.code(), Some(1), "{}", show(&a));
    assert!(
        String::from_utf8_lossy(&a.stderr)
            .contains("conflict: b.txt: changed in the project since the run started"),
        "{}",
        show(&a)
    );
    assert_eq!(
        std::fs::read_to_string(w.project.join("a.txt")).unwrap(),
        "a\n"
    );
    assert_eq!(
        std::fs::read_to_string(w.project.join("b.txt")).unwrap(),
        "host edit\n"
    );
    let a = changes(&w, &["apply", &id, "a.txt"]);
    assert_eq!(a.status.code(), Some(0), "{}", show(&a));
    assert_eq!(
        std::fs::read_to_string(w.project.join("a.txt")).unwrap(),
        "A\n"
    );
    assert_eq!(
        std::fs::read_to_string(w.project.join("b.txt")).unwrap(),
        "host edit\n"
    );
}

/// The default policy with `${PROJECT}/secrets` denied, written in `dir`.
fn deny_secrets_policy(dir: &Path) -> std::path::PathBuf {
    let pol = dir.join("deny.toml");
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../policies/default.toml"
    ))
    .unwrap()
    .replace("deny = [", "deny = [\n  \"${PROJECT}/secrets\",");
    assert!(text.contains("/secrets\","));
    std::fs::write(&pol, text).unwrap();
    pol
}

/// What the policy protects inside the project stays protected in the
/// overlay: `.git` and a `deny` path cannot be written (bound read-only
/// or hidden over it: by the guest on vm, by hull in the command's mount
/// namespace on landlock; bwrap binds them as on any run), so nothing of
/// them is in the change set;
/// a write elsewhere is. The same writes succeed under tier none.
fn protected_paths_stay_unwritable_in_the_overlay(tier: &str) {
    require_tier(tier);
    let w = World::new();
    w.git_init();
    std::fs::create_dir(w.project.join("secrets")).unwrap();
    std::fs::write(w.project.join("secrets/key"), "k\n").unwrap();
    let pol = deny_secrets_policy(w.root.path());
    let script = "echo x >> .git/config; echo a=$?; echo y > .git/new; echo b=$?; \
                  ls secrets | wc -l; echo z > secrets/new; echo c=$?; echo ok > ok.txt";
    // The control: under none every write lands.
    let c = w.run(
        "none",
        &[],
        "echo x >> .git/config && echo y > .git/new && echo ok",
    );
    assert_eq!(c.status.code(), Some(0), "{}", show(&c));
    assert!(w.project.join(".git/new").exists());
    std::fs::remove_file(w.project.join(".git/new")).unwrap();
    let config = std::fs::read(w.project.join(".git/config")).unwrap();
    let o = w.run(tier, &["--cow", "--policy", pol.to_str().unwrap()], script);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    for refused in ["a=", "b=", "c="] {
        assert!(
            out.contains(refused) && !out.contains(&format!("{refused}0")),
            "{refused}: {}",
            show(&o)
        );
    }
    assert!(
        out.contains("\n0\n"),
        "the deny path showed its files: {}",
        show(&o)
    );
    let s = changes(&w, &["show", &kept_id(&o), "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&s.stdout).unwrap();
    let paths: Vec<&str> = v["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["ok.txt"], "{}", show(&s));
    assert_eq!(
        std::fs::read(w.project.join(".git/config")).unwrap(),
        config
    );
    assert!(!w.project.join(".git/new").exists());
    assert!(!w.project.join("secrets/new").exists());
    assert!(!w.project.join("ok.txt").exists());
}

/// Names the command chose cannot forge lines in what a reviewer reads:
/// `hull changes show`, `diff` and `apply` print a file named
/// `a<newline>+ M /etc/passwd`, a link whose target has a newline and a
/// name with a right-to-left override quoted as git quotes paths, each on
/// one line; `--json` carries the names exactly. (Against the code
/// before, `show` printed a line `+ M /etc/passwd  ...`.)
#[cfg(feature = "bwrap")]
#[test]
fn names_the_command_chose_are_quoted_as_git_quotes_them() {
    require_tier("bwrap");
    let w = World::new();
    let forged = "a\n+ M /etc/passwd";
    let script = "printf x > \"$(printf 'a\\n+ M /etc/passwd' | tr / _)\"; \
                  ln -s \"$(printf 'target\\nA evil')\" link; \
                  printf y > \"$(printf 'x\\342\\200\\256txt.exe')\"; \
                  printf z > \"$(printf 'bad\\377name')\"";
    let o = w.run("bwrap", &["--cow"], script);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let id = kept_id(&o);
    let forged = forged.replace('/', "_");
    let s = changes(&w, &["show", &id]);
    assert_eq!(s.status.code(), Some(0), "{}", show(&s));
    let text = String::from_utf8(s.stdout.clone()).unwrap();
    // The header, then one line per change: four (the name that is not
    // UTF-8 refused, with its bytes).
    assert_eq!(text.lines().count(), 5, "{text}");
    assert!(text.contains("! \"bad\\357\\277\\275name\""), "{text}");
    assert!(
        !text.lines().any(|l| l.starts_with("+ M"))
            && !text.lines().any(|l| l.starts_with("A evil")),
        "{text}"
    );
    assert!(text.contains("\"a\\n+ M _etc_passwd\""), "{text}");
    assert!(text.contains("\"target\\nA evil\""), "{text}");
    assert!(text.contains("\"x\\342\\200\\256txt.exe\""), "{text}");
    let d = changes(&w, &["diff", &id]);
    let diff = String::from_utf8_lossy(&d.stdout);
    assert!(
        !diff
            .lines()
            .any(|l| l.starts_with("+ M _etc") || l.starts_with("A evil")),
        "{diff}"
    );
    assert!(diff.contains("+++ \"b/a\\n+ M _etc_passwd\""), "{diff}");
    let j = changes(&w, &["show", &id, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&j.stdout).unwrap();
    let paths: Vec<&str> = v["changes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["path"].as_str())
        .collect();
    assert!(paths.contains(&forged.as_str()), "{paths:?}");
    assert!(
        v["changes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["path_hex"] == "626164ff6e616d65" && c["op"] == "refused"),
        "{v}"
    );
    let a = changes(&w, &["apply", &id]);
    assert_eq!(a.status.code(), Some(0), "{}", show(&a));
    let applied = String::from_utf8_lossy(&a.stdout);
    assert_eq!(applied.lines().count(), 4, "{applied}");
    assert!(!w.project.join("bad\u{fffd}name").exists());
    assert_eq!(
        std::fs::read_to_string(w.project.join(&forged)).unwrap(),
        "x"
    );
}

/// `hull changes apply` applies only to the directory the run saw: a
/// project swapped for a link to elsewhere after the run is refused by
/// name and nothing lands there; put back, the same change set applies.
/// (Against the code before, apply wrote through the link.)
#[cfg(feature = "bwrap")]
#[test]
fn apply_refuses_a_project_swapped_for_a_link() {
    require_tier("bwrap");
    let w = World::new();
    let o = w.run("bwrap", &["--cow"], "echo new > out.txt");
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let id = kept_id(&o);
    let elsewhere = w.outside.join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let moved = w.root.path().join("project.moved");
    std::fs::rename(&w.project, &moved).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &w.project).unwrap();
    let a = changes(&w, &["apply", &id]);
    assert_eq!(
        std::fs::read_dir(&elsewhere).unwrap().count(),
        0,
        "{}",
        show(&a)
    );
    assert_ne!(a.status.code(), Some(0), "{}", show(&a));
    let err = String::from_utf8_lossy(&a.stderr);
    assert!(
        err.contains(&w.project.display().to_string())
            && err.contains("no longer the directory the run saw"),
        "{}",
        show(&a)
    );
    std::fs::remove_file(&w.project).unwrap();
    std::fs::rename(&moved, &w.project).unwrap();
    let a = changes(&w, &["apply", &id]);
    assert_eq!(a.status.code(), Some(0), "{}", show(&a));
    assert_eq!(
        std::fs::read_to_string(w.project.join("out.txt")).unwrap(),
        "new\n"
    );
}

#[cfg(feature = "bwrap")]
mod bwrap {
    #[test]
    fn a_cow_run_is_kept_apart_listed_applied_and_discarded() {
        super::a_cow_run_is_kept_apart_listed_applied_and_discarded("bwrap");
    }

    #[test]
    fn two_cow_runs_do_not_see_each_other() {
        super::two_cow_runs_do_not_see_each_other("bwrap");
    }

    #[test]
    fn a_path_changed_during_the_run_is_a_conflict() {
        super::a_path_changed_during_the_run_is_a_conflict("bwrap");
    }

    #[test]
    fn protected_paths_stay_unwritable_in_the_overlay() {
        super::protected_paths_stay_unwritable_in_the_overlay("bwrap");
    }
}

/// landlock as root: the overlay in the command's own mount namespace (the
/// one its switch to the sandbox user makes), the project's protections
/// covered by mounts over it, the project granted whole; the same
/// assertions as on bwrap. As a user (`landlock_a_cow_run_as_a_user`) the
/// overlay and covers are made in a user namespace of the run's own.
#[cfg(feature = "landlock")]
mod landlock {
    #[test]
    fn a_cow_run_is_kept_apart_listed_applied_and_discarded() {
        super::a_cow_run_is_kept_apart_listed_applied_and_discarded("landlock");
    }

    #[test]
    fn two_cow_runs_do_not_see_each_other() {
        super::two_cow_runs_do_not_see_each_other("landlock");
    }

    #[test]
    fn a_path_changed_during_the_run_is_a_conflict() {
        super::a_path_changed_during_the_run_is_a_conflict("landlock");
    }

    #[test]
    fn protected_paths_stay_unwritable_in_the_overlay() {
        super::protected_paths_stay_unwritable_in_the_overlay("landlock");
    }
}

/// Tier 3: the overlay is mounted in the guest over the read-only project
/// share, its upper layer on a writable share of the change set's
/// `layers/`; the same assertions as on bwrap.
#[cfg(feature = "tier3")]
mod vm {
    #[test]
    fn a_cow_run_is_kept_apart_listed_applied_and_discarded() {
        super::a_cow_run_is_kept_apart_listed_applied_and_discarded("vm");
    }

    #[test]
    fn two_cow_runs_do_not_see_each_other() {
        super::two_cow_runs_do_not_see_each_other("vm");
    }

    #[test]
    fn a_path_changed_during_the_run_is_a_conflict() {
        super::a_path_changed_during_the_run_is_a_conflict("vm");
    }

    #[test]
    fn protected_paths_stay_unwritable_in_the_overlay() {
        super::protected_paths_stay_unwritable_in_the_overlay("vm");
    }
}

/// `--cow` when hull runs as an ordinary user (nobody here): the overlay
/// is mounted in a user namespace of the run's own (before bwrap, or
/// before landlock's helper with the project's protections covered in it),
/// the project stays as it was, and the user applies the set, whose files
/// are theirs; a file the command left unreadable (mode 000) is reported,
/// not applied.
fn a_cow_run_as_a_user(tier: &str) {
    use std::os::unix::fs::MetadataExt;
    require_tier(tier);
    let w = hull_tests::nobody::AsNobody::new();
    let project = &w.project;
    std::fs::write(project.join("a.txt"), "a\n").unwrap();
    w.give_to_nobody();
    let o = w.hull(&[
        "run",
        "--tier",
        tier,
        "--cow",
        "--timeout",
        hull_tests::RUN_TIMEOUT,
        "--",
        "sh",
        "-c",
        "echo A > a.txt && mkdir d && echo n > d/new && echo s > locked && chmod 000 locked \
         && id -un && cat a.txt",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "nobody\nA\n",
        "{}",
        show(&o)
    );
    assert_eq!(
        std::fs::read_to_string(project.join("a.txt")).unwrap(),
        "a\n"
    );
    assert!(!project.join("d").exists());
    let id = kept_id(&o);
    let a = w.hull(&["changes", "apply", &id]);
    assert_eq!(a.status.code(), Some(0), "{}", show(&a));
    // What the command made unreadable to its own user is reported, not
    // applied, and does not cost the rest.
    assert!(
        String::from_utf8_lossy(&a.stdout).contains("refused locked: a file hull cannot read"),
        "{}",
        show(&a)
    );
    assert!(!project.join("locked").exists());
    assert_eq!(
        std::fs::read_to_string(project.join("a.txt")).unwrap(),
        "A\n"
    );
    let nobody = std::fs::metadata(&w.u).unwrap().uid();
    for p in ["a.txt", "d", "d/new"] {
        assert_eq!(
            std::fs::metadata(project.join(p)).unwrap().uid(),
            nobody,
            "{p}"
        );
    }
}

#[cfg(feature = "bwrap")]
#[test]
#[ignore = "needs root: runs hull as the user nobody"]
fn bwrap_a_cow_run_as_a_user() {
    a_cow_run_as_a_user("bwrap");
}

#[cfg(feature = "landlock")]
#[test]
#[ignore = "needs root: runs hull as the user nobody"]
fn landlock_a_cow_run_as_a_user() {
    a_cow_run_as_a_user("landlock");
}

/// landlock's `--cow` as a user: the project's protections are covered in
/// the overlay (`.git` read-only, a `deny` path hidden), and the metadata
/// the command changes through hull's broker (chmod, utimes: Landlock does
/// not mediate them, so hull performs them for the command) lands in the
/// overlay, not in the project below it, whether the path is absolute, a
/// link with an absolute target, or relative. Under tier none the same
/// calls change the project.
#[cfg(feature = "landlock")]
#[test]
#[ignore = "needs root: runs hull as the user nobody"]
fn landlock_a_cow_run_as_a_user_changes_metadata_in_its_overlay_only() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    require_tier("landlock");
    let w = hull_tests::nobody::AsNobody::new();
    let p = &w.project;
    std::fs::create_dir_all(p.join(".git")).unwrap();
    std::fs::write(p.join(".git/config"), "[core]\n").unwrap();
    std::fs::create_dir(p.join("secrets")).unwrap();
    std::fs::write(p.join("secrets/key"), "k\n").unwrap();
    for f in ["a.txt", "b.txt", "c.txt"] {
        std::fs::write(p.join(f), "x\n").unwrap();
    }
    w.give_to_nobody();
    let pol = deny_secrets_policy(w.top.path());
    let before = |f: &str| std::fs::metadata(p.join(f)).unwrap();
    let (mode, mtime) = (before("a.txt").mode() & 0o7777, before("a.txt").mtime());
    let script = "chmod 600 \"$PWD/a.txt\"; echo abs=$?; ln -s \"$PWD/b.txt\" l && chmod 640 l; \
                  echo link=$?; chmod 604 c.txt; echo rel=$?; touch -d @978307200 \"$PWD/a.txt\"; \
                  echo touch=$?; stat -c '%a %Y' a.txt b.txt c.txt";
    // The control: under none the same calls change the project.
    let c = w.run("none", &pol, script);
    assert_eq!(c.status.code(), Some(0), "{}", show(&c));
    assert_eq!(before("a.txt").mode() & 0o777, 0o600, "{}", show(&c));
    assert_eq!(before("b.txt").mode() & 0o777, 0o640, "{}", show(&c));
    for f in ["a.txt", "b.txt", "c.txt"] {
        std::fs::set_permissions(p.join(f), std::fs::Permissions::from_mode(mode)).unwrap();
    }
    std::fs::remove_file(p.join("l")).unwrap();
    let c = Command::new("touch")
        .args(["-d", &format!("@{mtime}")])
        .arg(p.join("a.txt"))
        .status()
        .unwrap();
    assert!(c.success());
    let o = w.hull(&[
        "run",
        "--tier",
        "landlock",
        "--cow",
        "--policy",
        pol.to_str().unwrap(),
        "--timeout",
        hull_tests::RUN_TIMEOUT,
        "--",
        "sh",
        "-c",
        &format!(
            "{script}; echo y >> .git/config; echo git=$?; ls secrets | wc -l; \
             echo z > secrets/new; echo deny=$?"
        ),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    for ok in [
        "abs=0",
        "link=0",
        "rel=0",
        "touch=0",
        "600 978307200",
        "640 ",
        "604 ",
    ] {
        assert!(out.contains(ok), "{ok}: {}", show(&o));
    }
    for refused in ["git=", "deny="] {
        assert!(
            out.contains(refused) && !out.contains(&format!("{refused}0")),
            "{refused}: {}",
            show(&o)
        );
    }
    assert!(
        out.contains("\n0\n"),
        "the deny path showed its files: {}",
        show(&o)
    );
    for f in ["a.txt", "b.txt", "c.txt"] {
        assert_eq!(before(f).mode() & 0o7777, mode, "{f}: {}", show(&o));
    }
    assert_eq!(before("a.txt").mtime(), mtime, "{}", show(&o));
    assert_eq!(
        std::fs::read_to_string(p.join(".git/config")).unwrap(),
        "[core]\n"
    );
    assert!(!p.join("secrets/new").exists() && !p.join("l").exists());
    let s = w.hull(&["changes", "show", &kept_id(&o), "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&s.stdout).unwrap();
    let mut paths: Vec<&str> = v["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["path"].as_str().unwrap())
        .collect();
    paths.sort();
    assert_eq!(paths, ["a.txt", "b.txt", "c.txt", "l"], "{}", show(&s));
}
