//! docs/settings.md is the one table of hull's environment variables: every
//! `HULL_*` name the source mentions is in it, and every name in it is still
//! in the source.

use std::collections::BTreeSet;
use std::path::Path;

/// Every `HULL_[A-Z0-9_]+` word in `text`.
fn names(text: &str, into: &mut BTreeSet<String>) {
    let b = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find("HULL_") {
        let start = i + at;
        // Quoted as a string, in code or in backticks, or `$HULL_...`: a
        // constant named HULL_* is not a variable.
        let before_ok = start > 0 && matches!(b[start - 1], b'"' | b'`' | b'$');
        let mut end = start + 5;
        while end < b.len()
            && (b[end].is_ascii_uppercase() || b[end].is_ascii_digit() || b[end] == b'_')
        {
            end += 1;
        }
        if before_ok && end > start + 5 {
            into.insert(text[start..end].trim_end_matches('_').to_string());
        }
        i = end;
    }
}

// A test helper outside a #[test] fn: clippy's allow-unwrap-in-tests does not reach it.
#[allow(clippy::unwrap_used)]
fn walk(dir: &Path, into: &mut BTreeSet<String>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            walk(&p, into);
        } else if p.extension().is_some_and(|x| x == "rs") {
            names(&std::fs::read_to_string(&p).unwrap(), into);
        }
    }
}

#[test]
fn every_variable_is_in_the_settings_table_and_no_stale_one() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut in_source = BTreeSet::new();
    for d in [
        "crates",
        "orchestrator/src",
        "orchestrator/tests",
        "guest-agent/src",
        "tests",
    ] {
        walk(&root.join(d), &mut in_source);
    }
    // This test's own file names none.
    let doc = std::fs::read_to_string(root.join("docs/settings.md")).unwrap();
    let mut in_doc = BTreeSet::new();
    names(&doc, &mut in_doc);
    let missing: Vec<_> = in_source.difference(&in_doc).collect();
    assert!(missing.is_empty(), "not in docs/settings.md: {missing:?}");
    let stale: Vec<_> = in_doc.difference(&in_source).collect();
    assert!(
        stale.is_empty(),
        "in docs/settings.md, not in the source: {stale:?}"
    );
}
