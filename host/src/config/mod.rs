//! `hunch` command line, environment and TOML file, resolved into one [`Settings`].
//!
//! Every `hunch serve` setting has a flag, a `HUNCH_*` environment variable and a TOML key
//! ([`SETTINGS`]). Precedence, for every setting alike: the flag over the variable over the
//! file's key over the default; the source that sets a setting decides its whole value (lists
//! are not merged across sources). Models are registered sidecars (`models`) first, then
//! `accelerators`, then `upstreams`; the first is the default (`jev-latest`). With none, the
//! [`Fallback`] decides: the default model, the demo or nothing ([`default_model`]).

mod args;
pub mod bundle;
pub mod decision_log;
pub mod default_model;
mod layer;
pub mod model_budget;
pub mod model_path;
mod parse;
#[cfg(test)]
mod precedence;

pub(crate) use args::parse_switch;
pub use args::ServeArgs;
pub use default_model::{DefaultModel, Fallback};
pub use layer::{FileAccelerator, FileModel, FileUpstream, Layer, CONFIG_ENV, SETTINGS};
pub use model_path::{check_model_path, model_name_of_path, ModelPathError};

use crate::api::Limits;
use crate::reader::sidecar::SIDECAR_BIN;
use std::path::PathBuf;
use std::time::Duration;

/// Where a model's reads go.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// A sidecar this server starts and supervises, on a checkpoint directory or a `.gguf` file.
    Sidecar { path: PathBuf },
    /// A sidecar started elsewhere.
    Accelerator { url: String },
    /// Another System One server.
    Upstream {
        url: String,
        remote_model: String,
        key: Option<String>,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelSource {
    /// `None` for an `--accelerator URL` whose name is asked from its `/health`.
    pub name: Option<String>,
    pub description: Option<String>,
    pub release_date: Option<String>,
    pub source: Source,
}

/// Recent decisions the console keeps when `--console-decisions` is not given.
pub const DEFAULT_CONSOLE_DECISIONS: usize = 200;

/// Everything `hunch serve` needs, resolved.
#[derive(Debug, Clone)]
pub struct Settings {
    pub listen: String,
    pub limits: Limits,
    pub api_keys: Vec<String>,
    pub models: Vec<ModelSource>,
    pub aliases: Vec<(String, String)>,
    /// `--chat-template NAME=TEMPLATE`: a `--model`'s chat template in place of its own.
    pub chat_templates: Vec<(String, String)>,
    /// `--upstream-ca-file`: trusted for every `https://` upstream.
    pub upstream_ca_file: Option<PathBuf>,
    /// The sidecar binary (`--accelerator-bin`, else `hunch-accelerator` next to `hunch`).
    pub accelerator_bin: PathBuf,
    pub sidecar_args: Vec<String>,
    /// `--memory-limit` in bytes, passed to every sidecar this server starts.
    pub memory_limit: Option<u64>,
    /// `--cpu-isa`, passed to every sidecar this server starts (they check it).
    pub cpu_isa: Option<String>,
    pub shutdown_grace: Duration,
    /// `--drain-delay`: unready but still serving, after SIGTERM.
    pub drain_delay: Duration,
    /// What is served when no model is configured.
    pub fallback: Fallback,
    /// `--policies DIR`.
    pub policies: Option<PathBuf>,
    /// `--calibration FILE`.
    pub calibration: Option<PathBuf>,
    /// `--quality-dir`, else `quality/` beside the models cache; `None` when there is neither
    /// (no `HOME`): no report is then found.
    pub quality_dir: Option<PathBuf>,
    /// `--admin-key`: deployments over HTTP and the console's actions.
    pub admin_key: Option<String>,
    /// `--console-decisions`: recent decisions kept for the console (0: none).
    pub console_decisions: usize,
    /// The default question mode (`--questions`).
    pub questions: hunch_core::QuestionMode,
    /// The default remedies (`--prior`, `--order`).
    pub prior: hunch_core::PriorMode,
    pub order: hunch_core::OrderMode,
    /// Answer cache bound in bytes (`--answer-cache-mb`); 0 = off.
    pub answer_cache_bytes: u64,
    /// The policy engine: pool, shadow share and ceilings.
    pub policy_engine: PolicyEngineSettings,
    pub decision_log: crate::decision::settings::DecisionLogSettings,
    /// `--bundle-url` and its settings; `None`: policies come from `--policies` or HTTP.
    pub bundle: Option<crate::policy::bundle::BundleSettings>,
    /// `--models-dir`, `--memory-budget`, `--model-ttl`.
    pub model_budget: model_budget::ModelBudgetSettings,
}

/// The policy engine's settings: how many instances run at once, how many of them shadow runs
/// may take, and the ceilings no policy's `NAME.toml` can raise.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyEngineSettings {
    pub pool: u32,
    pub shadow_runs: usize,
    pub max_memory_bytes: u64,
    pub max_stack_bytes: usize,
    pub max_fuel: u64,
}

impl Default for PolicyEngineSettings {
    fn default() -> Self {
        let engine = crate::policy::EngineSettings::default();
        let limits = crate::policy::Limits::default();
        PolicyEngineSettings {
            pool: engine.max_concurrent,
            shadow_runs: 16,
            max_memory_bytes: limits.memory_bytes,
            max_stack_bytes: engine.max_wasm_stack_bytes,
            max_fuel: limits.fuel,
        }
    }
}

impl PolicyEngineSettings {
    fn from_layer(
        pool: Option<u32>,
        shadow_runs: Option<usize>,
        max_memory: Option<hunch_core::size::ByteSize>,
        max_stack: Option<hunch_core::size::ByteSize>,
        max_fuel: Option<u64>,
    ) -> Result<Self, ConfigError> {
        let d = PolicyEngineSettings::default();
        let settings = PolicyEngineSettings {
            pool: pool.unwrap_or(d.pool),
            shadow_runs: shadow_runs.unwrap_or(d.shadow_runs),
            max_memory_bytes: max_memory.map_or(d.max_memory_bytes, |s| s.0),
            max_stack_bytes: max_stack.map_or(d.max_stack_bytes, |s| {
                usize::try_from(s.0).unwrap_or(usize::MAX)
            }),
            max_fuel: max_fuel.unwrap_or(d.max_fuel),
        };
        if settings.pool < 2 {
            return Err(ConfigError::Invalid(
                "policy_pool must be at least 2 (one instance stays free for reloads)".into(),
            ));
        }
        if settings.max_memory_bytes < 64 * 1024 {
            return Err(ConfigError::Invalid(
                "policy_max_memory must be at least 64K (one wasm page)".into(),
            ));
        }
        if settings.max_stack_bytes < 64 * 1024 {
            return Err(ConfigError::Invalid(
                "policy_max_stack must be at least 64K".into(),
            ));
        }
        if settings.max_fuel == 0 {
            return Err(ConfigError::Invalid(
                "policy_max_fuel must be at least 1".into(),
            ));
        }
        Ok(settings)
    }

    /// The engine these settings build (wasmtime's compile cache in its default place).
    pub fn engine(&self) -> crate::policy::EngineSettings {
        crate::policy::EngineSettings {
            max_concurrent: self.pool,
            max_memory_bytes: self.max_memory_bytes,
            max_wasm_stack_bytes: self.max_stack_bytes,
            ..crate::policy::EngineSettings::default()
        }
    }

    /// The ceilings every policy's own limits are capped by.
    pub fn ceiling(&self) -> crate::policy::Limits {
        crate::policy::Limits {
            fuel: self.max_fuel,
            memory_bytes: self.max_memory_bytes,
            ..crate::policy::Limits::default()
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Toml { path: PathBuf, message: String },
    #[error("{0}")]
    Invalid(String),
}

fn seconds(value: f64, what: &str) -> Result<Duration, ConfigError> {
    Duration::try_from_secs_f64(value)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| ConfigError::Invalid(format!("{what} must be a positive number of seconds")))
}

/// `hunch-accelerator` next to the running executable: where a build puts it.
fn sidecar_next_to_this_executable() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join(SIDECAR_BIN)))
        .unwrap_or_else(|| PathBuf::from(SIDECAR_BIN))
}

impl Settings {
    /// The flags, the environment through `env` (the process environment in `hunch serve`) and
    /// the TOML file that either names.
    pub fn resolve(
        args: &ServeArgs,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Settings, ConfigError> {
        let flags = Layer::from_flags(args)?;
        let environment = Layer::from_env(env)?;
        let config = args.config.clone().or_else(|| {
            env(CONFIG_ENV)
                .filter(|v| !v.trim().is_empty())
                .map(PathBuf::from)
        });
        let file = match &config {
            Some(path) => Layer::from_file(path)?,
            None => Layer::default(),
        };
        Self::from_layer(
            flags.over(environment).over(file),
            default_model::models_cache(env),
        )
    }

    /// The settings one merged layer gives, with the defaults for what it leaves unset.
    /// `models_cache` is where the default model is looked for unless `default_model` is set
    /// ([`default_model::models_cache`]), and the quality directory is beside it unless
    /// `quality_dir` is set ([`crate::quality::default_dir`]).
    pub fn from_layer(
        layer: Layer,
        models_cache: Option<PathBuf>,
    ) -> Result<Settings, ConfigError> {
        let decision_log = decision_log::resolve(layer.decision_log.clone())
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        let bundle = bundle::resolve(layer.bundle.clone())?;
        let defaults = Limits::default();
        let limits = Limits {
            max_body_bytes: layer.max_body_bytes.unwrap_or(defaults.max_body_bytes),
            request_timeout: match layer.request_timeout {
                Some(s) => seconds(s, "request_timeout")?,
                None => defaults.request_timeout,
            },
            max_concurrent_reads: layer
                .max_concurrent_reads
                .unwrap_or(defaults.max_concurrent_reads),
            max_queued_reads: layer.max_queued_reads.unwrap_or(defaults.max_queued_reads),
        };
        // A required write that could outlast the request would be answered 504 by the request
        // timeout instead of 503 (retryable, "not recorded") by the decision log; a spool's
        // append, 504 instead of the decision.
        let waits = decision_log.required || decision_log.spool.is_some();
        if waits && decision_log.write_timeout >= limits.request_timeout {
            return Err(ConfigError::Invalid(format!(
                "decision_log.write_timeout ({:?}) must be shorter than request_timeout ({:?})",
                decision_log.write_timeout, limits.request_timeout
            )));
        }
        if limits.max_concurrent_reads == 0 {
            return Err(ConfigError::Invalid(
                "max_concurrent_reads must be at least 1".into(),
            ));
        }
        let shutdown_grace = match layer.shutdown_grace {
            Some(s) => seconds(s, "shutdown_grace")?,
            None => Duration::from_secs(30),
        };
        // 0 is allowed here: no delay, as a process started by hand wants.
        let drain_delay = match layer.drain_delay {
            Some(s) => Duration::try_from_secs_f64(s).map_err(|_| {
                ConfigError::Invalid("drain_delay must be a number of seconds, 0 or more".into())
            })?,
            None => Duration::ZERO,
        };
        let api_keys = layer
            .api_keys
            .unwrap_or_default()
            .into_iter()
            .map(|k| k.trim().to_string())
            .filter(|k| !k.is_empty())
            .collect();

        let quality_dir = layer
            .quality_dir
            .or_else(|| crate::quality::default_dir(models_cache.as_deref()));
        let upstream_key = layer.upstream_key;
        let mut models = Vec::new();
        for m in layer.models.unwrap_or_default() {
            models.push(ModelSource {
                name: Some(m.name.unwrap_or_else(|| model_name_of_path(&m.path))),
                description: m.description,
                release_date: m.release_date,
                source: Source::Sidecar { path: m.path },
            });
        }
        for a in layer.accelerators.unwrap_or_default() {
            models.push(ModelSource {
                name: a.name,
                description: a.description,
                release_date: a.release_date,
                source: Source::Accelerator { url: a.url },
            });
        }
        for u in layer.upstreams.unwrap_or_default() {
            models.push(ModelSource {
                name: Some(u.name.clone()),
                description: u.description,
                release_date: u.release_date,
                source: Source::Upstream {
                    remote_model: u.model.unwrap_or(u.name),
                    url: u.url,
                    key: u.key.or_else(|| upstream_key.clone()),
                },
            });
        }

        Ok(Settings {
            listen: layer.listen.unwrap_or_else(|| "127.0.0.1:8080".to_string()),
            limits,
            api_keys,
            models,
            aliases: layer.aliases.unwrap_or_default().into_iter().collect(),
            chat_templates: layer
                .chat_templates
                .unwrap_or_default()
                .into_iter()
                .collect(),
            upstream_ca_file: layer.upstream_ca_file,
            accelerator_bin: layer
                .accelerator_bin
                .unwrap_or_else(sidecar_next_to_this_executable),
            sidecar_args: layer.sidecar_args.unwrap_or_default(),
            memory_limit: layer.memory_limit.map(|size| size.0),
            cpu_isa: layer.cpu_isa,
            shutdown_grace,
            drain_delay,
            fallback: Fallback::resolve(
                layer.demo,
                layer.no_demo,
                layer.default_model,
                models_cache,
            )?,
            policies: layer.policies,
            calibration: layer.calibration,
            quality_dir,
            admin_key: layer.admin_key.filter(|k| !k.trim().is_empty()),
            console_decisions: layer.console_decisions.unwrap_or(DEFAULT_CONSOLE_DECISIONS),
            questions: layer
                .questions
                .unwrap_or(hunch_core::QuestionMode::Isolated),
            prior: layer.prior.unwrap_or_default(),
            order: layer.order.unwrap_or_default(),
            answer_cache_bytes: layer.answer_cache_mb.unwrap_or(0).saturating_mul(1 << 20),
            policy_engine: PolicyEngineSettings::from_layer(
                layer.policy_pool,
                layer.policy_shadow_runs,
                layer.policy_max_memory,
                layer.policy_max_stack,
                layer.policy_max_fuel,
            )?,
            decision_log,
            bundle,
            model_budget: model_budget::ModelBudgetSettings::resolve(
                layer.models_dirs,
                layer.memory_budget,
                layer.model_ttl,
            ),
        })
    }
}

#[cfg(test)]
mod tests;
