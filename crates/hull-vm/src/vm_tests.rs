//! End-to-end tests of the host side with real QEMU (TCG here) and real
//! virtiofsd, booting the guest kernel with a busybox initramfs whose init
//! runs a shell script: what the guest could do to shared files, checked on
//! the host afterwards. Built with the `tier3` feature only (the machine
//! declares it has QEMU, virtiofsd and a guest kernel).

use std::fs;
use std::path::Path;
use std::time::Duration;

use super::machine::{BootImage, Machine, MachineSpec};
use super::qemu::Accel;
use super::testkit;
use super::virtiofsd::{HostMask, MaskKind, SandboxMode, VirtiofsdSpec};

fn share(
    dir: &Path,
    tag: &str,
    shared: &Path,
    readonly: bool,
    masks: Vec<HostMask>,
) -> VirtiofsdSpec {
    VirtiofsdSpec {
        tag: tag.into(),
        shared_dir: shared.to_path_buf(),
        socket: MachineSpec::share_socket(dir, tag),
        readonly,
        sandbox: SandboxMode::Namespace,
        translate: Some((super::GUEST_UID, super::GUEST_GID)),
        masks,
        views: Vec::new(),
        overlay: None,
    }
}

fn spec(dir: &Path, initrd: &Path, shares: Vec<VirtiofsdSpec>) -> MachineSpec {
    MachineSpec {
        name: "hull-test".into(),
        dir: dir.to_path_buf(),
        log_dir: dir.to_path_buf(),
        image: BootImage {
            kernel: testkit::kernel(),
            initrd: Some(initrd.to_path_buf()),
            disks: vec![],
            cmdline: "quiet".into(),
        },
        // The accelerator the probe picks (TCG on this machine).
        accel: super::accel::probe_accel().accel,
        memory_mib: 256,
        cpus: 1,
        shares,
        incoming: None,
        run_as: None,
    }
}

/// A project with git metadata, a spill dir, and a guest script that tries
/// every write it can; afterwards the host checks what actually landed.
#[test]
fn guest_writes_land_where_allowed_and_nowhere_else() {
    let tools = testkit::tools();
    let t = tempfile::tempdir().unwrap();
    let run = t.path().join("run");
    let proj = t.path().join("proj");
    let spill = t.path().join("spill");
    fs::create_dir_all(&run).unwrap();
    fs::create_dir_all(proj.join("src")).unwrap();
    fs::create_dir_all(proj.join(".git/hooks")).unwrap();
    fs::create_dir_all(proj.join("secret")).unwrap();
    fs::create_dir_all(&spill).unwrap();
    fs::write(proj.join("src/main.c"), b"int main(){}\n").unwrap();
    fs::write(proj.join(".git/config"), b"[core]\n").unwrap();
    fs::write(proj.join("secret/key"), b"TOPSECRET\n").unwrap();
    fs::write(spill.join("out.txt"), b"spilled\n").unwrap();

    let masks = vec![
        HostMask {
            path: proj.join(".git"),
            kind: MaskKind::ReadOnly,
            placeholder_is_file: false,
        },
        HostMask {
            path: proj.join(".hull"),
            kind: MaskKind::Hidden,
            placeholder_is_file: false,
        },
        HostMask {
            path: proj.join("secret"),
            kind: MaskKind::Hidden,
            placeholder_is_file: false,
        },
    ];
    let shares = vec![
        share(&run, "project", &proj, false, masks),
        share(&run, "spill", &spill, true, vec![]),
    ];
    let script = r#"
mkdir -p /mnt/p /mnt/s
mount -t virtiofs project /mnt/p && echo MOUNT-P-OK
mount -t virtiofs spill /mnt/s && echo MOUNT-S-OK
echo hello > /mnt/p/src/new.txt && echo NEW-OK
cat /mnt/s/out.txt
echo "R:$(stat -c %u:%g /mnt/p/src/main.c)"
echo evil >> /mnt/p/.git/config && echo GITCFG-WRITTEN
touch /mnt/p/.git/hooks/pre-commit && echo HOOK-WRITTEN
rm -rf /mnt/p/.git && echo GIT-REMOVED
mv /mnt/p/.git /mnt/p/git2 && echo GIT-MOVED
mkdir /mnt/p/.hull/x && echo HULL-WRITTEN
rmdir /mnt/p/.hull && echo HULL-REMOVED
cat /mnt/p/secret/key && echo SECRET-READ
echo "S:$(ls -A /mnt/p/secret | wc -l)"
echo x > /mnt/s/new && echo SPILL-WRITTEN
mount -o remount,rw /mnt/s && echo REMOUNTED
echo x > /mnt/s/new2 && echo SPILL-WRITTEN-AFTER-REMOUNT
umount /mnt/p/.git && echo GIT-UNMOUNTED
echo evil >> /mnt/p/.git/config && echo GITCFG-WRITTEN-AFTER-UMOUNT
mknod /mnt/p/src/disk b 8 0 && echo BLOCK-DEVICE-MADE
mknod /mnt/p/src/mem c 1 1 && echo CHAR-DEVICE-MADE
mknod /mnt/p/src/pipe p && echo FIFO-MADE
"#;
    let initrd = testkit::busybox_initramfs(t.path(), script, vec![]);
    let spec = spec(&run, &initrd, shares);
    let mut m = Machine::start(&spec, &tools).unwrap_or_else(|e| panic!("{e}"));
    // The placeholder for the missing .hull exists while the share is up.
    assert!(proj.join(".hull").is_dir());
    let status = m.qmp().unwrap().query_status().unwrap();
    assert!(status.running, "{status:?}");
    let exited = m.wait_exit(Duration::from_secs(120));
    let out = testkit::script_output(m.console_log());
    assert!(
        exited.is_some(),
        "guest did not power off; script output:\n{out}"
    );
    drop(m);

    for want in [
        "MOUNT-P-OK",
        "MOUNT-S-OK",
        "NEW-OK",
        "spilled",
        "R:1000:1000",
        "S:0",
        // No device node, but a fifo: no CAP_MKNOD needed for that.
        "FIFO-MADE",
    ] {
        assert!(
            out.contains(want),
            "missing {want:?} in guest output:\n{out}"
        );
    }
    for bad in [
        "GITCFG-WRITTEN",
        "HOOK-WRITTEN",
        "GIT-REMOVED",
        "GIT-MOVED",
        "HULL-WRITTEN",
        "HULL-REMOVED",
        "SECRET-READ",
        "TOPSECRET",
        "SPILL-WRITTEN",
        "BLOCK-DEVICE-MADE",
        "CHAR-DEVICE-MADE",
    ] {
        assert!(!out.contains(bad), "guest managed {bad:?}:\n{out}");
    }
    // The host side: allowed writes landed, nothing else changed.
    assert_eq!(fs::read(proj.join("src/new.txt")).unwrap(), b"hello\n");
    // No device node from the guest (virtiofsd runs without CAP_MKNOD),
    // where the host's own mknod makes one (the filesystem would hold it).
    assert!(!proj.join("src/disk").exists() && !proj.join("src/mem").exists());
    let control = std::process::Command::new("mknod")
        .arg(proj.join("src/control"))
        .args(["c", "1", "3"])
        .status()
        .unwrap();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        assert!(control.success(), "the control mknod failed as root");
        fs::remove_file(proj.join("src/control")).unwrap();
    }
    assert_eq!(fs::read(proj.join(".git/config")).unwrap(), b"[core]\n");
    assert!(!proj.join(".git/hooks/pre-commit").exists());
    assert!(!proj.join("git2").exists());
    assert_eq!(fs::read(proj.join("secret/key")).unwrap(), b"TOPSECRET\n");
    assert!(!spill.join("new").exists() && !spill.join("new2").exists());
    let mut spill_files: Vec<_> = fs::read_dir(&spill)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    spill_files.sort();
    assert_eq!(spill_files, ["out.txt"]);
    // The placeholder went with the machine: nothing got into it, and
    // nothing of hull's is left in the project.
    assert!(
        !proj.join(".hull").exists(),
        "the placeholder .hull is left behind (or the guest wrote into it)"
    );
}

/// QEMU and every virtiofsd are gone when the machine is dropped, and a
/// clean QMP shutdown works; pid files are removed.
#[test]
fn helpers_end_with_the_machine() {
    let tools = testkit::tools();
    let t = tempfile::tempdir().unwrap();
    let run = t.path().join("run");
    let proj = t.path().join("proj");
    fs::create_dir_all(&run).unwrap();
    fs::create_dir_all(&proj).unwrap();
    let initrd = testkit::busybox_initramfs(t.path(), "sleep 600", vec![]);
    let spec = spec(
        &run,
        &initrd,
        vec![share(&run, "project", &proj, false, vec![])],
    );

    let m = Machine::start(&spec, &tools).unwrap_or_else(|e| panic!("{e}"));
    let mut pids = vec![m.qemu_pid()];
    pids.extend(m.virtiofsd_pids().into_iter().map(|(_, p)| p));
    assert!(run.join("qemu.pid").exists() && run.join("vfs-project.pid").exists());
    drop(m);
    for p in &pids {
        assert!(
            !Path::new(&format!("/proc/{p}")).exists(),
            "pid {p} survived the drop"
        );
    }
    assert!(!run.join("qemu.pid").exists());

    let m = Machine::start(&spec, &tools).unwrap_or_else(|e| panic!("{e}"));
    let qemu = m.qemu_pid();
    m.shutdown(None, Duration::from_secs(10));
    assert!(!Path::new(&format!("/proc/{qemu}")).exists());
}

/// A guest that never starts an agent: the wait for its hello ends with an
/// error naming the step and the console log, and the VM is torn down.
#[test]
fn a_guest_without_agent_is_an_error_naming_the_console_log() {
    let tools = testkit::tools();
    let t = tempfile::tempdir().unwrap();
    let run = t.path().join("run");
    fs::create_dir_all(&run).unwrap();
    // The guest powers off right after boot: QEMU exits, no hello ever comes.
    let initrd = testkit::busybox_initramfs(t.path(), "echo no agent here", vec![]);
    let spec = spec(&run, &initrd, vec![]);
    let mut m = Machine::start(&spec, &tools).unwrap_or_else(|e| panic!("{e}"));
    let e = m
        .connect_agent(Duration::from_secs(120))
        .unwrap_err()
        .to_string();
    assert!(e.contains("waiting for the guest agent"), "{e}");
    assert!(
        e.contains(&run.join("console.log").display().to_string()),
        "{e}"
    );
    assert!(e.contains("QEMU exited") || e.contains("VM stopped"), "{e}");
}

/// Missing inputs fail before anything starts, naming the file.
#[test]
fn missing_kernel_is_named() {
    let t = tempfile::tempdir().unwrap();
    let mut s = MachineSpec {
        name: "x".into(),
        dir: t.path().to_path_buf(),
        log_dir: t.path().to_path_buf(),
        image: BootImage {
            kernel: t.path().join("nope/vmlinux"),
            initrd: None,
            disks: vec![],
            cmdline: String::new(),
        },
        accel: Accel::Tcg,
        memory_mib: 256,
        cpus: 1,
        shares: vec![],
        incoming: None,
        run_as: None,
    };
    let tools = super::machine::Tools {
        qemu: "/usr/bin/qemu-system-x86_64".into(),
        qemu_version: String::new(),
        sandbox: false,
        virtiofsd: None,
    };
    let e = Machine::start(&s, &tools).unwrap_err().to_string();
    assert!(e.contains("nope/vmlinux"), "{e}");
    s.image.kernel = "/bin/sh".into();
    s.dir = Path::new("/tmp").join("x".repeat(120));
    s.log_dir = t.path().to_path_buf();
    let e = Machine::start(&s, &tools).unwrap_err().to_string();
    assert!(e.contains("longer than"), "{e}");
    let guest = super::image::GuestImage {
        dir: t.path().to_path_buf(),
        agent: super::image::agent_disk::AgentDisk {
            path: t.path().join("agent-0123456789abcdef.ext4"),
            sha256: "0123456789abcdef".repeat(4),
            stamp: String::new(),
        },
    };
    let e = BootImage::from_image(&guest).unwrap_err().to_string();
    assert!(e.contains("vmlinux missing"), "{e}");
    for f in ["vmlinux", "initrd.cpio", "disk.raw"] {
        fs::write(t.path().join(f), b"x").unwrap();
    }
    let e = BootImage::from_image(&guest).unwrap_err().to_string();
    assert!(e.contains("agent-0123456789abcdef.ext4 missing"), "{e}");
}

/// The host-side agent session against the real `hull-agent serve` in a
/// busybox guest over the real virtio-serial port: output, exit codes,
/// stdin beyond the flow-control window, writes to the share, wall-time
/// kill, signals, interruption, and the session serving on afterwards.
#[test]
fn agent_session_over_virtio_serial() {
    use super::agent::ExecOptions;
    use crate::exec::{CommandSpec, ExitStatus, OutputSink};
    use std::sync::atomic::{AtomicI32, Ordering};
    use std::sync::Arc;

    let tools = testkit::tools();
    let t = tempfile::tempdir().unwrap();
    let run = t.path().join("run");
    let proj = t.path().join("proj");
    fs::create_dir_all(&run).unwrap();
    fs::create_dir_all(&proj).unwrap();
    let script =
        "mkdir -p /mnt/p\nmount -t virtiofs project /mnt/p\n/opt/hull-agent serve --port agent.0";
    let initrd = testkit::busybox_initramfs(t.path(), script, testkit::agent_files());
    let mut spec = spec(
        &run,
        &initrd,
        vec![share(&run, "project", &proj, false, vec![])],
    );
    spec.memory_mib = 512;
    let mut m = Machine::start(&spec, &tools).unwrap_or_else(|e| panic!("{e}"));
    let mut a = m
        .connect_agent(Duration::from_secs(180))
        .unwrap_or_else(|e| panic!("{e}"));

    #[derive(Default)]
    struct Out {
        out: Vec<u8>,
        err: Vec<u8>,
    }
    impl OutputSink for Out {
        fn stdout(&mut self, d: &[u8]) -> std::io::Result<()> {
            self.out.extend_from_slice(d);
            Ok(())
        }
        fn stderr(&mut self, d: &[u8]) -> std::io::Result<()> {
            self.err.extend_from_slice(d);
            Ok(())
        }
    }
    let sh = |script: &str, timeout: Option<Duration>| CommandSpec {
        argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
        cwd: "/mnt/p".into(),
        env: vec![("PATH".into(), "/bin".into())],
        timeout,
        user: None,
    };

    let mut o = Out::default();
    let st = a
        .exec(
            &sh("echo out; echo err >&2; pwd; exit 3", None),
            &mut o,
            ExecOptions::default(),
        )
        .unwrap();
    assert_eq!(st, ExitStatus::Code(3));
    assert_eq!(o.out, b"out\n/mnt/p\n");
    assert_eq!(o.err, b"err\n");

    // 5 MiB through stdin: more than the 4 MiB window, so acks must flow.
    let input: Vec<u8> = (0..5 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let mut o = Out::default();
    let st = a
        .exec(
            &sh("cat", None),
            &mut o,
            ExecOptions {
                stdin: Some(Box::new(std::io::Cursor::new(input.clone()))),
                ..ExecOptions::default()
            },
        )
        .unwrap();
    assert_eq!(st, ExitStatus::Code(0));
    assert!(
        o.out == input,
        "stdin came back with {} of {} bytes",
        o.out.len(),
        input.len()
    );

    let mut o = Out::default();
    let st = a
        .exec(
            &sh("echo from-guest > /mnt/p/made-here", None),
            &mut o,
            ExecOptions::default(),
        )
        .unwrap();
    assert_eq!(st, ExitStatus::Code(0));
    assert_eq!(fs::read(proj.join("made-here")).unwrap(), b"from-guest\n");

    let mut o = Out::default();
    let st = a
        .exec(
            &sh("sleep 600", Some(Duration::from_secs(2))),
            &mut o,
            ExecOptions::default(),
        )
        .unwrap();
    assert_eq!(st, ExitStatus::TimedOut);

    let mut o = Out::default();
    let st = a
        .exec(&sh("kill -9 $$", None), &mut o, ExecOptions::default())
        .unwrap();
    assert_eq!(st, ExitStatus::Signal(9));

    let irq = Arc::new(AtomicI32::new(0));
    let flag = irq.clone();
    let setter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(2));
        flag.store(2, Ordering::SeqCst);
    });
    let mut o = Out::default();
    let st = a
        .exec(
            &sh("echo started; sleep 600", None),
            &mut o,
            ExecOptions {
                interrupt: Some(irq),
                ..ExecOptions::default()
            },
        )
        .unwrap();
    setter.join().unwrap();
    assert_eq!(st, ExitStatus::Interrupted(2));
    assert_eq!(o.out, b"started\n");

    // Still serving.
    a.ping(Duration::from_secs(10)).unwrap();
    let mut o = Out::default();
    let st = a
        .exec(&sh("echo again", None), &mut o, ExecOptions::default())
        .unwrap();
    assert_eq!(
        (st, o.out.as_slice()),
        (ExitStatus::Code(0), &b"again\n"[..])
    );

    let qemu = m.qemu_pid();
    m.shutdown(Some(&mut a), Duration::from_secs(10));
    assert!(!Path::new(&format!("/proc/{qemu}")).exists());
}

/// QMP snapshot and restore for real (the basis of prepared snapshots):
/// stop, migrate to a file with mapped-ram, quit; a new QEMU started with
/// `-incoming defer` and a fresh virtiofsd loads it and continues the guest
/// where it stopped, without booting again.
#[test]
fn snapshot_to_file_and_restore_continues_the_guest() {
    use super::qemu::Incoming;
    let tools = testkit::tools();
    let t = tempfile::tempdir().unwrap();
    let run = t.path().join("run");
    let proj = t.path().join("proj");
    fs::create_dir_all(&run).unwrap();
    fs::create_dir_all(&proj).unwrap();
    let initrd = testkit::busybox_initramfs(
        t.path(),
        "i=0; while true; do echo TICK-$i; i=$((i+1)); sleep 1; done",
        vec![],
    );
    let mut spec = spec(
        &run,
        &initrd,
        vec![share(&run, "project", &proj, false, vec![])],
    );
    let mut m = Machine::start(&spec, &tools).unwrap_or_else(|e| panic!("{e}"));
    let console = m.console_log().to_path_buf();
    let end = std::time::Instant::now() + Duration::from_secs(120);
    while !fs::read_to_string(&console)
        .unwrap_or_default()
        .contains("TICK-2")
    {
        assert!(std::time::Instant::now() < end, "guest never ticked");
        std::thread::sleep(Duration::from_millis(200));
    }
    let state = t.path().join("state.bin");
    let uri = format!("file:{}", state.display());
    {
        let q = m.qmp().unwrap();
        q.stop().unwrap();
        assert_eq!(q.query_status().unwrap().status, "paused");
        q.migrate_set_capabilities(&[("mapped-ram", true)]).unwrap();
        q.migrate(&uri).unwrap();
        q.wait_migration(Duration::from_secs(120)).unwrap();
    }
    let last_before = fs::read_to_string(&console)
        .unwrap()
        .lines()
        .filter_map(|l| {
            l.trim()
                .strip_prefix("TICK-")
                .and_then(|n| n.parse::<u32>().ok())
        })
        .max()
        .unwrap();
    m.shutdown(None, Duration::from_secs(10));
    assert!(state.metadata().unwrap().len() > 0);

    spec.incoming = Some(Incoming::Defer);
    let mut r = Machine::start(&spec, &tools).unwrap_or_else(|e| panic!("{e}"));
    {
        let q = r.qmp().unwrap();
        assert_eq!(q.query_status().unwrap().status, "inmigrate");
        q.migrate_set_capabilities(&[("mapped-ram", true)]).unwrap();
        q.migrate_incoming(&uri).unwrap();
        q.wait_migration(Duration::from_secs(120)).unwrap();
        q.cont().unwrap();
        assert!(q.query_status().unwrap().running);
    }
    let end = std::time::Instant::now() + Duration::from_secs(60);
    let ticks = loop {
        let log = fs::read_to_string(r.console_log()).unwrap_or_default();
        let ticks: Vec<u32> = log
            .lines()
            .filter_map(|l| l.trim().strip_prefix("TICK-").and_then(|n| n.parse().ok()))
            .collect();
        if ticks.len() >= 2 {
            assert!(
                !log.contains(testkit::BOOTED),
                "the restored guest booted again:\n{log}"
            );
            break ticks;
        }
        assert!(
            std::time::Instant::now() < end,
            "restored guest is silent:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        ticks[0] > last_before,
        "ticks restarted: {ticks:?} after {last_before}"
    );
    r.shutdown(None, Duration::from_secs(10));
}
