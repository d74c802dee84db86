//! The policy file: TOML text to a checked, still unresolved [`PolicyFile`].
//!
//! Every error names the file, the line and the key, and nothing is run on an
//! error. Unknown keys are errors (a typo must not silently widen or narrow
//! the boundary).

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::net::{HostPattern, NetMode, NetPolicy, Registry, DEFAULT_PORTS};
use crate::{GitMetadata, ProjectAt, VmPolicy};
use toml::Spanned;

/// A parse or validation error, located in its file.
#[derive(Debug, thiserror::Error)]
#[error("{file}:{line}: {key}: {message}")]
pub struct PolicyError {
    /// The file (or `profile NAME` for a shipped profile).
    pub file: String,
    /// 1-based line, 0 when unknown.
    pub line: usize,
    /// The dotted key, for example `fs.read_write[1]`.
    pub key: String,
    pub message: String,
}

/// A policy file as written, with source spans kept for later errors.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyFile {
    /// Format version; only 1 exists.
    pub version: Spanned<u32>,
    /// A one-line description shown by `hull policy explain`.
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub fs: FsSection,
    #[serde(default)]
    pub net: NetSection,
    #[serde(default)]
    pub limits: LimitsSection,
    #[serde(default)]
    pub env: EnvSection,
    #[serde(default)]
    pub vm: VmSection,
    #[serde(skip)]
    pub source: Source,
}

/// Where a policy file came from, to name it in errors.
#[derive(Debug, Clone, Default)]
pub struct Source {
    pub name: String,
    pub text: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FsSection {
    #[serde(default)]
    pub read: Vec<Spanned<String>>,
    #[serde(default)]
    pub read_exec: Vec<Spanned<String>>,
    #[serde(default)]
    pub read_write: Vec<Spanned<String>>,
    #[serde(default)]
    pub deny: Vec<Spanned<String>>,
    /// `.git` in the writable roots, and what git runs from the worktree:
    /// `read-only` (the default) or `writable` (the roots are then the
    /// command's whole: no `.hull` kept there either).
    #[serde(default)]
    pub git: Option<Spanned<String>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetSection {
    /// `"none"` (the default) or `"allowlist"`.
    #[serde(default)]
    pub mode: Option<Spanned<String>>,
    /// Host names (`*.NAME` for subdomains) or IP literals.
    #[serde(default)]
    pub allow: Vec<Spanned<String>>,
    /// Checked before `allow`.
    #[serde(default)]
    pub deny: Vec<Spanned<String>>,
    /// Destination ports; `[443, 80]` when absent.
    #[serde(default)]
    pub ports: Option<Vec<Spanned<i64>>>,
    /// Names hull resolves to fixed addresses.
    #[serde(default)]
    pub hosts: BTreeMap<String, Spanned<String>>,
    /// Private ranges (CIDR, or one address) that may be reached.
    #[serde(default)]
    pub allow_private: Vec<Spanned<String>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsSection {
    /// Wall time, humantime syntax: `90s`, `10m`, `1h 30m`.
    #[serde(default)]
    pub wall_time: Option<Spanned<String>>,
    /// Memory: `512MiB`, `2GiB`, or bytes.
    #[serde(default)]
    pub memory: Option<Spanned<String>>,
    #[serde(default)]
    pub pids: Option<Spanned<u64>>,
    #[serde(default)]
    pub cpus: Option<Spanned<u32>>,
}

/// What tier 3's container holds beyond the image's default userland.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmSection {
    /// Debian packages added to the container image (an image of its own,
    /// built once and cached by its package list).
    #[serde(default)]
    pub packages: Vec<Spanned<String>>,
    /// A whole userland from a tarball (an absolute path), instead of the
    /// image's: checked entry by entry before use.
    #[serde(default)]
    pub rootfs: Option<Spanned<String>>,
    /// A whole userland from a container image (`oci-archive:PATH`,
    /// `docker-archive:PATH`, `oci:DIR[:TAG]`): its layers flattened,
    /// then checked as a rootfs is.
    #[serde(default)]
    pub image: Option<Spanned<String>>,
    /// Where the container sees the project: `"image"` (the image's
    /// `WorkingDir`, the default), `"host"` (the host's path) or an
    /// absolute path.
    #[serde(default)]
    pub project_at: Option<Spanned<String>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvSection {
    #[serde(default)]
    pub pass: Vec<Spanned<String>>,
    #[serde(default)]
    pub set: BTreeMap<String, Spanned<String>>,
}

impl PolicyFile {
    /// Parses policy text. `name` is the file path or `profile NAME`.
    pub fn parse(name: &str, text: &str) -> Result<PolicyFile, PolicyError> {
        let mut pf: PolicyFile = toml::from_str(text).map_err(|e| {
            let line = e.span().map(|s| line_of(text, s.start)).unwrap_or(0);
            let key = e
                .message()
                .split('`')
                .nth(1)
                .map(str::to_string)
                .unwrap_or_else(|| "(document)".to_string());
            PolicyError {
                file: name.to_string(),
                line,
                key,
                message: e.message().trim().to_string(),
            }
        })?;
        pf.source = Source {
            name: name.to_string(),
            text: text.to_string(),
        };
        if *pf.version.get_ref() != 1 {
            return Err(pf.error_at(
                pf.version.span(),
                "version",
                format!(
                    "unsupported version {}; this hull reads version 1",
                    pf.version.get_ref()
                ),
            ));
        }
        pf.net_policy()?;
        pf.vm_policy()?;
        for (k, v) in &pf.env.set {
            if !valid_env_name(k) {
                return Err(pf.error_at(
                    v.span(),
                    &format!("env.set.{k}"),
                    "not a valid variable name".into(),
                ));
            }
        }
        for (i, v) in pf.env.pass.iter().enumerate() {
            if !valid_env_name(v.get_ref()) {
                return Err(pf.error_at(
                    v.span(),
                    &format!("env.pass[{i}]"),
                    format!("{:?} is not a valid variable name", v.get_ref()),
                ));
            }
        }
        Ok(pf)
    }

    /// Reads and parses a policy file from disk.
    pub fn load(path: &Path) -> Result<PolicyFile, PolicyError> {
        let text = std::fs::read_to_string(path).map_err(|e| PolicyError {
            file: path.display().to_string(),
            line: 0,
            key: "(file)".into(),
            message: format!("cannot read: {e}"),
        })?;
        PolicyFile::parse(&path.display().to_string(), &text)
    }

    /// This policy's text with `fs.git = "writable"` where it sets no
    /// `fs.git` (one that says `read-only` keeps it): the policy of a copy
    /// that nobody uses git in on the host, a session's `copy` workspace.
    /// The rest means what it meant (relative paths are the project's, not
    /// the file's).
    pub fn git_writable_text(&self) -> Result<String, PolicyError> {
        self.rewritten(
            "for a copy nobody uses git in on the host: fs.git = \"writable\" unless it said otherwise",
            |doc| {
                if let toml::Value::Table(fs) = table(doc, "fs") {
                    fs.entry("git").or_insert_with(|| {
                        toml::Value::String(GitMetadata::Writable.as_str().into())
                    });
                }
            },
        )
    }

    /// This policy's text with the container image `reference` as tier
    /// 3's whole userland (`[vm] image`, its `packages` and `rootfs` gone):
    /// a session of that image. The reference is checked when the text is
    /// read.
    pub fn with_image_text(&self, reference: &str) -> Result<String, PolicyError> {
        self.rewritten(
            &format!("with the container image {reference:?} as tier 3's userland"),
            |doc| {
                if let toml::Value::Table(vm) = table(doc, "vm") {
                    vm.remove("packages");
                    vm.remove("rootfs");
                    vm.insert("image".into(), toml::Value::String(reference.into()));
                }
            },
        )
    }

    /// This policy's text as `edit` changes its document, under a comment
    /// naming it and `what` was changed.
    fn rewritten(
        &self,
        what: &str,
        edit: impl FnOnce(&mut toml::Table),
    ) -> Result<String, PolicyError> {
        let mut doc: toml::Table = toml::from_str(&self.source.text).map_err(|e| PolicyError {
            file: self.source.name.clone(),
            line: 0,
            key: "(document)".into(),
            message: e.message().to_string(),
        })?;
        edit(&mut doc);
        let body = toml::to_string(&doc).map_err(|e| PolicyError {
            file: self.source.name.clone(),
            line: 0,
            key: "(document)".into(),
            message: e.to_string(),
        })?;
        Ok(format!(
            "# {}, {}\n{body}",
            self.source.name.replace('\n', " "),
            what.replace('\n', " ")
        ))
    }

    /// An error located at a span of this file.
    pub fn error_at(&self, span: Range<usize>, key: &str, message: String) -> PolicyError {
        PolicyError {
            file: self.source.name.clone(),
            line: line_of(&self.source.text, span.start),
            key: key.to_string(),
            message,
        }
    }

    /// The `[vm]` section, checked: package names as Debian writes them
    /// (they reach the image build's package list, so nothing else passes),
    /// at most [`MAX_VM_PACKAGES`]; sorted and without repeats, so one
    /// userland has one list whatever the order it was written in.
    pub fn vm_policy(&self) -> Result<VmPolicy, PolicyError> {
        let list = &self.vm.packages;
        if list.len() > MAX_VM_PACKAGES {
            return Err(self.error_at(
                list[MAX_VM_PACKAGES].span(),
                "vm.packages",
                format!("more than {MAX_VM_PACKAGES} packages"),
            ));
        }
        let mut packages = Vec::with_capacity(list.len());
        for (i, p) in list.iter().enumerate() {
            if !valid_debian_package(p.get_ref()) {
                return Err(self.error_at(
                    p.span(),
                    &format!("vm.packages[{i}]"),
                    format!(
                        "{:?} is not a Debian package name (lowercase letters, digits, `+`, `-`, `.`; \
                         at least two characters, starting with a letter or digit, not ending \
                         with `-`)",
                        p.get_ref()
                    ),
                ));
            }
            packages.push(p.get_ref().clone());
        }
        packages.sort();
        packages.dedup();
        let rootfs = match &self.vm.rootfs {
            None => None,
            Some(r) => {
                let p = PathBuf::from(r.get_ref());
                if !p.is_absolute() || r.get_ref().contains('\0') {
                    return Err(self.error_at(
                        r.span(),
                        "vm.rootfs",
                        format!("{:?} is not an absolute path", r.get_ref()),
                    ));
                }
                if !packages.is_empty() {
                    return Err(self.error_at(
                        r.span(),
                        "vm.rootfs",
                        "a rootfs tarball comes with its own programs: `packages` would have to run \
                         its package manager, which hull does not do outside the VM; install them in \
                         the tarball instead"
                            .into(),
                    ));
                }
                Some(p)
            }
        };
        let image = match &self.vm.image {
            None => None,
            Some(r) => {
                let text = r.get_ref();
                let known = [
                    "oci-archive:",
                    "docker-archive:",
                    "oci:",
                    "docker://",
                    "sha256:",
                ];
                if !known.iter().any(|k| text.starts_with(k)) || text.contains('\0') {
                    return Err(self.error_at(
                        r.span(),
                        "vm.image",
                        format!(
                            "{text:?} is not an image reference (oci-archive:PATH, \
                             docker-archive:PATH, oci:DIR[:TAG], docker://HOST/NAME[:TAG], \
                             sha256:DIGEST)"
                        ),
                    ));
                }
                if rootfs.is_some() || !packages.is_empty() {
                    return Err(self.error_at(
                        r.span(),
                        "vm.image",
                        "an image is a whole userland: give it without `rootfs` and `packages` \
                         (install packages in the image instead)"
                            .into(),
                    ));
                }
                Some(text.clone())
            }
        };
        let project_at = match &self.vm.project_at {
            None => ProjectAt::Image,
            Some(p) => match p.get_ref().as_str() {
                "image" => ProjectAt::Image,
                "host" => ProjectAt::Host,
                text => {
                    let path = PathBuf::from(text);
                    crate::check_project_at(&path).map_err(|why| {
                        self.error_at(
                            p.span(),
                            "vm.project_at",
                            format!(
                                "{text:?} {why}: give \"image\" (the image's WorkingDir), \
                                 \"host\" (the host's path) or another absolute path"
                            ),
                        )
                    })?;
                    ProjectAt::Path(path)
                }
            },
        };
        Ok(VmPolicy {
            packages,
            rootfs,
            image,
            project_at,
        })
    }

    /// `fs.git`, checked: what the command may do to git metadata in its
    /// writable roots.
    pub fn git_metadata(&self) -> Result<GitMetadata, PolicyError> {
        match &self.fs.git {
            None => Ok(GitMetadata::ReadOnly),
            Some(g) => match g.get_ref().as_str() {
                "read-only" => Ok(GitMetadata::ReadOnly),
                "writable" => Ok(GitMetadata::Writable),
                other => Err(self.error_at(
                    g.span(),
                    "fs.git",
                    format!("unknown value {other:?}; supported: \"read-only\" (the default), \"writable\""),
                )),
            },
        }
    }

    /// The `[net]` section, checked: every bad entry is an error at its
    /// line.
    pub fn net_policy(&self) -> Result<NetPolicy, PolicyError> {
        let n = &self.net;
        let mode = match &n.mode {
            None => NetMode::None,
            Some(m) => match m.get_ref().as_str() {
                "none" => NetMode::None,
                "allowlist" => NetMode::Allowlist,
                other => {
                    return Err(self.error_at(
                        m.span(),
                        "net.mode",
                        format!("unknown mode {other:?}; supported: \"none\", \"allowlist\""),
                    ))
                }
            },
        };
        // Each entry with its index in the list, for the error's key.
        let patterns = |key: &str, list: Vec<(usize, &Spanned<String>)>| {
            list.into_iter()
                .map(|(i, e)| {
                    HostPattern::parse(e.get_ref()).map_err(|why| {
                        self.error_at(
                            e.span(),
                            &format!("{key}[{i}]"),
                            format!("{:?} {why}", e.get_ref()),
                        )
                    })
                })
                .collect::<Result<Vec<_>, _>>()
        };
        // `registry:NAME` entries of allow name a client's registries.
        let mut registries = Vec::new();
        let mut plain = Vec::new();
        for (i, e) in n.allow.iter().enumerate() {
            match e.get_ref().strip_prefix(Registry::PREFIX) {
                Some(name) => {
                    let r = Registry::from_name(name).ok_or_else(|| {
                        self.error_at(
                            e.span(),
                            &format!("net.allow[{i}]"),
                            format!(
                                "{:?} is not a registry hull knows: {}",
                                e.get_ref(),
                                Registry::ALL.map(|r| r.to_string()).join(", ")
                            ),
                        )
                    })?;
                    if !registries.contains(&r) {
                        registries.push(r);
                    }
                }
                None => plain.push((i, e)),
            }
        }
        let allow = patterns("net.allow", plain)?;
        if let Some((i, e)) = n
            .deny
            .iter()
            .enumerate()
            .find(|(_, e)| e.get_ref().starts_with(Registry::PREFIX))
        {
            return Err(self.error_at(
                e.span(),
                &format!("net.deny[{i}]"),
                format!(
                    "{:?}: a registry can only be allowed; deny its hosts by name",
                    e.get_ref()
                ),
            ));
        }
        let deny = patterns("net.deny", n.deny.iter().enumerate().collect())?;
        let ports = match &n.ports {
            None => DEFAULT_PORTS.to_vec(),
            Some(list) => list
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    u16::try_from(*p.get_ref())
                        .ok()
                        .filter(|&p| p != 0)
                        .ok_or_else(|| {
                            self.error_at(
                                p.span(),
                                &format!("net.ports[{i}]"),
                                format!("{} is not a port (1-65535)", p.get_ref()),
                            )
                        })
                })
                .collect::<Result<Vec<_>, _>>()?,
        };
        let mut hosts = BTreeMap::new();
        for (name, addr) in &n.hosts {
            let key = format!("net.hosts.{name}");
            let normal = crate::net::normalise_name(name)
                .map_err(|why| self.error_at(addr.span(), &key, format!("{name:?} {why}")))?;
            let ip = addr.get_ref().parse::<std::net::IpAddr>().map_err(|_| {
                self.error_at(
                    addr.span(),
                    &key,
                    format!("{:?} is not an IP address", addr.get_ref()),
                )
            })?;
            if hosts.insert(normal.clone(), ip).is_some() {
                return Err(self.error_at(
                    addr.span(),
                    &key,
                    format!(
                        "{normal} is given twice (names are compared in lower case, IDNA form)"
                    ),
                ));
            }
        }
        let allow_private = n
            .allow_private
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let t = e.get_ref();
                t.parse::<ipnet::IpNet>()
                    .or_else(|_| t.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                    .map_err(|_| {
                        self.error_at(
                            e.span(),
                            &format!("net.allow_private[{i}]"),
                            format!("{t:?} is not an address range (CIDR, as 10.20.0.0/16) or an address"),
                        )
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if mode == NetMode::None {
            // Entries with mode none would be ignored: a policy that reads
            // as "these hosts" must not quietly mean "no network".
            let given = [
                ("net.allow", n.allow.first().map(|e| e.span())),
                ("net.deny", n.deny.first().map(|e| e.span())),
                (
                    "net.allow_private",
                    n.allow_private.first().map(|e| e.span()),
                ),
                ("net.hosts", n.hosts.values().next().map(|e| e.span())),
            ];
            if let Some((key, Some(span))) = given.into_iter().find(|(_, s)| s.is_some()) {
                return Err(self.error_at(
                    span,
                    key,
                    "is set but net.mode is \"none\" (the default): set mode = \"allowlist\", or remove it".into(),
                ));
            }
        }
        Ok(NetPolicy {
            mode,
            allow,
            deny,
            ports,
            hosts,
            allow_private,
            registries,
        })
    }

    /// Every path entry with its key, in file order: `(key, index, value)`.
    pub fn path_entries(&self) -> impl Iterator<Item = (&'static str, usize, &Spanned<String>)> {
        let f = &self.fs;
        [
            ("fs.read", &f.read),
            ("fs.read_exec", &f.read_exec),
            ("fs.read_write", &f.read_write),
            ("fs.deny", &f.deny),
        ]
        .into_iter()
        .flat_map(|(k, v)| v.iter().enumerate().map(move |(i, s)| (k, i, s)))
    }

    /// The file's path if it was loaded from disk (for relative includes later).
    pub fn path(&self) -> PathBuf {
        PathBuf::from(&self.source.name)
    }
}

fn valid_env_name(s: &str) -> bool {
    !s.is_empty()
        && !s.as_bytes()[0].is_ascii_digit()
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// 1-based line number of a byte offset.
pub fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// The most packages one `[vm]` section may add.
pub const MAX_VM_PACKAGES: usize = 256;

/// A Debian package name (Debian Policy 5.6.1): lowercase letters, digits,
/// `+`, `-` and `.`, at least two characters, starting with a letter or
/// digit; at most 128 here; not ending with `-`, which apt reads as
/// "remove" (whether a name is a package of the mirror's, not a pattern
/// apt would expand, the image build checks against the mirror).
pub fn valid_debian_package(name: &str) -> bool {
    let b = name.as_bytes();
    b.len() >= 2
        && !name.ends_with('-')
        && b.len() <= 128
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"+-.".contains(c))
}

/// The table `key` of `doc`, made when missing.
fn table<'a>(doc: &'a mut toml::Table, key: &str) -> &'a mut toml::Value {
    doc.entry(key)
        .or_insert_with(|| toml::Value::Table(toml::Table::new()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_key_names_line_and_key() {
        let text = "version = 1\n[fs]\nread = []\nwrite = [\"/x\"]\n";
        let e = PolicyFile::parse("p.toml", text).unwrap_err();
        assert_eq!(e.file, "p.toml");
        assert_eq!(e.line, 4, "{e}");
        assert_eq!(e.key, "write", "{e}");
    }

    /// Every shipped profile, made a copy's: fs.git writable, the rest as
    /// it was; a policy that says read-only keeps it.
    #[test]
    fn a_copy_s_policy_is_the_policy_with_git_writable() {
        for (name, _) in crate::profiles::PROFILES {
            let pf = crate::profiles::load(name).unwrap();
            let text = pf.git_writable_text().unwrap();
            let copy = PolicyFile::parse("copy", &text).unwrap();
            assert_eq!(
                copy.git_metadata().unwrap(),
                GitMetadata::Writable,
                "{name}"
            );
            assert_eq!(copy.fs.read.len(), pf.fs.read.len(), "{name}");
            assert_eq!(copy.fs.read_write.len(), pf.fs.read_write.len(), "{name}");
            assert_eq!(
                copy.net_policy().unwrap(),
                pf.net_policy().unwrap(),
                "{name}"
            );
            assert_eq!(copy.env.set.len(), pf.env.set.len(), "{name}");
            assert!(text.starts_with(&format!("# profile {name},")), "{text}");
        }
        let with = PolicyFile::parse("p", "version = 1\n[vm]\npackages = [\"git\"]\n").unwrap();
        let text = with.with_image_text("oci-archive:/i.tar").unwrap();
        let image = PolicyFile::parse("image", &text)
            .unwrap()
            .vm_policy()
            .unwrap();
        assert_eq!(image.image.as_deref(), Some("oci-archive:/i.tar"));
        assert!(
            image.packages.is_empty() && image.rootfs.is_none(),
            "{text}"
        );
        let bad = with.with_image_text("ubuntu").unwrap();
        assert!(PolicyFile::parse("image", &bad).is_err(), "{bad}");
        let kept = PolicyFile::parse("p", "version = 1\n[fs]\ngit = \"read-only\"\n").unwrap();
        let text = kept.git_writable_text().unwrap();
        let again = PolicyFile::parse("copy", &text).unwrap();
        assert_eq!(again.git_metadata().unwrap(), GitMetadata::ReadOnly);
    }

    #[test]
    fn the_net_section_is_checked_entry_by_entry() {
        let ok = "version = 1\n[net]\nmode = \"allowlist\"\nallow = [\"Pkgs.Example\", \"*.cdn.example\"]\ndeny = [\"x.pkgs.example\"]\nports = [443]\nhosts = { \"pkgs.test\" = \"127.0.0.1\" }\nallow_private = [\"10.20.0.0/16\", \"127.0.0.1\"]\n";
        let n = PolicyFile::parse("p.toml", ok)
            .unwrap()
            .net_policy()
            .unwrap();
        assert_eq!(n.mode, NetMode::Allowlist);
        assert_eq!(n.allow[0], HostPattern::Exact("pkgs.example".into()));
        assert_eq!(n.allow[1], HostPattern::Subdomains("cdn.example".into()));
        assert_eq!(n.ports, vec![443]);
        assert_eq!(n.hosts["pkgs.test"].to_string(), "127.0.0.1");
        assert_eq!(n.allow_private[1].to_string(), "127.0.0.1/32");
        // `registry:NAME` is kept apart, each once, for the run to resolve.
        let reg = "version = 1\n[net]\nmode = \"allowlist\"\nallow = [\"registry:npm\", \"a.example\", \"registry:pip\", \"registry:npm\"]\n";
        let n = PolicyFile::parse("p.toml", reg)
            .unwrap()
            .net_policy()
            .unwrap();
        assert_eq!(n.registries, vec![Registry::Npm, Registry::Pip]);
        assert_eq!(n.allow, vec![HostPattern::Exact("a.example".into())]);
        // The default: no network, ports 443 and 80 should it be opened.
        let n = PolicyFile::parse("p.toml", "version = 1\n")
            .unwrap()
            .net_policy()
            .unwrap();
        assert_eq!((n.mode, n.ports), (NetMode::None, DEFAULT_PORTS.to_vec()));
        for (body, line, key) in [
            ("mode = \"open\"", 3, "net.mode"),
            ("mode = \"allowlist\"\nallow = [\"a.example\",\n \"*\"]", 5, "net.allow[1]"),
            ("mode = \"allowlist\"\nallow = [\"a*.example\"]", 4, "net.allow[0]"),
            ("mode = \"allowlist\"\ndeny = [\"pkgs.example.\"]", 4, "net.deny[0]"),
            ("mode = \"allowlist\"\nports = [443, 0]", 4, "net.ports[1]"),
            ("mode = \"allowlist\"\nports = [65536]", 4, "net.ports[0]"),
            ("mode = \"allowlist\"\nallow_private = [\"10.0.0.0/33\"]", 4, "net.allow_private[0]"),
            ("mode = \"allowlist\"\nhosts = { \"a.test\" = \"1.2.3\" }", 4, "net.hosts.a.test"),
            ("mode = \"allowlist\"\nhosts = { \"127.1\" = \"1.2.3.4\" }", 4, "net.hosts.127.1"),
            ("mode = \"allowlist\"\nhosts = { \"A.test\" = \"1.2.3.4\", \"a.test\" = \"1.2.3.5\" }", 4, "net.hosts.a.test"),
            // Entries under mode none would be ignored: an error instead.
            ("allow = [\"a.example\"]", 3, "net.allow"),
            ("mode = \"none\"\nallow_private = [\"10.0.0.0/8\"]", 4, "net.allow_private"),
            // Registries: only the clients hull knows, and only in allow.
            ("mode = \"allowlist\"\nallow = [\"registry:pip\", \"registry:gems\"]", 4, "net.allow[1]"),
            ("mode = \"allowlist\"\ndeny = [\"registry:npm\"]", 4, "net.deny[0]"),
        ] {
            let text = format!("version = 1\n[net]\n{body}\n");
            let e = PolicyFile::parse("p.toml", &text).unwrap_err();
            assert_eq!((e.line, e.key.as_str()), (line, key), "{body}: {e}");
        }
    }

    #[test]
    fn vm_packages_are_debian_names_sorted_once() {
        let ok = "version = 1\n[vm]\npackages = [\"python3-pip\", \"g++\", \"nodejs\", \"python3-pip\", \"libc6.1-dev\"]\n";
        let v = PolicyFile::parse("p.toml", ok)
            .unwrap()
            .vm_policy()
            .unwrap();
        assert_eq!(v.packages, ["g++", "libc6.1-dev", "nodejs", "python3-pip"]);
        let none = PolicyFile::parse("p.toml", "version = 1\n").unwrap();
        assert!(none.vm_policy().unwrap().packages.is_empty());
        // Nothing that is not a package name reaches the build's list.
        for bad in [
            "a",
            "Nodejs",
            "-x",
            ".x",
            "a,b",
            "a b",
            "a\\nb",
            "nodejs=18",
            "pkg/bookworm",
            "x:amd64",
            "nodejs-",
            "$(id)",
            "",
        ] {
            let text = format!("version = 1\n[vm]\npackages = [\"git\",\n {bad:?}]\n");
            let e = PolicyFile::parse("p.toml", &text).unwrap_err();
            assert_eq!(
                (e.line, e.key.as_str()),
                (4, "vm.packages[1]"),
                "{bad}: {e}"
            );
        }
        let many: Vec<String> = (0..=MAX_VM_PACKAGES).map(|i| format!("\"p{i}\"")).collect();
        let text = format!("version = 1\n[vm]\npackages = [{}]\n", many.join(", "));
        let e = PolicyFile::parse("p.toml", &text).unwrap_err();
        assert_eq!(e.key, "vm.packages", "{e}");
        // An image: a reference in one of the forms, and alone.
        let e = PolicyFile::parse("p.toml", "version = 1\n[vm]\nimage = \"x\"\n").unwrap_err();
        assert_eq!((e.line, e.key.as_str()), (3, "vm.image"), "{e}");
        assert!(e.to_string().contains("oci-archive:PATH"), "{e}");
        let both = "version = 1\n[vm]\nrootfs = \"/r.tar\"\nimage = \"oci:/l\"\n";
        let e = PolicyFile::parse("p.toml", both).unwrap_err();
        assert_eq!((e.line, e.key.as_str()), (4, "vm.image"), "{e}");
        let v = PolicyFile::parse("p.toml", "version = 1\n[vm]\nimage = \"oci:/l:v1\"\n")
            .unwrap()
            .vm_policy()
            .unwrap();
        assert_eq!(v.image.as_deref(), Some("oci:/l:v1"));
        // A rootfs: an absolute path, and not with packages.
        let ok = "version = 1\n[vm]\nrootfs = \"/srv/rootfs.tar\"\n";
        let v = PolicyFile::parse("p.toml", ok)
            .unwrap()
            .vm_policy()
            .unwrap();
        assert_eq!(v.rootfs.as_deref(), Some(Path::new("/srv/rootfs.tar")));
        for (body, line) in [
            ("rootfs = \"rootfs.tar\"", 3),
            ("packages = [\"git\"]\nrootfs = \"/srv/rootfs.tar\"", 4),
        ] {
            let text = format!("version = 1\n[vm]\n{body}\n");
            let e = PolicyFile::parse("p.toml", &text).unwrap_err();
            assert_eq!((e.line, e.key.as_str()), (line, "vm.rootfs"), "{body}: {e}");
        }
    }

    #[test]
    fn wrong_type_is_an_error() {
        let text = "version = 1\n[limits]\npids = \"many\"\n";
        let e = PolicyFile::parse("p.toml", text).unwrap_err();
        assert_eq!(e.line, 3, "{e}");
        assert!(!e.message.is_empty(), "{e}");
        assert!(e.to_string().starts_with("p.toml:3:"), "{e}");
    }

    #[test]
    fn unsupported_net_mode_is_an_error() {
        let text = "version = 1\n[net]\nmode = \"open\"\n";
        let e = PolicyFile::parse("p.toml", text).unwrap_err();
        assert_eq!((e.line, e.key.as_str()), (3, "net.mode"), "{e}");
    }

    #[test]
    fn version_is_required_and_checked() {
        assert!(PolicyFile::parse("p", "[fs]\n").is_err());
        let e = PolicyFile::parse("p", "version = 2\n").unwrap_err();
        assert_eq!(e.key, "version");
    }

    #[test]
    fn bad_env_name() {
        let e = PolicyFile::parse("p", "version = 1\n[env]\npass = [\"A-B\"]\n").unwrap_err();
        assert_eq!(e.key, "env.pass[0]");
    }
}
