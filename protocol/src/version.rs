//! Protocol version negotiation.
//!
//! Each `Hello` carries the range of versions its sender speaks; the session
//! uses the highest version both speak. Guards against silently talking past
//! a peer of another version: no overlap is an error, never a guess.

use crate::message::Hello;

/// Highest protocol version this crate speaks.
pub const PROTOCOL_VERSION: u32 = 1;
/// Lowest protocol version this crate speaks.
pub const MIN_PROTOCOL_VERSION: u32 = 1;

/// An inclusive range of protocol versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VersionRange {
    pub min: u32,
    pub max: u32,
}

impl VersionRange {
    /// The range this crate speaks.
    pub const CURRENT: VersionRange = VersionRange {
        min: MIN_PROTOCOL_VERSION,
        max: PROTOCOL_VERSION,
    };

    pub fn of(hello: &Hello) -> VersionRange {
        VersionRange {
            min: hello.min_version,
            max: hello.version,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no common protocol version: we speak {ours_min}..={ours_max}, the peer speaks {theirs_min}..={theirs_max}")]
pub struct VersionError {
    pub ours_min: u32,
    pub ours_max: u32,
    pub theirs_min: u32,
    pub theirs_max: u32,
}

/// The highest version in both ranges.
pub fn negotiate(ours: VersionRange, theirs: VersionRange) -> Result<u32, VersionError> {
    let hi = ours.max.min(theirs.max);
    let lo = ours.min.max(theirs.min);
    if ours.min > ours.max || theirs.min > theirs.max || hi < lo || hi == 0 {
        return Err(VersionError {
            ours_min: ours.min,
            ours_max: ours.max,
            theirs_min: theirs.min,
            theirs_max: theirs.max,
        });
    }
    Ok(hi)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(min: u32, max: u32) -> VersionRange {
        VersionRange { min, max }
    }

    #[test]
    fn picks_highest_common() {
        assert_eq!(negotiate(r(1, 3), r(2, 5)), Ok(3));
        assert_eq!(negotiate(r(1, 1), r(1, 1)), Ok(1));
        assert_eq!(negotiate(r(2, 5), r(1, 3)), Ok(3));
    }

    #[test]
    fn rejects_disjoint_and_empty() {
        assert!(negotiate(r(1, 1), r(2, 2)).is_err());
        assert!(negotiate(r(3, 4), r(1, 2)).is_err());
        assert!(negotiate(r(2, 1), r(1, 2)).is_err());
        assert!(negotiate(r(0, 0), r(0, 0)).is_err());
    }
}
