//! The executor off Linux (macOS, Windows): spawn, stream, time out, kill.
//!
//! On macOS the command is the leader of its own process group and the
//! group is killed on timeout (a grandchild that calls `setsid` escapes it:
//! macOS has no subreaper; docs/tiers.md says so). On Windows the command is
//! hull's trampoline, which holds a kill-on-close Job Object: killing the
//! trampoline ends the whole tree.

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::{ExecError, ExitStatus, OutputSink};

enum Event {
    Out(bool, Vec<u8>),
    Eof,
}

/// Runs `cmd` to its end (see the module docs for how the tree is ended).
pub fn run(
    mut cmd: Command,
    timeout: Option<Duration>,
    mut sink: Option<&mut dyn OutputSink>,
) -> Result<ExitStatus, ExecError> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    #[cfg(unix)]
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    cmd.stdin(Stdio::inherit());
    if sink.is_some() {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    }
    let mut child = cmd
        .spawn()
        .map_err(|source| ExecError::Spawn { program, source })?;
    let (tx, rx) = mpsc::channel();
    let mut open = 0;
    if let Some(o) = child.stdout.take() {
        open += 1;
        pump(o, true, tx.clone());
    }
    if let Some(e) = child.stderr.take() {
        open += 1;
        pump(e, false, tx.clone());
    }
    drop(tx);
    let deadline = timeout.map(|t| Instant::now() + t);
    let mut timed_out = false;
    loop {
        while let Ok(ev) = rx.recv_timeout(Duration::from_millis(20)) {
            match ev {
                Event::Out(is_out, data) => {
                    if let Some(s) = sink.as_deref_mut() {
                        let r = if is_out {
                            s.stdout(&data)
                        } else {
                            s.stderr(&data)
                        };
                        r.map_err(ExecError::Output)?;
                    }
                }
                Event::Eof => open -= 1,
            }
        }
        if let Some(st) = child.try_wait().map_err(ExecError::Wait)? {
            if open == 0 {
                if let Some(s) = sink {
                    s.finish().map_err(ExecError::Output)?;
                }
                if timed_out {
                    return Ok(ExitStatus::TimedOut);
                }
                return Ok(super::map_status(st));
            }
        } else if !timed_out && deadline.is_some_and(|d| Instant::now() >= d) {
            timed_out = true;
            kill_tree(&mut child);
        }
    }
}

fn kill_tree(child: &mut std::process::Child) {
    #[cfg(unix)]
    // SAFETY: kill(2) on the process group we created for the child.
    unsafe {
        libc::kill(-(child.id() as i32), libc::SIGKILL);
    }
    let _ = child.kill();
}

fn pump(mut r: impl Read + Send + 'static, is_out: bool, tx: mpsc::Sender<Event>) {
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = r.read(&mut buf) {
            if n == 0 || tx.send(Event::Out(is_out, buf[..n].to_vec())).is_err() {
                break;
            }
        }
        let _ = tx.send(Event::Eof);
    });
}
