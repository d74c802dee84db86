//! The rooms of the `hull` and `hull-vm` crates, floor by floor: a room (a
//! top-level module of a crate's `src`) may name only the rooms of lower
//! floors (`crate::ROOM`, and `super::ROOM` from a top-level file or
//! `super::super::ROOM` from one below it), never one of its own floor or
//! above. Cargo keeps the crates from a circle; inside a crate this test
//! does: the supervisor of `hull vm up` once imported `run.rs`'s errors,
//! closing a circle through `tier`, and the snapshot and the assembly of a
//! VM once imported each other.
//!
//! Comments are not imports: a line that starts with `//` is skipped. Test
//! code counts too. A new room fails here until it is given a floor.

use std::collections::BTreeMap;
use std::path::Path;

/// Each room's floor, lowest first. `hull-policy`, `hull-exec`, `hull-net`,
/// `hull-changes`, `hull-native` and `hull-vm` are crates below all of them
/// (re-exported as `policy`, `exec`, `runtime`, `settings`, `state`,
/// `mountinfo`, `sandbox_user`, `os`, `text`, `winsec`, `out_dir`, `net`,
/// `changes`, `vm` and `prepare`; `tier` re-exports `hull-native`'s
/// modules).
const HULL: &[(&str, u8)] = &[
    // The tiers and the dispatch over them (tier 3's adapter among them).
    ("tier", 4),
    // A run's result file; the templates runs and sessions start from.
    ("result_file", 5),
    ("templates", 5),
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

/// The crates below every room of `hull`, named through `crate::` by their
/// re-exports.
const HULL_BELOW: &[&str] = &[
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
    "out_dir",
    "vm",
    "prepare",
    "EXIT_HULL_FAILED",
    "EXIT_TIMEOUT",
];

/// Each room of `hull-vm`, lowest first: the order a VM is made in.
const VM: &[(&str, u8)] = &[
    // Leaves: the QEMU argv and its control socket, helper processes, the
    // guest image, liveness, the network port, the libc check, Hyper-V,
    // and what a run is prepared from.
    ("proc", 0),
    ("qemu", 0),
    ("qmp", 0),
    ("heartbeat", 0),
    ("image", 0),
    ("libc_needs", 0),
    ("net_channel", 0),
    ("hyperv", 0),
    ("prepare", 0),
    // What a QEMU binary says of itself, the agent session, the file
    // servers, and a batch's output directory.
    ("qemu_facts", 1),
    ("agent", 1),
    ("virtiofsd", 1),
    ("batch_out", 1),
    // The accelerator probe, one machine, and the shape of a machine for
    // a plan.
    ("accel", 2),
    ("machine", 2),
    ("shape", 2),
    // The prepared snapshot, restored instead of a boot.
    ("snapshot", 3),
    // A VM made for a plan: the image, restored or booted.
    ("assemble", 4),
    // One VM session, owner of its lifecycle.
    ("session", 5),
    // What keeps VMs: `hull vm up`, the batch pool.
    ("supervisor", 6),
    ("pool", 6),
    // The tests' helpers and the tests that boot guests (cfg(test) only).
    ("testkit", 7),
    ("vm_tests", 8),
    ("lib", 9),
];

/// The crates below every room of `hull-vm`, named through `crate::`.
const VM_BELOW: &[&str] = &[
    "policy",
    "exec",
    "runtime",
    "settings",
    "state",
    "sandbox_user",
    "os",
    "text",
    "winsec",
    "out_dir",
    "net",
    "GUEST_UID",
    "GUEST_GID",
    // cfg(test) only: the helpers every room's tests may use.
    "testkit",
];

/// A crate whose rooms stand on floors.
struct House {
    /// Its `src`, from the workspace's root.
    src: &'static str,
    floors: &'static [(&'static str, u8)],
    below: &'static [&'static str],
}

const HOUSES: &[House] = &[
    House {
        src: "orchestrator/src",
        floors: HULL,
        below: HULL_BELOW,
    },
    House {
        src: "crates/hull-vm/src",
        floors: VM,
        below: VM_BELOW,
    },
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

/// Every `PREFIX::NAME` the code (not a comment line) names, with its
/// line, `prefix` being a path that means the crate's root; a group,
/// `PREFIX::{a, b::c}` over one line or several, names each of its heads.
fn named_rooms(text: &str, prefix: &str) -> Vec<(usize, String)> {
    let code: String = text
        .lines()
        .map(|l| match l.trim_start().starts_with("//") {
            true => "\n".to_string(),
            false => format!("{l}\n"),
        })
        .collect();
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(found) = code[from..].find(prefix) {
        let at = from + found;
        from = at + prefix.len();
        let before = &code[..at];
        // `hull_crate::x` or `$crate::x` are not this crate's paths, and
        // `super::super::x` is not `super::` followed by `super`.
        if matches!(before.chars().last(), Some(c) if c.is_ascii_alphanumeric() || c == '_' || c == '$')
            || before.ends_with("super::")
        {
            continue;
        }
        let line = before.matches('\n').count() + 1;
        let tail = &code[from..];
        let heads = match tail.strip_prefix('{') {
            Some(group) => group_heads(group),
            None => vec![ident(tail)],
        };
        out.extend(
            heads
                .into_iter()
                .filter(|h| !h.is_empty() && h != "super" && h != "self")
                .map(|h| (line, h)),
        );
    }
    out
}

/// The identifier `s` starts with.
fn ident(s: &str) -> String {
    s.chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

/// The first name of each item of a `{...}` group (`s` starts after its
/// `{`), to the group's closing brace.
fn group_heads(s: &str) -> Vec<String> {
    let mut heads = vec![ident(s.trim_start())];
    let mut depth = 0usize;
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => heads.push(ident(s[i + 1..].trim_start())),
            _ => {}
        }
    }
    heads
}

/// What is wrong with the names `text`, a file of `room` in `house`,
/// gives; `depth` is how far below the room's top the file is (0: the
/// room's own file, `src/ROOM.rs` or `src/ROOM/mod.rs`; 1: `src/ROOM/x.rs`).
fn arrows_up(house: &House, room: &str, depth: usize, text: &str) -> Vec<String> {
    let floors: BTreeMap<&str, u8> = house.floors.iter().copied().collect();
    let Some(&floor) = floors.get(room) else {
        return vec![format!(
            "room `{room}` of {} has no floor in orchestrator/tests/floors.rs",
            house.src
        )];
    };
    let up = "super::".repeat(depth + 1);
    let mut wrong = Vec::new();
    for (line, name, strict) in named_rooms(text, "crate::")
        .into_iter()
        .map(|(l, n)| (l, n, true))
        .chain(
            named_rooms(text, &up)
                .into_iter()
                .map(|(l, n)| (l, n, false)),
        )
    {
        if name == room || house.below.contains(&name.as_str()) {
            continue;
        }
        // `super::` also names a test module's own file's items: only a
        // room counts there.
        if !strict && !floors.contains_key(name.as_str()) {
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
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut wrong = Vec::new();
    for house in HOUSES {
        let src = root.join(house.src);
        let mut files = Vec::new();
        sources(&src, &mut files);
        assert!(files.len() > 20, "too few sources under {}", src.display());
        for f in &files {
            let rel = f.strip_prefix(&src).unwrap();
            let parts: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            let room = parts[0].trim_end_matches(".rs");
            // `src/ROOM/mod.rs` is the room's own file, as `src/ROOM.rs` is.
            let depth = match parts.last().map(String::as_str) {
                Some("mod.rs") => parts.len() - 2,
                _ => parts.len() - 1,
            };
            let text = std::fs::read_to_string(f).unwrap();
            wrong.extend(
                arrows_up(house, room, depth, &text)
                    .into_iter()
                    .map(|w| format!("{}/{}:{w}", house.src, rel.display())),
            );
        }
    }
    assert!(
        wrong.is_empty(),
        "arrows that run sideways or up between the rooms of a crate:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn an_arrow_up_is_found_and_one_down_is_not() {
    let up =
        "use crate::run::RunError;\n// crate::tier in a comment\nlet x = hull_exec::crate_x;\n";
    let hull = &HOUSES[0];
    assert_eq!(
        arrows_up(hull, "tier", 0, up),
        ["1: `tier` (floor 4) names `crate::run` (floor 6)"]
    );
    assert_eq!(arrows_up(hull, "run", 0, up), Vec::<String>::new());
    // Sideways, within one floor, is refused too.
    assert_eq!(arrows_up(hull, "batch", 0, up).len(), 1);
    assert_eq!(
        arrows_up(hull, "tier", 0, "crate::runtime::gc(x);").len(),
        0
    );
    assert_eq!(arrows_up(hull, "newroom", 0, "").len(), 1);
}

#[test]
fn in_hull_vm_super_names_a_room_from_the_right_depth() {
    let vm = &HOUSES[1];
    // The snapshot and the assembly once imported each other.
    assert_eq!(
        arrows_up(vm, "snapshot", 0, "let x = crate::assemble::now_ns();"),
        ["1: `snapshot` (floor 3) names `crate::assemble` (floor 4)"]
    );
    assert_eq!(
        arrows_up(
            vm,
            "machine",
            0,
            "use super::{\n    qemu::Accel,\n    session::{self, Session},\n};"
        ),
        ["1: `machine` (floor 2) names `crate::session` (floor 5)"]
    );
    assert_eq!(
        arrows_up(vm, "machine", 0, "use super::session::Session;"),
        ["1: `machine` (floor 2) names `crate::session` (floor 5)"]
    );
    // One level down, `super::` is the room itself and `super::super::` the crate.
    assert_eq!(arrows_up(vm, "supervisor", 1, "use super::Phase;").len(), 0);
    assert_eq!(
        arrows_up(vm, "virtiofsd", 1, "use super::super::pool::Pool;"),
        ["1: `virtiofsd` (floor 1) names `crate::pool` (floor 6)"]
    );
    // A test module's `super::helper` is its file's, not a room.
    assert_eq!(arrows_up(vm, "shape", 0, "let p = super::plan();").len(), 0);
}
