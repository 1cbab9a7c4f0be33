//! `/console/decisions`: the live tail of the decisions the server keeps in memory
//! (`decision::ring`), newest first, filterable by policy, model and outcome. The page is whole
//! without script; `console.js` asks `/console/decisions/tail?after=SEQ` every second for newer
//! rows and adds them as text (never as HTML).

use super::html::{layout, Text};
use super::session::Viewer;
use super::{html_response, AppState};
use crate::decision::event::DecisionEvent;
use crate::decision::ring::Kept;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use std::fmt::Write;

/// Rows a page or a poll shows at most.
const MAX_ROWS: usize = 200;
/// Characters of the input shown in a row.
const SUMMARY_CHARS: usize = 100;

/// The tail's filters, as query parameters. Empty = any.
#[derive(Debug, Default, Clone, Deserialize)]
pub struct Filter {
    #[serde(default)]
    pub policy: String,
    #[serde(default)]
    pub model: String,
    /// `ok`, `error`, or empty.
    #[serde(default)]
    pub outcome: String,
    /// Only rows after this sequence number (the tail's polls).
    #[serde(default)]
    pub after: u64,
}

impl Filter {
    pub fn matches(&self, e: &DecisionEvent) -> bool {
        let policy = e.policy.as_ref().map_or("", |p| p.name.as_str());
        let model = e.model.as_ref().map_or("", |m| m.name.as_str());
        (self.policy.is_empty() || self.policy == policy)
            && (self.model.is_empty() || self.model == model)
            && match self.outcome.as_str() {
                "ok" => e.error.is_none(),
                "error" => e.error.is_some(),
                _ => true,
            }
    }
}

/// One decision as a row of the tail: what the page prints and the poll sends.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Row {
    pub seq: u64,
    pub id: String,
    pub time: String,
    pub route: String,
    /// `name` (`name · candidate` for a candidate's decision), empty for `/v1/systemone`.
    pub policy: String,
    /// The active decision a shadow run ran beside.
    pub shadow_of: Option<String>,
    pub model: String,
    pub status: u16,
    /// `ok`, or the failure's kind.
    pub outcome: String,
    pub ms: f64,
    /// The start of the input (a System One request's state, else the input as JSON).
    pub summary: String,
}

pub fn row(kept: &Kept) -> Row {
    let e = &kept.event;
    let summary = match e.input.get("state").and_then(|s| s.as_str()) {
        Some(state) if e.policy.is_none() => state.to_string(),
        _ => e.input.to_string(),
    };
    Row {
        seq: kept.seq,
        id: e.decision_id.clone(),
        time: e.timestamp.clone(),
        route: e.route.clone(),
        policy: e.policy.as_ref().map_or(String::new(), |p| {
            if p.stage == "active" {
                p.name.clone()
            } else {
                format!("{} · {}", p.name, p.stage)
            }
        }),
        shadow_of: e.shadow_of.clone(),
        model: e.model.as_ref().map_or(String::new(), |m| m.name.clone()),
        status: e.status,
        outcome: e
            .error
            .as_ref()
            .map_or("ok".into(), |err| err.kind.to_string()),
        ms: (e.timings.total_ms * 10.0).round() / 10.0,
        summary: truncate(&summary, SUMMARY_CHARS),
    }
}

fn truncate(text: &str, chars: usize) -> String {
    let mut out: String = text.chars().take(chars).collect();
    if text.chars().nth(chars).is_some() {
        out.push('…');
    }
    out
}

/// The kept decisions that pass `filter`, newest first, at most [`MAX_ROWS`].
pub fn rows(state: &AppState, filter: &Filter) -> Vec<Row> {
    let Some(ring) = state.decisions.recent() else {
        return Vec::new();
    };
    ring.after(filter.after)
        .iter()
        .rev()
        .filter(|k| filter.matches(&k.event))
        .take(MAX_ROWS)
        .map(row)
        .collect()
}

/// A row as HTML (the same cells `console.js` builds for a polled row).
fn row_html(r: &Row, out: &mut String) {
    let _ = write!(
        out,
        "<tr data-seq=\"{}\"><td><a href=\"/console/decisions/{id}\">{short}</a></td><td>{}</td>\
<td>{}</td><td>{}</td><td class=\"outcome {oc}\">{} {}</td><td class=\"num\">{:.1}</td><td class=\"summary\">{}</td></tr>",
        r.seq,
        Text(&r.time),
        Text(if r.policy.is_empty() { &r.route } else { &r.policy }),
        Text(&r.model),
        r.status,
        Text(&r.outcome),
        r.ms,
        Text(&r.summary),
        id = Text(&r.id),
        short = Text(&r.id[..r.id.len().min(12)]),
        oc = if r.outcome == "ok" { "ok" } else { "bad" },
    );
}

pub async fn page(
    State(state): State<AppState>,
    Extension(viewer): Extension<Viewer>,
    filter: Result<Query<Filter>, QueryRejection>,
) -> Response {
    // A filter that cannot be read shows everything rather than an error page.
    let filter = filter.map(|Query(f)| f).unwrap_or_default();
    let filter = Filter { after: 0, ..filter };
    let mut body = String::new();
    let Some(ring) = state.decisions.recent() else {
        body.push_str(
            "<p>The server keeps no recent decisions (<code>--console-decisions 0</code>).</p>",
        );
        return html_response(layout(
            "Decisions",
            "/console/decisions",
            &viewer,
            None,
            &body,
        ));
    };
    let rows = rows(&state, &filter);
    let _ = write!(
        body,
        "<form method=\"get\" action=\"/console/decisions\" class=\"filters\" id=\"filters\">\
<label>policy <input name=\"policy\" value=\"{}\" placeholder=\"any\"></label>\
<label>model <input name=\"model\" value=\"{}\" placeholder=\"any\"></label>\
<label>outcome <select name=\"outcome\">{}</select></label><button type=\"submit\">Filter</button></form>\
<p class=\"muted\">The last {} decisions this server made, masked as the decision log masks them; \
new ones appear at the top (<span id=\"tail-state\">live</span>). {} dropped while the list was busy.</p>",
        Text(&filter.policy),
        Text(&filter.model),
        ["", "ok", "error"]
            .iter()
            .map(|o| format!(
                "<option value=\"{o}\"{}>{}</option>",
                if filter.outcome == *o { " selected" } else { "" },
                if o.is_empty() { "any" } else { o }
            ))
            .collect::<String>(),
        ring.capacity(),
        ring.dropped(),
    );
    let last = ring.after(0).last().map_or(0, |k| k.seq);
    let _ = write!(
        body,
        "<div class=\"scroll\"><table class=\"grid\" id=\"tail\" data-last=\"{last}\"><thead><tr><th>decision</th>\
<th>time</th><th>policy / route</th><th>model</th><th>outcome</th><th>ms</th><th>input</th></tr></thead><tbody>"
    );
    for r in &rows {
        row_html(r, &mut body);
    }
    body.push_str("</tbody></table></div>");
    if rows.is_empty() {
        body.push_str("<p id=\"tail-empty\">No decision yet: ask one on the <a href=\"/console/ask\">Ask</a> page.</p>");
    }
    let flash = state.console.sessions.take_flash(&viewer);
    html_response(layout(
        "Decisions",
        "/console/decisions",
        &viewer,
        flash.as_deref(),
        &body,
    ))
}

/// What a poll gets: the new rows (newest first) and the sequence number to ask after next.
#[derive(Debug, Serialize)]
struct Tail {
    rows: Vec<Row>,
    last: u64,
}

pub async fn tail(
    State(state): State<AppState>,
    filter: Result<Query<Filter>, QueryRejection>,
) -> Response {
    let filter = match filter {
        Ok(Query(f)) => f,
        Err(e) => {
            return (
                axum::http::StatusCode::BAD_REQUEST,
                Json(serde_json::json!({"error": e.body_text()})),
            )
                .into_response()
        }
    };
    let last = state
        .decisions
        .recent()
        .and_then(|r| r.after(filter.after).last().map(|k| k.seq))
        .unwrap_or(filter.after);
    Json(Tail {
        rows: rows(&state, &filter),
        last,
    })
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::event::{ErrorRecord, PolicyRef};
    use crate::decision::DecisionLog;
    use std::sync::Arc;

    fn kept(seq: u64, policy: Option<&str>, failed: bool) -> Kept {
        let log = DecisionLog::disabled();
        let mut e = log.begin("/v1/systemone", None, None).event(200);
        e.input = serde_json::json!({"state": "<b>".repeat(50)});
        e.policy = policy.map(|name| PolicyRef {
            name: name.into(),
            version: "v".into(),
            sha256: "s".into(),
            declared_version: None,
            stage: "candidate".into(),
        });
        if failed {
            e.error = Some(ErrorRecord {
                kind: crate::decision::event::FailureKind::Timeout,
                message: "slow".into(),
            });
        }
        Kept {
            seq,
            event: Arc::new(e),
        }
    }

    #[test]
    fn rows_summarise_and_filters_match() {
        let k = kept(3, None, false);
        let r = row(&k);
        assert_eq!(r.outcome, "ok");
        assert_eq!(r.summary.chars().count(), SUMMARY_CHARS + 1);
        let mut html = String::new();
        row_html(&r, &mut html);
        assert!(!html.contains("<b>") && html.contains("&lt;b&gt;"));
        let p = kept(4, Some("triage"), true);
        assert_eq!(row(&p).policy, "triage · candidate");
        assert_ne!(row(&p).outcome, "ok");
        let only = |policy: &str, outcome: &str| Filter {
            policy: policy.into(),
            outcome: outcome.into(),
            ..Filter::default()
        };
        assert!(only("triage", "error").matches(&p.event));
        assert!(!only("triage", "ok").matches(&p.event));
        assert!(!only("triage", "").matches(&k.event));
        assert!(only("", "ok").matches(&k.event));
    }
}
