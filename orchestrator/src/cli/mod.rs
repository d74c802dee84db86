//! Argument parsing and output only: every subcommand parses here and calls
//! into the library. Errors are printed once, here, as a chain.

pub mod batch;
#[cfg(target_os = "linux")]
pub mod batch_jobs;
pub mod canary;
pub mod changes;
pub mod compare;
pub mod docs;
pub mod explain;
pub mod image;
#[cfg(unix)]
pub mod net;
pub mod probe;
pub mod read;
pub mod run;
pub mod runs;
pub mod serve;
pub mod templates;
pub mod vm;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::EXIT_HULL_FAILED;

#[derive(Debug, Parser)]
#[command(
    name = "hull",
    version,
    about = "Run a command behind an OS-enforced boundary"
)]
pub struct Cli {
    /// More logging (-v info, -vv debug, -vvv trace).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    /// Only errors.
    #[arg(short, long, global = true)]
    pub quiet: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a command in a sandbox.
    Run(run::RunArgs),
    /// Show every tier of every OS and whether this host can run it.
    Probe(probe::ProbeArgs),
    /// Run hull's escape probes against this machine's tiers, in a decoy
    /// home and project it makes and removes, and print the matrix.
    Canary(canary::CanaryArgs),
    /// Serve the session API on a unix socket of yours (docs/api.md):
    /// sessions that each keep one sandbox, commands run in them, their
    /// files read and written.
    Serve(serve::ServeArgs),
    /// Run one command on several tiers (and without hull), interleaved,
    /// and show the difference: wall times, ratios, peak memory, exit
    /// codes, whether stdout matched.
    Compare(compare::CompareArgs),
    /// Check or explain a policy.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// List or clean hull instance directories.
    #[command(subcommand)]
    Runs(runs::RunsCommand),
    /// Review, apply or discard what copy-on-write runs wrote.
    #[command(subcommand)]
    Changes(changes::ChangesCommand),
    /// Read UTF-8 text from the project or this instance's spill, in bounded pieces.
    Read(read::ReadArgs),
    /// Build, list or remove tier-3 guest images.
    #[command(subcommand)]
    Image(image::ImageCommand),
    /// Run many jobs: JSON lines or shell lines, on each --tier, a pristine
    /// workspace each, results appended to DIR/results.jsonl (or, for shell
    /// lines alone, each in a fresh tier-3 VM from a warm pool).
    Batch(batch::BatchArgs),
    /// Keep a tier-3 VM up between runs.
    #[command(subcommand)]
    Vm(vm::VmCommand),
    /// List or remove templates (sessions' workspaces kept under a name,
    /// made and started from through `hull serve`).
    #[command(subcommand)]
    Templates(templates::TemplatesCommand),
    /// Print the completion script for a shell (`hull completions bash >
    /// /etc/bash_completion.d/hull`).
    Completions(docs::CompletionsArgs),
    /// Print the man page (or write every page into --dir).
    Man(docs::ManArgs),
    /// Internal: apply Landlock and seccomp, then exec (used by `--tier landlock`).
    #[command(name = "__landlock-exec", hide = true)]
    LandlockExec(LandlockExecArgs),
    /// Windows, elevated, once: apply the ACEs a plan needs that only an
    /// administrator can set (`--tier appcontainer|restricted` says when).
    Setup(SetupArgs),
    /// Internal: start a command in an AppContainer or with a restricted token
    /// (the Windows trampoline used by `--tier appcontainer|restricted`).
    #[command(name = "__windows-exec", hide = true)]
    WindowsExec(WindowsExecArgs),
    /// Internal: the policy's egress proxy on its own (serves until stdin
    /// closes).
    #[cfg(unix)]
    #[command(name = "__net-proxy", hide = true)]
    NetProxy(net::NetProxyArgs),
}

#[derive(Debug, Args)]
pub struct SetupArgs {
    /// The plan file the refused run wrote (%LOCALAPPDATA%\hull\elevated-plan.json).
    #[arg(long)]
    pub elevated: PathBuf,
}

#[derive(Debug, Args)]
pub struct WindowsExecArgs {
    /// What to start, JSON (bounded, checked).
    #[arg(long)]
    pub spec: String,
    #[arg(last = true, required = true)]
    pub argv: Vec<std::ffi::OsString>,
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Validate a policy file (or profile name); exit non-zero with file:line: key: message.
    Check { policy: String },
    /// Show what each tier will enforce for a policy.
    Explain(explain::ExplainArgs),
}

#[derive(Debug, Args)]
pub struct LandlockExecArgs {
    /// The descriptor of the sealed memfd holding the plan (JSON).
    #[arg(long)]
    pub plan_fd: i32,
    /// Where to report a setup failure.
    #[arg(long)]
    pub error_fd: Option<i32>,
    #[arg(last = true, required = true)]
    pub argv: Vec<std::ffi::OsString>,
}

/// Where `--project` defaults: the current directory.
pub fn default_project() -> std::io::Result<PathBuf> {
    std::env::current_dir()
}

/// Entry point of the `hull` binary; returns the process exit code.
pub fn main() -> i32 {
    // While hull has one thread (see `size_table`).
    #[cfg(target_os = "linux")]
    crate::exec::fds::size_table(crate::exec::fds::TABLE_SLOTS);
    let cli = Cli::parse();
    init_tracing(cli.verbose, cli.quiet);
    // Nothing hull starts (a command, bwrap, QEMU, virtiofsd) inherits a
    // descriptor from hull's caller. The Landlock helper is hull started by
    // hull: what it holds above 2 was passed on purpose.
    #[cfg(unix)]
    if !matches!(cli.command, Command::LandlockExec(_)) {
        if let Err(e) = crate::exec::fds::cloexec_from(3) {
            eprintln!("hull: error: cannot mark inherited descriptors close-on-exec: {e}");
            return EXIT_HULL_FAILED;
        }
    }
    #[cfg(unix)]
    if prints_only(&cli.command) {
        // SAFETY: signal(2) restoring the default action, before hull
        // starts any thread.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    let result = match cli.command {
        Command::Run(a) => run::run(a),
        Command::Probe(a) => probe::probe(a),
        Command::Canary(a) => canary::canary(a, cli.quiet),
        Command::Compare(a) => compare::compare(a, cli.quiet),
        Command::Serve(a) => serve::serve(a),
        Command::Policy(PolicyCommand::Check { policy }) => explain::check(&policy),
        Command::Policy(PolicyCommand::Explain(a)) => explain::explain(a),
        Command::Runs(c) => runs::runs(c),
        Command::Changes(c) => changes::changes(c),
        Command::Read(a) => read::read(a),
        Command::Image(c) => image::image(c),
        Command::Vm(c) => vm::vm(c),
        Command::Templates(c) => templates::templates(c),
        Command::Batch(a) => batch::batch(a),
        Command::Completions(a) => docs::completions(a),
        Command::Man(a) => docs::man(a),
        Command::LandlockExec(a) => crate::tier::landlock::exec_main(a.plan_fd, a.error_fd, a.argv),
        Command::Setup(a) => {
            crate::tier::windows::elevated::setup_main(&a.elevated).map_err(anyhow::Error::from)
        }
        Command::WindowsExec(a) => {
            crate::tier::windows::exec_main(&a.spec, &a.argv).map_err(anyhow::Error::from)
        }
        #[cfg(unix)]
        Command::NetProxy(a) => net::net_proxy(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            print_error(&e);
            EXIT_HULL_FAILED
        }
    }
}

/// Commands that only read and print: a closed stdout (`hull image list |
/// head -1`) ends them quietly by SIGPIPE, as it ends `ls`, instead of a
/// panic in `println!`. Not the others: they write to sockets (the agent's,
/// QMP) with write(2), where SIGPIPE's default would kill hull without its
/// error and its cleanup.
#[cfg(unix)]
fn prints_only(c: &Command) -> bool {
    matches!(
        c,
        Command::Policy(_)
            | Command::Completions(_)
            | Command::Man(_)
            | Command::Read(_)
            | Command::Runs(runs::RunsCommand::List { .. })
            | Command::Changes(
                changes::ChangesCommand::List { .. }
                    | changes::ChangesCommand::Show { .. }
                    | changes::ChangesCommand::Diff { .. }
            )
            | Command::Image(image::ImageCommand::List | image::ImageCommand::Show { .. })
            | Command::Vm(vm::VmCommand::Status { .. })
            | Command::Templates(templates::TemplatesCommand::List)
    )
}

/// Prints an error and its chain of causes, once.
pub fn print_error(e: &anyhow::Error) {
    eprintln!("hull: error: {}", error_text(e.as_ref()));
}

/// An error and the causes its own text does not already name.
pub fn error_text(e: &(dyn std::error::Error + 'static)) -> String {
    hull_protocol::error_chain_with(e, "\n  caused by: ")
}

fn init_tracing(verbose: u8, quiet: bool) {
    use tracing_subscriber::EnvFilter;
    let level = if quiet {
        "error"
    } else {
        match verbose {
            0 => "warn",
            1 => "info",
            2 => "debug",
            _ => "trace",
        }
    };
    let filter = EnvFilter::try_from_env("HULL_LOG").unwrap_or_else(|_| EnvFilter::new(level));
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
    // Timestamps only when debugging: they show where time goes.
    let _ = if verbose >= 2 {
        b.with_timer(tracing_subscriber::fmt::time::uptime())
            .try_init()
    } else {
        b.without_time().try_init()
    };
}
