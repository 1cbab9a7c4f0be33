//! The HTML report of `hunch calibrate --report DIR`: one self-contained page (inline CSS and
//! SVG, nothing fetched) with a reliability diagram per question before and after, the metrics,
//! the cut-point table, the refused questions and the labels not used.

use super::file::{CalibrationFile, QuestionCalibration};
use hunch_core::calibration::{Metrics, ReliabilityBin};
use hunch_core::QuestionKind;
use std::fmt::Write;

/// The page.
pub fn html(file: &CalibrationFile) -> String {
    let mut out = String::new();
    out.push_str(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>Hunch calibration report</title>\
<style>body{font:14px/1.4 system-ui,sans-serif;margin:2em;max-width:70em}table{border-collapse:collapse}\
td,th{border:1px solid #ccc;padding:.25em .6em;text-align:right}th{background:#f4f4f4}\
td.l,th.l{text-align:left}.q{border-top:2px solid #888;margin-top:2em;padding-top:1em}\
.over{color:#b00}.under{color:#06c}svg{margin-right:1.5em}</style></head><body>",
    );
    let _ = write!(
        out,
        "<h1>Calibration report</h1><p>Every number is measured on held-out folds ({} folds): \
each answer is calibrated by a fit that never saw its label. ECE uses {} {}. \
Diagrams: one dot per bin at (mean top probability, share right), its area and label showing how \
many answers it holds; dots below the diagonal are over-confident, above it under-confident.</p>",
        file.folds,
        file.ece_bins,
        escape(&file.ece_binning)
    );
    if let Some(all) = &file.overall {
        let _ = write!(
            out,
            "<h2>All questions ({} labels)</h2>{}",
            all.labels,
            metrics_table(&all.before, &all.after)
        );
    }
    for q in &file.questions {
        question_section(&mut out, q);
    }
    if !file.refused.is_empty() {
        out.push_str("<h2>Not fitted</h2><table><tr><th class=l>question ids</th><th>labels</th><th>needed</th></tr>");
        for r in &file.refused {
            let _ = write!(
                out,
                "<tr><td class=l>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&r.ids.join(", ")),
                r.labels,
                r.needed
            );
        }
        out.push_str("</table>");
    }
    if !file.problems.is_empty() {
        let _ = write!(
            out,
            "<h2>Labels not used ({})</h2><table><tr><th>line</th><th class=l>decision or batch line</th><th class=l>question</th><th class=l>why</th></tr>",
            file.problems.len()
        );
        for p in &file.problems {
            let _ = write!(
                out,
                "<tr><td>{}</td><td class=l>{}</td><td class=l>{}</td><td class=l>{}</td></tr>",
                p.line,
                escape(p.record()),
                escape(p.question_id.as_deref().unwrap_or("")),
                escape(&p.reason)
            );
        }
        out.push_str("</table>");
    }
    out.push_str("</body></html>\n");
    out
}

pub fn question_section(out: &mut String, q: &QuestionCalibration) {
    let kind = match &q.question.kind {
        QuestionKind::Noul { .. } => "noul",
        QuestionKind::Choice { .. } => "choice",
        QuestionKind::Score { .. } => "score",
    };
    // T > 1 means the raw answers were too sharp.
    let verdict = if q.temperature > 1.05 {
        "<span class=over>over-confident</span>"
    } else if q.temperature < 0.95 {
        "<span class=under>under-confident</span>"
    } else {
        "about calibrated"
    };
    let _ = write!(
        out,
        "<div class=q><h2>{} <small>({kind}, {} labels)</small></h2><p>{}</p>\
<p>Temperature <b>{:.3}</b> ({verdict}); per fold: {}{}</p>",
        escape(&q.ids.join(", ")),
        q.labels,
        escape(&q.question.instructions),
        q.temperature,
        q.fold_temperatures
            .iter()
            .map(|t| format!("{t:.3}"))
            .collect::<Vec<_>>()
            .join(", "),
        match &q.offsets {
            Some(o) => format!(
                "; offsets {}",
                o.iter()
                    .map(|x| format!("{x:+.3}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
            None => String::new(),
        }
    );
    out.push_str(&diagram("before", &q.before.bins));
    out.push_str(&diagram("after", &q.after.bins));
    out.push_str(&metrics_table(&q.before, &q.after));
    if !q.cut_points.is_empty() {
        out.push_str("<h3>Cut-points on calibrated P(yes)</h3><table><tr><th>target precision</th><th>act when P(yes) ≥</th><th>held-out precision</th><th>coverage</th><th>cases at or above</th></tr>");
        for c in &q.cut_points {
            let _ = write!(
                out,
                "<tr><td>{:.2}</td><td>{}</td><td>{}</td><td>{:.1}%</td><td>{}</td></tr>",
                c.target_precision,
                c.threshold
                    .map_or("not reached".into(), |t| format!("{t:.4}")),
                c.precision.map_or("–".into(), |p| format!("{p:.3}")),
                100.0 * c.coverage,
                c.support
            );
        }
        out.push_str("</table>");
    }
    out.push_str("</div>");
}

pub fn metrics_table(before: &Metrics, after: &Metrics) -> String {
    format!(
        "<table><tr><th class=l></th><th>NLL</th><th>Brier</th><th>ECE</th><th>accuracy</th></tr>\
<tr><td class=l>before</td><td>{:.4}</td><td>{:.4}</td><td>{:.4}</td><td>{:.3}</td></tr>\
<tr><td class=l>after</td><td>{:.4}</td><td>{:.4}</td><td>{:.4}</td><td>{:.3}</td></tr></table>",
        before.nll,
        before.brier,
        before.ece,
        before.accuracy,
        after.nll,
        after.brier,
        after.ece,
        after.accuracy
    )
}

/// A 220-pixel reliability diagram: the diagonal, one dot per bin (area ∝ count) labelled with
/// its count.
fn diagram(title: &str, bins: &[ReliabilityBin]) -> String {
    const SIZE: f64 = 220.0;
    const PAD: f64 = 30.0;
    let max = bins.iter().map(|b| b.count).max().unwrap_or(1).max(1) as f64;
    let x = |v: f64| PAD + v.clamp(0.0, 1.0) * SIZE;
    let y = |v: f64| PAD + (1.0 - v.clamp(0.0, 1.0)) * SIZE;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{w}\" role=\"img\" aria-label=\"reliability diagram {title}\">\
<text x=\"{PAD}\" y=\"18\" font-weight=\"bold\">{title}</text>\
<rect x=\"{PAD}\" y=\"{PAD}\" width=\"{SIZE}\" height=\"{SIZE}\" fill=\"none\" stroke=\"#999\"/>\
<line x1=\"{x0}\" y1=\"{y0}\" x2=\"{x1}\" y2=\"{y1}\" stroke=\"#bbb\" stroke-dasharray=\"4\"/>\
<text x=\"{PAD}\" y=\"{yb}\" font-size=\"11\">confidence →</text>\
<text x=\"4\" y=\"{PAD}\" font-size=\"11\" transform=\"rotate(90 4 {PAD})\">share right →</text>",
        w = SIZE + 2.0 * PAD,
        x0 = x(0.0),
        y0 = y(0.0),
        x1 = x(1.0),
        y1 = y(1.0),
        yb = SIZE + 2.0 * PAD - 8.0,
    );
    for b in bins {
        let r = 3.0 + 9.0 * (b.count as f64 / max).sqrt();
        let colour = if b.accuracy < b.confidence {
            "#b00"
        } else {
            "#06c"
        };
        let _ = write!(
            svg,
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"{r:.1}\" fill=\"{colour}\" fill-opacity=\"0.5\"><title>{} answers: confidence {:.3}, right {:.3}</title></circle>\
<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"9\">{}</text>",
            x(b.confidence),
            y(b.accuracy),
            b.count,
            b.confidence,
            b.accuracy,
            x(b.confidence) + r + 1.0,
            y(b.accuracy) + 3.0,
            b.count
        );
    }
    svg.push_str("</svg>");
    svg
}

/// HTML-escapes text from questions, ids and reasons.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped_and_every_bin_is_drawn_with_its_count() {
        let bins = vec![
            ReliabilityBin {
                count: 7,
                confidence: 0.9,
                accuracy: 0.6,
            },
            ReliabilityBin {
                count: 3,
                confidence: 0.6,
                accuracy: 0.7,
            },
        ];
        let svg = diagram("before", &bins);
        assert_eq!(svg.matches("<circle").count(), 2);
        assert!(svg.contains(">7</text>") && svg.contains(">3</text>"));
        assert_eq!(escape("<a & \"b\">"), "&lt;a &amp; &quot;b&quot;&gt;");
    }
}
