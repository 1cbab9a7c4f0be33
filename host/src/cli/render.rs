//! Answers as a terminal reads them: one block per question, a bar per probability.

use serde_json::Value;
use std::fmt::Write;

/// Width of a full bar, in cells.
const BAR_CELLS: usize = 24;

/// `p` in [0, 1] as a bar of eighth-block characters, padded to [`BAR_CELLS`].
pub fn bar(p: f64) -> String {
    const PARTS: [char; 8] = [' ', '▏', '▎', '▍', '▌', '▋', '▊', '▉'];
    let eighths = (p.clamp(0.0, 1.0) * (BAR_CELLS * 8) as f64).round() as usize;
    let mut s = "█".repeat(eighths / 8);
    if eighths % 8 > 0 {
        s.push(PARTS[eighths % 8]);
    }
    let used = s.chars().count();
    s.push_str(&" ".repeat(BAR_CELLS.saturating_sub(used)));
    s
}

fn number(v: Option<&Value>) -> Option<f64> {
    v.and_then(Value::as_f64)
}

/// The rows (label, probability) of an answer in the wire format, and its headline.
fn rows(answer: &Value) -> (String, Vec<(String, f64)>) {
    let kind = answer.get("type").and_then(Value::as_str).unwrap_or("?");
    match kind {
        "noul" => {
            let p = number(answer.get("noul")).unwrap_or(f64::NAN);
            (
                format!("noul {p:.3}"),
                vec![("true".into(), p), ("false".into(), 1.0 - p)],
            )
        }
        "choice" => {
            let headline = format!(
                "choice {:?} (confidence {:.3})",
                answer.get("choice").and_then(Value::as_str).unwrap_or("?"),
                number(answer.get("confidence")).unwrap_or(f64::NAN)
            );
            let rows = answer
                .get("probabilities")
                .and_then(Value::as_object)
                .map(|p| {
                    p.iter()
                        .map(|(k, v)| (k.clone(), v.as_f64().unwrap_or(f64::NAN)))
                        .collect()
                })
                .unwrap_or_default();
            (headline, rows)
        }
        "score" => {
            let headline = format!(
                "score {:.3} (confidence {:.3})",
                number(answer.get("score")).unwrap_or(f64::NAN),
                number(answer.get("confidence")).unwrap_or(f64::NAN)
            );
            let legend = answer.get("legend");
            let rows = answer
                .get("probabilities")
                .and_then(Value::as_object)
                .map(|p| {
                    p.iter()
                        .map(|(k, v)| {
                            let label = match legend.and_then(|l| l.get(k)) {
                                Some(Value::String(s)) => format!("{k}: {s}"),
                                Some(other) => format!("{k}: {other}"),
                                None => k.clone(),
                            };
                            (label, v.as_f64().unwrap_or(f64::NAN))
                        })
                        .collect()
                })
                .unwrap_or_default();
            (headline, rows)
        }
        other => (format!("{other}: {answer}"), Vec::new()),
    }
}

/// Shortens `s` to `max` characters with an ellipsis.
pub fn shorten(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
        out.push('…');
        out
    }
}

/// One answer: `id  headline  (question)` then a bar per label.
pub fn answer_block(id: &str, question: Option<&str>, answer: &Value) -> String {
    let (headline, rows) = rows(answer);
    let mut out = String::new();
    let _ = write!(out, "{id}: {headline}");
    if let Some(q) = question.filter(|q| !q.is_empty()) {
        let _ = write!(out, "  — {}", shorten(q, 60));
    }
    out.push('\n');
    let width = rows
        .iter()
        .map(|(l, _)| l.chars().count().min(32))
        .max()
        .unwrap_or(0);
    for (label, p) in rows {
        let label = shorten(&label, 32);
        let pad = width.saturating_sub(label.chars().count());
        let _ = writeln!(out, "    {label}{} {} {p:6.3}", " ".repeat(pad), bar(p));
    }
    out
}

/// The question text a wire question carries, for the table (instructions, else criteria).
pub fn question_text(question: &Value) -> Option<String> {
    match question.get("instructions") {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Null) | None => None,
        Some(other) => Some(other.to_string()),
    }
}

/// A System One response as a table, questions from the request it answers.
pub fn response_table(request: &Value, response: &Value) -> String {
    let mut out = String::new();
    if let Some(model) = response.get("model").and_then(Value::as_str) {
        let _ = writeln!(out, "model {model}");
    }
    if let Some(answers) = response.get("answers").and_then(Value::as_object) {
        for (id, answer) in answers {
            let question = request
                .get("questions")
                .and_then(|q| q.get(id))
                .and_then(question_text);
            out.push_str(&answer_block(id, question.as_deref(), answer));
        }
    }
    if let Some(usage) = response.get("usage") {
        let _ = writeln!(
            out,
            "usage: {} input tokens, {} output tokens",
            usage.get("input_tokens").unwrap_or(&Value::Null),
            usage.get("output_tokens").unwrap_or(&Value::Null)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn bars_scale_with_probability() {
        assert_eq!(bar(0.0).trim_end(), "");
        assert_eq!(bar(1.0), "█".repeat(BAR_CELLS));
        assert_eq!(bar(0.5).trim_end(), "█".repeat(BAR_CELLS / 2));
        assert_eq!(bar(0.51).chars().count(), BAR_CELLS);
    }

    #[test]
    fn every_answer_type_renders_its_labels() {
        let request = json!({"questions": {"q1": {"type": "noul", "instructions": "Urgent?"}}});
        let response = json!({
            "model": "m",
            "answers": {
                "q1": {"type": "noul", "noul": 0.75},
                "team": {"type": "choice", "choice": "billing", "confidence": 0.6,
                         "probabilities": {"billing": 0.6, "technical": 0.4}},
                "anger": {"type": "score", "score": 1.2, "confidence": 0.5,
                          "legend": {"0": "calm", "1": "annoyed"},
                          "probabilities": {"0": 0.3, "1": 0.7}}
            },
            "usage": {"input_tokens": 10, "output_tokens": 3}
        });
        let table = response_table(&request, &response);
        assert!(table.contains("q1: noul 0.750  — Urgent?"), "{table}");
        assert!(table.contains("technical"), "{table}");
        assert!(table.contains("1: annoyed"), "{table}");
        assert!(
            table.contains("usage: 10 input tokens, 3 output tokens"),
            "{table}"
        );
    }
}

/// One line saying why a server refused a request, from any of its error shapes.
pub fn error_summary(status: u16, body: &Value) -> String {
    let detail = match body.get("detail") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Object(d)) => {
            let kind = d
                .get("error_type")
                .and_then(Value::as_str)
                .unwrap_or("error");
            let message = d.get("message").and_then(Value::as_str).unwrap_or_default();
            format!("{kind}: {message}")
        }
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| {
                let loc = i
                    .get("loc")
                    .and_then(Value::as_array)
                    .map(|l| {
                        l.iter()
                            .map(|p| match p {
                                Value::String(s) => s.clone(),
                                other => other.to_string(),
                            })
                            .collect::<Vec<_>>()
                            .join(".")
                    })
                    .unwrap_or_default();
                let msg = i.get("msg").and_then(Value::as_str).unwrap_or_default();
                format!("{loc}: {msg}")
            })
            .collect::<Vec<_>>()
            .join("; "),
        _ => match body {
            Value::String(s) => shorten(s, 200),
            other => shorten(&other.to_string(), 200),
        },
    };
    format!("HTTP {status}: {detail}")
}
