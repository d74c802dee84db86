//! `hull compare`: the same command on several tiers, and on none at all,
//! side by side. Each round runs it once on every tier in turn (the order
//! rotated each round, so that machine noise falls evenly), warm-up rounds
//! first and not counted; each tier's wall times (median, min, max) are
//! set against the fastest tier's and the direct run's, with its peak
//! memory where the tier can tell, its exit codes, and whether its stdout
//! is the direct run's.
//!
//! This module holds what is measured and how it is summed up
//! ([`summarize`]); `run` runs the rounds, `direct` the command without
//! hull, `render` writes the table and the page.

#[cfg(target_os = "linux")]
pub mod batch;
#[cfg(target_os = "linux")]
pub mod direct;
pub mod render;
#[cfg(target_os = "linux")]
pub mod run;

use serde::Serialize;

/// The row of the run without hull.
pub const DIRECT: &str = "direct";

/// One run of the command on one tier.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sample {
    /// From starting `hull run` (or the command, direct) to its exit.
    pub wall_s: f64,
    /// `exit`, `signal`, `timeout`, `hull_error` (as batch results say).
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_memory_bytes: Option<u64>,
    /// sha256 of everything the command wrote to stdout.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdout_sha256: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Median, min and max of a tier's measured wall times, in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Stats {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Stats {
    /// None for no values.
    pub fn of(values: &[f64]) -> Option<Stats> {
        let mut v: Vec<f64> = values.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = match n {
            0 => return None,
            _ if n % 2 == 1 => v[n / 2],
            _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        };
        Some(Stats {
            median,
            min: v[0],
            max: v[n - 1],
        })
    }
}

/// One row of the comparison: a tier (or the direct run).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TierReport {
    pub tier: String,
    pub available: bool,
    /// Why the tier did not run here.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The measured runs (warm-up runs are not kept).
    pub samples: Vec<Sample>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wall_s: Option<Stats>,
    /// Median over the fastest tier's median (the direct run is not a
    /// tier).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio_to_fastest: Option<f64>,
    /// Median over the direct run's median.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio_to_direct: Option<f64>,
    /// The largest peak of its runs, where the tier can tell.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_memory_bytes: Option<u64>,
    /// Each exit code its runs gave, once, in order.
    pub exit_codes: Vec<i32>,
    /// Runs that did not exit (a signal, a timeout, hull's error).
    pub failed_runs: usize,
    /// The stdout digest its runs all gave; None when they differ.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdout_sha256: Option<String>,
    /// Whether its stdout is the reference's (see [`Report`]); None when
    /// there is no reference or its runs disagree among themselves.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdout_matches: Option<bool>,
    /// What isolated it: versions, accelerator, image.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub receipt: Option<serde_json::Value>,
}

impl TierReport {
    /// A tier that does not run here.
    pub fn unavailable(tier: &str, reason: String) -> TierReport {
        TierReport {
            tier: tier.to_string(),
            available: false,
            reason: Some(reason),
            samples: Vec::new(),
            wall_s: None,
            ratio_to_fastest: None,
            ratio_to_direct: None,
            peak_memory_bytes: None,
            exit_codes: Vec::new(),
            failed_runs: 0,
            stdout_sha256: None,
            stdout_matches: None,
            receipt: None,
        }
    }

    /// A tier (or the direct run) that ran `samples`.
    pub fn measured(
        tier: &str,
        samples: Vec<Sample>,
        receipt: Option<serde_json::Value>,
    ) -> TierReport {
        let mut r = TierReport::unavailable(tier, String::new());
        r.available = true;
        r.reason = None;
        r.receipt = receipt;
        r.samples = samples;
        r
    }
}

/// The whole comparison.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub command: Vec<String>,
    pub policy: String,
    pub runs: usize,
    pub warmup: usize,
    /// The direct run first, then the tiers as asked.
    pub tiers: Vec<TierReport>,
    /// The tier with the lowest median.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fastest: Option<String>,
    /// Whose stdout the others are held against: the direct run's when its
    /// runs agree, else the digest most tiers gave.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdout_reference: Option<String>,
    /// Every tier that ran gave the reference's stdout.
    pub stdout_matched: bool,
    /// The tiers whose stdout differed (or varied between runs).
    pub stdout_differs: Vec<String>,
}

/// Sums up the rows' samples: statistics, ratios, peaks, exit codes and
/// the stdout comparison.
pub fn summarize(
    command: Vec<String>,
    policy: String,
    runs: usize,
    warmup: usize,
    mut rows: Vec<TierReport>,
) -> Report {
    for r in &mut rows {
        let walls: Vec<f64> = r.samples.iter().map(|s| s.wall_s).collect();
        r.wall_s = Stats::of(&walls);
        r.peak_memory_bytes = r.samples.iter().filter_map(|s| s.peak_memory_bytes).max();
        r.exit_codes.clear();
        for code in r.samples.iter().filter_map(|s| s.exit_code) {
            if !r.exit_codes.contains(&code) {
                r.exit_codes.push(code);
            }
        }
        r.failed_runs = r.samples.iter().filter(|s| s.status != "exit").count();
        let first = r.samples.first().and_then(|s| s.stdout_sha256.clone());
        r.stdout_sha256 = first.filter(|d| {
            r.samples
                .iter()
                .all(|s| s.stdout_sha256.as_deref() == Some(d.as_str()))
        });
    }
    let median = |r: &TierReport| r.wall_s.map(|s| s.median);
    let fastest = rows
        .iter()
        .filter(|r| r.tier != DIRECT)
        .filter_map(|r| median(r).map(|m| (m, r.tier.clone())))
        .min_by(|a, b| a.0.total_cmp(&b.0));
    let direct = rows.iter().find(|r| r.tier == DIRECT);
    let direct_median = direct.and_then(median);
    // The reference: the direct run's stdout, else the most common one.
    let (reference, reference_digest) = match direct.and_then(|d| d.stdout_sha256.clone()) {
        Some(d) => (Some(DIRECT.to_string()), Some(d)),
        None => {
            let mut counts: Vec<(String, usize)> = Vec::new();
            for d in rows.iter().filter_map(|r| r.stdout_sha256.clone()) {
                match counts.iter_mut().find(|(x, _)| *x == d) {
                    Some((_, n)) => *n += 1,
                    None => counts.push((d, 1)),
                }
            }
            let best = counts.into_iter().max_by_key(|(_, n)| *n).map(|(d, _)| d);
            (best.as_ref().map(|_| "majority".to_string()), best)
        }
    };
    let mut differs = Vec::new();
    for r in &mut rows {
        if let (Some(m), Some((f, _))) = (median(r), &fastest) {
            if r.tier != DIRECT && *f > 0.0 {
                r.ratio_to_fastest = Some(m / f);
            }
        }
        if let (Some(m), Some(d)) = (median(r), direct_median) {
            if d > 0.0 {
                r.ratio_to_direct = Some(m / d);
            }
        }
        if r.samples.is_empty() {
            continue;
        }
        r.stdout_matches = match (&r.stdout_sha256, &reference_digest) {
            (Some(mine), Some(theirs)) => Some(mine == theirs),
            _ => None,
        };
        if r.stdout_matches != Some(true) && r.tier != DIRECT {
            differs.push(r.tier.clone());
        }
    }
    Report {
        command,
        policy,
        runs,
        warmup,
        stdout_matched: differs.is_empty() && reference_digest.is_some(),
        stdout_differs: differs,
        fastest: fastest.map(|(_, t)| t),
        stdout_reference: reference,
        tiers: rows,
    }
}

/// The order of the rows to run in round `round`: `names` rotated by the
/// round, so that each goes first, second, ... equally often.
pub fn round_order(names: &[String], round: usize) -> Vec<String> {
    let n = names.len();
    (0..n)
        .map(|i| names[(i + round) % n.max(1)].clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(wall_s: f64, code: i32, out: &str, peak: Option<u64>) -> Sample {
        Sample {
            wall_s,
            status: "exit".into(),
            exit_code: Some(code),
            peak_memory_bytes: peak,
            stdout_sha256: Some(out.into()),
            error: None,
        }
    }

    #[test]
    fn medians_ratios_peaks_and_the_stdout_that_differs() {
        let rows = vec![
            TierReport::measured(
                DIRECT,
                vec![sample(0.01, 0, "a", None), sample(0.03, 0, "a", None)],
                None,
            ),
            TierReport::measured(
                "landlock",
                vec![
                    sample(0.04, 0, "a", Some(5)),
                    sample(0.05, 0, "a", Some(7)),
                    sample(0.09, 0, "a", Some(6)),
                ],
                None,
            ),
            TierReport::measured(
                "bwrap",
                vec![sample(0.1, 0, "b", None), sample(0.1, 1, "b", None)],
                None,
            ),
            TierReport::unavailable("seatbelt", "macOS only".into()),
        ];
        let r = summarize(vec!["true".into()], "default".into(), 2, 0, rows);
        let row = |t: &str| r.tiers.iter().find(|x| x.tier == t).unwrap();
        assert_eq!(
            row(DIRECT).wall_s,
            Some(Stats {
                median: 0.02,
                min: 0.01,
                max: 0.03
            })
        );
        assert_eq!(row("landlock").wall_s.unwrap().median, 0.05);
        assert_eq!(r.fastest.as_deref(), Some("landlock"));
        assert_eq!(row("landlock").ratio_to_fastest, Some(1.0));
        assert!((row("bwrap").ratio_to_fastest.unwrap() - 2.0).abs() < 1e-9);
        assert!((row("landlock").ratio_to_direct.unwrap() - 2.5).abs() < 1e-9);
        assert_eq!(row(DIRECT).ratio_to_fastest, None);
        assert_eq!(row("landlock").peak_memory_bytes, Some(7));
        assert_eq!(row("bwrap").exit_codes, [0, 1]);
        assert_eq!(r.stdout_reference.as_deref(), Some(DIRECT));
        assert_eq!(row("landlock").stdout_matches, Some(true));
        assert_eq!(row("bwrap").stdout_matches, Some(false));
        assert_eq!(row("seatbelt").stdout_matches, None);
        assert_eq!(r.stdout_differs, ["bwrap"]);
        assert!(!r.stdout_matched);
    }

    #[test]
    fn without_a_steady_direct_run_the_most_common_stdout_is_the_reference() {
        let rows = vec![
            TierReport::measured(
                DIRECT,
                vec![sample(0.01, 0, "x", None), sample(0.01, 0, "y", None)],
                None,
            ),
            TierReport::measured("landlock", vec![sample(0.04, 0, "a", None)], None),
            TierReport::measured("bwrap", vec![sample(0.04, 0, "a", None)], None),
            TierReport::measured("vm", vec![sample(1.0, 0, "b", None)], None),
        ];
        let r = summarize(vec!["x".into()], "default".into(), 1, 0, rows);
        assert_eq!(r.stdout_reference.as_deref(), Some("majority"));
        assert_eq!(r.stdout_differs, ["vm"]);
        let all_same = summarize(
            vec![],
            "default".into(),
            1,
            0,
            vec![
                TierReport::measured(DIRECT, vec![sample(0.01, 0, "a", None)], None),
                TierReport::measured("bwrap", vec![sample(0.04, 0, "a", None)], None),
            ],
        );
        assert!(all_same.stdout_matched);
    }

    #[test]
    fn each_row_leads_a_round_in_turn() {
        let names: Vec<String> = ["direct", "landlock", "bwrap"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(round_order(&names, 0), names);
        assert_eq!(round_order(&names, 1), ["landlock", "bwrap", "direct"]);
        assert_eq!(round_order(&names, 3), names);
        assert_eq!(Stats::of(&[]), None);
    }
}
