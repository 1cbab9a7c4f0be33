//! The decision event: one JSON object per decision, the unit every sink writes and `hunch
//! replay` reads. Field meanings are documented in `docs/decision-records.md`.

use hunch_core::{LabelDistribution, Question, ReadError, ReadOptions, ReadStats, Usage};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::time::{SystemTime, UNIX_EPOCH};

/// One decision, as written to the log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecisionEvent {
    pub decision_id: String,
    /// The id the server answered with (`x-typesafe-request-id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// The client's own `x-request-id`, when it sent a plain one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_request_id: Option<String>,
    /// RFC 3339, UTC, milliseconds: when the decision started.
    pub timestamp: String,
    /// The route template (`/v1/systemone`, `/v1/policies/{name}`).
    pub route: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyRef>,
    /// For a candidate run beside the active version: the active decision's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow_of: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelRef>,
    /// [`hunch_core::READ_ALGORITHM_VERSION`] of the server that wrote the event.
    pub read_algorithm: String,
    /// The input after masking (`null` when the request body was not JSON).
    #[serde(default)]
    pub input: Value,
    /// JSON pointers (`/input/...`, `/result/...`) whose values were replaced by `"<masked>"`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub masked: Vec<String>,
    /// JSON pointers whose values were removed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub erased: Vec<String>,
    /// Every model read the decision made, in the order they completed.
    #[serde(default)]
    pub reads: Vec<ReadEvent>,
    /// The decision (a policy's output, or the System One response body).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorRecord>,
    /// The HTTP status the decision was answered with.
    pub status: u16,
    #[serde(default)]
    pub usage: Usage,
    #[serde(default)]
    pub timings: EventTimings,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub limits_hit: Vec<LimitHit>,
}

/// Which policy version decided.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyRef {
    pub name: String,
    /// The served version (content hash prefix).
    pub version: String,
    /// sha256 of the component, hex.
    pub sha256: String,
    /// The version the policy declares about itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub declared_version: Option<String>,
    /// `active` or `candidate`.
    pub stage: String,
}

/// Which model answered the reads, and what exactly it was.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelRef {
    pub name: String,
    /// The fingerprint the model reported ([`hunch_core::ReaderInfo`]): `null` when unknown.
    #[serde(default, deserialize_with = "fingerprint_or_unknown")]
    pub fingerprint: Option<String>,
}

/// A fingerprint as logs spell it: a string, or anything else (`null`, or the object that logs
/// written before the sidecar owned model identity hold) read as unknown, so old logs replay.
fn fingerprint_or_unknown<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<String>, D::Error> {
    Ok(match Value::deserialize(deserializer)? {
        Value::String(s) => Some(s),
        _ => None,
    })
}

/// One read: the request as the model saw it and everything it answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReadEvent {
    /// The state text; absent when the server or the policy leaves state text out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// sha256 of the state text, hex: always present, what replay matches on.
    pub state_sha256: String,
    /// The questions as rendered for the model (no caller ids).
    pub questions: Vec<Question>,
    /// Seed, draws and read mode as asked.
    #[serde(default)]
    pub options: ReadOptions,
    /// One distribution per question, in the questions' order; absent when the read failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distributions: Option<Vec<LabelDistribution>>,
    #[serde(default)]
    pub usage: Usage,
    /// Draws, tokens, cache use and the model-side timings.
    #[serde(default)]
    pub stats: ReadStats,
    /// Wall time of the read, queue wait included.
    pub elapsed_ms: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ReadError>,
}

/// Why a decision was not made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorRecord {
    /// The error type clients saw (`limit_exceeded`, `policy_trapped`, `validation_error`, …).
    pub kind: String,
    pub message: String,
}

/// A limit the decision ran into.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LimitHit {
    pub limit: String,
    /// The limit's value, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EventTimings {
    pub total_ms: f64,
    /// Wall time spent in reads.
    pub read_ms: f64,
}

/// sha256 of `bytes`, lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `t` as RFC 3339 in UTC with milliseconds (`2026-11-30T09:58:01.123Z`).
pub fn rfc3339_ms(t: SystemTime) -> String {
    let ms = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    let (days, rem) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    let (y, m, d) = civil_from_days(days);
    let (h, min, s, milli) = (
        rem / 3_600_000,
        rem / 60_000 % 60,
        rem / 1000 % 60,
        rem % 1000,
    );
    format!("{y:04}-{m:02}-{d:02}T{h:02}:{min:02}:{s:02}.{milli:03}Z")
}

/// Proleptic Gregorian (year, month, day) of a day count since 1970-01-01 (H. Hinnant's
/// algorithm).
pub fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn timestamps_are_rfc3339_utc_with_milliseconds() {
        assert_eq!(rfc3339_ms(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let t = UNIX_EPOCH + Duration::from_millis(1_796_032_681_123);
        assert_eq!(rfc3339_ms(t), "2026-11-30T09:58:01.123Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(&rfc3339_ms(leap)[..10], "2000-02-29");
    }

    #[test]
    fn an_event_survives_a_round_trip() {
        let e = DecisionEvent {
            decision_id: "d".into(),
            request_id: Some("r".into()),
            client_request_id: None,
            timestamp: rfc3339_ms(SystemTime::now()),
            route: "/v1/systemone".into(),
            policy: None,
            shadow_of: None,
            model: Some(ModelRef {
                name: "m".into(),
                fingerprint: Some("0123/mlx-cpu/float32/read-2".into()),
            }),
            read_algorithm: hunch_core::READ_ALGORITHM_VERSION.into(),
            input: serde_json::json!({"a": 1}),
            masked: vec![],
            erased: vec![],
            reads: vec![],
            result: Some(serde_json::json!({"ok": true})),
            error: None,
            status: 200,
            usage: Usage::default(),
            timings: EventTimings::default(),
            limits_hit: vec![],
        };
        let text = serde_json::to_string(&e).unwrap();
        assert_eq!(serde_json::from_str::<DecisionEvent>(&text).unwrap(), e);
    }

    #[test]
    fn an_older_logs_object_fingerprint_reads_as_unknown() {
        let old: ModelRef =
            serde_json::from_str(r#"{"name": "m", "fingerprint": {"config_sha256": "x"}}"#)
                .unwrap();
        assert_eq!(old.fingerprint, None);
        let bare: ModelRef = serde_json::from_str(r#"{"name": "m"}"#).unwrap();
        assert_eq!(bare.fingerprint, None);
    }
}
