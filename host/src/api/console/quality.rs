//! The models page's quality section: per model with a report for its current fingerprint
//! (`api/quality.rs` finds them, as `GET /v1/models/NAME/quality` does), the overall score with
//! its interval, accuracy and ECE, when and how it was measured, and a plot of the score per
//! dimension: bars with their 95% intervals as whiskers, and the floor and ceiling (jevbench's
//! toy models on the same subset) as marks.
//!
//! The plot is SVG written here, inline in the page: sizes and positions are attributes and
//! colours are classes of `assets/console.css`, so it needs neither script nor `style=` under
//! the console's CSP. Every string from a report goes through [`Text`].

use super::html::Text;
use crate::quality::{Estimate, Figures, Report, MEASURE_COMMAND};
use std::collections::HashMap;
use std::fmt::Write;

/// One bar of the plot.
#[derive(Debug, Clone, PartialEq)]
struct Bar {
    label: String,
    title: Option<String>,
    estimate: Estimate,
    floor: Option<f64>,
    ceiling: Option<f64>,
}

/// The plot's geometry (SVG user units; the stylesheet scales it to the page's width).
const WIDTH: f64 = 640.0;
const PLOT_LEFT: f64 = 96.0;
const PLOT_RIGHT: f64 = 540.0;
const TOP: f64 = 6.0;
const ROW: f64 = 26.0;

/// The section for the models page's models, each `(name, fingerprint if known)`, with
/// `reports` by fingerprint.
pub fn section(
    models: &[(&str, Option<&str>)],
    reports: &HashMap<String, Report>,
    has_dir: bool,
) -> String {
    let mut out = String::from("<h2>Quality</h2>");
    let mut without = Vec::new();
    let mut not_loaded = Vec::new();
    for &(name, fingerprint) in models {
        match fingerprint.map(|fp| reports.get(fp)) {
            Some(Some(report)) => out.push_str(&card(name, report)),
            Some(None) => without.push(name),
            None => not_loaded.push(name),
        }
    }
    if !has_dir {
        out.push_str(
            "<p class=\"muted\">No quality directory is known (set <code>--quality-dir</code> or \
<code>HUNCH_QUALITY_DIR</code>), so no report is shown.</p>",
        );
        return out;
    }
    if !without.is_empty() {
        let _ = write!(
            out,
            "<p class=\"muted\">No quality report for {}: <code>{}</code> measures a model and \
stores its report where this page finds it (docs/quality.md).</p>",
            Text(&without.join(", ")),
            Text(MEASURE_COMMAND)
        );
    }
    if !not_loaded.is_empty() {
        let _ = write!(
            out,
            "<p class=\"muted\">No fingerprint known, so no report can be matched (not loaded \
yet, or an upstream): {}.</p>",
            Text(&not_loaded.join(", "))
        );
    }
    out
}

/// One model's report.
fn card(name: &str, report: &Report) -> String {
    let f = &report.figures;
    let mut out = String::new();
    let _ = write!(
        out,
        "<section class=\"quality\" data-model=\"{}\"><h3>{}</h3><table class=\"kv\">",
        Text(name),
        Text(name)
    );
    if let Some(score) = &f.score {
        let _ = write!(
            out,
            "<tr><th>score (JevBench)</th><td>{}</td></tr>",
            estimate(score)
        );
    }
    let floor = f.floor.as_ref().and_then(|r| r.overall.value);
    let ceiling = f.ceiling.as_ref().and_then(|r| r.overall.value);
    if floor.is_some() || ceiling.is_some() {
        let _ = write!(
            out,
            "<tr><th>floor / ceiling</th><td>{} / {}</td></tr>",
            percent(floor),
            percent(ceiling)
        );
    }
    for (what, figure) in [("accuracy", &f.accuracy), ("ECE", &f.ece)] {
        if let Some(e) = figure {
            let _ = write!(out, "<tr><th>{what}</th><td>{}</td></tr>", estimate(e));
        }
    }
    let _ = write!(
        out,
        "<tr><th>measured</th><td>{}</td></tr><tr><th>command</th><td><code>{}</code></td></tr>",
        Text(&f.measured_at),
        Text(&f.command)
    );
    if let Some(commit) = &f.commit {
        let _ = write!(
            out,
            "<tr><th>commit</th><td><code>{}</code></td></tr>",
            Text(commit)
        );
    }
    if let Some(requests) = f.requests {
        let _ = write!(
            out,
            "<tr><th>requests</th><td>{requests} ({} failed)</td></tr>",
            f.errors.unwrap_or(0)
        );
    }
    out.push_str("</table>");
    out.push_str(&plot(&bars(f, &report.document)));
    out.push_str("</section>");
    out
}

/// The bars a report draws: the overall score, then each dimension in the report's order (with
/// the floor's and ceiling's own); a run without JevBench draws its accuracy and ECE instead.
fn bars(f: &Figures, document: &serde_json::Value) -> Vec<Bar> {
    let reference = |r: &Option<crate::quality::Reference>, dim: Option<&str>| {
        r.as_ref().and_then(|r| match dim {
            None => r.overall.value,
            Some(d) => r.dimensions.get(d).and_then(|e| e.value),
        })
    };
    let mut out = Vec::new();
    if let Some(score) = &f.score {
        out.push(Bar {
            label: "overall".into(),
            title: None,
            estimate: score.clone(),
            floor: reference(&f.floor, None),
            ceiling: reference(&f.ceiling, None),
        });
    }
    // The document keeps the script's order (REP, BAT, MEA, LOG, CHO); the map sorts by name.
    let order: Vec<&String> = match document["dimensions"].as_object() {
        Some(dims) => dims.keys().collect(),
        None => f.dimensions.keys().collect(),
    };
    for name in order {
        if let Some(e) = f.dimensions.get(name) {
            out.push(Bar {
                label: name.clone(),
                title: e.title.clone(),
                estimate: e.clone(),
                floor: reference(&f.floor, Some(name.as_str())),
                ceiling: reference(&f.ceiling, Some(name.as_str())),
            });
        }
    }
    if out.is_empty() {
        for (label, figure) in [("accuracy", &f.accuracy), ("ECE", &f.ece)] {
            if let Some(e) = figure {
                out.push(Bar {
                    label: label.into(),
                    title: None,
                    estimate: e.clone(),
                    floor: None,
                    ceiling: None,
                });
            }
        }
    }
    out
}

/// `value [low, high]` in percent, `–` for what is unknown.
fn estimate(e: &Estimate) -> String {
    let mut out = percent(e.value);
    if let (Some(low), Some(high)) = (finite(e.low), finite(e.high)) {
        let _ = write!(out, " [{:.1}, {:.1}]", 100.0 * low, 100.0 * high);
    }
    out
}

fn percent(v: Option<f64>) -> String {
    finite(v).map_or_else(|| "–".into(), |v| format!("{:.1}%", 100.0 * v))
}

fn finite(v: Option<f64>) -> Option<f64> {
    v.filter(|v| v.is_finite())
}

/// Where a share (0–1, clamped) falls on the plot's axis.
fn x(share: f64) -> f64 {
    let at = PLOT_LEFT + share.clamp(0.0, 1.0) * (PLOT_RIGHT - PLOT_LEFT);
    (at * 10.0).round() / 10.0
}

/// The bars as one SVG: a row per bar (label, bar, whisker, floor and ceiling marks, value),
/// the axis in percent, and a legend. Empty when there is nothing to draw.
fn plot(bars: &[Bar]) -> String {
    if bars.is_empty() {
        return String::new();
    }
    let rows_bottom = TOP + ROW * bars.len() as f64;
    let height = rows_bottom + 44.0;
    let mut out = String::new();
    let _ = write!(
        out,
        "<svg class=\"quality\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {WIDTH} {height}\" \
width=\"{WIDTH}\" height=\"{height}\" role=\"img\" aria-label=\"score per dimension with 95% \
intervals\">"
    );
    for tick in [0.0, 0.25, 0.5, 0.75, 1.0] {
        let at = x(tick);
        let _ = write!(
            out,
            "<line class=\"grid\" x1=\"{at}\" y1=\"{TOP}\" x2=\"{at}\" y2=\"{rows_bottom}\"/>\
<text x=\"{at}\" y=\"{}\" text-anchor=\"middle\">{:.0}%</text>",
            rows_bottom + 13.0,
            100.0 * tick
        );
    }
    for (i, bar) in bars.iter().enumerate() {
        row(&mut out, bar, TOP + ROW * i as f64);
    }
    legend(&mut out, bars, rows_bottom + 34.0);
    out.push_str("</svg>");
    out
}

fn row(out: &mut String, bar: &Bar, top: f64) {
    let mid = top + ROW / 2.0;
    let e = &bar.estimate;
    let mut tip = match &bar.title {
        Some(title) => format!("{} ({title}): {}", bar.label, estimate(e)),
        None => format!("{}: {}", bar.label, estimate(e)),
    };
    if bar.floor.is_some() || bar.ceiling.is_some() {
        let _ = write!(
            tip,
            "; floor {}, ceiling {}",
            percent(bar.floor),
            percent(bar.ceiling)
        );
    }
    let class = if bar.label == "overall" {
        "score overall"
    } else {
        "score"
    };
    let _ = write!(
        out,
        "<g><title>{}</title><text class=\"label\" x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>",
        Text(&tip),
        PLOT_LEFT - 8.0,
        mid + 4.0,
        Text(&bar.label)
    );
    if let Some(v) = finite(e.value) {
        let _ = write!(
            out,
            "<rect class=\"{class}\" x=\"{PLOT_LEFT}\" y=\"{}\" width=\"{:.1}\" height=\"12\"/>",
            mid - 6.0,
            x(v) - PLOT_LEFT
        );
    }
    if let (Some(low), Some(high)) = (finite(e.low), finite(e.high)) {
        let (l, h) = (x(low), x(high));
        let _ = write!(
            out,
            "<line class=\"whisker\" x1=\"{l}\" y1=\"{mid}\" x2=\"{h}\" y2=\"{mid}\"/>\
<line class=\"whisker\" x1=\"{l}\" y1=\"{}\" x2=\"{l}\" y2=\"{}\"/>\
<line class=\"whisker\" x1=\"{h}\" y1=\"{}\" x2=\"{h}\" y2=\"{}\"/>",
            mid - 5.0,
            mid + 5.0,
            mid - 5.0,
            mid + 5.0
        );
    }
    for (class, mark) in [("floor", bar.floor), ("ceiling", bar.ceiling)] {
        if let Some(m) = finite(mark) {
            let at = x(m);
            let _ = write!(
                out,
                "<line class=\"{class}\" x1=\"{at}\" y1=\"{}\" x2=\"{at}\" y2=\"{}\"/>",
                top + 2.0,
                top + ROW - 2.0
            );
        }
    }
    let _ = write!(
        out,
        "<text x=\"{}\" y=\"{}\">{}</text></g>",
        PLOT_RIGHT + 8.0,
        mid + 4.0,
        percent(e.value)
    );
}

/// What the marks mean, one swatch each (the floor and ceiling only when drawn).
fn legend(out: &mut String, bars: &[Bar], y: f64) {
    let mut items = vec![("score", "score"), ("whisker", "95% interval")];
    if bars.iter().any(|b| b.floor.is_some()) {
        items.push(("floor", "floor (fake:biased)"));
    }
    if bars.iter().any(|b| b.ceiling.is_some()) {
        items.push(("ceiling", "ceiling (fake:coherent)"));
    }
    let mut at = PLOT_LEFT;
    for (class, text) in items {
        let _ = match class {
            "score" => write!(
                out,
                "<rect class=\"score\" x=\"{at}\" y=\"{}\" width=\"12\" height=\"8\"/>",
                y - 4.0
            ),
            "whisker" => write!(
                out,
                "<line class=\"whisker\" x1=\"{at}\" y1=\"{y}\" x2=\"{}\" y2=\"{y}\"/>",
                at + 12.0
            ),
            _ => write!(
                out,
                "<line class=\"{class}\" x1=\"{m}\" y1=\"{}\" x2=\"{m}\" y2=\"{}\"/>",
                y - 6.0,
                y + 6.0,
                m = at + 6.0
            ),
        };
        let _ = write!(
            out,
            "<text x=\"{}\" y=\"{}\">{text}</text>",
            at + 16.0,
            y + 4.0
        );
        // About 6.5 units a character at the legend's 11px.
        at += 16.0 + 6.5 * text.len() as f64 + 14.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quality::report::parse;
    use serde_json::json;
    use std::path::Path;

    fn report(doc: serde_json::Value) -> Report {
        parse(doc.to_string().as_bytes(), Path::new("r.json")).expect("a report")
    }

    fn full() -> serde_json::Value {
        json!({"model": "m", "fingerprint": "fp", "measured_at": "2026-12-07T01:02:03Z",
               "command": "scripts/quality.sh --max-requests 40", "commit": "abc1234",
               "requests": 40, "errors": 0,
               "score": {"value": 0.612, "low": 0.55, "high": 0.669},
               "dimensions": {"REP": {"value": 0.4, "low": 0.3, "high": 0.5, "title": "Repeatability"},
                              "BAT": {"value": 1.0, "low": 1.0, "high": 1.0},
                              "MEA": {"value": null, "low": null, "high": null}},
               "floor": {"value": 0.576, "dimensions": {"REP": {"value": 0.587}}},
               "ceiling": {"value": 0.648, "dimensions": {"REP": {"value": 0.613}}},
               "accuracy": {"value": 0.358, "low": 0.307, "high": 0.407},
               "ece": {"value": 0.289, "low": 0.249, "high": 0.347}})
    }

    #[test]
    fn the_bars_follow_the_report_order_with_their_marks() {
        let r = report(full());
        let bars = bars(&r.figures, &r.document);
        let labels: Vec<&str> = bars.iter().map(|b| b.label.as_str()).collect();
        assert_eq!(labels, ["overall", "REP", "BAT", "MEA"]);
        assert_eq!((bars[0].floor, bars[0].ceiling), (Some(0.576), Some(0.648)));
        assert_eq!((bars[1].floor, bars[1].ceiling), (Some(0.587), Some(0.613)));
        assert_eq!(bars[2].floor, None);
    }

    #[test]
    fn the_plot_draws_bars_whiskers_and_marks_as_attributes_only() {
        let r = report(full());
        let svg = plot(&bars(&r.figures, &r.document));
        assert!(svg.starts_with("<svg class=\"quality\"") && svg.ends_with("</svg>"));
        // overall, REP and BAT have a value; MEA has none and draws no bar.
        assert_eq!(svg.matches("<rect class=\"score").count(), 3 + 1, "{svg}");
        // Three whiskers of three lines each, plus the legend's.
        assert_eq!(svg.matches("class=\"whisker\"").count(), 9 + 1);
        assert_eq!(svg.matches("class=\"floor\"").count(), 2 + 1);
        // 61.2% of the axis: 96 + 0.612 × 444.
        assert!(svg.contains("width=\"271.7\""), "{svg}");
        assert!(svg.contains("REP (Repeatability): 40.0% [30.0, 50.0]; floor 58.7%"));
        assert!(!svg.contains("style=") && !svg.contains("<script"));
    }

    #[test]
    fn a_run_without_jevbench_plots_its_accuracy_and_ece() {
        let mut doc = full();
        for field in ["score", "dimensions", "floor", "ceiling"] {
            doc.as_object_mut().unwrap().remove(field);
        }
        let r = report(doc);
        let labels: Vec<String> = bars(&r.figures, &r.document)
            .into_iter()
            .map(|b| b.label)
            .collect();
        assert_eq!(labels, ["accuracy", "ECE"]);
        assert!(!plot(&bars(&r.figures, &r.document)).contains("fake:biased"));
    }

    #[test]
    fn every_string_of_a_report_is_escaped() {
        let hostile = "<script>alert(1)</script>";
        let mut doc = full();
        doc["command"] = json!(hostile);
        doc["commit"] = json!(hostile);
        doc["measured_at"] = json!("2026-12-07T01:02:03Z");
        doc["dimensions"] =
            json!({hostile: {"value": 0.5, "title": "\"><img src=x onerror=alert(1)>"}});
        let page = card("m<b>", &report(doc));
        assert!(!page.contains("<script>") && !page.contains("<img") && !page.contains("<b>"));
        assert!(
            page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
            "{page}"
        );
    }

    #[test]
    fn the_card_says_the_score_accuracy_ece_time_and_command() {
        let page = card("m", &report(full()));
        for text in [
            "61.2% [55.0, 66.9]",
            "35.8% [30.7, 40.7]",
            "28.9% [24.9, 34.7]",
            "2026-12-07T01:02:03Z",
            "scripts/quality.sh --max-requests 40",
            "57.6% / 64.8%",
            "40 (0 failed)",
            "<svg",
        ] {
            assert!(page.contains(text), "{text}: {page}");
        }
    }

    #[test]
    fn models_without_a_report_say_how_to_make_one() {
        let reports = HashMap::from([("fp".to_string(), report(full()))]);
        let rows = [("a", Some("fp")), ("b", Some("other")), ("c", None)];
        let out = section(&rows, &reports, true);
        assert!(out.contains("data-model=\"a\"") && !out.contains("data-model=\"b\""));
        assert!(out.contains("No quality report for b") && out.contains("scripts/quality.sh"));
        assert!(out.contains("No fingerprint known") && out.contains(": c."));
        assert!(section(&rows, &HashMap::new(), false).contains("No quality directory"));
    }
}
