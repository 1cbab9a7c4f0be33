//! The input file of `hunch batch`: OpenAI's batch lines (`custom_id`, `method`, `url`, `body`),
//! each turned into a [`Job`] or refused with the reason, and the order jobs are sent in.

use serde_json::Value;
use std::collections::{HashMap, HashSet};

/// The routes a batch line may name.
pub const SYSTEMONE_URL: &str = "/v1/systemone";
pub const POLICIES_PREFIX: &str = "/v1/policies/";

/// One request to send.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// 1-based line number in the input.
    pub line: usize,
    pub custom_id: String,
    /// `/v1/systemone` or `/v1/policies/NAME`.
    pub url: String,
    pub body: Value,
    /// Jobs with the same key share a prompt prefix (same model and question list, or same
    /// policy) and are sent back to back.
    pub group: String,
}

/// Why a line is answered with an `error` instead of being sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalCode {
    InvalidLine,
    DuplicateCustomId,
}

impl RefusalCode {
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalCode::InvalidLine => "invalid_line",
            RefusalCode::DuplicateCustomId => "duplicate_custom_id",
        }
    }
}

/// A line that cannot be sent.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub line: usize,
    /// `None` when the line has no usable `custom_id`.
    pub custom_id: Option<String>,
    pub code: RefusalCode,
    pub message: String,
}

/// A whole input file, parsed.
#[derive(Debug, Default)]
pub struct Input {
    /// In sending order: grouped by [`Job::group`], groups in order of first appearance, input
    /// order inside a group.
    pub jobs: Vec<Job>,
    pub refusals: Vec<Refusal>,
    /// Non-blank lines.
    pub lines: usize,
}

fn refuse(line: usize, custom_id: Option<String>, message: impl Into<String>) -> Refusal {
    Refusal {
        line,
        custom_id,
        code: RefusalCode::InvalidLine,
        message: format!("line {line}: {}", message.into()),
    }
}

/// Whether `name` can be a URL segment naming a policy (the server's own rule).
fn valid_policy_name(name: &str) -> bool {
    crate::policy::registry::valid_name(name)
}

/// Parses one non-blank line.
fn parse_line(line: usize, text: &str) -> Result<Job, Refusal> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| refuse(line, None, format!("not JSON: {e}")))?;
    let Value::Object(mut fields) = value else {
        return Err(refuse(line, None, "not a JSON object"));
    };
    let custom_id = match fields.get("custom_id") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        Some(Value::String(_)) => return Err(refuse(line, None, "`custom_id` is empty")),
        Some(other) => {
            return Err(refuse(
                line,
                None,
                format!("`custom_id` must be a string, got {other}"),
            ))
        }
        None => return Err(refuse(line, None, "no `custom_id`")),
    };
    let id = Some(custom_id.clone());
    match fields.get("method") {
        Some(Value::String(m)) if m.eq_ignore_ascii_case("POST") => {}
        Some(other) => {
            return Err(refuse(
                line,
                id,
                format!("`method` must be \"POST\", got {other}"),
            ))
        }
        None => return Err(refuse(line, id, "no `method` (\"POST\")")),
    }
    let url = match fields.get("url") {
        Some(Value::String(u)) => u.clone(),
        Some(other) => {
            return Err(refuse(
                line,
                id,
                format!("`url` must be a string, got {other}"),
            ))
        }
        None => return Err(refuse(line, id, "no `url`")),
    };
    let path = url.split(['?', '#']).next().unwrap_or_default();
    let group_prefix = if path == SYSTEMONE_URL {
        None
    } else if let Some(name) = path.strip_prefix(POLICIES_PREFIX) {
        if !valid_policy_name(name) {
            return Err(refuse(
                line,
                id,
                format!("`url` names no valid policy: {name:?} (1-64 of a-z, 0-9, '-', '_')"),
            ));
        }
        Some(path.to_string())
    } else {
        return Err(refuse(
            line,
            id,
            format!("`url` must be {SYSTEMONE_URL} or {POLICIES_PREFIX}NAME, got {url:?}"),
        ));
    };
    let body = match fields.remove("body") {
        Some(body @ Value::Object(_)) => body,
        Some(other) => {
            return Err(refuse(
                line,
                id,
                format!("`body` must be a JSON object, got {}", kind(&other)),
            ))
        }
        None => return Err(refuse(line, id, "no `body`")),
    };
    let group = match group_prefix {
        Some(policy) => policy,
        // The prompt prefix a read shares is the model and the question list.
        None => format!(
            "{SYSTEMONE_URL} {} {}",
            body.get("model").map(Value::to_string).unwrap_or_default(),
            body.get("questions")
                .map(Value::to_string)
                .unwrap_or_default()
        ),
    };
    Ok(Job {
        line,
        custom_id,
        url: path.to_string(),
        body,
        group,
    })
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Parses a whole file; the first line with a `custom_id` is sent, later ones are refused.
pub fn parse(text: &str) -> Input {
    let mut input = Input::default();
    let mut seen: HashSet<String> = HashSet::new();
    let mut jobs = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        if raw.trim().is_empty() {
            continue;
        }
        input.lines += 1;
        match parse_line(line, raw) {
            Ok(job) => {
                if seen.insert(job.custom_id.clone()) {
                    jobs.push(job);
                } else {
                    input.refusals.push(Refusal {
                        line,
                        message: format!(
                            "line {line}: `custom_id` {:?} was already used by an earlier line",
                            job.custom_id
                        ),
                        custom_id: Some(job.custom_id),
                        code: RefusalCode::DuplicateCustomId,
                    });
                }
            }
            Err(refusal) => input.refusals.push(refusal),
        }
    }
    input.jobs = schedule(jobs);
    input
}

/// Groups jobs sharing a prompt prefix, groups in order of first appearance: consecutive jobs
/// (sent by parallel workers) then hit the prefix cache and share forward passes.
pub fn schedule(jobs: Vec<Job>) -> Vec<Job> {
    let mut order: HashMap<String, usize> = HashMap::new();
    for job in &jobs {
        let n = order.len();
        order.entry(job.group.clone()).or_insert(n);
    }
    let mut jobs = jobs;
    // Stable: input order inside a group.
    jobs.sort_by_key(|j| order.get(&j.group).copied().unwrap_or(usize::MAX));
    jobs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(id: &str, url: &str, questions: &str) -> String {
        format!(
            r#"{{"custom_id":"{id}","method":"POST","url":"{url}","body":{{"model":"m","state":"s","questions":{questions}}}}}"#
        )
    }

    #[test]
    fn good_lines_become_jobs_grouped_by_question_list() {
        let text = [
            line("a", "/v1/systemone", r#"{"q":{"type":"noul"}}"#),
            line("b", "/v1/policies/triage", "{}"),
            line("c", "/v1/systemone", r#"{"r":{"type":"noul"}}"#),
            String::new(),
            line("d", "/v1/systemone", r#"{"q":{"type":"noul"}}"#),
        ]
        .join("\n");
        let input = parse(&text);
        assert_eq!(input.lines, 4);
        assert!(input.refusals.is_empty());
        let order: Vec<&str> = input.jobs.iter().map(|j| j.custom_id.as_str()).collect();
        assert_eq!(order, ["a", "d", "b", "c"]);
        assert_eq!(input.jobs[1].line, 5);
        assert_eq!(input.jobs[2].url, "/v1/policies/triage");
    }

    #[test]
    fn bad_lines_are_refused_with_the_reason() {
        let text = [
            "not json".to_string(),
            "[1]".into(),
            r#"{"method":"POST","url":"/v1/systemone","body":{}}"#.into(),
            r#"{"custom_id":"x","method":"GET","url":"/v1/systemone","body":{}}"#.into(),
            r#"{"custom_id":"y","method":"POST","url":"/v1/chat/completions","body":{}}"#.into(),
            r#"{"custom_id":"z","method":"POST","url":"/v1/systemone","body":"text"}"#.into(),
            r#"{"custom_id":"w","method":"POST","url":"/v1/policies/../etc","body":{}}"#.into(),
            line("ok", "/v1/systemone", "{}"),
            line("ok", "/v1/systemone", "{}"),
        ]
        .join("\n");
        let input = parse(&text);
        assert_eq!(input.jobs.len(), 1);
        let got: Vec<(usize, Option<&str>, &str)> = input
            .refusals
            .iter()
            .map(|r| (r.line, r.custom_id.as_deref(), r.code.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                (1, None, "invalid_line"),
                (2, None, "invalid_line"),
                (3, None, "invalid_line"),
                (4, Some("x"), "invalid_line"),
                (5, Some("y"), "invalid_line"),
                (6, Some("z"), "invalid_line"),
                (7, Some("w"), "invalid_line"),
                (9, Some("ok"), "duplicate_custom_id"),
            ]
        );
        assert!(input.refusals[4].message.contains("/v1/chat/completions"));
        assert!(input.refusals[5].message.contains("a string"));
    }
}
