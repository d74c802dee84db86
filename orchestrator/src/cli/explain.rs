//! `hull policy check|explain`: validate a policy, and show what each tier
//! will actually enforce for it on this host.
use std::path::PathBuf;

use clap::Args;
use serde_json::json;

use crate::policy::{self, Policy, RealFs, Vars};
use crate::tier::Tier;

#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// Tier to show (default: every tier with a lowering).
    #[arg(long)]
    pub tier: Option<String>,
    /// Policy file or profile name (default: `default`).
    pub policy: Option<String>,
    /// The project the policy is resolved for (default: the current directory).
    #[arg(long)]
    pub project: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
}

/// `hull policy check`: exit 0 when valid, 1 with `file:line: key: message` when not.
pub fn check(spec: &str) -> anyhow::Result<i32> {
    let r = policy::profiles::load(spec)
        .and_then(|pf| policy::resolve(&pf, &example_vars(PathBuf::from("/project"))));
    match r {
        Ok(p) => {
            println!(
                "ok: {} ({} grants, {} protections)",
                p.name,
                p.grants.len(),
                p.protects.len()
            );
            Ok(0)
        }
        Err(e) => {
            eprintln!("hull: invalid policy: {e}");
            Ok(1)
        }
    }
}

/// The variables of a hypothetical instance, for explaining.
pub fn example_vars(project: PathBuf) -> Vars {
    let runs = crate::runtime::runs_root();
    let inst = runs.join("INSTANCE");
    crate::prepare::vars_for(project, inst.join("tmp"), inst.join("spill"), runs)
}

pub fn explain(a: ExplainArgs) -> anyhow::Result<i32> {
    let project = match a.project {
        Some(p) => std::fs::canonicalize(&p)
            .map_err(|e| anyhow::anyhow!("project {}: {e}", p.display()))?,
        None => super::default_project()?,
    };
    let spec = a.policy.unwrap_or_else(|| "default".into());
    let pf = policy::profiles::load(&spec)?;
    let vars = example_vars(project);
    let mut pol = policy::resolve(&pf, &vars)?;
    // `registry:NAME`: what each resolves to here, as a run would see it.
    let registries = registry_lines(&mut pol);
    let tiers: Vec<Tier> = match &a.tier {
        Some(t) => vec![Tier::from_arg(t).ok_or_else(|| anyhow::anyhow!("unknown tier {t:?}"))?],
        None => Tier::ALL.to_vec(),
    };
    let mut out = Vec::new();
    for t in tiers {
        out.push(explain_tier(t, &pol));
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({"policy": pol, "tiers": out}))?
        );
    } else {
        print!("{}", render_policy(&pol, &registries));
        for o in out {
            println!("\n== tier {} ==", o["tier"].as_str().unwrap_or("?"));
            if let Some(lines) = o["lines"].as_array() {
                for l in lines {
                    println!("  {}", l.as_str().unwrap_or(""));
                }
            }
        }
    }
    Ok(0)
}

/// `registry:NAME` entries resolved into the policy's allow list, one line
/// each (or why a run would be refused).
#[cfg(unix)]
fn registry_lines(pol: &mut Policy) -> Result<Vec<String>, String> {
    if pol.net.mode != policy::NetMode::Allowlist {
        return Ok(Vec::new());
    }
    let list = crate::net::registry::apply(&mut pol.net).map_err(|e| e.to_string())?;
    Ok(list
        .iter()
        .map(|r| {
            let hosts: Vec<String> = r.endpoints.iter().map(|e| e.to_string()).collect();
            format!("{}  {}  (from {})", r.registry, hosts.join(" "), r.from)
        })
        .collect())
}

/// Registries are resolved where the proxy runs (Unix).
#[cfg(not(unix))]
fn registry_lines(_pol: &mut Policy) -> Result<Vec<String>, String> {
    Ok(Vec::new())
}

fn render_policy(p: &Policy, registries: &Result<Vec<String>, String>) -> String {
    let mut s = format!("policy {}\n", p.name);
    for g in &p.grants {
        s.push_str(&format!(
            "  {:<10} {}\n",
            g.access.as_str(),
            g.path.display()
        ));
    }
    for x in &p.protects {
        let kind = match x.protection {
            policy::Protection::Hidden => "hidden",
            policy::Protection::ReadOnly => "read-only",
        };
        s.push_str(&format!(
            "  {:<10} {}  ({})\n",
            kind,
            x.path.display(),
            x.reason.as_str()
        ));
    }
    if p.protects
        .iter()
        .any(|x| x.reason == policy::ProtectReason::GitMetadata)
    {
        s.push_str(
            "  (git metadata stays read-only: hooks and config there run code when git is used \
             on the host; fs.git = \"writable\" lifts it, for a copy nobody uses git in)\n",
        );
    }
    if p.git == policy::GitMetadata::Writable {
        s.push_str(
            "  git        writable (fs.git): .git in the writable roots is the command's to \
             change; use this only on a copy nobody runs git in on the host\n",
        );
    }
    let n = &p.net;
    s.push_str(&format!("  network    {}\n", n.mode.as_str()));
    if n.mode == policy::NetMode::Allowlist {
        let list = |v: &[policy::net::HostPattern]| {
            if v.is_empty() {
                "(none)".to_string()
            } else {
                v.iter()
                    .map(|x| x.to_string())
                    .collect::<Vec<_>>()
                    .join(" ")
            }
        };
        s.push_str(&format!("    allow    {}\n", list(&n.allow)));
        s.push_str(&format!("    deny     {}\n", list(&n.deny)));
        let ports: Vec<String> = n.ports.iter().map(u16::to_string).collect();
        s.push_str(&format!("    ports    {}\n", ports.join(" ")));
        #[cfg(unix)]
        match crate::net::trust::host_bundle() {
            Some((path, _)) => s.push_str(&format!(
                "    trust    the host's certificate authorities ({}), copied into the run's tmp and named by {} (each unless the policy sets it)\n",
                path.display(),
                crate::net::trust::VARS.join(" ")
            )),
            None => s.push_str(&format!(
                "    trust    the host has no certificate bundle ({}): the clients keep their own\n",
                crate::net::trust::HOST_BUNDLES.join(", ")
            )),
        }
        match registries {
            Ok(lines) => {
                for l in lines {
                    s.push_str(&format!("    {l}\n"));
                }
            }
            Err(e) => s.push_str(&format!("    net.allow: {e} (a run is refused)\n")),
        }
        for (name, ip) in &n.hosts {
            s.push_str(&format!("    host     {name} = {ip}\n"));
        }
        for net in &n.allow_private {
            s.push_str(&format!("    private  {net}\n"));
        }
    }
    let l = &p.limits;
    s.push_str(&format!(
        "  limits     wall_time={:?} memory={:?} pids={:?} cpus={:?}\n",
        l.wall_time, l.memory, l.pids, l.cpus
    ));
    s.push_str(&format!("  env pass   {}\n", p.env.pass.join(" ")));
    for (k, v) in &p.env.set {
        s.push_str(&format!("  env set    {k}={v}\n"));
    }
    s
}

/// One tier's lowered form as lines (and notes), or why there is none.
pub fn explain_tier(t: Tier, p: &Policy) -> serde_json::Value {
    let fs = RealFs;
    let lines: Result<Vec<String>, String> = match t {
        Tier::None => Ok(vec!["no boundary: environment scrub and cwd only".into()]),
        Tier::Bwrap => {
            let runs = crate::runtime::runs_root().join("INSTANCE");
            let masks = policy::lower::bwrap::Masks {
                empty_dir: runs.join("mask/dir"),
                empty_file: runs.join("mask/file"),
            };
            policy::lower::bwrap::lower(p, &fs, &masks, &p.vars.project)
                .map(|b| {
                    let mut l = vec!["bwrap \\".to_string()];
                    l.extend(b.display_lines().into_iter().map(|x| format!("  {x} \\")));
                    l.push("  --seccomp FD -- CMD...".into());
                    l.extend(
                        b.placeholders
                            .iter()
                            .map(|x| format!("# placeholder created: {}", x.path.display())),
                    );
                    l.extend(b.notes.iter().map(|n| format!("# note: {n}")));
                    l
                })
                .map_err(|e| e.to_string())
        }
        Tier::Landlock => policy::lower::landlock::lower(p, &fs)
            .map(|b| {
                let mut l = b.display_lines();
                l.push(
                    "seccomp: IP sockets refused; escape syscalls refused (see tier::seccomp)"
                        .into(),
                );
                l.extend(b.notes.iter().map(|n| format!("# note: {n}")));
                l
            })
            .map_err(|e| e.to_string()),
        Tier::Seatbelt => crate::tier::seatbelt::explain(p, &fs)
            .map(|sb| sb.explain().lines().map(str::to_string).collect())
            .map_err(|e| e.to_string()),
        Tier::AppContainer => {
            policy::lower::appcontainer::lower(p, &crate::tier::windows::workspace_of(p))
                .map(|plan| plan.render().lines().map(str::to_string).collect())
                .map_err(|e| e.to_string())
        }
        Tier::Restricted => {
            policy::lower::restricted::lower(p, &crate::tier::windows::workspace_of(p))
                .map(|plan| plan.render().lines().map(str::to_string).collect())
                .map_err(|e| e.to_string())
        }
        Tier::Vm => crate::tier::vm::explain(p)
            .map(|s| s.lines().map(str::to_string).collect())
            .map_err(|e| e.to_string()),
    };
    let lines = lines.map(|mut l| {
        l.push(match t.network(&p.net) {
            Ok(how) => format!("network: {how}"),
            Err(e) => format!("network: a run is refused: {e}"),
        });
        l
    });
    match lines {
        Ok(l) => json!({"tier": t.name(), "lines": l}),
        Err(e) => {
            json!({"tier": t.name(), "error": e, "lines": [format!("cannot be lowered here: {e}")]})
        }
    }
}
