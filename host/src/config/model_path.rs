//! A model's path, as `--model`, `HUNCH_MODELS`, `[[models]] path` and `--default-model` give it:
//! a checkpoint directory (Hugging Face, mlx-community, a super-decider export) or one `.gguf`
//! file. The sidecar recognises the family and the layout by the content, so the host only checks
//! that the path is one or the other, and derives the name a model is served under when none is
//! given.

use std::path::{Path, PathBuf};

/// What a model path is on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelPathKind {
    Directory,
    File,
}

/// Why a model path cannot be served, naming it.
#[derive(Debug, thiserror::Error)]
pub enum ModelPathError {
    #[error("{} does not exist (a model is a checkpoint directory or a .gguf file)", path.display())]
    Missing { path: PathBuf },
    #[error(
        "{} is neither a directory nor a file (a model is a checkpoint directory or a .gguf file)",
        path.display()
    )]
    NeitherDirectoryNorFile { path: PathBuf },
    /// (`error`, not `source`: the message carries it already, and a chain would say it twice.)
    #[error("cannot read {}: {error}", path.display())]
    Unreadable {
        path: PathBuf,
        error: std::io::Error,
    },
}

/// Whether `path` is a directory or a file (links followed, as the sidecar will follow them).
/// Called at start-up so that what a restart cannot fix fails once, not in a restart loop.
pub fn check_model_path(path: &Path) -> Result<ModelPathKind, ModelPathError> {
    let metadata = std::fs::metadata(path).map_err(|error| match error.kind() {
        std::io::ErrorKind::NotFound => ModelPathError::Missing {
            path: path.to_path_buf(),
        },
        _ => ModelPathError::Unreadable {
            path: path.to_path_buf(),
            error,
        },
    })?;
    if metadata.is_dir() {
        Ok(ModelPathKind::Directory)
    } else if metadata.is_file() {
        Ok(ModelPathKind::File)
    } else {
        Err(ModelPathError::NeitherDirectoryNorFile {
            path: path.to_path_buf(),
        })
    }
}

/// The name a model is served under when none is given. A directory: its last component, as
/// written (checkpoint folders are named after the model: `Qwen3-4B`). A file: its stem,
/// lower-cased (`gemma-3-4b-it-Q4_0.gguf` → `gemma-3-4b-it-q4_0`), since GGUF files carry their
/// quantisation in mixed case and a model name is typed in every request. A path that does not
/// exist yet counts as a file when it ends in `.gguf`, so the name does not change once it does.
pub fn model_name_of_path(path: &Path) -> String {
    let text = path.to_string_lossy();
    let trimmed = Path::new(text.trim_end_matches('/'));
    let is_gguf = trimmed
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
    if is_gguf || trimmed.is_file() {
        if let Some(stem) = trimmed.file_stem() {
            return stem.to_string_lossy().to_lowercase();
        }
    }
    trimmed
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| text.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_is_named_by_its_last_component_as_written() {
        assert_eq!(
            model_name_of_path(Path::new("/models/Qwen3-4B/")),
            "Qwen3-4B"
        );
        assert_eq!(model_name_of_path(Path::new("dg")), "dg");
    }

    #[test]
    fn a_file_is_named_by_its_stem_lower_cased() {
        assert_eq!(
            model_name_of_path(Path::new("/m/gemma-3-4b-it-Q4_0.gguf")),
            "gemma-3-4b-it-q4_0"
        );
        assert_eq!(
            model_name_of_path(Path::new("/m/SmolLM2-135M-Instruct.Q4_1.GGUF")),
            "smollm2-135m-instruct.q4_1"
        );
        // An existing file is a file whatever its extension (the sidecar reads its content).
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("Tiny.Model.bin");
        std::fs::write(&file, b"GGUF").expect("write");
        assert_eq!(model_name_of_path(&file), "tiny.model");
    }

    #[test]
    fn a_path_is_checked_to_be_a_directory_or_a_file_and_named_when_not() {
        let dir = tempfile::tempdir().expect("temp dir");
        assert_eq!(
            check_model_path(dir.path()).expect("a directory"),
            ModelPathKind::Directory
        );
        let file = dir.path().join("m.gguf");
        std::fs::write(&file, b"GGUF").expect("write");
        assert_eq!(
            check_model_path(&file).expect("a file"),
            ModelPathKind::File
        );
        let missing = dir.path().join("nope.gguf");
        let err = check_model_path(&missing).expect_err("missing");
        assert!(matches!(err, ModelPathError::Missing { .. }), "{err:?}");
        let text = err.to_string();
        assert!(
            text.contains("nope.gguf") && text.contains("does not exist"),
            "{text}"
        );
        #[cfg(unix)]
        {
            let err = check_model_path(Path::new("/dev/null")).expect_err("a device");
            assert!(
                matches!(err, ModelPathError::NeitherDirectoryNorFile { .. }),
                "{err:?}"
            );
            assert!(err.to_string().contains("/dev/null"), "{err}");
        }
    }
}
