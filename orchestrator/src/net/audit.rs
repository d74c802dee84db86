//! The proxy's record of every decision: one JSON line per request in the
//! instance's spill (`net-audit.jsonl`), and a count of refusals per host
//! for the line hull prints at the end of the run.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use serde::Serialize;

/// The audit file's name in the spill.
pub const FILE: &str = "net-audit.jsonl";

/// One decision of the proxy.
#[derive(Debug, Clone, Serialize)]
pub struct Entry {
    /// Seconds since the epoch.
    pub time: f64,
    /// `connect` (a CONNECT tunnel), `http` (a plain HTTP request) or
    /// `socks` (a SOCKS5 tunnel).
    pub kind: &'static str,
    /// The host as the command asked for it.
    pub host: String,
    pub port: u16,
    /// The address hull connected to (or refused).
    pub addr: Option<SocketAddr>,
    pub allowed: bool,
    /// Why it was refused, or how the exchange ended.
    pub reason: String,
    /// Bytes from the command to the destination and back.
    pub sent: u64,
    pub received: u64,
    pub duration: f64,
}

impl Entry {
    pub fn new(kind: &'static str, host: &str, port: u16) -> Entry {
        Entry {
            time: SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0),
            kind,
            host: host.to_string(),
            port,
            addr: None,
            allowed: false,
            reason: String::new(),
            sent: 0,
            received: 0,
            duration: 0.0,
        }
    }

    pub fn refused(mut self, why: impl ToString) -> Entry {
        self.allowed = false;
        self.reason = why.to_string();
        self
    }

    pub fn took(mut self, d: Duration) -> Entry {
        self.duration = d.as_secs_f64();
        self
    }
}

/// Where entries go.
#[derive(Debug)]
pub struct Audit {
    file: Option<Mutex<std::fs::File>>,
    refused: Mutex<BTreeMap<String, u64>>,
}

impl Audit {
    /// Appends to `path` (created 0600, never through a link).
    pub fn to_file(path: &Path) -> std::io::Result<Audit> {
        use std::os::unix::fs::OpenOptionsExt;
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)?;
        Ok(Audit {
            file: Some(Mutex::new(f)),
            refused: Mutex::default(),
        })
    }

    /// Appends to `file`, already open (passed by the run that owns the
    /// proxy's process).
    pub fn to_open_file(file: std::fs::File) -> Audit {
        Audit {
            file: Some(Mutex::new(file)),
            refused: Mutex::default(),
        }
    }

    /// Counts refusals only (tests).
    pub fn in_memory() -> Audit {
        Audit {
            file: None,
            refused: Mutex::default(),
        }
    }

    pub fn record(&self, e: &Entry) {
        if !e.allowed {
            if let Ok(mut r) = self.refused.lock() {
                *r.entry(format!("{}:{}", e.host, e.port)).or_default() += 1;
            }
        }
        if let Some(f) = &self.file {
            if let (Ok(mut line), Ok(mut f)) = (serde_json::to_vec(e), f.lock()) {
                line.push(b'\n');
                if let Err(err) = f.write_all(&line) {
                    tracing::warn!("cannot write the network audit: {err}");
                }
            }
        }
    }

    /// One line per refused `host:port`, by name: `network: refused
    /// HOST:PORT (N times)`, for the caller to prefix and print.
    pub fn refused_lines(&self) -> Vec<String> {
        self.refused()
            .into_iter()
            .map(|(host, n)| {
                format!(
                    "network: refused {host} ({n} time{})",
                    if n == 1 { "" } else { "s" }
                )
            })
            .collect()
    }

    /// Refused `host:port`s with their counts, by name.
    pub fn refused(&self) -> Vec<(String, u64)> {
        self.refused
            .lock()
            .map(|r| r.iter().map(|(k, v)| (k.clone(), *v)).collect())
            .unwrap_or_default()
    }
}
