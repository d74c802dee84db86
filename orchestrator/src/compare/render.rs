//! `hull compare`'s table as text, and its page: one self-contained HTML
//! file (no external asset) with an SVG chart of the wall times, the
//! table, the canary's matrix for the same tiers and each tier's receipt.

use super::{Report, TierReport, DIRECT};
use crate::text::html_escape;

/// A duration in seconds as people read it: `41.3 ms`, `1.27 s`.
pub fn seconds(s: f64) -> String {
    if s < 1.0 {
        format!("{:.1} ms", s * 1000.0)
    } else {
        format!("{s:.2} s")
    }
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0))
}

/// A row's label: the direct run says what it is.
fn label(r: &TierReport) -> String {
    if r.tier == DIRECT {
        "direct (no hull)".into()
    } else {
        r.tier.clone()
    }
}

/// A row's cells after the tier's: median, min, max, ratios, peak
/// memory, exit codes, stdout.
fn cells(r: &TierReport) -> [String; 8] {
    let dash = || "-".to_string();
    let ratio = |v: Option<f64>| v.map_or_else(dash, |x| format!("{x:.2}x"));
    let stdout = match (r.tier.as_str(), r.stdout_matches) {
        (_, None) if r.stdout_sha256.is_none() => "varies".to_string(),
        (DIRECT, Some(true)) => "reference".to_string(),
        (_, Some(true)) => "same".to_string(),
        (_, Some(false)) => "differs".to_string(),
        (_, None) => dash(),
    };
    let mut exit: Vec<String> = r.exit_codes.iter().map(i32::to_string).collect();
    if r.failed_runs > 0 {
        let statuses: Vec<&str> = r
            .samples
            .iter()
            .filter(|s| s.status != "exit")
            .map(|s| s.status.as_str())
            .collect();
        exit.push(format!("{} {}", r.failed_runs, statuses.join(",")));
    }
    [
        r.wall_s.map_or_else(dash, |s| seconds(s.median)),
        r.wall_s.map_or_else(dash, |s| seconds(s.min)),
        r.wall_s.map_or_else(dash, |s| seconds(s.max)),
        ratio(r.ratio_to_fastest),
        ratio(r.ratio_to_direct),
        r.peak_memory_bytes.map_or_else(dash, mib),
        if exit.is_empty() {
            dash()
        } else {
            exit.join(" ")
        },
        stdout,
    ]
}

const HEADINGS: [&str; 9] = [
    "tier",
    "median",
    "min",
    "max",
    "x fastest",
    "x direct",
    "peak memory",
    "exit",
    "stdout",
];

/// The table as text, then what did not run and whose stdout differed.
pub fn text(r: &Report) -> String {
    let mut rows: Vec<Vec<String>> = vec![HEADINGS.iter().map(|h| h.to_string()).collect()];
    for t in r.tiers.iter().filter(|t| t.available) {
        let mut row = vec![label(t)];
        row.extend(cells(t));
        rows.push(row);
    }
    let widths: Vec<usize> = (0..HEADINGS.len())
        .map(|i| {
            rows.iter()
                .map(|row| row[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = format!(
        "hull compare: {} ({} run{} a tier after {} warm-up, policy {})\n",
        r.command.join(" "),
        r.runs,
        if r.runs == 1 { "" } else { "s" },
        r.warmup,
        r.policy
    );
    for row in &rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i == 0 {
                line.push_str(&format!("{cell:<w$}", w = widths[i]));
            } else {
                line.push_str(&format!("  {cell:>w$}", w = widths[i]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    for t in r.tiers.iter().filter(|t| !t.available) {
        out.push_str(&format!(
            "{}: not available here: {}\n",
            t.tier,
            t.reason.as_deref().unwrap_or("")
        ));
    }
    for t in &r.tiers {
        for s in t.samples.iter().filter_map(|s| s.error.as_deref()).take(1) {
            out.push_str(&format!("{}: {}\n", t.tier, crate::text::printable(s)));
        }
    }
    let reference = r.stdout_reference.as_deref().unwrap_or("none");
    if r.stdout_matched {
        out.push_str(&format!(
            "stdout: the same on every tier (reference: {reference})\n"
        ));
    } else if !r.stdout_differs.is_empty() {
        out.push_str(&format!(
            "stdout: differs on {} (reference: {reference})\n",
            r.stdout_differs.join(", ")
        ));
    }
    out
}

/// The chart: one line per row that ran, a bar to its median and a
/// whisker from its min to its max, on a logarithmic time axis (a VM's
/// second and a process's millisecond on one chart).
pub fn svg(r: &Report) -> String {
    let measured: Vec<&TierReport> = r.tiers.iter().filter(|t| t.wall_s.is_some()).collect();
    let (row_h, left, width) = (28.0, 150.0, 560.0);
    let height = 40.0 + row_h * measured.len() as f64;
    let lo = measured
        .iter()
        .filter_map(|t| t.wall_s.map(|s| s.min))
        .fold(f64::INFINITY, f64::min)
        .max(1e-4)
        / 2.0;
    let hi = measured
        .iter()
        .filter_map(|t| t.wall_s.map(|s| s.max))
        .fold(0.0, f64::max)
        .max(lo * 10.0)
        * 2.0;
    let x = |v: f64| left + (v.max(lo).ln() - lo.ln()) / (hi.ln() - lo.ln()) * width;
    let mut o = format!(
        "<svg id=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{height}\" \
         role=\"img\" aria-label=\"wall time per tier\" font-family=\"sans-serif\" font-size=\"12\">\n",
        w = left + width + 90.0
    );
    // Decades on the axis: 0.1 ms, 1 ms, 10 ms, ...
    let mut tick = 10f64.powf(lo.log10().ceil());
    while tick <= hi {
        let tx = x(tick);
        o.push_str(&format!(
            "<line x1=\"{tx:.1}\" y1=\"10\" x2=\"{tx:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/>\
             <text x=\"{tx:.1}\" y=\"{ty:.1}\" text-anchor=\"middle\" fill=\"#666\">{}</text>\n",
            seconds(tick),
            y = height - 22.0,
            ty = height - 8.0
        ));
        tick *= 10.0;
    }
    for (i, t) in measured.iter().enumerate() {
        let Some(s) = t.wall_s else { continue };
        let y = 14.0 + row_h * i as f64;
        let colour = if t.tier == DIRECT { "#999" } else { "#4a78c2" };
        o.push_str(&format!(
            "<g class=\"bar\" data-tier=\"{tier}\"><text x=\"{lx:.1}\" y=\"{ty:.1}\" text-anchor=\"end\">{name}</text>\
             <rect x=\"{left:.1}\" y=\"{y:.1}\" width=\"{bw:.1}\" height=\"16\" fill=\"{colour}\"/>\
             <line x1=\"{x0:.1}\" y1=\"{ym:.1}\" x2=\"{x1:.1}\" y2=\"{ym:.1}\" stroke=\"#000\"/>\
             <line x1=\"{x0:.1}\" y1=\"{yt:.1}\" x2=\"{x0:.1}\" y2=\"{yb:.1}\" stroke=\"#000\"/>\
             <line x1=\"{x1:.1}\" y1=\"{yt:.1}\" x2=\"{x1:.1}\" y2=\"{yb:.1}\" stroke=\"#000\"/>\
             <text x=\"{vx:.1}\" y=\"{ty:.1}\">{median}</text></g>\n",
            tier = html_escape(&t.tier),
            name = html_escape(&label(t)),
            lx = left - 8.0,
            ty = y + 12.0,
            bw = (x(s.median) - left).max(1.0),
            x0 = x(s.min),
            x1 = x(s.max),
            ym = y + 8.0,
            yt = y + 3.0,
            yb = y + 13.0,
            vx = x(s.max) + 6.0,
            median = seconds(s.median),
        ));
    }
    o.push_str("</svg>\n");
    o
}

/// The whole page: the chart, the table, `matrix` (the canary's, for the
/// same tiers: [`crate::canary::matrix_html`]) when given, and each
/// tier's receipt. Every text from a run is escaped.
pub fn html(r: &Report, matrix: Option<&str>, matrix_style: &str) -> String {
    let mut o = format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>hull compare</title><style>\
         body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse;margin:1em 0}}\
         td,th{{border:1px solid #999;padding:.3em .6em;text-align:left}}\
         td.num{{text-align:right}}.differs{{background:#f4d0a0}}.same,.reference{{background:#c8f0c8}}\
         .unavailable{{color:#666}}{matrix_style}\
         </style></head><body><h1>hull compare</h1>\n<p>Command <code>{}</code>: {} run{} a tier \
         after {} warm-up, policy <code>{}</code>; the rounds interleave the tiers.</p>\n",
        html_escape(&r.command.join(" ")),
        r.runs,
        if r.runs == 1 { "" } else { "s" },
        r.warmup,
        html_escape(&r.policy),
    );
    o.push_str("<h2>Wall time per tier</h2>\n");
    o.push_str(&svg(r));
    o.push_str("<table id=\"compare\"><tr>");
    for h in HEADINGS {
        o.push_str(&format!("<th>{h}</th>"));
    }
    o.push_str("</tr>\n");
    for t in &r.tiers {
        if !t.available {
            o.push_str(&format!(
                "<tr class=\"unavailable\" data-tier=\"{0}\"><td>{0}</td><td colspan=\"8\">not available here: {1}</td></tr>\n",
                html_escape(&t.tier),
                html_escape(t.reason.as_deref().unwrap_or(""))
            ));
            continue;
        }
        let c = cells(t);
        o.push_str(&format!(
            "<tr data-tier=\"{}\"><td>{}</td>",
            html_escape(&t.tier),
            html_escape(&label(t))
        ));
        for (i, cell) in c.iter().enumerate() {
            let class = if i == c.len() - 1 {
                cell.as_str()
            } else {
                "num"
            };
            o.push_str(&format!(
                "<td class=\"{}\">{}</td>",
                html_escape(class),
                html_escape(cell)
            ));
        }
        o.push_str("</tr>\n");
    }
    o.push_str("</table>\n");
    let reference = r.stdout_reference.as_deref().unwrap_or("none");
    o.push_str(&format!(
        "<p id=\"stdout\">{}</p>\n",
        html_escape(&if r.stdout_matched {
            format!("stdout: the same on every tier (reference: {reference})")
        } else {
            format!(
                "stdout: differs on {} (reference: {reference})",
                r.stdout_differs.join(", ")
            )
        })
    ));
    if let Some(m) = matrix {
        o.push_str("<h2>What each tier stops (hull canary)</h2>\n");
        o.push_str(m);
    }
    o.push_str("<h2>Isolation receipts</h2>\n<table id=\"receipts\"><tr><th>tier</th><th>what isolated it</th></tr>\n");
    for t in r.tiers.iter().filter(|t| t.receipt.is_some()) {
        let mut parts = Vec::new();
        if let Some(obj) = t.receipt.as_ref().and_then(|v| v.as_object()) {
            for (k, v) in obj {
                match v {
                    serde_json::Value::Object(m) => {
                        for (ck, cv) in m {
                            parts.push(format!("{ck}: {}", cv.as_str().unwrap_or_default()));
                        }
                    }
                    serde_json::Value::String(s) if k != "tier" => parts.push(format!("{k}: {s}")),
                    _ => {}
                }
            }
        }
        o.push_str(&format!(
            "<tr><td>{}</td><td>{}</td></tr>\n",
            html_escape(&t.tier),
            html_escape(&parts.join("; "))
        ));
    }
    o.push_str("</table>\n</body></html>\n");
    o
}

#[cfg(test)]
mod tests {
    use super::super::{summarize, Sample, TierReport};
    use super::*;

    fn report() -> Report {
        let s = |wall_s: f64, out: &str| Sample {
            wall_s,
            status: "exit".into(),
            exit_code: Some(0),
            peak_memory_bytes: Some(3 << 20),
            stdout_sha256: Some(out.into()),
            error: None,
        };
        summarize(
            vec!["cat".into(), "/proc/1/comm".into()],
            "default".into(),
            1,
            0,
            vec![
                TierReport::measured(DIRECT, vec![s(0.002, "a")], None),
                TierReport::measured("landlock", vec![s(0.04, "a")], None),
                TierReport::measured(
                    "vm",
                    vec![s(1.2, "<b>")],
                    Some(serde_json::json!({"tier": "vm", "accelerator": "tcg",
                        "components": {"qemu": "QEMU 9.2 <x>"}})),
                ),
                TierReport::unavailable("seatbelt", "macOS only".into()),
            ],
        )
    }

    #[test]
    fn the_text_table_names_every_tier_and_what_differed() {
        let t = text(&report());
        assert!(t.contains("direct (no hull)"), "{t}");
        assert!(
            t.contains("1.20 s") && t.contains("40.0 ms") && t.contains("3.0 MiB"),
            "{t}"
        );
        assert!(
            t.contains("seatbelt: not available here: macOS only"),
            "{t}"
        );
        assert!(
            t.contains("stdout: differs on vm (reference: direct)"),
            "{t}"
        );
        assert!(t.contains("30.00x"), "{t}");
    }

    #[test]
    fn the_page_is_self_contained_and_escapes_what_runs_said() {
        let h = html(&report(), Some("<table id=\"matrix\"></table>"), "");
        assert!(h.contains("<svg id=\"chart\""));
        assert_eq!(h.matches("<g class=\"bar\"").count(), 3);
        assert!(h.contains("<table id=\"compare\">") && h.contains("<table id=\"matrix\">"));
        assert!(h.contains("qemu: QEMU 9.2 &lt;x&gt;"), "{h}");
        assert!(
            !h.contains("src=") && !h.contains("href="),
            "an external asset: {h}"
        );
        assert!(h.contains("not available here: macOS only"));
    }
}
