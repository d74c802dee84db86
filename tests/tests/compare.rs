#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]
// The escape matrix and the end-to-end tests drive the Linux tiers (bubblewrap,
// Landlock, tier 3 on QEMU): off Linux this crate is empty, and type-checks.
#![cfg(target_os = "linux")]
// Test code: a failed expectation is a failed test.
//! `hull compare` end to end with the real `hull`: the same command on
//! several tiers and without hull, interleaved; its JSON says which tier's
//! stdout matched the direct run's, lists a tier this host cannot run with
//! the reason; its HTML page renders in headless Chromium with the chart,
//! the table, the canary's matrix and the receipts.

use std::process::{Output, Stdio};

use hull_tests::{require_tier, show, World};

/// `hull compare ARGS` in the world's project (its work directory in
/// the world's), which must succeed.
fn compare_ok(w: &World, args: &[&str]) -> Output {
    let o = w
        .hull()
        .arg("compare")
        .args(args)
        .env("TMPDIR", w.root.path())
        .current_dir(&w.project)
        .stdin(Stdio::null())
        .output()
        .expect("spawn hull compare");
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    o
}

/// `hull compare ARGS --json ...`: the document.
fn compare(w: &World, args: &[&str]) -> (Output, serde_json::Value) {
    let o = compare_ok(w, args);
    let v = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", show(&o)));
    (o, v)
}

fn row<'a>(v: &'a serde_json::Value, tier: &str) -> &'a serde_json::Value {
    v["tiers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["tier"] == tier)
        .unwrap_or_else(|| panic!("no row for {tier}: {v:#}"))
}

/// A tier's row ran `runs` times, every run exiting 0, with its times.
fn ran(v: &serde_json::Value, tier: &str, runs: usize) {
    let r = row(v, tier);
    assert_eq!(r["available"], true, "{r:#}");
    assert_eq!(r["samples"].as_array().unwrap().len(), runs, "{r:#}");
    assert_eq!(r["exit_codes"], serde_json::json!([0]), "{r:#}");
    let s = &r["wall_s"];
    let (min, median, max) = (
        s["min"].as_f64().unwrap(),
        s["median"].as_f64().unwrap(),
        s["max"].as_f64().unwrap(),
    );
    assert!(0.0 < min && min <= median && median <= max, "{r:#}");
    assert!(r["ratio_to_direct"].as_f64().unwrap() > 0.0, "{r:#}");
}

/// The same output everywhere matches; `/proc/1/comm` differs where the
/// tier has a pid namespace of its own (bwrap) and not where it shares the
/// host's (landlock); a tier of another OS is listed with its reason, not
/// dropped.
#[cfg(all(feature = "bwrap", feature = "landlock"))]
#[test]
fn compare_says_which_tier_gave_another_stdout() {
    require_tier("landlock");
    require_tier("bwrap");
    let w = World::new();
    let tiers = [
        "--tier", "landlock", "--tier", "bwrap", "--tier", "seatbelt", "-n", "2", "--warmup", "1",
        "--json", "--",
    ];
    let (o, v) = compare(&w, &[&tiers[..], &["echo", "same"]].concat());
    for t in ["direct", "landlock", "bwrap"] {
        ran(&v, t, 2);
        assert_eq!(row(&v, t)["stdout_matches"], true, "{t}: {}", show(&o));
    }
    assert_eq!(v["stdout_matched"], true, "{v:#}");
    assert_eq!(v["stdout_reference"], "direct", "{v:#}");
    let seatbelt = row(&v, "seatbelt");
    assert_eq!(seatbelt["available"], false);
    assert!(
        seatbelt["reason"].as_str().unwrap().contains("macOS"),
        "{seatbelt:#}"
    );
    assert!(["landlock", "bwrap"].contains(&v["fastest"].as_str().unwrap()));
    // bwrap's /proc/1 is its own init; landlock's is the host's.
    let (o, v) = compare(&w, &[&tiers[..], &["cat", "/proc/1/comm"]].concat());
    assert_eq!(v["stdout_matched"], false, "{}", show(&o));
    assert_eq!(v["stdout_differs"], serde_json::json!(["bwrap"]), "{v:#}");
    assert_eq!(row(&v, "landlock")["stdout_matches"], true);
    assert_eq!(row(&v, "bwrap")["stdout_matches"], false);
    // The table says the same to a person; `--tier auto` is this host's
    // tier 2, named as such.
    let o = compare_ok(
        &w,
        &[
            "--tier",
            "auto",
            "--tier",
            "seatbelt",
            "-n",
            "1",
            "--",
            "cat",
            "/proc/1/comm",
        ],
    );
    let text = String::from_utf8_lossy(&o.stdout);
    for want in [
        "direct (no hull)",
        "x fastest",
        "seatbelt: not available here: needs macOS",
        "stdout: differs on bwrap (reference: direct)",
    ] {
        assert!(text.contains(want), "{want}: {}", show(&o));
    }
    // Nothing of the comparison is left in TMPDIR.
    let left: Vec<_> = std::fs::read_dir(w.root.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("hull-compare-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// The page (`--html`) opens in headless Chromium (Debian's `chromium`,
/// installed by `scripts/setup.sh --test`) and shows the chart with a bar
/// per row, the table, the canary's matrix for the same tiers (the probes
/// `--canary-probe` names: the whole canary runs in the escape tests) and
/// each tier's receipt. A probe that does not exist is refused before
/// anything runs.
#[cfg(all(feature = "bwrap", feature = "landlock"))]
#[test]
fn the_compare_page_renders_in_chromium() {
    require_tier("landlock");
    require_tier("bwrap");
    let w = World::new();
    let page = w.root.path().join("compare.html");
    compare_ok(
        &w,
        &[
            "--tier",
            "landlock",
            "--tier",
            "bwrap",
            "-n",
            "1",
            "--warmup",
            "0",
            "--html",
            page.to_str().unwrap(),
            "--canary-probe",
            "read_outside_file",
            "--canary-probe",
            "write_outside",
            "--",
            "cat",
            "/proc/1/comm",
        ],
    );
    let dom = hull_tests::chromium_dom(&page, w.root.path());
    assert!(
        !dom.contains("<td>read_home_key</td>"),
        "only the probes named: {dom}"
    );
    let o = w
        .hull()
        .args(["compare", "--tier", "bwrap", "--html"])
        .arg(w.root.path().join("other.html"))
        .args(["--canary-probe", "no_such_probe", "--", "touch", "ran.txt"])
        .current_dir(&w.project)
        .stdin(Stdio::null())
        .output()
        .expect("hull compare");
    assert_eq!(o.status.code(), Some(125), "{}", show(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("no_such_probe"),
        "{}",
        show(&o)
    );
    assert!(
        !w.project.join("ran.txt").exists(),
        "a run ran: {}",
        show(&o)
    );
    for want in [
        "<svg id=\"chart\"",
        "data-tier=\"direct\"",
        "data-tier=\"landlock\"",
        "data-tier=\"bwrap\"",
        "<table id=\"compare\">",
        "<td class=\"differs\">differs</td>",
        "<table id=\"matrix\">",
        "<th>none (control)</th>",
        "<td>read_outside_file</td>",
        "<table id=\"receipts\">",
        "bwrap: bubblewrap",
    ] {
        assert!(dom.contains(want), "{want}: {dom}");
    }
    assert_eq!(dom.matches("<g class=\"bar\"").count(), 3, "{dom}");
}

/// Tier 3 beside landlock: the same output matches; its guest's /proc/1
/// is the container's init, so that stdout differs; its row tells the container's peak memory and
/// its receipt the accelerator and the image.
#[cfg(all(feature = "tier3", feature = "landlock"))]
mod vm {
    use super::*;

    #[test]
    fn compare_runs_on_vm_beside_a_process_tier() {
        require_tier("vm");
        let w = World::new();
        let tiers = [
            "--tier", "landlock", "--tier", "vm", "-n", "1", "--warmup", "0", "--json", "--",
        ];
        let (o, v) = compare(&w, &[&tiers[..], &["echo", "same"]].concat());
        assert_eq!(v["stdout_matched"], true, "{}", show(&o));
        assert_eq!(row(&v, "vm")["stdout_matches"], true, "{v:#}");
        let (o, v) = compare(&w, &[&tiers[..], &["cat", "/proc/1/comm"]].concat());
        ran(&v, "vm", 1);
        ran(&v, "landlock", 1);
        assert_eq!(
            v["stdout_differs"],
            serde_json::json!(["vm"]),
            "{}",
            show(&o)
        );
        let vm = row(&v, "vm");
        assert!(vm["peak_memory_bytes"].as_u64().unwrap() > 0, "{vm:#}");
        assert!(vm["receipt"]["accelerator"].is_string(), "{vm:#}");
        assert!(vm["receipt"]["image_id"].is_string(), "{vm:#}");
        assert_eq!(v["fastest"], "landlock", "{v:#}");
    }
}
