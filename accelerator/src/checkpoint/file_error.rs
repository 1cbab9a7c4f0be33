//! The one error for a checkpoint file that could not be read, written or parsed: its own module
//! so that the layout reader (which returns it) and the load error (which wraps the layout's)
//! do not import each other.

use std::path::{Path, PathBuf};

/// A file that could not be read, written or parsed as JSON: the checkpoint reader's and the
/// checkpoint writer's errors carry it.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {why}")]
    Json { path: PathBuf, why: String },
}

impl FileError {
    /// For `map_err`: an I/O error on `path`.
    pub fn io(path: &Path) -> impl FnOnce(std::io::Error) -> FileError + '_ {
        move |source| FileError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    /// `path` is not the JSON it should be, for `why`.
    pub fn json(path: &Path, why: impl std::fmt::Display) -> FileError {
        FileError::Json {
            path: path.to_path_buf(),
            why: why.to_string(),
        }
    }
}
