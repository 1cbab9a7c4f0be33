//! `/console`: the server at a glance: ready or draining, each model's memory against the
//! budget, the policy bundle's revision and staleness, the API's request and error rates over
//! the last minutes, and the read queue.

use super::html::{bar, bytes, layout, seconds, Text};
use super::models::{self, ModelState};
use super::session::Viewer;
use super::{html_response, AppState};
use crate::metrics::recent::{rates, Bucket, BUCKET_SECONDS};
use axum::extract::State;
use axum::response::Response;
use axum::Extension;
use std::fmt::Write;
use std::sync::atomic::Ordering;
use std::time::Duration;

pub async fn page(State(state): State<AppState>, Extension(viewer): Extension<Viewer>) -> Response {
    let mut body = String::new();
    body.push_str("<div class=\"cards\">");
    status_card(&state, &mut body).await;
    queue_card(&state, &mut body);
    bundle_card(&state, &mut body);
    body.push_str("</div>");
    memory_section(&state, &mut body);
    rates_section(&state.metrics.recent_requests(), &mut body);
    let flash = state.console.sessions.take_flash(&viewer);
    html_response(layout(
        "Overview",
        "/console",
        &viewer,
        flash.as_deref(),
        &body,
    ))
}

async fn status_card(state: &AppState, out: &mut String) {
    let draining = state.draining.load(Ordering::SeqCst);
    let mut waiting = Vec::new();
    for entry in state.registry.models() {
        // As `/readyz` asks: a reader that cannot say quickly is not ready.
        let ready = tokio::time::timeout(Duration::from_secs(1), entry.reader.ready())
            .await
            .unwrap_or(false);
        if !ready {
            waiting.push(entry.name.clone());
        }
    }
    let (word, class, why) = if draining {
        (
            "draining",
            "bad",
            "shutting down: no new work is taken".to_string(),
        )
    } else if state.registry.models().is_empty() {
        ("not ready", "bad", "no model is configured".to_string())
    } else if !waiting.is_empty() {
        (
            "not ready",
            "warn",
            format!("waiting for {}", waiting.join(", ")),
        )
    } else {
        ("ready", "ok", "every model takes reads".to_string())
    };
    let policies = state
        .console
        .policies()
        .map_or(0, |p| p.registry.summaries().len());
    let kept = state.decisions.recent().map_or_else(
        || "off (--console-decisions 0)".to_string(),
        |r| format!("last {}", r.capacity()),
    );
    let _ = write!(
        out,
        "<section class=\"card\" id=\"status\"><h2>Server</h2><p class=\"big state {class}\">{word}</p>\
<p>{}</p><table class=\"kv\"><tr><th>models</th><td>{}</td></tr><tr><th>policies</th><td>{policies}</td></tr>\
<tr><th>calibration</th><td>{}</td></tr><tr><th>decisions kept</th><td>{}</td></tr>\
<tr><th>API keys</th><td>{}</td></tr></table></section>",
        Text(&why),
        state.registry.models().len(),
        state
            .calibration
            .current()
            .map_or("none".into(), |c| format!("<code>{}</code>", Text(&c.id[..c.id.len().min(12)]))),
        Text(&kept),
        if state.keys.enabled() { "on" } else { "off" },
    );
}

fn queue_card(state: &AppState, out: &mut String) {
    let (running, waiting) = state.metrics.read_queue();
    let slots = state.limits.max_concurrent_reads.max(1);
    let queue = state.limits.max_queued_reads.max(1);
    let _ = write!(
        out,
        "<section class=\"card\" id=\"queue\"><h2>Read queue</h2>\
<p>running <b>{running}</b> of {slots}</p>{}<p>waiting <b>{waiting}</b> of {queue}</p>{}</section>",
        bar(running.max(0) as f64 / slots as f64, "use"),
        bar(waiting.max(0) as f64 / queue as f64, "use"),
    );
}

fn bundle_card(state: &AppState, out: &mut String) {
    out.push_str("<section class=\"card\" id=\"bundle\"><h2>Policy bundle</h2>");
    match state.console.policies().and_then(|p| p.bundle.as_ref()) {
        None => out.push_str(
            "<p>Not following a bundle: policies come from <code>--policies</code> or HTTP deployments.</p>",
        ),
        Some(bundle) => {
            let r = bundle.report();
            let _ = write!(
                out,
                "<p class=\"big state {}\">{}</p><table class=\"kv\"><tr><th>revision</th><td><code>{}</code></td></tr>\
<tr><th>activated</th><td>{}</td></tr><tr><th>last check</th><td>{}</td></tr>\
<tr><th>since a good check</th><td>{}</td></tr><tr><th>last error</th><td>{}</td></tr></table>",
                if r.stale { "bad" } else { "ok" },
                if r.stale { "stale" } else { "current" },
                Text(r.revision.as_deref().unwrap_or("none yet")),
                Text(r.activated_at.as_deref().unwrap_or("–")),
                Text(r.last_success_at.as_deref().unwrap_or("–")),
                seconds(r.stale_seconds),
                r.last_error.as_ref().map_or("–".into(), |e| format!(
                    "{} <small>{}</small>",
                    Text(&e.message),
                    Text(&e.at)
                )),
            );
        }
    }
    out.push_str("</section>");
}

fn memory_section(state: &AppState, out: &mut String) {
    let rows = models::rows(state);
    let budget = models::budget(state);
    out.push_str("<section id=\"memory\"><h2>Models and memory</h2>");
    match &budget {
        Some(b) => {
            let _ = write!(
                out,
                "<p>Budget <b>{}</b> <small>({})</small>. Each bar is the model's measured resident \
memory against it; a model's size estimate is shown once models load on demand.</p>",
                bytes(b.bytes),
                Text(b.source)
            );
        }
        None => out.push_str("<p>No memory budget is known on this machine.</p>"),
    }
    out.push_str("<table class=\"grid models\"><tbody>");
    for r in &rows {
        let (share, text) = match (&r.state, r.resident_bytes, &budget) {
            (ModelState::Loading { progress }, _, _) => {
                (*progress, format!("loading {:.0}%", 100.0 * progress))
            }
            (_, Some(resident), Some(b)) => (
                resident as f64 / b.bytes.max(1) as f64,
                format!("{} of {}", bytes(resident), bytes(b.bytes)),
            ),
            (_, Some(resident), None) => (0.0, bytes(resident)),
            (ModelState::Remote, _, _) => (0.0, "remote: its memory is not here".into()),
            _ => (0.0, "–".into()),
        };
        let class = match r.state {
            ModelState::Loading { .. } => "loading",
            ModelState::Failed { .. } => "bad",
            _ => "mem",
        };
        let _ = write!(
            out,
            "<tr data-model=\"{name}\"><td class=\"label\"><b>{name}</b></td><td><span class=\"state {sc}\">{state}</span></td>\
<td class=\"barcell\">{bar}</td><td class=\"num\">{text}</td></tr>",
            name = Text(&r.name),
            sc = if r.state == ModelState::Loaded { "ok" } else { "" },
            state = Text(&r.state.label()),
            bar = bar(share, class),
            text = Text(&text),
        );
    }
    out.push_str("</tbody></table></section>");
}

fn rates_section(series: &[Bucket], out: &mut String) {
    let (rps1, refused1, failed1) = rates(series, (60 / BUCKET_SECONDS) as usize);
    let (rps10, refused10, failed10) = rates(series, series.len());
    let _ = write!(
        out,
        "<section id=\"rates\"><h2>API requests</h2><table class=\"kv\"><tr><th></th><th>last minute</th><th>last 10 minutes</th></tr>\
<tr><th>requests/s</th><td>{rps1:.2}</td><td>{rps10:.2}</td></tr>\
<tr><th>refused (4xx)/s</th><td>{refused1:.2}</td><td>{refused10:.2}</td></tr>\
<tr><th>failed (5xx)/s</th><td>{failed1:.2}</td><td>{failed10:.2}</td></tr></table>{}\
<p class=\"muted\">Requests to <code>/v1/…</code> per {BUCKET_SECONDS} s over the last ten minutes; \
failures in red. The console's own pages are not counted.</p></section>",
        sparkline(series)
    );
}

/// Columns of requests per bucket, failures stacked in red: an SVG with attributes only.
fn sparkline(series: &[Bucket]) -> String {
    let max = series.iter().map(|b| b.requests).max().unwrap_or(0).max(1) as f64;
    let width = series.len().max(1) * 5;
    let mut svg = format!(
        "<svg class=\"spark\" viewBox=\"0 0 {width} 40\" preserveAspectRatio=\"none\" role=\"img\" aria-label=\"requests per {BUCKET_SECONDS} seconds\">"
    );
    for (i, b) in series.iter().enumerate() {
        let h = 40.0 * b.requests as f64 / max;
        let f = 40.0 * (b.failed + b.refused) as f64 / max;
        let x = i * 5;
        if b.requests > 0 {
            let _ = write!(
                svg,
                "<rect class=\"req\" x=\"{x}\" y=\"{:.1}\" width=\"4\" height=\"{h:.1}\"><title>{} requests</title></rect>",
                40.0 - h,
                b.requests
            );
        }
        if f > 0.0 {
            let _ = write!(
                svg,
                "<rect class=\"err\" x=\"{x}\" y=\"{:.1}\" width=\"4\" height=\"{f:.1}\"/>",
                40.0 - f
            );
        }
    }
    svg.push_str("</svg>");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sparkline_draws_one_column_per_busy_bucket() {
        let series = vec![
            Bucket {
                slot: 1,
                requests: 0,
                refused: 0,
                failed: 0,
            },
            Bucket {
                slot: 2,
                requests: 4,
                refused: 1,
                failed: 1,
            },
        ];
        let svg = sparkline(&series);
        assert_eq!(svg.matches("class=\"req\"").count(), 1);
        assert_eq!(svg.matches("class=\"err\"").count(), 1);
        assert!(svg.contains("height=\"40.0\""));
    }
}
