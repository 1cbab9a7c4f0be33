//! `GET /v1/models/NAME/quality`: the newest quality report of the model's current fingerprint,
//! exactly as `scripts/quality.sh` stored it (docs/quality.md, "Where reports live"). Under the
//! same `/v1` bearer key as `GET /v1/models`; a 404 says which thing is missing: the model, its
//! fingerprint (not loaded yet, or an upstream's), or a report for it (and the command that
//! makes one).
//!
//! [`reports`] is what the console's models page reads through too, so the two never disagree
//! on which report describes a model.

use super::error::{ApiError, Missing};
use super::AppState;
use crate::quality::{QualityReports, Report, MEASURE_COMMAND};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;

/// The report of `name` (a model or an alias), or the 404 that says why there is none.
pub async fn latest(state: &AppState, name: &str) -> Result<Value, ApiError> {
    let entry = state.model(name)?;
    let Some(fingerprint) = entry.reader.info().fingerprint else {
        return Err(missing(format!(
            "model {} has no fingerprint yet, and a report is matched to a model by its \
             fingerprint: it is not loaded (a model of a --models-dir has none before its first \
             load, by its first read or POST /v1/models/NAME/load; ask again once it is \
             loaded), or it is an --upstream, whose file is never known here",
            entry.name
        )));
    };
    let Some(store) = state.quality.clone() else {
        return Err(missing(format!(
            "no quality reports are kept for model {}: this server has no quality directory \
             (neither --quality-dir, HUNCH_QUALITY_DIR, HUNCH_MODELS_CACHE nor HOME is set)",
            entry.name
        )));
    };
    let folder = store.folder(&fingerprint);
    let found = reports(Some(store), vec![fingerprint.clone()]).await;
    match found.into_values().next() {
        Some(report) => Ok(report.document),
        None => Err(missing(format!(
            "no quality report for model {name} (fingerprint {fingerprint}) in {folder}: \
             measure it with `{command}`, which stores its report there",
            name = entry.name,
            folder = folder.display(),
            command = MEASURE_COMMAND.replace("NAME", &entry.name),
        ))),
    }
}

/// The newest report of each fingerprint that has one, read off the async threads (the files
/// are small, but a slow disk must not hold a worker). Never fails: a bad file is skipped
/// (`QualityReports::latest` logs it), and so is a lookup that could not run.
pub async fn reports(
    store: Option<Arc<QualityReports>>,
    fingerprints: Vec<String>,
) -> HashMap<String, Report> {
    let Some(store) = store else {
        return HashMap::new();
    };
    let read = tokio::task::spawn_blocking(move || {
        fingerprints
            .into_iter()
            .filter_map(|fp| store.latest(&fp).map(|report| (fp, report)))
            .collect::<HashMap<_, _>>()
    });
    read.await.unwrap_or_else(|e| {
        tracing::error!(error = %e, "reading the quality reports failed");
        HashMap::new()
    })
}

fn missing(message: String) -> ApiError {
    ApiError::not_found(Missing::QualityReport, message)
}
