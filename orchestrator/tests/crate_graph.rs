//! docs/architecture.md opens with the workspace's crate graph: which crate
//! of hull's may use which. It is generated here from `cargo metadata`, so
//! it cannot go stale (`HULL_BLESS=1` rewrites it; review the diff), and
//! the floors it shows are checked: the policy crate and the container
//! image crate use no other crate of hull's, the exec crate only the policy
//! and the protocol, and the network crate only those and exec.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

const BEGIN: &str = "<!-- crate graph: made by orchestrator/tests/crate_graph.rs from `cargo metadata`; HULL_BLESS=1 rewrites it -->";
const END: &str = "<!-- end of the crate graph -->";

/// Each workspace crate with the workspace crates it depends on (normal
/// and build dependencies, any target; dev-dependencies are the tests').
#[allow(clippy::unwrap_used)] // a test helper outside a #[test] fn
fn graph(root: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(root)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let packages = meta["packages"].as_array().unwrap();
    let ours: BTreeSet<String> = packages
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect();
    let mut g = BTreeMap::new();
    for p in packages {
        let deps: BTreeSet<String> = p["dependencies"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| d["kind"].as_str() != Some("dev"))
            .map(|d| d["name"].as_str().unwrap().to_string())
            .filter(|n| ours.contains(n))
            .collect();
        g.insert(p["name"].as_str().unwrap().to_string(), deps);
    }
    g
}

/// The graph as the document shows it: one line per crate, the highest
/// (most dependencies in the workspace, transitively) first.
fn render(g: &BTreeMap<String, BTreeSet<String>>) -> String {
    fn depth(g: &BTreeMap<String, BTreeSet<String>>, n: &str, seen: &mut Vec<String>) -> usize {
        if seen.iter().any(|s| s == n) {
            return 0; // a circle: cargo refuses it before this runs
        }
        seen.push(n.to_string());
        let d = g
            .get(n)
            .map(|ds| ds.iter().map(|d| 1 + depth(g, d, seen)).max().unwrap_or(0))
            .unwrap_or(0);
        seen.pop();
        d
    }
    let mut rows: Vec<(usize, &String, &BTreeSet<String>)> = g
        .iter()
        .map(|(n, ds)| (depth(g, n, &mut Vec::new()), n, ds))
        .collect();
    rows.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)));
    let width = rows.iter().map(|r| r.1.len()).max().unwrap_or(0);
    let mut s = String::from("```text\n");
    for (_, n, ds) in rows {
        let uses = if ds.is_empty() {
            "(no crate of hull's)".to_string()
        } else {
            ds.iter().cloned().collect::<Vec<_>>().join(", ")
        };
        s.push_str(&format!("{n:<width$}  uses  {uses}\n"));
    }
    s.push_str("```\n");
    s
}

#[test]
fn the_architecture_document_opens_with_the_crate_graph() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let g = graph(&root);
    assert_eq!(
        g.get("hull-policy").map(BTreeSet::len),
        Some(0),
        "hull-policy is the lowest floor and uses no crate of hull's: {g:?}"
    );
    let exec: Vec<&str> = g["hull-exec"].iter().map(String::as_str).collect();
    assert_eq!(
        exec,
        ["hull-policy", "hull-protocol"],
        "hull-exec knows no tier, VM or network: it uses the policy and the protocol only"
    );
    let net: Vec<&str> = g["hull-net"].iter().map(String::as_str).collect();
    assert_eq!(
        net,
        ["hull-exec", "hull-policy", "hull-protocol"],
        "hull-net knows no tier or VM: it uses exec, the policy and the protocol only"
    );
    let changes: Vec<&str> = g["hull-changes"].iter().map(String::as_str).collect();
    assert_eq!(
        changes,
        ["hull-exec"],
        "hull-changes knows no tier, VM or run: it uses exec's walks and settings only"
    );
    let native: Vec<&str> = g["hull-native"].iter().map(String::as_str).collect();
    assert_eq!(
        native,
        ["hull-changes", "hull-exec", "hull-policy", "hull-seccomp"],
        "hull-native knows no VM, network proxy or run"
    );
    let vm: Vec<&str> = g["hull-vm"].iter().map(String::as_str).collect();
    assert_eq!(
        vm,
        ["hull-exec", "hull-net", "hull-oci", "hull-policy", "hull-protocol"],
        "hull-vm knows no other tier, run or CLI: it uses exec, the network, container images, the policy and the protocol only"
    );
    assert_eq!(
        g.get("hull-oci").map(BTreeSet::len),
        Some(0),
        "hull-oci reads container images and knows nothing else of hull's: {g:?}"
    );
    let block = format!("{BEGIN}\n{}{END}", render(&g));
    let path = root.join("docs/architecture.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let (Some(b), Some(e)) = (doc.find(BEGIN), doc.find(END)) else {
        panic!(
            "{} has no crate graph between {BEGIN} and {END}",
            path.display()
        );
    };
    let current = &doc[b..e + END.len()];
    if std::env::var_os("HULL_BLESS").is_some() {
        std::fs::write(&path, doc.replacen(current, &block, 1)).unwrap();
        return;
    }
    assert_eq!(
        current, block,
        "the crate graph in docs/architecture.md is stale; rerun with HULL_BLESS=1 and review it"
    );
}
