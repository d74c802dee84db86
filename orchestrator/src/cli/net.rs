//! `hull __net-proxy`: the policy's egress proxy on its own, for the run
//! that owns it (and for benchmarks): it serves until its stdin closes (the
//! owner gone) or SIGTERM/SIGINT, then prints one line per refused host.

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
    #[arg(long)]
    pub audit: Option<PathBuf>,
}

pub fn net_proxy(a: NetProxyArgs) -> anyhow::Result<i32> {
    if !a.listen.ip().is_loopback() {
        anyhow::bail!("--listen {}: the proxy listens on loopback only", a.listen);
    }
    let policy = crate::policy::profiles::load(&a.policy)?.net_policy()?;
    let audit = match &a.audit {
        Some(p) => Audit::to_file(p)
            .map_err(|e| anyhow::anyhow!("cannot open the audit file {}: {e}", p.display()))?,
        None => Audit::in_memory(),
    };
    let l = std::net::TcpListener::bind(a.listen)
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", a.listen))?;
    let addr = l.local_addr()?;
    let proxy = Proxy::start(Listener::Tcp(l), Shared { policy, audit })?;
    {
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
    let refused = proxy.audit().refused_lines();
    drop(proxy);
    for line in refused {
        eprintln!("hull: {line}");
    }
    Ok(0)
}
