//! Bidirectional multi-head attention over a fused q/k/v projection: every query sees every key
//! (a global layer, the laya head's blocks) or only the keys within a symmetric window (a
//! ModernBERT local layer: key `j` is visible from query `i` when `|i − j| ≤ window`, llama.cpp's
//! symmetric sliding window). Queries and keys may be rotated first (NeoX / rotate-half RoPE,
//! positions from 0, the whole head).

use mlx_rs::{fast, ops, Array, Dtype};

use super::{native, EncoderKernels};
use crate::model::{linear::Linear, ModelError};

/// One attention block's projections.
#[derive(Clone, Debug)]
pub struct BidirectionalAttention {
    /// `[3·hidden, hidden]`: the query rows, then the key rows, then the value rows.
    pub qkv: Linear,
    /// `[3·hidden]`, where the checkpoint has one.
    pub qkv_bias: Option<Array>,
    /// `[hidden, hidden]`.
    pub output: Linear,
    pub output_bias: Option<Array>,
    pub heads: i32,
    pub head_dim: i32,
}

/// `y + b`, or `y` where there is no bias.
pub(crate) fn biased(y: Array, bias: Option<&Array>) -> Result<Array, ModelError> {
    match bias {
        Some(b) => Ok(ops::add(&y, b)?),
        None => Ok(y),
    }
}

impl BidirectionalAttention {
    /// Attention over `x` `[1, L, hidden]` (already normed), before the residual add. `rope`:
    /// the RoPE base queries and keys are rotated with; `window`: the additive `[L, L]` mask
    /// MLX's attention takes (0 where a key is visible, −∞ elsewhere; [`window_mask`]) and the
    /// same window as the native kernels take it (keys at most this far), `(None, None)` for
    /// every key; `kernels`: MLX's attention or the native one, and how packed projections
    /// round their inputs ([`Linear::forward_native`]).
    pub fn forward(
        &self,
        x: &Array,
        rope: Option<f32>,
        (mask, window): (Option<&Array>, Option<usize>),
        kernels: EncoderKernels,
    ) -> Result<Array, ModelError> {
        let precision = kernels.precision;
        let len = x.dim(1);
        let hidden = self.heads * self.head_dim;
        let qkv = biased(
            float32(self.qkv.forward_native(x, precision)?)?,
            self.qkv_bias.as_ref(),
        )?;
        let parts = qkv.split_equal(3, -1)?;
        let heads = |t: &Array| -> Result<Array, ModelError> {
            Ok(t.reshape(&[1, len, self.heads, self.head_dim])?
                .transpose_axes(&[0, 2, 1, 3])?)
        };
        let (mut q, mut k, v) = (heads(&parts[0])?, heads(&parts[1])?, heads(&parts[2])?);
        if let Some(base) = rope {
            q = fast::rope(&q, self.head_dim, false, base, 1.0, 0, None)?;
            k = fast::rope(&k, self.head_dim, false, base, 1.0, 0, None)?;
        }
        let scale = 1.0 / (self.head_dim as f32).sqrt();
        let o = if kernels.native {
            // `[1, heads, L, d]` each, laid out in that order and read in place.
            let laid_out = [&q, &k, &v].map(|t| t.contiguous());
            let [q, k, v] = laid_out;
            let (q, k, v) = (q?, k?, v?);
            mlx_rs::transforms::eval([&q, &k, &v])?;
            fn slice(t: &Array) -> Result<&[f32], ModelError> {
                t.try_as_slice::<f32>()
                    .map_err(|_| ModelError::Shape("attention inputs are not contiguous"))
            }
            let out = native::attend(
                (slice(&q)?, slice(&k)?, slice(&v)?),
                self.heads as usize,
                self.head_dim as usize,
                window,
                scale,
            );
            Array::from_slice(&out, &[1, len, hidden])
        } else {
            let mask = mask.map(fast::ScaledDotProductAttentionMask::Array);
            let o = fast::scaled_dot_product_attention(&q, &k, &v, scale, mask, None)?;
            o.transpose_axes(&[0, 2, 1, 3])?
                .reshape(&[1, len, hidden])?
        };
        biased(
            float32(self.output.forward_native(&o, precision)?)?,
            self.output_bias.as_ref(),
        )
    }
}

/// The additive mask of a symmetric window over `len` positions: 0 where `|i − j| ≤ window`,
/// −∞ elsewhere (`[len, len]`, float32). Every row keeps its own position, so no row is empty.
pub fn window_mask(len: usize, window: usize) -> Array {
    let mut values = vec![f32::NEG_INFINITY; len * len];
    for i in 0..len {
        for j in i.saturating_sub(window)..(i + window + 1).min(len) {
            values[i * len + j] = 0.0;
        }
    }
    Array::from_slice(&values, &[len as i32, len as i32])
}

/// GELU in its exact (erf) form: `x · (1 + erf(x / √2)) / 2`, as ModernBERT's and the laya
/// scorer's `gelu` are.
pub fn gelu_erf(x: &Array) -> Result<Array, ModelError> {
    let inner = ops::erf(ops::multiply(
        x,
        Array::from_f32(std::f32::consts::FRAC_1_SQRT_2),
    )?)?;
    let one = ops::add(&inner, Array::from_f32(1.0))?;
    Ok(ops::multiply(
        &ops::multiply(x, &one)?,
        Array::from_f32(0.5),
    )?)
}

/// `x` as float32 (activations are float32 here; a float16 weight's product comes out float16).
pub(crate) fn float32(x: Array) -> Result<Array, ModelError> {
    Ok(if x.dtype() == Dtype::Float32 {
        x
    } else {
        x.as_dtype(Dtype::Float32)?
    })
}
