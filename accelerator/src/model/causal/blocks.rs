//! The blocks the causal architectures share: RoPE with the configs' frequency adjustments,
//! attention over a prompt chunk and the chunks before it, the gated MLP, and the decoder layer
//! that joins them with its norms.
//!
//! A prompt runs as chunks whose bounds sit at fixed absolute positions (multiples of the
//! chunk length from position 0). Each chunk's computation has shapes that depend only on its
//! index, so its keys and values are the same bits whether the chunks before it were computed
//! just now or restored from the prefix cache (docs/logit-read.md, "Exactness").

use mlx_rs::{fast, ops, Array};

use super::config::{Activation, CausalConfig, RopeSpec};
use crate::model::kv::{ChunkMasks, LayerKv};
use crate::model::{fused, linear::Linear, norm::RmsNorm, ModelError};

/// Rotary embedding, rotate-half convention (Hugging Face's order of the q/k rows).
#[derive(Clone, Debug)]
pub struct CausalRope {
    dims: i32,
    base: Option<f32>,
    scale: f32,
    /// Periods per pair when the config adjusts frequencies (Llama 3).
    periods: Option<Array>,
}

impl CausalRope {
    /// The rotation `spec` makes of `head_dim`-wide heads (its frequencies: [`RopeSpec::periods`]).
    pub fn new(spec: &RopeSpec, head_dim: i32) -> Self {
        match spec.periods(head_dim) {
            None => CausalRope {
                dims: head_dim,
                base: Some(spec.theta),
                scale: spec.position_scale(),
                periods: None,
            },
            Some(periods) => CausalRope {
                dims: head_dim,
                base: None,
                scale: spec.position_scale(),
                periods: Some(Array::from_slice(&periods, &[head_dim / 2])),
            },
        }
    }

    /// The inverse frequency of each rotary pair (`head_dim / 2` of them), in float32 as MLX's
    /// `fast::rope` makes them: `exp(−i · ln(base) / (d/2))` from a base, `1 / period` from
    /// periods. The native CPU path rotates with these (`causal::cpu`).
    pub(crate) fn inverse_frequencies(&self) -> Result<Vec<f32>, ModelError> {
        let half = (self.dims / 2).max(0) as usize;
        match (&self.periods, self.base) {
            (Some(periods), _) => {
                let periods = periods
                    .try_as_slice::<f32>()
                    .map_err(|_| ModelError::Shape("rope periods are not float32"))?;
                if periods.len() != half {
                    return Err(ModelError::Shape("rope periods and head_dim disagree"));
                }
                Ok(periods.iter().map(|p| 1.0 / p).collect())
            }
            (None, Some(base)) => {
                let step = base.ln() / half as f32;
                Ok((0..half).map(|i| (-(i as f32) * step).exp()).collect())
            }
            (None, None) => Err(ModelError::Shape("rope has neither base nor periods")),
        }
    }

    /// What positions are multiplied by before the angles (`1 / factor` under linear scaling).
    pub(crate) fn position_scale(&self) -> f32 {
        self.scale
    }

    /// Rotates `x` `[B, heads, L, head_dim]` for positions `offset .. offset + L`.
    pub fn forward(&self, x: &Array, offset: i32) -> Result<Array, ModelError> {
        Ok(fast::rope(
            x,
            self.dims,
            false,
            self.base,
            self.scale,
            offset,
            self.periods.as_ref(),
        )?)
    }
}

/// One layer's grouped-query attention.
#[derive(Clone, Debug)]
pub struct CausalAttention {
    pub q_proj: Linear,
    pub k_proj: Linear,
    pub v_proj: Linear,
    pub o_proj: Linear,
    /// Biases added after each projection, float32 (Qwen2's on q/k/v; `attention_bias`).
    pub biases: ProjectionBiases,
    /// Per-head norms of queries and keys (Qwen3, Gemma 3), before RoPE.
    pub q_norm: Option<RmsNorm>,
    pub k_norm: Option<RmsNorm>,
    pub rope: CausalRope,
    pub num_heads: i32,
    pub num_kv_heads: i32,
    pub head_dim: i32,
    pub scale: f32,
    /// `Some(window)` on sliding-window layers.
    pub window: Option<i32>,
}

/// The biases of an attention's projections, float32 `[out]` each, where the checkpoint has them.
#[derive(Clone, Debug, Default)]
pub struct ProjectionBiases {
    pub q: Option<Array>,
    pub k: Option<Array>,
    pub v: Option<Array>,
    pub o: Option<Array>,
}

/// `y + b` broadcast over rows, or `y` where there is no bias.
fn biased(y: Array, bias: Option<&Array>) -> Result<Array, ModelError> {
    match bias {
        Some(b) => Ok(ops::add(&y, b)?),
        None => Ok(y),
    }
}

impl CausalAttention {
    /// Attention of one chunk `x` `[1, L, hidden]` (already input-normed) starting at absolute
    /// position `start`, over `past` (this layer's K/V of the earlier chunks, in order) and
    /// itself. Returns the output and the chunk's own K/V.
    pub fn forward(
        &self,
        x: &Array,
        start: i32,
        past: &[&LayerKv],
        masks: &ChunkMasks,
    ) -> Result<(Array, LayerKv), ModelError> {
        let len = x.dim(1);
        let heads = |t: Array, n: i32| t.reshape(&[1, len, n, self.head_dim]);
        let b = &self.biases;
        let mut q = heads(
            biased(self.q_proj.forward(x)?, b.q.as_ref())?,
            self.num_heads,
        )?;
        let mut k = heads(
            biased(self.k_proj.forward(x)?, b.k.as_ref())?,
            self.num_kv_heads,
        )?;
        let v = heads(
            biased(self.v_proj.forward(x)?, b.v.as_ref())?,
            self.num_kv_heads,
        )?
        .swap_axes(1, 2)?;
        if let Some(norm) = &self.q_norm {
            q = norm.forward(&q)?;
        }
        if let Some(norm) = &self.k_norm {
            k = norm.forward(&k)?;
        }
        let q = self.rope.forward(&q.swap_axes(1, 2)?, start)?;
        let k = self.rope.forward(&k.swap_axes(1, 2)?, start)?;
        let (used, mask) = match self.window {
            None => (past, None),
            Some(_) => (
                past.get(masks.sliding_first()..).unwrap_or_default(),
                masks.sliding_mask(),
            ),
        };
        let (keys, values) = if used.is_empty() {
            (k.clone(), v.clone())
        } else {
            let mut keys: Vec<&Array> = used.iter().map(|kv| &kv.keys).collect();
            keys.push(&k);
            let mut values: Vec<&Array> = used.iter().map(|kv| &kv.values).collect();
            values.push(&v);
            (ops::concatenate(&keys, 2)?, ops::concatenate(&values, 2)?)
        };
        let mask = match mask {
            Some(mask) if mask.dim(3) != keys.dim(2) => {
                return Err(ModelError::Shape("chunk mask and keys disagree"));
            }
            Some(mask) => fast::ScaledDotProductAttentionMask::Array(mask),
            None => fast::ScaledDotProductAttentionMask::Causal,
        };
        let out =
            fast::scaled_dot_product_attention(&q, &keys, &values, self.scale, Some(mask), None)?;
        let out = out
            .swap_axes(1, 2)?
            .reshape(&[1, len, self.num_heads * self.head_dim])?;
        let out = biased(self.o_proj.forward(&out)?, b.o.as_ref())?;
        Ok((out, LayerKv { keys: k, values: v }))
    }
}

/// `down(act(gate(x)) ⊙ up(x))`.
#[derive(Clone, Debug)]
pub struct GatedMlp {
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
    pub activation: Activation,
}

impl GatedMlp {
    pub fn forward(&self, x: &Array) -> Result<Array, ModelError> {
        let g = self.gate.forward(x)?;
        let u = self.up.forward(x)?;
        let h = match self.activation {
            Activation::Silu => ops::multiply(&ops::multiply(&g, &ops::sigmoid(&g)?)?, &u)?,
            Activation::GeluTanh => fused::geglu(&g, &u)?,
        };
        self.down.forward(&h)
    }
}

/// One decoder layer: pre-norm attention and MLP with residuals; Gemma's sandwich norms
/// (after each block, before its residual add) where present.
#[derive(Clone, Debug)]
pub struct DecoderLayer {
    pub input_norm: RmsNorm,
    pub attention: CausalAttention,
    pub post_attention_norm: Option<RmsNorm>,
    pub pre_mlp_norm: RmsNorm,
    pub mlp: GatedMlp,
    pub post_mlp_norm: Option<RmsNorm>,
}

impl DecoderLayer {
    pub fn forward(
        &self,
        x: &Array,
        start: i32,
        past: &[&LayerKv],
        masks: &ChunkMasks,
    ) -> Result<(Array, LayerKv), ModelError> {
        let (mut r, kv) =
            self.attention
                .forward(&self.input_norm.forward(x)?, start, past, masks)?;
        if let Some(norm) = &self.post_attention_norm {
            r = norm.forward(&r)?;
        }
        let h = ops::add(x, &r)?;
        let mut r = self.mlp.forward(&self.pre_mlp_norm.forward(&h)?)?;
        if let Some(norm) = &self.post_mlp_norm {
            r = norm.forward(&r)?;
        }
        Ok((ops::add(&h, &r)?, kv))
    }
}

/// The attention settings of layer `index` under `config`.
pub fn layer_attention_geometry(config: &CausalConfig, index: usize) -> (RopeSpec, Option<i32>) {
    if config.sliding_layers.get(index).copied().unwrap_or(false) {
        (config.rope_local.clone(), Some(config.sliding_window))
    } else {
        (config.rope.clone(), None)
    }
}
