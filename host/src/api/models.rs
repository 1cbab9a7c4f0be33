//! `GET /v1/models` in TypeSafe's shape: aliases (`jev-latest` first) and the served models, each
//! with the extension `x_fingerprint`: what exactly the model is, as it reports itself (the same
//! fingerprint decision events record and the answer cache keys on; `null` while unknown).

use super::error::ApiError;
use super::AppState;
use crate::reader::ModelEntry;
use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

/// One entry of the list, under `name` (the model's own, or an alias of it).
fn listed(name: &str, description: String, model: &ModelEntry) -> Value {
    json!({
        "name": name,
        "description": description,
        "release_date": model.release_date,
        "x_fingerprint": model.reader.info().fingerprint,
    })
}

pub async fn list(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let registry = &state.registry;
    let mut models = Vec::new();
    for (alias, target) in registry.aliases() {
        if let Some(m) = registry.resolve(&target) {
            let description = format!("Alias of {}. {}", m.name, m.description)
                .trim_end()
                .to_string();
            models.push(listed(&alias, description, m));
        }
    }
    for m in registry.models() {
        models.push(listed(&m.name, m.description.clone(), m));
    }
    let mut body = json!({ "models": models });
    if let Some(c) = state.calibration.current() {
        body["x_calibration"] = json!({"id": c.id, "questions": c.len()});
    }
    Ok(Json(body))
}
