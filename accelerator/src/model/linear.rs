//! A bias-free linear layer whose weight is dense or affine-quantised.
//!
//! Loaders of every checkpoint layout build these through the public constructors; the math
//! only calls [`Linear::forward`] (and, for the tied embedding, [`Linear::rows`] and
//! [`Linear::forward_transposed`]).

use mlx_rs::{ops, Array};

use super::ModelError;

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
            Linear::Dense { weight } if transpose => Ok(ops::matmul(x, weight.t())?),
            Linear::Dense { weight } => Ok(ops::matmul(x, weight)?),
            Linear::Affine(q) => Ok(ops::quantized_matmul(
                x,
                &q.weight,
                &q.scales,
                &q.biases,
                transpose,
                q.group_size,
                q.bits,
            )?),
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
    pub fn dtype(&self) -> mlx_rs::Dtype {
        match self {
            Linear::Dense { weight } => weight.dtype(),
            Linear::Affine(q) => q.scales.dtype(),
        }
    }
}
