//! Windows security identifiers and access control lists: a leaf the
//! Windows tiers (restricted token, AppContainer) and the Hyper-V backend
//! (its VM account's denies) both use.

pub mod acl;
pub mod sid;

use crate::policy::lower::appcontainer::Deny;
use acl::Change;

/// A deny-everything ACE for a SID given in `S-1-...` form, on `path` and,
/// for a directory, everything below it.
pub fn deny_all_for_sid(path: &str, sid: &str) -> Result<(), String> {
    let s = sid::Sid::from_string(sid)?;
    acl::apply(
        path,
        &s,
        Change::Deny(Deny::All.mask()),
        crate::policy::lower::appcontainer::Inherit::Tree,
    )
}
