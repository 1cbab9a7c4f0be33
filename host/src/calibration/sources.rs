//! What `hunch calibrate --log` reads: decision logs (NDJSON, one event or one JSON array of
//! events per line, as the file and HTTP sinks write) and `hunch batch` output files, told apart
//! line by line by their content (a batch line has OpenAI's shape: a `custom_id` with a
//! `response` or an `error`), never by a file name or a field only our writer puts there. A file
//! compressed with gzip is recognised by its magic bytes.

use super::batch::{is_batch_line, parse_line, BatchLine};
use crate::decision::event::DecisionEvent;
use serde_json::Value;
use std::io::Read;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
#[error("cannot read {path}: {source}")]
pub struct SourceError {
    pub path: PathBuf,
    pub source: std::io::Error,
}

/// Everything the files held.
#[derive(Debug, Default)]
pub struct Sources {
    pub events: Vec<DecisionEvent>,
    pub batch: Vec<BatchLine>,
    /// Lines that were neither (torn, not JSON, another shape).
    pub skipped_lines: u64,
}

pub fn read_sources(paths: &[PathBuf]) -> Result<Sources, SourceError> {
    let mut out = Sources::default();
    for path in paths {
        let text = read_text(path)?;
        out.add(&text);
    }
    Ok(out)
}

fn read_text(path: &Path) -> Result<String, SourceError> {
    let error = |source| SourceError {
        path: path.to_path_buf(),
        source,
    };
    let bytes = std::fs::read(path).map_err(error)?;
    if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut text = Vec::new();
        flate2::read::MultiGzDecoder::new(bytes.as_slice())
            .read_to_end(&mut text)
            .map_err(error)?;
        Ok(String::from_utf8_lossy(&text).into_owned())
    } else {
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}

impl Sources {
    fn add(&mut self, text: &str) {
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            match serde_json::from_str::<Value>(line) {
                Ok(Value::Array(items)) => {
                    for item in items {
                        self.add_value(item);
                    }
                }
                Ok(value) => self.add_value(value),
                Err(_) => self.skipped_lines += 1,
            }
        }
    }

    fn add_value(&mut self, value: Value) {
        if is_batch_line(&value) {
            match parse_line(&value) {
                Some(line) => self.batch.push(line),
                None => self.skipped_lines += 1,
            }
            return;
        }
        match serde_json::from_value::<DecisionEvent>(value) {
            Ok(e) => self.events.push(e),
            Err(_) => self.skipped_lines += 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn events_and_batch_lines_are_told_apart_by_content_gzip_by_its_magic() {
        let event = serde_json::json!({"decision_id": "d", "timestamp": "t",
            "route": "/v1/systemone", "read_algorithm": "a", "status": 200});
        let batch = serde_json::json!({"id": "batch_req_1", "custom_id": "c",
            "response": {"status_code": 200, "body": {"answers": {}}}, "error": null});
        let text = format!("{event}\n[{event}, {event}]\n{batch}\nnot json\n{{\"x\": 1}}\n");
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("mixed.log");
        std::fs::write(&plain, &text).unwrap();
        // Compressed, under a name that says nothing.
        let zipped = dir.path().join("mixed.data");
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(text.as_bytes()).unwrap();
        std::fs::write(&zipped, gz.finish().unwrap()).unwrap();
        for path in [plain, zipped] {
            let s = read_sources(&[path]).unwrap();
            assert_eq!(s.events.len(), 3);
            assert_eq!(s.batch.len(), 1);
            assert_eq!(s.batch[0].custom_id, "c");
            assert_eq!(s.skipped_lines, 2);
        }
    }
}
