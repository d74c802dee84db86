//! Pulling an image from a registry (`docker://HOST/NAME:TAG`) by the
//! distribution API: the tag's manifest (an index followed to the host's
//! platform), then the config and the layers as blobs, each stored under
//! the digest hull computed of it and refused when that is not the digest
//! asked for. Nothing the registry says is trusted but what its digests
//! prove; every answer is bounded.
//!
//! The connection goes where the caller says: through hull's proxy, which
//! holds the run's network allowlist (the registry, its token service and
//! any host a blob is redirected to must be allowed), or nowhere. A
//! registry on a loopback address is spoken to in plain HTTP, as docker
//! does; any other over TLS, checked against the host's certificate
//! authorities. Credentials come from the caller's auth file
//! ([`credentials`]) and go to the registry and its token service only,
//! never over plain HTTP to a host off this machine.

use std::ffi::OsString;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use serde::Deserialize;

use crate::source::{self, Image, Kind, SourceError, MAX_JSON};
use crate::Reference;

/// What a token service may answer, at most.
const MAX_TOKEN_ANSWER: u64 = 1 << 20;
/// The most an auth file may hold.
const MAX_AUTH_FILE: u64 = 1 << 20;
/// How long connecting may take, and a whole request (a layer's body
/// included) at most.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3600);
/// Redirects followed for one request (a blob served from elsewhere).
const MAX_REDIRECTS: usize = 5;

const ACCEPT_MANIFESTS: &str = "application/vnd.oci.image.index.v1+json, \
     application/vnd.oci.image.manifest.v1+json, \
     application/vnd.docker.distribution.manifest.list.v2+json, \
     application/vnd.docker.distribution.manifest.v2+json";

/// How a pull reaches its registry.
#[derive(Debug, Clone, Default)]
pub struct Access {
    /// The proxy every connection goes through (`http://127.0.0.1:PORT`:
    /// hull's, holding the run's allowlist); none: connect directly.
    pub proxy: Option<String>,
    /// The key the proxy asks for (`Proxy-Authorization: Basic` of
    /// `hull:KEY`).
    pub proxy_key: Option<String>,
    /// The caller's credentials for the registry's host.
    pub credentials: Option<Credentials>,
}

/// A user name and its password (or token), as an auth file keeps them.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub user: String,
    password: String,
    /// The file they came from (for errors).
    pub from: PathBuf,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &"<hidden>")
            .field("from", &self.from)
            .finish()
    }
}

impl Credentials {
    fn basic(&self) -> String {
        let raw = format!("{}:{}", self.user, self.password);
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(raw)
        )
    }
}

/// What a pull found.
#[derive(Debug)]
pub enum Pulled {
    /// The manifest the reference names is one the caller has (`have`):
    /// nothing else was fetched.
    Have(String),
    /// The image, its blobs in the store.
    Read(Image),
}

/// Whether `host` (`NAME[:PORT]`) is this machine's loopback, which is
/// spoken to in plain HTTP.
pub fn is_loopback(host: &str) -> bool {
    let name = host_name(host);
    name == "localhost"
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|a| a.is_loopback())
}

/// The name of `NAME[:PORT]` (brackets of an IPv6 address removed).
pub fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split_once(']').map_or(rest, |(a, _)| a);
    }
    host.rsplit_once(':').map_or(host, |(n, _)| n)
}

/// The port of `NAME[:PORT]`: the one written, else the scheme's.
pub fn host_port(host: &str) -> u16 {
    let port = match host.strip_prefix('[') {
        Some(rest) => rest.split_once("]:").map(|(_, p)| p),
        None => host.rsplit_once(':').map(|(_, p)| p),
    };
    port.and_then(|p| p.parse().ok())
        .unwrap_or(if is_loopback(host) { 80 } else { 443 })
}

/// The caller's credentials for `host` from `REGISTRY_AUTH_FILE`, else
/// `$DOCKER_CONFIG/config.json`, else `~/.docker/config.json` (`env`:
/// the caller's variables). None when the file or the entry is not there;
/// an entry kept by a credential helper is refused by name (hull runs no
/// helper).
pub fn credentials(
    host: &str,
    env: &dyn Fn(&str) -> Option<OsString>,
) -> Result<Option<Credentials>, String> {
    let file = match (env("REGISTRY_AUTH_FILE"), env("DOCKER_CONFIG"), env("HOME")) {
        (Some(f), _, _) => PathBuf::from(f),
        (None, Some(d), _) => PathBuf::from(d).join("config.json"),
        (None, None, Some(h)) => PathBuf::from(h).join(".docker/config.json"),
        (None, None, None) => return Ok(None),
    };
    let body = match std::fs::File::open(&file) {
        Ok(f) => {
            let mut body = Vec::new();
            f.take(MAX_AUTH_FILE + 1)
                .read_to_end(&mut body)
                .map_err(|e| format!("reading {}: {e}", file.display()))?;
            if body.len() as u64 > MAX_AUTH_FILE {
                return Err(format!(
                    "{} is larger than {MAX_AUTH_FILE} bytes",
                    file.display()
                ));
            }
            body
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("reading {}: {e}", file.display())),
    };
    parse_credentials(host, &body, &file)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AuthFile {
    #[serde(default)]
    auths: std::collections::BTreeMap<String, AuthEntry>,
    #[serde(default)]
    cred_helpers: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    creds_store: Option<String>,
}

#[derive(Deserialize)]
struct AuthEntry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default)]
    identitytoken: Option<String>,
}

/// The key of an auth file's entry as a host: `https://HOST/v1/` and
/// `HOST` name the same registry.
fn entry_host(key: &str) -> &str {
    let k = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    k.split('/').next().unwrap_or(k)
}

fn parse_credentials(host: &str, body: &[u8], file: &Path) -> Result<Option<Credentials>, String> {
    // The error names the place, never the content (a password).
    let parsed: AuthFile = serde_json::from_slice(body).map_err(|e| {
        format!(
            "{} is not an auth file (line {}, column {})",
            file.display(),
            e.line(),
            e.column()
        )
    })?;
    let entry = parsed
        .auths
        .iter()
        .find(|(k, _)| entry_host(k).eq_ignore_ascii_case(host));
    let Some((_, entry)) = entry else {
        let helper = parsed
            .cred_helpers
            .iter()
            .find(|(k, _)| entry_host(k).eq_ignore_ascii_case(host))
            .map(|(_, h)| h.clone())
            .or(parsed.creds_store);
        return match helper {
            Some(h) if parsed.cred_helpers.contains_key(host) => Err(format!(
                "the credentials for {host} in {} are kept by docker-credential-{h}, which \
                 hull does not run: put them in a file of their own and name it in \
                 REGISTRY_AUTH_FILE",
                file.display()
            )),
            // A store for every registry may hold none for this one: pull
            // anonymously, as docker would when it has none.
            _ => Ok(None),
        };
    };
    if entry
        .identitytoken
        .as_deref()
        .is_some_and(|t| !t.is_empty())
    {
        return Err(format!(
            "the credentials for {host} in {} are an identity token, which hull does not \
             exchange: log in with a user name and password or token",
            file.display()
        ));
    }
    let bad = || {
        format!(
            "the entry for {host} in {} is not user:password",
            file.display()
        )
    };
    let (user, password) = match (&entry.auth, &entry.username, &entry.password) {
        (Some(a), _, _) if !a.is_empty() => {
            let raw = base64::engine::general_purpose::STANDARD
                .decode(a.trim())
                .map_err(|_| bad())?;
            let raw = String::from_utf8(raw).map_err(|_| bad())?;
            let (u, p) = raw.split_once(':').ok_or_else(bad)?;
            (u.to_string(), p.to_string())
        }
        (_, Some(u), Some(p)) => (u.clone(), p.clone()),
        _ => return Ok(None),
    };
    if user.is_empty()
        || user.chars().any(char::is_control)
        || password.chars().any(char::is_control)
    {
        return Err(bad());
    }
    Ok(Some(Credentials {
        user,
        password,
        from: file.to_path_buf(),
    }))
}

/// A challenge of `WWW-Authenticate`: its scheme and parameters.
#[derive(Debug, PartialEq, Eq)]
struct Challenge {
    scheme: String,
    params: Vec<(String, String)>,
}

impl Challenge {
    fn param(&self, k: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(k))
            .map(|(_, v)| v.as_str())
    }
}

/// `Bearer realm="...",service="...",scope="repository:a:pull,push"`.
fn parse_challenge(raw: &str) -> Option<Challenge> {
    let raw = raw.trim();
    let (scheme, rest) = raw.split_once(' ').unwrap_or((raw, ""));
    let mut params = Vec::new();
    let mut rest = rest.trim_start();
    while !rest.is_empty() {
        let (k, after) = rest.split_once('=')?;
        let k = k.trim().to_string();
        let after = after.trim_start();
        let (v, next) = match after.strip_prefix('"') {
            Some(q) => {
                let mut v = String::new();
                let mut chars = q.char_indices();
                let mut end = None;
                while let Some((i, c)) = chars.next() {
                    match c {
                        '\\' => v.extend(chars.next().map(|(_, c)| c)),
                        '"' => {
                            end = Some(i + 1);
                            break;
                        }
                        c => v.push(c),
                    }
                }
                (v, &q[end?..])
            }
            None => {
                let (v, n) = after.split_once(',').unwrap_or((after, ""));
                (v.trim().to_string(), n)
            }
        };
        params.push((k, v));
        rest = next.trim_start().trim_start_matches(',').trim_start();
    }
    Some(Challenge {
        scheme: scheme.to_string(),
        params,
    })
}

/// One pull's conversation with a registry.
struct Conversation<'a> {
    client: reqwest::blocking::Client,
    r: String,
    base: String,
    name: &'a str,
    host: &'a str,
    credentials: Option<&'a Credentials>,
    authorization: Option<String>,
}

#[derive(Deserialize)]
struct TokenAnswer {
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    access_token: Option<String>,
}

impl Conversation<'_> {
    fn refuse(&self, why: String) -> SourceError {
        SourceError::Refused {
            reference: self.r.clone(),
            why,
        }
    }

    fn send_err(&self, url: &str, e: reqwest::Error) -> SourceError {
        let mut why = format!("GET {url}: {e}");
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            why.push_str(&format!(": {s}"));
            src = s.source();
        }
        self.refuse(why)
    }

    /// GET `path` below the repository, authorizing once on a 401.
    fn get(
        &mut self,
        path: &str,
        accept: &str,
    ) -> Result<reqwest::blocking::Response, SourceError> {
        let url = format!("{}/v2/{}/{path}", self.base, self.name);
        for attempt in 0..2 {
            let mut req = self
                .client
                .get(&url)
                .header(reqwest::header::ACCEPT, accept);
            if let Some(a) = &self.authorization {
                req = req.header(reqwest::header::AUTHORIZATION, a);
            }
            let resp = req.send().map_err(|e| self.send_err(&url, e))?;
            let status = resp.status();
            if status == reqwest::StatusCode::UNAUTHORIZED && attempt == 0 {
                let challenge = resp
                    .headers()
                    .get(reqwest::header::WWW_AUTHENTICATE)
                    .and_then(|v| v.to_str().ok())
                    .and_then(parse_challenge)
                    .ok_or_else(|| {
                        self.refuse(format!("GET {url}: 401 without a challenge it can answer"))
                    })?;
                self.authorization = Some(self.authorize(&challenge)?);
                continue;
            }
            if !status.is_success() {
                let hint = match status.as_u16() {
                    401 | 403 => match self.credentials {
                        Some(c) => format!(" (as {} from {})", c.user, c.from.display()),
                        None => " (anonymously: no credentials for this registry in \
                                  REGISTRY_AUTH_FILE or ~/.docker/config.json)"
                            .to_string(),
                    },
                    404 => " (no such image, tag or blob)".to_string(),
                    _ => String::new(),
                };
                return Err(self.refuse(format!("GET {url}: {status}{hint}")));
            }
            return Ok(resp);
        }
        Err(self.refuse(format!("GET {url}: still 401 after authorizing")))
    }

    /// The `Authorization` a challenge asks for.
    fn authorize(&self, c: &Challenge) -> Result<String, SourceError> {
        let needs = |what: &str| {
            self.refuse(format!(
                "{} asks for {what}, and there are none for {} in REGISTRY_AUTH_FILE or \
                 ~/.docker/config.json",
                self.base, self.host
            ))
        };
        if c.scheme.eq_ignore_ascii_case("basic") {
            let creds = self.credentials.ok_or_else(|| needs("credentials"))?;
            self.check_secure(&self.base)?;
            return Ok(creds.basic());
        }
        if !c.scheme.eq_ignore_ascii_case("bearer") {
            return Err(self.refuse(format!(
                "{} asks for {:?} authorization, which hull does not speak",
                self.base, c.scheme
            )));
        }
        let realm = c.param("realm").ok_or_else(|| {
            self.refuse(format!("{}: a Bearer challenge without a realm", self.base))
        })?;
        let mut url = reqwest::Url::parse(realm)
            .map_err(|e| self.refuse(format!("the token service {realm:?}: {e}")))?;
        if !matches!(url.scheme(), "https" | "http") {
            return Err(self.refuse(format!("the token service {realm:?} is not HTTP")));
        }
        let scope = c
            .param("scope")
            .map_or_else(|| format!("repository:{}:pull", self.name), str::to_string);
        {
            let mut q = url.query_pairs_mut();
            q.append_pair("scope", &scope);
            if let Some(s) = c.param("service") {
                q.append_pair("service", s);
            }
        }
        let mut req = self.client.get(url.clone());
        if let Some(creds) = self.credentials {
            self.check_secure(url.as_str())?;
            req = req.header(reqwest::header::AUTHORIZATION, creds.basic());
        }
        let resp = req.send().map_err(|e| self.send_err(realm, e))?;
        let status = resp.status();
        if !status.is_success() {
            return Err(self.refuse(format!(
                "the token service {realm}: {status}{}",
                match self.credentials {
                    Some(c) => format!(" (as {} from {})", c.user, c.from.display()),
                    None => String::new(),
                }
            )));
        }
        let mut body = Vec::new();
        resp.take(MAX_TOKEN_ANSWER + 1)
            .read_to_end(&mut body)
            .map_err(|e| self.refuse(format!("the token service {realm}: {e}")))?;
        if body.len() as u64 > MAX_TOKEN_ANSWER {
            return Err(self.refuse(format!(
                "the token service {realm} answered more than {MAX_TOKEN_ANSWER} bytes"
            )));
        }
        let answer: TokenAnswer = serde_json::from_slice(&body)
            .map_err(|e| self.refuse(format!("the token service {realm}: {e}")))?;
        let token = answer
            .token
            .or(answer.access_token)
            .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_graphic()))
            .ok_or_else(|| self.refuse(format!("the token service {realm} gave no token")))?;
        Ok(format!("Bearer {token}"))
    }

    /// Credentials never cross a network in the clear: only over TLS, or
    /// to this machine.
    fn check_secure(&self, url: &str) -> Result<(), SourceError> {
        let parsed = reqwest::Url::parse(url).map_err(|e| self.refuse(format!("{url:?}: {e}")))?;
        let local = parsed.host_str().is_some_and(|h| {
            let h = h.trim_start_matches('[').trim_end_matches(']');
            h == "localhost" || h.parse::<std::net::IpAddr>().is_ok_and(|a| a.is_loopback())
        });
        match parsed.scheme() == "https" || local {
            true => Ok(()),
            false => Err(self.refuse(format!(
                "{url} is plain HTTP off this machine: the credentials are not sent there"
            ))),
        }
    }

    /// A manifest (or index) by tag or digest: its body and media type.
    fn manifest(&mut self, reference: &str) -> Result<(Vec<u8>, String), SourceError> {
        let resp = self.get(&format!("manifests/{reference}"), ACCEPT_MANIFESTS)?;
        let media = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.split(';').next().unwrap_or(v).trim().to_string())
            .unwrap_or_default();
        if media.starts_with("application/vnd.docker.distribution.manifest.v1") {
            return Err(self.refuse(format!(
                "{reference}: a schema 1 manifest ({media}), which hull does not read"
            )));
        }
        let mut body = Vec::new();
        resp.take(MAX_JSON + 1)
            .read_to_end(&mut body)
            .map_err(|e| self.refuse(format!("the manifest {reference}: {e}")))?;
        if body.len() as u64 > MAX_JSON {
            return Err(self.refuse(format!(
                "the manifest {reference} is larger than {MAX_JSON} bytes"
            )));
        }
        Ok((body, media))
    }
}

/// Pulls the image `reference` (a [`Reference::Registry`]) into `store`
/// (held as `store_fd`, at most `max_bytes` of blobs), unless the manifest
/// it names for the host's platform is one `have` says the caller has.
pub fn pull(
    reference: &Reference,
    store: &Path,
    store_fd: &OwnedFd,
    max_bytes: u64,
    access: &Access,
    have: &dyn Fn(&str) -> bool,
) -> Result<Pulled, SourceError> {
    let r = reference.to_string();
    let Reference::Registry { host, name, tag } = reference else {
        return Err(SourceError::Refused {
            reference: r,
            why: "not a registry's image".into(),
        });
    };
    let refuse = |why: String| SourceError::Refused {
        reference: r.clone(),
        why,
    };
    // reqwest asks rustls for the process's provider: ring, installed once
    // (another already installed is as good).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut builder = reqwest::blocking::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(REQUEST_TIMEOUT)
        .redirect(reqwest::redirect::Policy::limited(MAX_REDIRECTS))
        .user_agent(concat!("hull/", env!("CARGO_PKG_VERSION")))
        .tls_backend_rustls()
        .https_only(!is_loopback(host));
    builder = match &access.proxy {
        Some(p) => {
            let mut proxy =
                reqwest::Proxy::all(p).map_err(|e| refuse(format!("the proxy {p}: {e}")))?;
            if let Some(key) = &access.proxy_key {
                proxy = proxy.basic_auth("hull", key);
            }
            builder.proxy(proxy)
        }
        None => builder.no_proxy(),
    };
    let client = builder
        .build()
        .map_err(|e| refuse(format!("an HTTP client: {e}")))?;
    let scheme = if is_loopback(host) { "http" } else { "https" };
    let mut talk = Conversation {
        client,
        r: r.clone(),
        base: format!("{scheme}://{host}"),
        name,
        host,
        credentials: access.credentials.as_ref(),
        authorization: None,
    };
    // The tag's manifest, stored under the digest hull computes (the one
    // pinned, when the reference pins one).
    let (body, media) = talk.manifest(tag)?;
    let top = source::store_blob(store_fd, &mut &body[..], u64::MAX)
        .map_err(|e| source::io_err(&r, "store the manifest in", store, e))?
        .0;
    let top = format!("sha256:{top}");
    if reference.is_pinned() && &top != tag {
        return Err(refuse(format!(
            "the registry's manifest is {top}, not the {tag} asked for"
        )));
    }
    // The registry's answer as a one-entry index, so a list is followed to
    // the host's platform as a layout's is.
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{ "mediaType": media, "digest": top, "size": body.len() }],
    })
    .to_string();
    let mut total = 0u64;
    let mut fetch = |digest: &str, kind: Kind| -> Result<(), SourceError> {
        let hexd = source::digest_hex(digest).map_err(&refuse)?;
        if digest == top {
            return Ok(());
        }
        let (got, n) = match kind {
            Kind::Manifest => {
                let (b, _) = talk.manifest(digest)?;
                source::store_blob(store_fd, &mut &b[..], u64::MAX)
            }
            Kind::Blob => {
                let mut resp = talk.get(&format!("blobs/{digest}"), "*/*")?;
                source::store_blob(store_fd, &mut resp, max_bytes.saturating_sub(total))
            }
        }
        .map_err(|e| refuse(format!("{digest}: {e}")))?;
        total += n;
        if got != hexd {
            return Err(refuse(format!(
                "the registry sent sha256:{got} for {digest}: not the blob asked for"
            )));
        }
        Ok(())
    };
    let (digest, manifest) = source::pick_manifest(&r, index.as_bytes(), None, store, &mut fetch)?;
    if have(&digest) {
        return Ok(Pulled::Have(digest));
    }
    Ok(Pulled::Read(source::image_of(
        &r, digest, &manifest, store, &mut fetch,
    )?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_challenge_is_read_with_its_quoted_commas() {
        let c = parse_challenge(
            r#"Bearer realm="https://auth.example/token",service="reg.example",scope="repository:a/b:pull,push""#,
        )
        .expect("parsed");
        assert_eq!(c.scheme, "Bearer");
        assert_eq!(c.param("realm"), Some("https://auth.example/token"));
        assert_eq!(c.param("service"), Some("reg.example"));
        assert_eq!(c.param("scope"), Some("repository:a/b:pull,push"));
        let b = parse_challenge(r#"Basic realm="Registry Realm""#).expect("parsed");
        assert_eq!(b.scheme, "Basic");
        assert_eq!(b.param("realm"), Some("Registry Realm"));
        assert_eq!(parse_challenge(r#"Bearer realm="unterminated"#), None);
    }

    #[test]
    fn credentials_are_found_by_host_in_either_form_and_never_shown() {
        let file = Path::new("/x/auth.json");
        let auth = base64::engine::general_purpose::STANDARD.encode("ann:s3cret:with:colons");
        let body = format!(
            r#"{{"auths":{{"https://reg.example:5000/v1/":{{"auth":"{auth}"}},
                "other.example":{{"username":"bo","password":"pw"}}}},
               "credHelpers":{{"helped.example":"pass"}}}}"#
        );
        let c = parse_credentials("reg.example:5000", body.as_bytes(), file)
            .expect("read")
            .expect("found");
        assert_eq!(
            (c.user.as_str(), c.password.as_str()),
            ("ann", "s3cret:with:colons")
        );
        assert!(!format!("{c:?}").contains("s3cret"), "{c:?}");
        let o = parse_credentials("other.example", body.as_bytes(), file)
            .expect("read")
            .expect("found");
        assert_eq!(o.user, "bo");
        assert_eq!(
            parse_credentials("none.example", body.as_bytes(), file),
            Ok(None)
        );
        let e = parse_credentials("helped.example", body.as_bytes(), file).expect_err("helper");
        assert!(
            e.contains("docker-credential-pass") && e.contains("REGISTRY_AUTH_FILE"),
            "{e}"
        );
        let e = parse_credentials("x", br#"{"auths": {"x": {"auth": "%%%"}}} "#, file)
            .expect_err("bad");
        assert!(e.contains("/x/auth.json") && !e.contains("%%%"), "{e}");
        let e = parse_credentials("x", b"{\"password\": \"hunter2\"", file).expect_err("bad");
        assert!(!e.contains("hunter2"), "{e}");
    }

    #[test]
    fn loopback_registries_are_plain_http_the_rest_tls() {
        for (h, lo, port) in [
            ("localhost:5000", true, 5000),
            ("127.0.0.1:5000", true, 5000),
            ("[::1]:5000", true, 5000),
            ("[::1]", true, 80),
            ("127.0.0.1", true, 80),
            ("reg.example", false, 443),
            ("reg.example:8443", false, 8443),
            ("localhost.example.com", false, 443),
        ] {
            assert_eq!(is_loopback(h), lo, "{h}");
            assert_eq!(host_port(h), port, "{h}");
        }
        assert_eq!(host_name("[::1]:5000"), "::1");
        assert_eq!(host_name("reg.example:5000"), "reg.example");
    }
}
