//! GGUF files (llama.cpp, Ollama, LM Studio): metadata, tensor infos and their weights as MLX arrays.
//!
//! - `file`: the header (magic, version 2 or 3, metadata, tensor infos) over one private
//!   mapping, every tensor checked to lie inside the file when it opens;
//! - `types`: ggml's tensor types and their block sizes;
//! - `blocks`: Q4_0, Q4_1 and Q8_0 repacked exactly into MLX's affine layout (group 32), and
//!   Q5_0, Q5_1 and Q8_1 dequantised;
//! - `kquants`: Q2_K to Q8_K dequantised;
//! - `pack`: Q4_0, Q4_1, Q8_0, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K decoded straight into the native
//!   integer products' packing ([`GgufFile::pack`]), for a model served on the native path;
//! - `decision`: llama.cpp's decision-model keys (`{arch}.decision.*`, the `systemone`
//!   template), read as llama-server reads them; `decision_head`: a kev model's pointer head
//!   (`cls.output`) as float32 values;
//! - `float`: the element types dequantised tensors are written in, and ggml's f16 scales;
//! - `load`: the arrays of one tensor ([`GgufFile::load`]) and what they will take
//!   ([`GgufFile::resident_bytes`]).
//!
//! GGUF lists dims fastest-varying first; everything handed out here is row-major (an
//! `[out, in]` weight stored with dims `[in, out]` loads as `[out, in]`). Names stay llama.cpp's
//! (`blk.0.attn_q.weight`), and so does its permutation of the q and k rows: both are the
//! model loaders' to undo.

mod blocks;
mod decision;
mod decision_head;
mod error;
mod file;
mod float;
mod kquants;
mod load;
mod meta;
mod pack;
mod types;

#[cfg(test)]
pub(crate) mod quantise;
#[cfg(test)]
mod tests;
#[cfg(test)]
pub(crate) mod writer;

pub use decision::{
    decision_metadata, decision_type_key, DecisionKind, DecisionMetadata, DecisionMetadataError,
    LayaMetadata, SERVED_DECISION_TYPES,
};
pub use decision_head::{pointer_head_tensors, HeadTensor, POINTER_HEAD_BIAS, POINTER_HEAD_WEIGHT};
pub use error::GgufError;
pub use file::{GgufFile, GgufTensorInfo};
pub use load::{GgufWeight, GROUP_SIZE};
pub use meta::MetaValue;
pub use pack::{packed_bytes, packs, GgufRows};
pub use types::{FloatDtype, GgmlType, QK_K};
