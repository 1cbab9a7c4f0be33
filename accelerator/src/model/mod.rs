//! The models' math, one folder per family over shared blocks (docs/architecture.md, "The
//! accelerator's families"): [`diffusion_gemma`] (the diffusion model) and [`causal`] (chat
//! models read from their label logits: Llama, Qwen3, Gemma 3). Shared by both: [`linear`]
//! (dense and quantised products), [`norm`], [`fused`] (compiled elementwise kernels),
//! [`widened`] (narrow weights widened per call on the CPU) and [`kv`] (a prompt chunk's keys,
//! values and masks). Loading lives in the checkpoint module; these types only hold arrays and
//! compute.

pub mod causal;
pub mod diffusion_gemma;
pub mod encoder;
pub mod fused;
pub mod kv;
pub mod linear;
pub mod norm;
pub mod widened;

pub use diffusion_gemma::{
    ActivationDtype, AttentionKind, CanvasBatch, ChunkKv, Config, ConfigError, DiffusionGemma,
    Experts, ForwardOutput, LayerConfig, PromptCache, PromptChunk, RopeConfig,
    DEFAULT_PREFILL_CHUNK,
};

/// The MLX operations evaluating `outputs` would run (the distinct primitives of their
/// unevaluated graph). For benchmarks and diagnostics: it walks the whole graph.
pub fn graph_operations(outputs: &[&mlx_rs::Array]) -> usize {
    let handles: Vec<mlx_sys::mlx_array> = outputs.iter().map(|a| a.as_ptr()).collect();
    // SAFETY: the handles are live arrays borrowed for the call; the helper only reads them.
    unsafe { mlx_sys::hunch_mlx_graph_operations(handles.as_ptr(), handles.len()) }
}
pub use linear::Linear;

/// Why a forward pass failed.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// An MLX operation failed (shape mismatch inside MLX, unsupported op on this device…).
    #[error("MLX: {0}")]
    Mlx(#[from] mlx_rs::error::Exception),
    /// `prefill` needs at least one token.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// `denoise` needs at least one canvas of at least one token.
    #[error("no canvas to denoise (empty batch or zero width)")]
    EmptyBatch,
    /// All canvases of a batch must have the same width.
    #[error(
        "canvas {row} has {width} tokens but canvas 0 has {expected}; a batch needs equal widths"
    )]
    RaggedCanvases {
        /// Index of the offending canvas.
        row: usize,
        /// Its width.
        width: usize,
        /// The width of canvas 0.
        expected: usize,
    },
    /// A token id outside the vocabulary.
    #[error("token id {token} is outside the vocabulary (size {vocab})")]
    TokenOutOfRange {
        /// The id.
        token: u32,
        /// Vocabulary size.
        vocab: i32,
    },
    /// Prompt plus canvas run past the model's position range.
    #[error(
        "{needed} positions (prompt + canvas) exceed the model's max_position_embeddings {max}"
    )]
    TooLong {
        /// Positions the call needs.
        needed: usize,
        /// `max_position_embeddings`.
        max: i32,
    },
    /// Self-conditioning logits of the wrong shape.
    #[error(
        "self-conditioning logits have shape {found:?}; expected [{batch} or 1, {width}, {vocab}]"
    )]
    SelfConditioningShape {
        /// Shape given.
        found: Vec<i32>,
        /// Canvases in the batch.
        batch: i32,
        /// Canvas width.
        width: i32,
        /// Vocabulary size.
        vocab: i32,
    },
    /// A prompt cache from a different model (layer count differs).
    #[error("the prompt cache has {found} layers, the model {expected}")]
    CacheMismatch {
        /// Layers in the model.
        expected: usize,
        /// Layers in the cache.
        found: usize,
    },
    /// A position to unembed past the canvas width.
    #[error("canvas position {position} is outside the canvas (width {width})")]
    PositionOutOfRange {
        /// The position asked for.
        position: usize,
        /// Canvas width.
        width: usize,
    },
    /// An internal shape invariant failed.
    #[error("internal shape error: {0}")]
    Shape(&'static str),
    /// The router's expert choice could not be read on the host.
    #[error("reading the router's choice: {0}")]
    RouterChoice(String),
    /// A BLAS call of the native CPU path failed (no sgemm, or shapes it refused).
    #[error("BLAS: {0}")]
    Blas(#[from] crate::blas::BlasError),
    /// The native CPU path was asked for but cannot serve this model; says why.
    #[error("the native CPU kernels cannot serve this model: {0}")]
    NativeKernels(String),
    /// The raw NVFP4 call failed.
    #[error("nvfp4: {0}")]
    Nvfp4(String),
}
