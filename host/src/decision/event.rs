//! The decision event: one JSON object per decision, the unit every sink writes and `hunch
//! replay` reads. Field meanings are documented in `docs/decision-records.md`.

use hunch_core::{
    LabelDistribution, Question, QuestionId, ReadError, ReadOptions, ReadStats, Usage,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

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
    /// The policy bundle revision the deciding version came with (docs/deploy.md, "Policy
    /// bundles"); absent for a policy not served from a bundle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundle_revision: Option<String>,
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
    /// The id (sha256 of the file) of the calibration applied to this decision's answers;
    /// absent when none was (docs/calibration.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration: Option<String>,
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
    /// The caller's id of each question (the `/v1/systemone` request's, or the one a policy gave
    /// it), in the questions' order: what labels name an answer by (docs/calibration.md). Absent
    /// in logs written before it was recorded, and for a read made outside a question set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub question_ids: Vec<QuestionId>,
    /// Seed, draws and read mode as asked.
    #[serde(default)]
    pub options: ReadOptions,
    /// One distribution per question, in the questions' order; absent when the read failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distributions: Option<Vec<LabelDistribution>>,
    /// With a calibration applied: per question, the calibrated distribution the answer was
    /// computed from (`null` for a question the calibration does not cover). `distributions`
    /// stays the raw one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibrated: Option<Vec<Option<LabelDistribution>>>,
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
    pub kind: FailureKind,
    pub message: String,
}

/// Every kind of failure a decision can end in: the `error_type` its client saw. The API's
/// errors, the policy runtime's and the readers' each name theirs through a `kind()`; this enum
/// is the one vocabulary, so an event never carries a kind recovered from a message or a body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// The request does not follow the contract (422).
    ValidationError,
    /// The body could not be read or decoded (400).
    InvalidBody,
    /// A policy request's body is not JSON (400).
    InvalidJson,
    /// A query string the route cannot read (400).
    InvalidQuery,
    /// Beyond a limit of the model or of the server (400, 413).
    RequestTooLarge,
    /// Missing or wrong key (401).
    AuthenticationError,
    /// Deployments over HTTP are disabled (403).
    Forbidden,
    ModelNotFound,
    NotFound,
    /// A stage change the policy's stages do not allow (409).
    Conflict,
    /// A change of one policy where a policy bundle owns the set (409).
    BundleOwned,
    UnsupportedContentEncoding,
    /// An upstream System One server refused the request (its 4xx).
    UpstreamRejected,
    /// Loading, restarting, overloaded, or the required decision log cannot take the event (503).
    Unavailable,
    /// A model that can never fit the memory budget (507).
    InsufficientMemory,
    Timeout,
    InternalError,
    /// A policy's input breaks its input schema (422).
    InvalidInput,
    /// A policy broke one of its limits ([`Limit`]).
    LimitExceeded,
    PolicyTrapped,
    PolicyForbiddenCapability,
    /// `decide` returned a `policy-error`.
    PolicyDeclined,
    PolicyInvalidOutput,
    /// A deployment named a policy with a name that cannot be a file stem.
    InvalidName,
    /// A deployed component or its configuration was refused at load.
    PolicyRefused,
    InvalidConfig,
    InvalidStage,
    /// A kind this version does not know (an event written by a newer server).
    #[serde(other)]
    Unknown,
}

impl FailureKind {
    /// The snake_case name clients see as `error_type`.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::ValidationError => "validation_error",
            FailureKind::InvalidBody => "invalid_body",
            FailureKind::InvalidJson => "invalid_json",
            FailureKind::InvalidQuery => "invalid_query",
            FailureKind::RequestTooLarge => "request_too_large",
            FailureKind::AuthenticationError => "authentication_error",
            FailureKind::Forbidden => "forbidden",
            FailureKind::ModelNotFound => "model_not_found",
            FailureKind::NotFound => "not_found",
            FailureKind::Conflict => "conflict",
            FailureKind::BundleOwned => "bundle_owned",
            FailureKind::UnsupportedContentEncoding => "unsupported_content_encoding",
            FailureKind::UpstreamRejected => "upstream_rejected",
            FailureKind::Unavailable => "unavailable",
            FailureKind::InsufficientMemory => "insufficient_memory",
            FailureKind::Timeout => "timeout",
            FailureKind::InternalError => "internal_error",
            FailureKind::InvalidInput => "invalid_input",
            FailureKind::LimitExceeded => "limit_exceeded",
            FailureKind::PolicyTrapped => "policy_trapped",
            FailureKind::PolicyForbiddenCapability => "policy_forbidden_capability",
            FailureKind::PolicyDeclined => "policy_declined",
            FailureKind::PolicyInvalidOutput => "policy_invalid_output",
            FailureKind::InvalidName => "invalid_name",
            FailureKind::PolicyRefused => "policy_refused",
            FailureKind::InvalidConfig => "invalid_config",
            FailureKind::InvalidStage => "invalid_stage",
            FailureKind::Unknown => "unknown",
        }
    }
}

impl std::fmt::Display for FailureKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which limit a decision ran into: a policy's (fuel … output size) or the request's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Limit {
    Fuel,
    Timeout,
    Memory,
    Stack,
    Reads,
    Questions,
    StateSize,
    OutputSize,
    /// The server's `--max-body-bytes`.
    MaxBodyBytes,
    /// A limit of the model (prompt length, labels per question, questions per read).
    ModelSize,
    /// A kind this version does not know (an event written by a newer server).
    #[serde(other)]
    Unknown,
}

impl Limit {
    pub fn as_str(self) -> &'static str {
        match self {
            Limit::Fuel => "fuel",
            Limit::Timeout => "timeout",
            Limit::Memory => "memory",
            Limit::Stack => "stack",
            Limit::Reads => "reads",
            Limit::Questions => "questions",
            Limit::StateSize => "state_size",
            Limit::OutputSize => "output_size",
            Limit::MaxBodyBytes => "max_body_bytes",
            Limit::ModelSize => "model_size",
            Limit::Unknown => "unknown",
        }
    }
}

/// A limit the decision ran into.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LimitHit {
    pub limit: Limit,
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

pub use hunch_core::date::rfc3339_ms;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_survives_a_round_trip() {
        let e = DecisionEvent {
            decision_id: "d".into(),
            request_id: Some("r".into()),
            client_request_id: None,
            timestamp: rfc3339_ms(std::time::SystemTime::now()),
            route: "/v1/systemone".into(),
            policy: None,
            shadow_of: None,
            bundle_revision: None,
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
            calibration: Some("c".into()),
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
