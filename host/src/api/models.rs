//! `GET /v1/models` in TypeSafe's shape: aliases (`jev-latest` first) and the served models, each
//! with the extension `x_fingerprint`: what exactly the model is, as it reports itself (the same
//! fingerprint decision events record and the answer cache keys on; `null` while unknown).
//! A model served by a sidecar this server supervises also says how its process stands
//! (docs/models.md): `x_state` (`loading` with `x_progress` 0–1, `loaded`, `failed` with
//! `x_error` while it restarts), `x_resident_bytes` (measured) and `x_pinned` (a `--model`
//! stays loaded). Once a model has loaded it also says what it is: `x_family`,
//! `x_architecture`, `x_layout`, `x_quantization`, `x_read`, `x_checkpoint_name`. Clients that
//! know only TypeSafe's fields ignore them.

use super::error::ApiError;
use super::AppState;
use crate::reader::sidecar::{Sidecar, SidecarStatus};
use crate::reader::ModelEntry;
use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};
use std::sync::Arc;

/// One entry of the list, under `name` (the model's own, or an alias of it).
fn listed(name: &str, description: String, model: &ModelEntry, sidecars: &[Arc<Sidecar>]) -> Value {
    let info = model.reader.info();
    let mut entry = json!({
        "name": name,
        "description": description,
        "release_date": model.release_date,
        "x_fingerprint": info.fingerprint,
    });
    if let Some(kind) = info.kind {
        kind_fields(&mut entry, kind);
    }
    if let Some(sidecar) = sidecars.iter().find(|s| s.name() == model.name) {
        process_fields(&mut entry, sidecar);
    }
    entry
}

/// What kind of model it is, as the model reported it once loaded: `x_family` (`chat`,
/// `diffusion-gemma`), `x_architecture`, `x_layout`, `x_quantization`, `x_read` and, when the
/// checkpoint names itself, `x_checkpoint_name`.
fn kind_fields(entry: &mut Value, kind: hunch_core::protocol::ModelKind) {
    entry["x_family"] = json!(kind.family);
    entry["x_architecture"] = json!(kind.architecture);
    entry["x_layout"] = json!(kind.layout);
    entry["x_quantization"] = json!(kind.quantization);
    entry["x_read"] = json!(kind.read);
    if let Some(name) = kind.name {
        entry["x_checkpoint_name"] = json!(name);
    }
}

/// What a supervised sidecar's process is doing, and what it holds.
fn process_fields(entry: &mut Value, sidecar: &Sidecar) {
    match sidecar.status() {
        SidecarStatus::Starting => {
            entry["x_state"] = json!("loading");
            entry["x_progress"] = json!(0.0);
        }
        SidecarStatus::Loading { progress, .. } => {
            entry["x_state"] = json!("loading");
            entry["x_progress"] = json!(progress.clamp(0.0, 1.0));
        }
        SidecarStatus::Ready => entry["x_state"] = json!("loaded"),
        SidecarStatus::Down { message } => {
            entry["x_state"] = json!("failed");
            entry["x_error"] = json!(message);
        }
    }
    entry["x_resident_bytes"] = json!(sidecar.resident_bytes());
    // Every sidecar today is a `--model` (or the default model): started with the server and
    // never unloaded.
    entry["x_pinned"] = json!(true);
}

pub async fn list(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let registry = &state.registry;
    let mut models = Vec::new();
    for (alias, target) in registry.aliases() {
        if let Some(m) = registry.resolve(&target) {
            let description = format!("Alias of {}. {}", m.name, m.description)
                .trim_end()
                .to_string();
            models.push(listed(&alias, description, m, &state.sidecars));
        }
    }
    for m in registry.models() {
        models.push(listed(&m.name, m.description.clone(), m, &state.sidecars));
    }
    let mut body = json!({ "models": models });
    if let Some(c) = state.calibration.current() {
        body["x_calibration"] = json!({"id": c.id, "questions": c.len()});
    }
    Ok(Json(body))
}
