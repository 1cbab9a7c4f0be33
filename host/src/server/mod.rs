//! `hunch serve`: build the readers from [`Settings`], listen, and shut down gracefully (turn
//! unready, keep serving for the drain delay, stop accepting, let in-flight requests finish
//! within the grace period, stop the sidecars, flush the decision log).
//! [`policies`] adds the policy engine, registry, watcher and routes to the server.

pub mod policies;

use crate::api::{router_with, ApiKeys, AppState};
use crate::config::default_model::DEFAULT_MODEL_NAME;
use crate::config::{check_model_path, DefaultModel, Fallback, ModelSource, Settings, Source};
use crate::reader::accelerator::{AcceleratorClient, AcceleratorReader};
use crate::reader::manager::{ManagerSettings, ModelManager};
use crate::reader::models::discovery;
use crate::reader::upstream::{UpstreamConfig, UpstreamReader};
use crate::reader::{ModelEntry, Registry};
use anyhow::Context;
use axum::Router;
use hunch_core::date::today;
use std::sync::Arc;
use std::time::Duration;

/// The line printed on stdout once the server listens (tests and scripts read the port from it).
pub const LISTENING_PREFIX: &str = "HUNCH_LISTENING ";

/// The readers a configuration asks for, and the model manager that runs this server's
/// sidecars (pinned `--model`s and `--models-dir` models), when it runs any.
pub struct Readers {
    pub registry: Registry,
    pub models: Option<Arc<ModelManager>>,
}

/// The name the demo model is served under.
pub const DEMO_MODEL: &str = "hunch-demo";

/// With no model configured and `--demo`, `hunch serve` serves the demo checkpoint (for tests
/// and trying the diffusion read without a real checkpoint): `hunch-accelerator demo` writes it
/// once (deterministic, real HF layout, cached) and prints its directory.
async fn demo_model(settings: &Settings) -> anyhow::Result<ModelSource> {
    let binary = settings.accelerator_bin.clone();
    anyhow::ensure!(
        binary.is_file(),
        "--demo and no sidecar binary at {} to make the demo model (build hunch-accelerator, or \
         set --accelerator-bin / HUNCH_ACCELERATOR_BIN)",
        binary.display()
    );
    let output = tokio::process::Command::new(&binary)
        .arg("demo")
        .output()
        .await
        .with_context(|| format!("running {} demo", binary.display()))?;
    anyhow::ensure!(
        output.status.success(),
        "{} demo failed: {}",
        binary.display(),
        String::from_utf8_lossy(&output.stderr).trim()
    );
    let dir = String::from_utf8_lossy(&output.stdout).trim().to_string();
    tracing::warn!(
        dir = %dir,
        "--demo: serving the DEMO model {DEMO_MODEL}. Its weights are random and its answers \
         carry NO meaning. Serve a real model with --model NAME=PATH (see README)."
    );
    Ok(ModelSource {
        name: Some(DEMO_MODEL.into()),
        description: Some(
            "DEMO: a small random DiffusionGemma; its answers carry no meaning".into(),
        ),
        release_date: None,
        source: Source::Sidecar { path: dir.into() },
    })
}

/// With no model configured and neither `--demo` nor `--no-demo`: the default model, checked
/// here so that a missing file fails start-up with what to run, not a sidecar restart loop.
fn default_model(default: &DefaultModel) -> anyhow::Result<ModelSource> {
    let source = default.source()?;
    let name = source.name.clone().unwrap_or_default();
    let path = default
        .path()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    if name == DEFAULT_MODEL_NAME {
        tracing::info!(
            model = %name,
            path = %path,
            "no model configured: serving the default model {name}, SmolLM2-135M-Instruct, a \
             135M chat model: its answers carry meaning, but weakly. Serve a better model with \
             --model NAME=PATH (see README)."
        );
    } else {
        tracing::info!(model = %name, path = %path, "no model configured: serving the default model {name}");
    }
    Ok(source)
}

/// The models to serve: the configured ones, else what the fallback gives.
async fn models_to_serve(settings: &Settings) -> anyhow::Result<Vec<ModelSource>> {
    if !settings.models.is_empty() {
        return Ok(settings.models.clone());
    }
    Ok(match &settings.fallback {
        // A models directory is what is served then: no default model beside it.
        Fallback::DefaultModel(_) if !settings.model_budget.models_dirs.is_empty() => Vec::new(),
        Fallback::DefaultModel(default) => vec![default_model(default)?],
        Fallback::Demo => vec![demo_model(settings).await?],
        Fallback::Nothing => Vec::new(),
    })
}

/// The arguments every sidecar this server starts gets after its own: `--memory-limit` and
/// `--cpu-isa` when set, then the `--sidecar-arg`s. A `--sidecar-arg` that sets one of them
/// itself wins (the sidecar refuses a flag given twice, so ours is left out).
fn sidecar_args(settings: &Settings) -> Vec<String> {
    let explicit = |flag: &str| {
        settings
            .sidecar_args
            .iter()
            .any(|arg| arg == flag || arg.starts_with(&format!("{flag}=")))
    };
    let limit = settings
        .memory_limit
        .filter(|_| !explicit("--memory-limit"))
        .map(|bytes| format!("--memory-limit={bytes}"));
    let isa = settings
        .cpu_isa
        .as_ref()
        .filter(|_| !explicit("--cpu-isa"))
        .map(|isa| format!("--cpu-isa={isa}"));
    limit
        .into_iter()
        .chain(isa)
        .chain(settings.sidecar_args.iter().cloned())
        .collect()
}

/// Each `--chat-template NAME=TEMPLATE` as the sidecar argument of the `--model` it names; a
/// name that is no `--model` is an error at start, not a template silently unused.
fn chat_template_args(
    settings: &Settings,
    pinned: &[(String, std::path::PathBuf, u64)],
) -> anyhow::Result<std::collections::BTreeMap<String, Vec<String>>> {
    let mut args = std::collections::BTreeMap::new();
    for (name, template) in &settings.chat_templates {
        anyhow::ensure!(
            pinned.iter().any(|(model, _, _)| model == name),
            "--chat-template names {name:?}, which is not a --model (a models directory's model \
             takes `chat_template` in its hunch-models.toml)"
        );
        args.insert(
            name.clone(),
            vec!["--chat-template".to_string(), template.clone()],
        );
    }
    Ok(args)
}

pub async fn build_readers(settings: &Settings) -> anyhow::Result<Readers> {
    let mut registry = Registry::new();
    let models = models_to_serve(settings).await?;
    // A read may take as long as a request may; a little more so the request's own 504 wins.
    let read_timeout = settings.limits.request_timeout + Duration::from_secs(1);
    // Each model in configuration order; a sidecar's reader comes from the manager, made once
    // every name is known (a discovered model may not take a configured model's name).
    let mut served: Vec<(String, String, String, Option<Arc<dyn hunch_core::Reader>>)> = Vec::new();
    let mut pinned = Vec::new();
    for ModelSource {
        name,
        description,
        release_date,
        source,
    } in &models
    {
        let (name, reader): (String, Option<Arc<dyn hunch_core::Reader>>) = match source {
            Source::Sidecar { path } => {
                let name = name.clone().unwrap_or_else(|| "default".into());
                // Fail at startup, not in a restart loop, on what a restart cannot fix. A
                // directory or a file: which checkpoint it is, the sidecar tells by its content.
                check_model_path(path).with_context(|| format!("model {name}"))?;
                pinned.push((
                    name.clone(),
                    path.clone(),
                    discovery::estimate::checkpoint(path),
                ));
                (name, None)
            }
            Source::Accelerator { url } => {
                let probe =
                    AcceleratorClient::new("?", url, read_timeout).map_err(anyhow::Error::msg)?;
                let name = match name {
                    Some(n) => n.clone(),
                    None => probe
                        .health()
                        .await
                        .ok()
                        .map(|h| h.model)
                        .filter(|m| !m.is_empty())
                        .with_context(|| {
                            format!(
                                "cannot ask {url} for its model name; give --accelerator NAME=URL"
                            )
                        })?,
                };
                let client =
                    AcceleratorClient::new(&name, url, read_timeout).map_err(anyhow::Error::msg)?;
                (
                    name.clone(),
                    Some(Arc::new(AcceleratorReader::new(&name, client))),
                )
            }
            Source::Upstream {
                url,
                remote_model,
                key,
            } => {
                let name = name.clone().unwrap_or_else(|| remote_model.clone());
                let reader = UpstreamReader::new(UpstreamConfig {
                    name: name.clone(),
                    url: url.clone(),
                    remote_model: remote_model.clone(),
                    key: key.clone(),
                    timeout: read_timeout,
                    ca_file: settings.upstream_ca_file.clone(),
                })
                .with_context(|| format!("upstream {name}"))?;
                (name, Some(Arc::new(reader)))
            }
        };
        let description = description.clone().unwrap_or_else(|| match source {
            // The family (diffusion or chat model) is the sidecar's to recognise, not ours to name.
            Source::Sidecar { path } => format!("System One reader ({})", path.display()),
            Source::Accelerator { url } => format!("System One reader at {url}"),
            Source::Upstream { url, .. } => format!("System One server at {url}"),
        });
        served.push((
            name,
            description,
            release_date.clone().unwrap_or_else(today),
            reader,
        ));
    }
    let budget = &settings.model_budget;
    let manager = if pinned.is_empty() && budget.models_dirs.is_empty() {
        None
    } else {
        let binary = settings.accelerator_bin.clone();
        anyhow::ensure!(
            binary.is_file(),
            "no sidecar binary at {} to run the models (build hunch-accelerator, or set \
             --accelerator-bin / HUNCH_ACCELERATOR_BIN)",
            binary.display()
        );
        let mut reserved: Vec<String> = served
            .iter()
            .filter(|(_, _, _, reader)| reader.is_some())
            .map(|(name, ..)| name.clone())
            .collect();
        reserved.extend(settings.aliases.iter().map(|(alias, _)| alias.clone()));
        let pinned_total: u64 = pinned.iter().map(|(_, _, bytes)| bytes).sum();
        if pinned_total > budget.budget_bytes {
            tracing::warn!(
                pinned_bytes = pinned_total,
                budget_bytes = budget.budget_bytes,
                "the pinned models (--model) alone are estimated above the memory budget: they \
                 are loaded anyway, and no model of a models directory will fit"
            );
        }
        let manager = ModelManager::new(
            ManagerSettings {
                budget_bytes: budget.budget_bytes,
                models_dirs: budget.models_dirs.clone(),
                ttl: budget.ttl,
                // A read waits for its model's load (or for room) at most this long, leaving its
                // request time to answer 503 + Retry-After before the request's own 504.
                wait: settings
                    .limits
                    .request_timeout
                    .saturating_sub(Duration::from_secs(2))
                    .max(Duration::from_secs(1)),
                binary,
                extra_args: sidecar_args(settings),
                read_timeout,
                reserved,
                model_args: chat_template_args(settings, &pinned)?,
            },
            pinned,
        );
        let view = manager.view();
        tracing::info!(
            budget_bytes = view.budget_bytes,
            models = view.models.len(),
            dirs = ?budget.models_dirs,
            "model manager"
        );
        Some(manager)
    };
    for (name, description, release_date, reader) in served {
        let reader = match (reader, &manager) {
            (Some(reader), _) => reader,
            (None, Some(manager)) => Arc::new(manager.reader(&name)) as Arc<dyn hunch_core::Reader>,
            (None, None) => anyhow::bail!("model {name}: no manager to run its sidecar"),
        };
        registry.add(ModelEntry {
            name,
            description,
            release_date,
            reader,
        })?;
    }
    for (alias, target) in &settings.aliases {
        let managed = manager.as_ref().is_some_and(|m| m.manages(target));
        if managed && registry.resolve(target).is_none() {
            registry.alias_managed(alias, target)?;
        } else {
            registry.alias(alias, target)?;
        }
    }
    Ok(Readers {
        registry,
        models: manager,
    })
}

/// Resolves when SIGTERM or Ctrl-C arrives.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}

/// Serves until a shutdown signal. `extra` builds more routes (e.g. the policies') from the
/// ready state (registry, gated readers, metrics); they are merged under the `/v1` layers.
pub async fn serve_with(
    settings: Settings,
    extra: impl FnOnce(&AppState) -> anyhow::Result<Router<AppState>>,
) -> anyhow::Result<()> {
    serve_until(
        settings,
        extra,
        |addr| println!("{LISTENING_PREFIX}http://{addr}"),
        shutdown_signal(),
    )
    .await
}

/// [`serve_with`], announcing the bound address to `listening` and shutting down gracefully when
/// `shutdown` resolves: how `hunch batch --model DIR` runs the very same server in-process on an
/// ephemeral loopback port.
pub async fn serve_until(
    settings: Settings,
    extra: impl FnOnce(&AppState) -> anyhow::Result<Router<AppState>>,
    listening: impl FnOnce(std::net::SocketAddr),
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let readers = build_readers(&settings).await?;
    if readers.registry.models().is_empty() && readers.models.is_none() {
        tracing::warn!("no model configured: every read will be a 404 (give --model, --accelerator or --upstream)");
    }
    let mut state = AppState::new(
        readers.registry,
        settings.limits.clone(),
        ApiKeys::new(settings.api_keys.clone()),
    )
    .map_err(anyhow::Error::msg)?
    .with_answering(hunch_core::AnswerSettings {
        questions: settings.questions,
        prior: settings.prior,
        order: settings.order,
        cache: (settings.answer_cache_bytes > 0).then(|| {
            std::sync::Arc::new(hunch_core::AnswerCache::new(
                usize::try_from(settings.answer_cache_bytes).unwrap_or(usize::MAX),
            ))
        }),
    });
    tracing::info!(
        questions = settings.questions.as_str(),
        answer_cache_bytes = settings.answer_cache_bytes,
        "answering"
    );
    if let Some(path) = &settings.calibration {
        let bytes = std::fs::read(path)
            .with_context(|| format!("cannot read the calibration {}", path.display()))?;
        let calibrations = crate::calibration::file::Calibrations::from_bytes(&bytes)
            .with_context(|| format!("the calibration {}", path.display()))?;
        tracing::info!(id = %calibrations.id, questions = calibrations.len(), "calibration");
        state.calibration = std::sync::Arc::new(crate::calibration::serve::CalibrationSlot::new(
            Some(calibrations),
        ));
        tokio::spawn(crate::calibration::serve::watch(
            state.calibration.clone(),
            path.clone(),
            std::time::Duration::from_secs(1),
        ));
    }
    state.decisions = crate::decision::DecisionLog::start(settings.decision_log.clone())?;
    state.decisions.keep_recent(settings.console_decisions);
    state.console = Arc::new(crate::api::console::Console::new(
        settings.admin_key.clone(),
    ));
    state.memory_limit = settings.memory_limit;
    state.decisions.set_models(
        state
            .registry
            .models()
            .iter()
            .map(|m| (m.name.clone(), m.reader.clone())),
    );
    state.metrics.add_source(state.decisions.clone());
    if let Some(manager) = &readers.models {
        manager.start();
        state.metrics.add_source(manager.clone());
    }
    state.models = readers.models.clone();
    state.admin_key = settings.admin_key.clone();
    if let Some(dir) = &settings.quality_dir {
        tracing::info!(dir = %dir.display(), "quality reports");
        state.quality = Some(Arc::new(crate::quality::QualityReports::new(dir.clone())));
    }
    for (alias, target) in state.aliases() {
        tracing::info!(%alias, %target, "alias");
    }
    let app = router_with(state.clone(), extra(&state)?);
    let state_decisions = state.decisions.clone();
    let listener = tokio::net::TcpListener::bind(&settings.listen)
        .await
        .with_context(|| format!("cannot listen on {}", settings.listen))?;
    let addr = listener.local_addr()?;
    listening(addr);
    tracing::info!(%addr, auth = state.keys.enabled(), models = state.registry.models().len(), "listening");

    // The drain (docs/deploy.md, "Draining"): on the signal the server turns unready at once and
    // keeps serving for the drain delay (balancers and Kubernetes' endpoints notice unready
    // servers only after a while); then it stops accepting, in-flight requests get the grace
    // period, the sidecars stop, and the decision log is flushed before the process exits.
    let (signalled_tx, signalled_rx) = tokio::sync::oneshot::channel::<()>();
    let draining = state.draining.clone();
    let drain_delay = settings.drain_delay;
    let graceful = axum::serve(listener, app).with_graceful_shutdown(async move {
        shutdown.await;
        draining.store(true, std::sync::atomic::Ordering::SeqCst);
        tracing::info!(
            ?drain_delay,
            "shutting down: unready; still serving for the drain delay"
        );
        tokio::time::sleep(drain_delay).await;
        tracing::info!("shutting down: no new connections; draining in-flight requests");
        let _ = signalled_tx.send(());
    });
    let grace = settings.shutdown_grace;
    let deadline = async move {
        if signalled_rx.await.is_ok() {
            tokio::time::sleep(grace).await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        result = graceful => result.context("server error")?,
        _ = deadline => tracing::warn!(?grace, "grace period over: dropping the requests still in flight"),
    }
    if let Some(manager) = &readers.models {
        manager.stop_all().await;
    }
    state_decisions
        .close(crate::api::decision::SHUTDOWN_GRACE)
        .await;
    tracing::info!("decision log flushed; stopped");
    Ok(())
}

pub async fn serve(settings: Settings) -> anyhow::Result<()> {
    serve_policies_until(
        settings,
        |addr| println!("{LISTENING_PREFIX}http://{addr}"),
        shutdown_signal(),
    )
    .await
}

/// `hunch serve` (models and policies) announcing its address to `listening` and stopping when
/// `shutdown` resolves.
pub async fn serve_policies_until(
    settings: Settings,
    listening: impl FnOnce(std::net::SocketAddr),
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    // Policies load (compile + describe, no reads) before the server listens, so the first
    // request already sees them; their reads go to the app's gated readers once it exists.
    let policies = policies::PolicyService::start(
        settings.policies.clone(),
        settings.admin_key.clone(),
        &settings.policy_engine,
        settings.bundle.as_ref(),
    )
    .await?;
    serve_until(
        settings,
        move |state| Ok(policies.routes(state)),
        listening,
        shutdown,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::sidecar_args;
    use crate::config::{Layer, Settings};

    fn settings(memory_limit: Option<&str>, sidecar: &[&str]) -> Settings {
        let layer = Layer {
            memory_limit: memory_limit.map(|s| s.parse().expect("a size")),
            sidecar_args: Some(sidecar.iter().map(|s| s.to_string()).collect()),
            ..Layer::default()
        };
        Settings::from_layer(layer, None).expect("settings")
    }

    #[test]
    fn the_memory_limit_goes_to_the_sidecar_unless_a_sidecar_arg_sets_it() {
        assert_eq!(
            sidecar_args(&settings(Some("1K"), &["--dtype=bfloat16"])),
            ["--memory-limit=1024", "--dtype=bfloat16"]
        );
        assert_eq!(sidecar_args(&settings(None, &["--queue=2"])), ["--queue=2"]);
        for explicit in [&["--memory-limit=2K"][..], &["--memory-limit", "2K"][..]] {
            assert_eq!(sidecar_args(&settings(Some("1K"), explicit)), explicit);
        }
    }

    #[test]
    fn the_cpu_isa_goes_to_the_sidecar_unless_a_sidecar_arg_sets_it() {
        let with_isa = |isa: &str, sidecar: &[&str]| {
            let mut s = settings(Some("1K"), sidecar);
            s.cpu_isa = Some(isa.to_owned());
            sidecar_args(&s)
        };
        assert_eq!(
            with_isa("avx2", &["--queue=2"]),
            ["--memory-limit=1024", "--cpu-isa=avx2", "--queue=2"]
        );
        assert_eq!(
            with_isa("avx2", &["--cpu-isa", "portable"]),
            ["--memory-limit=1024", "--cpu-isa", "portable"]
        );
    }
}
