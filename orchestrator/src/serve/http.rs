//! HTTP/1.1 on the server's socket: routes ([`super::api::ROUTES`]),
//! bodies bounded before they are read whole, JSON errors with the status
//! that says who erred (4xx: the request; 5xx: hull).

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode};

use super::api::{self, CreateSession, ExecRequest};
use super::sessions::{Refusal, Sessions};

pub type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

fn full(status: u16, content_type: &str, bytes: Vec<u8>) -> Response<Body> {
    Response::builder()
        .status(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header("content-type", content_type)
        .body(Full::new(Bytes::from(bytes)).boxed())
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed()))
}

fn json<T: serde::Serialize>(status: u16, v: &T) -> Response<Body> {
    full(
        status,
        "application/json",
        serde_json::to_vec(v).unwrap_or_default(),
    )
}

fn refused(r: &Refusal) -> Response<Body> {
    json(
        r.status,
        &api::Error {
            error: r.message.clone(),
        },
    )
}

/// The whole body, at most [`api::MAX_BODY`] bytes: 413 beyond.
async fn body(req: Request<Incoming>) -> Result<Bytes, Refusal> {
    let too_big = || {
        Refusal::new(
            413,
            format!("the request body is larger than {} bytes", api::MAX_BODY),
        )
    };
    if req
        .headers()
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|n| n > api::MAX_BODY as u64)
    {
        return Err(too_big());
    }
    Limited::new(req.into_body(), api::MAX_BODY)
        .collect()
        .await
        .map(|c| c.to_bytes())
        .map_err(|_| too_big())
}

/// A JSON request body as `T`: 400 naming what is wrong (bad JSON, an
/// unknown or missing field).
async fn parse<T: serde::de::DeserializeOwned>(req: Request<Incoming>) -> Result<T, Refusal> {
    let b = body(req).await?;
    serde_json::from_slice(&b).map_err(|e| Refusal::new(400, format!("the request body: {e}")))
}

/// The query parameter `name`, percent-decoded.
fn query(req: &Request<Incoming>, name: &str) -> Option<String> {
    req.uri().query()?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        (k == name).then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(v) => {
                        out.push(v);
                        i += 3;
                    }
                    None => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Answers one request from `caller` (the peer's uid).
pub async fn handle(
    req: Request<Incoming>,
    sessions: Arc<Sessions>,
    caller: u32,
) -> Result<Response<Body>, Infallible> {
    Ok(match route(req, &sessions, caller).await {
        Ok(r) => r,
        Err(r) => refused(&r),
    })
}

async fn route(
    req: Request<Incoming>,
    sessions: &Arc<Sessions>,
    caller: u32,
) -> Result<Response<Body>, Refusal> {
    let path = req.uri().path().to_string();
    let parts: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    let method = req.method().clone();
    match (parts.as_slice(), &method) {
        (["", "v1", "openapi.json"], &Method::GET) => Ok(full(
            200,
            "application/json",
            api::OPENAPI.as_bytes().to_vec(),
        )),
        (["", "v1", "sessions"], &Method::GET) => Ok(json(200, &sessions.list(caller).await)),
        (["", "v1", "sessions"], &Method::POST) => {
            let create: CreateSession = parse(req).await?;
            Ok(json(201, &sessions.create(caller, create).await?))
        }
        (["", "v1", "sessions", id], &Method::GET) => {
            Ok(json(200, &sessions.get(caller, id).await?.info))
        }
        (["", "v1", "sessions", id], &Method::DELETE) => {
            sessions.close(caller, id).await?;
            Ok(full(204, "application/json", Vec::new()))
        }
        (["", "v1", "sessions", id, "exec"], &Method::POST) => {
            let s = sessions.get(caller, id).await?;
            let exec: ExecRequest = parse(req).await?;
            let stdin = stdin_of(&exec)?;
            if exec.stream {
                return Ok(stream(Arc::clone(sessions), s, exec, stdin));
            }
            let r = sessions.exec(&s, &exec, stdin, true, &|_, _| {}).await?;
            Ok(json(200, &r))
        }
        (["", "v1", "sessions", id, "template"], &Method::POST) => {
            let s = sessions.get(caller, id).await?;
            let make: api::MakeTemplate = parse(req).await?;
            Ok(json(201, &sessions.template(caller, &s, &make.name).await?))
        }
        (["", "v1", "sessions", id, "changes"], &Method::GET) => {
            let s = sessions.get(caller, id).await?;
            Ok(json(200, &s.changes().await?))
        }
        (["", "v1", "sessions", id, "files"], &Method::GET) => {
            let s = sessions.get(caller, id).await?;
            let file = query(&req, "path").ok_or_else(|| Refusal::new(400, "path: missing"))?;
            let max = match query(&req, "max_bytes") {
                Some(m) => m
                    .parse::<u64>()
                    .ok()
                    .filter(|m| *m <= api::MAX_OUTPUT)
                    .ok_or_else(|| {
                        Refusal::new(400, format!("max_bytes: at most {}", api::MAX_OUTPUT))
                    })?,
                None => api::MAX_OUTPUT,
            };
            let data = sessions.read_file(&s, &file, max).await?;
            Ok(full(200, "application/octet-stream", data))
        }
        (["", "v1", "sessions", id, "files"], &Method::PUT) => {
            let s = sessions.get(caller, id).await?;
            let file = query(&req, "path").ok_or_else(|| Refusal::new(400, "path: missing"))?;
            let data = body(req).await?;
            sessions.write_file(&s, &file, data.to_vec()).await?;
            Ok(full(204, "application/json", Vec::new()))
        }
        _ => {
            let known = api::ROUTES
                .iter()
                .any(|(_, pattern)| matches(pattern, &parts));
            Err(if known {
                Refusal::new(405, format!("{method} is not allowed on {path}"))
            } else {
                Refusal::new(404, format!("no such resource: {path}"))
            })
        }
    }
}

/// An exec's stdin: `stdin`'s text or `stdin_base64`'s bytes (not both).
fn stdin_of(exec: &ExecRequest) -> Result<Option<Vec<u8>>, Refusal> {
    use base64::Engine;
    match (&exec.stdin, &exec.stdin_base64) {
        (Some(_), Some(_)) => Err(Refusal::new(400, "stdin and stdin_base64: give one")),
        (Some(t), None) => Ok(Some(t.clone().into_bytes())),
        (None, Some(b)) => base64::engine::general_purpose::STANDARD
            .decode(b)
            .map(Some)
            .map_err(|e| Refusal::new(400, format!("stdin_base64: {e}"))),
        (None, None) => Ok(None),
    }
}

/// Whether `parts` (a path split at `/`) fits `pattern`'s (`{id}` fits
/// any one part).
fn matches(pattern: &str, parts: &[&str]) -> bool {
    let p: Vec<&str> = pattern.split('/').collect();
    p.len() == parts.len()
        && p.iter()
            .zip(parts)
            .all(|(a, b)| (a.starts_with('{') && !b.is_empty()) || a == b)
}

/// A streamed exec: one JSON line per piece of output (`{"event":
/// "stdout"|"stderr", "data": BASE64}`), then `{"event": "exit", ...}`.
fn stream(
    sessions: Arc<Sessions>,
    s: Arc<super::sessions::Session>,
    exec: ExecRequest,
    stdin: Option<Vec<u8>>,
) -> Response<Body> {
    use base64::Engine;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Bytes>();
    tokio::spawn(async move {
        let line = |v: serde_json::Value| {
            let mut b = serde_json::to_vec(&v).unwrap_or_default();
            b.push(b'\n');
            Bytes::from(b)
        };
        let sender = tx.clone();
        let on_chunk = move |stream: u8, b: &[u8]| {
            let event = if stream == 1 { "stdout" } else { "stderr" };
            let data = base64::engine::general_purpose::STANDARD.encode(b);
            let _ = sender.send(line(serde_json::json!({"event": event, "data": data})));
        };
        let end = match sessions.exec(&s, &exec, stdin, false, &on_chunk).await {
            Ok(r) => {
                let mut v = serde_json::to_value(&r).unwrap_or_default();
                v["event"] = "exit".into();
                v
            }
            Err(r) => serde_json::json!({"event": "error", "status": r.status, "error": r.message}),
        };
        let _ = tx.send(line(end));
    });
    Response::builder()
        .status(200)
        .header("content-type", "application/x-ndjson")
        .body(Lines(rx).boxed())
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed()))
}

/// A streamed body: the channel's pieces, each one frame, until the
/// sender is gone.
struct Lines(tokio::sync::mpsc::UnboundedReceiver<Bytes>);

impl hyper::body::Body for Lines {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_decoded_and_routes_matched() {
        assert_eq!(percent_decode("a%2Fb%20c+d"), "a/b c d");
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz"), "%zz");
        assert!(matches(
            "/v1/sessions/{id}/exec",
            &["", "v1", "sessions", "x", "exec"]
        ));
        assert!(!matches("/v1/sessions/{id}", &["", "v1", "sessions", ""]));
        assert!(!matches("/v1/sessions", &["", "v1", "sessions", "x"]));
    }
}
