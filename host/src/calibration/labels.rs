//! The labels file: JSONL, one decision per line,
//! `{"decision_id": "…", "labels": {"QUESTION_ID": LABEL, …}}`.

use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// One line's labels.
#[derive(Debug, Clone, PartialEq)]
pub struct LabelLine {
    /// 1-based line number in the file.
    pub line: usize,
    pub decision_id: String,
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

/// Reads the file; lines that are not `{"decision_id": STRING, "labels": OBJECT}` come back as
/// [`BadLine`]s beside the good ones.
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
            Ok((decision_id, labels)) => good.push(LabelLine {
                line,
                decision_id,
                labels,
            }),
            Err(reason) => bad.push(BadLine { line, reason }),
        }
    }
    (good, bad)
}

fn parse_line(raw: &str) -> Result<(String, Map<String, Value>), String> {
    let value: Value = serde_json::from_str(raw).map_err(|e| format!("not JSON: {e}"))?;
    let Value::Object(mut fields) = value else {
        return Err("not a JSON object".into());
    };
    let decision_id = match fields.remove("decision_id") {
        Some(Value::String(id)) if !id.is_empty() => id,
        Some(_) => return Err("`decision_id` must be a non-empty string".into()),
        None if fields.contains_key("custom_id") => {
            return Err(
                "`custom_id` (labels for `hunch batch` output) is not supported yet; label by `decision_id`"
                    .into(),
            )
        }
        None => return Err("no `decision_id`".into()),
    };
    match fields.remove("labels") {
        Some(Value::Object(labels)) => Ok((decision_id, labels)),
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
{"custom_id": "c", "labels": {}}"#;
        let (good, bad) = parse_labels(text);
        assert_eq!(good.len(), 1);
        assert_eq!(good[0].decision_id, "d1");
        assert_eq!(good[0].labels["urgent"], Value::Bool(true));
        let lines: Vec<usize> = bad.iter().map(|b| b.line).collect();
        assert_eq!(lines, vec![3, 4, 5, 6]);
        assert!(bad[3].reason.contains("custom_id"));
    }
}
