//! `hull serve`: the session API (docs/api.md) on a unix socket owned by
//! the caller, mode 0600, in a directory of the caller's (0700); no TCP.
//! Harnesses open a session (tier, policy, project), run commands in it,
//! read and write its files, and close it; [`sessions`] keeps them,
//! [`http`] speaks HTTP/1.1, [`api`] is what crosses the socket.
//!
//! Every connection's peer credentials (`SO_PEERCRED`) name its caller: a
//! session is its maker's, and another uid (root included) is told it does
//! not exist. SIGINT or SIGTERM closes every session (a tier-3 session's
//! VM is stopped) and removes the socket.

mod admission;
pub mod api;
mod http;
mod leader;
pub mod sessions;
mod workspace;

use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("hull serve: {path}: {what}; choose another --socket")]
    Unsafe { path: PathBuf, what: String },
    #[error("hull serve: {what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("hull serve: another server answers on {0}")]
    InUse(PathBuf),
}

/// The socket's default place: `$XDG_RUNTIME_DIR/hull/serve.sock`, else
/// `TMPDIR/hull-serve-UID/serve.sock`.
pub fn default_socket() -> PathBuf {
    let uid = rustix::process::geteuid().as_raw();
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()) {
        Some(d) => PathBuf::from(d).join("hull").join("serve.sock"),
        None => std::env::temp_dir()
            .join(format!("hull-serve-{uid}"))
            .join("serve.sock"),
    }
}

/// Makes `dir` (0700) or checks the one there: a directory of the caller's
/// that no one else can enter or write, not a link.
fn own_dir(dir: &Path) -> Result<(), ServeError> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(source) => {
            return Err(ServeError::Io {
                what: "cannot create",
                path: dir.to_path_buf(),
                source,
            })
        }
    }
    let m = std::fs::symlink_metadata(dir).map_err(|source| ServeError::Io {
        what: "cannot inspect",
        path: dir.to_path_buf(),
        source,
    })?;
    let me = rustix::process::geteuid().as_raw();
    let unsafe_because = if !m.is_dir() {
        Some("not a directory (a link?)".to_string())
    } else if m.uid() != me {
        Some(format!("owned by uid {}, not {me}", m.uid()))
    } else if m.permissions().mode() & 0o077 != 0 {
        Some(format!(
            "mode {:o}: others may enter it",
            m.permissions().mode() & 0o777
        ))
    } else {
        None
    };
    match unsafe_because {
        Some(what) => Err(ServeError::Unsafe {
            path: dir.to_path_buf(),
            what,
        }),
        None => Ok(()),
    }
}

/// Serves the API on `socket` until SIGINT or SIGTERM.
pub fn serve(socket: &Path) -> Result<(), ServeError> {
    let dir = socket.parent().unwrap_or(Path::new("/"));
    own_dir(dir)?;
    if std::os::unix::net::UnixStream::connect(socket).is_ok() {
        return Err(ServeError::InUse(socket.to_path_buf()));
    }
    // A socket left by a server that is gone.
    if std::fs::symlink_metadata(socket).is_ok_and(|m| m.file_type().is_socket()) {
        let _ = std::fs::remove_file(socket);
    }
    let hull = std::env::current_exe().map_err(|source| ServeError::Io {
        what: "cannot find",
        path: "/proc/self/exe".into(),
        source,
    })?;
    let work = dir.join(format!("work-{}", std::process::id()));
    own_dir(&work)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|source| ServeError::Io {
            what: "cannot start the runtime for",
            path: socket.to_path_buf(),
            source,
        })?;
    let sessions = Arc::new(sessions::Sessions::new(hull, work.clone()));
    let r = rt.block_on(run(socket, Arc::clone(&sessions)));
    let _ = std::fs::remove_file(socket);
    let _ = std::fs::remove_dir_all(&work);
    r
}

async fn run(socket: &Path, sessions: Arc<sessions::Sessions>) -> Result<(), ServeError> {
    let listener = tokio::net::UnixListener::bind(socket).map_err(|source| ServeError::Io {
        what: "cannot listen on",
        path: socket.to_path_buf(),
        source,
    })?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600)).map_err(|source| {
        ServeError::Io {
            what: "cannot set the mode of",
            path: socket.to_path_buf(),
            source,
        }
    })?;
    eprintln!("hull serve: listening on {}", socket.display());
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|source| ServeError::Io {
            what: "cannot watch signals for",
            path: socket.to_path_buf(),
            source,
        })?;
    let admitted = admission::Admitted::new(rustix::process::geteuid().as_raw());
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else {
                    // Out of descriptors (EMFILE) or the like: not a spin.
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    continue;
                };
                let Ok(cred) = stream.peer_cred() else { continue };
                let caller = cred.uid();
                // Over its uid's share: closed at once, unread.
                let Some(ticket) = admission::admit(&admitted, caller) else { continue };
                let sessions = Arc::clone(&sessions);
                tokio::spawn(async move {
                    let _ticket = ticket;
                    let svc = hyper::service::service_fn(move |req| {
                        http::handle(req, Arc::clone(&sessions), caller)
                    });
                    let conn = hyper::server::conn::http1::Builder::new()
                        .max_buf_size(64 * 1024)
                        .timer(hyper_util::rt::TokioTimer::new())
                        // Also the longest a kept-alive connection idles.
                        .header_read_timeout(admission::HEADER_TIMEOUT)
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc);
                    if let Err(e) = conn.await {
                        tracing::debug!("hull serve: connection: {e}");
                    }
                });
            }
            _ = tokio::signal::ctrl_c() => break,
            _ = term.recv() => break,
        }
    }
    eprintln!("hull serve: stopping; closing every session");
    sessions.close_all().await;
    Ok(())
}
