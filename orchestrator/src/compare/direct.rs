//! The command run without hull: the baseline of `hull compare`. It runs
//! as the caller, in the project, with the caller's environment, its
//! stdout and stderr in files, stdin empty; ended (SIGKILL) at the
//! timeout. Its peak memory is the largest resident set of the command's
//! own process (`wait4`'s rusage).

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::time::{Duration, Instant};

use super::Sample;

/// Runs `argv` in `project` once; stdout into `stdout`, stderr into
/// `stderr`.
pub fn run(
    argv: &[String],
    project: &Path,
    stdout: &Path,
    stderr: &Path,
    timeout: Option<Duration>,
) -> Sample {
    let failed = |wall_s: f64, error: String| Sample {
        wall_s,
        status: "hull_error".into(),
        exit_code: None,
        peak_memory_bytes: None,
        stdout_sha256: None,
        error: Some(error),
    };
    let file = |p: &Path| {
        std::fs::File::create(p).map_err(|e| format!("cannot create {}: {e}", p.display()))
    };
    let (out, err) = match (file(stdout), file(stderr)) {
        (Ok(o), Ok(e)) => (o, e),
        (Err(e), _) | (_, Err(e)) => return failed(0.0, e),
    };
    let Some((program, args)) = argv.split_first() else {
        return failed(0.0, "no command".into());
    };
    let t0 = Instant::now();
    let child = std::process::Command::new(program)
        .args(args)
        .current_dir(project)
        .stdin(std::process::Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn();
    let child = match child {
        Ok(c) => c,
        Err(e) => return failed(0.0, format!("cannot start {program}: {e}")),
    };
    let pid = child.id() as i32;
    // The timer ends the command through a pidfd: never another process
    // that got its pid after it was reaped.
    let pidfd = rustix::process::Pid::from_raw(pid)
        .and_then(|p| rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok());
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let timer = timeout.zip(pidfd).map(|(limit, fd)| {
        std::thread::spawn(move || {
            if done_rx.recv_timeout(limit).is_err() {
                let _ = rustix::process::pidfd_send_signal(&fd, rustix::process::Signal::KILL);
                return true;
            }
            false
        })
    });
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 fills it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let reaped = loop {
        // SAFETY: waits for our own child with valid out-pointers.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if r >= 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            break r;
        }
    };
    let wall_s = t0.elapsed().as_secs_f64();
    drop(done_tx);
    let timed_out = timer.is_some_and(|t| t.join().unwrap_or(false));
    drop(child);
    if reaped < 0 {
        return failed(
            wall_s,
            format!(
                "cannot wait for {program}: {}",
                std::io::Error::last_os_error()
            ),
        );
    }
    let st = std::process::ExitStatus::from_raw(status);
    let (status, exit_code) = match (timed_out, st.code(), st.signal()) {
        (true, _, _) => ("timeout", None),
        (false, Some(c), _) => ("exit", Some(c)),
        (false, None, _) => ("signal", None),
    };
    Sample {
        wall_s,
        status: status.into(),
        exit_code,
        peak_memory_bytes: u64::try_from(usage.ru_maxrss).ok().map(|kib| kib * 1024),
        stdout_sha256: super::run::digest(stdout),
        error: None,
    }
}
