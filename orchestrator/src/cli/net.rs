//! `hull __net-proxy`: the policy's egress proxy on its own, for the run
//! that owns it (`net::helper`) and for benchmarks: it serves until its
//! stdin closes (the owner gone) or SIGTERM/SIGINT, then prints one line
//! per refused host.

use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;

use crate::net::{Audit, Listener, Proxy, Shared};

#[derive(Debug, Args)]
pub struct NetProxyArgs {
    /// Profile name or policy file whose `[net]` section is enforced.
    #[arg(long, default_value = "default")]
    pub policy: String,
    /// Address to listen on (loopback; port 0 picks one).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// Append every decision here as JSON lines.
    #[arg(long, conflicts_with = "audit_fd")]
    pub audit: Option<PathBuf>,
    /// The network part of a resolved policy, as hull serializes it (the
    /// run's own proxy), instead of `--policy`.
    #[arg(long)]
    pub net_json: Option<String>,
    /// A socket on which the listener arrives (from the child that made it
    /// in the command's network namespace), instead of `--listen`.
    #[arg(long)]
    pub arrival_fd: Option<i32>,
    /// A socket over which connections arrive one by one (tier 3's network
    /// channel), instead of `--listen`.
    #[arg(long, conflicts_with = "arrival_fd")]
    pub connections_fd: Option<i32>,
    /// An open file to append the decisions to, instead of `--audit`.
    #[arg(long)]
    pub audit_fd: Option<i32>,
    /// What the refused-host lines start with ("tier bwrap").
    #[arg(long)]
    pub label: Option<String>,
}

/// Takes descriptor `fd`, passed by the parent on purpose; refuses 0-2.
fn passed_fd(fd: i32, what: &str) -> anyhow::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: fcntl(F_GETFD) on an integer only reports whether it is open.
    if fd < 3 || unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        anyhow::bail!("--{what} {fd}: not an open descriptor passed by the parent");
    }
    // SAFETY: the parent passed this descriptor for this process alone, and
    // nothing else here owns or closes it.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

pub fn net_proxy(a: NetProxyArgs) -> anyhow::Result<i32> {
    let policy = match &a.net_json {
        Some(j) => serde_json::from_str(j)
            .map_err(|e| anyhow::anyhow!("--net-json: not hull's network policy: {e}"))?,
        None => crate::policy::profiles::load(&a.policy)?.net_policy()?,
    };
    let audit = match (&a.audit, a.audit_fd) {
        (Some(p), _) => Audit::to_file(p)
            .map_err(|e| anyhow::anyhow!("cannot open the audit file {}: {e}", p.display()))?,
        (None, Some(fd)) => Audit::to_open_file(passed_fd(fd, "audit-fd")?.into()),
        (None, None) => Audit::in_memory(),
    };
    // Everything is opened or bound before the confinement, which allows
    // neither.
    let (listener, announce) = match (a.arrival_fd, a.connections_fd) {
        #[cfg(target_os = "linux")]
        (Some(fd), _) => (
            Listener::Handed(crate::net::netns::Arrival(passed_fd(fd, "arrival-fd")?)),
            None,
        ),
        #[cfg(target_os = "linux")]
        (None, Some(fd)) => (
            Listener::Connections(passed_fd(fd, "connections-fd")?),
            None,
        ),
        #[cfg(not(target_os = "linux"))]
        (Some(_), _) | (None, Some(_)) => {
            anyhow::bail!("--arrival-fd, --connections-fd: Linux only")
        }
        (None, None) => {
            if !a.listen.ip().is_loopback() {
                anyhow::bail!("--listen {}: the proxy listens on loopback only", a.listen);
            }
            let l = std::net::TcpListener::bind(a.listen)
                .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", a.listen))?;
            let addr = l.local_addr()?;
            (Listener::Tcp(l), Some(addr))
        }
    };
    #[cfg(target_os = "linux")]
    {
        match crate::net::confine::apply(&policy) {
            Ok(how) => tracing::debug!(?how, "the proxy is confined"),
            Err(e) => anyhow::bail!("cannot confine the proxy with Landlock: {e}"),
        }
        // Then seccomp, before any thread: nothing executed, no namespace,
        // mount or trace (`hull_seccomp::Profile::Proxy`).
        // SAFETY: prctl with integer arguments.
        if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
            anyhow::bail!("no_new_privs: {}", std::io::Error::last_os_error());
        }
        hull_seccomp::build(hull_seccomp::Profile::Proxy)
            .and_then(|p| hull_seccomp::apply(&p))
            .map_err(|e| anyhow::anyhow!("cannot confine the proxy with seccomp: {e}"))?;
    }
    let proxy = Proxy::start(
        listener,
        Shared {
            policy,
            audit,
            key: None,
        },
    )?;
    if let Some(addr) = announce {
        let mut out = std::io::stdout().lock();
        writeln!(out, "listening {addr}")?;
        out.flush()?;
    }
    let (done, ended) = std::sync::mpsc::channel::<()>();
    {
        let done = done.clone();
        std::thread::spawn(move || {
            // Until the owner closes stdin (or dies).
            let mut sink = String::new();
            let mut stdin = std::io::stdin().lock();
            while stdin.read_line(&mut sink).is_ok_and(|n| n > 0) {
                sink.clear();
            }
            let _ = done.send(());
        });
    }
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])?;
    std::thread::spawn(move || {
        if signals.forever().next().is_some() {
            let _ = done.send(());
        }
    });
    let _ = ended.recv();
    proxy.audit().end_open();
    let refused = proxy.audit().refused_lines();
    drop(proxy);
    let prefix = a.label.map(|l| format!("{l}: ")).unwrap_or_default();
    for line in refused {
        eprintln!("hull: {prefix}{line}");
    }
    Ok(0)
}
