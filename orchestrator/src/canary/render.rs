//! The canary's matrix as text and as one self-contained HTML page.

use super::{Cell, Verdict};
use crate::text::html_escape;

/// The matrix's columns (tiers, the control first) and rows (probe, class),
/// in the order the cells came.
fn layout(cells: &[Cell]) -> (Vec<&str>, Vec<(&'static str, &'static str)>) {
    let mut tiers: Vec<&str> = Vec::new();
    let mut rows: Vec<(&'static str, &'static str)> = Vec::new();
    for c in cells {
        if !tiers.contains(&c.tier.as_str()) {
            tiers.push(&c.tier);
        }
        if !rows.iter().any(|(p, _)| *p == c.probe) {
            rows.push((c.probe, c.class));
        }
    }
    (tiers, rows)
}

/// A column's heading.
fn column(tier: &str) -> &str {
    if tier == "none" {
        "none (control)"
    } else {
        tier
    }
}

/// What a cell shows: under the control, an attack that landed "lands".
fn shown(c: &Cell) -> &'static str {
    match (c.tier.as_str(), c.verdict) {
        ("none", Verdict::Allowed) => "lands",
        (_, v) => v.label(),
    }
}

/// The matrix as text: one row per probe, one column per tier (the control
/// first), and the evidence of every cell that is not as it should be.
pub fn render(cells: &[Cell]) -> String {
    let (tiers, rows) = layout(cells);
    let mut line = format!("{:<28} {:<30}", "probe", "class");
    for t in &tiers {
        line.push_str(&format!(" {:<19}", column(t)));
    }
    let mut out = format!("{}\n", line.trim_end());
    for (probe, class) in &rows {
        let mut line = format!("{probe:<28} {class:<30}");
        for t in &tiers {
            let v = cells
                .iter()
                .find(|c| c.probe == *probe && c.tier == *t)
                .map_or("", shown);
            line.push_str(&format!(" {v:<19}"));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    // Why cells are n/a, once per reason: which probes (every one, when
    // the tier is not there at all) on which tiers.
    let mut reasons: Vec<(&str, Vec<&str>, Vec<&str>)> = Vec::new();
    for c in cells.iter().filter(|c| c.verdict == Verdict::NotApplicable) {
        let at = match reasons.iter().position(|(e, _, _)| *e == c.evidence) {
            Some(i) => i,
            None => {
                reasons.push((&c.evidence, Vec::new(), Vec::new()));
                reasons.len() - 1
            }
        };
        let (_, probes, on) = &mut reasons[at];
        if !probes.contains(&c.probe) {
            probes.push(c.probe);
        }
        if !on.contains(&c.tier.as_str()) {
            on.push(&c.tier);
        }
    }
    for (why, probes, on) in &reasons {
        let which = if probes.len() == rows.len() && rows.len() > 1 {
            "every probe".to_string()
        } else {
            probes.join(", ")
        };
        out.push_str(&format!("  n/a: {which} on {}: {why}\n", on.join(", ")));
    }
    for c in cells
        .iter()
        .filter(|c| c.verdict.is_bad() || (c.verdict == Verdict::Inconclusive && c.tier == "none"))
    {
        out.push_str(&format!(
            "  {} on {}: {}: {}\n",
            c.probe,
            c.tier,
            c.verdict.label(),
            c.evidence
        ));
    }
    out
}

/// The matrix as one self-contained HTML page (no external assets): cells
/// coloured by verdict, each cell's evidence in its tooltip and in a
/// `<details>` under the table. Every text from a probe's run (evidence is
/// the command's own output) is escaped.
pub fn render_html(cells: &[Cell]) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>hull canary</title><style>\
         body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}\
         td,th{{border:1px solid #999;padding:.3em .6em;text-align:left}}{STYLE}\
         </style></head><body><h1>hull canary</h1>\n{}</body></html>\n",
        matrix_html(cells)
    )
}

/// The CSS of the matrix's cells, by verdict.
pub const STYLE: &str = ".denied{background:#c8f0c8}.allowed{background:#d8e8ff}\
     .leak,.failed,.error{background:#f4a0a0;font-weight:bold}\
     .inconclusive{background:#fff0a0}.not_applicable{background:#eee;color:#666}";

/// The matrix as an HTML table (`id="matrix"`, classes by verdict:
/// [`STYLE`]) and the evidence under it, for a page of its own or
/// another's.
pub fn matrix_html(cells: &[Cell]) -> String {
    let (tiers, rows) = layout(cells);
    let mut out = String::from("<table id=\"matrix\"><tr><th>probe</th><th>class</th>");
    for t in &tiers {
        out.push_str(&format!("<th>{}</th>", html_escape(column(t))));
    }
    out.push_str("</tr>\n");
    for (probe, class) in &rows {
        out.push_str(&format!(
            "<tr><td>{}</td><td>{}</td>",
            html_escape(probe),
            html_escape(class)
        ));
        for t in &tiers {
            match cells.iter().find(|c| c.probe == *probe && c.tier == *t) {
                Some(c) => {
                    let class = serde_json::to_value(c.verdict)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_default();
                    let label = shown(c);
                    out.push_str(&format!(
                        "<td class=\"{class}\" title=\"{}\">{}</td>",
                        html_escape(&c.evidence),
                        html_escape(label)
                    ));
                }
                None => out.push_str("<td></td>"),
            }
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</table>\n<details><summary>evidence</summary><ul>\n");
    for c in cells {
        out.push_str(&format!(
            "<li>{} on {}: {}: {}</li>\n",
            html_escape(c.probe),
            html_escape(&c.tier),
            html_escape(c.verdict.label()),
            html_escape(&c.evidence)
        ));
    }
    out.push_str("</ul></details>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::canary::Verdict;

    fn c(probe: &'static str, tier: &str, verdict: Verdict, evidence: &str) -> Cell {
        Cell {
            probe,
            class: "k",
            tier: tier.into(),
            verdict,
            evidence: evidence.into(),
        }
    }

    #[test]
    fn the_matrix_has_a_row_per_probe_and_says_what_went_wrong() {
        let cells = vec![
            c("a", "none", Verdict::Allowed, "landed"),
            c("a", "landlock", Verdict::Leak, "x exists on the host"),
            c("a", "vm", Verdict::NotApplicable, "no image"),
            c("b", "none", Verdict::Inconclusive, "exit 1: nope"),
            c("b", "landlock", Verdict::Inconclusive, "control"),
            c("b", "vm", Verdict::NotApplicable, "no image"),
        ];
        let text = render(&cells);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].contains("none (control)") && lines[0].contains("landlock"));
        assert!(
            lines[1].starts_with("a ") && lines[1].contains("lands") && lines[1].contains("LEAK")
        );
        assert!(lines[2].starts_with("b ") && lines[2].contains("inconclusive"));
        assert!(
            text.contains("a on landlock: LEAK: x exists on the host"),
            "{text}"
        );
        assert!(
            text.contains("b on none: inconclusive: exit 1: nope"),
            "{text}"
        );
        assert_eq!(
            text.matches("n/a: every probe on vm: no image").count(),
            1,
            "{text}"
        );
        assert!(Verdict::Leak.is_bad() && Verdict::Failed.is_bad() && Verdict::Error.is_bad());
        assert!(!Verdict::Inconclusive.is_bad() && !Verdict::NotApplicable.is_bad());
    }

    #[test]
    fn the_html_page_is_self_contained_and_escapes_the_evidence() {
        let cells = vec![
            c("a", "none", Verdict::Allowed, "landed"),
            c(
                "a",
                "bwrap",
                Verdict::Denied,
                "<script>alert(1)</script> \"x\" & 'y'\u{1b}[2J",
            ),
        ];
        let page = render_html(&cells);
        assert!(page.starts_with("<!DOCTYPE html>") && page.ends_with("</html>\n"));
        assert!(
            page.contains("<th>none (control)</th><th>bwrap</th>"),
            "{page}"
        );
        assert!(page.contains("class=\"denied\""), "{page}");
        assert!(
            !page.contains("<script>") && !page.contains('\u{1b}'),
            "{page}"
        );
        assert!(
            page.contains("&lt;script&gt;alert(1)&lt;/script&gt; &quot;x&quot; &amp; &#39;y&#39;")
        );
        for external in ["src=", "href=", "http:", "https:", "@import", "url("] {
            assert!(!page.contains(external), "{external}: {page}");
        }
    }
}
