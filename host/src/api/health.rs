//! `/healthz` (the process answers) and `/readyz` (every model's reader can take reads, and the
//! server is not draining).

use super::error::ApiError;
use super::AppState;
use axum::extract::State;
use axum::Json;
use serde_json::{json, Map, Value};
use std::time::Duration;

pub async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

pub async fn readyz(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    // First: a draining server is unready whatever its models say, so balancers move on while
    // it finishes what it has (docs/deploy.md, "Draining").
    if state.draining.load(std::sync::atomic::Ordering::SeqCst) {
        return Err(ApiError::Unavailable {
            message: "draining: this server is shutting down".into(),
            retry_after_seconds: 1,
        });
    }
    let mut models = Map::new();
    let mut waiting = Vec::new();
    for entry in state.registry.models() {
        // A reader that cannot say quickly is not ready.
        let ready = tokio::time::timeout(Duration::from_secs(2), entry.reader.ready())
            .await
            .unwrap_or(false);
        if !ready {
            waiting.push(entry.name.clone());
        }
        models.insert(entry.name.clone(), json!(ready));
    }
    // Models of a models directory load on request: being unloaded is not being unready.
    let managed = state.models.as_ref().is_some_and(|m| !m.names().is_empty());
    if state.registry.models().is_empty() && !managed {
        return Err(ApiError::Unavailable {
            message: "no model is configured".into(),
            retry_after_seconds: 5,
        });
    }
    if !waiting.is_empty() {
        return Err(ApiError::Unavailable {
            message: format!("not ready: {}", waiting.join(", ")),
            retry_after_seconds: 2,
        });
    }
    Ok(Json(json!({"status": "ready", "models": models})))
}
