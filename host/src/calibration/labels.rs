//! The labels file: JSONL, one decision per line,
//! `{"decision_id": "…", "labels": {"QUESTION_ID": LABEL, …}}`, or, for the output of
//! `hunch batch`, `{"custom_id": "…", "labels": {…}}`.

use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// What a labels line names: a decision of a decision log, or a line of a `hunch batch` output.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LabelKey {
    Decision(String),
    Custom(String),
}

impl std::fmt::Display for LabelKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LabelKey::Decision(id) => write!(f, "decision_id {id}"),
            LabelKey::Custom(id) => write!(f, "custom_id {id}"),
        }
    }
}

/// One line's labels.
#[derive(Debug, Clone, PartialEq)]
pub struct LabelLine {
    /// 1-based line number in the file.
    pub line: usize,
    pub key: LabelKey,
    /// Question id → label, as written (`true`/`false`, an option name, a level index or name).
    pub labels: Map<String, Value>,
}

#[derive(Debug, thiserror::Error)]
pub enum LabelsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// A line that is not a labels line: reported, never silently skipped.
#[derive(Debug, Clone, PartialEq)]
pub struct BadLine {
    pub line: usize,
    pub reason: String,
}

/// Reads the file; lines that are not `{"decision_id" or "custom_id": STRING, "labels": OBJECT}`
/// come back as [`BadLine`]s beside the good ones.
pub fn read_labels(path: &Path) -> Result<(Vec<LabelLine>, Vec<BadLine>), LabelsError> {
    let text = std::fs::read_to_string(path).map_err(|source| LabelsError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(parse_labels(&text))
}

pub fn parse_labels(text: &str) -> (Vec<LabelLine>, Vec<BadLine>) {
    let mut good = Vec::new();
    let mut bad = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        if raw.trim().is_empty() {
            continue;
        }
        match parse_line(raw) {
            Ok((key, labels)) => good.push(LabelLine { line, key, labels }),
            Err(reason) => bad.push(BadLine { line, reason }),
        }
    }
    (good, bad)
}

fn parse_line(raw: &str) -> Result<(LabelKey, Map<String, Value>), String> {
    let value: Value = serde_json::from_str(raw).map_err(|e| format!("not JSON: {e}"))?;
    let Value::Object(mut fields) = value else {
        return Err("not a JSON object".into());
    };
    let id = |field: &str, value: Value| match value {
        Value::String(id) if !id.is_empty() => Ok(id),
        _ => Err(format!("`{field}` must be a non-empty string")),
    };
    let key = match (fields.remove("decision_id"), fields.remove("custom_id")) {
        (Some(d), None) => LabelKey::Decision(id("decision_id", d)?),
        (None, Some(c)) => LabelKey::Custom(id("custom_id", c)?),
        (Some(_), Some(_)) => {
            return Err("both `decision_id` and `custom_id`: name one (a decision of a decision log, or a line of a `hunch batch` output)".into())
        }
        (None, None) => return Err("no `decision_id` (or `custom_id` for a `hunch batch` output)".into()),
    };
    match fields.remove("labels") {
        Some(Value::Object(labels)) => Ok((key, labels)),
        Some(_) => Err("`labels` must be an object of question id → label".into()),
        None => Err("no `labels`".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_and_bad_lines_are_both_reported() {
        let text = r#"{"decision_id": "d1", "labels": {"urgent": true}}

not json
{"decision_id": 3, "labels": {}}
{"decision_id": "d2"}
{"custom_id": "c", "labels": {"urgent": false}}
{"custom_id": "c", "decision_id": "d", "labels": {}}
{"labels": {}}"#;
        let (good, bad) = parse_labels(text);
        assert_eq!(good.len(), 2);
        assert_eq!(good[0].key, LabelKey::Decision("d1".into()));
        assert_eq!(good[0].labels["urgent"], Value::Bool(true));
        assert_eq!(good[1].key, LabelKey::Custom("c".into()));
        let lines: Vec<usize> = bad.iter().map(|b| b.line).collect();
        assert_eq!(lines, vec![3, 4, 5, 7, 8]);
        assert!(bad[3].reason.contains("both"));
        assert!(bad[4].reason.contains("custom_id"));
    }
}
