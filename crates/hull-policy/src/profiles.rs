//! The shipped profiles (`policies/*.toml`), compiled into the binary so a
//! profile name always means the same text as the hull that runs it.

use std::path::Path;

use super::file::{PolicyError, PolicyFile};

/// Every shipped profile: name and text.
pub const PROFILES: &[(&str, &str)] = &[
    ("default", include_str!("../../../policies/default.toml")),
    ("readonly", include_str!("../../../policies/readonly.toml")),
    ("build", include_str!("../../../policies/build.toml")),
    (
        "build-net",
        include_str!("../../../policies/build-net.toml"),
    ),
];

/// The text of `spec` as [`load`] reads it (a shipped profile's, or the
/// file's bytes), if there is one: what a receipt hashes.
pub fn source(spec: &str) -> Option<Vec<u8>> {
    if spec.contains('/') || spec.ends_with(".toml") {
        return std::fs::read(spec).ok();
    }
    PROFILES
        .iter()
        .find(|(n, _)| *n == spec)
        .map(|(_, text)| text.as_bytes().to_vec())
}

/// Loads `spec`: a shipped profile name, or a path to a TOML file (anything
/// containing `/` or ending in `.toml`).
pub fn load(spec: &str) -> Result<PolicyFile, PolicyError> {
    if spec.contains('/') || spec.ends_with(".toml") {
        return PolicyFile::load(Path::new(spec));
    }
    match PROFILES.iter().find(|(n, _)| *n == spec) {
        Some((name, text)) => PolicyFile::parse(&format!("profile {name}"), text),
        None => {
            Err(PolicyError {
                file: "--policy".into(),
                line: 0,
                key: "policy".into(),
                message: format!(
                "no profile named {spec:?}; shipped profiles: {}; or give a path to a .toml file",
                PROFILES.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
            ),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shipped_profile_parses() {
        for (name, _) in PROFILES {
            load(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }

    #[test]
    fn unknown_profile_is_an_error_listing_the_known_ones() {
        let e = load("nope").unwrap_err();
        assert!(e.message.contains("default"), "{e}");
    }
}
