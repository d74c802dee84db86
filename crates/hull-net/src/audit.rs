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
    /// What in the policy would allow a refused request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_with: Option<String>,
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
            allow_with: None,
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

    /// Refused, with what in the policy would allow it.
    pub fn refused_with(mut self, why: impl ToString, allow_with: Option<String>) -> Entry {
        self.allow_with = allow_with;
        self.refused(why)
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
    refused: Mutex<BTreeMap<Refused, u64>>,
    /// Tunnels carried now, by number: recorded when they close, or, when
    /// the proxy ends first, by [`Audit::end_open`].
    open: Mutex<BTreeMap<u64, Entry>>,
    next_open: std::sync::atomic::AtomicU64,
}

/// A tunnel [`Audit::opened`] counts as open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenTunnel(u64);

/// A kind of refusal, as the line after the run counts them: where to,
/// why, and what would allow it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Refused {
    to: String,
    reason: String,
    allow_with: Option<String>,
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
            open: Mutex::default(),
            next_open: Default::default(),
        })
    }

    /// Appends to `file`, already open (passed by the run that owns the
    /// proxy's process).
    pub fn to_open_file(file: std::fs::File) -> Audit {
        Audit {
            file: Some(Mutex::new(file)),
            refused: Mutex::default(),
            open: Mutex::default(),
            next_open: Default::default(),
        }
    }

    /// Counts refusals only (tests, and hull's own pulls of an image,
    /// whose refusals go into the error).
    pub fn in_memory() -> Audit {
        Audit {
            file: None,
            refused: Mutex::default(),
            open: Mutex::default(),
            next_open: Default::default(),
        }
    }

    /// Counts the tunnel `e` describes as open until [`Audit::closed`].
    pub fn opened(&self, e: &Entry) -> OpenTunnel {
        let n = self
            .next_open
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Ok(mut open) = self.open.lock() {
            open.insert(n, e.clone());
        }
        OpenTunnel(n)
    }

    /// Records the tunnel's end, once: not when [`Audit::end_open`]
    /// recorded it already.
    pub fn closed(&self, t: OpenTunnel, e: &Entry) {
        let was_open = self
            .open
            .lock()
            .map(|mut open| open.remove(&t.0).is_some())
            .unwrap_or(true);
        if was_open {
            self.record(e);
        }
    }

    /// Records every tunnel still open, as the proxy ends (its owner's run
    /// is over): a tunnel whose far end has not closed yet, after the
    /// command's end closed the near one, is in the audit too.
    pub fn end_open(&self) {
        let open = match self.open.lock() {
            Ok(mut open) => std::mem::take(&mut *open),
            Err(_) => return,
        };
        for (_, mut e) in open {
            e.reason = "open when the proxy ended".into();
            self.record(&e);
        }
    }

    pub fn record(&self, e: &Entry) {
        if !e.allowed {
            if let Ok(mut r) = self.refused.lock() {
                let key = Refused {
                    to: format!("{}:{}", e.host, e.port),
                    reason: e.reason.clone(),
                    allow_with: e.allow_with.clone(),
                };
                *r.entry(key).or_default() += 1;
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

    /// One line per refused `host:port` and reason, by name: `network:
    /// refused HOST:PORT (N times): REASON; to allow it: LINE`, for the
    /// caller to prefix and print.
    pub fn refused_lines(&self) -> Vec<String> {
        let counted = self.refused.lock().map(|r| r.clone()).unwrap_or_default();
        counted
            .into_iter()
            .map(|(r, n)| {
                let mut line = format!(
                    "network: refused {} ({n} time{})",
                    r.to,
                    if n == 1 { "" } else { "s" }
                );
                if !r.reason.is_empty() {
                    line.push_str(": ");
                    line.push_str(&r.reason);
                }
                if let Some(allow) = &r.allow_with {
                    line.push_str("; to allow it: ");
                    line.push_str(allow);
                }
                line
            })
            .collect()
    }

    /// The refused lines ([`Audit::refused_lines`]) of the entries
    /// appended to the audit file at `path` after its first `offset`
    /// bytes (a kept VM's proxy serves many runs: each run reports what
    /// was refused while it ran). Reads at most 16 MiB; a line that is not
    /// an entry is skipped.
    pub fn refused_since(path: &Path, offset: u64) -> Vec<String> {
        use std::io::{Read, Seek};
        let mut text = String::new();
        let read = std::fs::File::open(path).and_then(|mut f| {
            f.seek(std::io::SeekFrom::Start(offset))?;
            f.take(16 << 20).read_to_string(&mut text)
        });
        if read.is_err() {
            return Vec::new();
        }
        let counted = Audit::in_memory();
        for line in text.lines() {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            if v["allowed"] == serde_json::Value::Bool(false) {
                let (Some(host), Some(port)) = (v["host"].as_str(), v["port"].as_u64()) else {
                    continue;
                };
                let e = Entry::new("", host, port.min(u64::from(u16::MAX)) as u16).refused_with(
                    v["reason"].as_str().unwrap_or_default(),
                    v["allow_with"].as_str().map(str::to_string),
                );
                counted.record(&e);
            }
        }
        counted.refused_lines()
    }

    /// Refused `host:port`s with their counts, by name.
    pub fn refused(&self) -> Vec<(String, u64)> {
        let mut by_to = BTreeMap::<String, u64>::new();
        if let Ok(r) = self.refused.lock() {
            for (k, n) in r.iter() {
                *by_to.entry(k.to.clone()).or_default() += n;
            }
        }
        by_to.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tunnel still open when the proxy ends (its far end had not closed
    /// after the command's end closed the near one) is in the audit, once;
    /// one that closed is recorded by its close only.
    #[test]
    fn tunnels_open_at_the_end_are_recorded_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE);
        let audit = Audit::to_file(&path).unwrap();
        let mut e = Entry::new("connect", "index.example", 443);
        e.allowed = true;
        let closed = audit.opened(&e);
        let left = audit.opened(&Entry {
            host: "static.example".into(),
            ..e.clone()
        });
        let mut done = e.clone();
        done.reason = "tunnel closed".into();
        audit.closed(closed, &done);
        let lines = || std::fs::read_to_string(&path).unwrap();
        assert_eq!(lines().lines().count(), 1);
        audit.end_open();
        let text = lines();
        assert_eq!(text.lines().count(), 2, "{text}");
        let last: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
        assert_eq!(last["host"], "static.example");
        assert_eq!(last["allowed"], true);
        assert_eq!(last["reason"], "open when the proxy ended");
        // Its late close records nothing more.
        audit.closed(left, &done);
        audit.end_open();
        assert_eq!(lines().lines().count(), 2);
    }

    /// What a kept VM's run reports: the refusals appended after its
    /// offset, counted by host and port; allowed entries, earlier entries
    /// and lines that are not entries are not.
    #[test]
    fn refusals_since_an_offset_are_counted_by_host() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE);
        let audit = Audit::to_file(&path).unwrap();
        audit.record(&Entry::new("http", "early.example", 80).refused("not allowed"));
        let offset = std::fs::metadata(&path).unwrap().len();
        audit.record(&Entry::new("http", "other.example", 80).refused("not allowed"));
        audit.record(&Entry::new("connect", "other.example", 80).refused("not allowed"));
        let mut ok = Entry::new("http", "pkgs.example", 443);
        ok.allowed = true;
        audit.record(&ok);
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"not json\n{\"allowed\":false}\n")
            .unwrap();
        assert_eq!(
            Audit::refused_since(&path, offset),
            vec!["network: refused other.example:80 (2 times): not allowed".to_string()]
        );
        assert_eq!(Audit::refused_since(&path, 0).len(), 2);
        assert!(Audit::refused_since(&dir.path().join("none"), 0).is_empty());
    }
}
