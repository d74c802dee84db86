//! Finding and killing process trees through `/proc`.
//!
//! An exec's tree is every live descendant of its shepherd (see
//! [`crate::spawn`]): orphans reparent to the shepherd, so walking parent
//! links from `/proc/*/stat` finds processes that called `setsid` or
//! double-forked. Each kill goes through a pidfd opened after the process was
//! seen and checked again to still have the same parent, so a recycled pid
//! is never signalled.
//!
//! Does not protect against a process that is stuck in uninterruptible sleep
//! (it cannot be killed by anyone): after a bounded number of rounds the kill
//! gives up and says how many are left.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::time::Duration;

use rustix::process::{pidfd_open, pidfd_send_signal, Pid, PidfdFlags, Signal};

/// One line of `/proc/PID/stat` that matters here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcInfo {
    pub pid: i32,
    pub ppid: i32,
    pub sid: i32,
    pub zombie: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum TreeError {
    #[error("could not list /proc: {0}")]
    Proc(#[source] io::Error),
    #[error("{left} processes under pid {root} survived {rounds} rounds of SIGKILL (uninterruptible sleep?)")]
    Survivors {
        root: i32,
        left: usize,
        rounds: usize,
    },
}

/// Parse `/proc/PID/stat`. The command name may contain spaces and
/// parentheses, so fields are counted from the last `)`.
pub fn parse_stat(text: &str) -> Option<ProcInfo> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let pid = text[..open].trim().parse().ok()?;
    let mut rest = text.get(close + 1..)?.split_ascii_whitespace();
    let state = rest.next()?;
    let ppid = rest.next()?.parse().ok()?;
    let _pgrp = rest.next()?;
    let sid = rest.next()?.parse().ok()?;
    Some(ProcInfo {
        pid,
        ppid,
        sid,
        zombie: state == "Z" || state == "X",
    })
}

/// Read one process's stat; `None` if it is gone. A zombie leader whose
/// other threads still run (its main thread called `pthread_exit`) shows as
/// Z but is alive: it holds descriptors, its threads run, and a kill ends
/// them; so it counts as live here.
pub fn proc_info(pid: i32) -> Option<ProcInfo> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut info = parse_stat(&text)?;
    if info.zombie && has_live_threads(pid) {
        info.zombie = false;
    }
    Some(info)
}

/// Whether `pid` has a thread besides its (exited) leader.
fn has_live_threads(pid: i32) -> bool {
    let me = pid.to_string();
    fs::read_dir(format!("/proc/{pid}/task"))
        .map(|rd| rd.flatten().any(|e| e.file_name() != me.as_str()))
        .unwrap_or(false)
}

/// Every process visible in `/proc`.
pub fn scan() -> Result<Vec<ProcInfo>, TreeError> {
    let mut out = Vec::new();
    for entry in fs::read_dir("/proc").map_err(TreeError::Proc)? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        if let Some(info) = proc_info(pid) {
            out.push(info);
        }
    }
    Ok(out)
}

/// The live (non-zombie) descendants of `root`, with their parents.
pub fn descendants(procs: &[ProcInfo], root: i32) -> Vec<ProcInfo> {
    let mut children: HashMap<i32, Vec<&ProcInfo>> = HashMap::new();
    for p in procs {
        children.entry(p.ppid).or_default().push(p);
    }
    let mut out = Vec::new();
    let mut stack = vec![root];
    while let Some(pid) = stack.pop() {
        for c in children.get(&pid).map(Vec::as_slice).unwrap_or(&[]) {
            if c.pid == root {
                continue;
            }
            stack.push(c.pid);
            if !c.zombie {
                out.push(**c);
            }
        }
    }
    out
}

/// Send `sig` to `p` if it still is the process we saw (same parent).
fn signal_checked(p: &ProcInfo, sig: Signal) {
    let Some(pid) = Pid::from_raw(p.pid) else {
        return;
    };
    match pidfd_open(pid, PidfdFlags::empty()) {
        Ok(fd) => {
            // The pidfd pins this exact process; make sure it is still ours.
            if proc_info(p.pid).is_some_and(|now| now.ppid == p.ppid) {
                let _ = pidfd_send_signal(&fd, sig);
            }
        }
        Err(rustix::io::Errno::NOSYS) => {
            // Kernel without pidfds (< 5.3): plain kill after the same check.
            if proc_info(p.pid).is_some_and(|now| now.ppid == p.ppid) {
                let _ = rustix::process::kill_process(pid, sig);
            }
        }
        Err(_) => {} // gone already
    }
}

const KILL_ROUNDS: usize = 500;

/// SIGKILL every descendant of `root` (not `root` itself) until none is
/// left alive. Zombies are left for their parent (the shepherd) to reap.
pub fn kill_descendants(root: i32) -> Result<(), TreeError> {
    for round in 0..KILL_ROUNDS {
        let live = descendants(&scan()?, root);
        if live.is_empty() {
            return Ok(());
        }
        for p in &live {
            signal_checked(p, Signal::KILL);
        }
        // Give the kernel a moment to finish the deaths before looking again.
        std::thread::sleep(Duration::from_millis((round as u64 + 1).min(20)));
    }
    let left = descendants(&scan()?, root).len();
    if left == 0 {
        return Ok(());
    }
    Err(TreeError::Survivors {
        root,
        left,
        rounds: KILL_ROUNDS,
    })
}

/// Kill processes that were orphaned to the agent itself (their shepherd
/// died early) and reap them. A child of the agent counts as such an
/// orphan when it is not a live shepherd and runs in another session than
/// the agent: children the agent's own code started stay in its session.
pub fn sweep_orphans() -> Result<(), TreeError> {
    let me = std::process::id() as i32;
    let my_sid = proc_info(me).map(|p| p.sid).unwrap_or(0);
    for _ in 0..KILL_ROUNDS {
        let shepherds = crate::spawn::SHEPHERDS
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let procs = scan()?;
        let orphans: Vec<ProcInfo> = procs
            .iter()
            .filter(|p| p.ppid == me && p.sid != my_sid && !shepherds.contains(&p.pid))
            .copied()
            .collect();
        if orphans.is_empty() {
            return Ok(());
        }
        for o in &orphans {
            for d in descendants(&procs, o.pid) {
                signal_checked(&d, Signal::KILL);
            }
            signal_checked(o, Signal::KILL);
        }
        drop(shepherds);
        for o in &orphans {
            if let Some(pid) = Pid::from_raw(o.pid) {
                let _ = rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_odd_names() {
        let p = parse_stat("123 (a) b (c)) S 45 123 77 0 -1").unwrap();
        assert_eq!(
            p,
            ProcInfo {
                pid: 123,
                ppid: 45,
                sid: 77,
                zombie: false
            }
        );
        assert!(parse_stat("9 (x) Z 1 9 9").unwrap().zombie);
        assert_eq!(parse_stat("garbage"), None);
    }

    /// A real process whose main thread exited while another runs: /proc
    /// says Z, and it must still count as live (and die by a kill).
    #[test]
    fn a_leader_with_live_threads_is_not_a_zombie() {
        let mut child = std::process::Command::new("python3")
            .args([
                "-c",
                "import threading, time, ctypes\n\
                 def spin():\n    while True: time.sleep(0.05)\n\
                 threading.Thread(target=spin).start()\n\
                 ctypes.CDLL(None).pthread_exit(None)\n",
            ])
            .spawn()
            .expect("python3 is needed for this test");
        let pid = child.id() as i32;
        let mut state = String::new();
        for _ in 0..200 {
            let text = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if parse_stat(&text).is_some_and(|p| p.zombie) {
                state = "Z".into();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let info = proc_info(pid);
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(state, "Z", "the leader never showed as a zombie");
        assert_eq!(info.map(|p| p.zombie), Some(false));
        assert!(proc_info(pid).is_none(), "the kill did not end it");
    }

    #[test]
    fn descendants_follow_parent_links_and_skip_zombies() {
        let p = |pid, ppid, zombie| ProcInfo {
            pid,
            ppid,
            sid: 0,
            zombie,
        };
        let procs = [
            p(10, 1, false),
            p(11, 10, false),
            p(12, 11, false),
            p(13, 10, true),
            p(20, 1, false),
        ];
        let mut d: Vec<i32> = descendants(&procs, 10).iter().map(|p| p.pid).collect();
        d.sort();
        assert_eq!(d, vec![11, 12]);
        assert!(descendants(&procs, 20).is_empty());
    }
}
