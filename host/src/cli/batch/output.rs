//! The output file of `hunch batch`: one self-identifying line per input line, appended as each
//! completes, and how a rerun resumes from it.
//!
//! A line has OpenAI's fields (`id`, `custom_id`, `response` with `status_code`, `request_id`
//! and `body`, `error`) and, so that `hunch calibrate` can fit on it (docs/calibration.md),
//! two more that readers of OpenAI's format ignore: `request.questions`, the questions of a
//! `/v1/systemone` line as sent (which question each answer belongs to), and
//! `response.calibration`, the id of the calibration the server computed the answers with
//! (absent when they are raw).
//!
//! Resuming keeps every line that has a `response` (an answered `custom_id` is never sent
//! again), drops the `error` lines (they are retried and reported afresh) and repairs a torn
//! last line left by a killed run, rewriting the file atomically when anything is dropped.

use super::input::{Job, SYSTEMONE_URL};
use serde_json::{json, Value};
use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} line {line} is not a batch output line ({message}); move the file away or fix that line to resume")]
    Corrupt {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What a previous run left in the output file.
#[derive(Debug, Default, PartialEq)]
pub struct Previous {
    /// `custom_id`s with a `response`.
    pub answered: HashSet<String>,
    /// Lines without a `response` (errors), dropped to be retried.
    pub dropped_errors: usize,
    /// Whether a torn (incomplete) last line was removed.
    pub repaired_tail: bool,
}

/// The answered `custom_id` of an output line, if it has a `response`.
fn answered_id(value: &Value) -> Option<&str> {
    let response = value.get("response")?;
    if !response.is_object() {
        return None;
    }
    value.get("custom_id")?.as_str()
}

/// Reads `path` (absent: nothing to resume), returning what to keep and what was found.
fn scan(path: &Path) -> Result<(Vec<String>, Previous), OutputError> {
    let read_err = |source| OutputError::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok((Vec::new(), Previous::default()))
        }
        Err(e) => return Err(read_err(e)),
    };
    let mut reader = BufReader::new(file);
    let mut kept = Vec::new();
    let mut previous = Previous::default();
    let mut buf = Vec::new();
    let mut line = 0;
    loop {
        buf.clear();
        let n = reader.read_until(b'\n', &mut buf).map_err(read_err)?;
        if n == 0 {
            break;
        }
        line += 1;
        let complete = buf.last() == Some(&b'\n');
        let text = String::from_utf8_lossy(&buf);
        let text = text.trim();
        if text.is_empty() {
            continue;
        }
        let value: Value = match serde_json::from_str(text) {
            Ok(v) => v,
            // A killed run tears at most its last line.
            Err(_) if !complete => {
                previous.repaired_tail = true;
                break;
            }
            Err(e) => {
                return Err(OutputError::Corrupt {
                    path: path.to_path_buf(),
                    line,
                    message: format!("not JSON: {e}"),
                })
            }
        };
        if !value.is_object() || value.get("custom_id").is_none() {
            return Err(OutputError::Corrupt {
                path: path.to_path_buf(),
                line,
                message: "no `custom_id`".into(),
            });
        }
        if !complete {
            // Whole JSON but no newline: keep it, and write the newline back.
            previous.repaired_tail = true;
        }
        match answered_id(&value) {
            Some(id) if previous.answered.insert(id.to_string()) => kept.push(text.to_string()),
            _ => previous.dropped_errors += 1,
        }
    }
    Ok((kept, previous))
}

/// Appends output lines, one `write` per line so concurrent workers never interleave.
pub struct Writer {
    path: PathBuf,
    file: Mutex<File>,
}

impl Writer {
    /// Opens `path` for appending after resuming from what it holds.
    pub fn open(path: &Path) -> Result<(Writer, Previous), OutputError> {
        let (kept, previous) = scan(path)?;
        let write_err = |source| OutputError::Write {
            path: path.to_path_buf(),
            source,
        };
        if previous.dropped_errors > 0 || previous.repaired_tail {
            // Rewrite beside it and rename: a crash now leaves the old file or the new one.
            let tmp = path.with_extension("resume.tmp");
            let mut out = File::create(&tmp).map_err(write_err)?;
            for line in &kept {
                out.write_all(line.as_bytes()).map_err(write_err)?;
                out.write_all(b"\n").map_err(write_err)?;
            }
            out.sync_all().map_err(write_err)?;
            std::fs::rename(&tmp, path).map_err(write_err)?;
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(write_err)?;
        Ok((
            Writer {
                path: path.to_path_buf(),
                file: Mutex::new(file),
            },
            previous,
        ))
    }

    pub fn write(&self, value: &Value) -> Result<(), OutputError> {
        let mut line = value.to_string();
        line.push('\n');
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        file.write_all(line.as_bytes())
            .map_err(|source| OutputError::Write {
                path: self.path.clone(),
                source,
            })
    }

    /// Flushes to disk.
    pub fn finish(&self) -> Result<(), OutputError> {
        let file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        file.sync_all().map_err(|source| OutputError::Write {
            path: self.path.clone(),
            source,
        })
    }
}

/// `batch_req_…` ids, as OpenAI's output lines carry, from the input line number.
fn line_id(line: usize) -> String {
    format!("batch_req_{line}")
}

/// What the server answered a line with.
#[derive(Debug, Clone)]
pub struct Answered<'a> {
    pub status: u16,
    pub request_id: Option<&'a str>,
    /// `x-hunch-calibration`: the calibration the answers were computed with.
    pub calibration: Option<&'a str>,
    pub body: Value,
}

/// An answered line: the server's status and body (4xx and 5xx included).
pub fn response_line(job: &Job, answered: Answered<'_>) -> Value {
    let mut response = json!({
        "status_code": answered.status,
        "request_id": answered.request_id,
        "body": answered.body,
    });
    if let Some(c) = answered.calibration {
        response["calibration"] = json!(c);
    }
    let mut line = json!({
        "id": line_id(job.line),
        "custom_id": job.custom_id,
        "response": response,
        "error": null,
    });
    if job.url == SYSTEMONE_URL {
        if let Some(questions) = job.body.get("questions") {
            line["request"] = json!({ "questions": questions });
        }
    }
    line
}

/// A line that could not be sent.
pub fn error_line(line: usize, custom_id: Option<&str>, code: &str, message: &str) -> Value {
    json!({
        "id": line_id(line),
        "custom_id": custom_id,
        "response": null,
        "error": {"code": code, "message": message},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(line: usize, custom_id: &str) -> Job {
        Job {
            line,
            custom_id: custom_id.into(),
            url: "/v1/policies/p".into(),
            body: json!({}),
            group: String::new(),
        }
    }

    fn response_line(
        line: usize,
        custom_id: &str,
        status: u16,
        request_id: Option<&str>,
        body: Value,
    ) -> Value {
        super::response_line(
            &job(line, custom_id),
            Answered {
                status,
                request_id,
                calibration: None,
                body,
            },
        )
    }

    #[test]
    fn a_systemone_line_keeps_its_questions_and_the_calibration_it_was_answered_with() {
        let mut j = job(3, "c");
        j.url = SYSTEMONE_URL.into();
        j.body = json!({"model": "m", "state": "long text", "questions": {"u": {"type": "noul"}}});
        let line = super::response_line(
            &j,
            Answered {
                status: 200,
                request_id: Some("r"),
                calibration: Some("abc"),
                body: json!({"answers": {}}),
            },
        );
        assert_eq!(
            line["request"],
            json!({"questions": {"u": {"type": "noul"}}})
        );
        assert!(
            line["request"].get("state").is_none(),
            "the state is not copied"
        );
        assert_eq!(line["response"]["calibration"], "abc");
        assert_eq!(line["response"]["status_code"], 200);
        // A policy line, and raw answers, add nothing.
        let plain = response_line(1, "p", 200, None, json!({}));
        assert!(plain.get("request").is_none());
        assert!(plain["response"].get("calibration").is_none());
        // Resuming still reads it as answered.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        std::fs::write(&path, format!("{line}\n")).unwrap();
        let (_, previous) = Writer::open(&path).unwrap();
        assert!(previous.answered.contains("c"));
    }

    #[test]
    fn resuming_keeps_answers_drops_errors_and_repairs_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        let answered = response_line(1, "a", 200, None, json!({"x": 1}));
        let refused = response_line(2, "b", 422, Some("r"), json!({"detail": []}));
        let error = error_line(3, Some("c"), "transport", "down");
        let text = format!("{answered}\n{error}\n{refused}\n{{\"custom_id\":\"d\",\"resp");
        std::fs::write(&path, text).unwrap();
        let (writer, previous) = Writer::open(&path).unwrap();
        assert_eq!(previous.dropped_errors, 1);
        assert!(previous.repaired_tail);
        let mut ids: Vec<&str> = previous.answered.iter().map(String::as_str).collect();
        ids.sort();
        assert_eq!(ids, ["a", "b"]);
        writer
            .write(&error_line(4, None, "invalid_line", "x"))
            .unwrap();
        let lines: Vec<Value> = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0], answered);
        assert_eq!(lines[1], refused);
    }

    #[test]
    fn a_complete_last_line_without_newline_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        let answered = response_line(1, "a", 200, None, json!({}));
        std::fs::write(&path, answered.to_string()).unwrap();
        let (writer, previous) = Writer::open(&path).unwrap();
        assert!(previous.answered.contains("a"));
        writer
            .write(&response_line(2, "b", 200, None, json!({})))
            .unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 2);
    }

    #[test]
    fn a_corrupt_middle_line_stops_the_resume() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        std::fs::write(&path, "garbage\n{\"custom_id\":\"a\"}\n").unwrap();
        let err = Writer::open(&path).err().unwrap();
        assert!(err.to_string().contains("line 1"), "{err}");
    }
}
