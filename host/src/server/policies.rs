//! Policies inside `hunch serve`: the engine, the registry over `--policies DIR`, the watcher,
//! and the `/v1/policies` routes, with reads going to the app's gated readers (the same bounded
//! queue and metrics as the raw API).

use crate::api::policies::{router, PolicyApi};
use crate::api::AppState;
use crate::config::PolicyEngineSettings;
use crate::policy::bundle::{BundleSettings, BundleSync};
use crate::policy::rollout::shadow::ShadowRunner;
use crate::policy::{build_engine, watch, Capacity, PolicyWatcher, ReaderSource, Registry};
use crate::reader::{Priority, DEFAULT_ALIAS};
use anyhow::Context;
use axum::Router;
use hunch_core::Reader;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

/// The app's readers, known once the app state exists (after the policies have loaded).
#[derive(Default)]
pub struct AppReaders(OnceLock<AppState>);

impl ReaderSource for AppReaders {
    /// The gated reader behind the server's answer cache (when on): the registry wraps it in
    /// the decision's recorder, so cached answers are recorded too.
    fn reader(&self, name: Option<&str>) -> Option<Arc<dyn Reader>> {
        let state = self.0.get()?;
        let gated = state.reader(name.unwrap_or(DEFAULT_ALIAS)).ok()?;
        Some(state.answering.reader(Arc::new(gated)))
    }

    /// A shadow run's reads are admitted at background priority: after every waiting live read,
    /// never in the live queue.
    fn shadow_reader(&self, name: Option<&str>) -> Option<Arc<dyn Reader>> {
        let state = self.0.get()?;
        let gated = state.reader(name.unwrap_or(DEFAULT_ALIAS)).ok()?;
        Some(
            state
                .answering
                .reader(Arc::new(gated.with_priority(Priority::Background))),
        )
    }

    fn answering(&self) -> hunch_core::AnswerSettings {
        self.0
            .get()
            .map(|state| state.answering.clone())
            .unwrap_or_default()
    }

    fn calibration(&self) -> Option<Arc<crate::calibration::file::Calibrations>> {
        self.0.get().and_then(|state| state.calibration.current())
    }
}

pub struct PolicyService {
    registry: Arc<Registry>,
    readers: Arc<AppReaders>,
    admin_key: Option<String>,
    shadows: Arc<ShadowRunner>,
    _watcher: Option<PolicyWatcher>,
    /// With `--bundle-url`: the bundle that owns the policy set, and its poller.
    bundle: Option<(Arc<BundleSync>, tokio::task::JoinHandle<()>)>,
}

impl Drop for PolicyService {
    fn drop(&mut self) {
        if let Some((_, poller)) = &self.bundle {
            poller.abort();
        }
    }
}

impl PolicyService {
    /// Builds the engine, loads every policy of `dir` and starts watching it; or, with a
    /// bundle, restores the persisted bundle and starts polling its URL (the directory is then
    /// neither loaded nor watched: the bundle owns the set).
    pub async fn start(
        dir: Option<PathBuf>,
        admin_key: Option<String>,
        settings: &PolicyEngineSettings,
        bundle: Option<&BundleSettings>,
    ) -> anyhow::Result<Self> {
        let engine = build_engine(&settings.engine())?;
        if let Some(bundle) = bundle {
            if let Some(d) = &dir {
                tracing::warn!(dir = %d.display(), url = bundle.url, "a policy bundle owns the policies: the policy directory is neither loaded nor watched");
            }
            let readers = Arc::new(AppReaders::default());
            let registry = Registry::bundle_owned(
                engine,
                settings.ceiling(),
                readers.clone(),
                Capacity::split(settings.pool, settings.shadow_runs),
            );
            let sync = Arc::new(
                BundleSync::new(bundle, registry.clone())
                    .context("cannot follow the policy bundle")?,
            );
            // Before the server listens and before the first poll: a replica restarted while
            // the bundle server is down serves its last good revision.
            sync.restore().await;
            let poller = sync.clone().spawn();
            tracing::info!(url = bundle.url, poll = ?bundle.poll, "following the policy bundle");
            let shadows =
                Arc::new(ShadowRunner::start().context("cannot start the shadow-run thread")?);
            return Ok(PolicyService {
                registry,
                readers,
                admin_key,
                shadows,
                _watcher: None,
                bundle: Some((sync, poller)),
            });
        }
        if let Some(d) = &dir {
            std::fs::create_dir_all(d)
                .with_context(|| format!("cannot create the policy directory {}", d.display()))?;
        }
        let readers = Arc::new(AppReaders::default());
        let registry = Registry::new(
            engine,
            dir.clone(),
            settings.ceiling(),
            readers.clone(),
            Capacity::split(settings.pool, settings.shadow_runs),
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
        let shadows =
            Arc::new(ShadowRunner::start().context("cannot start the shadow-run thread")?);
        Ok(PolicyService {
            registry,
            readers,
            admin_key,
            shadows,
            _watcher: watcher,
            bundle: None,
        })
    }

    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// The `/v1/policies` routes; from now on policy reads use `state`'s readers.
    pub fn routes(self, state: &AppState) -> Router<AppState> {
        let _ = self.readers.0.set(state.clone());
        state.metrics.add_source(self.registry.rollouts().clone());
        let bundle_status = self.bundle.as_ref().map(|(sync, _)| sync.status().clone());
        if let Some(status) = &bundle_status {
            state.metrics.add_source(status.clone());
        }
        state.served_policies.serve(self.registry.clone());
        state
            .console
            .serve_policies(crate::api::console::PolicySources {
                registry: self.registry.clone(),
                bundle: bundle_status.clone(),
            });
        let api = Arc::new(PolicyApi {
            registry: self.registry.clone(),
            admin_key: self.admin_key.clone(),
            decisions: state.decisions.clone(),
            shadows: self.shadows.clone(),
        });
        // The watcher lives as long as the routes (the server's lifetime).
        let service = Arc::new(self);
        router(api)
            .merge(crate::api::status::router(bundle_status))
            .layer(axum::Extension(service))
    }
}
