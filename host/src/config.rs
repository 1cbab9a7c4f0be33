//! `hunch` command line, environment and TOML file, resolved into one [`Settings`].
//!
//! Precedence: a flag (or its environment variable) over the TOML file over the defaults. Models
//! from flags come first (the first model is the default, `jev-latest`), then the file's; within
//! the flags, `--model`s, then `--accelerator`s, then `--upstream`s.

use crate::api::Limits;
use crate::reader::sidecar::parse_model_arg;
use crate::reader::upstream::parse_upstream_arg;
use clap::{Args, Parser, Subcommand};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, Parser)]
#[command(
    name = "hunch",
    version,
    about = "Fast, typed, calibrated System One decisions"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

// Parsed once per process: the size difference between variants costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the System One API.
    Serve(ServeArgs),
    /// Print the JSON Schema requests are validated against.
    Schema,
    /// Print the OpenAPI document.
    Openapi,
    /// Replay recorded policy decisions from decision logs through a component (reads answered
    /// from the log) and report what changed; `--reread --server URL` re-asks recorded reads.
    Replay(crate::decision::replay_cli::ReplayArgs),
    /// Answer a JSONL file of requests (OpenAI's batch format), resumably.
    Batch(crate::cli::batch::BatchArgs),
    /// Ask one System One question set from the shell and print the answers.
    Ask(crate::cli::ask::AskArgs),
    /// Decision policies: `new` scaffolds a crate, `run` runs one locally, `check` validates one.
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Write a policy crate (Cargo.toml + src/lib.rs) that builds and tests as it is.
    New {
        /// The policy's name (`[a-z0-9][a-z0-9_-]*`): the crate, the file and the URL segment.
        name: String,
        /// Where to create the crate's folder (default: the repository's policies workspace).
        #[arg(long, default_value = "policies")]
        dir: PathBuf,
        /// How the crate depends on the SDK, as a Cargo dependency spec. The default suits a crate
        /// inside `policies/`; elsewhere use e.g. `{ path = "/path/to/hunch/guest-sdk" }`.
        #[arg(long, default_value = "{ workspace = true }")]
        sdk: String,
    },
    /// Run a policy component in this process on one input, its reads sent to a server or a
    /// local model; print the decision, its reads, logs and limits.
    Run(crate::cli::policy_run::RunArgs),
    /// Validate a policy component as the server would before serving it, without deciding.
    Check(crate::cli::policy_run::CheckArgs),
}

#[derive(Debug, Clone, Default, Args)]
pub struct ServeArgs {
    /// A TOML file with any of the settings below (flags win).
    #[arg(long, env = "HUNCH_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address to listen on (port 0 picks a free port; the address is printed on stdout).
    #[arg(long, env = "HUNCH_LISTEN")]
    pub listen: Option<String>,
    /// A model served by an accelerator sidecar this server starts: `NAME=DIR` or `DIR`.
    #[arg(long = "model", value_name = "[NAME=]DIR")]
    pub models: Vec<String>,
    /// A model served by a sidecar started elsewhere: `NAME=URL` or `URL`.
    #[arg(long = "accelerator", value_name = "[NAME=]URL")]
    pub accelerators: Vec<String>,
    /// A model served by another System One server: `NAME=URL` or `NAME=MODEL@URL`.
    #[arg(long = "upstream", value_name = "NAME=[MODEL@]URL")]
    pub upstreams: Vec<String>,
    /// Bearer key sent to `--upstream` servers.
    #[arg(long, env = "HUNCH_UPSTREAM_KEY", hide_env_values = true)]
    pub upstream_key: Option<String>,
    /// An accepted bearer key (repeatable; also `HUNCH_API_KEYS`, comma-separated). None = auth off.
    #[arg(long = "api-key", value_name = "KEY")]
    pub api_keys: Vec<String>,
    /// Another name for a model: `ALIAS=MODEL` (`jev-latest` is the first model unless set here).
    #[arg(long = "alias", value_name = "ALIAS=MODEL")]
    pub aliases: Vec<String>,
    /// The sidecar binary (default: `hunch-accelerator` next to this executable).
    #[arg(long, env = "HUNCH_ACCELERATOR_BIN")]
    pub accelerator_bin: Option<PathBuf>,
    /// An extra argument for every sidecar this server starts (repeatable, e.g. `--sidecar-arg=--dtype=float32`).
    #[arg(long = "sidecar-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub sidecar_args: Vec<String>,
    /// Largest request body in bytes, compressed or decompressed (413 beyond). Default 8 MiB.
    #[arg(long, env = "HUNCH_MAX_BODY_BYTES")]
    pub max_body_bytes: Option<usize>,
    /// Longest a request may take, in seconds (504 beyond). Default 120.
    #[arg(long, env = "HUNCH_REQUEST_TIMEOUT")]
    pub request_timeout: Option<f64>,
    /// Reads running at once over all models (the accelerator batches them). Default 16.
    #[arg(long, env = "HUNCH_MAX_CONCURRENT_READS")]
    pub max_concurrent_reads: Option<usize>,
    /// Reads waiting for a slot before new ones get 503 + Retry-After. Default 64.
    #[arg(long, env = "HUNCH_MAX_QUEUED_READS")]
    pub max_queued_reads: Option<usize>,
    /// Seconds in-flight requests get to finish after SIGTERM/Ctrl-C. Default 30.
    #[arg(long, env = "HUNCH_SHUTDOWN_GRACE")]
    pub shutdown_grace: Option<f64>,
    /// With no model configured, serve nothing instead of the demo model.
    #[arg(long, env = "HUNCH_NO_DEMO")]
    pub no_demo: bool,
    /// A directory of decision policies (`NAME.wasm` + optional `NAME.toml`), watched: changes
    /// take effect without a restart. Without it, policies deployed over HTTP live in memory.
    #[arg(long, env = "HUNCH_POLICIES")]
    pub policies: Option<PathBuf>,
    /// The key for deploying policies over HTTP (`PUT`/`DELETE /v1/policies/NAME`, sent as
    /// `X-Admin-Key`). None = deployments over HTTP are off.
    #[arg(long, env = "HUNCH_ADMIN_KEY", hide_env_values = true)]
    pub admin_key: Option<String>,
    /// How a request's questions are read: `isolated` (default; each question alone, so an answer
    /// does not depend on the other questions; costs a prefill of the state per question) or
    /// `joint` (one prompt for all, the reference read). Requests may override it with
    /// `x_questions`, policies in `NAME.toml` (docs/read.md).
    #[arg(long, env = "HUNCH_QUESTIONS", value_name = "isolated|joint")]
    pub questions: Option<hunch_core::QuestionMode>,
    /// Answer cache size in MiB: isolated answers kept by model, state, question and seed
    /// settings, served without a read. 0 (default) = off.
    #[arg(long, env = "HUNCH_ANSWER_CACHE_MB", value_name = "MIB")]
    pub answer_cache_mb: Option<u64>,
    #[command(flatten)]
    pub decision_log: crate::decision::settings::DecisionLogArgs,
}

/// The TOML file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub listen: Option<String>,
    #[serde(default)]
    pub api_keys: Vec<String>,
    pub upstream_key: Option<String>,
    pub max_body_bytes: Option<usize>,
    pub request_timeout: Option<f64>,
    pub max_concurrent_reads: Option<usize>,
    pub max_queued_reads: Option<usize>,
    pub shutdown_grace: Option<f64>,
    pub accelerator_bin: Option<PathBuf>,
    #[serde(default)]
    pub sidecar_args: Vec<String>,
    #[serde(default)]
    pub models: Vec<FileModel>,
    #[serde(default)]
    pub accelerators: Vec<FileAccelerator>,
    #[serde(default)]
    pub upstreams: Vec<FileUpstream>,
    /// alias → model name.
    #[serde(default)]
    pub aliases: std::collections::BTreeMap<String, String>,
    pub policies: Option<PathBuf>,
    pub admin_key: Option<String>,
    /// `isolated` or `joint`.
    pub questions: Option<hunch_core::QuestionMode>,
    pub answer_cache_mb: Option<u64>,
    /// `[decision_log]`: see `crate::decision::settings`.
    pub decision_log: Option<crate::decision::settings::DecisionLogFile>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileModel {
    pub name: Option<String>,
    pub dir: PathBuf,
    pub description: Option<String>,
    pub release_date: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileAccelerator {
    pub name: Option<String>,
    pub url: String,
    pub description: Option<String>,
    pub release_date: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileUpstream {
    pub name: String,
    pub url: String,
    /// The `model` sent upstream (default: `name`).
    pub model: Option<String>,
    pub key: Option<String>,
    pub description: Option<String>,
    pub release_date: Option<String>,
}

/// Where a model's reads go.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// A sidecar this server starts and supervises.
    Sidecar { dir: PathBuf },
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

/// Everything `hunch serve` needs, resolved.
#[derive(Debug, Clone)]
pub struct Settings {
    pub listen: String,
    pub limits: Limits,
    pub api_keys: Vec<String>,
    pub models: Vec<ModelSource>,
    pub aliases: Vec<(String, String)>,
    pub accelerator_bin: Option<PathBuf>,
    pub sidecar_args: Vec<String>,
    pub shutdown_grace: Duration,
    /// Serve the generated demo model when no model is configured.
    pub demo: bool,
    /// `--policies DIR`.
    pub policies: Option<PathBuf>,
    /// `--admin-key`: deployments over HTTP.
    pub admin_key: Option<String>,
    /// The default question mode (`--questions`).
    pub questions: hunch_core::QuestionMode,
    /// Answer cache bound in bytes (`--answer-cache-mb`); 0 = off.
    pub answer_cache_bytes: u64,
    pub decision_log: crate::decision::settings::DecisionLogSettings,
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

pub fn load_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    toml::from_str(&text).map_err(|e| ConfigError::Toml {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

fn seconds(value: f64, what: &str) -> Result<Duration, ConfigError> {
    Duration::try_from_secs_f64(value)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| ConfigError::Invalid(format!("{what} must be a positive number of seconds")))
}

/// `[NAME=]URL`: a name only when what precedes `=` is not part of the URL.
fn split_named_url(arg: &str) -> (Option<String>, String) {
    match arg.split_once('=') {
        Some((name, url)) if !name.contains("://") && !name.is_empty() => {
            (Some(name.to_string()), url.to_string())
        }
        _ => (None, arg.to_string()),
    }
}

impl Settings {
    /// Flags + environment (`api_keys_env` is `HUNCH_API_KEYS`) + the file they name.
    pub fn resolve(args: &ServeArgs, api_keys_env: Option<&str>) -> Result<Settings, ConfigError> {
        let file = match &args.config {
            Some(path) => load_file(path)?,
            None => FileConfig::default(),
        };
        Self::merge(args, api_keys_env, file)
    }

    pub fn merge(
        args: &ServeArgs,
        api_keys_env: Option<&str>,
        file: FileConfig,
    ) -> Result<Settings, ConfigError> {
        let defaults = Limits::default();
        let limits = Limits {
            max_body_bytes: args
                .max_body_bytes
                .or(file.max_body_bytes)
                .unwrap_or(defaults.max_body_bytes),
            request_timeout: match args.request_timeout.or(file.request_timeout) {
                Some(s) => seconds(s, "request_timeout")?,
                None => defaults.request_timeout,
            },
            max_concurrent_reads: args
                .max_concurrent_reads
                .or(file.max_concurrent_reads)
                .unwrap_or(defaults.max_concurrent_reads),
            max_queued_reads: args
                .max_queued_reads
                .or(file.max_queued_reads)
                .unwrap_or(defaults.max_queued_reads),
        };
        if limits.max_concurrent_reads == 0 {
            return Err(ConfigError::Invalid(
                "max_concurrent_reads must be at least 1".into(),
            ));
        }
        let decision_log = crate::decision::settings::DecisionLogSettings::merge(
            &args.decision_log,
            file.decision_log.clone(),
        )
        .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        let shutdown_grace = match args.shutdown_grace.or(file.shutdown_grace) {
            Some(s) => seconds(s, "shutdown_grace")?,
            None => Duration::from_secs(30),
        };

        let mut api_keys: Vec<String> = args.api_keys.clone();
        if let Some(env) = api_keys_env {
            api_keys.extend(
                env.split(',')
                    .map(str::trim)
                    .filter(|k| !k.is_empty())
                    .map(String::from),
            );
        }
        api_keys.extend(file.api_keys.iter().cloned());

        let upstream_key = args.upstream_key.clone().or(file.upstream_key.clone());
        let mut models = Vec::new();
        for arg in &args.models {
            let (name, dir) = parse_model_arg(arg);
            models.push(ModelSource {
                name: Some(name),
                description: None,
                release_date: None,
                source: Source::Sidecar { dir },
            });
        }
        for arg in &args.accelerators {
            let (name, url) = split_named_url(arg);
            models.push(ModelSource {
                name,
                description: None,
                release_date: None,
                source: Source::Accelerator { url },
            });
        }
        for arg in &args.upstreams {
            let (name, remote_model, url) =
                parse_upstream_arg(arg).map_err(ConfigError::Invalid)?;
            models.push(ModelSource {
                name: Some(name),
                description: None,
                release_date: None,
                source: Source::Upstream {
                    url,
                    remote_model,
                    key: upstream_key.clone(),
                },
            });
        }
        for m in file.models {
            let name = m
                .name
                .unwrap_or_else(|| parse_model_arg(&m.dir.to_string_lossy()).0);
            models.push(ModelSource {
                name: Some(name),
                description: m.description,
                release_date: m.release_date,
                source: Source::Sidecar { dir: m.dir },
            });
        }
        for a in file.accelerators {
            models.push(ModelSource {
                name: a.name,
                description: a.description,
                release_date: a.release_date,
                source: Source::Accelerator { url: a.url },
            });
        }
        for u in file.upstreams {
            crate::http_url::check("upstreams.url", &u.url)
                .map_err(|e| ConfigError::Invalid(e.to_string()))?;
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

        let mut aliases = Vec::new();
        for arg in &args.aliases {
            let (alias, target) = arg
                .split_once('=')
                .filter(|(a, t)| !a.is_empty() && !t.is_empty())
                .ok_or_else(|| {
                    ConfigError::Invalid(format!("--alias wants ALIAS=MODEL, got {arg:?}"))
                })?;
            aliases.push((alias.to_string(), target.to_string()));
        }
        aliases.extend(file.aliases);

        let mut sidecar_args = file.sidecar_args;
        sidecar_args.extend(args.sidecar_args.iter().cloned());

        Ok(Settings {
            listen: args
                .listen
                .clone()
                .or(file.listen)
                .unwrap_or_else(|| "127.0.0.1:8080".to_string()),
            limits,
            api_keys,
            models,
            aliases,
            accelerator_bin: args.accelerator_bin.clone().or(file.accelerator_bin),
            sidecar_args,
            shutdown_grace,
            demo: !args.no_demo,
            policies: args.policies.clone().or(file.policies),
            admin_key: args
                .admin_key
                .clone()
                .or(file.admin_key)
                .filter(|k| !k.trim().is_empty()),
            questions: args
                .questions
                .or(file.questions)
                .unwrap_or(hunch_core::QuestionMode::Isolated),
            answer_cache_bytes: args
                .answer_cache_mb
                .or(file.answer_cache_mb)
                .unwrap_or(0)
                .saturating_mul(1 << 20),
            decision_log,
        })
    }
}

/// Today's date as `YYYY-MM-DD` (UTC), the default `release_date` of a served model.
pub fn today() -> String {
    let days = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() / 86_400)
        .unwrap_or(0) as i64;
    let (y, m, d) = crate::decision::event::civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_win_over_the_file_and_models_keep_order() {
        let file: FileConfig = toml::from_str(
            r#"
            listen = "0.0.0.0:9000"
            request_timeout = 5
            api_keys = ["from-file"]
            [[upstreams]]
            name = "remote"
            url = "http://127.0.0.1:1"
            key = "k"
            [aliases]
            fast = "local"
            "#,
        )
        .unwrap();
        let args = ServeArgs {
            listen: Some("127.0.0.1:0".into()),
            models: vec!["local=/m/dg".into()],
            accelerators: vec!["http://127.0.0.1:5".into()],
            api_keys: vec!["a".into()],
            ..ServeArgs::default()
        };
        let s = Settings::merge(&args, Some("b, c"), file).unwrap();
        assert_eq!(s.listen, "127.0.0.1:0");
        assert_eq!(s.limits.request_timeout, Duration::from_secs(5));
        assert_eq!(s.api_keys, vec!["a", "b", "c", "from-file"]);
        assert_eq!(s.models[0].name.as_deref(), Some("local"));
        assert_eq!(s.models[1].name, None);
        assert_eq!(
            s.models[2].source,
            Source::Upstream {
                url: "http://127.0.0.1:1".into(),
                remote_model: "remote".into(),
                key: Some("k".into())
            }
        );
        assert_eq!(s.aliases, vec![("fast".to_string(), "local".to_string())]);
    }

    #[test]
    fn bad_values_are_refused() {
        let args = ServeArgs {
            request_timeout: Some(-1.0),
            ..ServeArgs::default()
        };
        assert!(Settings::merge(&args, None, FileConfig::default()).is_err());
        assert!(toml::from_str::<FileConfig>("nonsense = 1").is_err());
    }

    #[test]
    fn today_is_a_date() {
        let t = today();
        assert_eq!(t.len(), 10);
        assert!(t.starts_with("20"));
    }
}
