//! `hull image import` and `--image` without a VM: an image's layers are
//! stacked as a runtime would (a file replaced, a file and a directory
//! whited out), the result is kept in the image cache once per version of
//! the image, and a tier that cannot run an image refuses it by name.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Output};

fn hull(cache: &Path, args: &[&str]) -> Output {
    hull_cmd(cache, args).output().unwrap()
}

fn hull_cmd(cache: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_hull"));
    c.args(args).env("HULL_IMAGE_CACHE", cache);
    c
}

/// `hull run --tier bwrap` in `project`, on `image` if given, of `argv`
/// (none: the image's own command).
fn on_bwrap(cache: &Path, project: &Path, image: Option<&str>, argv: &[&str]) -> Command {
    let mut args = vec![
        "run",
        "--tier",
        "bwrap",
        "--timeout",
        "60s",
        "--project",
        project.to_str().unwrap(),
    ];
    if let Some(r) = image {
        args.extend(["--image", r]);
    }
    if !argv.is_empty() {
        args.push("--");
        args.extend(argv);
    }
    hull_cmd(cache, &args)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A layer tarball of `files` (path, contents), as `tar` writes one.
fn layer(dir: &Path, name: &str, files: &[(&str, &str)]) -> std::path::PathBuf {
    let root = dir.join(format!("{name}.d"));
    for (p, body) in files {
        let f = root.join(p);
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(f, body).unwrap();
    }
    let out = dir.join(format!("{name}.tar"));
    let st = Command::new("tar")
        .arg("-C")
        .arg(&root)
        .args(["--sort=name", "-cf"])
        .arg(&out)
        .arg(".")
        .status()
        .unwrap();
    assert!(st.success());
    out
}

fn make_image(kind: &str, out: &Path, layers: &[&Path]) {
    make_image_as(kind, out, layers, "1000")
}

/// The same, its config's `User` being `user`.
fn make_image_as(kind: &str, out: &Path, layers: &[&Path], user: &str) {
    let o = Command::new("python3")
        .env("IMAGE_USER", user)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/container-image/make.py"
        ))
        .arg(kind)
        .arg(out)
        .args(layers)
        .output()
        .unwrap();
    assert!(o.status.success(), "make.py {kind}: {}", text(&o.stderr));
}

/// What the flattened tarball holds: (name, contents) of its files.
fn files_of(tar: &Path) -> Vec<(String, String)> {
    let list = Command::new("tar").arg("-tvf").arg(tar).output().unwrap();
    let mut out = Vec::new();
    for line in text(&list.stdout).lines() {
        // `-rw-r--r-- root/root 1 2026-12-07 18:00 ./etc/a`: files only.
        let name = line.rsplit(' ').next().unwrap();
        if !line.starts_with('-') {
            continue;
        }
        let body = Command::new("tar")
            .arg("-xOf")
            .arg(tar)
            .arg(name)
            .output()
            .unwrap();
        out.push((
            name.trim_start_matches("./").to_string(),
            text(&body.stdout),
        ));
    }
    out.sort();
    out
}

#[test]
fn an_image_s_layers_are_stacked_once_per_version_of_the_image() {
    let t = tempfile::tempdir().unwrap();
    let cache = t.path().join("cache");
    let lower = layer(
        t.path(),
        "lower",
        &[
            ("etc/a", "1"),
            ("etc/b", "b"),
            ("gone/inside", "i"),
            ("kept", "k"),
        ],
    );
    let upper = layer(
        t.path(),
        "upper",
        &[("etc/a", "2"), ("etc/.wh.b", ""), (".wh.gone", "")],
    );
    let archive = t.path().join("image.docker.tar");
    make_image("docker-archive", &archive, &[&lower, &upper]);
    let reference = format!("docker-archive:{}", archive.display());
    let o = hull(&cache, &["image", "import", &reference]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    let (digest, path) = out.trim().split_once('\t').unwrap();
    assert!(digest.starts_with("sha256:"), "{out}");
    assert!(
        text(&o.stderr).contains("flattening 2 layer(s)"),
        "{}",
        text(&o.stderr)
    );
    assert_eq!(
        files_of(Path::new(path)),
        [
            ("etc/a".to_string(), "2".to_string()),
            ("kept".to_string(), "k".to_string())
        ]
    );
    // The same version again: nothing is read or flattened, and the
    // tarball's times (its version to the rootfs digest's record) stay.
    let times = |p: &str| {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(p).unwrap();
        (m.mtime(), m.mtime_nsec(), m.ctime(), m.ctime_nsec())
    };
    let before = times(path);
    let again = hull(&cache, &["image", "import", &reference]);
    assert_eq!(times(path), before, "the tarball was touched");
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert_eq!(text(&again.stdout), out);
    assert_eq!(text(&again.stderr), "", "read again");
    // Nothing of the blobs is left once flattened.
    let blobs: Vec<_> = std::fs::read_dir(cache.join("oci-blobs"))
        .unwrap()
        .collect();
    assert!(blobs.is_empty(), "{blobs:?}");
    // Listed with its digest, size and source; removed by its digest.
    let l = hull(&cache, &["image", "list"]);
    assert!(l.status.success(), "{}", text(&l.stderr));
    let listed = text(&l.stdout);
    let line = listed
        .lines()
        .find(|l| l.starts_with(digest))
        .unwrap_or_else(|| panic!("{digest} not listed: {listed}"));
    assert!(line.ends_with(&reference), "{line}");
    let rm = hull(&cache, &["image", "rm", &digest[..19]]);
    assert!(rm.status.success(), "{}", text(&rm.stderr));
    assert_eq!(
        text(&rm.stdout),
        format!("removed the imported image {digest}\n")
    );
    assert!(!Path::new(path).exists(), "{path} is left");
    let l = hull(&cache, &["image", "list"]);
    assert!(!text(&l.stdout).contains(digest), "{}", text(&l.stdout));
    let again = hull(&cache, &["image", "rm", digest]);
    assert!(!again.status.success());
    assert!(
        text(&again.stderr).contains("no imported image has that digest"),
        "{}",
        text(&again.stderr)
    );
}

#[test]
fn a_tier_that_runs_no_image_refuses_one_by_name() {
    let t = tempfile::tempdir().unwrap();
    for tier in ["landlock", "none"] {
        let o = hull(
            &t.path().join("cache"),
            &[
                "run",
                "--tier",
                tier,
                "--project",
                t.path().to_str().unwrap(),
                "--image",
                "oci-archive:/nonexistent.tar",
                "--",
                "touch",
                "ran",
            ],
        );
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(125), "{tier}: {err}");
        assert!(
            err.contains(&format!(
                "tier {tier}: --image oci-archive:/nonexistent.tar is refused"
            )),
            "{tier}: {err}"
        );
        assert!(!t.path().join("ran").exists(), "{tier}: the command ran");
    }
}

#[test]
fn what_is_no_image_is_refused_naming_the_forms() {
    let t = tempfile::tempdir().unwrap();
    let missing = t.path().join("missing.tar");
    for (reference, want) in [
        ("ubuntu:24.04".to_string(), "unknown form".to_string()),
        (
            format!("oci-archive:{}", missing.display()),
            format!("{}", missing.display()),
        ),
    ] {
        let o = hull(&t.path().join("cache"), &["image", "import", &reference]);
        let err = text(&o.stderr);
        assert!(!o.status.success(), "{reference}: {err}");
        assert!(err.contains(&want), "{reference}: {err}");
    }
}

#[test]
fn explain_says_what_an_image_adds() {
    let t = tempfile::tempdir().unwrap();
    let pol = t.path().join("image.toml");
    std::fs::write(
        &pol,
        "version = 1\n[fs]\nread_write = [\"${PROJECT}\"]\n[vm]\nimage = \"oci:/srv/layout:v1\"\n",
    )
    .unwrap();
    let o = hull(
        &t.path().join("cache"),
        &[
            "policy",
            "explain",
            "--tier",
            "vm",
            "--project",
            t.path().to_str().unwrap(),
            pol.to_str().unwrap(),
        ],
    );
    let out = text(&o.stdout);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        out.contains("container userland: the container image oci:/srv/layout:v1"),
        "{out}"
    );
}

/// A userland of the host's static busybox (`make.py busybox-layer`).
fn busybox_layer(dir: &Path) -> std::path::PathBuf {
    let out = dir.join("busybox.tar");
    make_image("busybox-layer", &out, &[]);
    out
}

/// `--image` on bwrap: the image's tree is `/` (read-only), the project is
/// bound on top and written through, `/tmp` is the sandbox's own; the
/// host's system directories are not there. The same command without the
/// image sees the host's.
#[test]
fn an_image_is_the_root_of_a_bwrap_sandbox() {
    let t = tempfile::tempdir().unwrap();
    let cache = t.path().join("cache");
    let project = t.path().join("p");
    std::fs::create_dir(&project).unwrap();
    let bb = busybox_layer(t.path());
    let archive = t.path().join("bb.oci.tar");
    make_image("oci-archive", &archive, &[&bb]);
    let reference = format!("oci-archive:{}", archive.display());
    let script = "cat /etc/os-release; cat /usr/share/hello; echo \"from image: $FROM_IMAGE\"; \
                  stat -c %a /bin/setuid-busybox; echo mine > made-in-project; \
                  echo scratch > /tmp/t && cat /tmp/t; \
                  touch /usr/share/new 2>/dev/null || echo no write to the image; \
                  test -e /usr/bin/bwrap || echo no host bwrap; id -u; id -g; pwd";
    let run = |image: Option<&str>| {
        on_bwrap(&cache, &project, image, &["sh", "-c", script])
            .output()
            .unwrap()
    };
    // The control: without the image, the host's userland.
    let o = run(None);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(
        !text(&o.stdout).contains("hull-test-image"),
        "{}",
        text(&o.stdout)
    );
    std::fs::remove_file(project.join("made-in-project")).unwrap();
    let o = run(Some(&reference));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(
        text(&o.stdout),
        "ID=hull-test-image\nfrom the image\nfrom image: yes\n755\nscratch\n\
         no write to the image\nno host bwrap\n1000\n1000\n/work\n",
        "{}",
        text(&o.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(project.join("made-in-project")).unwrap(),
        "mine\n"
    );
    // The image's tree is unchanged, and nothing of the sandbox's /tmp is
    // on the host.
    let trees: Vec<_> = std::fs::read_dir(cache.join("oci-trees"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(trees.len(), 1, "{trees:?}");
    assert!(!trees[0].join("usr/share/new").exists());
    assert!(!trees[0].join("tmp/t").exists());
    // No command: the image's own.
    let o = on_bwrap(&cache, &project, Some(&reference), &[])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "the image says hello\n");
    // `hull image rm` takes the tree with the image.
    let list = text(&hull(&cache, &["image", "list"]).stdout);
    let digest = list
        .split_whitespace()
        .find(|w| w.starts_with("sha256:"))
        .unwrap_or_else(|| panic!("{list}"))
        .to_string();
    // Its tarball and its unpacked tree, each with its size.
    let line = list.lines().find(|l| l.starts_with(&digest)).unwrap();
    let sizes: Vec<&str> = line.split_whitespace().skip(1).take(4).collect();
    assert!(
        sizes.len() == 4 && sizes[0] != "-" && sizes[2] != "-" && sizes[1].ends_with('B'),
        "{list}"
    );
    // Not while a run uses it.
    let mut running = on_bwrap(
        &cache,
        &project,
        Some(&reference),
        &["sh", "-c", "echo up > up; sleep 60"],
    )
    .spawn()
    .unwrap();
    let t0 = std::time::Instant::now();
    while !project.join("up").exists() {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(30),
            "the run did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let o = hull(&cache, &["image", "rm", &digest]);
    assert!(!o.status.success());
    assert!(
        text(&o.stderr).contains("a run is using it"),
        "{}",
        text(&o.stderr)
    );
    assert!(trees[0].join("usr/share/hello").exists());
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(running.id() as i32).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    running.wait().unwrap();
    let o = hull(&cache, &["image", "rm", &digest]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(!trees[0].exists());
}

/// A project that holds the image cache would let the command change the
/// tree every later run starts from: refused, nothing run.
#[test]
fn an_image_run_whose_project_holds_the_cache_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let cache = t.path().join("cache");
    let bb = busybox_layer(t.path());
    let archive = t.path().join("bb.oci.tar");
    make_image("oci-archive", &archive, &[&bb]);
    let reference = format!("oci-archive:{}", archive.display());
    let o = on_bwrap(&cache, t.path(), Some(&reference), &["touch", "ran"])
        .output()
        .unwrap();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(125), "{err}");
    assert!(err.contains("which this policy makes writable"), "{err}");
    assert!(!t.path().join("ran").exists());
    // A project inside the trees: the same.
    let inside = std::fs::read_dir(cache.join("oci-trees"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.join("usr").is_dir())
        .unwrap()
        .join("usr/share");
    let before: Vec<_> = std::fs::read_dir(&inside).unwrap().collect();
    let o = on_bwrap(&cache, &inside, Some(&reference), &["touch", "ran"])
        .output()
        .unwrap();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(125), "{err}");
    assert!(err.contains("which this policy makes writable"), "{err}");
    assert!(!inside.join("ran").exists());
    assert_eq!(std::fs::read_dir(&inside).unwrap().count(), before.len());
}

/// The image's `User` on bwrap: a name looked up in the image's own
/// `/etc/passwd` (root there is uid 0 in the sandbox, no capability); one
/// the image does not have is refused by name, nothing run.
#[test]
fn an_image_s_user_is_the_command_s_ids_on_bwrap() {
    let t = tempfile::tempdir().unwrap();
    let cache = t.path().join("cache");
    let project = t.path().join("p");
    std::fs::create_dir(&project).unwrap();
    let bb = busybox_layer(t.path());
    let run = |user: &str| {
        let archive = t.path().join(format!("{user}.oci.tar"));
        make_image_as("oci-archive", &archive, &[&bb], user);
        let reference = format!("oci-archive:{}", archive.display());
        on_bwrap(
            &cache,
            &project,
            Some(&reference),
            &[
                "sh",
                "-c",
                "id -u; id -g; cat /proc/self/status | grep ^CapEff; echo ran > ran",
            ],
        )
        .output()
        .unwrap()
    };
    let o = run("root");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(
        text(&o.stdout),
        "0\n0\nCapEff:\t0000000000000000\n",
        "{}",
        text(&o.stderr)
    );
    std::fs::remove_file(project.join("ran")).unwrap();
    let o = run("app");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(
        text(&o.stdout),
        "1500\n1600\nCapEff:\t0000000000000000\n",
        "{}",
        text(&o.stderr)
    );
    std::fs::remove_file(project.join("ran")).unwrap();
    // A number: its own, the image's primary group of it.
    let o = run("1500");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(
        text(&o.stdout).starts_with("1500\n1600\n"),
        "{}",
        text(&o.stderr)
    );
    std::fs::remove_file(project.join("ran")).unwrap();
    let o = run("ghost");
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(125), "{err}");
    assert!(
        err.contains("\"ghost\" is not in the image's /etc/passwd"),
        "{err}"
    );
    assert!(!project.join("ran").exists());
}

/// `hull run --tier bwrap --policy POLICY --image REF -- argv` in
/// `project`, with no auth file of the caller's but `auth`.
fn pull_on_bwrap(
    cache: &Path,
    project: &Path,
    policy: Option<&Path>,
    image: &str,
    auth: Option<&Path>,
    argv: &[&str],
) -> Output {
    let mut args = vec![
        "run",
        "--tier",
        "bwrap",
        "--timeout",
        "60s",
        "--project",
        project.to_str().unwrap(),
        "--image",
        image,
    ];
    if let Some(p) = policy {
        args.extend(["--policy", p.to_str().unwrap()]);
    }
    args.push("--");
    args.extend(argv);
    let mut c = hull_cmd(cache, &args);
    // The caller's own docker config is not this test's.
    c.env(
        "DOCKER_CONFIG",
        cache.parent().unwrap().join("no-docker-config"),
    )
    .env_remove("REGISTRY_AUTH_FILE");
    if let Some(a) = auth {
        c.env("REGISTRY_AUTH_FILE", a);
    }
    c.output().unwrap()
}

/// A policy whose network allows the registry on `port` (the project
/// writable, as the default's).
fn registry_policy(dir: &Path, name: &str, port: u16) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(
        &p,
        format!(
            "version = 1\n[fs]\nread_write = [\"${{PROJECT}}\"]\n[net]\nmode = \"allowlist\"\n\
             allow = [\"127.0.0.1\"]\nports = [{port}]\nallow_private = [\"127.0.0.1/32\"]\n"
        ),
    )
    .unwrap();
    p
}

/// Pushes the busybox image to `reg` as `team/tool` (`:plain` its
/// manifest, `:multi` an index of it and an arm64 one); its digest.
fn push(t: &Path, reg: &hull_tests::registry::Registry, login: Option<(&str, &str)>) -> String {
    let bb = busybox_layer(t);
    let mut c = Command::new("python3");
    c.arg(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/container-image/make.py"
    ))
    .args(["push", &reg.host, "team/tool"])
    .arg(&bb);
    if let Some((u, p)) = login {
        c.env("REGISTRY_USER", u).env("REGISTRY_PASSWORD", p);
    }
    let o = c.output().unwrap();
    assert!(o.status.success(), "push: {}", text(&o.stderr));
    text(&o.stdout).trim().to_string()
}

/// `docker://`: an image pulled from a registry on loopback (Debian's
/// docker-registry) through hull's proxy holding the policy's allowlist.
/// Refused, with nothing pulled, when the policy has no network or not the
/// registry's port; pulled once allowed (an index followed to the host's
/// platform) and run; the same manifest by another tag or by its digest
/// reads nothing again; a digest the registry does not have is refused.
#[test]
fn a_registry_s_image_is_pulled_through_the_policy_s_allowlist() {
    let t = tempfile::tempdir().unwrap();
    let cache = t.path().join("cache");
    let project = t.path().join("p");
    std::fs::create_dir(&project).unwrap();
    let reg = hull_tests::registry::Registry::start(t.path(), None);
    let digest = push(t.path(), &reg, None);
    let allowed = registry_policy(t.path(), "allowed.toml", reg.port);
    let other_port = registry_policy(t.path(), "other-port.toml", reg.port + 1);
    let multi = format!("docker://{}/team/tool:multi", reg.host);
    let argv = ["sh", "-c", "cat /etc/os-release; pwd"];
    for (policy, why) in [
        (None, "the policy's network mode is none"),
        (
            Some(other_port.as_path()),
            &*format!("port {} is not allowed", reg.port),
        ),
    ] {
        let o = pull_on_bwrap(&cache, &project, policy, &multi, None, &argv);
        assert_eq!(o.status.code(), Some(125), "{}", text(&o.stderr));
        let err = text(&o.stderr);
        assert!(err.contains(&multi) && err.contains(why), "{err}");
        assert!(err.contains("to allow it: [net]"), "{err}");
        assert_eq!(text(&o.stdout), "");
    }
    let l = hull(&cache, &["image", "list"]);
    assert!(!text(&l.stdout).contains("sha256:"), "{}", text(&l.stdout));
    let o = pull_on_bwrap(&cache, &project, Some(&allowed), &multi, None, &argv);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "ID=hull-test-image\n/work\n");
    assert!(
        text(&o.stderr).contains("flattening 1 layer(s)"),
        "{}",
        text(&o.stderr)
    );
    let l = hull(&cache, &["image", "list"]);
    let listed = text(&l.stdout);
    assert!(
        listed
            .lines()
            .any(|l| l.starts_with(&digest) && l.ends_with(&multi)),
        "{digest} from {multi} not listed: {listed}"
    );
    // The same manifest by its tag, pinned by its digest, and by the
    // digest hull names it with: nothing flattened or unpacked again.
    for r in [
        format!("docker://{}/team/tool:plain", reg.host),
        format!("docker://{}/team/tool@{digest}", reg.host),
        digest.clone(),
    ] {
        let o = pull_on_bwrap(&cache, &project, Some(&allowed), &r, None, &argv);
        assert_eq!(o.status.code(), Some(0), "{r}: {}", text(&o.stderr));
        assert_eq!(text(&o.stdout), "ID=hull-test-image\n/work\n", "{r}");
        let err = text(&o.stderr);
        assert!(
            !err.contains("flattening") && !err.contains("unpacking"),
            "{r}: {err}"
        );
    }
    let unknown = format!("docker://{}/team/tool@sha256:{}", reg.host, "0".repeat(64));
    let o = pull_on_bwrap(&cache, &project, Some(&allowed), &unknown, None, &argv);
    assert_eq!(o.status.code(), Some(125), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("404"), "{}", text(&o.stderr));
}

/// A layer the registry serves that is not the one its manifest names
/// (its stored bytes changed, the size kept) is refused naming both
/// digests, and nothing of it is imported or run.
#[test]
fn a_registry_s_blob_that_is_not_its_digest_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let cache = t.path().join("cache");
    let project = t.path().join("p");
    std::fs::create_dir(&project).unwrap();
    let reg = hull_tests::registry::Registry::start(t.path(), None);
    push(t.path(), &reg, None);
    let allowed = registry_policy(t.path(), "allowed.toml", reg.port);
    // The largest blob is the layer; one byte of it flipped.
    let mut blobs: Vec<(u64, std::path::PathBuf)> = Vec::new();
    let mut stack = vec![reg.storage.join("docker/registry/v2/blobs")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                blobs.push((e.metadata().unwrap().len(), e.path()));
            }
        }
    }
    blobs.sort();
    let (_, layer) = blobs.last().unwrap();
    let layer_digest = format!(
        "sha256:{}",
        layer
            .parent()
            .unwrap()
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
    );
    let mut bytes = std::fs::read(layer).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(layer, &bytes).unwrap();
    let r = format!("docker://{}/team/tool:plain", reg.host);
    let o = pull_on_bwrap(&cache, &project, Some(&allowed), &r, None, &["true"]);
    assert_eq!(o.status.code(), Some(125), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    assert!(
        err.contains(&format!("for {layer_digest}: not the blob asked for")),
        "{err}"
    );
    let l = hull(&cache, &["image", "list"]);
    assert!(!text(&l.stdout).contains("sha256:"), "{}", text(&l.stdout));
    let left: Vec<_> = std::fs::read_dir(cache.join("oci-blobs"))
        .unwrap()
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// A registry that asks for a login: refused anonymously (naming where
/// credentials are looked for); pulled with the caller's auth file, whose
/// credentials stay out of the sandbox (neither the file nor the variable
/// is there).
#[test]
fn a_registry_s_login_comes_from_the_caller_s_auth_file_and_stays_outside() {
    let t = tempfile::tempdir().unwrap();
    let cache = t.path().join("cache");
    let project = t.path().join("p");
    std::fs::create_dir(&project).unwrap();
    let login = ("puller", "s3cret-pw");
    let reg = hull_tests::registry::Registry::start(t.path(), Some(login));
    push(t.path(), &reg, Some(login));
    let allowed = registry_policy(t.path(), "allowed.toml", reg.port);
    let r = format!("docker://{}/team/tool:plain", reg.host);
    let auth = t.path().join("auth.json");
    let script = format!(
        "echo \"auth=${{REGISTRY_AUTH_FILE:-none}}\"; cat {} 2>/dev/null || echo no file",
        auth.display()
    );
    let argv = ["sh", "-c", script.as_str()];
    let o = pull_on_bwrap(&cache, &project, Some(&allowed), &r, None, &argv);
    assert_eq!(o.status.code(), Some(125), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    assert!(
        err.contains("asks for credentials") && err.contains("REGISTRY_AUTH_FILE"),
        "{err}"
    );
    // Wrong password: refused, naming the user and the file, not the
    // password.
    let write_auth = |pw: &str| {
        use base64::Engine as _;
        let encode = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        std::fs::write(
            &auth,
            format!(
                "{{\"auths\":{{\"{}\":{{\"auth\":\"{}\"}}}}}}",
                reg.host,
                encode(&format!("{}:{pw}", login.0))
            ),
        )
        .unwrap();
    };
    write_auth("wrong-pw");
    let o = pull_on_bwrap(&cache, &project, Some(&allowed), &r, Some(&auth), &argv);
    assert_eq!(o.status.code(), Some(125), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    assert!(
        err.contains("as puller from") && err.contains(auth.to_str().unwrap()),
        "{err}"
    );
    assert!(!err.contains("wrong-pw"), "{err}");
    write_auth(login.1);
    let o = pull_on_bwrap(&cache, &project, Some(&allowed), &r, Some(&auth), &argv);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "auth=none\nno file\n");
}

/// An image buildah builds from a Containerfile (`FROM scratch`, the
/// busybox layer added, a small program copied in, `ENV`, `WORKDIR`,
/// `USER`, `CMD`; a layer per step), written by `buildah push` as an OCI
/// archive, a docker archive, an OCI layout and into a registry on
/// loopback: each runs on bwrap with the image's environment, working
/// directory, user, program and command.
#[test]
fn a_buildah_made_image_runs_in_every_form_on_bwrap() {
    assert!(
        Path::new("/usr/bin/buildah").exists(),
        "/usr/bin/buildah is missing: `scripts/setup.sh --test` installs buildah"
    );
    let t = tempfile::tempdir().unwrap();
    let cache = t.path().join("cache");
    let project = t.path().join("p");
    std::fs::create_dir(&project).unwrap();
    let context = t.path().join("context");
    std::fs::create_dir(&context).unwrap();
    // The layer's /etc/os-release says which image this is.
    let o = Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/container-image/make.py"
        ))
        .arg("busybox-layer")
        .arg(context.join("busybox.tar"))
        .arg("made-by-buildah")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    std::fs::write(
        context.join("hello"),
        "#!/bin/sh\necho \"a program the Containerfile installed\"\n",
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            context.join("hello"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
    }
    std::fs::write(
        context.join("Containerfile"),
        "FROM scratch\nADD busybox.tar /\nCOPY hello /usr/local/bin/hello\n\
         ENV FROM_BUILDAH=yes PATH=/usr/local/bin:/usr/bin:/bin\nWORKDIR /srv/app\nUSER app\n\
         CMD [\"sh\", \"-c\", \"hello; pwd; id -u\"]\n",
    )
    .unwrap();
    let storage = t.path().join("buildah");
    let buildah = |args: &[&str]| -> String {
        let o = Command::new("buildah")
            .arg("--root")
            .arg(storage.join("root"))
            .arg("--runroot")
            .arg(storage.join("run"))
            .args(["--storage-driver", "vfs"])
            .args(args)
            .env("HOME", t.path())
            .output()
            .unwrap();
        assert!(o.status.success(), "buildah {args:?}: {}", text(&o.stderr));
        text(&o.stdout).trim().to_string()
    };
    buildah(&[
        "bud",
        "-q",
        "--layers",
        "-t",
        "localhost/hull-test:1",
        context.to_str().unwrap(),
    ]);
    let reg = hull_tests::registry::Registry::start(t.path(), None);
    let oci = t.path().join("img.oci.tar");
    let docker = t.path().join("img.docker.tar");
    let layout = t.path().join("layout");
    let pushed = format!("docker://{}/buildah/img:1", reg.host);
    for dest in [
        format!("oci-archive:{}", oci.display()),
        format!("docker-archive:{}", docker.display()),
        format!("oci:{}:v1", layout.display()),
    ] {
        buildah(&["push", "-q", "localhost/hull-test:1", &dest]);
    }
    buildah(&[
        "push",
        "-q",
        "--tls-verify=false",
        "localhost/hull-test:1",
        &pushed,
    ]);
    let allowed = registry_policy(t.path(), "allowed.toml", reg.port);
    for r in [
        format!("oci-archive:{}", oci.display()),
        format!("docker-archive:{}", docker.display()),
        format!("oci:{}:v1", layout.display()),
        pushed.clone(),
    ] {
        let script = "cat /etc/os-release; echo $FROM_BUILDAH; pwd; id -u; id -g";
        let o = pull_on_bwrap(
            &cache,
            &project,
            Some(&allowed),
            &r,
            None,
            &["sh", "-c", script],
        );
        assert_eq!(o.status.code(), Some(0), "{r}: {}", text(&o.stderr));
        assert_eq!(
            text(&o.stdout),
            "ID=made-by-buildah\nyes\n/srv/app\n1500\n1600\n",
            "{r}: {}",
            text(&o.stderr)
        );
    }
    // No command: the image's own.
    let o = hull_cmd(
        &cache,
        &[
            "run",
            "--tier",
            "bwrap",
            "--timeout",
            "60s",
            "--project",
            project.to_str().unwrap(),
            "--policy",
            allowed.to_str().unwrap(),
            "--image",
            &format!("oci-archive:{}", oci.display()),
        ],
    )
    .output()
    .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(
        text(&o.stdout),
        "a program the Containerfile installed\n/srv/app\n1500\n"
    );
}
