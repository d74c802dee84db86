//! The policy's network part: which host names the command may reach
//! through hull's proxy, on which ports, and which addresses those names
//! may lead to.
//!
//! Names are compared in one form: IDNA (UTS 46) to ASCII, lower case,
//! labels of letters, digits, `-` and `_`. A name that is not a name (a NUL,
//! a control character, a space, a trailing dot, an empty label) is refused,
//! and so is an IP literal in any spelling a resolver would accept
//! (`127.1`, `0x7f000001`) unless the policy lists that address itself.
//! `*.example` matches the subdomains of `example`, never `example`.
//! `deny` is checked before `allow`; an empty `allow` refuses everything.
//!
//! Addresses: whatever a name resolves to, hull refuses loopback, private,
//! link-local (the cloud metadata address with it), CGNAT, multicast,
//! unspecified and reserved addresses, and IPv6 forms that carry one of them
//! (IPv4-mapped, IPv4-compatible, NAT64, 6to4), unless `allow_private`
//! covers the address.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

/// What the command may reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum NetMode {
    /// No network at all: only loopback inside the sandbox's own namespace
    /// (bwrap, VM) or no IP sockets at all (landlock).
    #[default]
    None,
    /// The allowed names, through hull's proxy, and nothing else.
    Allowlist,
}

impl NetMode {
    pub fn as_str(self) -> &'static str {
        match self {
            NetMode::None => "none",
            NetMode::Allowlist => "allowlist",
        }
    }
}

/// The ports allowed when the policy names none.
pub const DEFAULT_PORTS: [u16; 2] = [443, 80];

/// The network part of a resolved policy (deserialized only from hull's
/// own serialization, by the proxy's process: `hull __net-proxy`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetPolicy {
    pub mode: NetMode,
    pub allow: Vec<HostPattern>,
    pub deny: Vec<HostPattern>,
    pub ports: Vec<u16>,
    /// Names hull resolves to fixed addresses (normalised names).
    pub hosts: BTreeMap<String, IpAddr>,
    /// Private ranges that may be reached.
    pub allow_private: Vec<IpNet>,
    /// `registry:NAME` entries of `allow`: the hosts of the registries the
    /// host's own clients use, resolved when a run starts
    /// (`net::registry`), then added to `allow` as exact names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub registries: Vec<Registry>,
}

/// A package registry named by its client (`registry:pip` in `allow`),
/// never by host: hull asks the client which hosts it uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Registry {
    Pip,
    Npm,
    Cargo,
    Apt,
}

impl Registry {
    pub const ALL: [Registry; 4] = [Registry::Pip, Registry::Npm, Registry::Cargo, Registry::Apt];
    /// The prefix of an `allow` entry that names a registry.
    pub const PREFIX: &'static str = "registry:";

    pub fn as_str(self) -> &'static str {
        match self {
            Registry::Pip => "pip",
            Registry::Npm => "npm",
            Registry::Cargo => "cargo",
            Registry::Apt => "apt",
        }
    }

    pub fn from_name(name: &str) -> Option<Registry> {
        Registry::ALL.into_iter().find(|r| r.as_str() == name)
    }
}

impl fmt::Display for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", Registry::PREFIX, self.as_str())
    }
}

impl Default for NetPolicy {
    fn default() -> NetPolicy {
        NetPolicy {
            mode: NetMode::None,
            allow: Vec::new(),
            deny: Vec::new(),
            ports: DEFAULT_PORTS.to_vec(),
            hosts: BTreeMap::new(),
            allow_private: Vec::new(),
            registries: Vec::new(),
        }
    }
}

/// A host as the command named it, in the one form names are compared in.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Host {
    Name(String),
    Ip(IpAddr),
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::Ip(IpAddr::V6(a)) => write!(f, "[{a}]"),
            Host::Ip(a) => write!(f, "{a}"),
        }
    }
}

/// An entry of `allow` or `deny`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HostPattern {
    /// This name only.
    Exact(String),
    /// `*.NAME`: every subdomain of NAME, not NAME itself.
    Subdomains(String),
    /// This address, written as a literal.
    Ip(IpAddr),
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostPattern::Exact(n) => f.write_str(n),
            HostPattern::Subdomains(n) => write!(f, "*.{n}"),
            HostPattern::Ip(a) => write!(f, "{a}"),
        }
    }
}

/// Why a name is not a host name hull accepts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("is empty")]
    Empty,
    #[error("contains a NUL, control character or space")]
    Control,
    #[error("ends in a dot")]
    TrailingDot,
    #[error("has an empty label")]
    EmptyLabel,
    #[error("is not a valid internationalised name")]
    Idna,
    #[error("has a character other than letters, digits, '-' and '_' in {label:?}")]
    Character { label: String },
    #[error("is longer than 253 characters, or has a label longer than 63")]
    TooLong,
    #[error("is an IP address written as a name ({0}); list the address itself")]
    NumericName(String),
    #[error("has a '*' other than a whole first label ('*.example')")]
    Wildcard,
    #[error("would allow every host (list the names instead)")]
    Everything,
}

/// Parses a host as a command gives it (a proxy request's host): an IP
/// literal (IPv6 in brackets or bare) or a name, normalised.
pub fn parse_host(raw: &str) -> Result<Host, NameError> {
    if raw.is_empty() {
        return Err(NameError::Empty);
    }
    if raw.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(NameError::Control);
    }
    let unbracketed = raw
        .strip_prefix('[')
        .and_then(|r| r.strip_suffix(']'))
        .unwrap_or(raw);
    if let Ok(ip) = unbracketed.parse::<IpAddr>() {
        return Ok(Host::Ip(ip));
    }
    normalise_name(raw).map(Host::Name)
}

/// A name in its compared form: IDNA to ASCII, lower case, checked.
pub fn normalise_name(raw: &str) -> Result<String, NameError> {
    if raw.is_empty() {
        return Err(NameError::Empty);
    }
    if raw.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(NameError::Control);
    }
    // Also the ideographic and other full stops IDNA maps to '.'.
    if raw.ends_with(['.', '\u{3002}', '\u{ff0e}', '\u{ff61}']) {
        return Err(NameError::TrailingDot);
    }
    let ascii = idna::domain_to_ascii(raw).map_err(|_| NameError::Idna)?;
    if ascii.is_empty() {
        return Err(NameError::Empty);
    }
    if ascii.ends_with('.') {
        return Err(NameError::TrailingDot);
    }
    if ascii.len() > 253 {
        return Err(NameError::TooLong);
    }
    for label in ascii.split('.') {
        if label.is_empty() {
            return Err(NameError::EmptyLabel);
        }
        if label.len() > 63 {
            return Err(NameError::TooLong);
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        {
            return Err(NameError::Character {
                label: label.to_string(),
            });
        }
    }
    // A resolver reads a name whose last label is a number as an IPv4
    // address (`127.1`, `0x7f000001`, `2130706433`): never a name.
    let last = ascii.rsplit('.').next().unwrap_or("");
    if is_number(last) {
        return Err(NameError::NumericName(ascii));
    }
    Ok(ascii)
}

/// Decimal, octal (leading 0) or hexadecimal (`0x`) digits: what
/// `inet_aton` takes as one part of an address.
fn is_number(label: &str) -> bool {
    let hex = label
        .strip_prefix("0x")
        .or_else(|| label.strip_prefix("0X"));
    match hex {
        Some(h) => h.bytes().all(|b| b.is_ascii_hexdigit()),
        None => !label.is_empty() && label.bytes().all(|b| b.is_ascii_digit()),
    }
}

impl HostPattern {
    /// Parses an `allow` or `deny` entry.
    pub fn parse(raw: &str) -> Result<HostPattern, NameError> {
        if raw == "*" {
            return Err(NameError::Everything);
        }
        if let Some(rest) = raw.strip_prefix("*.") {
            if rest.contains('*') {
                return Err(NameError::Wildcard);
            }
            return normalise_name(rest).map(HostPattern::Subdomains);
        }
        if raw.contains('*') {
            return Err(NameError::Wildcard);
        }
        match parse_host(raw)? {
            Host::Ip(ip) => Ok(HostPattern::Ip(ip)),
            Host::Name(n) => Ok(HostPattern::Exact(n)),
        }
    }

    pub fn matches(&self, host: &Host) -> bool {
        match (self, host) {
            (HostPattern::Exact(p), Host::Name(n)) => p == n,
            (HostPattern::Subdomains(p), Host::Name(n)) => n
                .strip_suffix(p.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            (HostPattern::Ip(p), Host::Ip(a)) => same_address(*p, *a),
            _ => false,
        }
    }
}

/// Equal, also across an IPv4 address and its IPv4-mapped IPv6 form.
fn same_address(a: IpAddr, b: IpAddr) -> bool {
    let canon = |x: IpAddr| match x {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(x),
        v4 => v4,
    };
    canon(a) == canon(b)
}

/// Why the proxy refuses a request or an address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("the policy's network mode is none")]
    NoNetwork,
    #[error("{host:?} is not a host name hull accepts: {source}")]
    BadName {
        host: String,
        #[source]
        source: NameError,
    },
    #[error("{host} is denied by the policy ({pattern})")]
    Denied { host: Host, pattern: HostPattern },
    #[error("{host} is not in the policy's allow list")]
    NotAllowed { host: Host },
    #[error("port {port} is not allowed (allowed: {allowed})")]
    Port { port: u16, allowed: String },
    #[error("{addr} is a {kind} address, which allow_private does not cover")]
    Address { addr: IpAddr, kind: &'static str },
}

impl Refusal {
    /// The policy line that would allow what was refused, for the line
    /// hull prints after the run (`None`: no line would: a name hull does
    /// not accept).
    pub fn allow_with(&self, port: u16) -> Option<String> {
        let net_addr = |a: &IpAddr| match a {
            IpAddr::V4(_) => format!("{a}/32"),
            IpAddr::V6(_) => format!("{a}/128"),
        };
        match self {
            Refusal::NoNetwork => Some(
                "[net] mode = \"allowlist\" with the host in allow = [...] (the build-net profile: --policy build-net)".into(),
            ),
            Refusal::BadName { .. } => None,
            Refusal::Denied { pattern, .. } => {
                Some(format!("the policy's [net] deny without \"{pattern}\""))
            }
            Refusal::NotAllowed { host } => Some(format!("[net] allow = [..., \"{host}\"]")),
            Refusal::Port { .. } => Some(format!("[net] ports = [..., {port}]")),
            Refusal::Address { addr, .. } => Some(format!(
                "[net] allow_private = [..., \"{}\"] (only if that address is meant to be reached)",
                net_addr(addr)
            )),
        }
    }
}

impl NetPolicy {
    /// Whether the command may ask for `host` on `port`: mode, the name's
    /// form, `deny` then `allow`, then the port. Returns the host in its
    /// compared form.
    pub fn check_request(&self, raw_host: &str, port: u16) -> Result<Host, Refusal> {
        if self.mode == NetMode::None {
            return Err(Refusal::NoNetwork);
        }
        let host = parse_host(raw_host).map_err(|source| Refusal::BadName {
            host: raw_host.to_string(),
            source,
        })?;
        if let Some(p) = self.deny.iter().find(|p| p.matches(&host)) {
            return Err(Refusal::Denied {
                host,
                pattern: p.clone(),
            });
        }
        if !self.allow.iter().any(|p| p.matches(&host)) {
            return Err(Refusal::NotAllowed { host });
        }
        if !self.ports.contains(&port) {
            return Err(Refusal::Port {
                port,
                allowed: self
                    .ports
                    .iter()
                    .map(u16::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        Ok(host)
    }

    /// The fixed address of a name, from `hosts`.
    pub fn fixed_address(&self, host: &Host) -> Option<IpAddr> {
        match host {
            Host::Name(n) => self.hosts.get(n).copied(),
            Host::Ip(a) => Some(*a),
        }
    }

    /// Whether hull may connect to `addr` (after resolving an allowed
    /// name): refused when it is of a kind [`address_kind`] names, unless
    /// `allow_private` covers it (or the address it carries).
    pub fn check_address(&self, addr: IpAddr) -> Result<(), Refusal> {
        let Some(kind) = address_kind(addr) else {
            return Ok(());
        };
        let carried = carried_v4(addr).map(IpAddr::V4);
        let covered = |a: IpAddr| self.allow_private.iter().any(|n| n.contains(&a));
        if covered(addr) || carried.is_some_and(covered) {
            return Ok(());
        }
        Err(Refusal::Address { addr, kind })
    }
}

/// The IPv4 address an IPv6 address carries and reaches: IPv4-mapped,
/// IPv4-compatible (deprecated), NAT64 (`64:ff9b::/96`) and 6to4
/// (`2002::/16`).
fn carried_v4(addr: IpAddr) -> Option<Ipv4Addr> {
    let IpAddr::V6(v6) = addr else {
        return None;
    };
    if let Some(v4) = v6.to_ipv4_mapped() {
        return Some(v4);
    }
    let s = v6.segments();
    let low = |a: u16, b: u16| Ipv4Addr::from(((a as u32) << 16) | b as u32);
    if s[..6] == [0, 0, 0, 0, 0, 0] && !(s[6] == 0 && s[7] <= 1) {
        return Some(low(s[6], s[7]));
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return Some(low(s[6], s[7]));
    }
    if s[0] == 0x2002 {
        return Some(low(s[1], s[2]));
    }
    None
}

/// The kind of an address hull does not connect to by default, or `None`
/// for an ordinary public address.
pub fn address_kind(addr: IpAddr) -> Option<&'static str> {
    match addr {
        IpAddr::V4(v4) => v4_kind(v4),
        IpAddr::V6(v6) => {
            // An address that carries an IPv4 address reaches that one.
            match carried_v4(addr) {
                Some(v4) => v4_kind(v4),
                None => v6_kind(v6),
            }
        }
    }
}

fn v4_kind(a: Ipv4Addr) -> Option<&'static str> {
    let o = a.octets();
    let kind = match o {
        [169, 254, 169, 254] => "cloud metadata",
        [0, ..] => "unspecified (0.0.0.0/8)",
        [127, ..] => "loopback",
        [10, ..] => "private (10.0.0.0/8)",
        [172, b, ..] if (16..32).contains(&b) => "private (172.16.0.0/12)",
        [192, 168, ..] => "private (192.168.0.0/16)",
        [169, 254, ..] => "link-local",
        [100, b, ..] if (64..128).contains(&b) => "shared CGNAT (100.64.0.0/10)",
        [192, 0, 0, _] => "IETF protocol assignment (192.0.0.0/24)",
        [198, 18..=19, ..] => "benchmarking (198.18.0.0/15)",
        [192, 0, 2, _] | [198, 51, 100, _] | [203, 0, 113, _] => "documentation",
        [224..=239, ..] => "multicast",
        [240..=255, ..] => "reserved (240.0.0.0/4, broadcast)",
        _ => return None,
    };
    Some(kind)
}

fn v6_kind(a: Ipv6Addr) -> Option<&'static str> {
    let s = a.segments();
    let kind = if a.is_unspecified() {
        "unspecified"
    } else if a.is_loopback() {
        "loopback"
    } else if s[0] & 0xfe00 == 0xfc00 {
        "unique local (fc00::/7)"
    } else if s[0] & 0xffc0 == 0xfe80 {
        "link-local"
    } else if s[0] & 0xffc0 == 0xfec0 {
        "site-local (deprecated)"
    } else if s[0] & 0xff00 == 0xff00 {
        "multicast"
    } else if s[0] == 0x2001 && s[1] == 0 {
        "Teredo tunnel (2001::/32)"
    } else if s[0] == 0x2001 && s[1] == 0xdb8 {
        "documentation"
    } else if s[0] == 0x0100 && s[1..4] == [0, 0, 0] {
        "discard-only (100::/64)"
    } else {
        return None;
    };
    Some(kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(allow: &[&str], deny: &[&str]) -> NetPolicy {
        NetPolicy {
            mode: NetMode::Allowlist,
            allow: allow
                .iter()
                .map(|a| HostPattern::parse(a).unwrap())
                .collect(),
            deny: deny
                .iter()
                .map(|a| HostPattern::parse(a).unwrap())
                .collect(),
            ..NetPolicy::default()
        }
    }

    #[test]
    fn names_are_compared_in_one_form() {
        assert_eq!(normalise_name("PkGs.Example").unwrap(), "pkgs.example");
        assert_eq!(
            normalise_name("bücher.example").unwrap(),
            "xn--bcher-kva.example"
        );
        assert_eq!(
            normalise_name("BÜCHER.example").unwrap(),
            "xn--bcher-kva.example"
        );
        // Full-width letters fold to ASCII under UTS 46.
        assert_eq!(normalise_name("ｐｋｇｓ.example").unwrap(), "pkgs.example");
        assert_eq!(
            normalise_name("_srv.pkgs.example").unwrap(),
            "_srv.pkgs.example"
        );
    }

    #[test]
    fn what_is_not_a_name_is_refused() {
        for (raw, want) in [
            ("", NameError::Empty),
            ("pkgs.example\0.evil", NameError::Control),
            ("pkgs.example\n", NameError::Control),
            ("pkgs .example", NameError::Control),
            ("pkgs.example.", NameError::TrailingDot),
            ("pkgs.example\u{3002}", NameError::TrailingDot),
            ("pkgs..example", NameError::EmptyLabel),
            ("127.1", NameError::NumericName("127.1".into())),
            ("0x7f000001", NameError::NumericName("0x7f000001".into())),
            ("2130706433", NameError::NumericName("2130706433".into())),
            ("evil.0x7f", NameError::NumericName("evil.0x7f".into())),
        ] {
            assert_eq!(normalise_name(raw), Err(want), "{raw:?}");
        }
        assert!(matches!(
            normalise_name("pkgs.exa%mple"),
            Err(NameError::Idna | NameError::Character { .. })
        ));
        assert!(matches!(
            normalise_name(&format!("{}.example", "a".repeat(64))),
            Err(NameError::TooLong | NameError::Idna)
        ));
        // A name with a numeric label that is not the last is a name.
        assert_eq!(normalise_name("1.pkgs.example").unwrap(), "1.pkgs.example");
    }

    #[test]
    fn patterns_parse_and_bad_ones_are_refused() {
        assert_eq!(
            HostPattern::parse("*.CDN.example").unwrap(),
            HostPattern::Subdomains("cdn.example".into())
        );
        assert_eq!(
            HostPattern::parse("[::1]").unwrap(),
            HostPattern::Ip("::1".parse().unwrap())
        );
        assert_eq!(HostPattern::parse("*"), Err(NameError::Everything));
        for bad in [
            "a*.example",
            "*example",
            "x.*.example",
            "*.*.example",
            "**.example",
        ] {
            assert_eq!(HostPattern::parse(bad), Err(NameError::Wildcard), "{bad}");
        }
    }

    #[test]
    fn a_wildcard_matches_subdomains_not_its_apex_or_lookalikes() {
        let p = policy(&["*.cdn.example"], &[]);
        assert!(p.check_request("a.cdn.example", 443).is_ok());
        assert!(p.check_request("a.b.CDN.example", 443).is_ok());
        for no in [
            "cdn.example",
            "evilcdn.example",
            "cdn.example.evil",
            "xcdn.example",
        ] {
            assert!(
                matches!(p.check_request(no, 443), Err(Refusal::NotAllowed { .. })),
                "{no}"
            );
        }
    }

    #[test]
    fn deny_beats_allow_and_empty_allow_refuses_everything() {
        let p = policy(
            &["*.pkgs.example", "pkgs.example"],
            &["private.pkgs.example"],
        );
        assert!(p.check_request("pkgs.example", 443).is_ok());
        assert!(p.check_request("public.pkgs.example", 80).is_ok());
        assert!(matches!(
            p.check_request("PRIVATE.pkgs.example", 443),
            Err(Refusal::Denied { .. })
        ));
        let empty = policy(&[], &[]);
        assert!(matches!(
            empty.check_request("pkgs.example", 443),
            Err(Refusal::NotAllowed { .. })
        ));
        let none = NetPolicy {
            mode: NetMode::None,
            ..policy(&["pkgs.example"], &[])
        };
        assert_eq!(
            none.check_request("pkgs.example", 443),
            Err(Refusal::NoNetwork)
        );
    }

    #[test]
    fn ports_and_ip_literals() {
        let p = policy(&["pkgs.example", "192.0.2.7"], &[]);
        assert!(matches!(
            p.check_request("pkgs.example", 22),
            Err(Refusal::Port { port: 22, .. })
        ));
        // A literal is allowed only where the address itself is listed,
        // whatever its spelling.
        assert!(p.check_request("192.0.2.7", 443).is_ok());
        assert!(p.check_request("[::ffff:192.0.2.7]", 443).is_ok());
        assert!(matches!(
            p.check_request("192.0.2.8", 443),
            Err(Refusal::NotAllowed { .. })
        ));
        assert!(matches!(
            p.check_request("0xc0000207", 443),
            Err(Refusal::BadName { .. })
        ));
    }

    #[test]
    fn addresses_that_reach_inside_are_refused_unless_covered() {
        let p = NetPolicy {
            allow_private: vec!["10.20.0.0/16".parse().unwrap()],
            ..policy(&["x.example"], &[])
        };
        for bad in [
            "127.0.0.1",
            "10.0.0.1",
            "172.16.5.4",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fd00:ec2::254",
            "fe80::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "64:ff9b::10.0.0.1",
            "2002:a00:1::",
        ] {
            let a: IpAddr = bad.parse().unwrap();
            assert!(
                matches!(p.check_address(a), Err(Refusal::Address { .. })),
                "{bad} should be refused"
            );
        }
        for good in [
            "93.184.215.14",
            "2606:2800:21f:cb07:6820:80da:af6b:8b2c",
            "::ffff:93.184.215.14",
            "10.20.3.4",
            "::ffff:10.20.3.4",
        ] {
            let a: IpAddr = good.parse().unwrap();
            assert_eq!(p.check_address(a), Ok(()), "{good} should be allowed");
        }
        assert_eq!(
            address_kind("169.254.169.254".parse().unwrap()),
            Some("cloud metadata")
        );
    }
}
