//! Checkpoints: finding a directory's layout from its tensors, validating them against
//! `config.json`, and loading them into a [`DiffusionGemma`] (docs/checkpoint-layouts.md).
//!
//! The loader's path, each step one module:
//! - [`files`]: which safetensors files hold the weights (index, any manifest, or headers);
//! - [`tensors`]: the one safetensors reader (memory-mapped files, tensors by name);
//! - [`format`]: the layouts' on-disk conventions, shared with the writers;
//! - [`layout`]: which layout the tensors fit, validated against [`dims`] (the inventory
//!   config.json implies);
//! - [`memory`]: what the load will take, refused before allocating when it cannot fit;
//! - [`mapped`], [`arrays`]: MLX arrays over the mapped bytes, in the dtype each weight is held in;
//! - [`assemble`]: the model from a [`MappedLayout`];
//! - [`stored`]: how a checkpoint's matrices are stored, in words (`/health`'s model kind).
//! - [`encoder`]: a ModernBERT GGUF with its laya decision head, loaded into `model::encoder`.
//!
//! Writing checkpoints (random ones, conversion, quantisers) lives in the `tools` module, which
//! uses this one and which this module never uses (only its tests write checkpoints with it).

pub mod arrays;
pub mod assemble;
pub mod causal;
pub mod dims;
pub mod encoder;
mod error;
mod file_error;
pub mod files;
pub mod format;
pub mod gguf;
pub mod layout;
pub mod mapped;
pub mod memory;
pub mod stored;
pub mod tensors;

use std::path::Path;

pub use assemble::assemble;
pub use error::LoadError;
pub use file_error::FileError;
pub use format::Layout;
pub use layout::{
    detect_layout, Checkpoint, QuantMode, Quantized, QuantizedPart, QuantizedWeight, Weight,
};
pub use mapped::MappedLayout;
pub use memory::MemoryPlan;

use crate::model::{ActivationDtype, Config, ConfigError, DiffusionGemma};

/// How to load a model.
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// Activation (and dense weight) dtype.
    pub dtype: ActivationDtype,
    /// Draw a progress bar on stderr (hidden anyway when stderr is not a terminal).
    pub progress: bool,
    /// Bytes the weights converted at load may take; `None`: what the machine has available.
    pub memory_limit: Option<u64>,
}

/// Loads a checkpoint directory in any of the three layouts: finds the layout its tensors fit
/// ([`Checkpoint::open`]), works out the memory the model will take and refuses before
/// allocating when it cannot fit ([`memory::check`]), then builds the model over the mapped
/// files.
pub fn load(dir: &Path, options: &LoadOptions) -> Result<DiffusionGemma, LoadError> {
    // Parsed once: the model's Config and the checkpoint's inventory are read from one value.
    let config_path = dir.join("config.json");
    let text = std::fs::read_to_string(&config_path).map_err(|source| LoadError::Io {
        path: config_path.clone(),
        source,
    })?;
    let config_error = |source| LoadError::Config {
        path: config_path.clone(),
        source,
    };
    let json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| config_error(ConfigError::Json(e)))?;
    let config = Config::from_value(&json).map_err(config_error)?;
    let layout = MappedLayout::new(Checkpoint::with_config(dir, json)?);
    let dtype = options.dtype.dtype();
    let plan = MemoryPlan::of(layout.checkpoint(), dtype);
    memory::check(&plan, options.memory_limit, dir, dtype)?;
    assemble(&layout, config, options)
}

impl DiffusionGemma {
    /// Loads the checkpoint in `dir` (see [`load`]).
    pub fn load(dir: &Path, options: &LoadOptions) -> Result<Self, LoadError> {
        load(dir, options)
    }
}

#[cfg(test)]
mod load_error_tests {
    use super::*;

    #[test]
    fn a_config_json_that_is_not_json_says_so_with_its_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("config.json"), "this is { not JSON").expect("write");
        let Err(error) = load(dir.path(), &LoadOptions::default()) else {
            panic!("a config that is not JSON loaded");
        };
        let message = error.to_string();
        let path = dir.path().join("config.json").display().to_string();
        assert!(
            message.starts_with(&format!("{path}: not valid JSON (")),
            "{message}"
        );
        // Valid JSON that is not a DiffusionGemma config says that instead.
        std::fs::write(dir.path().join("config.json"), "{\"a\": 1}").expect("write");
        let Err(error) = load(dir.path(), &LoadOptions::default()) else {
            panic!("a config without text_config loaded");
        };
        assert!(
            error
                .to_string()
                .starts_with(&format!("{path}: not a DiffusionGemma config (")),
            "{error}"
        );
    }
}
