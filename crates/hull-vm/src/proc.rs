//! Helper processes (QEMU, virtiofsd) tied to the hull instance that started them.
//!
//! What this protects against: a VM or file server outliving hull. Each child
//! gets `PR_SET_PDEATHSIG(SIGKILL)` (Linux), its own process group (a Ctrl-C
//! at the terminal reaches hull, which then ends the VM in order), is killed
//! and reaped when its handle drops, and leaves a pid file in the instance dir
//! (`<name>.pid`: pid, start time, program) so a later hull can find and kill
//! the ones a crashed hull left behind ([`kill_stale`]). The start time makes
//! a reused pid harmless: a process is only killed when pid, start time and
//! program all match.
//!
//! A child that changes its credentials itself (QEMU's `-run-with user=`)
//! loses PDEATHSIG with the change: [`Supervised::watch_parent`] gives it a
//! watcher instead, a forked process that holds a pipe from hull and a
//! pidfd of the child, and kills exactly that child when the pipe ends
//! (hull gone, however it died).
//!
//! What it does not: PDEATHSIG fires when the *thread* that spawned the child
//! ends, so spawn from a thread that lives as long as the child (the caller's
//! main thread or the VM's owner thread). On non-Linux hosts there is no
//! PDEATHSIG and no start time: children die with their handle, and stale
//! pid files are reported, never acted on.

use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum ProcError {
    #[error("tier vm: cannot start {name} ({program}): {source}")]
    Spawn {
        name: String,
        program: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("tier vm: cannot write pid file {path}: {source}")]
    PidFile {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Makes `cmd`'s child die with this thread, in its own process group.
/// Call before adding other `pre_exec` hooks so this one runs first.
pub fn tie_to_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    cmd.process_group(0);
    #[cfg(target_os = "linux")]
    {
        let parent = std::process::id();
        // SAFETY: the hook runs in the forked child before exec and only makes
        // async-signal-safe system calls (prctl, getppid); it allocates nothing.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // The parent may have died between fork and prctl.
                if libc::getppid() as u32 != parent {
                    return Err(io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
    }
}

/// A running helper process. Killed (SIGKILL) and reaped on drop.
#[derive(Debug)]
pub struct Supervised {
    name: String,
    program: PathBuf,
    child: Option<Child>,
    pid_file: PathBuf,
    status: Option<ExitStatus>,
    /// The watcher's pid and our end of its pipe ([`Supervised::watch_parent`]).
    watcher: Option<(i32, std::os::fd::OwnedFd)>,
}

impl Supervised {
    /// Spawns `cmd` (already given [`tie_to_parent`]) and writes
    /// `<dir>/<name>.pid`. `name` is a short file-name-safe label.
    pub fn spawn(mut cmd: Command, name: &str, dir: &Path) -> Result<Supervised, ProcError> {
        let program = PathBuf::from(cmd.get_program());
        let child = cmd.spawn().map_err(|source| ProcError::Spawn {
            name: name.to_string(),
            program: program.clone(),
            source,
        })?;
        let pid_file = dir.join(format!("{name}.pid"));
        let mut me = Supervised {
            name: name.to_string(),
            program,
            child: Some(child),
            pid_file,
            status: None,
            watcher: None,
        };
        let record = PidRecord {
            pid: me.pid(),
            start_time: start_time(me.pid()),
            program: me.program.clone(),
        };
        if let Err(source) = fs::write(&me.pid_file, record.to_text()) {
            let path = me.pid_file.clone();
            me.kill();
            return Err(ProcError::PidFile { path, source });
        }
        Ok(me)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The child's stderr, if it was piped (once).
    pub fn take_stderr(&mut self) -> Option<std::process::ChildStderr> {
        self.child.as_mut()?.stderr.take()
    }

    pub fn take_stdout(&mut self) -> Option<std::process::ChildStdout> {
        self.child.as_mut()?.stdout.take()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or(0)
    }

    /// The exit status if the process has ended (reaps it).
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(s)) = c.try_wait() {
                    self.status = Some(s);
                }
            }
        }
        self.status
    }

    /// True when the process, or a child it forked, is stopped by a signal
    /// (state `T`): alive, and serving nothing.
    #[cfg(target_os = "linux")]
    pub fn is_stopped(&mut self) -> bool {
        if self.try_wait().is_some() {
            return false;
        }
        let pid = self.pid();
        std::iter::once(pid)
            .chain(children(pid))
            .any(|p| state(p) == Some('T'))
    }

    /// SIGKILLs the children it forked ([`kill_children`]), only while it
    /// is unreaped: its pid is then still its own.
    #[cfg(target_os = "linux")]
    pub fn kill_children(&mut self) {
        if self.try_wait().is_none() {
            kill_children(self.pid());
        }
    }

    /// Waits up to `d` for the process to end by itself.
    pub fn wait_timeout(&mut self, d: Duration) -> Option<ExitStatus> {
        let end = Instant::now() + d;
        loop {
            if let Some(s) = self.try_wait() {
                return Some(s);
            }
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            self.sleep_while_alive(left.min(Duration::from_millis(20)));
        }
    }

    /// Sleeps up to `d`, waking as soon as the (unreaped) process ends: a
    /// guest's power-off is seen when it happens, not at the next tick.
    pub fn sleep_while_alive(&self, d: Duration) {
        #[cfg(target_os = "linux")]
        if let (Some(c), None) = (&self.child, self.status) {
            use rustix::event::{poll, PollFd, PollFlags, Timespec};
            // The child is not reaped yet (no status): its pid is its own.
            let pidfd = rustix::process::Pid::from_raw(c.id() as i32).and_then(|pid| {
                rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok()
            });
            if let Some(fd) = pidfd {
                let mut fds = [PollFd::new(&fd, PollFlags::IN)];
                let t = Timespec {
                    tv_sec: d.as_secs() as i64,
                    tv_nsec: i64::from(d.subsec_nanos()),
                };
                if poll(&mut fds, Some(&t)).is_ok() {
                    return;
                }
            }
        }
        std::thread::sleep(d);
    }

    /// SIGKILL and reap; removes the pid file; ends the watcher. Idempotent.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            if self.status.is_none() {
                let _ = c.kill();
                if let Ok(s) = c.wait() {
                    self.status = Some(s);
                }
            }
            let _ = fs::remove_file(&self.pid_file);
        }
        if let Some((pid, pipe)) = self.watcher.take() {
            // End of file: the watcher signals a child that is gone, exits.
            drop(pipe);
            let mut st = 0;
            // SAFETY: reaps our own child, the watcher; `st` is a valid pointer.
            unsafe { libc::waitpid(pid, &mut st, 0) };
        }
    }

    /// Kills the child when this process ends, however it ends, also after
    /// the child changed its credentials (which clears PDEATHSIG): a forked
    /// watcher holds a pipe whose other end only this process has, and a
    /// pidfd of the child, and SIGKILLs exactly that child at end of file.
    #[cfg(target_os = "linux")]
    pub fn watch_parent(&mut self) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let Some(child) = self.child.as_ref() else {
            return Ok(());
        };
        let pid = rustix::process::Pid::from_raw(child.id() as i32)
            .ok_or_else(|| io::Error::other("the child has no pid"))?;
        let pidfd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())?;
        let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
        let (rfd, pfd) = (r.as_raw_fd(), pidfd.as_raw_fd());
        let (lo, hi) = (rfd.min(pfd), rfd.max(pfd));
        // SAFETY: the forked child only makes raw, async-signal-safe system
        // calls (close_range, read, pidfd_send_signal, _exit) on integers
        // and a stack buffer; it allocates nothing and takes no lock.
        let watcher = unsafe { libc::fork() };
        if watcher < 0 {
            return Err(io::Error::last_os_error());
        }
        if watcher == 0 {
            // SAFETY: see above.
            unsafe {
                // Nothing of hull's but the pipe's read end and the pidfd:
                // the write end must close with hull, and no socket, file
                // or terminal of hull's may stay open because of us.
                let close = |from: i32, to: i32| {
                    if from <= to {
                        libc::syscall(libc::SYS_close_range, from as u32, to as u32, 0u32);
                    }
                };
                close(0, lo - 1);
                close(lo + 1, hi - 1);
                close(hi + 1, i32::MAX);
                let mut b = [0u8; 1];
                loop {
                    let n = libc::read(rfd, b.as_mut_ptr().cast(), 1);
                    if n < 0 && *libc::__errno_location() == libc::EINTR {
                        continue;
                    }
                    break;
                }
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    pfd,
                    libc::SIGKILL,
                    0usize,
                    0u32,
                );
                libc::_exit(0);
            }
        }
        drop(r);
        drop(pidfd);
        self.watcher = Some((watcher, w));
        Ok(())
    }

    /// Sends SIGTERM (a polite stop; virtiofsd exits cleanly on it).
    pub fn terminate(&mut self) {
        if self.try_wait().is_none() {
            if let Some(c) = self.child.as_ref() {
                let pid = c.id() as libc::pid_t;
                // SAFETY: plain kill(2) on our own, not yet reaped, child.
                unsafe {
                    libc::kill(pid, libc::SIGTERM);
                }
            }
        }
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What a pid file records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PidRecord {
    pub pid: u32,
    /// Start time in clock ticks since boot (`/proc/PID/stat` field 22).
    pub start_time: Option<u64>,
    pub program: PathBuf,
}

/// Largest pid file read back (they are a few dozen bytes).
const MAX_PID_FILE: u64 = 4096;

impl PidRecord {
    fn to_text(&self) -> String {
        format!(
            "{}\n{}\n{}\n",
            self.pid,
            self.start_time.map(|t| t.to_string()).unwrap_or_default(),
            self.program.display()
        )
    }

    fn parse(text: &str) -> Option<PidRecord> {
        let mut lines = text.lines();
        let pid: u32 = lines.next()?.trim().parse().ok()?;
        if pid <= 1 {
            return None;
        }
        let st = lines.next()?.trim();
        let start_time = if st.is_empty() {
            None
        } else {
            Some(st.parse().ok()?)
        };
        let program = PathBuf::from(lines.next()?.trim());
        Some(PidRecord {
            pid,
            start_time,
            program,
        })
    }

    /// True when this exact process is still running.
    pub fn is_alive(&self) -> bool {
        match (self.start_time, start_time(self.pid)) {
            (Some(want), Some(now)) => want == now && exe_matches(self.pid, &self.program),
            _ => false,
        }
    }
}

/// This process's start time (for a pid record of itself).
pub fn own_start_time() -> Option<u64> {
    start_time(std::process::id())
}

/// Start time of a live process; `None` for a gone one or a zombie (it
/// has exited and only waits to be reaped).
#[cfg(target_os = "linux")]
fn start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may contain spaces.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    // Field 3 is the state.
    if matches!(fields.next(), Some("Z") | Some("X")) {
        return None;
    }
    // Start time is field 22 (the 19th after the state).
    fields.nth(18)?.parse().ok()
}

#[cfg(not(target_os = "linux"))]
fn start_time(_pid: u32) -> Option<u64> {
    None
}

#[cfg(target_os = "linux")]
fn exe_matches(pid: u32, program: &Path) -> bool {
    match fs::read_link(format!("/proc/{pid}/exe")) {
        Ok(exe) => {
            let want = fs::canonicalize(program).unwrap_or_else(|_| program.to_path_buf());
            // A deleted binary reads as "PATH (deleted)".
            exe == want || exe.to_string_lossy().starts_with(&*want.to_string_lossy())
        }
        Err(_) => false,
    }
}

#[cfg(not(target_os = "linux"))]
fn exe_matches(_pid: u32, _program: &Path) -> bool {
    false
}

/// A stale helper found in an instance dir.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stale {
    pub pid_file: PathBuf,
    pub record: Option<PidRecord>,
    /// The process was still running and was killed.
    pub killed: bool,
}

/// Kills every helper recorded in `dir/*.pid` that is still running (same
/// pid, start time and program) and removes the pid files. Only call it for
/// a dir whose `.active` lock is free (no hull owns it any more).
#[cfg(target_os = "linux")]
/// The scheduler state of `pid` (`R`, `S`, `D`, `T` stopped by a signal,
/// `t` stopped by a tracer, `Z`...), if the process exists.
pub fn state(pid: u32) -> Option<char> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The name may hold spaces and parentheses: the state follows the last ')'.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .next()?
        .chars()
        .next()
}

#[cfg(target_os = "linux")]
/// The children of `pid` (of each of its threads).
pub fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut out: Vec<u32> = tasks
        .flatten()
        .filter_map(|t| fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|s| {
            s.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

#[cfg(target_os = "linux")]
fn parent_of(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// SIGKILLs the children of `pid`, a helper of ours that forks workers
/// (virtiofsd's sandboxed worker): a worker that was stopped ignores the
/// SIGTERM its parent's death brings it, and would stay. Each is signalled
/// through a pidfd opened while it is still `pid`'s child, so a reused pid
/// is never hit.
#[cfg(target_os = "linux")]
pub fn kill_children(pid: u32) {
    use rustix::process::{pidfd_open, pidfd_send_signal, Pid, PidfdFlags, Signal};
    for c in children(pid) {
        let Some(cpid) = i32::try_from(c).ok().and_then(Pid::from_raw) else {
            continue;
        };
        let Ok(fd) = pidfd_open(cpid, PidfdFlags::empty()) else {
            continue;
        };
        if parent_of(c) == Some(pid) {
            let _ = pidfd_send_signal(&fd, Signal::KILL);
        }
    }
}

pub fn kill_stale(dir: &Path) -> io::Result<Vec<Stale>> {
    let mut out = Vec::new();
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "pid"))
        .collect();
    files.sort();
    for pid_file in files {
        let record = read_pid_file(&pid_file);
        let mut killed = false;
        if let Some(r) = &record {
            if r.is_alive() {
                // SAFETY: kill(2) on a process identified by pid, start time and program.
                unsafe {
                    libc::kill(r.pid as libc::pid_t, libc::SIGKILL);
                }
                killed = true;
            }
        }
        let _ = fs::remove_file(&pid_file);
        out.push(Stale {
            pid_file,
            record,
            killed,
        });
    }
    Ok(out)
}

fn read_pid_file(p: &Path) -> Option<PidRecord> {
    use std::io::Read;
    let f = fs::File::open(p).ok()?;
    let mut s = String::new();
    f.take(MAX_PID_FILE).read_to_string(&mut s).ok()?;
    PidRecord::parse(&s)
}

/// Copies `from` (a helper's output pipe) to `file` on a thread of its own,
/// at most `cap` bytes: past it one line says so and the rest is read and
/// dropped, so the writer never blocks and the log never fills the disk
/// (what the guest writes to its console is the guest's to choose).
pub fn capped_log(
    from: impl Read + Send + 'static,
    mut file: fs::File,
    cap: u64,
    name: &str,
) -> io::Result<()> {
    use std::io::Write;
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            let mut from = from;
            let mut buf = vec![0u8; 64 * 1024];
            let mut written: u64 = 0;
            let mut cut = false;
            loop {
                let n = match from.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(_) => break,
                };
                if cut {
                    continue;
                }
                let room = cap.saturating_sub(written) as usize;
                let take = n.min(room);
                if file.write_all(&buf[..take]).is_err() {
                    cut = true;
                    continue;
                }
                written += take as u64;
                if take < n {
                    let _ = writeln!(
                        file,
                        "\n[hull: log cut at {cap} bytes; the rest was dropped]"
                    );
                    cut = true;
                }
            }
        })?;
    Ok(())
}

/// The last `max` bytes of a log file, lossily decoded, for error messages.
/// What the guest writes there is the guest's: control characters other
/// than newline and tab are shown escaped (`\x1b`), so no escape sequence
/// reaches the user's terminal through hull's errors.
pub fn log_tail(path: &Path, max: u64) -> String {
    printable(&raw_tail(path, max))
}

pub use crate::text::printable;

/// Text from the guest for one of hull's messages: [`printable`], and at
/// most [`MAX_GUEST_TEXT`] bytes.
pub fn guest_text(text: &str) -> String {
    let mut t = printable(text);
    if t.len() > MAX_GUEST_TEXT {
        let mut end = MAX_GUEST_TEXT;
        while !t.is_char_boundary(end) {
            end -= 1;
        }
        t.truncate(end);
        t.push_str(" [cut]");
    }
    t
}

/// The longest guest text in one of hull's messages.
pub const MAX_GUEST_TEXT: usize = 2048;

fn raw_tail(path: &Path, max: u64) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = fs::File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    if len > max {
        let _ = f.seek(SeekFrom::Start(len - max));
    }
    let mut buf = Vec::new();
    let _ = f.take(max).read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_tails_carry_no_terminal_escapes() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("console.log");
        fs::write(&p, b"boot ok\n\x1b]0;pwned\x07\x1b[2Jlast line\r\n").unwrap();
        let t = log_tail(&p, 1000);
        assert!(!t.chars().any(|c| c.is_control() && c != '\n'), "{t:?}");
        assert!(t.contains("\\x1b]0;pwned\\x07"), "{t:?}");
        assert!(t.starts_with("boot ok\n"), "{t:?}");
        assert!(t.ends_with("last line"), "{t:?}");
        // Bounded: only the tail is read.
        assert!(log_tail(&p, 10).len() <= 10 * 4);
    }

    /// A helper that writes without end fills its log up to the cap only,
    /// and is never blocked: the rest is read and dropped.
    #[test]
    fn a_flooded_log_stops_at_its_cap_and_the_writer_runs_on() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("console.log");
        let mut child = Command::new("sh")
            .args(["-c", "head -c 10485760 /dev/zero; echo done >&2"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        capped_log(out, fs::File::create(&p).unwrap(), 1 << 20, "t-console").unwrap();
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        assert!(child.wait().unwrap().success());
        assert_eq!(err, "done\n", "the writer finished");
        // The thread writes the cut line once it has read past the cap.
        let deadline = Instant::now() + Duration::from_secs(10);
        let text = loop {
            let t = fs::read(&p).unwrap();
            if t.ends_with(b"dropped]\n") || Instant::now() > deadline {
                break t;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(text.len() < (1 << 20) + 200, "{} bytes", text.len());
        assert!(text.len() >= 1 << 20);
        assert!(String::from_utf8_lossy(&text[1 << 20..]).contains("log cut at 1048576 bytes"));
    }

    #[test]
    fn guest_text_is_escaped_and_bounded() {
        let t = guest_text("chdir failed: \u{202e}txt.exe\x1b[31m\u{200b}");
        assert_eq!(t, "chdir failed: \\u{202e}txt.exe\\x1b[31m\\u{200b}");
        let long = "é".repeat(MAX_GUEST_TEXT);
        let t = guest_text(&long);
        assert!(t.len() <= MAX_GUEST_TEXT + " [cut]".len(), "{}", t.len());
        assert!(t.ends_with(" [cut]"));
        assert_eq!(guest_text("plain\tline\nnext"), "plain\tline\nnext");
    }

    #[test]
    fn pid_records_round_trip_and_bad_ones_are_ignored() {
        let r = PidRecord {
            pid: 42,
            start_time: Some(123),
            program: "/usr/bin/qemu-system-x86_64".into(),
        };
        assert_eq!(PidRecord::parse(&r.to_text()), Some(r));
        assert_eq!(PidRecord::parse("1\n5\n/bin/x\n"), None);
        assert_eq!(PidRecord::parse("x\n5\n/bin/x\n"), None);
        assert_eq!(PidRecord::parse(""), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn spawned_child_is_killed_on_drop_and_stale_ones_are_found() {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = Command::new("/bin/sleep");
        cmd.arg("600");
        tie_to_parent(&mut cmd);
        let s = Supervised::spawn(cmd, "sleeper", dir.path()).unwrap();
        let pid = s.pid();
        let rec = read_pid_file(&dir.path().join("sleeper.pid")).unwrap();
        assert_eq!(rec.pid, pid);
        assert!(rec.is_alive());
        drop(s);
        assert!(!dir.path().join("sleeper.pid").exists());
        assert!(!rec.is_alive(), "child {pid} still running after drop");

        // A "crashed hull": the child keeps running, its pid file stays.
        let mut cmd = Command::new("/bin/sleep");
        cmd.arg("600");
        let mut child = cmd.spawn().unwrap();
        let rec = PidRecord {
            pid: child.id(),
            start_time: start_time(child.id()),
            program: "/bin/sleep".into(),
        };
        fs::write(dir.path().join("qemu.pid"), rec.to_text()).unwrap();
        // A pid file whose process is gone, and one for a reused pid.
        let gone = PidRecord {
            pid: child.id(),
            start_time: Some(1),
            program: "/bin/sleep".into(),
        };
        fs::write(dir.path().join("old.pid"), gone.to_text()).unwrap();
        let found = kill_stale(dir.path()).unwrap();
        assert_eq!(found.len(), 2);
        let q = found
            .iter()
            .find(|s| s.pid_file.ends_with("qemu.pid"))
            .unwrap();
        assert!(q.killed);
        let o = found
            .iter()
            .find(|s| s.pid_file.ends_with("old.pid"))
            .unwrap();
        assert!(
            !o.killed,
            "a pid with another start time must not be killed"
        );
        let st = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(st.signal(), Some(libc::SIGKILL));
        assert!(!dir.path().join("qemu.pid").exists());
    }
}
