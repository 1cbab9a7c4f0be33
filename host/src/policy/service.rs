//! Policies inside `hunch serve`: the engine, the registry over `--policies DIR`, the watcher,
//! and the `/v1/policies` routes, with reads going to the app's gated readers (the same bounded
//! queue and metrics as the raw API).

use crate::api::policies::{router, PolicyApi};
use crate::api::AppState;
use crate::policy::{
    build_engine, watch, EngineSettings, Limits, PolicyWatcher, ReaderSource, Registry,
};
use crate::reader::DEFAULT_ALIAS;
use anyhow::Context;
use axum::Router;
use hunch_core::Reader;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

/// The app's readers, known once the app state exists (after the policies have loaded).
#[derive(Default)]
pub struct AppReaders(OnceLock<AppState>);

impl ReaderSource for AppReaders {
    fn reader(&self, name: Option<&str>) -> Option<Arc<dyn Reader>> {
        let state = self.0.get()?;
        let gated = state.reader(name.unwrap_or(DEFAULT_ALIAS)).ok()?;
        Some(Arc::new(gated))
    }

    fn answering(&self) -> crate::reader::AnswerSettings {
        self.0
            .get()
            .map(|state| state.answering.clone())
            .unwrap_or_default()
    }
}

pub struct PolicyService {
    registry: Arc<Registry>,
    readers: Arc<AppReaders>,
    admin_key: Option<String>,
    _watcher: Option<PolicyWatcher>,
}

impl PolicyService {
    /// Builds the engine, loads every policy of `dir` and starts watching it.
    pub async fn start(dir: Option<PathBuf>, admin_key: Option<String>) -> anyhow::Result<Self> {
        let settings = EngineSettings::default();
        let engine = build_engine(&settings)?;
        if let Some(d) = &dir {
            std::fs::create_dir_all(d)
                .with_context(|| format!("cannot create the policy directory {}", d.display()))?;
        }
        let readers = Arc::new(AppReaders::default());
        let registry = Registry::new(
            engine,
            dir.clone(),
            Limits::default(),
            readers.clone(),
            settings.max_concurrent,
        );
        let mut watcher = None;
        if let Some(d) = &dir {
            for (name, result) in registry.scan().await {
                match result {
                    Ok(_) => tracing::info!(policy = name, "policy loaded"),
                    Err(e) => tracing::warn!(policy = name, error = %e, "policy refused"),
                }
            }
            watcher = Some(watch(registry.clone())?);
            tracing::info!(dir = %d.display(), policies = registry.summaries().len(), "watching policies");
        }
        Ok(PolicyService {
            registry,
            readers,
            admin_key,
            _watcher: watcher,
        })
    }

    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// The `/v1/policies` routes; from now on policy reads use `state`'s readers.
    pub fn routes(self, state: &AppState) -> Router<AppState> {
        let _ = self.readers.0.set(state.clone());
        state.served_policies.serve(self.registry.clone());
        let api = Arc::new(PolicyApi {
            registry: self.registry.clone(),
            admin_key: self.admin_key.clone(),
            decisions: state.decisions.clone(),
            shadows: Arc::default(),
        });
        // The watcher lives as long as the routes (the server's lifetime).
        let service = Arc::new(self);
        router(api).layer(axum::Extension(service))
    }
}
