//! The HTTP front door: the raw System One API, models, health, metrics and the OpenAPI document.
//!
//! [`router`] builds the whole app from an [`AppState`]; [`router_with`] lets another module (the
//! policies) add `/v1/...` routes that get the same auth, timeout, request ids and metrics.

pub mod auth;
pub mod body;
pub mod console;
pub mod decision;
pub mod error;
pub mod health;
pub mod metrics;
pub mod middleware;
pub mod models;
pub mod openapi;
pub mod policies;
pub mod status;
pub mod systemone;
pub mod validate;

use crate::metrics::Metrics;
use crate::reader::{GatedReader, ModelEntry, ReadGate, Registry};
pub use auth::ApiKeys;
use axum::middleware::from_fn_with_state;
use axum::routing::{get, post};
use axum::Router;
use error::ApiError;
use hunch_core::AnswerSettings;
use std::sync::Arc;
use std::time::Duration;
use validate::RequestValidator;

/// Limits every request is held to.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest request body, compressed or decompressed (413 beyond).
    pub max_body_bytes: usize,
    /// Longest a `/v1` request may take (504 beyond).
    pub request_timeout: Duration,
    /// Reads running at once, over all readers.
    pub max_concurrent_reads: usize,
    /// Reads waiting for a slot before new ones are refused with 503.
    pub max_queued_reads: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 8 * 1024 * 1024,
            request_timeout: Duration::from_secs(120),
            max_concurrent_reads: 16,
            max_queued_reads: 64,
        }
    }
}

/// Everything a handler needs. Cheap to clone.
#[derive(Clone, Debug)]
pub struct AppState {
    pub registry: Arc<Registry>,
    pub gate: Arc<ReadGate>,
    pub metrics: Arc<Metrics>,
    pub validator: Arc<RequestValidator>,
    pub keys: Arc<ApiKeys>,
    pub limits: Limits,
    /// The default question mode and the answer cache (API and policies).
    pub answering: AnswerSettings,
    /// Decision ids and events (`crate::decision`); off until the server configures it.
    pub decisions: Arc<crate::decision::DecisionLog>,
    /// The calibration applied to `/v1/systemone` answers (`--calibration`), if any.
    pub calibration: Arc<crate::calibration::serve::CalibrationSlot>,
    /// The policies `/openapi.json` describes, once the policy routes exist.
    pub served_policies: openapi::ServedPolicies,
    /// Set once a shutdown began: `/readyz` answers 503 so balancers send no new work.
    pub draining: Arc<std::sync::atomic::AtomicBool>,
    /// The sidecars this server supervises, for what `/v1/models` says of each one's process.
    pub sidecars: Arc<Vec<Arc<crate::reader::sidecar::Sidecar>>>,
    /// The operator console's sessions, admin key and policy sources (`/console`).
    pub console: Arc<console::Console>,
    /// `--memory-limit`: what the console draws the models' memory against when set.
    pub memory_limit: Option<u64>,
}

impl AppState {
    pub fn new(
        registry: Registry,
        limits: Limits,
        keys: ApiKeys,
    ) -> Result<Self, validate::SchemaError> {
        let metrics = Arc::new(Metrics::new());
        Ok(AppState {
            registry: Arc::new(registry),
            gate: Arc::new(ReadGate::new(
                limits.max_concurrent_reads,
                limits.max_queued_reads,
                metrics.clone(),
            )),
            metrics,
            validator: Arc::new(RequestValidator::new()?),
            keys: Arc::new(keys),
            limits,
            answering: AnswerSettings::default(),
            decisions: crate::decision::DecisionLog::disabled(),
            calibration: Default::default(),
            served_policies: openapi::ServedPolicies::default(),
            draining: Arc::default(),
            sidecars: Arc::default(),
            console: Arc::default(),
            memory_limit: None,
        })
    }

    /// The same state with another question mode and answer cache.
    pub fn with_answering(mut self, answering: AnswerSettings) -> Self {
        self.answering = answering;
        self
    }

    /// The model a request names (a name or an alias), or a 404 listing what is served.
    pub fn model(&self, name: &str) -> Result<&ModelEntry, ApiError> {
        self.registry.resolve(name).ok_or_else(|| {
            let mut known: Vec<String> = self
                .registry
                .aliases()
                .into_iter()
                .map(|(a, _)| a)
                .collect();
            known.extend(self.registry.models().iter().map(|m| m.name.clone()));
            ApiError::not_found(
                error::Missing::Model,
                format!("unknown model {name:?}; served: {}", known.join(", ")),
            )
        })
    }

    /// The reader for a model, behind the bounded queue and counted in the metrics: what the raw
    /// API and the policies call.
    pub fn reader(&self, name: &str) -> Result<GatedReader, ApiError> {
        let entry = self.model(name)?;
        Ok(GatedReader::new(
            entry,
            self.gate.clone(),
            self.metrics.clone(),
        ))
    }
}

/// The whole app.
pub fn router(state: AppState) -> Router {
    router_with(state, Router::new())
}

/// The whole app with `extra` routes (e.g. `/v1/policies/...`) merged under the same `/v1` layers
/// (auth, per-request timeout) and the app-wide ones (request id, metrics, logs). The console
/// (`/console`) has its own gate (sessions, not bearer keys) under the app-wide layers.
pub fn router_with(state: AppState, extra: Router<AppState>) -> Router {
    let v1 = Router::new()
        .route("/v1/systemone", post(systemone::handle))
        .route("/v1/models", get(models::list))
        .merge(extra)
        .route_layer(from_fn_with_state(state.clone(), middleware::timeout))
        .route_layer(from_fn_with_state(state.clone(), middleware::auth));
    Router::new()
        .merge(v1)
        .merge(console::router(state.clone()))
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(metrics::metrics))
        .route("/openapi.json", get(openapi::openapi))
        .fallback(not_found)
        .layer(from_fn_with_state(state.clone(), middleware::observe))
        .with_state(state)
}

async fn not_found(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::not_found(
        error::Missing::Route,
        format!("no route {method} {}", uri.path()),
    )
}
