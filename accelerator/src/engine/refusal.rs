//! Which load failures are refusals: the checkpoint's files or the model's settings say no, so
//! no retry can load it until an operator changes them (docs/models.md, "Configs"). The sidecar
//! says so in `/health` (`refused: true`) and the host answers the model's reads 4xx instead of
//! 503 + `Retry-After`.
//!
//! Decided by the error's type, never its text. Every match lists each variant, with no `_`
//! arm, so a new variant does not compile until someone decides which it is. Where a cause is
//! not the checkpoint's or the settings' (I/O, MLX, BLAS, a bug), or cannot be told from the
//! type, it is not a refusal: answering 503 for a refusal only costs a client a futile retry,
//! while answering 4xx for a transient fault tells it wrongly that a retry cannot help.

use super::{AnyEngineError, CausalEngineError, EncoderEngineError, EngineError};
use crate::checkpoint::causal::CausalLoadError;
use crate::checkpoint::files::FilesError;
use crate::checkpoint::gguf::GgufError;
use crate::checkpoint::layout::LayoutError;
use crate::checkpoint::memory::{LimitSource, TooLarge};
use crate::checkpoint::tensors::TensorError;
use crate::checkpoint::{FileError, LoadError};
use crate::model::ModelError;
use crate::server::LoadFailure;
use crate::tokenizer::chat::ChatTokenizerError;
use crate::tokenizer::TokenizerError;

impl AnyEngineError {
    /// Whether no retry can load this checkpoint as it is set up (the module's rule).
    pub fn is_refusal(&self) -> bool {
        match self {
            AnyEngineError::Diffusion(e) => e.is_refusal(),
            AnyEngineError::Causal(e) => e.is_refusal(),
            AnyEngineError::Encoder(e) => e.is_refusal(),
        }
    }
}

impl From<AnyEngineError> for LoadFailure {
    fn from(e: AnyEngineError) -> Self {
        LoadFailure {
            refused: e.is_refusal(),
            message: e.to_string(),
        }
    }
}

impl CausalEngineError {
    /// Whether no retry can load this chat model as it is set up (the module's rule).
    pub fn is_refusal(&self) -> bool {
        match self {
            CausalEngineError::Load(e) => causal_load(e),
            CausalEngineError::Tokenizer(e) => chat_tokenizer(e),
            CausalEngineError::Gguf(e) => gguf(e),
            CausalEngineError::Kernels { source, .. } => model(source),
            // The tokenizer cannot spell the answer labels: a property of its vocabulary.
            CausalEngineError::Labels { .. } => true,
            // A decision model's metadata, template or labels, or a setting that does not
            // apply to it: all in its files or its settings.
            CausalEngineError::DecisionMetadata { .. }
            | CausalEngineError::Decision { .. }
            | CausalEngineError::DecisionTemplateGiven { .. }
            | CausalEngineError::LayaNotEncoder { .. } => true,
        }
    }
}

impl EncoderEngineError {
    /// Whether no retry can load this encoder as it is set up (the module's rule).
    pub fn is_refusal(&self) -> bool {
        match self {
            EncoderEngineError::Gguf(e) => gguf(e),
            EncoderEngineError::Tokenizer(e) => chat_tokenizer(e),
            // Its metadata, template or head, or a setting that does not apply to it: all in
            // its files or its settings.
            EncoderEngineError::DecisionMetadata { .. }
            | EncoderEngineError::NotLaya { .. }
            | EncoderEngineError::Decision { .. }
            | EncoderEngineError::DecisionTemplateGiven { .. } => true,
        }
    }
}

impl EngineError {
    /// Whether no retry can load this DiffusionGemma as it is set up (the module's rule).
    pub fn is_refusal(&self) -> bool {
        match self {
            EngineError::Load(e) => load(e),
            EngineError::Tokenizer(e) => tokenizer(e),
            // The read plan cannot be built for this model's limits and vocabulary.
            EngineError::Plan { .. } => true,
        }
    }
}

fn causal_load(e: &CausalLoadError) -> bool {
    match e {
        // A file that cannot be read now (permissions, a disk error, a download not done) may
        // be readable at the next try.
        CausalLoadError::Io { .. } => false,
        CausalLoadError::Config { .. } | CausalLoadError::Tensor { .. } => true,
        CausalLoadError::Gguf(e) => gguf(e),
        CausalLoadError::Tensors(e) => load(e),
        CausalLoadError::Model(e) => model(e),
    }
}

fn gguf(e: &GgufError) -> bool {
    match e {
        GgufError::Io { .. } => false,
        GgufError::Format { .. }
        | GgufError::Tensor { .. }
        | GgufError::Unsupported { .. }
        | GgufError::Missing { .. }
        | GgufError::Metadata { .. } => true,
    }
}

fn load(e: &LoadError) -> bool {
    match e {
        LoadError::Io { .. } => false,
        LoadError::Config { .. }
        | LoadError::Format { .. }
        | LoadError::ShapeMismatch { .. }
        | LoadError::Dtype { .. } => true,
        LoadError::Mlx { .. } => false,
        LoadError::Model(e) => model(e),
        LoadError::Layout(e) => layout(e),
        LoadError::TooLarge(e) => too_large(e),
    }
}

/// A model that would not fit the memory it was checked against. Against what the OS has
/// available now it may fit later (another process ends, the cache is dropped): not a refusal.
/// Against the limit set (`--memory-limit`, one of the model's settings) or the machine's
/// whole memory it never fits until the settings change (`--dtype bfloat16`, a larger limit)
/// or the files do (a quantised checkpoint): a refusal.
fn too_large(e: &TooLarge) -> bool {
    match e.limit_source {
        LimitSource::Available(_) => false,
        LimitSource::Setting | LimitSource::Physical => true,
    }
}

fn layout(e: &LayoutError) -> bool {
    match e {
        LayoutError::File(FileError::Io { .. }) => false,
        LayoutError::File(FileError::Json { .. }) => true,
        LayoutError::NotACheckpoint { .. } | LayoutError::Dims(_) => true,
        LayoutError::Tensor(e) => tensor(e),
        LayoutError::Files(e) => files(e),
        LayoutError::Quantization { .. }
        | LayoutError::Missing { .. }
        | LayoutError::Shape { .. }
        | LayoutError::Dtype { .. }
        | LayoutError::NoLayoutFits { .. } => true,
    }
}

fn tensor(e: &TensorError) -> bool {
    match e {
        TensorError::Io { .. } => false,
        TensorError::BadHeader { .. }
        | TensorError::BadTensor { .. }
        | TensorError::Missing { .. }
        | TensorError::WrongDtype { .. } => true,
        // Writing is no part of a load; if it ever is, a failed write is the disk's.
        TensorError::Write { .. } => false,
    }
}

fn files(e: &FilesError) -> bool {
    match e {
        FilesError::Io { .. } => false,
        FilesError::Json { .. } | FilesError::OutsideDir { .. } | FilesError::NoWeights { .. } => {
            true
        }
    }
}

/// Building the model from tensors that passed the loaders' checks.
fn model(e: &ModelError) -> bool {
    match e {
        // The native kernels cannot serve this checkpoint's encoding, and an NVFP4 weight that
        // does not fit its format: the files (or `--causal-kernels`) must change.
        ModelError::NativeKernels(_) | ModelError::Nvfp4(_) => true,
        // MLX's and BLAS's runtime faults.
        ModelError::Mlx(_) | ModelError::Blas(_) => false,
        // A forward-pass error while loading is a bug (the loaders' checks passed), not the
        // checkpoint's: not claimed to be permanent.
        ModelError::EmptyPrompt
        | ModelError::EmptyBatch
        | ModelError::RaggedCanvases { .. }
        | ModelError::TokenOutOfRange { .. }
        | ModelError::TooLong { .. }
        | ModelError::SelfConditioningShape { .. }
        | ModelError::CacheMismatch { .. }
        | ModelError::PositionOutOfRange { .. }
        | ModelError::Shape(_)
        | ModelError::RouterChoice(_) => false,
    }
}

fn chat_tokenizer(e: &ChatTokenizerError) -> bool {
    match e {
        ChatTokenizerError::Io { .. } => false,
        // No tokenizer, one `tokenizers` refuses, a file of the wrong shape, an unknown
        // tokenizer model or pre-tokenizer, a template that does not compile or is missing
        // (`chat_template` in the model's settings gives one), or one that fails on the
        // probe messages.
        ChatTokenizerError::NoTokenizerJson { .. }
        | ChatTokenizerError::Load { .. }
        | ChatTokenizerError::Config { .. }
        | ChatTokenizerError::Gguf { .. }
        | ChatTokenizerError::UnknownModel { .. }
        | ChatTokenizerError::UnknownPre { .. }
        | ChatTokenizerError::Template { .. }
        | ChatTokenizerError::NoTemplate { .. }
        | ChatTokenizerError::Render { .. } => true,
        // `tokenizers`' own failures on a text: not known to be the vocabulary's.
        ChatTokenizerError::Encode(_) | ChatTokenizerError::Decode(_) => false,
    }
}

fn tokenizer(e: &TokenizerError) -> bool {
    match e {
        TokenizerError::Load { .. }
        | TokenizerError::MissingSpecial { .. }
        | TokenizerError::NotAtomic { .. } => true,
        TokenizerError::Encode(_) | TokenizerError::Decode(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::memory::MemoryPlan;
    use crate::engine::causal::CausalEngineOptions;
    use std::path::{Path, PathBuf};

    fn io() -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::PermissionDenied, "denied")
    }

    fn data(path: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data")
            .join(path)
    }

    #[test]
    fn a_config_key_that_would_change_the_math_is_a_refusal_from_the_real_loader() {
        let e = crate::engine::load_engine(
            &data("causal/refused/tiny-qwen2.unknown-key.gguf"),
            &Default::default(),
            &CausalEngineOptions::default(),
        )
        .err()
        .expect("the unknown key was not refused");
        assert!(e.is_refusal(), "{e}");
        assert!(e.to_string().contains("qwen2.attention.zoom"), "{e}");
        let failure = LoadFailure::from(e);
        assert!(failure.refused);
        assert!(failure.message.contains("qwen2.attention.zoom"));
    }

    #[test]
    fn a_file_that_is_no_gguf_is_a_refusal_and_one_that_cannot_be_read_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("broken.gguf");
        std::fs::write(&path, b"not a gguf at all, just text").unwrap();
        let e =
            crate::engine::load_engine(&path, &Default::default(), &CausalEngineOptions::default())
                .err()
                .expect("a text file loaded as a GGUF");
        assert!(e.is_refusal(), "{e}");

        let unreadable = AnyEngineError::Causal(CausalEngineError::Gguf(GgufError::Io {
            path: path.clone(),
            source: io(),
        }));
        assert!(!unreadable.is_refusal());
        let config = CausalEngineError::Load(CausalLoadError::Io { path, source: io() });
        assert!(!config.is_refusal());
    }

    #[test]
    fn tokenizer_and_template_faults_are_refusals_but_io_and_mlx_are_not() {
        let no_template =
            CausalEngineError::Tokenizer(ChatTokenizerError::NoTemplate { origin: "m".into() });
        assert!(no_template.is_refusal());
        let labels = CausalEngineError::Labels {
            path: "m".into(),
            why: "no single token".into(),
        };
        assert!(labels.is_refusal());
        let io_tokenizer = CausalEngineError::Tokenizer(ChatTokenizerError::Io {
            path: "m".into(),
            source: io(),
        });
        assert!(!io_tokenizer.is_refusal());
        let mlx = EngineError::Load(LoadError::Mlx {
            name: "w".into(),
            source: mlx_rs::error::Exception::custom("out of memory"),
        });
        assert!(!mlx.is_refusal());
        let shape = EngineError::Load(LoadError::ShapeMismatch {
            name: "w".into(),
            file: "m".into(),
            found: vec![1],
            expected: vec![2],
        });
        assert!(shape.is_refusal());
    }

    #[test]
    fn too_large_is_a_refusal_only_against_a_limit_that_cannot_grow_by_itself() {
        let refusal = |limit_source| {
            EngineError::Load(LoadError::TooLarge(Box::new(TooLarge {
                dir: "m".into(),
                activation: "float32",
                plan: MemoryPlan {
                    stored: 2,
                    mapped: 0,
                    allocated: 2,
                    largest_converted: 1,
                    largest: 1,
                },
                limit: 1,
                limit_source,
            })))
            .is_refusal()
        };
        assert!(!refusal(LimitSource::Available("/proc/meminfo".into())));
        assert!(refusal(LimitSource::Setting));
        assert!(refusal(LimitSource::Physical));
    }
}
