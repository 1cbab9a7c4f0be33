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
        let newer: Health = serde_json::from_str(
            r#"{"state": "draining", "info": {"fingerprint": "f", "limits": {"max_request_bytes": 5}}}"#,
        )
        .unwrap();
        assert_eq!(newer.state, HealthState::Unknown);
        let info = newer.info.unwrap();
        assert_eq!(info.limits.max_request_bytes, Some(5));
        assert_eq!(info.limits.questions, Default::default());
    }
}
