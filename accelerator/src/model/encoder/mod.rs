//! Encoders: bidirectional transformers read at marker tokens rather than at a last position.
//!
//! - [`attention`]: multi-head attention over a fused q/k/v projection, unmasked or within a
//!   symmetric window, with or without RoPE (the block both stacks below share);
//! - [`modern_bert`]: the ModernBERT encoder (alternating global and sliding-window layers,
//!   gated GELU MLPs, LayerNorms without biases);
//! - [`marker_head`]: llama.cpp's `laya` decision head over it: a question-type embedding,
//!   PyTorch-style encoder blocks and a scorer read at each option's marker.
//!
//! Loading (a GGUF's tensors and keys) lives in `checkpoint::gguf::modern_bert`; these types
//! only hold arrays and compute, in float32 (docs/models.md, "Decision models").

pub mod attention;
pub mod marker_head;
pub mod modern_bert;

pub use attention::BidirectionalAttention;
pub use marker_head::{HeadBlock, MarkerHead, QuestionType};
pub use modern_bert::{EncoderLayer, ModernBert, ModernBertConfig};
