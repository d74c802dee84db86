//! `hull-agent` command line: parse arguments, set up logging, run a mode.

#[cfg(target_os = "linux")]
mod cli {
    use std::path::PathBuf;

    use anyhow::Context;
    use clap::{Args, Parser, Subcommand};
    use hull_agent::serve::{self, ServeOptions, DEFAULT_MAX_EXECS};
    use hull_protocol::Role;

    #[derive(Debug, Parser)]
    #[command(name = "hull-agent", version, about = "hull's guest agent")]
    struct Cli {
        /// More log output on stderr (-v info, -vv debug).
        #[arg(short, long, action = clap::ArgAction::Count, global = true)]
        verbose: u8,
        #[command(subcommand)]
        cmd: Cmd,
    }

    #[derive(Debug, Subcommand)]
    enum Cmd {
        /// Run commands for the host over one transport.
        Serve {
            #[command(flatten)]
            listen: Listen,
            #[command(flatten)]
            limits: Limits,
        },
        /// `serve` inside the container, on a unix socket: every exec names
        /// the user, or the uid and gid, it runs as.
        Inner {
            #[arg(long, value_name = "PATH")]
            listen_unix: PathBuf,
            #[command(flatten)]
            limits: Limits,
        },
        /// The outer-VM agent.
        Outer(hull_agent::outer::OuterArgs),
    }

    #[derive(Debug, Args)]
    #[group(required = true, multiple = false)]
    struct Listen {
        /// Listen on a unix socket (one connection at a time).
        #[arg(long, value_name = "PATH")]
        listen_unix: Option<PathBuf>,
        /// Speak the protocol on stdin/stdout.
        #[arg(long)]
        stdio: bool,
        /// Open the virtio-serial port with this name (/sys/class/virtio-ports/*/name).
        #[arg(long, value_name = "NAME")]
        port: Option<String>,
    }

    #[derive(Debug, Args)]
    struct Limits {
        /// Most concurrent execs per session.
        #[arg(long, default_value_t = DEFAULT_MAX_EXECS)]
        max_execs: usize,
        /// Run every command as UID:GID; requests for other ids are refused.
        #[arg(long, value_name = "UID:GID", value_parser = parse_ids)]
        run_as: Option<(u32, u32)>,
        /// Every command's environment starts from the agent's own, the
        /// exec's entries on top (a session's leader in a native sandbox).
        #[arg(long)]
        inherit_env: bool,
        /// What an exec leaves running when its command exits by itself
        /// runs on until the session ends (a session's leader).
        #[arg(long)]
        keep_leftovers: bool,
        /// The time limit, in milliseconds, of an exec that names none.
        #[arg(long, value_name = "MS")]
        default_timeout_ms: Option<u64>,
    }

    fn parse_ids(s: &str) -> Result<(u32, u32), String> {
        let (u, g) = s.split_once(':').ok_or("expected UID:GID")?;
        let u = u.parse().map_err(|_| format!("bad uid {u:?}"))?;
        let g = g.parse().map_err(|_| format!("bad gid {g:?}"))?;
        Ok((u, g))
    }

    fn options(role: Role, l: Limits) -> ServeOptions {
        let mut o = ServeOptions::new(role);
        o.max_execs = l.max_execs.max(1);
        o.run_as = l.run_as;
        // Entries that are not UTF-8 cannot travel in an exec: left out.
        o.base_env = l.inherit_env.then(|| {
            std::env::vars_os()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
                .collect()
        });
        o.default_timeout_ms = l.default_timeout_ms;
        o.keep_leftovers = l.keep_leftovers;
        o
    }

    pub fn main() -> anyhow::Result<()> {
        let cli = Cli::parse();
        let level = match cli.verbose {
            0 => "warn",
            1 => "info",
            _ => "debug",
        };
        tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_env("HULL_AGENT_LOG")
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level)),
            )
            .init();
        match cli.cmd {
            Cmd::Serve { listen, limits } => {
                let opts = options(Role::InnerAgent, limits);
                if let Some(path) = listen.listen_unix {
                    serve::serve_unix(&path, &opts)
                        .with_context(|| format!("serving on {}", path.display()))
                } else if let Some(name) = listen.port {
                    serve::serve_port(&name, &opts)
                        .with_context(|| format!("serving on virtio-serial port {name}"))
                } else {
                    serve::serve_stdio(&opts).context("serving on stdio")
                }
            }
            Cmd::Inner {
                listen_unix,
                limits,
            } => serve::serve_unix(
                &listen_unix,
                &ServeOptions {
                    exec_cgroups: true,
                    ids_required: true,
                    ..options(Role::InnerAgent, limits)
                },
            )
            .with_context(|| format!("inner agent on {}", listen_unix.display())),
            Cmd::Outer(args) => hull_agent::outer::run(args),
        }
    }
}

#[cfg(target_os = "linux")]
fn main() {
    if let Err(e) = cli::main() {
        eprintln!("hull-agent: {e:#}");
        std::process::exit(1);
    }
}

#[cfg(not(target_os = "linux"))]
fn main() {
    eprintln!("hull-agent runs only on Linux");
    std::process::exit(1);
}
