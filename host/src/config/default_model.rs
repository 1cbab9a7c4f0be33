//! What `hunch serve` serves when no model is configured (no `models`, `accelerators` or
//! `upstreams`): the default model, the random DiffusionGemma demo (`--demo`), or nothing
//! (`--no-demo`).
//!
//! The default model is SmolLM2-135M-Instruct as a Q4_1 GGUF (98 MB, Apache-2.0): a small chat
//! model read from its next-token logits, whose answers carry meaning, weakly.
//! `scripts/fetch-default-model.sh` puts it in the models cache (`$HUNCH_MODELS_CACHE`, else
//! `$HOME/.cache/hunch/models`), where it is looked for; `--default-model PATH` names another
//! place (the container image's `/usr/share/hunch/models/`). The server never downloads it: one
//! that starts serves a file already on disk, and one that cannot says what to run.

use super::model_path::{check_model_path, model_name_of_path, ModelPathError};
use super::{ConfigError, ModelSource, Source};
use std::path::{Path, PathBuf};

/// The default model's file name, in the models cache (pinned with its sha256 in
/// `scripts/fetch-default-model.sh`).
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// The name the default model is served under: the model's, not the file's (whose stem carries
/// the quantisation).
pub const DEFAULT_MODEL_NAME: &str = "smollm2-135m-instruct";
/// The variable naming the models cache (the script reads it too).
pub const MODELS_CACHE_ENV: &str = "HUNCH_MODELS_CACHE";
/// What fetches the default model; every error that lacks it names it.
pub const FETCH_SCRIPT: &str = "scripts/fetch-default-model.sh";
const DEFAULT_MODEL_DESCRIPTION: &str =
    "SmolLM2-135M-Instruct (Q4_1 GGUF): a 135M chat model read \
     from its next-token logits; its answers carry meaning, weakly";

/// The models cache: `$HUNCH_MODELS_CACHE`, else `$HOME/.cache/hunch/models` (the same rule as
/// the fetch script's); `None` when neither is set. An empty variable counts as unset.
pub fn models_cache(env: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let set = |name: &str| env(name).filter(|v| !v.trim().is_empty());
    set(MODELS_CACHE_ENV)
        .map(PathBuf::from)
        .or_else(|| set("HOME").map(|home| Path::new(&home).join(".cache/hunch/models")))
}

/// What is served when no model is configured.
#[derive(Debug, Clone, PartialEq)]
pub enum Fallback {
    /// The default model (neither `--demo` nor `--no-demo`).
    DefaultModel(DefaultModel),
    /// `--demo`: the generated random DiffusionGemma, whose answers carry no meaning.
    Demo,
    /// `--no-demo`: nothing; the server answers 404 for every model.
    Nothing,
}

/// Where the default model is.
#[derive(Debug, Clone, PartialEq)]
pub enum DefaultModel {
    /// `--default-model PATH` (`HUNCH_DEFAULT_MODEL`, `default_model`).
    Configured(PathBuf),
    /// [`DEFAULT_MODEL_FILE`] in the models cache.
    Cached(PathBuf),
    /// No setting and no models cache (neither `HUNCH_MODELS_CACHE` nor `HOME` is set).
    Nowhere,
}

/// Why the default model cannot be served; each says what to do instead.
#[derive(Debug, thiserror::Error)]
pub enum DefaultModelError {
    #[error(
        "no model is configured and the default model is not fetched ({} does not exist): run \
         {FETCH_SCRIPT} to fetch it (SmolLM2-135M-Instruct, 98 MB), or serve a model of your own \
         with --model NAME=PATH (a checkpoint directory or a .gguf file), or the random \
         DiffusionGemma demo with --demo",
        path.display()
    )]
    NotFetched { path: PathBuf },
    #[error(
        "no model is configured and the default model in the models cache cannot be served: \
         {reason}; remove it and run {FETCH_SCRIPT}, or pass --model NAME=PATH or --demo"
    )]
    Cached { reason: ModelPathError },
    #[error(
        "no model is configured and the default model (--default-model, HUNCH_DEFAULT_MODEL, \
         default_model) cannot be served: {reason}; point it at a checkpoint directory or a .gguf \
         file ({FETCH_SCRIPT} fetches SmolLM2-135M-Instruct), or pass --model NAME=PATH or --demo"
    )]
    Configured { reason: ModelPathError },
    #[error(
        "no model is configured, and with neither {MODELS_CACHE_ENV} nor HOME set there is no \
         models cache to find the default model in: set {MODELS_CACHE_ENV} and run \
         {FETCH_SCRIPT}, or pass --default-model PATH, --model NAME=PATH or --demo"
    )]
    NoCache,
}

impl Fallback {
    /// The fallback the settings choose. `demo` and `no_demo` are two switches for one choice;
    /// both on (in one source: across sources the higher one decides, `Layer::over`) is a
    /// contradiction, refused rather than guessed.
    pub fn resolve(
        demo: Option<bool>,
        no_demo: Option<bool>,
        default_model: Option<PathBuf>,
        models_cache: Option<PathBuf>,
    ) -> Result<Fallback, ConfigError> {
        match (demo.unwrap_or(false), no_demo.unwrap_or(false)) {
            (true, true) => Err(ConfigError::Invalid(
                "demo and no_demo are both on: --demo serves the random demo model and --no-demo \
                 nothing when no model is configured; turn one off (e.g. --no-demo=false)"
                    .into(),
            )),
            (true, false) => Ok(Fallback::Demo),
            (false, true) => Ok(Fallback::Nothing),
            (false, false) => Ok(Fallback::DefaultModel(
                match (default_model, models_cache) {
                    (Some(path), _) => DefaultModel::Configured(path),
                    (None, Some(cache)) => DefaultModel::Cached(cache.join(DEFAULT_MODEL_FILE)),
                    (None, None) => DefaultModel::Nowhere,
                },
            )),
        }
    }
}

impl DefaultModel {
    /// The path looked at, if there is one.
    pub fn path(&self) -> Option<&Path> {
        match self {
            DefaultModel::Configured(path) | DefaultModel::Cached(path) => Some(path),
            DefaultModel::Nowhere => None,
        }
    }

    /// The model to serve, once its path is checked: the pinned file is served as
    /// [`DEFAULT_MODEL_NAME`] wherever it lies; another file or directory under the name its path
    /// gives ([`model_name_of_path`]).
    pub fn source(&self) -> Result<ModelSource, DefaultModelError> {
        let path = match self {
            DefaultModel::Configured(path) => {
                check_model_path(path)
                    .map_err(|reason| DefaultModelError::Configured { reason })?;
                path
            }
            DefaultModel::Cached(path) => {
                check_model_path(path).map_err(|reason| match reason {
                    ModelPathError::Missing { path } => DefaultModelError::NotFetched { path },
                    reason => DefaultModelError::Cached { reason },
                })?;
                path
            }
            DefaultModel::Nowhere => return Err(DefaultModelError::NoCache),
        };
        let pinned = path.file_name().is_some_and(|n| n == DEFAULT_MODEL_FILE);
        Ok(ModelSource {
            name: Some(if pinned {
                DEFAULT_MODEL_NAME.to_string()
            } else {
                model_name_of_path(path)
            }),
            description: pinned.then(|| DEFAULT_MODEL_DESCRIPTION.to_string()),
            release_date: None,
            source: Source::Sidecar { path: path.clone() },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn the_models_cache_is_the_variable_else_home() {
        assert_eq!(
            models_cache(&env(&[("HUNCH_MODELS_CACHE", "/c"), ("HOME", "/h")])),
            Some(PathBuf::from("/c"))
        );
        assert_eq!(
            models_cache(&env(&[("HUNCH_MODELS_CACHE", " "), ("HOME", "/h")])),
            Some(PathBuf::from("/h/.cache/hunch/models"))
        );
        assert_eq!(models_cache(&env(&[])), None);
    }

    #[test]
    fn the_switches_choose_the_fallback_and_both_on_is_refused() {
        let cache = Some(PathBuf::from("/c"));
        assert_eq!(
            Fallback::resolve(None, None, None, cache.clone()).unwrap(),
            Fallback::DefaultModel(DefaultModel::Cached(PathBuf::from(
                "/c/SmolLM2-135M-Instruct.Q4_1.gguf"
            )))
        );
        assert_eq!(
            Fallback::resolve(None, None, Some("/m/x.gguf".into()), cache.clone()).unwrap(),
            Fallback::DefaultModel(DefaultModel::Configured("/m/x.gguf".into()))
        );
        assert_eq!(
            Fallback::resolve(None, None, None, None).unwrap(),
            Fallback::DefaultModel(DefaultModel::Nowhere)
        );
        assert_eq!(
            Fallback::resolve(Some(true), Some(false), None, cache.clone()).unwrap(),
            Fallback::Demo
        );
        assert_eq!(
            Fallback::resolve(Some(false), Some(true), None, cache.clone()).unwrap(),
            Fallback::Nothing
        );
        let err = Fallback::resolve(Some(true), Some(true), None, cache).unwrap_err();
        assert!(err.to_string().contains("both on"), "{err}");
    }

    #[test]
    fn a_missing_default_model_says_to_fetch_it() {
        let dir = tempfile::tempdir().expect("temp dir");
        let cached = DefaultModel::Cached(dir.path().join(DEFAULT_MODEL_FILE));
        let err = cached.source().expect_err("not fetched");
        assert!(
            matches!(err, DefaultModelError::NotFetched { .. }),
            "{err:?}"
        );
        let text = err.to_string();
        for needle in [FETCH_SCRIPT, "--model", "--demo", DEFAULT_MODEL_FILE] {
            assert!(text.contains(needle), "{text} lacks {needle}");
        }
        let err = DefaultModel::Configured(dir.path().join("gone.gguf"))
            .source()
            .expect_err("missing");
        let text = err.to_string();
        assert!(
            text.contains("gone.gguf") && text.contains("--default-model"),
            "{text}"
        );
        let text = DefaultModel::Nowhere.source().unwrap_err().to_string();
        assert!(text.contains(MODELS_CACHE_ENV), "{text}");
    }

    #[test]
    fn the_pinned_file_is_served_by_the_models_name_wherever_it_lies() {
        let dir = tempfile::tempdir().expect("temp dir");
        let pinned = dir.path().join(DEFAULT_MODEL_FILE);
        std::fs::write(&pinned, b"GGUF").expect("write");
        for default in [
            DefaultModel::Cached(pinned.clone()),
            DefaultModel::Configured(pinned.clone()),
        ] {
            let source = default.source().expect("served");
            assert_eq!(source.name.as_deref(), Some(DEFAULT_MODEL_NAME));
            assert!(source.description.is_some());
            assert_eq!(
                source.source,
                Source::Sidecar {
                    path: pinned.clone()
                }
            );
        }
        // Another file is named by its stem; a directory by its name.
        let other = dir.path().join("Qwen3-4B-Q4_K_M.gguf");
        std::fs::write(&other, b"GGUF").expect("write");
        let source = DefaultModel::Configured(other).source().expect("served");
        assert_eq!(source.name.as_deref(), Some("qwen3-4b-q4_k_m"));
        assert_eq!(source.description, None);
        let folder = dir.path().join("Qwen3-4B");
        std::fs::create_dir(&folder).expect("mkdir");
        let source = DefaultModel::Configured(folder).source().expect("served");
        assert_eq!(source.name.as_deref(), Some("Qwen3-4B"));
    }
}
