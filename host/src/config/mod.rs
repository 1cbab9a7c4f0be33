//! `hunch` command line, environment and TOML file, resolved into one [`Settings`].
//!
//! Every `hunch serve` setting has a flag, a `HUNCH_*` environment variable and a TOML key
//! ([`SETTINGS`]). Precedence, for every setting alike: the flag over the variable over the
//! file's key over the default; the source that sets a setting decides its whole value (lists
//! are not merged across sources). Models are registered sidecars (`models`) first, then
//! `accelerators`, then `upstreams`; the first is the default (`jev-latest`). With none, the
//! [`Fallback`] decides: the default model, the demo or nothing ([`default_model`]).

pub mod bundle;
pub mod decision_log;
pub mod default_model;
mod layer;
pub mod model_budget;
pub mod model_path;
mod parse;
#[cfg(test)]
mod precedence;

pub use default_model::{DefaultModel, Fallback};
pub use layer::{FileAccelerator, FileModel, FileUpstream, Layer, CONFIG_ENV, SETTINGS};
pub use model_path::{check_model_path, model_name_of_path, ModelPathError};

use crate::api::Limits;
use crate::reader::sidecar::SIDECAR_BIN;
use clap::Args;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone, Default, Args)]
pub struct ServeArgs {
    /// A TOML file with any of the settings below (env HUNCH_CONFIG). A setting's flag wins over
    /// its environment variable, which wins over the file's key.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Address to listen on (port 0 picks a free port; the address is printed on stdout).
    /// [env HUNCH_LISTEN, TOML `listen`]
    #[arg(long)]
    pub listen: Option<String>,
    /// A model served by an accelerator sidecar this server starts: `NAME=PATH` or `PATH`
    /// (repeatable), PATH a checkpoint directory (Hugging Face, mlx-community, …) or a `.gguf`
    /// file; without NAME, a directory's name or a file's stem, lower-cased. The first model is
    /// also `jev-latest`. [env HUNCH_MODELS, comma-separated; TOML `models`, each `{ name, path }`]
    #[arg(long = "model", value_name = "[NAME=]PATH")]
    pub models: Vec<String>,
    /// A model served by a sidecar started elsewhere: `NAME=URL` or `URL` (repeatable).
    /// [env HUNCH_ACCELERATORS, comma-separated; TOML `accelerators`]
    #[arg(long = "accelerator", value_name = "[NAME=]URL")]
    pub accelerators: Vec<String>,
    /// A model served by another System One server: `NAME=URL` or `NAME=MODEL@URL` (repeatable).
    /// [env HUNCH_UPSTREAMS, comma-separated; TOML `upstreams`]
    #[arg(long = "upstream", value_name = "NAME=[MODEL@]URL")]
    pub upstreams: Vec<String>,
    /// Bearer key sent to upstream servers that have no key of their own.
    /// [env HUNCH_UPSTREAM_KEY, TOML `upstream_key`]
    #[arg(long)]
    pub upstream_key: Option<String>,
    /// PEM certificates to trust for `https://` upstreams besides the system's roots (a private
    /// CA or a self-signed server). [env HUNCH_UPSTREAM_CA_FILE, TOML `upstream_ca_file`]
    #[arg(long, value_name = "PEM")]
    pub upstream_ca_file: Option<PathBuf>,
    /// An accepted bearer key (repeatable). None = auth off.
    /// [env HUNCH_API_KEYS, comma-separated; TOML `api_keys`]
    #[arg(long = "api-key", value_name = "KEY")]
    pub api_keys: Vec<String>,
    /// Another name for a model: `ALIAS=MODEL` (repeatable; `jev-latest` is the first model
    /// unless set here). [env HUNCH_ALIASES, comma-separated; TOML `aliases`]
    #[arg(long = "alias", value_name = "ALIAS=MODEL")]
    pub aliases: Vec<String>,
    /// The sidecar binary (default: `hunch-accelerator` next to this executable).
    /// [env HUNCH_ACCELERATOR_BIN, TOML `accelerator_bin`]
    #[arg(long)]
    pub accelerator_bin: Option<PathBuf>,
    /// An extra argument for every sidecar this server starts (repeatable, e.g.
    /// `--sidecar-arg=--dtype=float32`). [env HUNCH_SIDECAR_ARGS, whitespace-separated; TOML
    /// `sidecar_args`]
    #[arg(long = "sidecar-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub sidecar_args: Vec<String>,
    /// Memory each sidecar this server starts may give its model (bytes, or e.g. `48G`,
    /// `512M`): a load whose weights would take more (float32 activations widen bf16 weights) is
    /// refused before allocating, with the size it needed. Default: the memory the machine has
    /// available. [env HUNCH_MEMORY_LIMIT, TOML `memory_limit`, as `"48G"` or bytes]
    #[arg(long, value_name = "SIZE")]
    pub memory_limit: Option<hunch_core::size::ByteSize>,
    /// Largest request body in bytes, compressed or decompressed (413 beyond). Default 8 MiB.
    /// [env HUNCH_MAX_BODY_BYTES, TOML `max_body_bytes`]
    #[arg(long)]
    pub max_body_bytes: Option<usize>,
    /// Longest a request may take, in seconds (504 beyond). Default 120.
    /// [env HUNCH_REQUEST_TIMEOUT, TOML `request_timeout`]
    #[arg(long)]
    pub request_timeout: Option<f64>,
    /// Reads running at once over all models (the accelerator batches them). Default 16.
    /// [env HUNCH_MAX_CONCURRENT_READS, TOML `max_concurrent_reads`]
    #[arg(long)]
    pub max_concurrent_reads: Option<usize>,
    /// Reads waiting for a slot before new ones get 503 + Retry-After. Default 64.
    /// [env HUNCH_MAX_QUEUED_READS, TOML `max_queued_reads`]
    #[arg(long)]
    pub max_queued_reads: Option<usize>,
    /// Seconds in-flight requests get to finish after SIGTERM/Ctrl-C. Default 30.
    /// [env HUNCH_SHUTDOWN_GRACE, TOML `shutdown_grace`]
    #[arg(long)]
    pub shutdown_grace: Option<f64>,
    /// Seconds between SIGTERM and refusing new connections: `/readyz` answers 503 at once, so
    /// balancers stop sending new work, while requests that still arrive are served. Then
    /// in-flight requests get `--shutdown-grace`. Default 0 (the Kubernetes manifests set 10).
    /// [env HUNCH_DRAIN_DELAY, TOML `drain_delay`]
    #[arg(long)]
    pub drain_delay: Option<f64>,
    /// With no model configured, serve nothing: neither the default model nor the demo (a
    /// request naming a model then gets 404). `--no-demo=false` turns a lower source's setting off; a source
    /// that turns `--demo` or `--no-demo` on decides both. [env HUNCH_NO_DEMO, TOML `no_demo`]
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          value_parser = parse_switch)]
    pub no_demo: Option<bool>,
    /// With no model configured, serve the generated DiffusionGemma demo (`hunch-demo`, random
    /// weights: its answers carry NO meaning) instead of the default model; for tests and for
    /// trying the diffusion read. No effect when a model is configured. [env HUNCH_DEMO, TOML
    /// `demo`]
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          value_parser = parse_switch)]
    pub demo: Option<bool>,
    /// The model served when no model is configured (and neither `--demo` nor `--no-demo`): a
    /// checkpoint directory or a `.gguf` file. Default: SmolLM2-135M-Instruct.Q4_1.gguf in the
    /// models cache ($HUNCH_MODELS_CACHE, else ~/.cache/hunch/models), which
    /// scripts/fetch-default-model.sh fetches; start-up fails, saying so, when it is missing.
    /// [env HUNCH_DEFAULT_MODEL, TOML `default_model`]
    #[arg(long, value_name = "PATH")]
    pub default_model: Option<PathBuf>,
    /// A directory of decision policies (`NAME.wasm` + optional `NAME.toml`), watched: changes
    /// take effect without a restart. Without it, policies deployed over HTTP live in memory.
    /// [env HUNCH_POLICIES, TOML `policies`]
    #[arg(long)]
    pub policies: Option<PathBuf>,
    /// A calibration file written by `hunch calibrate`: answers to the questions it covers are
    /// computed from calibrated distributions, policies' reads included unless a policy's
    /// `NAME.toml` names its own (docs/calibration.md); a request sends
    /// `"x_calibration": "off"` for raw ones. [env HUNCH_CALIBRATION, TOML `calibration`]
    #[arg(long, value_name = "FILE")]
    pub calibration: Option<PathBuf>,
    /// The key for deploying policies over HTTP (`PUT`/`DELETE /v1/policies/NAME`, sent as
    /// `X-Admin-Key`) and for logging in to the console at `/console` with its actions (promote,
    /// roll back). None = deployments over HTTP and console actions are off. [env
    /// HUNCH_ADMIN_KEY, TOML `admin_key`]
    #[arg(long)]
    pub admin_key: Option<String>,
    /// Recent decisions the server keeps in memory for the console's live tail and decision
    /// pages (`/console/decisions`), masked as the decision log masks them. 0 = none. Default
    /// 200. [env HUNCH_CONSOLE_DECISIONS, TOML `console_decisions`]
    #[arg(long, value_name = "N")]
    pub console_decisions: Option<usize>,
    /// How a request's questions are read: `isolated` (default; each question alone, so an answer
    /// does not depend on the other questions; costs a prefill of the state per question) or
    /// `joint` (one prompt for all, the reference read). Requests may override it with
    /// `x_questions`, policies in `NAME.toml` (docs/read.md). [env HUNCH_QUESTIONS, TOML
    /// `questions`]
    #[arg(long, value_name = "isolated|joint")]
    pub questions: Option<hunch_core::QuestionMode>,
    /// Answer cache size in MiB: isolated answers kept by model, state, question and seed
    /// settings, served without a read. 0 (default) = off. [env HUNCH_ANSWER_CACHE_MB, TOML
    /// `answer_cache_mb`]
    #[arg(long, value_name = "MIB")]
    pub answer_cache_mb: Option<u64>,
    /// Policy instances at once (the wasm instance pool): live decisions, shadow runs and one kept
    /// for `describe` during reloads. Default 64. [env HUNCH_POLICY_POOL, TOML `policy_pool`]
    #[arg(long, value_name = "N")]
    pub policy_pool: Option<u32>,
    /// Shadow runs of candidate versions at once, taken from the pool but never from live
    /// decisions' share (at most a quarter of the pool); beyond, a shadow run is skipped and
    /// counted. Default 16. [env HUNCH_POLICY_SHADOW_RUNS, TOML `policy_shadow_runs`]
    #[arg(long, value_name = "N")]
    pub policy_shadow_runs: Option<usize>,
    /// The most linear memory any policy may use (its `NAME.toml` may only lower it), e.g. `64M`.
    /// Default 64M. [env HUNCH_POLICY_MAX_MEMORY, TOML `policy_max_memory`]
    #[arg(long, value_name = "SIZE")]
    pub policy_max_memory: Option<hunch_core::size::ByteSize>,
    /// Wasm stack per invocation: deeper recursion stops the policy with `limit: stack`, e.g.
    /// `512K`. Default 512K. [env HUNCH_POLICY_MAX_STACK, TOML `policy_max_stack`]
    #[arg(long, value_name = "SIZE")]
    pub policy_max_stack: Option<hunch_core::size::ByteSize>,
    /// The most fuel (≈ wasm instructions) any invocation may use (its `NAME.toml` may only lower
    /// it). Default 1000000000. [env HUNCH_POLICY_MAX_FUEL, TOML `policy_max_fuel`]
    #[arg(long, value_name = "N")]
    pub policy_max_fuel: Option<u64>,
    /// Serve the policies of the bundle at this URL (docs/deploy.md, "Policy bundles"), polled
    /// with If-None-Match; a verified revision replaces the whole policy set at once. The bundle
    /// then owns the policies: `--policies` is ignored and HTTP deploys answer 409.
    /// [env HUNCH_BUNDLE_URL, TOML `bundle.url`]
    #[arg(long, value_name = "URL")]
    pub bundle_url: Option<String>,
    /// The ed25519 public key (SPKI PEM, `hunch bundle keygen` or `openssl pkey -pubout`)
    /// bundles must be signed with. [env HUNCH_BUNDLE_PUBLIC_KEY, TOML `bundle.public_key`]
    #[arg(long, value_name = "PEM")]
    pub bundle_public_key: Option<PathBuf>,
    /// How often the bundle URL is polled (±10% jitter), e.g. `10s`, `500ms`, `2m`. Default
    /// 10s. [env HUNCH_BUNDLE_POLL, TOML `bundle.poll`]
    #[arg(long, value_name = "DURATION")]
    pub bundle_poll: Option<bundle::Span>,
    /// Where the last good bundle is persisted and restored from at start, so a restarted
    /// replica serves while the bundle server is down. [env HUNCH_BUNDLE_DIR, TOML
    /// `bundle.dir`]
    #[arg(long, value_name = "DIR")]
    pub bundle_dir: Option<PathBuf>,
    /// A replica whose last successful check of the bundle URL is older than this reports
    /// itself stale (`/v1/status`, `hunch_bundle_stale`). Default 3 × `--bundle-poll`.
    /// [env HUNCH_BUNDLE_STALE_AFTER, TOML `bundle.stale_after`]
    #[arg(long, value_name = "DURATION")]
    pub bundle_stale_after: Option<bundle::Span>,
    /// Accept unsigned bundles when no `--bundle-public-key` is given (whoever can serve the
    /// URL then decides the policies). [env HUNCH_BUNDLE_ALLOW_UNSIGNED, TOML
    /// `bundle.allow_unsigned`]
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          value_parser = parse_switch)]
    pub bundle_allow_unsigned: Option<bool>,
    #[command(flatten)]
    pub decision_log: decision_log::DecisionLogArgs,
    #[command(flatten)]
    pub model_budget: model_budget::ModelBudgetArgs,
}

/// An on/off flag's value (`--flag` alone is `true`).
fn parse_switch(value: &str) -> Result<bool, ConfigError> {
    parse::parse_bool(value)
}

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
    /// `--upstream-ca-file`: trusted for every `https://` upstream.
    pub upstream_ca_file: Option<PathBuf>,
    /// The sidecar binary (`--accelerator-bin`, else `hunch-accelerator` next to `hunch`).
    pub accelerator_bin: PathBuf,
    pub sidecar_args: Vec<String>,
    /// `--memory-limit` in bytes, passed to every sidecar this server starts.
    pub memory_limit: Option<u64>,
    pub shutdown_grace: Duration,
    /// `--drain-delay`: unready but still serving, after SIGTERM.
    pub drain_delay: Duration,
    /// What is served when no model is configured.
    pub fallback: Fallback,
    /// `--policies DIR`.
    pub policies: Option<PathBuf>,
    /// `--calibration FILE`.
    pub calibration: Option<PathBuf>,
    /// `--admin-key`: deployments over HTTP and the console's actions.
    pub admin_key: Option<String>,
    /// `--console-decisions`: recent decisions kept for the console (0: none).
    pub console_decisions: usize,
    /// The default question mode (`--questions`).
    pub questions: hunch_core::QuestionMode,
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
    /// ([`default_model::models_cache`]).
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
            upstream_ca_file: layer.upstream_ca_file,
            accelerator_bin: layer
                .accelerator_bin
                .unwrap_or_else(sidecar_next_to_this_executable),
            sidecar_args: layer.sidecar_args.unwrap_or_default(),
            memory_limit: layer.memory_limit.map(|size| size.0),
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
            admin_key: layer.admin_key.filter(|k| !k.trim().is_empty()),
            console_decisions: layer.console_decisions.unwrap_or(DEFAULT_CONSOLE_DECISIONS),
            questions: layer
                .questions
                .unwrap_or(hunch_core::QuestionMode::Isolated),
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
mod tests {
    use super::*;
    use clap::Parser;

    /// `hunch serve`'s flags alone (the command line itself is `crate::cli`'s).
    #[derive(Debug, Parser)]
    struct Serve {
        #[command(flatten)]
        args: ServeArgs,
    }

    fn args(line: &[&str]) -> ServeArgs {
        let mut argv = vec!["hunch-serve"];
        argv.extend_from_slice(line);
        Serve::try_parse_from(argv).expect("valid flags").args
    }

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        move |name| vars.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone())
    }

    fn file(text: &str) -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("hunch.toml");
        std::fs::write(&path, text).expect("write config");
        let path = path.to_string_lossy().into_owned();
        (dir, path)
    }

    const FILE: &str = r#"
        listen = "0.0.0.0:9000"
        request_timeout = 5
        api_keys = ["from-file"]
        sidecar_args = ["--dtype=float32"]
        no_demo = true
        [[models]]
        name = "filed"
        dir = "/m/filed"
        [[upstreams]]
        name = "remote"
        url = "http://127.0.0.1:1"
        key = "k"
        [aliases]
        fast = "filed"
    "#;

    #[test]
    fn a_flag_wins_over_its_variable_which_wins_over_the_file() {
        let (_dir, path) = file(FILE);
        let s = Settings::resolve(
            &args(&[
                "--config",
                &path,
                "--listen",
                "127.0.0.1:0",
                "--api-key",
                "a",
            ]),
            &env(&[
                ("HUNCH_LISTEN", "127.0.0.1:1"),
                ("HUNCH_API_KEYS", "b, c"),
                ("HUNCH_REQUEST_TIMEOUT", "7"),
                ("HUNCH_SIDECAR_ARGS", "--dtype=bfloat16 --queue 8"),
            ]),
        )
        .unwrap();
        assert_eq!(s.listen, "127.0.0.1:0");
        // Lists are not merged: the flags' keys replace the variable's and the file's.
        assert_eq!(s.api_keys, vec!["a"]);
        assert_eq!(s.limits.request_timeout, Duration::from_secs(7));
        assert_eq!(s.sidecar_args, vec!["--dtype=bfloat16", "--queue", "8"]);
        assert_eq!(s.fallback, Fallback::Nothing, "the file's no_demo = true");
        assert_eq!(s.aliases, vec![("fast".to_string(), "filed".to_string())]);
    }

    #[test]
    fn the_variable_wins_over_the_file_for_lists_too() {
        let (_dir, path) = file(FILE);
        let s = Settings::resolve(
            &args(&["--sidecar-arg=--queue=2"]),
            &env(&[
                ("HUNCH_CONFIG", path.as_str()),
                ("HUNCH_API_KEYS", "b, c"),
                ("HUNCH_NO_DEMO", "false"),
            ]),
        )
        .unwrap();
        assert_eq!(
            s.listen, "0.0.0.0:9000",
            "the file named by HUNCH_CONFIG is read"
        );
        assert_eq!(s.api_keys, vec!["b", "c"]);
        assert_eq!(s.sidecar_args, vec!["--queue=2"]);
        assert!(
            matches!(s.fallback, Fallback::DefaultModel(_)),
            "HUNCH_NO_DEMO=false overrides the file's no_demo = true: {:?}",
            s.fallback
        );
    }

    #[test]
    fn with_no_model_the_default_model_is_looked_for_in_the_models_cache_unless_set() {
        let cached = |path: &str| {
            Fallback::DefaultModel(DefaultModel::Cached(
                PathBuf::from(path).join(default_model::DEFAULT_MODEL_FILE),
            ))
        };
        let s = Settings::resolve(&args(&[]), &env(&[("HOME", "/home/u")])).unwrap();
        assert_eq!(s.fallback, cached("/home/u/.cache/hunch/models"));
        let s = Settings::resolve(
            &args(&[]),
            &env(&[("HOME", "/home/u"), ("HUNCH_MODELS_CACHE", "/models")]),
        )
        .unwrap();
        assert_eq!(s.fallback, cached("/models"));
        let s = Settings::resolve(&args(&[]), &env(&[])).unwrap();
        assert_eq!(s.fallback, Fallback::DefaultModel(DefaultModel::Nowhere));

        // The setting, from each source, in the usual order.
        let configured =
            |path: &str| Fallback::DefaultModel(DefaultModel::Configured(PathBuf::from(path)));
        let (_dir, path) = file("default_model = \"/file/m.gguf\"\n");
        let home = ("HOME", "/home/u");
        let s = Settings::resolve(&args(&["--config", &path]), &env(&[home])).unwrap();
        assert_eq!(s.fallback, configured("/file/m.gguf"));
        let s = Settings::resolve(
            &args(&["--config", &path]),
            &env(&[home, ("HUNCH_DEFAULT_MODEL", "/env/m.gguf")]),
        )
        .unwrap();
        assert_eq!(s.fallback, configured("/env/m.gguf"));
        let s = Settings::resolve(
            &args(&["--config", &path, "--default-model", "/flag/Qwen3-4B"]),
            &env(&[home, ("HUNCH_DEFAULT_MODEL", "/env/m.gguf")]),
        )
        .unwrap();
        assert_eq!(s.fallback, configured("/flag/Qwen3-4B"));
    }

    #[test]
    fn demo_serves_the_demo_and_contradicting_no_demo_is_refused_in_one_source() {
        let s = Settings::resolve(&args(&["--demo"]), &env(&[])).unwrap();
        assert_eq!(s.fallback, Fallback::Demo);
        let s = Settings::resolve(&args(&[]), &env(&[("HUNCH_DEMO", "true")])).unwrap();
        assert_eq!(s.fallback, Fallback::Demo);
        let (_dir, path) = file("demo = true\n");
        let s = Settings::resolve(&args(&["--config", &path]), &env(&[])).unwrap();
        assert_eq!(s.fallback, Fallback::Demo);
        // A higher source decides the choice whole: the flag's --demo over the file's no_demo,
        // the flag's --no-demo over the variable's demo.
        let (_dir, no_demo) = file(FILE);
        let s = Settings::resolve(&args(&["--config", &no_demo, "--demo"]), &env(&[])).unwrap();
        assert_eq!(s.fallback, Fallback::Demo);
        let s = Settings::resolve(&args(&["--no-demo"]), &env(&[("HUNCH_DEMO", "1")])).unwrap();
        assert_eq!(s.fallback, Fallback::Nothing);
        // Both on in one source is a contradiction.
        let err = Settings::resolve(&args(&["--demo", "--no-demo"]), &env(&[])).unwrap_err();
        assert!(err.to_string().contains("both on"), "{err}");
        let (_dir, both) = file("demo = true\nno_demo = true\n");
        assert!(Settings::resolve(&args(&["--config", &both]), &env(&[])).is_err());
    }

    #[test]
    fn a_gguf_file_is_a_model_named_by_its_lower_cased_stem() {
        let s = Settings::resolve(
            &args(&[
                "--model",
                "/m/gemma-3-4b-it-Q4_0.gguf",
                "--model",
                "qwen3=/m/Qwen3-4B",
            ]),
            &env(&[]),
        )
        .unwrap();
        let models: Vec<_> = s
            .models
            .iter()
            .map(|m| (m.name.clone(), m.source.clone()))
            .collect();
        assert_eq!(
            models,
            vec![
                (
                    Some("gemma-3-4b-it-q4_0".to_string()),
                    Source::Sidecar {
                        path: "/m/gemma-3-4b-it-Q4_0.gguf".into()
                    }
                ),
                (
                    Some("qwen3".to_string()),
                    Source::Sidecar {
                        path: "/m/Qwen3-4B".into()
                    }
                ),
            ]
        );
        let (_dir, path) = file("[[models]]\npath = \"/m/SmolLM2-135M-Instruct.Q4_1.gguf\"\n");
        let s = Settings::resolve(&args(&["--config", &path]), &env(&[])).unwrap();
        assert_eq!(
            s.models[0].name.as_deref(),
            Some("smollm2-135m-instruct.q4_1")
        );
    }

    #[test]
    fn the_drain_delay_is_zero_unless_set_and_may_be_zero() {
        let unset = Settings::resolve(&args(&[]), &env(&[])).unwrap();
        assert_eq!(unset.drain_delay, std::time::Duration::ZERO);
        let set = Settings::resolve(&args(&[]), &env(&[("HUNCH_DRAIN_DELAY", "2.5")])).unwrap();
        assert_eq!(set.drain_delay, std::time::Duration::from_millis(2500));
        let zero = Settings::resolve(&args(&["--drain-delay", "0"]), &env(&[])).unwrap();
        assert_eq!(zero.drain_delay, std::time::Duration::ZERO);
        let wrong = Settings::resolve(&args(&["--drain-delay=-1"]), &env(&[])).unwrap_err();
        assert!(wrong.to_string().contains("drain_delay"), "{wrong}");
    }

    #[test]
    fn the_memory_limit_reads_as_a_size_from_each_source() {
        let (_dir, path) = file("memory_limit = \"48G\"\n");
        let from_file = Settings::resolve(&args(&["--config", &path]), &env(&[])).unwrap();
        assert_eq!(from_file.memory_limit, Some(48 << 30));
        let (_dir, bytes) = file("memory_limit = 4096\n");
        let in_bytes = Settings::resolve(&args(&["--config", &bytes]), &env(&[])).unwrap();
        assert_eq!(in_bytes.memory_limit, Some(4096));
        let from_env = Settings::resolve(
            &args(&["--config", &path]),
            &env(&[("HUNCH_MEMORY_LIMIT", "512M")]),
        )
        .unwrap();
        assert_eq!(from_env.memory_limit, Some(512 << 20));
        let from_flag = Settings::resolve(
            &args(&["--memory-limit", "1.5G"]),
            &env(&[("HUNCH_MEMORY_LIMIT", "512M")]),
        )
        .unwrap();
        assert_eq!(from_flag.memory_limit, Some(3 << 29));
        let unset = Settings::resolve(&args(&[]), &env(&[])).unwrap();
        assert_eq!(unset.memory_limit, None);

        let wrong = Settings::resolve(&args(&[]), &env(&[("HUNCH_MEMORY_LIMIT", "lots")]))
            .expect_err("not a size");
        assert!(wrong.to_string().contains("HUNCH_MEMORY_LIMIT"), "{wrong}");
        let (_dir, wrong_file) = file("memory_limit = \"12X\"\n");
        let wrong = Settings::resolve(&args(&["--config", &wrong_file]), &env(&[]))
            .expect_err("not a size");
        assert!(
            wrong.to_string().contains("\"12X\" is not a memory size"),
            "{wrong}"
        );
        assert!(
            Serve::try_parse_from(["hunch-serve", "--memory-limit", "much"]).is_err(),
            "the flag is checked when parsed"
        );
    }

    #[test]
    fn models_come_from_the_source_that_sets_each_kind_in_kind_order() {
        let (_dir, path) = file(FILE);
        let s = Settings::resolve(
            &args(&["--config", &path, "--upstream", "up=jev-latest@https://h"]),
            &env(&[("HUNCH_ACCELERATORS", "http://127.0.0.1:5")]),
        )
        .unwrap();
        let names: Vec<_> = s.models.iter().map(|m| m.name.clone()).collect();
        // The file's model, the variable's accelerator (named by its /health), the flag's
        // upstream, which replaced the file's.
        assert_eq!(names, vec![Some("filed".into()), None, Some("up".into())]);
        assert_eq!(
            s.models[2].source,
            Source::Upstream {
                url: "https://h".into(),
                remote_model: "jev-latest".into(),
                key: None
            }
        );
        let s = Settings::resolve(&args(&["--config", &path]), &env(&[])).unwrap();
        assert_eq!(
            s.models[1].source,
            Source::Upstream {
                url: "http://127.0.0.1:1".into(),
                remote_model: "remote".into(),
                key: Some("k".into())
            }
        );
    }

    #[test]
    fn the_sidecar_binary_is_read_from_the_variable_in_the_settings() {
        let s = Settings::resolve(&args(&[]), &env(&[("HUNCH_ACCELERATOR_BIN", "/x/sidecar")]))
            .unwrap();
        assert_eq!(s.accelerator_bin, PathBuf::from("/x/sidecar"));
        let s = Settings::resolve(&args(&[]), &env(&[])).unwrap();
        assert!(s.accelerator_bin.ends_with(SIDECAR_BIN));
    }

    #[test]
    fn bad_values_are_refused() {
        assert!(Settings::resolve(&args(&["--request-timeout=-1"]), &env(&[])).is_err());
        assert!(Settings::resolve(&args(&["--alias", "nope"]), &env(&[])).is_err());
        assert!(
            Settings::resolve(&args(&["--alias", "a=b", "--alias", "a=c"]), &env(&[])).is_err()
        );
        assert!(toml::from_str::<Layer>("nonsense = 1").is_err());
        // A required decision log must give up on a hung disk before the request times out.
        let required = ["--decision-log", "/d", "--decision-log-required"];
        let slow = [&required[..], &["--request-timeout", "1"]].concat();
        assert!(Settings::resolve(&args(&slow), &env(&[])).is_err());
        let fast = [&slow[..], &["--decision-log-write-timeout", "0.5"]].concat();
        assert!(Settings::resolve(&args(&fast), &env(&[])).is_ok());
        let (_dir, path) = file("listen = 5");
        let err = Settings::resolve(&args(&["--config", &path]), &env(&[])).unwrap_err();
        assert!(err.to_string().contains("hunch.toml"), "{err}");
    }
}
