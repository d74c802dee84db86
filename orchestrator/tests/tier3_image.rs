//! Boots the built tier-3 image for real (QEMU, TCG here) with a hand-written
//! command line that follows the guest contract (images/README.md): two virtiofsd
//! (project read-write, spill `--readonly`, host user translated to guest uid 1000),
//! the virtio-serial agent port on a unix socket, a qcow2 overlay over the base disk,
//! and the agent disk read-only after it.
//! Then, as the host, it configures the container and runs commands in it through
//! the outer and inner agents, and checks the boundary both ways.
//!
//! Needs a built image: `hull image build`; the agent is `HULL_AGENT` (default:
//! the `hull-agent` beside this test's build), on the disk hull makes for it. Built with the
//! `tier3` feature only (the machine declares it has QEMU, virtiofsd and the
//! image): `cargo nextest run -p hull --features tier3 --test tier3_image`.

#![cfg(all(target_os = "linux", feature = "tier3"))]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hull::vm::image::{self, Cache};
use hull_protocol::*;

struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn agent_path() -> PathBuf {
    std::env::var_os("HULL_AGENT")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            // target/<profile>/deps/<test> -> target/<profile>/hull-agent
            let exe = std::env::current_exe().unwrap();
            exe.parent()
                .and_then(Path::parent)
                .map(|d| d.join("hull-agent"))
                .unwrap()
        })
}

fn virtiofsd() -> PathBuf {
    let mut cands: Vec<PathBuf> =
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .map(|d| d.join("virtiofsd"))
            .collect();
    if let Some(h) = std::env::var_os("HOME") {
        cands.push(Path::new(&h).join(".cargo/bin/virtiofsd"));
    }
    cands.push("/usr/libexec/virtiofsd".into());
    cands.into_iter().find(|p| p.is_file()).expect(
        "virtiofsd not found (cargo install virtiofsd --locked; see scripts/setup.sh --tier3)",
    )
}

/// Waits until `log` holds `line`: a helper that prints it once it listens
/// is ready, where a socket file alone is not (it exists from `bind`, before
/// `listen`, and a connect in between is refused).
fn wait_for_line(log: &Path, line: &str, what: &str, secs: u64) {
    let t = Instant::now();
    while !std::fs::read_to_string(log).is_ok_and(|s| s.contains(line)) {
        assert!(
            t.elapsed() < Duration::from_secs(secs),
            "{what} did not print {line:?} in {secs} s; its log: {}",
            log.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Connects to a server socket, retrying while it is absent or not yet
/// listening (QEMU binds its chardev socket before it listens on it).
fn connect_retrying(path: &Path, what: &str, secs: u64) -> UnixStream {
    let t = Instant::now();
    loop {
        match UnixStream::connect(path) {
            Ok(s) => return s,
            Err(e) if t.elapsed() >= Duration::from_secs(secs) => {
                panic!("{what} at {} refused us for {secs} s: {e}", path.display())
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

fn spawn_virtiofsd(run: &Path, tag: &str, dir: &Path, readonly: bool) -> Child {
    let sock = run.join(format!("{tag}.sock"));
    let log = run.join(format!("virtiofsd-{tag}.log"));
    let mut c = Command::new(virtiofsd());
    c.arg(format!("--socket-path={}", sock.display()))
        .arg(format!("--shared-dir={}", dir.display()))
        .arg("--sandbox=namespace")
        .arg("--seccomp=kill")
        .arg("--log-level=info")
        // The host user (root here) appears as guest uid/gid 1000 and back.
        .args([
            "--translate-uid",
            "map:1000:0:1",
            "--translate-gid",
            "map:1000:0:1",
        ])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    if readonly {
        c.arg("--readonly");
    }
    let child = c.spawn().expect("start virtiofsd");
    wait_for_line(
        &log,
        "Waiting for vhost-user socket connection",
        "virtiofsd",
        10,
    );
    child
}

struct Outcome {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    end: Message,
    seconds: f64,
    /// The `Usage` the outer agent sent before the `Exit`.
    peak_memory_bytes: Option<u64>,
}

fn exec(conn: &mut Connection<UnixStream>, id: u32, script: &str, cwd: &Path) -> Outcome {
    exec_as(conn, id, script, cwd, Some(image::GUEST_UID))
}

/// `ids`: the uid (and gid, the same) the exec names; the inner agent
/// runs none that names no user or ids.
fn exec_as(
    conn: &mut Connection<UnixStream>,
    id: u32,
    script: &str,
    cwd: &Path,
    ids: Option<u32>,
) -> Outcome {
    let req = Exec {
        argv: vec![Bytes::from("sh"), Bytes::from("-c"), Bytes::from(script)],
        env: vec![
            ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()),
            ("HOME".into(), "/tmp".into()),
        ],
        cwd: Bytes::from(cwd.to_str().unwrap()),
        timeout_ms: Some(60_000),
        stdin: false,
        uid: ids,
        gid: ids,
        scrub: vec![],
        keep_leftovers: false,
        user: None,
    };
    let t = Instant::now();
    conn.send(&Message::Exec(req), id).unwrap();
    let (mut stdout, mut stderr, mut peak_memory_bytes) = (Vec::new(), Vec::new(), None);
    loop {
        let (fid, m) = conn.recv().unwrap();
        assert_eq!(fid, id, "frame for another id: {m:?}");
        match m {
            Message::Started { .. } | Message::StdinAck { .. } => {}
            Message::Stdout(b) => stdout.extend(b),
            Message::Stderr(b) => stderr.extend(b),
            Message::Usage {
                peak_memory_bytes: p,
            } => {
                assert!(peak_memory_bytes.is_none(), "a second Usage");
                peak_memory_bytes = Some(p);
            }
            end @ (Message::Exit(_) | Message::Error { .. }) => {
                return Outcome {
                    stdout,
                    stderr,
                    end,
                    seconds: t.elapsed().as_secs_f64(),
                    peak_memory_bytes,
                }
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn boot_configure_and_run_in_the_container() {
    let cache = Cache::default_location().unwrap();
    let img = image::find(&cache, &image::recipe::Recipe::base()).unwrap_or_else(|e| panic!("{e}"));
    let _hold = img.lock_shared(&cache).unwrap();
    let agent = image::GuestImage::with_agent(&img.dir, &agent_path())
        .unwrap_or_else(|e| panic!("{e}"))
        .agent;
    let tmp = tempfile::Builder::new()
        .prefix("hull-t3-")
        .tempdir()
        .unwrap();
    let root = tmp.path().canonicalize().unwrap();
    let run = root.join("run");
    let project = root.join("project");
    let spill = root.join("spill");
    for d in [&run, &project, &spill] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::write(project.join("input.txt"), b"from the host\n").unwrap();
    std::fs::write(spill.join("report.txt"), b"original\n").unwrap();

    let mut procs = Procs(Vec::new());
    procs
        .0
        .push(spawn_virtiofsd(&run, "project", &project, false));
    procs.0.push(spawn_virtiofsd(&run, "spill", &spill, true));
    let overlay = run.join("root.qcow2");
    let st = Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2", "-F", "raw", "-b"])
        .arg(&img.base_disk)
        .arg(&overlay)
        .status()
        .unwrap();
    assert!(st.success(), "qemu-img create failed");

    let mem = 1024;
    let smp = std::env::var("HULL_TEST_SMP").unwrap_or_else(|_| "1".into());
    let agent_sock = run.join("agent.sock");
    let console = run.join("console.log");
    let t_boot = Instant::now();
    let qemu = Command::new("qemu-system-x86_64")
        .args([
            "-accel",
            "tcg",
            "-M",
            "pc",
            "-nodefaults",
            "-no-user-config",
        ])
        .args([
            "-m",
            &format!("{mem}M"),
            "-smp",
            &smp,
            "-display",
            "none",
            "-no-reboot",
        ])
        .arg("-kernel")
        .arg(&img.kernel)
        .arg("-initrd")
        .arg(&img.initrd)
        .args(["-append", img.cmdline()])
        .arg("-serial")
        .arg(format!("file:{}", console.display()))
        .args([
            "-object",
            &format!("memory-backend-memfd,id=mem,size={mem}M,share=on"),
        ])
        .args(["-numa", "node,memdev=mem"])
        .arg("-drive")
        .arg(format!(
            "file={},format=qcow2,if=none,id=root",
            overlay.display()
        ))
        .args(["-device", "virtio-blk-pci,drive=root"])
        .arg("-drive")
        .arg(format!(
            "file={},format=raw,if=none,id=agent,readonly=on",
            agent.path.display()
        ))
        .args([
            "-device",
            "virtio-blk-pci,drive=agent",
            "-device",
            "virtio-rng-pci",
        ])
        .arg("-chardev")
        .arg(format!(
            "socket,id=fs0,path={}",
            run.join("project.sock").display()
        ))
        .args(["-device", "vhost-user-fs-pci,chardev=fs0,tag=project"])
        .arg("-chardev")
        .arg(format!(
            "socket,id=fs1,path={}",
            run.join("spill.sock").display()
        ))
        .args(["-device", "vhost-user-fs-pci,chardev=fs1,tag=spill"])
        .args(["-device", "virtio-serial-pci"])
        .arg("-chardev")
        .arg(format!(
            "socket,id=agent,path={},server=on,wait=off",
            agent_sock.display()
        ))
        .args(["-device", "virtserialport,chardev=agent,name=agent.0"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(run.join("qemu.log")).unwrap())
        .spawn()
        .unwrap();
    procs.0.push(qemu);

    let stream = connect_retrying(&agent_sock, "QEMU's agent socket", 30);
    stream
        // Inside the test runner's 5 minutes (.config/nextest.toml): a wedged
        // guest fails this read with its console named, not a kill.
        .set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    let mut conn = Connection::new(stream);
    let hello = conn
        .hello(Role::Host, "tier3-image-test")
        .unwrap_or_else(|e| {
            panic!(
                "no hello from the guest: {e}; console: {}",
                console.display()
            )
        });
    assert_eq!(hello.role, Role::OuterAgent);
    let ready_s = t_boot.elapsed().as_secs_f64();

    let now_ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let spec = ConfigureSpec {
        shares: vec![
            Share {
                tag: "project".into(),
                guest_path: format!("{}/project", image::SHARE_ROOT),
                container_path: project.to_str().unwrap().into(),
                readonly: false,
                subdir: None,
                noexec: false,
            },
            Share {
                tag: "spill".into(),
                guest_path: format!("{}/spill", image::SHARE_ROOT),
                container_path: spill.to_str().unwrap().into(),
                readonly: true,
                subdir: None,
                noexec: false,
            },
        ],
        container: ContainerSpec {
            name: image::RUN_CONTAINER.into(),
            base: image::BASE_CONTAINER.into(),
            uid: image::GUEST_UID,
            gid: image::GUEST_GID,
            memory_bytes: Some(512 << 20),
            cpus: Some(1),
            processes: Some(512),
        },
        clock_unix_ns: now_ns,
        prepare: false,
        network: None,
        overlay: None,
    };
    let t_conf = Instant::now();
    conn.send(&Message::Configure(spec), 0).unwrap();
    match conn.recv().unwrap() {
        (0, Message::Configured(c)) => assert_eq!(c.container, image::RUN_CONTAINER),
        other => panic!(
            "configure failed: {other:?}; console: {}",
            console.display()
        ),
    }
    let configure_s = t_conf.elapsed().as_secs_f64();

    // echo hi, in the container, as uid 1000.
    let o = exec(&mut conn, 1, "echo hi", &project);
    assert_eq!(
        o.end,
        Message::Exit(ExitStatus::Code(0)),
        "stderr: {}",
        text(&o.stderr)
    );
    assert_eq!(text(&o.stdout), "hi\n");
    // An exec that names no user or ids is refused: the inner agent, the
    // container's root, never runs a command as itself unasked.
    let r = exec_as(&mut conn, 90, "touch /root-made", &project, None);
    assert!(
        matches!(
            &r.end,
            Message::Error {
                code: ErrorCode::PolicyDenied,
                ..
            }
        ),
        "{:?}",
        r.end
    );
    // After a boot as after a restore: the container's peak while it ran.
    assert!(
        o.peak_memory_bytes.is_some_and(|p| p > 0 && p < 512 << 20),
        "{:?}",
        o.peak_memory_bytes
    );
    let first_exec_s = o.seconds;

    let o = exec(&mut conn, 2, "id -u; id -g", &project);
    assert_eq!(
        o.end,
        Message::Exit(ExitStatus::Code(0)),
        "stderr: {}",
        text(&o.stderr)
    );
    assert_eq!(
        text(&o.stdout),
        "1000\n1000\n",
        "the command does not run as uid/gid 1000"
    );
    // Inside a user namespace whose root is not guest root.
    let o = exec(&mut conn, 6, "cat /proc/self/uid_map", &project);
    let map = text(&o.stdout);
    let root_line: Vec<u64> = map
        .lines()
        .map(|l| {
            l.split_whitespace()
                .map(|x| x.parse().unwrap())
                .collect::<Vec<u64>>()
        })
        .find(|f| f[0] == 0)
        .unwrap_or_else(|| panic!("no root line in {map}"));
    assert_ne!(root_line[1], 0, "container root is guest root: {map}");
    assert!(
        map.lines()
            .all(|l| l.split_whitespace().nth(1) != Some("0")),
        "{map}"
    );
    let o = exec(&mut conn, 7, "ls /sys/class/net", &project);
    assert_eq!(text(&o.stdout), "lo\n", "network interfaces besides lo");

    // The host's file is visible; a write to the project lands on the host.
    let o = exec(
        &mut conn,
        3,
        "cat input.txt && echo from-the-container > out.txt",
        &project,
    );
    assert_eq!(
        o.end,
        Message::Exit(ExitStatus::Code(0)),
        "stderr: {}",
        text(&o.stderr)
    );
    assert_eq!(text(&o.stdout), "from the host\n");
    assert_eq!(
        std::fs::read(project.join("out.txt")).unwrap(),
        b"from-the-container\n"
    );
    assert_eq!(
        std::fs::metadata(project.join("out.txt")).unwrap().uid(),
        0,
        "translated back to the host user"
    );

    // Writes to the spill fail and the host file is unchanged.
    let script = format!(
        "echo evil > {s}/report.txt; a=$?; touch {s}/new; b=$?; echo $a $b; [ $a -ne 0 ] && [ $b -ne 0 ]",
        s = spill.display()
    );
    let o = exec(&mut conn, 4, &script, &project);
    assert_eq!(
        o.end,
        Message::Exit(ExitStatus::Code(0)),
        "a spill write succeeded: {} {}",
        text(&o.stdout),
        text(&o.stderr)
    );
    assert!(
        text(&o.stderr).contains("Read-only file system"),
        "{}",
        text(&o.stderr)
    );
    assert_eq!(
        std::fs::read(spill.join("report.txt")).unwrap(),
        b"original\n"
    );
    assert!(!spill.join("new").exists());
    let o = exec(
        &mut conn,
        5,
        &format!("cat {}/report.txt", spill.display()),
        &project,
    );
    assert_eq!(text(&o.stdout), "original\n");

    // Warm exec latency.
    let mut lat: Vec<f64> = (0..10)
        .map(|i| {
            let o = exec(&mut conn, 100 + i, "true", &project);
            assert_eq!(o.end, Message::Exit(ExitStatus::Code(0)));
            o.seconds
        })
        .collect();
    lat.sort_by(|a, b| a.partial_cmp(b).unwrap());

    conn.send(&Message::Shutdown, 0).unwrap();
    let t_down = Instant::now();
    let mut qemu = procs.0.pop().unwrap();
    let status = loop {
        if let Some(s) = qemu.try_wait().unwrap() {
            break s;
        }
        assert!(
            t_down.elapsed() < Duration::from_secs(120),
            "the guest did not power off after shutdown"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut console_text = String::new();
    std::fs::File::open(&console)
        .unwrap()
        .read_to_string(&mut console_text)
        .unwrap();
    let milestones: Vec<&str> = console_text
        .lines()
        .filter(|l| l.starts_with("hull-init:"))
        .collect();
    eprintln!(
        "figures (TCG, -smp {smp}, load {}):",
        std::fs::read_to_string("/proc/loadavg").unwrap().trim()
    );
    eprintln!("  boot to agent hello   {ready_s:7.2} s");
    eprintln!("  configure             {configure_s:7.2} s");
    eprintln!("  first exec (echo hi)  {:7.3} s", first_exec_s);
    eprintln!(
        "  warm exec p50 / max   {:7.3} s / {:.3} s",
        lat[lat.len() / 2],
        lat[lat.len() - 1]
    );
    eprintln!(
        "  qemu exit after shutdown {:.2} s ({status})",
        t_down.elapsed().as_secs_f64()
    );
    for m in milestones {
        eprintln!("  {m}");
    }
}

/// hull's agent starts in the container's root as its init. A userland
/// that plants a program interpreter (`/lib64/ld-linux-x86-64.so.2`, here
/// one that leaves a mark) and an `/etc/ld.so.preload` gets nothing of
/// them run by the agent: it is static, the kernel starts it as it is,
/// and it prints its help. The control: the glibc build of the same
/// agent, started the same way, runs the planted interpreter.
#[test]
#[ignore = "needs root: chroot into the planted userland"]
fn a_planted_loader_never_runs_for_the_agent() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("root");
    for dir in ["lib64", "etc", "tmp"] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/fake-loader.c");
    let cc = Command::new("cc")
        .args([
            "-nostdlib",
            "-static-pie",
            "-fPIE",
            "-O2",
            "-fno-stack-protector",
            "-o",
        ])
        .arg(root.join("lib64/ld-linux-x86-64.so.2"))
        .arg(&src)
        .output()
        .expect("cc (the tests need a C compiler: scripts/setup.sh)");
    assert!(cc.status.success(), "cc: {}", text(&cc.stderr));
    std::fs::write(root.join("etc/ld.so.preload"), "/usr/lib/planted.so\n").unwrap();
    let dynamic = Path::new(env!("CARGO_BIN_EXE_hull")).with_file_name("hull-agent");
    assert!(
        dynamic.is_file(),
        "{} is missing: cargo build --workspace builds it",
        dynamic.display()
    );
    let start = |agent: &Path| {
        std::fs::copy(agent, root.join("agent")).unwrap();
        let _ = std::fs::remove_file(root.join("loader-ran"));
        let o = Command::new("chroot")
            .arg(&root)
            .args(["/agent", "--help"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (o, root.join("loader-ran").exists())
    };
    let (o, ran) = start(&dynamic);
    assert!(
        ran && o.status.code() == Some(127),
        "the control: the glibc agent should run the planted interpreter ({:?})",
        o.status
    );
    let (o, ran) = start(&agent_path());
    assert!(!ran, "the agent ran the planted interpreter");
    assert!(
        o.status.success() && text(&o.stdout).contains("hull's guest agent"),
        "{:?}: {}",
        o.status,
        text(&o.stderr)
    );
}

/// A fifo named as `[vm] rootfs` is refused at once, naming it, by `hull
/// image build` and by `hull run` (both once waited for a writer forever,
/// and the run ignored SIGTERM while it waited); a link to a tarball is
/// refused too, and nothing reads through it.
#[test]
fn a_fifo_as_the_rootfs_is_refused_at_once() {
    let d = tempfile::tempdir().unwrap();
    let fifo = d.path().join("rootfs.tar");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let policy = d.path().join("p.toml");
    std::fs::write(
        &policy,
        format!("version = 1\n[vm]\nrootfs = {:?}\n", fifo.to_str().unwrap()),
    )
    .unwrap();
    let hull = |args: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_hull"));
        c.args(args)
            .env("HULL_IMAGE_CACHE", d.path().join("images"))
            .env("HULL_AGENT", agent_path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = c.spawn().unwrap();
        let pid = child.id();
        let t0 = Instant::now();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait_with_output());
        });
        let o = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| {
                // SAFETY: kill on the pid of a child not yet reaped.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                panic!("hull {args:?} still waits after 60 s")
            })
            .unwrap();
        (o, t0.elapsed().as_secs_f64())
    };
    let p = policy.to_str().unwrap();
    for args in [
        &["image", "build", "--no-snapshot", "--policy", p][..],
        &["run", "--tier", "vm", "--policy", p, "--", "true"][..],
    ] {
        let (o, secs) = hull(args);
        let err = text(&o.stderr);
        assert_ne!(o.status.code(), Some(0), "{args:?}: {err}");
        assert!(
            err.contains("not a regular file (a fifo)") && err.contains(fifo.to_str().unwrap()),
            "{args:?}: {err}"
        );
        assert!(secs < 30.0, "{args:?} took {secs:.0} s");
    }
}

/// A vm run that has not started (here: waiting for another build of its
/// userland's image) ends on SIGTERM at once, saying nothing ran; before,
/// it took the signal for its command, which had not started, and went on
/// waiting.
#[test]
fn a_run_waiting_for_its_image_ends_on_sigterm() {
    let d = tempfile::tempdir().unwrap();
    let cache = d.path().join("images");
    let policy = d.path().join("p.toml");
    std::fs::write(&policy, "version = 1\n[vm]\npackages = [\"hello\"]\n").unwrap();
    let hull = |args: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_hull"));
        c.args(args)
            .arg("--policy")
            .arg(&policy)
            .env("HULL_IMAGE_CACHE", &cache)
            .env("HULL_AGENT", agent_path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    };
    // The build holds the image's lock while it runs (minutes).
    let mut build = hull(&["image", "build", "--no-snapshot"]).spawn().unwrap();
    let t0 = Instant::now();
    while !std::fs::read_dir(&cache)
        .map(|rd| {
            rd.flatten()
                .any(|e| e.file_name().to_string_lossy().contains(".partial-"))
        })
        .unwrap_or(false)
    {
        assert!(t0.elapsed().as_secs() < 60, "the build did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
    let run = hull(&["run", "--tier", "vm"])
        .args(["--", "echo", "ran"])
        .spawn()
        .unwrap();
    let pid = run.id() as i32;
    // It reaches the lock (its image is being built), then the signal.
    std::thread::sleep(Duration::from_secs(3));
    let t1 = Instant::now();
    // SAFETY: kill on the pid of a child not yet reaped.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(run.wait_with_output());
    });
    let got = rx.recv_timeout(Duration::from_secs(30));
    let _ = build.kill();
    let _ = build.wait();
    let o = got
        .unwrap_or_else(|_| {
            // SAFETY: as above.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("the run still waits 30 s after SIGTERM")
        })
        .unwrap();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(128 + 15), "{err}");
    assert!(
        err.contains("SIGTERM before the run started") && err.contains("nothing ran"),
        "{err}"
    );
    assert!(!text(&o.stdout).contains("ran"), "{err}");
    assert!(t1.elapsed().as_secs() < 10, "{err}");
}

/// A `[vm] packages` entry the Debian mirror does not have fails the build
/// at its first step, naming the package, within seconds and before
/// anything is built: no image, and the build directory holds only the
/// recipe, the agent disk and the log. (Uses the mirror, as every build.)
#[test]
fn a_package_the_mirror_lacks_is_named_before_anything_is_built() {
    let d = tempfile::tempdir().unwrap();
    let cache = d.path().join("images");
    let policy = d.path().join("p.toml");
    std::fs::write(
        &policy,
        "version = 1\n[vm]\npackages = [\"python3-pip\", \"hull-no-such-package\"]\n",
    )
    .unwrap();
    let t0 = Instant::now();
    let o = Command::new(env!("CARGO_BIN_EXE_hull"))
        .args(["image", "build", "--no-snapshot", "--policy"])
        .arg(&policy)
        .arg("--agent")
        .arg(agent_path())
        .env("HULL_IMAGE_CACHE", &cache)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let secs = t0.elapsed().as_secs_f64();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(125), "{err}");
    assert!(
        err.contains("step 1/8") && err.contains("no such package in Debian bookworm"),
        "{err}"
    );
    assert!(
        err.contains(": hull-no-such-package\n"),
        "only the missing one is named: {err}"
    );
    assert!(secs < 120.0, "took {secs:.0} s: {err}");
    // Nothing was built, and nothing of the failed build is left but its
    // log (a partial of about a GiB was left by every failed build).
    let mut names = Vec::new();
    for e in std::fs::read_dir(&cache).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        assert!(
            !hull::vm::image::cache::is_id(&name),
            "an image {name} was made"
        );
        assert!(!name.contains(".partial-"), "the partial {name} is left");
        names.push(name);
    }
    let log = names
        .iter()
        .find(|n| n.ends_with(".failed.log"))
        .unwrap_or_else(|| panic!("no failed build's log in {names:?}"));
    assert!(err.contains(&*cache.join(log).to_string_lossy()), "{err}");
    let kept = std::fs::read_to_string(cache.join(log)).unwrap();
    assert!(kept.contains("hull-no-such-package"), "{kept}");
}

/// A `[vm] packages` name apt would read as a pattern (`texlive.+`: no
/// package has that name, so apt took it as a regular expression and
/// selected 470 packages, 3.9 GB, and the build went on) is refused at the
/// build's first step, naming it, before anything is built or downloaded.
#[test]
fn a_package_name_apt_reads_as_a_pattern_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let cache = d.path().join("images");
    let policy = d.path().join("p.toml");
    std::fs::write(
        &policy,
        "version = 1\n[vm]\npackages = [\"python3-pip\", \"texlive.+\"]\n",
    )
    .unwrap();
    let t0 = Instant::now();
    let o = Command::new(env!("CARGO_BIN_EXE_hull"))
        .args(["image", "build", "--no-snapshot", "--policy"])
        .arg(&policy)
        .arg("--agent")
        .arg(agent_path())
        .env("HULL_IMAGE_CACHE", &cache)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let secs = t0.elapsed().as_secs_f64();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(125), "{err}");
    assert!(
        err.contains("step 1/8")
            && err.contains("by that exact name")
            && err.contains(" texlive.+\n"),
        "{err}"
    );
    assert!(
        !err.contains("python3-pip\n"),
        "only the pattern is named: {err}"
    );
    assert!(secs < 300.0, "took {secs:.0} s: {err}");
    for e in std::fs::read_dir(&cache).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        assert!(
            !hull::vm::image::cache::is_id(&name),
            "an image {name} was made"
        );
        assert!(!name.contains(".partial-"), "the partial {name} is left");
    }
}

/// A userland whose packages take more than `HULL_USERLAND_MAX` (to
/// download or installed, read from the mirror's index at the build's
/// first step) is refused there, naming the sizes and the setting, before
/// anything is downloaded; under the cap the same step passes.
#[test]
fn a_userland_over_its_size_cap_is_refused_at_the_first_step() {
    let d = tempfile::tempdir().unwrap();
    let cache = d.path().join("images");
    let policy = d.path().join("p.toml");
    std::fs::write(&policy, "version = 1\n[vm]\npackages = [\"hello\"]\n").unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_hull"))
        .args(["image", "build", "--no-snapshot", "--policy"])
        .arg(&policy)
        .arg("--agent")
        .arg(agent_path())
        .env("HULL_IMAGE_CACHE", &cache)
        .env("HULL_USERLAND_MAX", "64MiB")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(125), "{err}");
    assert!(
        err.contains("step 1/8")
            && err.contains("MiB to download and")
            && err.contains("more than HULL_USERLAND_MAX (64 MiB)"),
        "{err}"
    );
    for e in std::fs::read_dir(&cache).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        assert!(!name.contains(".partial-"), "the partial {name} is left");
    }
}

/// The images of one recipe share the guest's own system (rootfs, kernel,
/// initrd): the first build keeps it under the cache's `bases/`, and a
/// build of another userland copies it instead of making it again. Read
/// from the images `scripts/test.sh` built (the default first, then the
/// tests' userland and the rootfs tarball's): they name one base, at least
/// one says it reused it, and their initrd (a cpio with the build's times
/// in it) is the very same file, byte for byte.
#[test]
fn the_images_of_one_recipe_share_the_guests_own_system() {
    let cache = Cache::default_location().unwrap();
    let base =
        image::find(&cache, &image::recipe::Recipe::base()).unwrap_or_else(|e| panic!("{e}"));
    let key = base
        .manifest
        .info
        .get("guest_base")
        .unwrap_or_else(|| panic!("{}: no guest_base in the manifest", base.dir.display()))
        .clone();
    let initrd = |img: &image::BuiltImage| img.manifest.files.get(&img.manifest.initrd).cloned();
    let mut sharing = Vec::new();
    for e in cache.entries().unwrap() {
        if let image::cache::Entry::Built(img) = e {
            if img.manifest.info.get("guest_base") == Some(&key) {
                sharing.push(img);
            }
        }
    }
    let ids: Vec<String> = sharing
        .iter()
        .map(|i| {
            format!(
                "{} (reused: {:?})",
                i.id,
                i.manifest.info.get("guest_base_reused")
            )
        })
        .collect();
    assert!(
        sharing.len() >= 2,
        "only {ids:?} of the cache {} have the guest base {key}: build the tests' userland (scripts/test.sh)",
        cache.root().display()
    );
    assert!(
        sharing
            .iter()
            .any(|i| i.manifest.info.get("guest_base_reused").map(String::as_str) == Some("1")),
        "no image reused the guest base {key}: {ids:?}"
    );
    for img in &sharing {
        assert_eq!(
            initrd(img),
            initrd(&base),
            "{} and {} have the guest base {key} but not the same initrd",
            img.id,
            base.id
        );
    }
    assert!(
        cache
            .root()
            .join("bases")
            .join(&key)
            .join("complete")
            .is_file(),
        "the base {key} is not kept under {}",
        cache.root().join("bases").display()
    );
}
