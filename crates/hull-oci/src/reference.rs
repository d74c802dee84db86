//! Image references, as skopeo names them: `oci-archive:PATH`,
//! `docker-archive:PATH`, `oci:DIR[:TAG]` and `docker://HOST/NAME[:TAG]`
//! (or `@sha256:DIGEST`); and `sha256:DIGEST`, an image hull has imported.

use std::path::PathBuf;

/// Where an image comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reference {
    /// A tar of an OCI layout (`buildah push IMG oci-archive:PATH`).
    OciArchive(PathBuf),
    /// What `docker save` writes.
    DockerArchive(PathBuf),
    /// An OCI layout directory, and the tag of the manifest to take (its
    /// only manifest when none is named).
    OciLayout { dir: PathBuf, tag: Option<String> },
    /// An image in a registry: `tag` is a tag, or the manifest's digest
    /// (`sha256:HEX`, written after `@`).
    Registry {
        host: String,
        name: String,
        tag: String,
    },
    /// An image already imported into hull's cache, by the digest `hull
    /// image list` shows (`sha256:HEX`, whole).
    Imported(String),
}

impl Reference {
    /// Whether a registry reference names its manifest by digest.
    pub fn is_pinned(&self) -> bool {
        matches!(self, Reference::Registry { tag, .. } if tag.starts_with("sha256:"))
    }
}

#[derive(Debug, thiserror::Error)]
#[error(
    "image reference {reference:?}: {why} (the forms: oci-archive:PATH, docker-archive:PATH, \
     oci:DIR[:TAG], docker://HOST/NAME[:TAG|@sha256:DIGEST], sha256:DIGEST)"
)]
pub struct ReferenceError {
    pub reference: String,
    pub why: String,
}

impl std::str::FromStr for Reference {
    type Err = ReferenceError;

    fn from_str(s: &str) -> Result<Reference, ReferenceError> {
        let refuse = |why: &str| ReferenceError {
            reference: s.to_string(),
            why: why.to_string(),
        };
        let path = |p: &str| {
            if p.is_empty() {
                return Err(refuse("no path"));
            }
            if p.contains('\0') {
                return Err(refuse("a NUL byte in the path"));
            }
            Ok(PathBuf::from(p))
        };
        if let Some(h) = s.strip_prefix("sha256:") {
            check_hex(h).map_err(|why| refuse(&why))?;
            return Ok(Reference::Imported(s.to_string()));
        }
        if let Some(p) = s.strip_prefix("oci-archive:") {
            return Ok(Reference::OciArchive(path(p)?));
        }
        if let Some(p) = s.strip_prefix("docker-archive:") {
            return Ok(Reference::DockerArchive(path(p)?));
        }
        if let Some(rest) = s.strip_prefix("oci:") {
            // A tag is what follows the last `:` after the last `/`.
            let (dir, tag) = match rest.rsplit_once(':') {
                Some((d, t)) if !t.contains('/') && !d.is_empty() => (d, Some(t)),
                _ => (rest, None),
            };
            if let Some(t) = tag {
                check_tag(t).map_err(|why| refuse(&why))?;
            }
            return Ok(Reference::OciLayout {
                dir: path(dir)?,
                tag: tag.map(str::to_string),
            });
        }
        if let Some(rest) = s.strip_prefix("docker://") {
            let (host, name) = rest
                .split_once('/')
                .ok_or_else(|| refuse("no image name after the registry's host"))?;
            if host.is_empty()
                || !host
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']'))
            {
                return Err(refuse("the registry's host is not a host name[:port]"));
            }
            if !host.contains('.') && !host.contains(':') && host != "localhost" {
                return Err(refuse(
                    "name the registry's host (hull assumes no default registry)",
                ));
            }
            let (name, tag) = match (name.split_once('@'), name.rsplit_once(':')) {
                (Some((n, d)), _) => {
                    let h = d.strip_prefix("sha256:").ok_or_else(|| {
                        refuse("a registry image is pinned by @sha256:DIGEST only")
                    })?;
                    check_hex(h).map_err(|why| refuse(&why))?;
                    (n, d)
                }
                (None, Some((n, t))) if !t.contains('/') => (n, t),
                _ => (name, "latest"),
            };
            if name.is_empty()
                || !name.split('/').all(|c| {
                    !c.is_empty()
                        && c.chars().all(|ch| {
                            ch.is_ascii_lowercase() || ch.is_ascii_digit() || "._-".contains(ch)
                        })
                })
            {
                return Err(refuse("the image name is not a repository path"));
            }
            if !tag.starts_with("sha256:") {
                check_tag(tag).map_err(|why| refuse(&why))?;
            }
            return Ok(Reference::Registry {
                host: host.to_string(),
                name: name.to_string(),
                tag: tag.to_string(),
            });
        }
        Err(refuse("unknown form"))
    }
}

/// The hex of a whole sha256 digest: 64 lowercase hex digits.
fn check_hex(h: &str) -> Result<(), String> {
    match h.len() == 64 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        true => Ok(()),
        false => Err(format!(
            "{h:?} is not the 64 lowercase hex digits of a sha256 digest"
        )),
    }
}

fn check_tag(t: &str) -> Result<(), String> {
    let ok = !t.is_empty()
        && t.len() <= 128
        && t.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    match ok {
        true => Ok(()),
        false => Err(format!("the tag {t:?} is not a tag")),
    }
}

impl std::fmt::Display for Reference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reference::OciArchive(p) => write!(f, "oci-archive:{}", p.display()),
            Reference::DockerArchive(p) => write!(f, "docker-archive:{}", p.display()),
            Reference::OciLayout { dir, tag: None } => write!(f, "oci:{}", dir.display()),
            Reference::OciLayout { dir, tag: Some(t) } => write!(f, "oci:{}:{t}", dir.display()),
            Reference::Registry { host, name, tag } if tag.starts_with("sha256:") => {
                write!(f, "docker://{host}/{name}@{tag}")
            }
            Reference::Registry { host, name, tag } => write!(f, "docker://{host}/{name}:{tag}"),
            Reference::Imported(digest) => f.write_str(digest),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_is_read_and_said_back() {
        for (text, want) in [
            (
                "oci-archive:/a/b.tar",
                Reference::OciArchive("/a/b.tar".into()),
            ),
            (
                "docker-archive:x.tar",
                Reference::DockerArchive("x.tar".into()),
            ),
            (
                "oci:/img/layout:v1",
                Reference::OciLayout {
                    dir: "/img/layout".into(),
                    tag: Some("v1".into()),
                },
            ),
            (
                "oci:rel/dir",
                Reference::OciLayout {
                    dir: "rel/dir".into(),
                    tag: None,
                },
            ),
            (
                "docker://127.0.0.1:5000/team/tool:2",
                Reference::Registry {
                    host: "127.0.0.1:5000".into(),
                    name: "team/tool".into(),
                    tag: "2".into(),
                },
            ),
            (
                format!("docker://[::1]:5000/tool@sha256:{}", "ab".repeat(32)).as_str(),
                Reference::Registry {
                    host: "[::1]:5000".into(),
                    name: "tool".into(),
                    tag: format!("sha256:{}", "ab".repeat(32)),
                },
            ),
            (
                format!("sha256:{}", "0f".repeat(32)).as_str(),
                Reference::Imported(format!("sha256:{}", "0f".repeat(32))),
            ),
            (
                "docker://localhost/tool",
                Reference::Registry {
                    host: "localhost".into(),
                    name: "tool".into(),
                    tag: "latest".into(),
                },
            ),
        ] {
            let got: Reference = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(got, want, "{text}");
            let again: Reference = got.to_string().parse().unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(again, want, "{text} said back");
        }
    }

    #[test]
    fn what_is_no_reference_is_refused_with_the_forms() {
        for bad in [
            "ubuntu:24.04",
            "docker://ubuntu",
            "docker://Host/x",
            "docker://a.b/UPPER",
            "oci-archive:",
            "oci:/d:bad tag",
            "docker://a.b/x:../../y",
            "docker://a.b/x@md5:00",
            "docker://a.b/x@sha256:00",
            "sha256:0f",
        ] {
            let e = bad.parse::<Reference>().expect_err(bad).to_string();
            assert!(e.contains("oci-archive:PATH"), "{bad}: {e}");
            assert!(e.contains(bad), "{bad}: {e}");
        }
    }
}
