//! `registry:NAME` in a policy's `allow`: the hosts of the package
//! registries the host's own clients use, asked of each client when a run
//! starts, never written in hull or in a policy.
//!
//! - pip: the index URLs pip's configuration gives (`pip config list`:
//!   files and `PIP_*` variables); with none, the default index pip itself
//!   reports, and the host pip's default index serves files from.
//! - npm: every registry of `npm config list --json` (`registry`,
//!   `@scope:registry`).
//! - cargo: the registries cargo has used here (the index caches under
//!   `$CARGO_HOME/registry/index`, named by host, and the download and API
//!   hosts of their `config.json`), and the index URLs of
//!   `$CARGO_HOME/config.toml` (source replacement, `[registries]`).
//! - apt: the URIs of `apt-get indextargets`.
//!
//! The clients run with `/` as their working directory (a project's own
//! `.npmrc` or `.cargo/config.toml` is the command's, not the user's, and
//! must not widen what the command reaches), stdin closed, a time limit and
//! a cap on what they print. Each registry is resolved once per hull
//! process (a batch asks once).

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::policy::net::{HostPattern, NetPolicy, Registry};

/// One host a registry is reached on.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// What a registry resolved to, and where that came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub registry: Registry,
    pub endpoints: Vec<Endpoint>,
    /// For `hull policy explain`: which client said so, how.
    pub from: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    #[error("{registry}: cannot ask `{command}`: {why}")]
    Ask {
        registry: Registry,
        command: String,
        why: String,
    },
    #[error("{registry}: {why}")]
    Nothing { registry: Registry, why: String },
    #[error("{registry}: {url:?} is not a URL with a host hull accepts ({why})")]
    BadUrl {
        registry: Registry,
        url: String,
        why: String,
    },
    #[error("{registry}: {endpoint} uses port {port}, which net.ports ({ports}) does not allow; add it to ports")]
    Port {
        registry: Registry,
        endpoint: Endpoint,
        port: u16,
        ports: String,
    },
}

/// How long a client may take to answer.
const ASK_TIMEOUT: Duration = Duration::from_secs(30);
/// The most of a client's output read.
const ASK_MAX: u64 = 1 << 20;

/// Resolves `net`'s registries and adds their hosts to `allow` (as exact
/// names). Returns what each resolved to.
pub fn apply(net: &mut NetPolicy) -> Result<Vec<Resolved>, RegistryError> {
    // The clients are asked at once: each takes up to a second.
    let answers: Vec<Result<Resolved, RegistryError>> = std::thread::scope(|scope| {
        let asked: Vec<_> = net
            .registries
            .iter()
            .map(|&r| scope.spawn(move || resolve(r)))
            .collect();
        asked
            .into_iter()
            .zip(&net.registries)
            .map(|(h, &r)| {
                h.join().unwrap_or_else(|_| {
                    Err(RegistryError::Nothing {
                        registry: r,
                        why: "asking the client panicked".into(),
                    })
                })
            })
            .collect()
    });
    let mut out = Vec::new();
    for resolved in answers {
        let resolved = resolved?;
        add_endpoints(net, &resolved)?;
        out.push(resolved);
    }
    Ok(out)
}

/// Adds `resolved`'s hosts to `net.allow`; every port must be allowed
/// (nothing is added otherwise).
fn add_endpoints(net: &mut NetPolicy, resolved: &Resolved) -> Result<(), RegistryError> {
    let r = resolved.registry;
    let mut patterns = Vec::new();
    for e in &resolved.endpoints {
        if !net.ports.contains(&e.port) {
            return Err(RegistryError::Port {
                registry: r,
                endpoint: e.clone(),
                port: e.port,
                ports: net
                    .ports
                    .iter()
                    .map(u16::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        patterns.push(
            HostPattern::parse(&e.host).map_err(|why| RegistryError::BadUrl {
                registry: r,
                url: e.host.clone(),
                why: why.to_string(),
            })?,
        );
    }
    for p in patterns {
        if !net.allow.contains(&p) {
            net.allow.push(p);
        }
    }
    Ok(())
}

/// What `r` resolves to on this host (asked once per process).
pub fn resolve(r: Registry) -> Result<Resolved, RegistryError> {
    static CACHE: OnceLock<Mutex<HashMap<Registry, Result<Resolved, RegistryError>>>> =
        OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(hit) = cache.lock().unwrap_or_else(|p| p.into_inner()).get(&r) {
        return hit.clone();
    }
    let got = match r {
        Registry::Pip => pip(),
        Registry::Npm => npm(),
        Registry::Cargo => cargo(),
        Registry::Apt => apt(),
    };
    cache
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(r, got.clone());
    got
}

/// Runs a client with `/` as its directory and returns its stdout.
fn ask(registry: Registry, program: &str, args: &[&str]) -> Result<String, RegistryError> {
    let command = std::iter::once(program)
        .chain(args.iter().copied())
        .collect::<Vec<_>>()
        .join(" ");
    let fail = |why: String| RegistryError::Ask {
        registry,
        command: command.clone(),
        why,
    };
    let mut child = Command::new(program)
        .args(args)
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| fail(e.to_string()))?;
    let (Some(mut out), Some(mut err)) = (child.stdout.take(), child.stderr.take()) else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(fail("its output was not piped".into()));
    };
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = (&mut out).take(ASK_MAX).read_to_string(&mut text);
        text
    });
    let err_reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = (&mut err).take(ASK_MAX).read_to_string(&mut text);
        text
    });
    let end = Instant::now() + ASK_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st,
            Ok(None) if Instant::now() >= end => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(fail(format!(
                    "no answer within {} s",
                    ASK_TIMEOUT.as_secs()
                )));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => return Err(fail(e.to_string())),
        }
    };
    let text = reader.join().unwrap_or_default();
    let err_text = err_reader.join().unwrap_or_default();
    if !status.success() {
        let last = err_text.lines().last().unwrap_or("").trim().to_string();
        return Err(fail(format!("{status}: {last}")));
    }
    Ok(text)
}

/// The host and port of a registry URL (`sparse+` and `registry+`
/// prefixes of cargo's source ids taken off).
fn endpoint(registry: Registry, url: &str) -> Result<Endpoint, RegistryError> {
    let bad = |why: &str| RegistryError::BadUrl {
        registry,
        url: url.to_string(),
        why: why.to_string(),
    };
    let plain = url
        .trim()
        .trim_start_matches("sparse+")
        .trim_start_matches("registry+");
    let uri: hyper::Uri = plain.parse().map_err(|_| bad("does not parse"))?;
    let host = uri.host().ok_or_else(|| bad("no host"))?;
    let port = match (uri.port_u16(), uri.scheme_str()) {
        (Some(p), _) => p,
        (None, Some("https")) => 443,
        (None, Some("http")) => 80,
        _ => return Err(bad("not http or https")),
    };
    Ok(Endpoint {
        host: host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_ascii_lowercase(),
        port,
    })
}

fn endpoints(registry: Registry, urls: &[String]) -> Result<Vec<Endpoint>, RegistryError> {
    let mut out = urls
        .iter()
        .map(|u| endpoint(registry, u))
        .collect::<Result<Vec<_>, _>>()?;
    out.sort();
    out.dedup();
    Ok(out)
}

/// The index URLs in `pip config list`'s output (`scope.key='value'`).
fn pip_config_urls(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        if key.ends_with(".index-url") || key.ends_with(".extra-index-url") {
            let value = value.trim().trim_matches('\'').trim_matches('"');
            out.extend(value.split_whitespace().map(str::to_string));
        }
    }
    out
}

/// What pip reports as its default index and the host it serves files
/// from (two lines).
const PIP_DEFAULTS: &str = "from pip._internal.models.index import PyPI\n\
                            print(PyPI.simple_url)\n\
                            print('https://' + PyPI.file_storage_domain + '/')\n";

fn pip() -> Result<Resolved, RegistryError> {
    let r = Registry::Pip;
    let python = "python3";
    let config = ask(r, python, &["-m", "pip", "config", "list"])?;
    let configured = pip_config_urls(&config);
    let defaults = ask(r, python, &["-c", PIP_DEFAULTS])?;
    let defaults: Vec<String> = defaults.lines().map(str::to_string).collect();
    let [index, files] = defaults.as_slice() else {
        return Err(RegistryError::Nothing {
            registry: r,
            why: format!("pip's defaults were not two URLs: {defaults:?}"),
        });
    };
    let (mut urls, from) = if configured.is_empty() {
        (
            vec![index.clone()],
            "pip's default index (no index-url configured)".to_string(),
        )
    } else {
        (
            configured.clone(),
            "pip config list (index-url, extra-index-url)".to_string(),
        )
    };
    // The default index serves its files from another host.
    let default_host = endpoint(r, index)?.host;
    if endpoints(r, &urls)?.iter().any(|e| e.host == default_host) {
        urls.push(files.clone());
    }
    Ok(Resolved {
        registry: r,
        endpoints: endpoints(r, &urls)?,
        from,
    })
}

/// The registries in `npm config list --json`: `registry` and every
/// `@scope:registry`.
fn npm_config_urls(json: &str) -> Result<Vec<String>, String> {
    let v: serde_json::Value = serde_json::from_str(json).map_err(|e| e.to_string())?;
    let map = v.as_object().ok_or("not a JSON object")?;
    Ok(map
        .iter()
        .filter(|(k, _)| *k == "registry" || k.ends_with(":registry"))
        .filter_map(|(_, v)| v.as_str().map(str::to_string))
        .collect())
}

fn npm() -> Result<Resolved, RegistryError> {
    let r = Registry::Npm;
    let json = ask(r, "npm", &["config", "list", "--json"])?;
    let urls = npm_config_urls(&json).map_err(|why| RegistryError::Nothing {
        registry: r,
        why: format!("npm config list --json: {why}"),
    })?;
    resolved(
        r,
        &urls,
        "npm config list (registry, @scope:registry)".into(),
        || "npm config list --json names no registry".into(),
    )
}

/// What `r`'s client named, with where it came from, or why nothing
/// (`none`) when it named no URL.
fn resolved(
    r: Registry,
    urls: &[String],
    from: String,
    none: impl FnOnce() -> String,
) -> Result<Resolved, RegistryError> {
    if urls.is_empty() {
        return Err(RegistryError::Nothing {
            registry: r,
            why: none(),
        });
    }
    Ok(Resolved {
        registry: r,
        endpoints: endpoints(r, urls)?,
        from,
    })
}

/// The index URLs of a cargo `config.toml`: `source.*.registry` and
/// `registries.*.index`.
fn cargo_config_urls(text: &str) -> Result<Vec<String>, String> {
    let v: toml::Table = text.parse().map_err(|e: toml::de::Error| e.to_string())?;
    let mut out = Vec::new();
    for (section, key) in [("source", "registry"), ("registries", "index")] {
        if let Some(t) = v.get(section).and_then(|s| s.as_table()) {
            for entry in t.values() {
                if let Some(url) = entry.get(key).and_then(|u| u.as_str()) {
                    out.push(url.to_string());
                }
            }
        }
    }
    Ok(out)
}

/// The host an index cache directory is named after (`HOST-HASH`).
fn cache_dir_host(name: &str) -> Option<&str> {
    let (host, hash) = name.rsplit_once('-')?;
    (hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) && !host.is_empty())
        .then_some(host)
}

/// The `dl` and `api` URLs of a registry's `config.json`.
fn cargo_index_config_urls(json: &str) -> Vec<String> {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(json) else {
        return Vec::new();
    };
    ["dl", "api"]
        .iter()
        .filter_map(|k| v.get(k).and_then(|u| u.as_str()))
        .map(str::to_string)
        .collect()
}

fn cargo_home() -> Option<PathBuf> {
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")))
}

fn cargo() -> Result<Resolved, RegistryError> {
    let r = Registry::Cargo;
    let home = cargo_home().ok_or_else(|| RegistryError::Nothing {
        registry: r,
        why: "neither CARGO_HOME nor HOME is set".into(),
    })?;
    let mut urls = Vec::new();
    for name in ["config.toml", "config"] {
        let p = home.join(name);
        if let Ok(text) = read_capped(&p) {
            urls.extend(
                cargo_config_urls(&text).map_err(|why| RegistryError::Nothing {
                    registry: r,
                    why: format!("{}: {why}", p.display()),
                })?,
            );
        }
    }
    let index = home.join("registry").join("index");
    let mut hosts = Vec::new();
    if let Ok(entries) = std::fs::read_dir(&index) {
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(host) = name.to_str().and_then(cache_dir_host) else {
                continue;
            };
            hosts.push(format!("https://{host}/"));
            if let Ok(json) = read_capped(&e.path().join("config.json")) {
                urls.extend(cargo_index_config_urls(&json));
            }
        }
    }
    urls.extend(hosts);
    let config = home.join("config.toml");
    resolved(
        r,
        &urls,
        format!(
            "the registries cargo used ({}) and {}",
            index.display(),
            config.display()
        ),
        || {
            format!(
            "cargo has not used a registry on this machine yet (nothing in {}) and {} names none; run `cargo fetch` once outside hull, or allow the index's host by name",
            index.display(),
            config.display()
        )
        },
    )
}

fn read_capped(p: &Path) -> std::io::Result<String> {
    let mut text = String::new();
    std::fs::File::open(p)?
        .take(ASK_MAX)
        .read_to_string(&mut text)?;
    Ok(text)
}

fn apt() -> Result<Resolved, RegistryError> {
    let r = Registry::Apt;
    let text = ask(r, "apt-get", &["indextargets", "--format", "$(URI)"])?;
    let urls: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    resolved(r, &urls, "apt-get indextargets".into(), || {
        "apt-get indextargets names no source (run apt-get update once?)".into()
    })
}

#[cfg(test)]
mod tests;
