//! Encoders: bidirectional transformers read at marker tokens rather than at a last position.
//!
//! - [`attention`]: multi-head attention over a fused q/k/v projection, unmasked or within a
//!   symmetric window, with or without RoPE (the block both stacks below share);
//! - [`modern_bert`]: the ModernBERT encoder (alternating global and sliding-window layers,
//!   gated GELU MLPs, LayerNorms without biases);
//! - [`marker_head`]: llama.cpp's `laya` decision head over it: a question-type embedding,
//!   PyTorch-style encoder blocks and a scorer read at each option's marker;
//! - [`native`]: attention and GELU on the native CPU kernels, where MLX's CPU backend runs
//!   their exponentials and erf one scalar at a time ([`EncoderKernels`]).
//!
//! Loading (a GGUF's tensors and keys) lives in `checkpoint::gguf::modern_bert`; these types
//! only hold arrays and compute, in float32 (docs/models.md, "Decision models").

pub mod attention;
pub mod marker_head;
pub mod modern_bert;
pub mod native;

pub use attention::BidirectionalAttention;
pub use marker_head::{HeadBlock, MarkerHead, QuestionType};
pub use modern_bert::{EncoderLayer, ModernBert, ModernBertConfig};

use hunch_kernels::quant::Precision;

/// How an encoder's heavy steps run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EncoderKernels {
    /// Attention and GELU on the native CPU kernels ([`native`]) instead of MLX's operations
    /// (packed weights' products are native either way: `Linear::forward_native`).
    pub native: bool,
    /// How packed weights' products round their inputs.
    pub precision: Precision,
}
