//! The policy file: TOML text to a checked, still unresolved [`PolicyFile`].
//!
//! Every error names the file, the line and the key, and nothing is run on an
//! error. Unknown keys are errors (a typo must not silently widen or narrow
//! the boundary).

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::Deserialize;
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
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetSection {
    #[serde(default)]
    pub mode: Option<Spanned<String>>,
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
        if let Some(mode) = &pf.net.mode {
            if mode.get_ref() != "none" {
                return Err(pf.error_at(
                    mode.span(),
                    "net.mode",
                    format!(
                        "unknown mode {:?}; supported: \"none\" (allowlists are not implemented yet)",
                        mode.get_ref()
                    ),
                ));
            }
        }
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

    /// An error located at a span of this file.
    pub fn error_at(&self, span: Range<usize>, key: &str, message: String) -> PolicyError {
        PolicyError {
            file: self.source.name.clone(),
            line: line_of(&self.source.text, span.start),
            key: key.to_string(),
            message,
        }
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

    #[test]
    fn wrong_type_is_an_error() {
        let text = "version = 1\n[limits]\npids = \"many\"\n";
        let e = PolicyFile::parse("p.toml", text).unwrap_err();
        assert_eq!(e.line, 3, "{e}");
        assert!(e.message.contains("integer"), "{e}");
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
