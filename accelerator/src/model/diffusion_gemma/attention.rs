//! Self-attention of one layer: sliding or full, GQA, q/k norms, weightless v norm, K=V on full
//! layers, RoPE, score scale 1.0 (the q/k norms stand in for 1/√d).

use mlx_rs::{fast, ops, Array};

use super::{
    config::{AttentionKind, LayerConfig},
    rope::Rope,
};
use crate::model::kv::{ChunkMasks, LayerKv};
use crate::model::{linear::Linear, norm::RmsNorm, widened, ModelError};

/// One layer's attention block.
#[derive(Clone, Debug)]
pub struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    /// `None` on K=V (full) layers: values are the raw `k_proj` output.
    v_proj: Option<Linear>,
    o_proj: Linear,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    v_norm: RmsNorm,
    rope: Rope,
    kind: AttentionKind,
    num_heads: i32,
    num_kv_heads: i32,
    head_dim: i32,
}

impl Attention {
    /// From the projections and norms. `v_proj` must be `None` exactly when `layer.k_eq_v`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        layer: &LayerConfig,
        num_heads: i32,
        q_proj: Linear,
        k_proj: Linear,
        v_proj: Option<Linear>,
        o_proj: Linear,
        q_norm: RmsNorm,
        k_norm: RmsNorm,
        rope: Rope,
        eps: f32,
    ) -> Self {
        Self {
            q_proj,
            k_proj,
            v_proj,
            o_proj,
            q_norm,
            k_norm,
            v_norm: RmsNorm::no_scale(eps),
            rope,
            kind: layer.kind,
            num_heads,
            num_kv_heads: layer.num_kv_heads,
            head_dim: layer.head_dim,
        }
    }

    /// One layer's attention over a batch of segments laid end to end in `x` `[1, N, hidden]`
    /// (already input-normed): prompt chunks and canvas groups of different reads. The
    /// projections, norms and output projection run over all `N` rows at once; RoPE and the
    /// attention itself run per segment, with exactly the shapes that segment has when it runs
    /// alone, so a row's result does not depend on what else is in the batch (given
    /// row-independent matmuls; see docs/batching.md). Returns the output `[1, N, hidden]` and,
    /// for each prompt-chunk segment (in order), the chunk's own K/V to keep.
    pub fn forward(
        &self,
        x: &Array,
        segments: &[Segment<'_>],
    ) -> Result<(Array, Vec<LayerKv>), ModelError> {
        let rows: i32 = segments.iter().map(|s| s.rows).sum();
        if rows != x.dim(1) {
            return Err(ModelError::Shape("segment rows do not add up to the batch"));
        }
        let q_all = self.q_proj.forward(x)?;
        let k_all = self.k_proj.forward(x)?;
        let v_all = match &self.v_proj {
            Some(v_proj) => Some(v_proj.forward(x)?),
            None => None,
        };
        let bounds: Vec<i32> = segments
            .iter()
            .scan(0, |at, s| {
                *at += s.rows;
                Some(*at)
            })
            .take(segments.len().saturating_sub(1))
            .collect();
        let split = |t: &Array| -> Result<Vec<Array>, ModelError> {
            if bounds.is_empty() {
                Ok(vec![t.clone()])
            } else {
                Ok(t.split_at_indices(&bounds, 1)?)
            }
        };
        let qs = split(&q_all)?;
        let ks = split(&k_all)?;
        let vs = match &v_all {
            Some(v) => Some(split(v)?),
            None => None,
        };
        let mut outputs = Vec::with_capacity(segments.len());
        let mut chunk_kvs = Vec::new();
        for (i, segment) in segments.iter().enumerate() {
            let (b, l) = segment.batch_and_width()?;
            let heads = |t: &Array, n: i32| t.reshape(&[b, l, n, self.head_dim]);
            let q = heads(&qs[i], self.num_heads)?;
            let k_raw = heads(&ks[i], self.num_kv_heads)?;
            let v = match &vs {
                Some(vs) => heads(&vs[i], self.num_kv_heads)?,
                // K=V: values are the raw key projection, before k_norm and RoPE.
                None => k_raw.clone(),
            };
            let offset = segment.attend.first_position();
            let q = self
                .rope
                .forward(&self.q_norm.forward(&q)?.swap_axes(1, 2)?, offset)?;
            let k = self
                .rope
                .forward(&self.k_norm.forward(&k_raw)?.swap_axes(1, 2)?, offset)?;
            let v = self.v_norm.forward(&v)?.swap_axes(1, 2)?;
            let out = match &segment.attend {
                Attend::Chunk { past, masks, .. } => {
                    let out = self.chunk_attention(&q, &k, &v, past, masks)?;
                    chunk_kvs.push(LayerKv { keys: k, values: v });
                    out
                }
                Attend::Canvas { cache, .. } => self.canvas_attention(&q, k, v, cache, b)?,
            };
            outputs.push(out.swap_axes(1, 2)?.reshape(&[
                1,
                b * l,
                self.num_heads * self.head_dim,
            ])?);
        }
        let attn = if outputs.len() == 1 {
            outputs.swap_remove(0)
        } else {
            ops::concatenate(&outputs, 1)?
        };
        Ok((self.o_proj.forward(&attn)?, chunk_kvs))
    }

    /// Encoder attention of one prompt chunk over the earlier chunks' K/V and its own, under
    /// the chunk's precomputed mask for this layer's kind (see [`ChunkMasks`]).
    fn chunk_attention(
        &self,
        q: &Array,
        k: &Array,
        v: &Array,
        past: &[&LayerKv],
        masks: &ChunkMasks,
    ) -> Result<Array, ModelError> {
        let (used, mask) = match self.kind {
            AttentionKind::Full => (past, None),
            AttentionKind::Sliding => (
                past.get(masks.sliding_first()..).unwrap_or_default(),
                masks.sliding_mask(),
            ),
        };
        let (keys, values) = if used.is_empty() {
            (k.clone(), v.clone())
        } else {
            let mut keys: Vec<&Array> = used.iter().map(|kv| &kv.keys).collect();
            keys.push(k);
            let mut values: Vec<&Array> = used.iter().map(|kv| &kv.values).collect();
            values.push(v);
            (ops::concatenate(&keys, 2)?, ops::concatenate(&values, 2)?)
        };
        let mask = match mask {
            Some(mask) if keys.dim(2) != mask.dim(3) => {
                return Err(ModelError::Shape("chunk mask and keys disagree"));
            }
            Some(mask) => fast::ScaledDotProductAttentionMask::Array(mask),
            None => fast::ScaledDotProductAttentionMask::Causal,
        };
        sdpa(q, &keys, &values, Some(mask))
    }

    /// Decoder attention: canvases (`b` of them) attend, without a mask, to the cached prompt
    /// K/V (read-only, batch 1, broadcast to `b`) followed by their own K/V.
    fn canvas_attention(
        &self,
        q: &Array,
        k: Array,
        v: Array,
        cache: &LayerKv,
        b: i32,
    ) -> Result<Array, ModelError> {
        let broadcast = |t: &Array| -> Result<Array, ModelError> {
            let mut shape = t.shape().to_vec();
            shape[0] = b;
            Ok(ops::broadcast_to(t, &shape)?)
        };
        let keys = ops::concatenate(&[broadcast(&cache.keys)?, k], 2)?;
        let values = ops::concatenate(&[broadcast(&cache.values)?, v], 2)?;
        sdpa(q, &keys, &values, None)
    }

    /// Whether this is a sliding-window layer.
    pub fn is_sliding(&self) -> bool {
        self.kind == AttentionKind::Sliding
    }
}

/// Scaled dot-product attention (scale 1), in the activation dtype. On MLX's CPU backend that
/// is float32 (`ActivationDtype::compute`): its bf16 matmuls run in a portable loop several
/// times slower than float32 (`model::widened`), so a bf16 model computes its activations, and
/// keeps its K/V, in float32 there.
fn sdpa(
    q: &Array,
    keys: &Array,
    values: &Array,
    mask: Option<fast::ScaledDotProductAttentionMask<'_>>,
) -> Result<Array, ModelError> {
    widened::note_native(&[q, keys, values]);
    Ok(fast::scaled_dot_product_attention(
        q, keys, values, 1.0, mask, None,
    )?)
}

/// What one segment of a batched forward attends to (one layer's view).
#[derive(Debug)]
pub enum Attend<'a> {
    /// A prompt chunk whose first token sits at absolute position `start`; `past` is this
    /// layer's K/V of the prompt's earlier chunks, in order.
    Chunk {
        start: i32,
        past: Vec<&'a LayerKv>,
        masks: &'a ChunkMasks,
    },
    /// `batch` canvases after a prompt of `prompt_len` tokens whose K/V for this layer is
    /// `cache` (sliding layers: the prompt's last `sliding_window - 1` positions).
    Canvas {
        cache: &'a LayerKv,
        prompt_len: i32,
        batch: i32,
    },
}

impl Attend<'_> {
    fn first_position(&self) -> i32 {
        match self {
            Attend::Chunk { start, .. } => *start,
            Attend::Canvas { prompt_len, .. } => *prompt_len,
        }
    }
}

/// A run of consecutive rows of a batched forward that attend together.
#[derive(Debug)]
pub struct Segment<'a> {
    /// Rows (tokens) in the segment: the chunk length, or canvases × width.
    pub rows: i32,
    pub attend: Attend<'a>,
}

impl Segment<'_> {
    fn batch_and_width(&self) -> Result<(i32, i32), ModelError> {
        match &self.attend {
            Attend::Chunk { .. } => Ok((1, self.rows)),
            Attend::Canvas { batch, .. } if *batch > 0 && self.rows % batch == 0 => {
                Ok((*batch, self.rows / batch))
            }
            Attend::Canvas { .. } => Err(ModelError::Shape("canvas rows not a multiple of batch")),
        }
    }

    /// Whether the segment is a prompt chunk (encoder) rather than canvases (decoder).
    pub fn is_chunk(&self) -> bool {
        matches!(self.attend, Attend::Chunk { .. })
    }
}
