//! The session API's messages, as they cross the socket: requests refuse
//! unknown fields; every size a client names is bounded here.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The largest request body (a file written, an exec's stdin): 64 MiB.
pub const MAX_BODY: usize = 64 << 20;
/// The largest output kept of one stream of an exec (and of a file read).
pub const MAX_OUTPUT: u64 = 64 << 20;
/// What an exec keeps of each stream when it names no `max_output`.
pub const DEFAULT_OUTPUT: u64 = 1 << 20;
/// The most arguments, environment entries and sessions a caller may have.
pub const MAX_ARGS: usize = 4096;
pub const MAX_ENV: usize = 1024;
pub const MAX_SESSIONS: usize = 64;

/// The API's operations: method and path pattern, as `docs/openapi.json`
/// names them (a test holds the two together).
pub const ROUTES: &[(&str, &str)] = &[
    ("GET", "/v1/openapi.json"),
    ("GET", "/v1/sessions"),
    ("POST", "/v1/sessions"),
    ("GET", "/v1/sessions/{id}"),
    ("DELETE", "/v1/sessions/{id}"),
    ("POST", "/v1/sessions/{id}/exec"),
    ("GET", "/v1/sessions/{id}/files"),
    ("PUT", "/v1/sessions/{id}/files"),
    ("GET", "/v1/sessions/{id}/changes"),
    ("POST", "/v1/sessions/{id}/template"),
];

/// The OpenAPI document the server serves (`GET /v1/openapi.json`).
pub const OPENAPI: &str = include_str!("../../../docs/openapi.json");

/// Where a session's commands write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Workspace {
    /// Into the project, as `hull run` does (a session's default).
    Shared,
    /// Into a change set of the session's own, every exec seeing the
    /// project as it was plus the session's earlier writes (`hull run
    /// --cow`, then `--cow-continue`), the project untouched.
    Cow,
    /// Into a copy of the project (or an empty directory) that hull makes
    /// for the session and removes at its end; its git metadata is the
    /// command's (`fs.git = "writable"`), as nobody uses git there on the
    /// host.
    Copy,
}

/// `POST /v1/sessions`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateSession {
    /// landlock, bwrap, vm.
    pub tier: String,
    /// A shipped profile name or a policy file (default: `default`).
    #[serde(default = "default_policy")]
    pub policy: String,
    /// The project directory (absolute); with `copy`, what the session's
    /// workspace is filled from (none: it starts empty).
    #[serde(default)]
    pub project: Option<PathBuf>,
    #[serde(default = "shared")]
    pub workspace: Workspace,
    /// Tier vm: the container image whose layers are the session's
    /// userland (`oci-archive:PATH`, `docker-archive:PATH`,
    /// `oci:DIR[:TAG]`), instead of the policy's.
    #[serde(default)]
    pub image: Option<String>,
    /// A template of the caller's to start from (landlock, bwrap): the
    /// session's workspace is a copy-on-write layer over the template's;
    /// its tier, policy and image must be the template's.
    #[serde(default)]
    pub from: Option<String>,
}

/// `POST /v1/sessions/{id}/template`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MakeTemplate {
    pub name: String,
}

fn default_policy() -> String {
    "default".into()
}

fn shared() -> Workspace {
    Workspace::Shared
}

/// A session, as the API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct SessionInfo {
    pub id: String,
    pub tier: String,
    pub policy: String,
    /// Where the commands work: the project, or a `copy` session's own
    /// copy of it.
    pub project: PathBuf,
    pub workspace: Workspace,
    /// A `copy` session's: the project its workspace was filled from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<PathBuf>,
    /// Where `files` takes a relative path from (the project).
    pub roots: Vec<PathBuf>,
    /// The container image that is its userland (tier vm), if one is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

/// `GET /v1/sessions/{id}/changes`: a copy-on-write session's change set
/// (none before its first exec), as `hull changes show --json` lists it.
#[derive(Debug, Clone, Serialize)]
pub struct SessionChanges {
    pub id: Option<String>,
    pub counts: Option<serde_json::Value>,
    pub changes: Vec<serde_json::Value>,
}

/// `POST /v1/sessions/{id}/exec`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    pub argv: Vec<String>,
    /// The directory the command starts in: relative to the project, or
    /// absolute (the sandbox decides what it may read there).
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Given to the command on its stdin (none: empty).
    #[serde(default)]
    pub stdin: Option<String>,
    /// The same as bytes, in base64 (not with `stdin`).
    #[serde(default)]
    pub stdin_base64: Option<String>,
    /// Wall-time limit (`30s`, `10m`; default: the policy's).
    #[serde(default)]
    pub timeout: Option<String>,
    /// Bytes kept of each of stdout and stderr (default 1 MiB, at most
    /// 64 MiB); the rest is counted, not kept.
    #[serde(default)]
    pub max_output: Option<u64>,
    /// Stream the output as it comes (`application/x-ndjson`).
    #[serde(default)]
    pub stream: bool,
    /// Tier vm: the container's user to run as, by name (`root`
    /// included; default: the session's uid 1000). The process tiers run
    /// every command as the session's own user and refuse this.
    #[serde(default)]
    pub user: Option<String>,
}

/// How an exec ended: the body of a collected exec, and the last line of
/// a streamed one (`"event": "exit"`, without the output).
#[derive(Debug, Clone, Serialize)]
pub struct ExecResult {
    /// `exit`, `signal`, `timeout`, `hull_error`.
    pub status: crate::batch::Status,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdout: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stderr: Option<String>,
    /// Bytes each stream had, kept or not.
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    pub truncated: bool,
    pub wall_s: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// hull's word on a failure it can explain (a write to the protected
    /// `.git` refused, and the policy key that allows it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

/// An error's body.
#[derive(Debug, Clone, Serialize)]
pub struct Error {
    pub error: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The document names exactly the operations the server routes.
    #[test]
    fn the_openapi_document_names_every_route_and_no_other() {
        let doc: serde_json::Value = serde_json::from_str(OPENAPI).unwrap();
        let mut documented = Vec::new();
        for (path, ops) in doc["paths"].as_object().unwrap() {
            for method in ops.as_object().unwrap().keys() {
                if method != "parameters" {
                    documented.push((method.to_uppercase(), path.clone()));
                }
            }
        }
        documented.sort();
        let mut routed: Vec<(String, String)> = ROUTES
            .iter()
            .map(|(m, p)| (m.to_string(), p.to_string()))
            .collect();
        routed.sort();
        assert_eq!(documented, routed);
        // The request schemas name the fields the server accepts.
        let exec = &doc["components"]["schemas"]["Exec"]["properties"];
        for f in [
            "argv",
            "cwd",
            "env",
            "stdin",
            "stdin_base64",
            "timeout",
            "max_output",
            "stream",
            "user",
        ] {
            assert!(exec.get(f).is_some(), "{f}");
        }
        assert_eq!(exec.as_object().unwrap().len(), 9);
        let create = &doc["components"]["schemas"]["CreateSession"]["properties"];
        for f in ["tier", "policy", "project", "workspace", "image", "from"] {
            assert!(create.get(f).is_some(), "{f}");
        }
        assert_eq!(create.as_object().unwrap().len(), 6);
    }
}
