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
//! It serves a model only when every weight the chunk reads is a dense, row-contiguous float32
//! array (what `--affine-weights auto` makes of a small model on the CPU); it borrows their
//! values and copies nothing. Quantised or narrow weights keep the MLX path.

pub use hunch_kernels as kernels;

mod attention;
mod forward;
mod rope;

use std::fmt;
use std::str::FromStr;

pub use forward::forward_chunk;

use forward::{dense, norm_weight};

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

/// The native path's name in fingerprints: the instruction set decides the last bits.
pub fn native_name() -> String {
    format!("native-{}", kernels::isa().name())
}

/// `Ok` when the native path can run `lm`: a BLAS `sgemm` is reachable and every weight a chunk
/// reads (embedding, every layer's projections and norms, the final norm) is dense,
/// row-contiguous float32. Otherwise why not, naming the first weight that does not qualify.
/// Checking evaluates the weights (they would be on the first chunk anyway).
pub fn check(model: &Weights<'_>) -> Result<(), String> {
    if !crate::blas::sgemm_available() {
        return Err("no BLAS sgemm is reachable from this process".into());
    }
    let linear = |name: &str, l: &Linear| {
        dense(l).map(|_| ()).map_err(|_| {
            format!(
                "{name} is not a dense contiguous float32 weight ({:?})",
                l.dtype()
            )
        })
    };
    let norm = |name: &str, n: &RmsNorm| {
        norm_weight(n)
            .map(|_| ())
            .map_err(|_| format!("{name}'s weight is not contiguous float32"))
    };
    linear("the embedding", model.embedding)?;
    norm("the final norm", model.norm)?;
    for (i, layer) in model.layers.iter().enumerate() {
        let a = &layer.attention;
        for (what, l) in [
            ("q_proj", &a.q_proj),
            ("k_proj", &a.k_proj),
            ("v_proj", &a.v_proj),
            ("o_proj", &a.o_proj),
            ("gate_proj", &layer.mlp.gate),
            ("up_proj", &layer.mlp.up),
            ("down_proj", &layer.mlp.down),
        ] {
            linear(&format!("layer {i} {what}"), l)?;
        }
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
    Ok(())
}
