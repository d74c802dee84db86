//! Tier 3 under faults: each helper of a run (QEMU, a virtiofsd) killed or
//! stopped in the middle of a command that reads, writes and prints; a
//! guest whose vCPUs stop; a Ctrl-C while the guest answers nothing; hull
//! itself killed; and a `hull vm up` VM whose QEMU stalls. Each asserts the
//! exit code, the message naming the fault, the time to exit, and that
//! nothing of the run is left (process, socket, mount). Built with the
//! `tier3` feature only, like `tier3_vm.rs`.
#![cfg(all(target_os = "linux", feature = "tier3"))]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;

/// Reads the project, writes into it and prints, five times a second,
/// until something ends it.
const BUSY: &str = "echo started; i=0; while :; do i=$((i+1)); cat input.txt >/dev/null; \
                    echo $i > count.txt; echo line $i; sleep 0.2; done";

/// A run of [`BUSY`] (or `script`) whose first line was printed.
struct Busy {
    child: Child,
    /// The lines it printed after `started`, read on a thread so the pipe
    /// never fills.
    lines: mpsc::Receiver<String>,
}

impl Busy {
    fn start(w: &World, extra: &[&str], script: &str) -> Busy {
        let mut args = vec!["run", "--tier3", "--timeout", RUN_TIMEOUT];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "sh", "-c", script]);
        let mut child = w
            .cmd(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut first = String::new();
        out.read_line(&mut first).unwrap();
        if first != "started\n" {
            let _ = child.kill();
            let mut err = String::new();
            let _ = child.stderr.take().unwrap().read_to_string(&mut err);
            panic!("the command did not start: {first:?}\n{err}");
        }
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in out.lines() {
                let Ok(l) = l else { return };
                if tx.send(l).is_err() {
                    return;
                }
            }
        });
        Busy { child, lines }
    }

    /// Waits until the command has printed `n` more lines (it runs).
    fn wait_lines(&self, n: usize) {
        for _ in 0..n {
            self.lines
                .recv_timeout(Duration::from_secs(20))
                .expect("the command prints");
        }
    }

    /// The exit status, how long after `since` it came, and stderr; fails
    /// the test when hull still runs after `limit`.
    fn end(mut self, since: Instant, limit: Duration) -> (ExitStatus, Duration, String) {
        let status = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st;
            }
            if since.elapsed() > limit {
                let _ = self.child.kill();
                let mut err = String::new();
                let _ = self.child.stderr.take().unwrap().read_to_string(&mut err);
                panic!("hull still runs {limit:?} after the fault\n{err}");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let took = since.elapsed();
        let mut err = String::new();
        self.child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        (status, took, err)
    }
}

fn signal(pid: u64, sig: i32) {
    // SAFETY: kill(2) on a pid just read from /proc.
    let r = unsafe { libc::kill(pid as i32, sig) };
    assert_eq!(r, 0, "kill {pid} {sig}");
}

fn ppid(pid: u64) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    after
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0)
}

/// The run's QEMU.
fn qemu(w: &World) -> u64 {
    let q = run_helpers(w, "qemu-system");
    assert_eq!(q.len(), 1, "the run's QEMU: {q:?}");
    q[0]
}

/// The process serving the project's share: with its namespace sandbox
/// virtiofsd runs as two processes, the one hull started and the worker it
/// forks, which serves the share.
fn project_file_server(w: &World) -> u64 {
    let project = w.project.to_string_lossy().into_owned();
    let vfs = run_helpers(w, &format!("--shared-dir={project}\0"));
    vfs.iter()
        .copied()
        .find(|p| vfs.contains(&ppid(*p)))
        .or_else(|| (vfs.len() == 1).then(|| vfs[0]))
        .unwrap_or_else(|| panic!("the project's virtiofsd: {vfs:?}"))
}

/// Nothing of `w`'s runs is left: no QEMU or virtiofsd (a stopped one
/// counts), no socket under its dirs, no mount of them.
fn assert_nothing_left(w: &World) {
    let end = Instant::now() + Duration::from_secs(5);
    // A stopped helper counts: `running` only leaves out zombies.
    let left = || run_helpers(w, "");
    while !left().is_empty() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(left().is_empty(), "left running: {:?}", left());
    let mut socks = Vec::new();
    find_sockets(w.root.path(), &mut socks);
    assert!(socks.is_empty(), "sockets left: {socks:?}");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let root = w.root.path().to_string_lossy().into_owned();
    assert!(!mounts.contains(&root), "mounts left:\n{mounts}");
}

fn find_sockets(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    use std::os::unix::fs::FileTypeExt;
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let Ok(t) = e.file_type() else { continue };
        if t.is_dir() {
            find_sockets(&e.path(), out);
        } else if t.is_socket() {
            out.push(e.path());
        }
    }
}

/// The tier-3 fault message for `helper`, with its log and the console log.
fn assert_names_the_fault(err: &str, helper: &str, fault: &str) {
    assert!(err.contains(&format!("tier vm: {helper}")), "{err}");
    assert!(err.contains(fault), "{err}");
    assert!(err.contains("the VM was killed"), "{err}");
    assert!(err.contains("its log: "), "{err}");
    assert!(err.contains("console log: "), "{err}");
}

/// The project's virtiofsd killed mid-command: the guest's I/O on the
/// project would wait forever, so hull ends the run at once, names the dead
/// helper, and leaves nothing behind (before, the run hung until its
/// wall-time limit).
#[test]
fn a_dead_file_server_ends_the_run_at_once() {
    let w = world();
    let run = Busy::start(&w, &[], BUSY);
    run.wait_lines(3);
    let project = w.project.to_string_lossy().into_owned();
    signal(project_file_server(&w), libc::SIGKILL);
    let (st, took, err) = run.end(Instant::now(), Duration::from_secs(30));
    assert_eq!(st.code(), Some(125), "{err}");
    assert_names_the_fault(
        &err,
        &format!("the virtiofsd of {project} (share "),
        "exited (",
    );
    assert!(took < Duration::from_secs(2), "took {took:?}: {err}");
    assert_nothing_left(&w);
}

/// QEMU killed mid-command: the run ends at once naming QEMU.
#[test]
fn a_dead_qemu_ends_the_run_at_once() {
    let w = world();
    let run = Busy::start(&w, &[], BUSY);
    run.wait_lines(3);
    signal(qemu(&w), libc::SIGKILL);
    let (st, took, err) = run.end(Instant::now(), Duration::from_secs(30));
    assert_eq!(st.code(), Some(125), "{err}");
    assert!(err.contains("tier vm: "), "{err}");
    assert!(err.contains("console log: "), "{err}");
    assert!(took < Duration::from_secs(2), "took {took:?}: {err}");
    assert_nothing_left(&w);
}

/// QEMU stopped (SIGSTOP) mid-command: alive but running nothing. hull sees
/// it stopped, ends the run within the stall limit (3 s) and a little, and
/// kills it (a stopped process dies of SIGKILL).
#[test]
fn a_stopped_qemu_ends_the_run_within_seconds() {
    let w = world();
    let run = Busy::start(&w, &[], BUSY);
    run.wait_lines(3);
    signal(qemu(&w), libc::SIGSTOP);
    let (st, took, err) = run.end(Instant::now(), Duration::from_secs(30));
    assert_eq!(st.code(), Some(125), "{err}");
    assert_names_the_fault(&err, "QEMU", "has been stopped by a signal");
    assert!(took < Duration::from_secs(5), "took {took:?}: {err}");
    assert_nothing_left(&w);
}

/// The project's file server stopped mid-command: the command's next read
/// of the project waits, the agent still answers pings; hull sees the
/// stopped worker, ends the run and kills it too (it would ignore the
/// SIGTERM its parent's death sends it).
#[test]
fn a_stopped_file_server_ends_the_run_within_seconds() {
    let w = world();
    let run = Busy::start(&w, &[], BUSY);
    run.wait_lines(3);
    let project = w.project.to_string_lossy().into_owned();
    signal(project_file_server(&w), libc::SIGSTOP);
    let (st, took, err) = run.end(Instant::now(), Duration::from_secs(30));
    assert_eq!(st.code(), Some(125), "{err}");
    assert_names_the_fault(
        &err,
        &format!("the virtiofsd of {project} (share "),
        "has been stopped by a signal",
    );
    assert!(took < Duration::from_secs(5), "took {took:?}: {err}");
    assert_nothing_left(&w);
}

/// Stops every vCPU thread of a QEMU (ptrace interrupt; its main thread
/// runs on, so the process is not in state T): the guest answers nothing,
/// as a hung guest kernel would. The tracer thread reaps the threads once
/// QEMU is killed, and lets them go when dropped.
struct FrozenVcpus {
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FrozenVcpus {
    fn freeze(qemu: u64) -> FrozenVcpus {
        use std::sync::atomic::{AtomicBool, Ordering};
        let vcpus: Vec<i32> = std::fs::read_dir(format!("/proc/{qemu}/task"))
            .unwrap()
            .flatten()
            .filter_map(|t| {
                let comm = std::fs::read_to_string(t.path().join("comm")).ok()?;
                comm.starts_with("CPU ")
                    .then(|| t.file_name().to_str()?.parse().ok())?
            })
            .collect();
        assert!(
            !vcpus.is_empty(),
            "no vCPU threads (CPU n/...) in QEMU {qemu}"
        );
        let done = std::sync::Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let d = done.clone();
        let thread = std::thread::spawn(move || {
            // All ptrace calls from this thread: it is the tracer.
            for &t in &vcpus {
                // SAFETY: ptrace(2) requests on thread ids of a process the
                // test started (through hull); no pointers are passed.
                let r = unsafe {
                    libc::ptrace(libc::PTRACE_SEIZE, t, 0usize, 0usize) == 0
                        && libc::ptrace(libc::PTRACE_INTERRUPT, t, 0usize, 0usize) == 0
                };
                assert!(r, "ptrace {t}: {}", std::io::Error::last_os_error());
            }
            tx.send(()).unwrap();
            let mut left = vcpus;
            while !left.is_empty() && !d.load(Ordering::SeqCst) {
                left.retain(|&t| {
                    let mut st = 0;
                    // SAFETY: waitpid on a tracee of this thread; `st` is valid.
                    let r = unsafe { libc::waitpid(t, &mut st, libc::WNOHANG | libc::__WALL) };
                    !(r == t && (libc::WIFEXITED(st) || libc::WIFSIGNALED(st))) && r >= 0
                });
                std::thread::sleep(Duration::from_millis(20));
            }
            for t in left {
                // SAFETY: as above.
                unsafe { libc::ptrace(libc::PTRACE_DETACH, t, 0usize, 0usize) };
            }
        });
        rx.recv_timeout(Duration::from_secs(10))
            .expect("vCPUs stopped");
        FrozenVcpus {
            done,
            thread: Some(thread),
        }
    }
}

impl Drop for FrozenVcpus {
    fn drop(&mut self) {
        self.done.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A guest whose vCPUs stop answers nothing, not even a ping, while QEMU
/// itself looks alive: the heartbeat ends the run within its limit (8 s)
/// and a little, and the VM is killed.
#[test]
fn a_guest_that_stops_answering_is_killed_by_the_heartbeat() {
    let w = world();
    let run = Busy::start(&w, &[], BUSY);
    run.wait_lines(3);
    let frozen = FrozenVcpus::freeze(qemu(&w));
    let (st, took, err) = run.end(Instant::now(), Duration::from_secs(40));
    drop(frozen);
    assert_eq!(st.code(), Some(125), "{err}");
    assert!(err.contains("the guest has not answered for"), "{err}");
    assert!(err.contains("the VM was killed"), "{err}");
    assert!(took < Duration::from_secs(11), "took {took:?}: {err}");
    assert_nothing_left(&w);
}

/// Ctrl-C (SIGINT) and SIGTERM end a run within 2 s: with a guest that
/// answers `Kill`, and with one that answers nothing at all.
#[test]
fn an_interrupt_ends_a_run_within_2_s_whatever_the_guest_does() {
    let w = world();
    let run = Busy::start(&w, &[], BUSY);
    run.wait_lines(2);
    signal(u64::from(run.child.id()), libc::SIGTERM);
    let (st, took, err) = run.end(Instant::now(), Duration::from_secs(30));
    assert_eq!(st.code(), Some(128 + libc::SIGTERM), "{err}");
    assert!(took < Duration::from_secs(2), "took {took:?}: {err}");
    assert_nothing_left(&w);

    let run = Busy::start(&w, &[], BUSY);
    run.wait_lines(2);
    let frozen = FrozenVcpus::freeze(qemu(&w));
    signal(u64::from(run.child.id()), libc::SIGINT);
    let (st, took, err) = run.end(Instant::now(), Duration::from_secs(30));
    drop(frozen);
    assert_eq!(st.code(), Some(128 + libc::SIGINT), "{err}");
    assert!(took < Duration::from_secs(2), "took {took:?}: {err}");
    assert_nothing_left(&w);
}

/// hull killed outright (SIGKILL: no handler runs) mid-command: its QEMU
/// (which dropped root, and PDEATHSIG with it) and every virtiofsd go too.
#[test]
fn killing_hull_ends_its_vm() {
    let w = world();
    let mut run = Busy::start(&w, &[], BUSY);
    run.wait_lines(2);
    assert!(
        !run_helpers(&w, "").is_empty(),
        "no QEMU or virtiofsd found for the run"
    );
    run.child.kill().unwrap();
    run.child.wait().unwrap();
    let end = Instant::now() + Duration::from_secs(5);
    while !run_helpers(&w, "").is_empty() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        run_helpers(&w, "").is_empty(),
        "left running after hull was killed: {:?}",
        run_helpers(&w, "")
    );
}

/// A `hull vm up` VM whose QEMU stops while a run uses it: the supervisor
/// sees it, kills the VM, and tells its client, whose run ends with the
/// fault named; nothing of the VM is left, and the next run gets a fresh
/// VM (never the faulted one), saying why.
#[test]
fn a_kept_vm_that_stalls_fails_its_run_and_the_next_one() {
    let w = world();
    let vm = KeptVm::up(&w, &format!("f{}", std::process::id()), &[]);
    let name = vm.name.clone();
    let run = Busy::start(&w, &["--vm", &name], BUSY);
    run.wait_lines(3);
    signal(qemu(&w), libc::SIGSTOP);
    let (st, took, err) = run.end(Instant::now(), Duration::from_secs(30));
    assert_eq!(st.code(), Some(125), "{err}");
    assert!(
        err.contains(&format!("hull vm {name}: the VM ended")),
        "{err}"
    );
    assert!(err.contains("QEMU has been stopped by a signal"), "{err}");
    assert!(took < Duration::from_secs(5), "took {took:?}: {err}");
    // Nothing of the faulted VM is left; the next run gets a fresh one,
    // and says why.
    assert_nothing_left(&w);
    let next = w.run(
        &["--vm", &name],
        "cat /proc/sys/kernel/random/boot_id; echo RAN",
    );
    assert_eq!(next.status.code(), Some(0), "{}", text(&next.stderr));
    assert!(text(&next.stdout).contains("RAN"));
    assert!(
        text(&next.stderr).contains(&format!("VM {name} was taken down by a fault"))
            && text(&next.stderr).contains("QEMU has been stopped by a signal")
            && text(&next.stderr).contains("starting a fresh one"),
        "{}",
        text(&next.stderr)
    );
    assert_eq!(
        run_helpers(&w, "qemu-system").len(),
        1,
        "the fresh VM's QEMU"
    );
    drop(vm);
    assert_nothing_left(&w);
}

/// A batch job whose VM stalls (QEMU stopped) gets a hull-error result
/// naming the fault; the pool replaces the VM, and every other job still
/// gets its result, exactly once.
#[test]
fn a_stalled_vm_in_a_batch_fails_its_job_and_the_batch_goes_on() {
    let w = world();
    let jobs = w.root.path().join("jobs.txt");
    std::fs::write(
        &jobs,
        "echo first\n\
         touch victim.started; sleep 50; echo NOT-REACHED\n\
         echo last\n",
    )
    .unwrap();
    let out_dir = w.root.path().join("out");
    let mut batch = w
        .batch(&jobs, &out_dir, &["--pool", "1", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = w.project.join("victim.started");
    let end = Instant::now() + Duration::from_secs(120);
    while !started.exists() {
        assert!(Instant::now() < end, "the second job never started");
        assert!(batch.try_wait().unwrap().is_none(), "the batch ended early");
        std::thread::sleep(Duration::from_millis(50));
    }
    // One worker: the only VM up is the second job's.
    signal(qemu(&w), libc::SIGSTOP);
    let stopped = Instant::now();
    let end = Instant::now() + Duration::from_secs(120);
    while batch.try_wait().unwrap().is_none() {
        if Instant::now() > end {
            let _ = batch.kill();
            panic!("the batch still runs 120 s after the stall");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut stdout = String::new();
    batch
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    let mut stderr = String::new();
    let _ = batch.stderr.take().unwrap().read_to_string(&mut stderr);
    let reports = batch_reports(&stdout);
    let mut lines: Vec<u64> = reports
        .iter()
        .map(|r| r["line"].as_u64().unwrap())
        .collect();
    lines.sort_unstable();
    assert_eq!(lines, [1, 2, 3], "each job once: {stdout}\n{stderr}");
    let by_line = |n: u64| reports.iter().find(|r| r["line"] == n).unwrap();
    assert_eq!(by_line(1)["exit_code"], 0, "{stdout}");
    assert_eq!(by_line(3)["exit_code"], 0, "{stdout}");
    let victim = by_line(2)["status"].as_str().unwrap();
    assert!(
        victim.starts_with("error: ") && victim.contains("QEMU has been stopped by a signal"),
        "{stdout}"
    );
    let job_s = by_line(2)["job_s"].as_f64().unwrap();
    assert!(
        job_s < 60.0,
        "the stalled job ran out its wall time: {stdout}"
    );
    let last = std::fs::read_to_string(out_dir.join("job-3.stdout")).unwrap();
    assert_eq!(last, "last\n");
    assert!(!std::fs::read_to_string(out_dir.join("job-2.stdout"))
        .unwrap()
        .contains("NOT-REACHED"));
    eprintln!("batch ended {:?} after the stall", stopped.elapsed());
    assert_nothing_left(&w);
}
