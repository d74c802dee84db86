//! Bounds on every variable-sized field that crosses the wire.
//!
//! Both sides enforce them: the encoder refuses to send a message that breaks
//! one and the decoder rejects it, so a hostile peer cannot make the other side
//! hold more than these sizes per message.

/// Most entries in `Exec.argv`.
pub const MAX_ARGS: usize = 4096;
/// Most bytes in all of `Exec.argv` together: Linux's own `ARG_MAX`
/// (2 MiB, for the arguments and the environment together; the guest's
/// `execve` refuses more, as the host's would).
pub const MAX_ARGV_BYTES: usize = 2 * 1024 * 1024;
/// Most entries in `Exec.env`.
pub const MAX_ENV: usize = 4096;
/// Most bytes in all of `Exec.env` (keys plus values) together: `ARG_MAX`
/// as for the arguments.
pub const MAX_ENV_BYTES: usize = 2 * 1024 * 1024;
/// Longest path (`Exec.cwd`, share paths).
pub const MAX_PATH: usize = 4096;
/// Most directories in `Exec.scrub`.
pub const MAX_SCRUB: usize = 8;
/// Longest `Exec.user` name (Linux's `LOGIN_NAME_MAX` less its NUL).
pub const MAX_USER: usize = 255;
/// Longest `Hello.software` string.
pub const MAX_SOFTWARE: usize = 256;
/// Longest error message; longer messages are truncated when encoded.
pub const MAX_ERROR_MESSAGE: usize = 4096;
/// Longest `Exec.timeout_ms` (30 days): keeps deadline arithmetic finite.
pub const MAX_TIMEOUT_MS: u64 = 30 * 24 * 3600 * 1000;
/// Most shares in one `Configure`.
pub const MAX_SHARES: usize = 64;
/// Longest name (container, base image, share tag).
pub const MAX_NAME: usize = 63;
/// Stdin flow-control window: the most stdin bytes of one exec the host may
/// have sent that the agent has not yet acknowledged with `StdinAck`.
pub const STDIN_WINDOW: u64 = 4 * 1024 * 1024;
/// Highest signal number accepted in `Signal` and reported in `Exit`.
pub const MAX_SIGNAL: i32 = 64;

/// Highest peak memory a `Usage` may report: 1 TiB, beyond any tier-3
/// guest (a larger figure is a broken or hostile guest's).
pub const MAX_PEAK_MEMORY: u64 = 1 << 40;
