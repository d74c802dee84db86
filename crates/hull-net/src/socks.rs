//! SOCKS5 on the proxy's port (RFC 1928, no authentication, `CONNECT`
//! only): other TCP than HTTP(S) to the names and ports the policy allows,
//! such as git over ssh (`ssh -o ProxyCommand='nc -X 5 -x 127.0.0.1:3128 %h
//! %p'`), or clients told `socks5h://127.0.0.1:3128`.
//!
//! The request is checked as a `CONNECT` is (the name's form, deny, allow,
//! port; an address literal only when listed); hull answers success before
//! it connects and reads what the client sends first: a TLS ClientHello must
//! name the requested host, as in a `CONNECT` tunnel; anything else (an SSH
//! banner) or nothing within a moment (a protocol whose server speaks
//! first) is carried as it is. Then hull resolves and checks the address
//! and connects to it. A refusal before the answer is reply 2 ("not allowed
//! by ruleset"); after it, the connection is closed. Every decision is an
//! audit entry of kind `socks`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::audit::Entry;
use super::proxy::{
    check_hello, connect_and_carry, read_hello_after, tunnel_ended, ProxyError, Shared,
};

/// The first byte of a SOCKS5 greeting.
pub const VERSION: u8 = 5;

/// How long hull waits for the client's first bytes before it takes the
/// protocol for one whose server speaks first.
const FIRST_BYTES: Duration = Duration::from_millis(300);
/// How long the handshake may take.
const HANDSHAKE: Duration = Duration::from_secs(10);

/// Reply codes (RFC 1928 6).
const REP_OK: u8 = 0;
const REP_NOT_ALLOWED: u8 = 2;
const REP_COMMAND: u8 = 7;
const REP_ADDRESS: u8 = 8;

/// What the handshake asked for.
struct Request {
    host: String,
    port: u16,
}

/// Why a handshake ends before a request.
enum Handshake {
    /// Not SOCKS5 as hull speaks it: the reply code to send (if any) and
    /// why.
    Bad(Option<u8>, &'static str),
    Io(std::io::Error),
}

/// Serves one SOCKS5 client whose first byte (`VERSION`) was already read.
pub async fn serve<S>(mut client: S, shared: Arc<Shared>)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let started = Instant::now();
    let req = match tokio::time::timeout(HANDSHAKE, handshake(&mut client)).await {
        Ok(Ok(r)) => r,
        Ok(Err(Handshake::Bad(code, why))) => {
            if let Some(code) = code {
                let _ = reply(&mut client, code).await;
            }
            let e = ProxyError::BadRequest(why);
            shared.audit.record(
                &Entry::new("socks", "", 0)
                    .refused(&e)
                    .took(started.elapsed()),
            );
            return;
        }
        Ok(Err(Handshake::Io(e))) => {
            tracing::debug!("SOCKS5 handshake: {e}");
            return;
        }
        Err(_) => return,
    };
    let mut entry = Entry::new("socks", &req.host, req.port);
    let host = match shared.policy.check_request(&req.host, req.port) {
        Ok(h) => h,
        Err(r) => {
            let _ = reply(&mut client, REP_NOT_ALLOWED).await;
            let e = ProxyError::from(r);
            shared
                .audit
                .record(&super::proxy::refused(entry, &e).took(started.elapsed()));
            return;
        }
    };
    if reply(&mut client, REP_OK).await.is_err() {
        return;
    }
    let mut opened = entry.clone();
    opened.allowed = true;
    let open = shared.audit.opened(&opened);
    let r = carry(&mut client, &host, req.port, &shared, &mut entry).await;
    shared
        .audit
        .closed(open, &tunnel_ended(entry, r).took(started.elapsed()));
}

/// The client's first bytes checked (a ClientHello must name `host`), then
/// the connection carried.
async fn carry<S>(
    client: &mut S,
    host: &crate::policy::net::Host,
    port: u16,
    shared: &Shared,
    entry: &mut Entry,
) -> Result<(), ProxyError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    // What the client sent first, as one read (a banner, or the start of
    // a ClientHello).
    let mut first = vec![0u8; 16 << 10];
    let early: Vec<u8> = match tokio::time::timeout(FIRST_BYTES, client.read(&mut first)).await {
        Ok(Ok(0)) => return Ok(()),
        Ok(Ok(n)) if first[0] == super::sni::RECORD_HANDSHAKE => {
            first.truncate(n);
            let (bytes, name) = read_hello_after(client, first).await?;
            check_hello(host, name)?;
            bytes
        }
        Ok(Ok(n)) => {
            first.truncate(n);
            first
        }
        Ok(Err(e)) => return Err(ProxyError::Tunnel(e)),
        // The server speaks first.
        Err(_) => Vec::new(),
    };
    connect_and_carry(client, &early, host, port, shared, entry).await
}

/// The greeting (after its version byte) and the request.
async fn handshake<S>(client: &mut S) -> Result<Request, Handshake>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let io = Handshake::Io;
    let n = client.read_u8().await.map_err(io)?;
    let mut methods = vec![0u8; usize::from(n)];
    client.read_exact(&mut methods).await.map_err(io)?;
    if !methods.contains(&0) {
        // 0xFF: no acceptable method.
        client.write_all(&[VERSION, 0xff]).await.map_err(io)?;
        return Err(Handshake::Bad(
            None,
            "SOCKS5: hull takes no authentication method",
        ));
    }
    client.write_all(&[VERSION, 0]).await.map_err(io)?;
    let mut head = [0u8; 4];
    client.read_exact(&mut head).await.map_err(io)?;
    let [version, command, _reserved, atyp] = head;
    if version != VERSION {
        return Err(Handshake::Bad(None, "SOCKS5: a request of another version"));
    }
    let host = match atyp {
        1 => {
            let mut a = [0u8; 4];
            client.read_exact(&mut a).await.map_err(io)?;
            std::net::Ipv4Addr::from(a).to_string()
        }
        4 => {
            let mut a = [0u8; 16];
            client.read_exact(&mut a).await.map_err(io)?;
            std::net::Ipv6Addr::from(a).to_string()
        }
        3 => {
            let len = client.read_u8().await.map_err(io)?;
            let mut name = vec![0u8; usize::from(len)];
            client.read_exact(&mut name).await.map_err(io)?;
            // Not UTF-8 is not a name the policy can allow.
            String::from_utf8(name).map_err(|_| {
                Handshake::Bad(Some(REP_NOT_ALLOWED), "SOCKS5: a name that is not UTF-8")
            })?
        }
        _ => {
            return Err(Handshake::Bad(
                Some(REP_ADDRESS),
                "SOCKS5: an unknown address type",
            ))
        }
    };
    let port = client.read_u16().await.map_err(io)?;
    // Checked once the request is read whole: a reply before that would
    // reach the client as a reset.
    if command != 1 {
        return Err(Handshake::Bad(
            Some(REP_COMMAND),
            "SOCKS5: only CONNECT is served (no BIND, no UDP ASSOCIATE)",
        ));
    }
    Ok(Request { host, port })
}

/// A reply with the bound address left unspecified (0.0.0.0:0).
async fn reply<S: AsyncWrite + Unpin>(client: &mut S, code: u8) -> std::io::Result<()> {
    client
        .write_all(&[VERSION, code, 0, 1, 0, 0, 0, 0, 0, 0])
        .await?;
    client.flush().await
}
