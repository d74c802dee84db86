//! The rooms of the `hull` crate, floor by floor: a room (a top-level
//! module of `orchestrator/src`) may name only the rooms of lower floors
//! (`crate::ROOM`), never one of its own floor or above. Until each floor
//! is a crate of its own (issue 54), this test is what keeps an arrow from
//! running back up: the supervisor of `hull vm up` once imported `run.rs`'s
//! errors, closing a circle through `tier`.
//!
//! Comments are not imports: a line that starts with `//` is skipped. A new
//! room fails here until it is given a floor.

use std::collections::BTreeMap;
use std::path::Path;

/// Each room's floor, lowest first. `hull-policy`, `hull-exec`, `hull-net`
/// and `hull-changes` are crates below all of them (re-exported as
/// `policy`, `exec`, `runtime`, `settings`, `state`, `mountinfo`,
/// `sandbox_user`, `os`, `text`, `winsec`, `net` and `changes`).
const FLOORS: &[(&str, u8)] = &[
    // Leaves: each names only the crates below.
    ("out_dir", 0),
    // What a run is prepared from (project, variables, policy, environment).
    ("prepare", 2),
    // Tier 3's machinery: images, snapshots, machines, the supervisor, the pool.
    ("vm", 3),
    // The tiers and their launchers.
    ("tier", 4),
    // A run's result file.
    ("result_file", 5),
    // One run, a batch, the canary.
    ("run", 6),
    ("batch", 6),
    ("canary", 6),
    // What runs many of those.
    ("compare", 7),
    ("serve", 7),
    // The command line, and the binary.
    ("cli", 8),
    ("main", 9),
    ("lib", 9),
];

/// The crates below every room, named through `crate::` by their re-exports.
const BELOW: &[&str] = &[
    "policy",
    "exec",
    "runtime",
    "settings",
    "state",
    "mountinfo",
    "sandbox_user",
    "os",
    "text",
    "winsec",
    "net",
    "changes",
    "EXIT_HULL_FAILED",
    "EXIT_TIMEOUT",
];

// Test helpers outside a #[test] fn: clippy's allow-unwrap-in-tests does not reach them.
#[allow(clippy::unwrap_used)]
fn sources(dir: &Path, into: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            sources(&p, into);
        } else if p.extension().is_some_and(|x| x == "rs") {
            into.push(p);
        }
    }
}

/// Every `crate::NAME` a line of code (not a comment) names.
fn named_rooms(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("//") {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("crate::") {
            let tail = &rest[at + "crate::".len()..];
            let name: String = tail
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            // `hull_crate::x` or `$crate::x` are not this crate's paths.
            let before = rest[..at].chars().last();
            if !name.is_empty()
                && !matches!(before, Some(c) if c.is_ascii_alphanumeric() || c == '_' || c == '$')
            {
                out.push((n + 1, name));
            }
            rest = tail;
        }
    }
    out
}

/// What is wrong with the names `text`, a file of `room`, gives.
fn arrows_up(room: &str, text: &str) -> Vec<String> {
    let floors: BTreeMap<&str, u8> = FLOORS.iter().copied().collect();
    let Some(&floor) = floors.get(room) else {
        return vec![format!(
            "room `{room}` has no floor in orchestrator/tests/floors.rs"
        )];
    };
    let mut wrong = Vec::new();
    for (line, name) in named_rooms(text) {
        if name == room || BELOW.contains(&name.as_str()) {
            continue;
        }
        match floors.get(name.as_str()) {
            Some(&to) if to < floor => {}
            Some(&to) => wrong.push(format!(
                "{line}: `{room}` (floor {floor}) names `crate::{name}` (floor {to})"
            )),
            None => wrong.push(format!("{line}: `crate::{name}` is no room with a floor")),
        }
    }
    wrong
}

#[test]
#[allow(clippy::unwrap_used)]
fn no_room_names_a_room_of_its_floor_or_above() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    assert!(files.len() > 50, "too few sources under {}", src.display());
    let mut wrong = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let room = first.trim_end_matches(".rs");
        let text = std::fs::read_to_string(f).unwrap();
        wrong.extend(
            arrows_up(room, &text)
                .into_iter()
                .map(|w| format!("{}:{w}", rel.display())),
        );
    }
    assert!(
        wrong.is_empty(),
        "arrows that run sideways or up between the rooms of hull:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn an_arrow_up_is_found_and_one_down_is_not() {
    let up =
        "use crate::run::RunError;\n// crate::tier in a comment\nlet x = hull_exec::crate_x;\n";
    assert_eq!(
        arrows_up("vm", up),
        ["1: `vm` (floor 3) names `crate::run` (floor 6)"]
    );
    assert_eq!(arrows_up("run", up), Vec::<String>::new());
    // Sideways, within one floor, is refused too.
    assert_eq!(arrows_up("batch", up).len(), 1);
    assert_eq!(arrows_up("vm", "crate::runtime::gc(x);").len(), 0);
    assert_eq!(arrows_up("newroom", "").len(), 1);
}
