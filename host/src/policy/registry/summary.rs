//! What the registry reports of a policy (`GET /v1/policies`, `GET /v1/policies/NAME`): its
//! serving version, its candidate and their settings, from the registry's entries.

use serde::Serialize;
use serde_json::Value;

use super::{unix_ms, Entry, ReloadStatus};
use crate::calibration::file::Calibrations;
use crate::policy::calibration::ActiveCalibration;
use crate::policy::invoke::LoadedPolicy;
use crate::policy::limits::Limits;

/// What `GET /v1/policies` shows about one policy.
#[derive(Debug, Clone, Serialize)]
pub struct PolicySummary {
    pub name: String,
    /// `None` when no version ever loaded (only a refused one).
    pub version: Option<String>,
    pub loaded_at_ms: Option<u64>,
    pub description: Option<String>,
    /// The policy's own name and version from `describe`.
    pub declared_name: Option<String>,
    pub declared_version: Option<String>,
    pub input_schema: Option<Value>,
    pub output_schema: Option<Value>,
    pub limits: Option<Limits>,
    pub reader: Option<String>,
    pub wasm_bytes: Option<usize>,
    pub last_reload: Option<ReloadStatus>,
    /// `off` without a candidate, else the candidate's `shadow`, `canary` or `off`.
    pub mode: &'static str,
    pub candidate: Option<CandidateSummary>,
    /// The version a rollback would restore.
    pub previous_version: Option<String>,
    /// What the version's reads are calibrated with now.
    pub calibration: Option<ActiveCalibration>,
}

/// What `GET /v1/policies/NAME` shows about a candidate.
#[derive(Debug, Clone, Serialize)]
pub struct CandidateSummary {
    pub version: String,
    pub declared_version: String,
    pub loaded_at_ms: u64,
    pub rollout: crate::policy::rollout::RolloutConfig,
    /// What the candidate's reads are calibrated with (its own `NAME.candidate.toml` may name a
    /// new calibration: how one is shadowed before promotion).
    pub calibration: ActiveCalibration,
}

pub(super) fn summary(name: &str, e: &Entry, server: Option<&Calibrations>) -> PolicySummary {
    let p = e.current.as_ref();
    let candidate = e.candidate.as_ref().map(|c| CandidateSummary {
        version: c.version.clone(),
        declared_version: c.descriptor.version.clone(),
        loaded_at_ms: unix_ms(c.loaded_at),
        rollout: c.rollout.clone(),
        calibration: c.calibration.active(server),
    });
    PolicySummary {
        name: name.to_string(),
        version: p.map(|p| p.version.clone()),
        loaded_at_ms: p.map(|p| unix_ms(p.loaded_at)),
        description: p.map(|p| p.descriptor.description.clone()),
        declared_name: p.map(|p| p.descriptor.name.clone()),
        declared_version: p.map(|p| p.descriptor.version.clone()),
        input_schema: p.map(|p| p.descriptor.input_schema.clone()),
        output_schema: p.map(|p| p.descriptor.output_schema.clone()),
        limits: p.map(|p| p.limits),
        reader: p.and_then(|p| p.reader.clone()),
        wasm_bytes: p.map(|p| p.wasm_bytes),
        last_reload: e.last_reload.clone(),
        mode: e
            .candidate
            .as_ref()
            .map(|c| c.rollout.mode.as_str())
            .unwrap_or("off"),
        candidate,
        previous_version: e.previous.as_ref().map(|p| p.version.clone()),
        calibration: p.map(|p| p.calibration.active(server)),
    }
}

/// `summary` with `version` as the version it describes.
pub(super) fn describe(
    summary: PolicySummary,
    version: &LoadedPolicy,
    server: Option<&Calibrations>,
) -> PolicySummary {
    PolicySummary {
        version: Some(version.version.clone()),
        loaded_at_ms: Some(unix_ms(version.loaded_at)),
        description: Some(version.descriptor.description.clone()),
        declared_name: Some(version.descriptor.name.clone()),
        declared_version: Some(version.descriptor.version.clone()),
        input_schema: Some(version.descriptor.input_schema.clone()),
        output_schema: Some(version.descriptor.output_schema.clone()),
        limits: Some(version.limits),
        reader: version.reader.clone(),
        wasm_bytes: Some(version.wasm_bytes),
        calibration: Some(version.calibration.active(server)),
        ..summary
    }
}
