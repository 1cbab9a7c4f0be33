//! One stored quality report, read and checked: the figures `scripts/quality.sh` wrote
//! (docs/quality.md lists them) as types, beside the document exactly as stored (what
//! `GET /v1/models/NAME/quality` answers).

use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Larger than any report the script writes (tens of kilobytes) by far; a bigger file is not
/// one of its reports and is not read into memory.
pub const MAX_REPORT_BYTES: u64 = 16 << 20;

/// A figure with its 95% interval, each `null` where the script could not compute it (an
/// empty part, a trimmed run's dimension).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct Estimate {
    pub value: Option<f64>,
    #[serde(default)]
    pub low: Option<f64>,
    #[serde(default)]
    pub high: Option<f64>,
    /// A dimension's name in words (`Repeatability`); absent on the overall figures.
    #[serde(default)]
    pub title: Option<String>,
}

/// A reference model's score (`floor`: jevbench's `fake:biased`, `ceiling`: `fake:coherent`),
/// overall and per dimension.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct Reference {
    #[serde(flatten)]
    pub overall: Estimate,
    #[serde(default)]
    pub dimensions: BTreeMap<String, Estimate>,
}

/// What a report must hold to be shown: whose it is, when and how it was measured. The
/// figures are optional because a run may skip a part (`--skip jevbench` has no score,
/// `--skip labelled` no accuracy).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Figures {
    pub model: String,
    pub fingerprint: String,
    pub measured_at: String,
    pub command: String,
    #[serde(default)]
    pub commit: Option<String>,
    #[serde(default)]
    pub requests: Option<u64>,
    #[serde(default)]
    pub errors: Option<u64>,
    #[serde(default)]
    pub score: Option<Estimate>,
    #[serde(default)]
    pub dimensions: BTreeMap<String, Estimate>,
    #[serde(default)]
    pub floor: Option<Reference>,
    #[serde(default)]
    pub ceiling: Option<Reference>,
    #[serde(default)]
    pub accuracy: Option<Estimate>,
    #[serde(default)]
    pub ece: Option<Estimate>,
}

/// A report read from its file.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub figures: Figures,
    /// The whole document as stored, every field the script wrote.
    pub document: Value,
    pub file: PathBuf,
    /// [`Figures::measured_at`] as a key that sorts by time.
    pub(super) when: MeasuredAt,
}

/// Why a file in the quality directory is not a report; the file is skipped, saying this.
#[derive(Debug, thiserror::Error)]
pub enum BadReport {
    #[error("cannot read it: {0}")]
    Unreadable(#[from] std::io::Error),
    #[error("it holds {0} bytes, more than a report ever does (16 MiB)")]
    TooLarge(u64),
    #[error("it is not JSON: {0}")]
    NotJson(serde_json::Error),
    #[error("it is not a quality report: {0}")]
    Shape(serde_json::Error),
    #[error("its measured_at {0:?} is not a UTC time as YYYY-MM-DDTHH:MM:SSZ")]
    BadTime(String),
}

/// A UTC time, `YYYY-MM-DDTHH:MM:SS` with optional fraction and `Z` (or `+00:00`): its fixed
/// digits, then its fraction in nanoseconds, so that comparing two compares their instants.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct MeasuredAt(String, u32);

impl MeasuredAt {
    pub(super) fn parse(text: &str) -> Option<MeasuredAt> {
        let rest = text
            .strip_suffix('Z')
            .or_else(|| text.strip_suffix("+00:00"))?;
        let (head, fraction) = match rest.split_once('.') {
            Some((head, fraction)) => (head, fraction),
            None => (rest, ""),
        };
        let shape_ok = head.len() == 19
            && head.bytes().enumerate().all(|(i, b)| match i {
                4 | 7 => b == b'-',
                10 => b == b'T',
                13 | 16 => b == b':',
                _ => b.is_ascii_digit(),
            });
        if !shape_ok || fraction.len() > 9 || !fraction.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let nanos = format!("{fraction:0<9}").parse().ok()?;
        Some(MeasuredAt(head.to_string(), nanos))
    }
}

/// The report in `path`, or why it is none.
pub fn read(path: &Path) -> Result<Report, BadReport> {
    let size = std::fs::metadata(path)?.len();
    if size > MAX_REPORT_BYTES {
        return Err(BadReport::TooLarge(size));
    }
    parse(&std::fs::read(path)?, path)
}

/// A report from its bytes (`path` says where they came from).
pub fn parse(bytes: &[u8], path: &Path) -> Result<Report, BadReport> {
    let document: Value = serde_json::from_slice(bytes).map_err(BadReport::NotJson)?;
    let figures = Figures::deserialize(&document).map_err(BadReport::Shape)?;
    let when = MeasuredAt::parse(&figures.measured_at)
        .ok_or_else(|| BadReport::BadTime(figures.measured_at.clone()))?;
    Ok(Report {
        figures,
        document,
        file: path.to_path_buf(),
        when,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parsed(doc: Value) -> Result<Report, BadReport> {
        parse(doc.to_string().as_bytes(), Path::new("r.json"))
    }

    fn minimal() -> Value {
        json!({"model": "m", "fingerprint": "f", "measured_at": "2026-12-07T01:02:03Z",
               "command": "scripts/quality.sh"})
    }

    #[test]
    fn a_report_needs_its_model_fingerprint_time_and_command_and_nothing_else() {
        let r = parsed(minimal()).expect("a report");
        assert_eq!(r.figures.fingerprint, "f");
        assert!(r.figures.score.is_none() && r.figures.dimensions.is_empty());
        for field in ["model", "fingerprint", "measured_at", "command"] {
            let mut doc = minimal();
            doc.as_object_mut().unwrap().remove(field);
            let e = parsed(doc).expect_err(field);
            assert!(
                matches!(e, BadReport::Shape(_)) && e.to_string().contains(field),
                "{field}: {e}"
            );
        }
    }

    #[test]
    fn the_figures_are_read_with_their_intervals_and_nulls() {
        let mut doc = minimal();
        doc["score"] = json!({"value": 0.6, "low": 0.5, "high": 0.7, "n": 3});
        doc["dimensions"] = json!({"REP": {"value": 0.4, "low": null, "high": null, "title": "Repeatability"},
                                   "MEA": {"value": null, "low": null, "high": null}});
        doc["floor"] =
            json!({"value": 0.5, "low": 0.4, "high": 0.6, "dimensions": {"REP": {"value": 0.3}}});
        let r = parsed(doc).expect("a report");
        assert_eq!(r.figures.score.as_ref().and_then(|s| s.high), Some(0.7));
        assert_eq!(
            r.figures.dimensions["REP"].title.as_deref(),
            Some("Repeatability")
        );
        assert_eq!(r.figures.dimensions["MEA"].value, None);
        let floor = r.figures.floor.expect("a floor");
        assert_eq!(floor.dimensions["REP"].value, Some(0.3));
    }

    #[test]
    fn bad_files_say_what_is_wrong() {
        let e = parse(b"{not json", Path::new("x")).expect_err("not JSON");
        assert!(matches!(e, BadReport::NotJson(_)), "{e}");
        let mut doc = minimal();
        doc["score"] = json!("high");
        assert!(matches!(parsed(doc), Err(BadReport::Shape(_))));
        let mut doc = minimal();
        doc["measured_at"] = json!("yesterday");
        assert!(matches!(parsed(doc), Err(BadReport::BadTime(_))));
    }

    #[test]
    fn times_sort_by_instant() {
        let t = |s: &str| MeasuredAt::parse(s).unwrap_or_else(|| panic!("{s}"));
        assert!(t("2026-12-07T01:02:03Z") < t("2026-12-07T01:02:03.5Z"));
        assert!(t("2026-12-07T01:02:03.5Z") < t("2026-12-07T01:02:03.500001Z"));
        assert_eq!(
            t("2026-12-07T01:02:03+00:00"),
            t("2026-12-07T01:02:03.000Z")
        );
        assert!(t("2026-12-06T23:59:59Z") < t("2026-12-07T00:00:00Z"));
        for bad in [
            "2026-12-07 01:02:03Z",
            "2026-12-07T01:02:03",
            "2026-12-07T01:02:03+01:00",
            "2026-12-07T01:02:3Z",
            "2026-12-07T01:02:03.Z1",
        ] {
            assert!(MeasuredAt::parse(bad).is_none(), "{bad}");
        }
    }
}
