//! Why a checkpoint could not be loaded into MLX. Every variant names what to look at.

use std::path::PathBuf;

use super::layout::LayoutError;
use super::memory::TooLarge;
use crate::model::{ConfigError, ModelError};

/// Why a checkpoint could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A file could not be opened or read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// `config.json` is unreadable or describes an unsupported model.
    #[error("{path}: {}", describe_config_error(source))]
    Config {
        /// The config file.
        path: PathBuf,
        /// What is wrong with it.
        source: ConfigError,
    },
    /// The checkpoint and the model disagree about a module (config.json read two ways).
    #[error("{path}: {message}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A tensor has another shape than the model expects.
    #[error("tensor {name} in {file} has shape {found:?}, expected {expected:?}")]
    ShapeMismatch {
        /// Its name.
        name: String,
        /// The file holding it.
        file: PathBuf,
        /// Shape on disk.
        found: Vec<i32>,
        /// Shape the model expects.
        expected: Vec<i32>,
    },
    /// A tensor's dtype cannot be used.
    #[error("tensor {name} in {file} has dtype {dtype}, which {why}")]
    Dtype {
        /// Its name.
        name: String,
        /// The file holding it.
        file: PathBuf,
        /// The safetensors dtype.
        dtype: String,
        /// Why it is refused.
        why: &'static str,
    },
    /// MLX failed while preparing a tensor.
    #[error("MLX while loading {name}: {source}")]
    Mlx {
        /// The tensor.
        name: String,
        /// The MLX error.
        source: mlx_rs::error::Exception,
    },
    /// Assembling the model failed.
    #[error("assembling the model: {0}")]
    Model(#[from] ModelError),
    /// Finding or validating the layout failed (names tensor, file and shapes).
    /// Boxed: the validator's error is large and load errors travel through `Result`s.
    #[error(transparent)]
    Layout(Box<LayoutError>),
    /// The loaded model would not fit in memory; refused before allocating.
    #[error(transparent)]
    TooLarge(Box<TooLarge>),
}

impl From<LayoutError> for LoadError {
    fn from(e: LayoutError) -> Self {
        LoadError::Layout(Box::new(e))
    }
}

impl From<TooLarge> for LoadError {
    fn from(e: TooLarge) -> Self {
        LoadError::TooLarge(Box::new(e))
    }
}

/// Why `config.json` was refused, in an operator's words: the path is printed before it, so the
/// file name is not repeated, and a syntax error says plainly that the file is not JSON.
fn describe_config_error(error: &ConfigError) -> String {
    match error {
        ConfigError::Json(e) if e.is_syntax() || e.is_eof() => format!("not valid JSON ({e})"),
        ConfigError::Json(e) => format!("not a DiffusionGemma config ({e})"),
        ConfigError::Invalid(message) => message.clone(),
    }
}
