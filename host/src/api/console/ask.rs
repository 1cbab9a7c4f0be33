//! `/console/ask`: a form for one System One request — a model, a state, up to three questions
//! of any type — answered as bars. The form becomes the JSON body `POST /v1/systemone` takes and
//! goes through that route's own handler, so it is validated, read, calibrated and recorded like
//! any decision (its id links to the decision's page).

use super::html::{csrf_field, layout, probability_row, Text};
use super::session::Viewer;
use super::{check_csrf, html_response, AppState};
use crate::api::middleware::RequestId;
use crate::api::systemone;
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::Response;
use axum::{Extension, Form};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::fmt::Write;

/// Questions the form has room for.
const QUESTIONS: usize = 3;
/// The largest answer body the page reads back.
const MAX_ANSWER_BYTES: usize = 4 << 20;

/// The form as posted (and as first shown, prefilled with an example).
#[derive(Debug, Clone, Deserialize)]
pub struct AskForm {
    pub csrf: Option<String>,
    #[serde(default)]
    pub model: String,
    #[serde(default)]
    pub state: String,
    #[serde(default)]
    pub q1_id: String,
    #[serde(default)]
    pub q1_type: String,
    #[serde(default)]
    pub q1_text: String,
    #[serde(default)]
    pub q1_labels: String,
    #[serde(default)]
    pub q2_id: String,
    #[serde(default)]
    pub q2_type: String,
    #[serde(default)]
    pub q2_text: String,
    #[serde(default)]
    pub q2_labels: String,
    #[serde(default)]
    pub q3_id: String,
    #[serde(default)]
    pub q3_type: String,
    #[serde(default)]
    pub q3_text: String,
    #[serde(default)]
    pub q3_labels: String,
}

/// One question row of the form.
struct Row<'a> {
    id: &'a str,
    kind: &'a str,
    text: &'a str,
    labels: &'a str,
}

impl AskForm {
    fn example(model: &str) -> AskForm {
        AskForm {
            csrf: None,
            model: model.into(),
            state: "I was charged twice for my subscription this month. Please refund one.".into(),
            q1_id: "billing".into(),
            q1_type: "noul".into(),
            q1_text: "Is this message about billing?".into(),
            q1_labels: String::new(),
            q2_id: "team".into(),
            q2_type: "choice".into(),
            q2_text: "Which team should handle it?".into(),
            q2_labels: "billing: Payments and refunds\ntechnical\nsales".into(),
            q3_id: "urgency".into(),
            q3_type: "score".into(),
            q3_text: "How urgent is it?".into(),
            q3_labels: "Can wait\nThis week\nToday".into(),
        }
    }

    fn rows(&self) -> [Row<'_>; QUESTIONS] {
        [
            Row {
                id: &self.q1_id,
                kind: &self.q1_type,
                text: &self.q1_text,
                labels: &self.q1_labels,
            },
            Row {
                id: &self.q2_id,
                kind: &self.q2_type,
                text: &self.q2_text,
                labels: &self.q2_labels,
            },
            Row {
                id: &self.q3_id,
                kind: &self.q3_type,
                text: &self.q3_text,
                labels: &self.q3_labels,
            },
        ]
    }

    /// The `/v1/systemone` body. Rows without an id are left out; the route's own validation
    /// judges the rest (a bad question is its 422, shown on the page).
    pub fn request(&self) -> Value {
        let mut questions = Map::new();
        for row in self.rows() {
            let id = row.id.trim();
            if id.is_empty() {
                continue;
            }
            let lines: Vec<&str> = row
                .labels
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect();
            let mut q = json!({"type": row.kind, "instructions": row.text});
            match row.kind {
                "choice" => {
                    let criteria: Map<String, Value> = lines
                        .iter()
                        .map(|l| match l.split_once(':') {
                            Some((name, what)) => (name.trim().to_string(), json!(what.trim())),
                            None => (l.to_string(), Value::Null),
                        })
                        .collect();
                    q["criteria"] = Value::Object(criteria);
                }
                "score" => q["criteria"] = json!(lines),
                _ => {}
            }
            questions.insert(id.to_string(), q);
        }
        json!({"model": self.model, "state": self.state, "questions": questions})
    }
}

fn form_html(state: &AppState, viewer: &Viewer, form: &AskForm, out: &mut String) {
    let mut names: Vec<String> = state
        .registry
        .aliases()
        .into_iter()
        .map(|(a, _)| a)
        .collect();
    names.extend(state.registry.models().iter().map(|m| m.name.clone()));
    let options: String = names
        .iter()
        .map(|n| {
            format!(
                "<option value=\"{v}\"{s}>{v}</option>",
                v = Text(n),
                s = if *n == form.model { " selected" } else { "" }
            )
        })
        .collect();
    let _ = write!(
        out,
        "<form method=\"post\" action=\"/console/ask\" id=\"ask\" class=\"ask\">{}\
<label>model <select name=\"model\">{options}</select></label>\
<label class=\"wide\">state <textarea name=\"state\" rows=\"4\">{}</textarea></label>",
        csrf_field(viewer),
        Text(&form.state)
    );
    for (i, row) in form.rows().iter().enumerate() {
        let n = i + 1;
        let types: String = ["noul", "choice", "score"]
            .iter()
            .map(|t| {
                format!(
                    "<option value=\"{t}\"{}>{t}</option>",
                    if row.kind == *t { " selected" } else { "" }
                )
            })
            .collect();
        let _ = write!(
            out,
            "<fieldset><legend>question {n}</legend><label>id <input name=\"q{n}_id\" value=\"{}\"></label>\
<label>type <select name=\"q{n}_type\">{types}</select></label>\
<label class=\"wide\">instructions <input name=\"q{n}_text\" value=\"{}\"></label>\
<label class=\"wide\">options (choice: one per line, <code>name: description</code>) or levels (score: one per line, lowest first)\
<textarea name=\"q{n}_labels\" rows=\"3\">{}</textarea></label></fieldset>",
            Text(row.id),
            Text(row.text),
            Text(row.labels)
        );
    }
    out.push_str("<p class=\"muted\">Leave a question's id empty to leave it out. A noul is a yes/no question.</p>\
<button type=\"submit\" class=\"primary\">Ask</button></form>");
}

/// The answers as bars: a noul's P(yes), a choice's and a score's probabilities.
fn answers_html(body: &Value, out: &mut String) {
    let Some(answers) = body.get("answers").and_then(Value::as_object) else {
        return;
    };
    for (id, a) in answers {
        let kind = a.get("type").and_then(Value::as_str).unwrap_or("");
        let _ = write!(out, "<div class=\"question answer\" data-question=\"{}\"><h3>{} <small>{}</small></h3><table class=\"probs\">", Text(id), Text(id), Text(kind));
        match kind {
            "noul" => {
                let p = a.get("noul").and_then(Value::as_f64).unwrap_or(0.0);
                out.push_str(&probability_row("yes", p, "raw"));
                out.push_str(&probability_row("no", 1.0 - p, "raw"));
            }
            _ => {
                let legend = a.get("legend").and_then(Value::as_object);
                if let Some(probs) = a.get("probabilities").and_then(Value::as_object) {
                    for (label, p) in probs {
                        let shown = match legend.and_then(|l| l.get(label)) {
                            Some(Value::String(level)) => format!("{label}: {level}"),
                            _ => label.clone(),
                        };
                        out.push_str(&probability_row(&shown, p.as_f64().unwrap_or(0.0), "raw"));
                    }
                }
            }
        }
        out.push_str("</table>");
        if let Some(choice) = a.get("choice").and_then(Value::as_str) {
            let _ = write!(out, "<p>choice <b>{}</b></p>", Text(choice));
        }
        if let Some(score) = a.get("score").and_then(Value::as_f64) {
            let _ = write!(out, "<p>score <b>{score:.2}</b></p>");
        }
        out.push_str("</div>");
    }
}

pub async fn page(State(state): State<AppState>, Extension(viewer): Extension<Viewer>) -> Response {
    let model = crate::reader::DEFAULT_ALIAS;
    let mut body = String::new();
    form_html(&state, &viewer, &AskForm::example(model), &mut body);
    html_response(layout("Ask", "/console/ask", &viewer, None, &body))
}

pub async fn submit(
    State(state): State<AppState>,
    Extension(viewer): Extension<Viewer>,
    request_id: Option<Extension<RequestId>>,
    Form(form): Form<AskForm>,
) -> Response {
    if let Err(refused) = check_csrf(&viewer, form.csrf.as_deref()) {
        return refused;
    }
    let request = form.request();
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    let bytes = serde_json::to_vec(&request).unwrap_or_default();
    // The very handler of `POST /v1/systemone`: the same validation, read and decision record.
    let response =
        systemone::handle(State(state.clone()), request_id, headers, Body::from(bytes)).await;
    let status = response.status();
    let decision_id = response
        .headers()
        .get(crate::decision::DECISION_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let answer: Value = match axum::body::to_bytes(response.into_body(), MAX_ANSWER_BYTES).await {
        Ok(b) => serde_json::from_slice(&b).unwrap_or(Value::Null),
        Err(e) => json!({"detail": {"message": format!("the answer could not be read: {e}")}}),
    };
    let mut body = String::new();
    body.push_str("<section id=\"answer\"><h2>Answer</h2>");
    if let Some(id) = &decision_id {
        let _ = write!(
            body,
            "<p>Decision <a id=\"answer-decision\" href=\"/console/decisions/{id}\">{id}</a> · HTTP {}</p>",
            status.as_u16(),
            id = Text(id)
        );
    }
    if status.is_success() {
        answers_html(&answer, &mut body);
    } else {
        let message = answer
            .pointer("/detail/message")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| answer.to_string());
        let _ = write!(body, "<p class=\"error\">{}</p>", Text(&message));
    }
    body.push_str("</section>");
    form_html(&state, &viewer, &form, &mut body);
    html_response(layout("Ask", "/console/ask", &viewer, None, &body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_form_becomes_a_system_one_request() {
        let form = AskForm::example("jev-latest");
        let r = form.request();
        assert_eq!(r["model"], "jev-latest");
        assert_eq!(
            r["questions"]["billing"],
            json!({"type": "noul", "instructions": "Is this message about billing?"})
        );
        assert_eq!(
            r["questions"]["team"]["criteria"],
            json!({"billing": "Payments and refunds", "technical": null, "sales": null})
        );
        assert_eq!(
            r["questions"]["urgency"]["criteria"],
            json!(["Can wait", "This week", "Today"])
        );
        let empty = AskForm {
            q2_id: " ".into(),
            ..form
        };
        assert!(empty.request()["questions"].get("team").is_none());
    }

    #[test]
    fn answers_are_bars_with_escaped_labels() {
        let body = json!({"answers": {
            "<i>x</i>": {"type": "noul", "noul": 0.8},
            "t": {"type": "choice", "choice": "a", "probabilities": {"a": 0.7, "<b>": 0.3}}}});
        let mut out = String::new();
        answers_html(&body, &mut out);
        assert_eq!(out.matches("<svg").count(), 4);
        assert!(!out.contains("<i>x") && !out.contains("<b></td>"));
        assert!(out.contains("&lt;i&gt;x&lt;/i&gt;") && out.contains("&lt;b&gt;"));
        assert!(out.contains("80.0%"));
    }
}
