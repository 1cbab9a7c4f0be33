//! `hunch serve`'s command-line flags ([`ServeArgs`]): what clap parses, before the environment
//! and the TOML file are layered under it into [`Settings`](super::Settings).

use super::{bundle, decision_log, model_budget, parse, ConfigError};
use clap::Args;
use std::path::PathBuf;

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
    /// The chat template a `--model` is read with in place of its checkpoint's own (base
    /// models' GGUFs have none): `NAME=TEMPLATE`, TEMPLATE a built-in (`chatml`, `llama3`,
    /// `gemma`) or a Jinja file's path (repeatable; a models directory's model takes
    /// `chat_template` in its hunch-models.toml instead). [env HUNCH_CHAT_TEMPLATES,
    /// comma-separated; TOML `chat_templates`, a table]
    #[arg(long = "chat-template", value_name = "NAME=TEMPLATE")]
    pub chat_templates: Vec<String>,
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
    /// The copy of the integer products every sidecar this server starts runs quantised chat
    /// weights on: `auto` (the best the CPU runs) or `portable`, `avx2`, `avxvnni`,
    /// `avx512vnni`, `neon`, `dotprod`, `i8mm` (all give the same bits); one the CPU cannot run
    /// stops the sidecar at start, naming the CPU's features. [env HUNCH_CPU_ISA, TOML
    /// `cpu_isa`]
    #[arg(long, value_name = "ISA")]
    pub cpu_isa: Option<String>,
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
    /// Where quality reports are kept (`scripts/quality.sh` stores them; docs/quality.md):
    /// `GET /v1/models/NAME/quality` and the console's models page show the newest report of a
    /// model's exact fingerprint. Default: `quality/` beside the models cache
    /// (~/.cache/hunch/quality). [env HUNCH_QUALITY_DIR, TOML `quality_dir`]
    #[arg(long, value_name = "DIR")]
    pub quality_dir: Option<PathBuf>,
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
    /// The prior remedy of requests that send no `x_prior` (and of policies' reads): `none`
    /// (default) or `divide` (each question also read about "N/A", that distribution divided
    /// out; docs/read.md). A model's `prior` in hunch-models.toml wins over it. [env HUNCH_PRIOR,
    /// TOML `prior`]
    #[arg(long, value_name = "none|divide")]
    pub prior: Option<hunch_core::PriorMode>,
    /// The order remedy likewise (`x_order`): `as_given` (default), `reversed_average` or
    /// `cyclic_average` (docs/read.md). [env HUNCH_ORDER, TOML `order`]
    #[arg(long, value_name = "as_given|reversed_average|cyclic_average")]
    pub order: Option<hunch_core::OrderMode>,
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
pub(crate) fn parse_switch(value: &str) -> Result<bool, ConfigError> {
    parse::parse_bool(value)
}
