//! The native CPU forward of causal chat models' prompt chunks (docs/logit-read.md, "Kernels").
//!
//! MLX's CPU backend runs the products of a chunk in the BLAS but its elementwise work (the
//! attention softmax's exps, SiLU's sigmoid) one scalar at a time, with a libm call per fused
//! multiply-add, and fresh buffers for every operation: on SmolLM2-135M that was more of a
//! chunk's time than the products (docs/benchmarks.md, "Native CPU kernels for chat models").
//! This path runs the same chunk in Rust: the products through the same BLAS (`blas::sgemm`),
//! the rest in vectorised kernels, over buffers reused by every layer.
//!
//! - [`kernels`] (the `hunch-kernels` crate, optimised in dev builds too): exp, softmax,
//!   RMSNorm, SwiGLU/GeGLU, RoPE rotation, adds (AVX2+FMA or portable);
//! - `rope`: the cos/sin tables of a chunk's positions and their application head by head;
//! - `attention`: grouped-query attention of a chunk over the earlier chunks' K/V;
//! - `forward`: the chunk through every layer, K/V and the last hidden state out as MLX arrays.
//!
//! - `packed`: affine-quantised projections repacked for the integer products of
//!   [`kernels::quant`] (AVX-512 VNNI, AVX-VNNI, AVX2, NEON, dotprod or i8mm, chosen at run
//!   time), with activations quantised to 8 bits per block of 32.
//!
//! It serves a model when every projection is a dense, row-contiguous float32 array (borrowed,
//! not copied), a bf16/f16 one (widened once, up to 6 GiB in all) or an affine 4- or 8-bit one
//! (repacked once, 0.75 bytes a weight at 4 bits, 1.25 at 8) where the CPU runs the integer
//! products fast; norms must be float32.

pub use hunch_kernels as kernels;

mod attention;
mod forward;
mod packed;
mod rope;

use std::fmt;
use std::str::FromStr;

pub use forward::{forward_batch, forward_batch_rows, forward_chunk};
pub use packed::Packed;

use forward::norm_weight;

use crate::model::causal::blocks::DecoderLayer;
use crate::model::causal::config::CausalConfig;
use crate::model::kv::LayerKv;
use crate::model::linear::Linear;
use crate::model::norm::RmsNorm;

/// What a chunk reads of a model (borrowed from a `CausalLm`).
pub struct Weights<'a> {
    pub config: &'a CausalConfig,
    pub embedding: &'a Linear,
    pub layers: &'a [DecoderLayer],
    /// The final norm.
    pub norm: &'a RmsNorm,
}

/// An earlier chunk of the same prompt: its length and its K/V per layer.
pub struct PastChunk<'a> {
    pub len: usize,
    pub kv: &'a [LayerKv],
}

/// Which code runs a chat model's prompt chunks (`--causal-kernels`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CausalKernels {
    /// Native where MLX's default device is the CPU and every weight qualifies, else MLX.
    #[default]
    Auto,
    /// MLX's operations, on whatever device MLX uses.
    Mlx,
    /// The native CPU path, or an error saying why it cannot serve the model.
    Native,
}

impl CausalKernels {
    pub fn name(self) -> &'static str {
        match self {
            CausalKernels::Auto => "auto",
            CausalKernels::Mlx => "mlx",
            CausalKernels::Native => "native",
        }
    }
}

impl fmt::Display for CausalKernels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A `--causal-kernels` value that is none of `auto`, `mlx`, `native`.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not a kernel choice; use auto, mlx or native")]
pub struct UnknownKernels(pub String);

impl FromStr for CausalKernels {
    type Err = UnknownKernels;

    fn from_str(s: &str) -> Result<Self, UnknownKernels> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(CausalKernels::Auto),
            "mlx" => Ok(CausalKernels::Mlx),
            "native" => Ok(CausalKernels::Native),
            _ => Err(UnknownKernels(s.to_owned())),
        }
    }
}

/// The native path's name in fingerprints: the instruction sets decide the last bits (and
/// whether the integer products run, which round activations), and `rowattn` the attention's
/// order of sums (each row over its own keys; before it, the BLAS's products).
pub fn native_name(packed: &Packed) -> String {
    let mut name = format!("native-{}+rowattn", kernels::isa().name());
    if packed.any() {
        name.push('+');
        name.push_str(kernels::quant::quant_isa().name());
        name.push('-');
        name.push_str(packed.precision().name());
    }
    name
}

/// The weights prepared for the native path when it can run `lm`: a BLAS `sgemm` is reachable,
/// every projection is dense row-contiguous float32 or affine 4/8-bit (repacked here, where
/// the integer products are fast or `force_int8` asks for them anyway), the embedding is one of
/// the two, and every norm is float32. Otherwise why not, naming the first weight that does not
/// qualify. Checking evaluates the weights (they would be on the first chunk anyway).
pub fn prepare(model: &Weights<'_>, force_int8: bool) -> Result<Packed, String> {
    if !crate::blas::sgemm_available() {
        return Err("no BLAS sgemm is reachable from this process".into());
    }
    let int8 = packed::int8_allowed(force_int8);
    let norm = |name: &str, n: &RmsNorm| {
        norm_weight(n)
            .map(|_| ())
            .map_err(|_| format!("{name}'s weight is not contiguous float32"))
    };
    // The embedding's rows are read as float32, or dequantised/widened by MLX a chunk's tokens
    // at a time; the projections are checked (and prepared) by `Packed::new`.
    norm("the final norm", model.norm)?;
    for (i, layer) in model.layers.iter().enumerate() {
        let a = &layer.attention;
        let norms = [
            Some(("input norm", &layer.input_norm)),
            Some(("pre-MLP norm", &layer.pre_mlp_norm)),
            layer
                .post_attention_norm
                .as_ref()
                .map(|n| ("post-attention norm", n)),
            layer.post_mlp_norm.as_ref().map(|n| ("post-MLP norm", n)),
            a.q_norm.as_ref().map(|n| ("q norm", n)),
            a.k_norm.as_ref().map(|n| ("k norm", n)),
        ];
        for (what, n) in norms.into_iter().flatten() {
            norm(&format!("layer {i} {what}"), n)?;
        }
        if a.rope.inverse_frequencies().is_err() {
            return Err(format!("layer {i}'s rotary embedding has no frequencies"));
        }
    }
    Packed::new(model.layers, int8)
}
