//! Many models under one memory budget (docs/models.md): where models are discovered
//! (`--models-dir`), the budget they share (`--memory-budget`) and how long an idle one stays
//! loaded (`--model-ttl`). The flags live here and are flattened into `hunch serve`'s.

use super::bundle::Span;
use crate::reader::models::budget;
use clap::Args;
use std::path::PathBuf;
use std::time::Duration;

/// How long a discovered model stays loaded after its last read, unless a request's
/// `x_keep_alive` says otherwise (Ollama's default too).
pub const DEFAULT_TTL: Duration = Duration::from_secs(5 * 60);

#[derive(Debug, Clone, Default, Args)]
pub struct ModelBudgetArgs {
    /// A directory of models loaded on first request (repeatable): flat folders, `org/name`
    /// folders, the Hugging Face cache layout and single `.gguf` files, each named by its path
    /// under the directory (docs/models.md). Rescanned, so new and removed models are noticed
    /// without a restart. A `hunch-models.toml` at its root gives models their own settings
    /// (aliases, pinned, ttl, hidden, dtype, sidecar_args, questions, draws). [env
    /// HUNCH_MODELS_DIRS, comma-separated; TOML `models_dirs`]
    #[arg(long = "models-dir", value_name = "DIR")]
    pub models_dirs: Vec<PathBuf>,
    /// The memory all loaded models share (bytes, or e.g. `24G`): before a model loads, idle
    /// models are unloaded until its size fits; one that can never fit is a 507. Default: the
    /// machine's memory less max(2 GiB, an eighth). [env HUNCH_MEMORY_BUDGET, TOML
    /// `memory_budget`, as `"24G"` or bytes]
    #[arg(long, value_name = "SIZE")]
    pub memory_budget: Option<hunch_core::size::ByteSize>,
    /// How long a model from `--models-dir` stays loaded after its last read, e.g. `5m`, `30s`
    /// (a request's `x_keep_alive` overrides it for that model). `--model`s stay loaded.
    /// Default 5m. [env HUNCH_MODEL_TTL, TOML `model_ttl`]
    #[arg(long, value_name = "DURATION")]
    pub model_ttl: Option<Span>,
}

/// The resolved settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelBudgetSettings {
    pub models_dirs: Vec<PathBuf>,
    /// Bytes all loaded models share.
    pub budget_bytes: u64,
    /// Whether `budget_bytes` was given (else it is the machine's default).
    pub budget_given: bool,
    pub ttl: Duration,
}

impl ModelBudgetSettings {
    pub fn resolve(
        models_dirs: Option<Vec<PathBuf>>,
        memory_budget: Option<hunch_core::size::ByteSize>,
        model_ttl: Option<Span>,
    ) -> Self {
        let (budget_bytes, budget_given) = match memory_budget {
            Some(size) => (size.0, true),
            None => (
                budget::machine_total()
                    .map(budget::default_budget)
                    .unwrap_or(u64::MAX),
                false,
            ),
        };
        ModelBudgetSettings {
            models_dirs: models_dirs.unwrap_or_default(),
            budget_bytes,
            budget_given,
            ttl: model_ttl.map_or(DEFAULT_TTL, |s| s.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_the_budget_is_the_machines_less_the_reserve_and_the_ttl_five_minutes() {
        let s = ModelBudgetSettings::resolve(None, None, None);
        assert!(!s.budget_given);
        assert_eq!(s.ttl, DEFAULT_TTL);
        #[cfg(target_os = "linux")]
        assert_eq!(
            s.budget_bytes,
            budget::default_budget(budget::machine_total().unwrap())
        );
        let given = ModelBudgetSettings::resolve(
            Some(vec!["/m".into()]),
            Some(hunch_core::size::ByteSize(1 << 30)),
            Some(Span(Duration::from_secs(30))),
        );
        assert_eq!(given.budget_bytes, 1 << 30);
        assert!(given.budget_given);
        assert_eq!(given.ttl, Duration::from_secs(30));
        assert_eq!(given.models_dirs, [PathBuf::from("/m")]);
    }
}
