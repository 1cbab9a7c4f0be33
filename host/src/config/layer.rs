//! One source of settings: the flags, the environment or the TOML file, each read into the same
//! [`Layer`] so that precedence is one rule for every setting: the highest layer that sets a
//! setting decides its whole value (a list from the flags replaces the environment's and the
//! file's; it is not merged with them).
//!
//! Adding a setting: a field here, a flag in `ServeArgs`, a line in [`SETTINGS`], its reading in
//! [`Layer::from_flags`] and [`Layer::from_env`], its use in `Settings::from_layer`, and its case
//! in `config/precedence.rs`. The unit tests check that every flag has its variable and key, that
//! `--help` names both, and that the flag wins over the variable over the key.

use super::bundle::BundleLayer;
use super::decision_log::DecisionLogFile;
use super::parse::{
    parse_alias_arg, parse_bool, parse_model_arg, parse_upstream_arg, split_named_url,
};
use super::{ConfigError, ServeArgs};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Every `hunch serve` setting: its flag, its environment variable, its TOML key. The file itself
/// (`--config`, `HUNCH_CONFIG`) is the one setting with no key.
pub const SETTINGS: &[(&str, &str, &str)] = &[
    ("--listen", "HUNCH_LISTEN", "listen"),
    ("--model", "HUNCH_MODELS", "models"),
    ("--accelerator", "HUNCH_ACCELERATORS", "accelerators"),
    ("--upstream", "HUNCH_UPSTREAMS", "upstreams"),
    ("--upstream-key", "HUNCH_UPSTREAM_KEY", "upstream_key"),
    (
        "--upstream-ca-file",
        "HUNCH_UPSTREAM_CA_FILE",
        "upstream_ca_file",
    ),
    ("--api-key", "HUNCH_API_KEYS", "api_keys"),
    ("--alias", "HUNCH_ALIASES", "aliases"),
    ("--chat-template", "HUNCH_CHAT_TEMPLATES", "chat_templates"),
    (
        "--accelerator-bin",
        "HUNCH_ACCELERATOR_BIN",
        "accelerator_bin",
    ),
    ("--sidecar-arg", "HUNCH_SIDECAR_ARGS", "sidecar_args"),
    ("--memory-limit", "HUNCH_MEMORY_LIMIT", "memory_limit"),
    ("--cpu-isa", "HUNCH_CPU_ISA", "cpu_isa"),
    ("--models-dir", "HUNCH_MODELS_DIRS", "models_dirs"),
    ("--memory-budget", "HUNCH_MEMORY_BUDGET", "memory_budget"),
    ("--model-ttl", "HUNCH_MODEL_TTL", "model_ttl"),
    ("--max-body-bytes", "HUNCH_MAX_BODY_BYTES", "max_body_bytes"),
    (
        "--request-timeout",
        "HUNCH_REQUEST_TIMEOUT",
        "request_timeout",
    ),
    (
        "--max-concurrent-reads",
        "HUNCH_MAX_CONCURRENT_READS",
        "max_concurrent_reads",
    ),
    (
        "--max-queued-reads",
        "HUNCH_MAX_QUEUED_READS",
        "max_queued_reads",
    ),
    ("--shutdown-grace", "HUNCH_SHUTDOWN_GRACE", "shutdown_grace"),
    ("--drain-delay", "HUNCH_DRAIN_DELAY", "drain_delay"),
    ("--no-demo", "HUNCH_NO_DEMO", "no_demo"),
    ("--demo", "HUNCH_DEMO", "demo"),
    ("--default-model", "HUNCH_DEFAULT_MODEL", "default_model"),
    ("--policies", "HUNCH_POLICIES", "policies"),
    ("--calibration", "HUNCH_CALIBRATION", "calibration"),
    ("--quality-dir", "HUNCH_QUALITY_DIR", "quality_dir"),
    ("--admin-key", "HUNCH_ADMIN_KEY", "admin_key"),
    (
        "--console-decisions",
        "HUNCH_CONSOLE_DECISIONS",
        "console_decisions",
    ),
    ("--questions", "HUNCH_QUESTIONS", "questions"),
    ("--prior", "HUNCH_PRIOR", "prior"),
    ("--order", "HUNCH_ORDER", "order"),
    (
        "--answer-cache-mb",
        "HUNCH_ANSWER_CACHE_MB",
        "answer_cache_mb",
    ),
    ("--policy-pool", "HUNCH_POLICY_POOL", "policy_pool"),
    (
        "--policy-shadow-runs",
        "HUNCH_POLICY_SHADOW_RUNS",
        "policy_shadow_runs",
    ),
    (
        "--policy-max-memory",
        "HUNCH_POLICY_MAX_MEMORY",
        "policy_max_memory",
    ),
    (
        "--policy-max-stack",
        "HUNCH_POLICY_MAX_STACK",
        "policy_max_stack",
    ),
    (
        "--policy-max-fuel",
        "HUNCH_POLICY_MAX_FUEL",
        "policy_max_fuel",
    ),
    ("--bundle-url", "HUNCH_BUNDLE_URL", "bundle.url"),
    (
        "--bundle-public-key",
        "HUNCH_BUNDLE_PUBLIC_KEY",
        "bundle.public_key",
    ),
    ("--bundle-poll", "HUNCH_BUNDLE_POLL", "bundle.poll"),
    ("--bundle-dir", "HUNCH_BUNDLE_DIR", "bundle.dir"),
    (
        "--bundle-stale-after",
        "HUNCH_BUNDLE_STALE_AFTER",
        "bundle.stale_after",
    ),
    (
        "--bundle-allow-unsigned",
        "HUNCH_BUNDLE_ALLOW_UNSIGNED",
        "bundle.allow_unsigned",
    ),
];

/// The environment variable naming the TOML file.
pub const CONFIG_ENV: &str = "HUNCH_CONFIG";

/// Settings as one source gives them; `None` = this source does not set it.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Layer {
    pub listen: Option<String>,
    pub models: Option<Vec<FileModel>>,
    pub accelerators: Option<Vec<FileAccelerator>>,
    pub upstreams: Option<Vec<FileUpstream>>,
    pub upstream_key: Option<String>,
    pub upstream_ca_file: Option<PathBuf>,
    pub api_keys: Option<Vec<String>>,
    /// alias → model name.
    pub aliases: Option<BTreeMap<String, String>>,
    /// model name → chat template (a built-in name or a Jinja file's path).
    pub chat_templates: Option<BTreeMap<String, String>>,
    pub accelerator_bin: Option<PathBuf>,
    pub sidecar_args: Option<Vec<String>>,
    /// `"48G"` or bytes.
    pub memory_limit: Option<hunch_core::size::ByteSize>,
    /// The sidecars' `--cpu-isa`.
    pub cpu_isa: Option<String>,
    pub models_dirs: Option<Vec<PathBuf>>,
    /// `"24G"` or bytes.
    pub memory_budget: Option<hunch_core::size::ByteSize>,
    /// `"5m"`, `"30s"` or seconds.
    pub model_ttl: Option<super::bundle::Span>,
    pub max_body_bytes: Option<usize>,
    pub request_timeout: Option<f64>,
    pub max_concurrent_reads: Option<usize>,
    pub max_queued_reads: Option<usize>,
    pub shutdown_grace: Option<f64>,
    pub drain_delay: Option<f64>,
    pub no_demo: Option<bool>,
    pub demo: Option<bool>,
    /// A checkpoint directory or a `.gguf` file.
    pub default_model: Option<PathBuf>,
    pub policies: Option<PathBuf>,
    pub calibration: Option<PathBuf>,
    pub quality_dir: Option<PathBuf>,
    pub admin_key: Option<String>,
    /// Recent decisions kept for the console; 0 = none.
    pub console_decisions: Option<usize>,
    /// `isolated` or `joint`.
    pub questions: Option<hunch_core::QuestionMode>,
    /// `divide` or `none`.
    pub prior: Option<hunch_core::PriorMode>,
    /// `as_given`, `reversed_average` or `cyclic_average`.
    pub order: Option<hunch_core::OrderMode>,
    pub answer_cache_mb: Option<u64>,
    pub policy_pool: Option<u32>,
    pub policy_shadow_runs: Option<usize>,
    /// `"64M"` or bytes.
    pub policy_max_memory: Option<hunch_core::size::ByteSize>,
    /// `"512K"` or bytes.
    pub policy_max_stack: Option<hunch_core::size::ByteSize>,
    pub policy_max_fuel: Option<u64>,
    /// `[decision_log]`: its flags, variables and keys are `config/decision_log.rs`'s; merged
    /// key by key ([`DecisionLogFile::over`]), not as a whole.
    pub decision_log: Option<DecisionLogFile>,
    /// `[bundle]`: merged setting by setting ([`BundleLayer::over`]), not as a whole.
    pub bundle: Option<BundleLayer>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileModel {
    pub name: Option<String>,
    /// A checkpoint directory or a `.gguf` file; `dir`, its name when only directories were
    /// served, is still read.
    #[serde(alias = "dir")]
    pub path: PathBuf,
    pub description: Option<String>,
    pub release_date: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileAccelerator {
    pub name: Option<String>,
    pub url: String,
    pub description: Option<String>,
    pub release_date: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
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

impl FileModel {
    fn from_arg(arg: &str) -> FileModel {
        let (name, path) = parse_model_arg(arg);
        FileModel {
            name: Some(name),
            path,
            description: None,
            release_date: None,
        }
    }
}

impl FileAccelerator {
    fn from_arg(arg: &str) -> FileAccelerator {
        let (name, url) = split_named_url(arg);
        FileAccelerator {
            name,
            url,
            description: None,
            release_date: None,
        }
    }
}

impl FileUpstream {
    fn from_arg(arg: &str) -> Result<FileUpstream, ConfigError> {
        let (name, model, url) = parse_upstream_arg(arg)?;
        Ok(FileUpstream {
            name,
            url,
            model: Some(model),
            key: None,
            description: None,
            release_date: None,
        })
    }
}

/// A repeatable flag: `None` when not given, so that a lower layer decides.
fn given<T: Clone>(values: &[T]) -> Option<Vec<T>> {
    (!values.is_empty()).then(|| values.to_vec())
}

/// `NAME=TEMPLATE` pairs, each model named once.
fn chat_templates_from<'a>(
    args: impl Iterator<Item = &'a str>,
) -> Result<BTreeMap<String, String>, ConfigError> {
    let mut templates = BTreeMap::new();
    for arg in args {
        let (name, template) = arg
            .split_once('=')
            .filter(|(n, t)| !n.is_empty() && !t.is_empty())
            .ok_or_else(|| {
                ConfigError::Invalid(format!("--chat-template wants NAME=TEMPLATE, got {arg:?}"))
            })?;
        if templates
            .insert(name.to_string(), template.to_string())
            .is_some()
        {
            return Err(ConfigError::Invalid(format!(
                "--chat-template names model {name:?} twice"
            )));
        }
    }
    Ok(templates)
}

fn aliases_from<'a>(
    args: impl IntoIterator<Item = &'a str>,
) -> Result<BTreeMap<String, String>, ConfigError> {
    let mut aliases = BTreeMap::new();
    for arg in args {
        let (alias, target) = parse_alias_arg(arg)?;
        if aliases.insert(alias.clone(), target).is_some() {
            return Err(ConfigError::Invalid(format!(
                "alias {alias:?} is given twice"
            )));
        }
    }
    Ok(aliases)
}

impl Layer {
    /// The command line's settings.
    pub fn from_flags(args: &ServeArgs) -> Result<Layer, ConfigError> {
        Ok(Layer {
            listen: args.listen.clone(),
            models: given(&args.models).map(|m| m.iter().map(|a| FileModel::from_arg(a)).collect()),
            accelerators: given(&args.accelerators)
                .map(|a| a.iter().map(|a| FileAccelerator::from_arg(a)).collect()),
            upstreams: given(&args.upstreams)
                .map(|u| u.iter().map(|a| FileUpstream::from_arg(a)).collect())
                .transpose()?,
            upstream_key: args.upstream_key.clone(),
            upstream_ca_file: args.upstream_ca_file.clone(),
            api_keys: given(&args.api_keys),
            chat_templates: given(&args.chat_templates)
                .map(|a| chat_templates_from(a.iter().map(String::as_str)))
                .transpose()?,
            aliases: given(&args.aliases)
                .map(|a| aliases_from(a.iter().map(String::as_str)))
                .transpose()?,
            accelerator_bin: args.accelerator_bin.clone(),
            sidecar_args: given(&args.sidecar_args),
            memory_limit: args.memory_limit,
            cpu_isa: args.cpu_isa.clone(),
            models_dirs: given(&args.model_budget.models_dirs),
            memory_budget: args.model_budget.memory_budget,
            model_ttl: args.model_budget.model_ttl,
            max_body_bytes: args.max_body_bytes,
            request_timeout: args.request_timeout,
            max_concurrent_reads: args.max_concurrent_reads,
            max_queued_reads: args.max_queued_reads,
            shutdown_grace: args.shutdown_grace,
            drain_delay: args.drain_delay,
            no_demo: args.no_demo,
            demo: args.demo,
            default_model: args.default_model.clone(),
            policies: args.policies.clone(),
            calibration: args.calibration.clone(),
            quality_dir: args.quality_dir.clone(),
            admin_key: args.admin_key.clone(),
            console_decisions: args.console_decisions,
            questions: args.questions,
            prior: args.prior,
            order: args.order,
            answer_cache_mb: args.answer_cache_mb,
            policy_pool: args.policy_pool,
            policy_shadow_runs: args.policy_shadow_runs,
            policy_max_memory: args.policy_max_memory,
            policy_max_stack: args.policy_max_stack,
            policy_max_fuel: args.policy_max_fuel,
            decision_log: args.decision_log.layer(),
            bundle: BundleLayer {
                url: args.bundle_url.clone(),
                public_key: args.bundle_public_key.clone(),
                poll: args.bundle_poll,
                dir: args.bundle_dir.clone(),
                stale_after: args.bundle_stale_after,
                allow_unsigned: args.bundle_allow_unsigned,
            }
            .some(),
        })
    }

    /// The environment's settings, through `lookup` (the process environment in `hunch serve`).
    /// An empty variable counts as unset. Lists are comma-separated, except `HUNCH_SIDECAR_ARGS`
    /// (separated by whitespace, as arguments are).
    pub fn from_env(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Layer, ConfigError> {
        let var = |name: &str| {
            lookup(name)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let list = |name: &str| {
            var(name).map(|v| {
                v.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(String::from)
                    .collect::<Vec<_>>()
            })
        };
        fn number<T: std::str::FromStr>(
            name: &str,
            value: Option<String>,
        ) -> Result<Option<T>, ConfigError> {
            value
                .map(|v| {
                    v.parse()
                        .map_err(|_| ConfigError::Invalid(format!("{name}={v:?} is not a number")))
                })
                .transpose()
        }
        fn size(
            name: &str,
            value: Option<String>,
        ) -> Result<Option<hunch_core::size::ByteSize>, ConfigError> {
            value
                .map(|v| {
                    v.parse()
                        .map_err(|e| ConfigError::Invalid(format!("{name}: {e}")))
                })
                .transpose()
        }
        fn span(
            name: &str,
            value: Option<String>,
        ) -> Result<Option<super::bundle::Span>, ConfigError> {
            value
                .map(|v| {
                    v.parse()
                        .map_err(|e| ConfigError::Invalid(format!("{name}: {e}")))
                })
                .transpose()
        }
        let switch = |name: &str| {
            var(name)
                .map(|v| parse_bool(&v).map_err(|e| ConfigError::Invalid(format!("{name}: {e}"))))
                .transpose()
        };
        Ok(Layer {
            listen: var("HUNCH_LISTEN"),
            models: list("HUNCH_MODELS")
                .map(|m| m.iter().map(|a| FileModel::from_arg(a)).collect()),
            accelerators: list("HUNCH_ACCELERATORS")
                .map(|a| a.iter().map(|a| FileAccelerator::from_arg(a)).collect()),
            upstreams: list("HUNCH_UPSTREAMS")
                .map(|u| u.iter().map(|a| FileUpstream::from_arg(a)).collect())
                .transpose()?,
            upstream_key: var("HUNCH_UPSTREAM_KEY"),
            upstream_ca_file: var("HUNCH_UPSTREAM_CA_FILE").map(PathBuf::from),
            api_keys: list("HUNCH_API_KEYS"),
            chat_templates: list("HUNCH_CHAT_TEMPLATES")
                .map(|a| chat_templates_from(a.iter().map(String::as_str)))
                .transpose()?,
            aliases: list("HUNCH_ALIASES")
                .map(|a| aliases_from(a.iter().map(String::as_str)))
                .transpose()?,
            accelerator_bin: var("HUNCH_ACCELERATOR_BIN").map(PathBuf::from),
            sidecar_args: var("HUNCH_SIDECAR_ARGS")
                .map(|v| v.split_whitespace().map(String::from).collect()),
            memory_limit: size("HUNCH_MEMORY_LIMIT", var("HUNCH_MEMORY_LIMIT"))?,
            cpu_isa: var("HUNCH_CPU_ISA"),
            models_dirs: list("HUNCH_MODELS_DIRS")
                .map(|dirs| dirs.into_iter().map(PathBuf::from).collect()),
            memory_budget: size("HUNCH_MEMORY_BUDGET", var("HUNCH_MEMORY_BUDGET"))?,
            model_ttl: span("HUNCH_MODEL_TTL", var("HUNCH_MODEL_TTL"))?,
            max_body_bytes: number("HUNCH_MAX_BODY_BYTES", var("HUNCH_MAX_BODY_BYTES"))?,
            request_timeout: number("HUNCH_REQUEST_TIMEOUT", var("HUNCH_REQUEST_TIMEOUT"))?,
            max_concurrent_reads: number(
                "HUNCH_MAX_CONCURRENT_READS",
                var("HUNCH_MAX_CONCURRENT_READS"),
            )?,
            max_queued_reads: number("HUNCH_MAX_QUEUED_READS", var("HUNCH_MAX_QUEUED_READS"))?,
            shutdown_grace: number("HUNCH_SHUTDOWN_GRACE", var("HUNCH_SHUTDOWN_GRACE"))?,
            drain_delay: number("HUNCH_DRAIN_DELAY", var("HUNCH_DRAIN_DELAY"))?,
            no_demo: switch("HUNCH_NO_DEMO")?,
            demo: switch("HUNCH_DEMO")?,
            default_model: var("HUNCH_DEFAULT_MODEL").map(PathBuf::from),
            policies: var("HUNCH_POLICIES").map(PathBuf::from),
            calibration: var("HUNCH_CALIBRATION").map(PathBuf::from),
            quality_dir: var(crate::quality::QUALITY_DIR_ENV).map(PathBuf::from),
            admin_key: var("HUNCH_ADMIN_KEY"),
            console_decisions: number("HUNCH_CONSOLE_DECISIONS", var("HUNCH_CONSOLE_DECISIONS"))?,
            questions: var("HUNCH_QUESTIONS")
                .map(|v| {
                    v.parse()
                        .map_err(|e| ConfigError::Invalid(format!("HUNCH_QUESTIONS: {e}")))
                })
                .transpose()?,
            prior: var("HUNCH_PRIOR")
                .map(|v| {
                    v.parse()
                        .map_err(|e| ConfigError::Invalid(format!("HUNCH_PRIOR: {e}")))
                })
                .transpose()?,
            order: var("HUNCH_ORDER")
                .map(|v| {
                    v.parse()
                        .map_err(|e| ConfigError::Invalid(format!("HUNCH_ORDER: {e}")))
                })
                .transpose()?,
            answer_cache_mb: number("HUNCH_ANSWER_CACHE_MB", var("HUNCH_ANSWER_CACHE_MB"))?,
            policy_pool: number("HUNCH_POLICY_POOL", var("HUNCH_POLICY_POOL"))?,
            policy_shadow_runs: number(
                "HUNCH_POLICY_SHADOW_RUNS",
                var("HUNCH_POLICY_SHADOW_RUNS"),
            )?,
            policy_max_memory: size("HUNCH_POLICY_MAX_MEMORY", var("HUNCH_POLICY_MAX_MEMORY"))?,
            policy_max_stack: size("HUNCH_POLICY_MAX_STACK", var("HUNCH_POLICY_MAX_STACK"))?,
            policy_max_fuel: number("HUNCH_POLICY_MAX_FUEL", var("HUNCH_POLICY_MAX_FUEL"))?,
            decision_log: DecisionLogFile::from_env(lookup)
                .map_err(|e| ConfigError::Invalid(e.to_string()))?,
            bundle: BundleLayer {
                url: var("HUNCH_BUNDLE_URL"),
                public_key: var("HUNCH_BUNDLE_PUBLIC_KEY").map(PathBuf::from),
                poll: span("HUNCH_BUNDLE_POLL", var("HUNCH_BUNDLE_POLL"))?,
                dir: var("HUNCH_BUNDLE_DIR").map(PathBuf::from),
                stale_after: span("HUNCH_BUNDLE_STALE_AFTER", var("HUNCH_BUNDLE_STALE_AFTER"))?,
                allow_unsigned: switch("HUNCH_BUNDLE_ALLOW_UNSIGNED")?,
            }
            .some(),
        })
    }

    /// The TOML file's settings.
    pub fn from_file(path: &Path) -> Result<Layer, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        toml::from_str(&text).map_err(|e| ConfigError::Toml {
            path: path.to_path_buf(),
            message: e.to_string(),
        })
    }

    /// Each setting from `self` where it is set, else from `lower`.
    pub fn over(self, lower: Layer) -> Layer {
        let bundle = BundleLayer::over(self.bundle, lower.bundle);
        let decision_log = DecisionLogFile::over(self.decision_log, lower.decision_log);
        // `demo` and `no_demo` are two switches for one choice (what to serve with no model): a
        // source that turns either on decides it whole, so `--demo` is not contradicted by a
        // file's `no_demo = true`, nor `--no-demo` by `HUNCH_DEMO=1`.
        let (demo, no_demo) = if self.demo == Some(true) || self.no_demo == Some(true) {
            (self.demo, self.no_demo)
        } else {
            (self.demo.or(lower.demo), self.no_demo.or(lower.no_demo))
        };
        macro_rules! pick {
            ($($field:ident),* $(,)?) => {
                Layer {
                    bundle,
                    decision_log,
                    demo,
                    no_demo,
                    $($field: self.$field.or(lower.$field)),*
                }
            };
        }
        pick!(
            listen,
            models,
            accelerators,
            upstreams,
            upstream_key,
            upstream_ca_file,
            api_keys,
            aliases,
            chat_templates,
            accelerator_bin,
            sidecar_args,
            memory_limit,
            cpu_isa,
            models_dirs,
            memory_budget,
            model_ttl,
            max_body_bytes,
            request_timeout,
            max_concurrent_reads,
            max_queued_reads,
            shutdown_grace,
            drain_delay,
            default_model,
            policies,
            calibration,
            quality_dir,
            admin_key,
            console_decisions,
            questions,
            prior,
            order,
            answer_cache_mb,
            policy_pool,
            policy_shadow_runs,
            policy_max_memory,
            policy_max_stack,
            policy_max_fuel,
        )
    }
}

#[cfg(test)]
mod tests;
