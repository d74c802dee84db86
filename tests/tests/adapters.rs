#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]
// The escape matrix and the end-to-end tests drive the Linux tiers (bubblewrap,
// Landlock, tier 3 on QEMU): off Linux this crate is empty, and type-checks.
#![cfg(target_os = "linux")]
// Test code: a failed expectation is a failed test.
//! The harness adapters (`adapters/python`) with the real harnesses, at
//! the versions `adapters/python/requirements.lock` pins, in the venv
//! `scripts/setup.sh --test` makes (`target/adapters-venv`): an inspect_ai
//! eval of two samples in the `hull` sandbox (the entry point registers
//! it), and mini-swe-agent's environment protocol with a scripted action
//! list. Both start their own `hull serve`; afterwards nothing of theirs
//! may be left: no workspace, no server, no session VM, no process.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use hull_tests::{require_tier, show, World};

fn python() -> PathBuf {
    let p = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../target/adapters-venv/bin/python"
    ));
    assert!(
        p.exists(),
        "{} is missing: scripts/setup.sh --test makes the adapters' venv",
        p.display()
    );
    p
}

fn script(name: &str) -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../adapters/python/tests"
    ))
    .join(name)
}

/// Runs an adapter script with the world's environment for hull, its
/// TMPDIR in the world; the JSON document it prints last.
fn run(w: &World, args: &[&std::ffi::OsStr]) -> serde_json::Value {
    run_in(w, &w.root.path().join("tmp"), args)
}

/// [`run`], in directory `cwd`.
fn run_in(w: &World, cwd: &std::path::Path, args: &[&std::ffi::OsStr]) -> serde_json::Value {
    let tmp = w.root.path().join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let mut c = Command::new("timeout");
    c.arg("600").arg(python()).args(args).current_dir(cwd);
    w.hull_env(&mut c);
    let o = c
        .env("HULL_BIN", hull_tests::hull_bin())
        .env("TMPDIR", &tmp)
        .env("MSWEA_CONFIG_DIR", w.root.path().join("mini-config"))
        .env("INSPECT_LOG_LEVEL", "warning")
        .stdin(Stdio::null())
        .output()
        .expect("spawn python");
    assert!(o.status.success(), "{}", show(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let last = out.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {}", show(&o)))
}

/// Nothing of the adapters is left: workspaces and servers in TMPDIR, a
/// process naming the world, an instance not over, a kept VM up.
fn nothing_left(w: &World) {
    let tmp = w.root.path().join("tmp");
    let left: Vec<String> = std::fs::read_dir(&tmp)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("hull-sample-") || n.starts_with("hull-serve-"))
        .collect();
    assert!(left.is_empty(), "left in TMPDIR: {left:?}");
    let procs = hull_tests::pids_with(&w.root.path().to_string_lossy());
    assert!(procs.is_empty(), "processes left: {procs:?}");
    // Every instance of the runs is over, nothing in it but what an
    // ended run keeps (its lock file, spill and logs); a run with nothing
    // to keep left no instance at all.
    let o = w
        .hull()
        .args(["runs", "list", "--json"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let runs: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for r in runs.as_array().unwrap() {
        assert_eq!(r["state"], "idle", "an instance is left: {r}");
        // A run dir removed since the listing left nothing.
        let Ok(entries) = std::fs::read_dir(r["dir"].as_str().unwrap()) else {
            continue;
        };
        for e in entries {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            assert!(
                [".active", "spill", "logs"].contains(&name.as_str()),
                "{}/{name} is left",
                r["dir"].as_str().unwrap()
            );
        }
    }
    let status = w
        .hull()
        .args(["vm", "status", "--json"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let all: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let up: Vec<&serde_json::Value> = all
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["up"] == true)
        .collect();
    assert!(up.is_empty(), "VMs left up: {up:?}");
}

/// Two samples, each in a workspace of its own (it sees only its own
/// files), each scored by a command run in its sandbox; each tries to
/// write a file outside its roots, which fails in the sandbox and is
/// unchanged on the host (under tier none the same write lands).
fn an_inspect_eval_of_two_samples(tier: &str) {
    require_tier(tier);
    let w = World::new();
    let victim = w.outside.join("victim");
    std::fs::write(&victim, hull_tests::VICTIM).unwrap();
    // The control: the attack's write lands without a sandbox.
    let control = Command::new("sh")
        .args(["-c", &format!("echo pwned > '{}'", victim.display())])
        .status()
        .unwrap();
    assert!(control.success());
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "pwned\n");
    std::fs::write(&victim, hull_tests::VICTIM).unwrap();
    let logs = w.root.path().join("logs");
    let v = run(
        &w,
        &[
            script("inspect_eval.py").as_os_str(),
            tier.as_ref(),
            victim.as_os_str(),
            logs.as_os_str(),
        ],
    );
    assert_eq!(v["status"], "success", "{v:#}");
    let samples = v["samples"].as_array().unwrap();
    assert_eq!(samples.len(), 2, "{v:#}");
    for (s, answer) in samples.iter().zip(["ABC", "HULL"]) {
        assert_eq!(s["score"], "C", "{v:#}");
        assert_eq!(s["answer"], answer, "{v:#}");
        assert_ne!(s["attack_exit"], 0, "the write outside succeeded: {v:#}");
        assert_eq!(
            s["seen"],
            serde_json::json!(["answer.txt", "input.txt"]),
            "{v:#}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(&victim).unwrap(),
        hull_tests::VICTIM
    );
    nothing_left(&w);
}

#[cfg(feature = "bwrap")]
#[test]
fn bwrap_an_inspect_eval_of_two_samples() {
    an_inspect_eval_of_two_samples("bwrap");
}

/// `workspace="cow"`: each sample a copy-on-write session on the project
/// itself (nothing copied): both see the project's files and their own
/// writes only, and the project is untouched.
#[cfg(feature = "bwrap")]
#[test]
fn bwrap_an_inspect_eval_in_copy_on_write_sessions_of_one_project() {
    require_tier("bwrap");
    let w = World::new();
    std::fs::write(w.project.join("README"), "the project\n").unwrap();
    let before = std::fs::read_dir(&w.project).unwrap().count();
    let victim = w.outside.join("victim");
    std::fs::write(&victim, hull_tests::VICTIM).unwrap();
    let logs = w.root.path().join("logs");
    let v = run(
        &w,
        &[
            script("inspect_eval.py").as_os_str(),
            "bwrap".as_ref(),
            victim.as_os_str(),
            logs.as_os_str(),
            w.project.as_os_str(),
        ],
    );
    assert_eq!(v["status"], "success", "{v:#}");
    for s in v["samples"].as_array().unwrap() {
        assert_eq!(s["score"], "C", "{v:#}");
        assert_eq!(
            s["seen"],
            serde_json::json!(["README", "answer.txt", "input.txt", "src"]),
            "{v:#}"
        );
    }
    assert_eq!(std::fs::read_dir(&w.project).unwrap().count(), before);
    assert!(!w.project.join("answer.txt").exists());
    assert_eq!(
        std::fs::read_to_string(&victim).unwrap(),
        hull_tests::VICTIM
    );
    nothing_left(&w);
}

/// mini-swe-agent's protocol: each action's output (stderr merged) and
/// exit code, a directory inside the project, a timeout reported as
/// mini-swe-agent's own environments report it, the submission, and what
/// the agent wrote landing in the project.
fn mini_swe_agent_runs_a_scripted_action_list(tier: &str) {
    require_tier(tier);
    let w = World::new();
    std::fs::create_dir(w.project.join("sub")).unwrap();
    let v = run(
        &w,
        &[
            script("mini_actions.py").as_os_str(),
            tier.as_ref(),
            w.project.as_os_str(),
        ],
    );
    let r = v["results"].as_array().unwrap();
    let out = |i: usize| {
        (
            r[i]["output"].as_str().unwrap(),
            r[i]["returncode"].as_i64().unwrap(),
        )
    };
    assert_eq!(out(0), ("hello\n", 0), "{v:#}");
    assert_eq!(out(1), ("made by the agent\n", 0), "{v:#}");
    assert_eq!(out(2), ("to-stderr\n", 3), "{v:#}");
    let sub = format!("{}/sub\n", w.project.display());
    assert_eq!(out(3), (sub.as_str(), 0), "{v:#}");
    assert_eq!(r[4]["returncode"], -1, "{v:#}");
    assert!(
        r[4]["exception_info"]
            .as_str()
            .unwrap()
            .contains("ran out of its 2 s"),
        "{v:#}"
    );
    assert_eq!(v["submission"], "the fix\n", "{v:#}");
    assert_eq!(
        v["serialized"]["info"]["config"]["environment_type"],
        "hull_sandbox.minisweagent.HullEnvironment"
    );
    assert!(v["vars"].as_array().unwrap().iter().any(|k| k == "session"));
    assert_eq!(
        std::fs::read_to_string(w.project.join("notes.txt")).unwrap(),
        "made by the agent\n"
    );
    nothing_left(&w);
}

#[cfg(feature = "bwrap")]
#[test]
fn bwrap_mini_swe_agent_runs_a_scripted_action_list() {
    mini_swe_agent_runs_a_scripted_action_list("bwrap");
}

/// mini-swe-agent's own loop with its stock configs as shipped (`default`
/// and `mini`, whose templates name `system`, `release`, `version` and
/// `machine`) and a scripted model, in an environment made with no
/// project (the directory it runs in is the project): the loop submits,
/// what the model's command wrote lands in the project, and the platform
/// values are those of where the commands run (on tier 3 the guest's
/// kernel, not the host's).
fn mini_swe_agent_runs_its_stock_configs(tier: &str) {
    require_tier(tier);
    let w = World::new();
    let host_release = String::from_utf8(
        Command::new("uname")
            .arg("-r")
            .output()
            .expect("uname")
            .stdout,
    )
    .unwrap();
    for config in ["default", "mini"] {
        let _ = std::fs::remove_file(w.project.join("fix.txt"));
        let v = run_in(
            &w,
            &w.project,
            &[
                script("mini_agent.py").as_os_str(),
                tier.as_ref(),
                config.as_ref(),
            ],
        );
        assert_eq!(v["result"]["exit_status"], "Submitted", "{config}: {v:#}");
        assert_eq!(v["result"]["submission"], "the fix\n", "{config}: {v:#}");
        assert_eq!(
            std::fs::read_to_string(w.project.join("fix.txt")).unwrap_or_default(),
            "fixed\n",
            "{config}: {v:#}"
        );
        assert!(
            v["observation"].as_str().unwrap().contains("fixed"),
            "{config}: {v:#}"
        );
        let vars = &v["vars"];
        assert_eq!(
            vars["project"],
            w.project.to_str().unwrap(),
            "{config}: {v:#}"
        );
        assert_eq!(vars["system"], "Linux", "{config}: {v:#}");
        assert_eq!(vars["machine"], std::env::consts::ARCH, "{config}: {v:#}");
        let release = vars["release"].as_str().unwrap();
        assert!(!release.is_empty() && !vars["version"].as_str().unwrap().is_empty());
        match tier {
            "vm" => assert_ne!(release, host_release.trim(), "{config}: {v:#}"),
            _ => assert_eq!(release, host_release.trim(), "{config}: {v:#}"),
        }
        let system = v["system"].as_str().unwrap().to_owned() + v["instance"].as_str().unwrap();
        assert!(
            system.contains(release),
            "{config}: the templates did not render: {v:#}"
        );
    }
    nothing_left(&w);
}

#[cfg(feature = "bwrap")]
#[test]
fn bwrap_mini_swe_agent_runs_its_stock_configs() {
    mini_swe_agent_runs_its_stock_configs("bwrap");
}

#[cfg(feature = "landlock")]
#[test]
fn landlock_mini_swe_agent_runs_its_stock_configs() {
    mini_swe_agent_runs_its_stock_configs("landlock");
}

/// inspect_ai's stateful tools in a session, driven by a scripted model's
/// tool calls: `text_editor` creates and edits a file in the session's own
/// `/tmp` (the tools' server is injected under `/var/tmp`), and
/// `bash_session`'s shell keeps its variables and working directory from
/// one call to the next (a process the session keeps between execs); git
/// commits, diffs and stashes in the sample's workspace (hull's copy).
fn inspect_s_stateful_tools_run_in_a_session(tier: &str) {
    require_tier(tier);
    let w = World::new();
    let logs = w.root.path().join("logs");
    let v = run(
        &w,
        &[
            script("inspect_tools.py").as_os_str(),
            tier.as_ref(),
            logs.as_os_str(),
        ],
    );
    assert_eq!(v["status"], "success", "{v:#}");
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 5, "{v:#}");
    for r in results {
        assert!(r["error"].is_null(), "{v:#}");
    }
    assert!(
        results[1]["text"]
            .as_str()
            .unwrap()
            .contains("hello from the hull"),
        "{v:#}"
    );
    assert!(
        results[2]["text"]
            .as_str()
            .unwrap()
            .contains("hello from the hull"),
        "{v:#}"
    );
    assert!(
        results[3]["text"]
            .as_str()
            .unwrap()
            .contains("kept in /tmp"),
        "{v:#}"
    );
    // git in the sample's workspace: init, add, commit, diff, stash.
    let git = results[4]["text"].as_str().unwrap();
    assert!(
        git.contains("1 file changed, 1 insertion(+)")
            && git.contains("stashed 1")
            && git.contains("first"),
        "{v:#}"
    );
    assert!(
        !std::path::Path::new("/tmp/hello.txt").exists() || {
            // Another program's: not the session's words.
            !std::fs::read_to_string("/tmp/hello.txt")
                .unwrap_or_default()
                .contains("from the hull")
        }
    );
    nothing_left(&w);
}

#[cfg(feature = "bwrap")]
#[test]
fn bwrap_inspect_s_stateful_tools_run_in_a_session() {
    inspect_s_stateful_tools_run_in_a_session("bwrap");
}

/// On landlock the tools' server talks over a unix socket (connected by
/// hull's broker where Landlock cannot mediate unix sockets) and its shell
/// runs on a terminal of the session's own devpts.
#[cfg(feature = "landlock")]
#[test]
fn landlock_inspect_s_stateful_tools_run_in_a_session() {
    inspect_s_stateful_tools_run_in_a_session("landlock");
}

/// inspect_ai's own conformance checks for sandbox providers
/// (`inspect_ai.util._sandbox.self_check`), each on a fresh sample
/// sandbox: all pass but running as another user, refused by name (one
/// user runs every command of a native sandbox). The session's own `/tmp`
/// takes the checks' files and directories there.
fn inspect_s_own_sandbox_checks_pass_but_for_hull_s_design(tier: &str) {
    require_tier(tier);
    let w = World::new();
    let v = run(
        &w,
        &[script("inspect_self_check.py").as_os_str(), tier.as_ref()],
    );
    let checks = v.as_object().unwrap();
    assert!(checks.len() >= 40, "{v:#}");
    let failed: Vec<(&String, &str)> = checks
        .iter()
        .map(|(k, r)| (k, r.as_str().unwrap()))
        .filter(|(_, r)| *r != "pass")
        .collect();
    let expected = [(
        "test_exec_as_user",
        "SandboxUserUnsupportedError: hull: user 'root'",
    )];
    assert_eq!(checks["hull_exec_as_the_session_s_user"], "pass");
    for (name, why) in &failed {
        assert!(
            expected.iter().any(|(n, w)| *name == n && why.contains(w)),
            "{name} failed: {why}"
        );
    }
    assert_eq!(failed.len(), expected.len(), "{failed:#?}");
    nothing_left(&w);
}

#[cfg(feature = "bwrap")]
#[test]
fn bwrap_inspect_s_own_sandbox_checks_pass_but_for_hull_s_design() {
    inspect_s_own_sandbox_checks_pass_but_for_hull_s_design("bwrap");
}

#[cfg(feature = "landlock")]
#[test]
fn landlock_inspect_s_own_sandbox_checks_pass_but_for_hull_s_design() {
    inspect_s_own_sandbox_checks_pass_but_for_hull_s_design("landlock");
}

/// Tier 3: the same eval, each sample's session with a VM of its own; the
/// same action list in one session's VM.
#[cfg(feature = "tier3")]
mod vm {
    #[test]
    fn an_inspect_eval_of_two_samples() {
        super::an_inspect_eval_of_two_samples("vm");
    }

    #[test]
    fn mini_swe_agent_runs_a_scripted_action_list() {
        super::mini_swe_agent_runs_a_scripted_action_list("vm");
    }

    #[test]
    fn mini_swe_agent_runs_its_stock_configs() {
        super::mini_swe_agent_runs_its_stock_configs("vm");
    }

    /// inspect's `text_editor` and `bash_session` in a vm session: the
    /// tools' server injected in the container's `/var/tmp`, the shell a
    /// process the container keeps between execs.
    #[test]
    fn inspect_s_stateful_tools_run_in_a_session() {
        super::inspect_s_stateful_tools_run_in_a_session("vm");
    }

    /// Every one of inspect's checks passes on vm, `test_exec_as_user`
    /// too (root adds a user, whom the next exec runs as), all on one
    /// sample's sandbox (a VM each would take minutes under TCG); an
    /// unknown user is refused naming it.
    #[test]
    fn inspect_s_own_sandbox_checks_all_pass() {
        hull_tests::require_tier("vm");
        let w = hull_tests::World::new();
        let v = super::run(
            &w,
            &[
                super::script("inspect_self_check.py").as_os_str(),
                "vm".as_ref(),
                "--one-sandbox".as_ref(),
            ],
        );
        let checks = v.as_object().unwrap();
        assert!(checks.len() >= 40, "{v:#}");
        assert_eq!(checks["test_exec_as_user"], "pass", "{v:#}");
        assert_eq!(
            checks["hull_exec_as_root_of_the_container"], "pass",
            "{v:#}"
        );
        let failed: Vec<_> = checks.iter().filter(|(_, r)| *r != "pass").collect();
        assert!(failed.is_empty(), "{failed:#?}");
        super::nothing_left(&w);
    }
}
