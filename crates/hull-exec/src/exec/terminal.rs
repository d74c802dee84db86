//! The caller's terminal is the same after a run as before it.
//!
//! A command that inherits the caller's terminal as stdin, stdout or stderr
//! can change its settings (`stty -echo -isig`: no echo, Ctrl-C dead) and
//! those outlive hull. hull records the settings (termios and line
//! discipline) of each terminal among its standard descriptors before the
//! command starts and puts them back once the command's tree is gone. The
//! filter already refuses TIOCSTI, TIOCLINUX and TIOCSETD; this covers the
//! settings a program may legitimately change while it runs.

use std::os::fd::RawFd;

#[derive(Debug)]
struct Tty {
    fd: RawFd,
    termios: libc::termios,
    ldisc: libc::c_int,
}

/// The settings of the caller's terminals, put back on drop.
#[derive(Debug)]
pub struct Saved(Vec<Tty>);

/// Records the settings of every terminal among descriptors 0, 1 and 2.
pub fn save() -> Saved {
    let mut out = Vec::new();
    for fd in 0..=2 {
        // SAFETY: isatty, tcgetattr and ioctl(TIOCGETD) on a descriptor
        // number, writing into values we own.
        unsafe {
            if libc::isatty(fd) != 1 {
                continue;
            }
            let mut termios: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(fd, &mut termios) != 0 {
                continue;
            }
            let mut ldisc: libc::c_int = 0;
            if libc::ioctl(fd, libc::TIOCGETD, &mut ldisc as *mut libc::c_int) != 0 {
                ldisc = -1;
            }
            out.push(Tty { fd, termios, ldisc });
        }
    }
    Saved(out)
}

impl Saved {
    fn restore(&self) {
        if self.0.is_empty() {
            return;
        }
        // SAFETY: sigset operations on a set we own; SIGTTOU blocked on
        // this thread only, so restoring from a background process group
        // does not stop hull (a blocked SIGTTOU lets tcsetattr proceed).
        unsafe {
            let mut block: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut block);
            libc::sigaddset(&mut block, libc::SIGTTOU);
            libc::pthread_sigmask(libc::SIG_BLOCK, &block, &mut old);
            for t in &self.0 {
                let mut ldisc: libc::c_int = 0;
                if t.ldisc >= 0
                    && libc::ioctl(t.fd, libc::TIOCGETD, &mut ldisc as *mut libc::c_int) == 0
                    && ldisc != t.ldisc
                {
                    libc::ioctl(t.fd, libc::TIOCSETD, &t.ldisc as *const libc::c_int);
                }
                let mut now: libc::termios = std::mem::zeroed();
                if libc::tcgetattr(t.fd, &mut now) == 0 && !same(&now, &t.termios) {
                    libc::tcsetattr(t.fd, libc::TCSANOW, &t.termios);
                }
            }
            libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        }
    }
}

fn same(a: &libc::termios, b: &libc::termios) -> bool {
    a.c_iflag == b.c_iflag
        && a.c_oflag == b.c_oflag
        && a.c_cflag == b.c_cflag
        && a.c_lflag == b.c_lflag
        && a.c_cc == b.c_cc
}

impl Drop for Saved {
    fn drop(&mut self) {
        self.restore();
    }
}
