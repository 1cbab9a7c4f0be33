//! The accelerator sidecar's protocol, owned here so both sides compile against one definition
//! (docs/accelerator-protocol.md): `GET /health` answers [`Health`], `POST /read` takes a
//! [`crate::ReadRequest`] and answers a [`crate::ReadOutcome`] or a [`crate::ReadError`] body.

pub use crate::reader::ModelKind;
use crate::reader::{ReaderInfo, ReaderLimits};
use serde::{Deserialize, Serialize};

pub const HEALTH_PATH: &str = "/health";
pub const READ_PATH: &str = "/read";

/// Where a sidecar is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HealthState {
    Loading,
    Ready,
    Failed,
    /// A state this side does not know yet: treated as not ready, never as an error.
    #[serde(other)]
    Unknown,
}

/// What `GET /health` says.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Health {
    pub state: HealthState,
    #[serde(default)]
    pub model: String,
    /// Load progress in [0, 1].
    #[serde(default)]
    pub progress: f64,
    #[serde(default)]
    pub message: String,
    /// With `state: failed`: the load failed for a reason no retry fixes, the checkpoint's files
    /// or the model's settings (a config key that would change the math, an unknown
    /// architecture, a malformed file, no chat template), so the host answers its reads 4xx
    /// rather than 503. False (and left out) for a failure a retry may fix (I/O, memory, a
    /// crash), and from an older sidecar, which never says.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub refused: bool,
    /// Present once the model is loaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub info: Option<ModelInfo>,
}

/// What a loaded model tells its host: what it can take and what its answers depend on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelInfo {
    /// Changes whenever an answer could: the checkpoint's files, the backend, the activation
    /// dtype, the read settings and the read algorithm's version.
    pub fingerprint: String,
    pub limits: ReaderLimits,
    /// Every BLAS library the sidecar's process has mapped (Linux; empty elsewhere or from an
    /// older sidecar): the record benchmarks keep of what served the matmuls. Not part of the
    /// identity: the fingerprint already names the BLAS chosen.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blas_libraries: Vec<String>,
    /// What kind of model this is (absent from an older sidecar). Descriptive only: the
    /// fingerprint is the identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<ModelKind>,
}

/// What a reader served by a sidecar is: the limits and fingerprint its `/health` reported.
impl From<ModelInfo> for ReaderInfo {
    fn from(info: ModelInfo) -> Self {
        ReaderInfo {
            limits: info.limits,
            fingerprint: Some(info.fingerprint),
            kind: info.kind,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_older_or_newer_health_answer_is_understood() {
        let old: Health = serde_json::from_str(r#"{"state": "ready", "model": "m"}"#).unwrap();
        assert_eq!(old.state, HealthState::Ready);
        assert!(old.info.is_none());
        assert!(!old.refused, "an older sidecar's failure is not a refusal");
        let newer: Health = serde_json::from_str(
            r#"{"state": "draining", "info": {"fingerprint": "f", "limits": {"max_request_bytes": 5}}}"#,
        )
        .unwrap();
        assert_eq!(newer.state, HealthState::Unknown);
        let info = newer.info.unwrap();
        assert_eq!(info.limits.max_request_bytes, Some(5));
        assert_eq!(info.limits.questions, Default::default());
        let refused: Health =
            serde_json::from_str(r#"{"state": "failed", "message": "m: k = 1", "refused": true}"#)
                .unwrap();
        assert_eq!(refused.state, HealthState::Failed);
        assert!(refused.refused);
    }

    #[test]
    fn refused_is_written_only_when_true() {
        let mut health = Health {
            state: HealthState::Failed,
            model: "m".into(),
            progress: 0.0,
            message: "out of memory".into(),
            refused: false,
            info: None,
        };
        let written = serde_json::to_value(&health).unwrap();
        assert!(written.get("refused").is_none(), "{written}");
        health.refused = true;
        let written = serde_json::to_value(&health).unwrap();
        assert_eq!(written["refused"], true);
        let back: Health = serde_json::from_value(written).unwrap();
        assert_eq!(back, health);
    }
}
