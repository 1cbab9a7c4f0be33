//! `GET /v1/status`: what this replica serves, for fleet tools comparing replicas. Today that is
//! the policy bundle (docs/deploy.md, "Policy bundles"): its revision, when it was activated,
//! the last successful check, the last error and how stale the replica is; `"bundle": null`
//! when the server follows no bundle.

use crate::policy::bundle::BundleStatus;
use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};
use std::sync::Arc;

/// The route, with its own state, ready to merge into the server's router.
pub fn router<S: Clone + Send + Sync + 'static>(bundle: Option<Arc<BundleStatus>>) -> Router<S> {
    Router::new()
        .route("/v1/status", get(status))
        .with_state(bundle)
}

async fn status(State(bundle): State<Option<Arc<BundleStatus>>>) -> Json<Value> {
    Json(json!({ "bundle": bundle.map(|b| b.report()) }))
}
