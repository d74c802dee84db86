//! hull's egress proxy: HTTP `CONNECT` for TLS and absolute-URI plain HTTP
//! (and SOCKS5 on the same port, [`super::socks`]), to the names the policy
//! allows and nothing else.
//!
//! For each request: the policy's check of the name and port (deny, allow,
//! ports); for `CONNECT`, a `200` and then the ClientHello, whose server
//! name must be the `CONNECT` host before anything is connected; then hull
//! resolves the name itself (or takes it from `hosts`), refuses addresses
//! that reach inside unless `allow_private` covers them, and connects to the
//! address it checked: no second resolution. A refusal before the tunnel is
//! a `403` with `X-Hull-Refused`; after the `200` (a ClientHello naming
//! another host) the connection is closed. Every decision is an
//! [`audit::Entry`](super::audit::Entry).

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::audit::{Audit, Entry};
use super::sni::{self, Hello};
use crate::policy::net::{normalise_name, Host, NetPolicy, Refusal};

/// How long the command may take to send its ClientHello, and hull to
/// connect to a destination.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

type Body = BoxBody<Bytes, hyper::Error>;

/// Why a request did not reach its destination.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error("{0}")]
    BadRequest(&'static str),
    #[error("the Host header {header:?} is not the request's host {host:?}")]
    HostMismatch { header: String, host: String },
    #[error("the TLS ClientHello names {sni:?}, not the CONNECT host {host}")]
    SniMismatch { sni: String, host: Host },
    #[error("the TLS ClientHello: {0}")]
    Hello(#[source] sni::SniError),
    #[error("no ClientHello within {HELLO_TIMEOUT:?}")]
    HelloTimeout,
    #[error("cannot resolve {host}: {source}")]
    Resolve {
        host: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{host} resolves to no address")]
    NoAddress { host: String },
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("the upstream exchange failed: {0}")]
    Upstream(#[source] hyper::Error),
    #[error("the tunnel failed: {0}")]
    Tunnel(#[source] std::io::Error),
}

impl ProxyError {
    /// A refusal by policy (403) rather than a failure to reach (502).
    fn is_refusal(&self) -> bool {
        matches!(
            self,
            ProxyError::Refused(_)
                | ProxyError::HostMismatch { .. }
                | ProxyError::SniMismatch { .. }
                | ProxyError::Hello(_)
        )
    }

    /// What in the policy would allow the request (only a refusal by
    /// policy has one).
    fn allow_with(&self, port: u16) -> Option<String> {
        match self {
            ProxyError::Refused(r) => r.allow_with(port),
            _ => None,
        }
    }
}

/// `entry` refused by `e`, with what in the policy would allow it.
pub(super) fn refused(entry: Entry, e: &ProxyError) -> Entry {
    let allow = e.allow_with(entry.port);
    entry.refused_with(e, allow)
}

/// What every connection of the proxy shares.
#[derive(Debug)]
pub struct Shared {
    pub policy: NetPolicy,
    pub audit: Audit,
    /// A key every request must carry (`Proxy-Authorization: Basic` of
    /// `hull:KEY`; SOCKS refused), for a proxy on a port other processes
    /// of the host could reach: hull's own pull of an image, whose policy
    /// is not theirs. None: the listener itself is the command's only.
    pub key: Option<String>,
}

impl Shared {
    /// The `Proxy-Authorization` value `key` asks for.
    pub fn authorization(key: &str) -> String {
        use base64::Engine as _;
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("hull:{key}"))
        )
    }

    /// Whether `req` carries the key (always, when there is none).
    fn admits<B>(&self, req: &Request<B>) -> bool {
        let Some(key) = &self.key else {
            return true;
        };
        let want = Shared::authorization(key);
        let got = req
            .headers()
            .get(hyper::header::PROXY_AUTHORIZATION)
            .map(|v| v.as_bytes())
            .unwrap_or_default();
        // Compared whole, in time that does not depend on where they differ.
        got.len() == want.len()
            && got
                .iter()
                .zip(want.as_bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    }
}

/// Serves one client connection: SOCKS5 when its first byte says so
/// ([`super::socks`]), otherwise HTTP/1.1 with upgrades for `CONNECT`.
pub async fn serve_connection<S>(mut io: S, shared: Arc<Shared>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let first = match io.read_u8().await {
        Ok(b) => b,
        Err(_) => return,
    };
    if first == super::socks::VERSION {
        // SOCKS carries no key: a keyed proxy speaks HTTP only.
        if shared.key.is_some() {
            return;
        }
        return super::socks::serve(io, shared).await;
    }
    serve_http(Prefixed::new(first, io), shared).await
}

async fn serve_http<S>(io: S, shared: Arc<Shared>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |req| handle(req, Arc::clone(&shared)));
    let conn = hyper::server::conn::http1::Builder::new()
        .max_buf_size(64 * 1024)
        .serve_connection(TokioIo::new(io), svc)
        .with_upgrades();
    if let Err(e) = conn.await {
        tracing::debug!("proxy connection: {e}");
    }
}

/// A stream whose first byte was already read: it reads that byte again
/// first, then the stream.
struct Prefixed<S> {
    first: Option<u8>,
    inner: S,
}

impl<S> Prefixed<S> {
    fn new(first: u8, inner: S) -> Prefixed<S> {
        Prefixed {
            first: Some(first),
            inner,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if buf.remaining() > 0 {
            if let Some(b) = self.first.take() {
                buf.put_slice(&[b]);
                return std::task::Poll::Ready(Ok(()));
            }
        }
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

async fn handle(req: Request<Incoming>, shared: Arc<Shared>) -> Result<Response<Body>, Infallible> {
    let started = Instant::now();
    if !shared.admits(&req) {
        let mut r = Response::new(full("hull: this proxy serves hull's own pull only\n"));
        *r.status_mut() = StatusCode::PROXY_AUTHENTICATION_REQUIRED;
        return Ok(r);
    }
    if req.method() == Method::CONNECT {
        return Ok(connect(req, shared, started));
    }
    Ok(plain(req, shared, started).await)
}

/// The host and port of a `host:port` authority (brackets kept off IPv6).
fn split_authority(a: &hyper::http::uri::Authority, default: Option<u16>) -> Option<(String, u16)> {
    let port = a.port_u16().or(default)?;
    Some((a.host().to_string(), port))
}

fn refusal_response(e: &ProxyError) -> Response<Body> {
    let status = if e.is_refusal() {
        StatusCode::FORBIDDEN
    } else if matches!(e, ProxyError::BadRequest(_)) {
        StatusCode::BAD_REQUEST
    } else {
        StatusCode::BAD_GATEWAY
    };
    let text = format!("hull: {e}\n");
    let mut r = Response::new(full(text.clone()));
    *r.status_mut() = status;
    let header = text.trim().replace(['\r', '\n'], " ");
    if let Ok(v) = hyper::header::HeaderValue::from_str(&header) {
        r.headers_mut().insert("x-hull-refused", v);
    }
    r
}

fn full(text: impl Into<Bytes>) -> Body {
    Full::new(text.into())
        .map_err(|never| match never {})
        .boxed()
}

/// `CONNECT host:port`: checked, answered `200`, then the ClientHello is
/// read and checked before hull connects.
fn connect(req: Request<Incoming>, shared: Arc<Shared>, started: Instant) -> Response<Body> {
    let Some((raw_host, port)) = req.uri().authority().and_then(|a| split_authority(a, None))
    else {
        let e = ProxyError::BadRequest("CONNECT needs host:port");
        shared
            .audit
            .record(&Entry::new("connect", "", 0).refused(&e));
        return refusal_response(&e);
    };
    let entry = Entry::new("connect", &raw_host, port);
    let host = match shared.policy.check_request(&raw_host, port) {
        Ok(h) => h,
        Err(r) => {
            let e = ProxyError::from(r);
            shared
                .audit
                .record(&refused(entry, &e).took(started.elapsed()));
            return refusal_response(&e);
        }
    };
    tokio::spawn(async move {
        let mut entry = entry;
        // Counted open as the policy allowed it; its end says how it went.
        let mut opened = entry.clone();
        opened.allowed = true;
        let open = shared.audit.opened(&opened);
        let r = match hyper::upgrade::on(req).await {
            Ok(up) => tunnel(TokioIo::new(up), &host, port, &shared, &mut entry).await,
            Err(e) => Err(ProxyError::Upstream(e)),
        };
        shared
            .audit
            .closed(open, &tunnel_ended(entry, r).took(started.elapsed()));
    });
    Response::new(full(Bytes::new()))
}

/// The audit entry of a tunnel (CONNECT or SOCKS5) once it ended: closed
/// normally, failed after hull connected, or refused before.
pub(super) fn tunnel_ended(mut entry: Entry, r: Result<(), ProxyError>) -> Entry {
    match r {
        Ok(()) => {
            entry.allowed = true;
            entry.reason = "tunnel closed".into();
            entry
        }
        Err(e) if entry.allowed => {
            entry.reason = e.to_string();
            entry
        }
        Err(e) => refused(entry, &e),
    }
}

async fn tunnel<S>(
    mut client: S,
    host: &Host,
    port: u16,
    shared: &Shared,
    entry: &mut Entry,
) -> Result<(), ProxyError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (bytes, name) = read_hello_after(&mut client, Vec::new()).await?;
    check_hello(host, name)?;
    connect_and_carry(&mut client, &bytes, host, port, shared, entry).await
}

/// Connects to `host` as the policy allows ([`connect_checked`]), sends
/// `early` (what the client sent before), then carries both ways until
/// either side closes, counting the bytes into `entry`.
pub(super) async fn connect_and_carry<S>(
    client: &mut S,
    early: &[u8],
    host: &Host,
    port: u16,
    shared: &Shared,
    entry: &mut Entry,
) -> Result<(), ProxyError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (mut upstream, addr) = connect_checked(&shared.policy, host, port).await?;
    entry.addr = Some(addr);
    entry.allowed = true;
    upstream
        .write_all(early)
        .await
        .map_err(ProxyError::Tunnel)?;
    // 64 KiB a side (tokio's default is 8 KiB): a quarter of the system
    // calls on a download (measured in benches/net_proxy.py).
    let (sent, received) =
        tokio::io::copy_bidirectional_with_sizes(client, &mut upstream, 64 << 10, 64 << 10)
            .await
            .map_err(ProxyError::Tunnel)?;
    entry.sent = sent + early.len() as u64;
    entry.received = received;
    Ok(())
}

/// The ClientHello's server name against the host asked for: the same
/// name, or none for an address listed as itself.
pub(super) fn check_hello(host: &Host, name: Option<String>) -> Result<(), ProxyError> {
    match (host, name) {
        (Host::Name(want), Some(sni)) => {
            if normalise_name(&sni).ok().as_ref() != Some(want) {
                return Err(ProxyError::SniMismatch {
                    sni,
                    host: host.clone(),
                });
            }
            Ok(())
        }
        // An address listed as itself: clients send no name for it.
        (Host::Ip(_), None) => Ok(()),
        (Host::Ip(_), Some(sni)) => Err(ProxyError::SniMismatch {
            sni,
            host: host.clone(),
        }),
        (Host::Name(_), None) => Err(ProxyError::Hello(sni::SniError::NoName)),
    }
}

/// Reads the ClientHello's records after the bytes already read (`buf`),
/// within [`HELLO_TIMEOUT`]: the bytes and the server name (none when the
/// hello has no SNI extension).
pub(super) async fn read_hello_after<S: AsyncRead + Unpin>(
    client: &mut S,
    buf: Vec<u8>,
) -> Result<(Vec<u8>, Option<String>), ProxyError> {
    tokio::time::timeout(HELLO_TIMEOUT, read_hello(client, buf))
        .await
        .map_err(|_| ProxyError::HelloTimeout)?
}

async fn read_hello<S: AsyncRead + Unpin>(
    client: &mut S,
    mut buf: Vec<u8>,
) -> Result<(Vec<u8>, Option<String>), ProxyError> {
    buf.reserve(2048);
    loop {
        match sni::server_name(&buf) {
            Ok(Hello::Name(n)) => return Ok((buf, Some(n))),
            Err(sni::SniError::NoName) => return Ok((buf, None)),
            Err(e) => return Err(ProxyError::Hello(e)),
            Ok(Hello::Incomplete(more)) => {
                let start = buf.len();
                buf.resize(start + more, 0);
                client
                    .read_exact(&mut buf[start..])
                    .await
                    .map_err(ProxyError::Tunnel)?;
            }
        }
    }
}

/// Resolves `host` (or takes its fixed address), keeps the addresses the
/// policy allows, and connects to the first that answers: the address
/// checked is the address connected to.
async fn connect_checked(
    policy: &NetPolicy,
    host: &Host,
    port: u16,
) -> Result<(TcpStream, SocketAddr), ProxyError> {
    let addrs: Vec<IpAddr> = match policy.fixed_address(host) {
        Some(a) => vec![a],
        None => {
            let name = host.to_string();
            let found = tokio::net::lookup_host((name.as_str(), port))
                .await
                .map_err(|source| ProxyError::Resolve {
                    host: name.clone(),
                    source,
                })?;
            found.map(|s| s.ip()).collect()
        }
    };
    let mut first_error: Option<ProxyError> = None;
    for ip in addrs {
        if let Err(r) = policy.check_address(ip) {
            first_error.get_or_insert(ProxyError::Refused(r));
            continue;
        }
        let addr = SocketAddr::new(ip, port);
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => return Ok((s, addr)),
            Ok(Err(source)) => {
                first_error.get_or_insert(ProxyError::Connect { addr, source });
            }
            Err(_) => {
                first_error.get_or_insert(ProxyError::Connect {
                    addr,
                    source: std::io::ErrorKind::TimedOut.into(),
                });
            }
        }
    }
    Err(first_error.unwrap_or(ProxyError::NoAddress {
        host: host.to_string(),
    }))
}

/// Hop-by-hop headers, not passed on (RFC 9110 7.6.1), and the proxy's own.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
];

/// An absolute-URI plain HTTP request: the URI's host is checked, a Host
/// header that disagrees is refused, and the request goes on in origin
/// form over a connection to the checked address.
async fn plain(
    mut req: Request<Incoming>,
    shared: Arc<Shared>,
    started: Instant,
) -> Response<Body> {
    let uri = req.uri().clone();
    let authority = match (uri.scheme_str(), uri.authority()) {
        (Some("http"), Some(a)) => a.clone(),
        _ => {
            let e = ProxyError::BadRequest(
                "hull's proxy takes CONNECT host:port, or plain HTTP with an absolute http:// URI",
            );
            shared.audit.record(
                &Entry::new("http", &uri.to_string(), 0)
                    .refused(&e)
                    .took(started.elapsed()),
            );
            return refusal_response(&e);
        }
    };
    let Some((raw_host, port)) = split_authority(&authority, Some(80)) else {
        return refusal_response(&ProxyError::BadRequest("no host"));
    };
    let mut entry = Entry::new("http", &raw_host, port);
    let r = async {
        let host = shared.policy.check_request(&raw_host, port)?;
        if let Some(h) = req.headers().get(hyper::header::HOST) {
            let text = h.to_str().unwrap_or("").to_string();
            let agrees = text
                .parse::<hyper::http::uri::Authority>()
                .ok()
                .and_then(|a| split_authority(&a, Some(80)))
                .and_then(|(h, p)| {
                    let same_host = crate::policy::net::parse_host(&h).ok()? == host;
                    Some(same_host && p == port)
                })
                .unwrap_or(false);
            if !agrees {
                return Err(ProxyError::HostMismatch {
                    header: text,
                    host: authority.to_string(),
                });
            }
        }
        let (stream, addr) = connect_checked(&shared.policy, &host, port).await?;
        Ok((stream, addr))
    }
    .await;
    let (stream, addr) = match r {
        Ok(x) => x,
        Err(e) => {
            let resp = refusal_response(&e);
            shared
                .audit
                .record(&refused(entry, &e).took(started.elapsed()));
            return resp;
        }
    };
    entry.addr = Some(addr);
    entry.allowed = true;
    for h in HOP_BY_HOP {
        req.headers_mut().remove(h);
    }
    let origin_form = uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    if let Ok(u) = origin_form.parse() {
        *req.uri_mut() = u;
    }
    let result = async {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(ProxyError::Upstream)?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!("upstream connection: {e}");
            }
        });
        sender.send_request(req).await.map_err(ProxyError::Upstream)
    }
    .await;
    match result {
        Ok(resp) => {
            entry.reason = format!("HTTP {}", resp.status().as_u16());
            shared.audit.record(&entry.took(started.elapsed()));
            resp.map(|b| b.boxed())
        }
        Err(e) => {
            entry.reason = e.to_string();
            shared.audit.record(&entry.took(started.elapsed()));
            refusal_response(&e)
        }
    }
}

#[cfg(test)]
mod tests;
