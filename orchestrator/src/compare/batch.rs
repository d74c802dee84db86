//! A batch run on several tiers, compared job by job: whose exit code
//! and whose stdout differed from the first tier's (`hull batch --tier A
//! --tier B`'s summary).

use crate::batch::ResultLine;

/// Each tier's exit code for one job (None: it did not exit).
pub type Codes = Vec<(String, Option<i32>)>;

/// What differed between the tiers of a batch.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Across {
    /// Jobs with a result on every tier.
    pub jobs: usize,
    /// Per job whose exit codes differ: its id, and each tier's code
    /// (None: it did not exit).
    pub exit_differs: Vec<(String, Codes)>,
    /// Per job whose stdout differs from the first tier's: its id and the
    /// tiers that differ.
    pub stdout_differs: Vec<(String, Vec<String>)>,
}

/// Compares each job's results across `tiers` (the first is the
/// reference); `digest` reads a result's stdout.
pub fn across(
    results: &[ResultLine],
    tiers: &[String],
    digest: &dyn Fn(&ResultLine) -> Option<String>,
) -> Across {
    let mut ids: Vec<&str> = Vec::new();
    for r in results {
        if !ids.contains(&r.id.as_str()) {
            ids.push(&r.id);
        }
    }
    let mut out = Across::default();
    for id in ids {
        let mine: Vec<&ResultLine> = tiers
            .iter()
            .filter_map(|t| results.iter().find(|r| r.id == id && &r.tier == t))
            .collect();
        if mine.len() != tiers.len() || mine.is_empty() {
            continue;
        }
        out.jobs += 1;
        let code = |r: &ResultLine| {
            (r.status == crate::batch::Status::Exit)
                .then_some(r.exit_code)
                .flatten()
        };
        if mine.iter().any(|r| code(r) != code(mine[0])) {
            out.exit_differs.push((
                id.to_string(),
                mine.iter().map(|r| (r.tier.clone(), code(r))).collect(),
            ));
        }
        let reference = digest(mine[0]);
        let differs: Vec<String> = mine[1..]
            .iter()
            .filter(|r| reference.is_none() || digest(r) != reference)
            .map(|r| r.tier.clone())
            .collect();
        if !differs.is_empty() {
            out.stdout_differs.push((id.to_string(), differs));
        }
    }
    out
}

impl Across {
    /// Two lines for the batch's summary: exit codes and stdout.
    pub fn render(&self, reference: &str) -> String {
        const SHOWN: usize = 5;
        let mut o = String::new();
        let more = |n: usize| {
            if n > SHOWN {
                format!(", and {} more", n - SHOWN)
            } else {
                String::new()
            }
        };
        if self.exit_differs.is_empty() {
            o.push_str(&format!(
                "exit codes: the same on every tier for all {} jobs\n",
                self.jobs
            ));
        } else {
            let each: Vec<String> = self
                .exit_differs
                .iter()
                .take(SHOWN)
                .map(|(id, codes)| {
                    let c: Vec<String> = codes
                        .iter()
                        .map(|(t, c)| match c {
                            Some(c) => format!("{t} {c}"),
                            None => format!("{t} -"),
                        })
                        .collect();
                    format!("{id} ({})", c.join(", "))
                })
                .collect();
            o.push_str(&format!(
                "exit codes: differ on {} of {} jobs: {}{}\n",
                self.exit_differs.len(),
                self.jobs,
                each.join("; "),
                more(self.exit_differs.len())
            ));
        }
        if self.stdout_differs.is_empty() {
            o.push_str(&format!(
                "stdout: the same on every tier for all {} jobs (reference: {reference})\n",
                self.jobs
            ));
        } else {
            let each: Vec<String> = self
                .stdout_differs
                .iter()
                .take(SHOWN)
                .map(|(id, t)| format!("{id} ({})", t.join(", ")))
                .collect();
            o.push_str(&format!(
                "stdout: differs from {reference}'s on {} of {} jobs: {}{}\n",
                self.stdout_differs.len(),
                self.jobs,
                each.join("; "),
                more(self.stdout_differs.len())
            ));
        }
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::Status;

    fn line(id: &str, tier: &str, code: i32) -> ResultLine {
        ResultLine {
            id: id.into(),
            tier: tier.into(),
            status: Status::Exit,
            exit_code: Some(code),
            signal: None,
            wall_s: 0.1,
            queue_s: 0.0,
            usage: Default::default(),
            stdout: format!("{id}.{tier}").into(),
            stderr: "e".into(),
            changes: None,
            counts: None,
            policy_sha256: String::new(),
            receipt: Default::default(),
            error: None,
        }
    }

    #[test]
    fn each_job_is_held_against_the_first_tier() {
        let results = vec![
            line("a", "bwrap", 0),
            line("a", "vm", 0),
            line("b", "bwrap", 0),
            line("b", "vm", 1),
            line("c", "bwrap", 0),
        ];
        let tiers = vec!["bwrap".to_string(), "vm".to_string()];
        // b's stdout differs on vm; a's is the same.
        let digest = |r: &ResultLine| {
            Some(
                if r.id == "b" && r.tier == "vm" {
                    "y"
                } else {
                    "x"
                }
                .to_string(),
            )
        };
        let a = across(&results, &tiers, &digest);
        assert_eq!(a.jobs, 2, "c ran on one tier only");
        assert_eq!(
            a.exit_differs,
            [(
                "b".to_string(),
                vec![("bwrap".to_string(), Some(0)), ("vm".to_string(), Some(1))]
            )]
        );
        assert_eq!(
            a.stdout_differs,
            [("b".to_string(), vec!["vm".to_string()])]
        );
        let text = a.render("bwrap");
        assert!(
            text.contains("exit codes: differ on 1 of 2 jobs: b (bwrap 0, vm 1)"),
            "{text}"
        );
        assert!(
            text.contains("stdout: differs from bwrap's on 1 of 2 jobs: b (vm)"),
            "{text}"
        );
    }
}
