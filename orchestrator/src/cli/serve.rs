//! `hull serve [--socket PATH]`: argument parsing only (see
//! [`crate::serve`]).

use std::path::PathBuf;

use clap::Args;

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The unix socket to listen on (its directory made 0700, or one of
    /// yours that only you can enter). Default:
    /// `$XDG_RUNTIME_DIR/hull/serve.sock`, else `TMPDIR/hull-serve-UID/serve.sock`.
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
}

#[cfg(target_os = "linux")]
pub fn serve(a: ServeArgs) -> anyhow::Result<i32> {
    let socket = a.socket.unwrap_or_else(crate::serve::default_socket);
    let socket = std::path::absolute(&socket).unwrap_or(socket);
    crate::serve::serve(&socket)?;
    Ok(0)
}

#[cfg(not(target_os = "linux"))]
pub fn serve(_a: ServeArgs) -> anyhow::Result<i32> {
    anyhow::bail!("hull serve runs on Linux for now")
}
