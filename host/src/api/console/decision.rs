//! `/console/decisions/ID`: one kept decision: who decided (policy version or the raw API), its
//! input, each read with each question's probabilities as bars (raw, and calibrated beside them
//! when a calibration applied), its result or failure, timings; and, when its policy has a
//! candidate, "replay against the candidate" (`policy::replay`, answered from the recorded reads,
//! no model read).

use super::html::{csrf_field, json_block, layout, probability_row, Text};
use super::session::Viewer;
use super::{check_csrf, html_response, refusal, AppState};
use crate::decision::event::{DecisionEvent, ReadEvent};
use crate::policy::replay::{replay as replay_events, ReplayReport};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::{Extension, Form};
use hunch_core::{Question, QuestionKind};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt::Write;

/// The labels of a question's distribution, in its order.
pub fn labels(q: &Question) -> Vec<String> {
    match &q.kind {
        QuestionKind::Noul { .. } => vec!["yes".into(), "no".into()],
        QuestionKind::Choice { options } => options.iter().map(|o| o.name.clone()).collect(),
        QuestionKind::Score { levels } => levels
            .iter()
            .enumerate()
            .map(|(i, l)| format!("{i}: {l}"))
            .collect(),
    }
}

fn kind_name(q: &Question) -> &'static str {
    match q.kind {
        QuestionKind::Noul { .. } => "noul",
        QuestionKind::Choice { .. } => "choice",
        QuestionKind::Score { .. } => "score",
    }
}

/// One read: its state, then per question the raw bars (and calibrated ones when applied).
fn read_html(i: usize, r: &ReadEvent, out: &mut String) {
    let _ = write!(
        out,
        "<section class=\"read\"><h3>Read {} <small>{:.1} ms · {} draws · {} prompt tokens</small></h3>",
        i + 1,
        r.elapsed_ms,
        r.stats.draws,
        r.stats.prompt_tokens
    );
    match &r.state {
        Some(state) => {
            let _ = write!(
                out,
                "<p class=\"label\">state</p><pre class=\"state\">{}</pre>",
                Text(state)
            );
        }
        None => out.push_str(
            "<p class=\"muted\">The state text is left out of the record (omit_state).</p>",
        ),
    }
    if let Some(e) = &r.error {
        let _ = write!(
            out,
            "<p class=\"error\">The read failed: {}</p>",
            Text(&e.to_string())
        );
    }
    for (qi, q) in r.questions.iter().enumerate() {
        let id = r
            .question_ids
            .get(qi)
            .map_or(format!("question {}", qi + 1), |id| id.0.clone());
        let _ = write!(
            out,
            "<div class=\"question\"><h4>{} <small>{}</small></h4><p>{}</p>",
            Text(&id),
            kind_name(q),
            Text(&q.instructions)
        );
        let raw = r.distributions.as_ref().and_then(|d| d.get(qi));
        let calibrated = r
            .calibrated
            .as_ref()
            .and_then(|c| c.get(qi))
            .and_then(|c| c.as_ref());
        match raw {
            None => out.push_str("<p class=\"muted\">no distribution</p>"),
            Some(raw) => {
                out.push_str("<table class=\"probs\">");
                if calibrated.is_some() {
                    out.push_str("<tr><th></th><th>raw</th><th></th></tr>");
                }
                for (label, p) in labels(q).iter().zip(raw.probabilities()) {
                    out.push_str(&probability_row(label, *p, "raw"));
                }
                out.push_str("</table>");
                if let Some(cal) = calibrated {
                    out.push_str(
                        "<table class=\"probs\"><tr><th></th><th>calibrated</th><th></th></tr>",
                    );
                    for (label, p) in labels(q).iter().zip(cal.probabilities()) {
                        out.push_str(&probability_row(label, *p, "cal"));
                    }
                    out.push_str("</table>");
                }
            }
        }
        out.push_str("</div>");
    }
    out.push_str("</section>");
}

/// The page of one decision, with `replayed` (the replay's outcome) when one was just asked.
fn decision_html(
    state: &AppState,
    viewer: &Viewer,
    e: &DecisionEvent,
    replayed: Option<&str>,
) -> String {
    let mut body = String::new();
    let who = match &e.policy {
        Some(p) => format!(
            "policy <b>{}</b> ({}) version <code>{}</code>{}",
            Text(&p.name),
            Text(&p.stage),
            Text(&p.version),
            p.declared_version
                .as_ref()
                .map_or(String::new(), |v| format!(
                    " <small>declared {}</small>",
                    Text(v)
                ))
        ),
        None => format!("<code>{}</code>", Text(&e.route)),
    };
    let _ =
        write!(
        body,
        "<table class=\"kv\"><tr><th>decision</th><td><code id=\"decision-id\">{}</code></td></tr>\
<tr><th>time</th><td>{}</td></tr><tr><th>decided by</th><td>{who}</td></tr>\
<tr><th>model</th><td>{}</td></tr><tr><th>status</th><td>{}</td></tr>\
<tr><th>timings</th><td>{:.1} ms in all, {:.1} ms reading</td></tr>\
<tr><th>tokens</th><td>{} in, {} out</td></tr>{}{}{}</table>",
        Text(&e.decision_id),
        Text(&e.timestamp),
        e.model.as_ref().map_or("–".into(), |m| format!(
            "{} <small><code>{}</code></small>",
            Text(&m.name),
            Text(m.fingerprint.as_deref().unwrap_or("fingerprint unknown"))
        )),
        e.status,
        e.timings.total_ms,
        e.timings.read_ms,
        e.usage.input_tokens,
        e.usage.output_tokens,
        e.shadow_of.as_ref().map_or(String::new(), |a| format!(
            "<tr><th>shadow of</th><td><a href=\"/console/decisions/{id}\">{id}</a></td></tr>",
            id = Text(a)
        )),
        e.calibration.as_ref().map_or(String::new(), |c| format!(
            "<tr><th>calibration</th><td><code>{}</code></td></tr>",
            Text(c)
        )),
        if e.masked.is_empty() && e.erased.is_empty() {
            String::new()
        } else {
            format!(
                "<tr><th>masked / erased</th><td>{}</td></tr>",
                Text(&e.masked.iter().chain(&e.erased).cloned().collect::<Vec<_>>().join(", "))
            )
        },
    );
    if let Some(text) = replayed {
        let _ = write!(body, "<section id=\"replay-result\" class=\"flash\"><h2>Replay against the candidate</h2><p>{}</p></section>", Text(text));
    }
    if let Some(name) = e.policy.as_ref().map(|p| &p.name) {
        let candidate = state
            .console
            .policies()
            .and_then(|p| p.registry.candidate(name));
        if let Some(c) = candidate {
            if e.policy.as_ref().is_some_and(|p| p.stage == "active") {
                let _ = write!(
                    body,
                    "<form method=\"post\" action=\"/console/decisions/{}/replay\" id=\"replay\">{}\
<button type=\"submit\">Replay against the candidate <code>{}</code></button> \
<small>answered from this decision's recorded reads; nothing is written</small></form>",
                    Text(&e.decision_id),
                    csrf_field(viewer),
                    Text(&c.version)
                );
            }
        }
    }
    body.push_str("<h2>Input</h2>");
    body.push_str(&json_block(&e.input));
    let _ = write!(body, "<h2>Reads ({})</h2>", e.reads.len());
    if e.reads.is_empty() {
        body.push_str("<p class=\"muted\">No model read.</p>");
    }
    for (i, r) in e.reads.iter().enumerate() {
        read_html(i, r, &mut body);
    }
    body.push_str("<h2>Result</h2>");
    match (&e.result, &e.error) {
        (_, Some(err)) => {
            let _ = write!(
                body,
                "<p class=\"error\"><b>{}</b>: {}</p>",
                Text(err.kind.as_str()),
                Text(&err.message)
            );
        }
        (Some(result), None) => body.push_str(&json_block(result)),
        (None, None) => body.push_str("<p class=\"muted\">No result recorded.</p>"),
    }
    if !e.limits_hit.is_empty() {
        let _ = write!(
            body,
            "<p>Limits hit: {}</p>",
            Text(&serde_json::to_string(&e.limits_hit).unwrap_or_default())
        );
    }
    body
}

fn not_kept(id: &str) -> Response {
    refusal(
        StatusCode::NOT_FOUND,
        &format!("Decision {id} is not among the decisions this server keeps (it may have been pushed out by newer ones)."),
    )
}

pub async fn page(
    State(state): State<AppState>,
    Extension(viewer): Extension<Viewer>,
    Path(id): Path<String>,
) -> Response {
    let Some(kept) = state.decisions.recent().and_then(|r| r.find(&id)) else {
        return not_kept(&id);
    };
    let body = decision_html(&state, &viewer, &kept.event, None);
    let flash = state.console.sessions.take_flash(&viewer);
    html_response(layout(
        "Decision",
        "/console/decisions",
        &viewer,
        flash.as_deref(),
        &body,
    ))
}

#[derive(Debug, Deserialize)]
pub struct CsrfForm {
    pub csrf: Option<String>,
}

/// What a replay found, in words.
pub fn verdict(report: &ReplayReport) -> String {
    if report.unchanged == 1 {
        return "The candidate decides exactly as the active version did.".into();
    }
    if report.changed == 1 {
        let fields: Vec<&str> = report.fields.keys().map(String::as_str).collect();
        let moves: Vec<String> = report
            .largest_moves
            .iter()
            .map(|m| format!("{} {:.4} → {:.4}", m.field, m.from, m.to))
            .collect();
        return format!(
            "The candidate decides differently: {}{}.",
            fields.join(", "),
            if moves.is_empty() {
                String::new()
            } else {
                format!(" ({})", moves.join("; "))
            }
        );
    }
    match report.samples.not_replayable.first() {
        Some(n) => format!("Not replayable: {}.", n.reason),
        None => "Not replayable: this decision is not a policy decision.".into(),
    }
}

pub async fn replay(
    State(state): State<AppState>,
    Extension(viewer): Extension<Viewer>,
    Path(id): Path<String>,
    Form(form): Form<CsrfForm>,
) -> Response {
    if let Err(refused) = check_csrf(&viewer, form.csrf.as_deref()) {
        return refused;
    }
    let Some(kept) = state.decisions.recent().and_then(|r| r.find(&id)) else {
        return not_kept(&id);
    };
    let e = &kept.event;
    let candidate = e.policy.as_ref().and_then(|p| {
        state
            .console
            .policies()
            .and_then(|s| s.registry.candidate(&p.name))
            .map(|c| (p.name.clone(), c))
    });
    let text = match candidate {
        None => "This decision's policy has no candidate to replay against.".to_string(),
        Some((name, c)) => {
            let components = BTreeMap::from([(name, c)]);
            let report = replay_events(std::slice::from_ref(&**e), &components, None, 5).await;
            verdict(&report)
        }
    };
    let body = decision_html(&state, &viewer, e, Some(&text));
    html_response(layout(
        "Decision",
        "/console/decisions",
        &viewer,
        None,
        &body,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hunch_core::{ChoiceOption, LabelDistribution};

    #[test]
    fn a_read_shows_every_label_with_raw_and_calibrated_bars_escaped() {
        let q = Question {
            instructions: "<script>alert(1)</script>".into(),
            kind: QuestionKind::Choice {
                options: vec![
                    ChoiceOption {
                        name: "\"><img src=x onerror=alert(1)>".into(),
                        description: None,
                    },
                    ChoiceOption {
                        name: "b".into(),
                        description: None,
                    },
                ],
            },
        };
        let r = ReadEvent {
            state: Some("<script>alert(1)</script>".into()),
            state_sha256: String::new(),
            questions: vec![q],
            question_ids: vec![],
            options: Default::default(),
            distributions: Some(vec![LabelDistribution(vec![0.75, 0.25])]),
            calibrated: Some(vec![Some(LabelDistribution(vec![0.6, 0.4]))]),
            usage: Default::default(),
            stats: Default::default(),
            elapsed_ms: 1.0,
            error: None,
        };
        let mut out = String::new();
        read_html(0, &r, &mut out);
        assert!(!out.contains("<script>") && !out.contains("<img"));
        assert!(out.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert_eq!(out.matches("class=\"bar raw\"").count(), 2);
        assert_eq!(out.matches("class=\"bar cal\"").count(), 2);
        assert!(out.contains("75.0%") && out.contains("40.0%"));
    }
}
