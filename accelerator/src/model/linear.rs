//! A bias-free linear layer whose weight is dense or affine-quantised.
//!
//! Loaders of every checkpoint layout build these through the public constructors; the math
//! only calls [`Linear::forward`] (and, for the tied embedding, [`Linear::rows`] and
//! [`Linear::forward_transposed`]).

use mlx_rs::{ops, Array, Dtype};

use super::{widened, ModelError};

/// Weight of a linear map `y = x · Wᵀ`, `W` of logical shape `[out, in]`.
#[derive(Clone, Debug)]
pub enum Linear {
    /// Plain weight `[out, in]` in the activation dtype.
    Dense {
        /// `[out, in]`.
        weight: Array,
    },
    /// MLX affine quantisation of `[out, in]`.
    Affine(Affine),
}

/// MLX affine quantisation (mlx-community layout) of a weight `[..., out, in]` (one matrix, or
/// a stack of experts): `weight` uint32 `[..., out, in·bits/32]`, `scales` and `biases`
/// `[..., out, in/group_size]`, as `mlx.core.quantize` produces them.
#[derive(Clone, Debug)]
pub struct Affine {
    /// Packed codes.
    pub weight: Array,
    /// One scale per group.
    pub scales: Array,
    /// One bias per group.
    pub biases: Array,
    /// Inputs per quantisation group (64 in mlx-community checkpoints).
    pub group_size: i32,
    /// Bits per code (4 or 8).
    pub bits: i32,
}

impl Affine {
    /// The parts `mlx.core.quantize` returns, and the group size and bits it was given.
    pub fn new(weight: Array, scales: Array, biases: Array, group_size: i32, bits: i32) -> Self {
        Affine {
            weight,
            scales,
            biases,
            group_size,
            bits,
        }
    }

    /// Runs one of MLX's quantized kernels (`quantized_matmul`, `gather_qmm`), given as
    /// `kernel(x, scales, biases)`, on `x` with this module's scales and biases.
    ///
    /// MLX's CPU backend (the prebuilt Linux wheels) runs these kernels one scalar at a time,
    /// and in bfloat16 or float16 every multiply and add converts to float32 and rounds back,
    /// the running sum included: at DiffusionGemma's shapes a bfloat16 product took 7–10x as
    /// long as the float32 one and was off by up to 12% of its range
    /// (docs/checkpoint-layouts.md, "Affine products on the CPU"). So on the CPU, inputs
    /// narrower than float32 are widened for the call: the activations, and the scales and
    /// biases (exactly; the widened copies are transient, one module's at a time, never kept,
    /// so resident memory stays what the checkpoint stores). The result is cast back to what
    /// MLX would have returned. Other backends get everything as stored.
    pub(crate) fn run_kernel(
        &self,
        x: &Array,
        kernel: impl FnOnce(&Array, &Array, &Array) -> Result<Array, mlx_rs::error::Exception>,
    ) -> Result<Array, ModelError> {
        let narrow = x.dtype() != Dtype::Float32 || self.scales.dtype() != Dtype::Float32;
        if !narrow || !widened::cpu_backend()? {
            widened::note_native(&[x, &self.scales]);
            return Ok(kernel(x, &self.scales, &self.biases)?);
        }
        widened::note(widened::Path::Widened);
        let natural = result_dtype(x.dtype(), self.scales.dtype());
        let y = kernel(
            &x.as_dtype(Dtype::Float32)?,
            &self.scales.as_dtype(Dtype::Float32)?,
            &self.biases.as_dtype(Dtype::Float32)?,
        )?;
        Ok(if natural == Dtype::Float32 {
            y
        } else {
            y.as_dtype(natural)?
        })
    }
}

/// The dtype MLX gives a quantized product of activations `x` with scales `s` (the wider of
/// the two floating types; float32 where they are bfloat16 and float16).
fn result_dtype(x: Dtype, s: Dtype) -> Dtype {
    match (x, s) {
        (a, b) if a == b => a,
        (Dtype::Bfloat16, Dtype::Float16) | (Dtype::Float16, Dtype::Bfloat16) => Dtype::Float32,
        (Dtype::Float32, _) | (_, Dtype::Float32) => Dtype::Float32,
        (Dtype::Float64, _) | (_, Dtype::Float64) => Dtype::Float64,
        (a, _) => a,
    }
}

impl Linear {
    /// A dense weight of shape `[out, in]`.
    pub fn dense(weight: Array) -> Self {
        Linear::Dense { weight }
    }

    /// An affine-quantised weight as `mlx.core.quantize` produces it.
    pub fn affine(weight: Array, scales: Array, biases: Array, group_size: i32, bits: i32) -> Self {
        Linear::Affine(Affine::new(weight, scales, biases, group_size, bits))
    }

    /// `x · Wᵀ` over the last axis of `x`.
    pub fn forward(&self, x: &Array) -> Result<Array, ModelError> {
        self.product(x, true)
    }

    /// `x · W` (x's last axis has `out` entries): the soft embedding `p · E` of self-conditioning.
    pub fn forward_transposed(&self, x: &Array) -> Result<Array, ModelError> {
        self.product(x, false)
    }

    /// `x · Wᵀ` when `transpose`, else `x · W`.
    fn product(&self, x: &Array, transpose: bool) -> Result<Array, ModelError> {
        match self {
            // bf16 weights in float32 on the CPU, a slice at a time (`widened`).
            Linear::Dense { weight } => widened::dense_matmul(x, weight, transpose),
            Linear::Affine(q) => q.run_kernel(x, |x, scales, biases| {
                ops::quantized_matmul(
                    x,
                    &q.weight,
                    scales,
                    biases,
                    transpose,
                    q.group_size,
                    q.bits,
                )
            }),
        }
    }

    /// Rows `W[ids]` (embedding lookup), dequantised; `ids` of any shape, result `[..., in]`.
    pub fn rows(&self, ids: &Array) -> Result<Array, ModelError> {
        match self {
            Linear::Dense { weight } => Ok(weight.take_axis(ids, 0)?),
            Linear::Affine(q) => {
                let w = q.weight.take_axis(ids, 0)?;
                let s = q.scales.take_axis(ids, 0)?;
                let b = q.biases.take_axis(ids, 0)?;
                Ok(ops::dequantize(&w, &s, &b, q.group_size, q.bits)?)
            }
        }
    }

    /// The dtype results come out in (the dense weight's or the scales').
    pub fn dtype(&self) -> Dtype {
        match self {
            Linear::Dense { weight } => weight.dtype(),
            Linear::Affine(q) => q.scales.dtype(),
        }
    }
}
