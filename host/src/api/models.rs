//! `GET /v1/models` in TypeSafe's shape: aliases (`jev-latest` first) and the served models.

use super::error::ApiError;
use super::AppState;
use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

pub async fn list(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let registry = &state.registry;
    let mut models = Vec::new();
    for (alias, target) in registry.aliases() {
        if let Some(m) = registry.resolve(&target) {
            models.push(json!({
                "name": alias,
                "description": format!("Alias of {}. {}", m.name, m.description).trim_end().to_string(),
                "release_date": m.release_date,
            }));
        }
    }
    for m in registry.models() {
        models.push(json!({
            "name": m.name,
            "description": m.description,
            "release_date": m.release_date,
        }));
    }
    let mut body = json!({ "models": models });
    if let Some(c) = state.calibration.current() {
        body["x_calibration"] = json!({"id": c.id, "questions": c.len()});
    }
    Ok(Json(body))
}
