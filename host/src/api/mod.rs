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
pub mod openapi_models;
pub mod openapi_policies;
mod openapi_responses;
pub mod policies;
pub mod quality;
pub mod status;
pub mod systemone;
pub mod validate;

use crate::metrics::Metrics;
use crate::reader::manager::ModelManager;
use crate::reader::{GatedReader, ModelEntry, ReadGate, Registry, DEFAULT_ALIAS};
pub use auth::ApiKeys;
use axum::middleware::from_fn_with_state;
use axum::routing::{any, get, post};
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
    /// The operator console's sessions, admin key and policy sources (`/console`).
    pub console: Arc<console::Console>,
    /// `--memory-limit`: what the console draws the models' memory against when set.
    pub memory_limit: Option<u64>,
    /// The models whose sidecars this server runs (pinned `--model`s and `--models-dir`
    /// discoveries) under one memory budget; `None` when it runs none.
    pub models: Option<Arc<ModelManager>>,
    /// `--admin-key`: loading and unloading models over HTTP.
    pub admin_key: Option<String>,
    /// The quality reports (`--quality-dir`); `None` when no directory is known.
    pub quality: Option<Arc<crate::quality::QualityReports>>,
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
            console: Arc::default(),
            memory_limit: None,
            models: None,
            admin_key: None,
            quality: None,
        })
    }

    /// The same state with another question mode and answer cache.
    pub fn with_answering(mut self, answering: AnswerSettings) -> Self {
        self.answering = answering;
        self
    }

    /// The model a request names (a name or an alias), or a 404 listing what is served. A name
    /// the registry does not know may be a model of a models directory (found by a rescan when
    /// it was just copied in).
    pub fn model(&self, name: &str) -> Result<ModelEntry, ApiError> {
        if let Some(entry) = self.registry.resolve(name) {
            return Ok(entry.clone());
        }
        if let (Some(manager), Some(target)) = (&self.models, self.managed_name(name)) {
            return Ok(discovered_entry(manager, &target));
        }
        let mut known: Vec<String> = self.aliases().into_iter().map(|(a, _)| a).collect();
        known.extend(self.registry.models().iter().map(|m| m.name.clone()));
        if let Some(manager) = &self.models {
            // A hidden model is served by name, never listed, not even here.
            for name in manager.listed_names() {
                if !known.contains(&name) {
                    known.push(name);
                }
            }
        }
        Err(ApiError::not_found(
            error::Missing::Model,
            format!("unknown model {name:?}; served: {}", known.join(", ")),
        ))
    }

    /// The managed model `name` means when the registry does not know it: a discovered model,
    /// or what an alias (`jev-latest` included, with no registry model; or one of a models
    /// directory's settings file) points at.
    fn managed_name(&self, name: &str) -> Option<String> {
        let manager = self.models.as_ref()?;
        let target = match self.registry.alias_target(name) {
            Some(target) => target.to_string(),
            None if name == DEFAULT_ALIAS && self.registry.models().is_empty() => {
                manager.listed_names().into_iter().next()?
            }
            None => manager
                .alias_target(name)
                .unwrap_or_else(|| name.to_string()),
        };
        manager.contains(&target).then_some(target)
    }

    /// Every alias with its target: the registry's, `jev-latest` for the first listed
    /// discovered model when the registry serves none, and those of the models directories'
    /// settings files.
    pub fn aliases(&self) -> Vec<(String, String)> {
        let mut aliases = self.registry.aliases();
        if self.registry.models().is_empty() && !aliases.iter().any(|(a, _)| a == DEFAULT_ALIAS) {
            if let Some(first) = self
                .models
                .as_ref()
                .and_then(|m| m.listed_names().into_iter().next())
            {
                aliases.insert(0, (DEFAULT_ALIAS.to_string(), first));
            }
        }
        if let Some(manager) = &self.models {
            aliases.extend(manager.aliases());
        }
        aliases
    }

    /// The reader for a model, behind the bounded queue and counted in the metrics: what the raw
    /// API and the policies call. A model of the manager is leased before the queue (its load
    /// holds no read slot).
    pub fn reader(&self, name: &str) -> Result<GatedReader, ApiError> {
        let entry = self.model(name)?;
        if let Some(manager) = self.models.as_ref().filter(|m| m.manages(&entry.name)) {
            return Ok(GatedReader::managed(
                &entry.name,
                manager,
                self.gate.clone(),
                self.metrics.clone(),
            ));
        }
        Ok(GatedReader::new(
            &entry,
            self.gate.clone(),
            self.metrics.clone(),
        ))
    }

    /// A model that can never fit the memory budget: the raw API answers 507 before reading.
    pub fn check_fits(&self, model: &str) -> Result<(), ApiError> {
        let Some(manager) = &self.models else {
            return Ok(());
        };
        match manager.check_fits(model) {
            Err(crate::reader::manager::LeaseError::NeverFits {
                model,
                needed,
                budget,
                pinned,
            }) => Err(ApiError::InsufficientStorage {
                model,
                needed_bytes: needed,
                budget_bytes: budget,
                pinned_bytes: pinned,
            }),
            _ => Ok(()),
        }
    }
}

/// A discovered model as the API lists and reads it.
fn discovered_entry(manager: &Arc<ModelManager>, name: &str) -> ModelEntry {
    let path = manager
        .view()
        .model(name)
        .map(|v| v.path.display().to_string())
        .unwrap_or_default();
    ModelEntry {
        name: name.to_string(),
        description: format!("System One reader ({path}), loaded on first request"),
        release_date: hunch_core::date::today(),
        reader: Arc::new(manager.reader(name)),
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
        .route("/v1/models/{*rest}", any(models::admin))
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
