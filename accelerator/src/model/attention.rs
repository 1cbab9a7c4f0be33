//! Self-attention of one layer: sliding or full, GQA, q/k norms, weightless v norm, K=V on full
//! layers, RoPE, score scale 1.0 (the q/k norms stand in for 1/√d).

use mlx_rs::{fast, ops, Array};

use super::{
    config::{AttentionKind, LayerConfig},
    linear::Linear,
    norm::RmsNorm,
    rope::Rope,
    ModelError,
};

/// Keys and values of the prompt for one layer, `[1, kv_heads, T, head_dim]` each (already
/// normed and rotated). Sliding layers keep only the last `sliding_window - 1` positions.
#[derive(Clone, Debug)]
pub struct LayerKv {
    /// Keys.
    pub keys: Array,
    /// Values.
    pub values: Array,
}

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
    sliding_window: i32,
}

impl Attention {
    /// From the projections and norms. `v_proj` must be `None` exactly when `layer.k_eq_v`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        layer: &LayerConfig,
        num_heads: i32,
        sliding_window: i32,
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
            sliding_window,
        }
    }

    /// q, k, v of `x` `[B, L, hidden]` at positions `offset..offset+L`, as `[B, heads, L, hd]`.
    fn qkv(&self, x: &Array, offset: i32) -> Result<(Array, Array, Array), ModelError> {
        let (b, l) = (x.dim(0), x.dim(1));
        let heads = |t: Array, n: i32| t.reshape(&[b, l, n, self.head_dim]);
        let q = heads(self.q_proj.forward(x)?, self.num_heads)?;
        let k_raw = heads(self.k_proj.forward(x)?, self.num_kv_heads)?;
        let v = match &self.v_proj {
            Some(v_proj) => heads(v_proj.forward(x)?, self.num_kv_heads)?,
            // K=V: values are the raw key projection, before k_norm and RoPE.
            None => k_raw.clone(),
        };
        let q = self.q_norm.forward(&q)?.swap_axes(1, 2)?;
        let k = self.k_norm.forward(&k_raw)?.swap_axes(1, 2)?;
        let v = self.v_norm.forward(&v)?.swap_axes(1, 2)?;
        let q = self.rope.forward(&q, offset)?;
        let k = self.rope.forward(&k, offset)?;
        Ok((q, k, v))
    }

    fn output(&self, attn: Array, b: i32, l: i32) -> Result<Array, ModelError> {
        let attn = attn
            .swap_axes(1, 2)?
            .reshape(&[b, l, self.num_heads * self.head_dim])?;
        self.o_proj.forward(&attn)
    }

    /// Encoder (prefill): causal attention over the prompt `x` `[1, P, hidden]`, sliding layers
    /// limited to the last `sliding_window` positions. Returns the output and the K/V to cache.
    pub fn prefill(&self, x: &Array) -> Result<(Array, LayerKv), ModelError> {
        let (b, p) = (x.dim(0), x.dim(1));
        let (q, k, v) = self.qkv(x, 0)?;
        let out = match self.kind {
            AttentionKind::Full => fast::scaled_dot_product_attention(
                &q,
                &k,
                &v,
                1.0,
                fast::ScaledDotProductAttentionMask::Causal,
                None,
            )?,
            AttentionKind::Sliding => {
                // Query i sees keys j with i - window < j <= i.
                let w = self.sliding_window;
                let mask: Vec<bool> = (0..p)
                    .flat_map(|i| (0..p).map(move |j| j <= i && i - j < w))
                    .collect();
                let mask = Array::from_slice(&mask, &[1, 1, p, p]);
                fast::scaled_dot_product_attention(&q, &k, &v, 1.0, &mask, None)?
            }
        };
        let keep = match self.kind {
            AttentionKind::Full => p,
            // What transformers' sliding cache keeps, and all the decoder may look at.
            AttentionKind::Sliding => p.min(self.sliding_window - 1),
        };
        let kv = if keep == p {
            LayerKv { keys: k, values: v }
        } else {
            let tail = |t: &Array| -> Result<Array, ModelError> {
                Ok(t.split_at_indices(&[p - keep], 2)?.swap_remove(1))
            };
            LayerKv {
                keys: tail(&k)?,
                values: tail(&v)?,
            }
        };
        Ok((self.output(out, b, p)?, kv))
    }

    /// Decoder: canvases `x` `[B, W, hidden]` at positions `offset..offset+W` attend, without a
    /// mask, to the cached prompt K/V (read-only, batch 1, broadcast to B) followed by the
    /// canvases' own K/V.
    pub fn denoise(&self, x: &Array, cache: &LayerKv, offset: i32) -> Result<Array, ModelError> {
        let (b, w) = (x.dim(0), x.dim(1));
        let (q, k, v) = self.qkv(x, offset)?;
        let broadcast = |t: &Array| -> Result<Array, ModelError> {
            let mut shape = t.shape().to_vec();
            shape[0] = b;
            Ok(ops::broadcast_to(t, &shape)?)
        };
        let keys = ops::concatenate(&[broadcast(&cache.keys)?, k], 2)?;
        let values = ops::concatenate(&[broadcast(&cache.values)?, v], 2)?;
        let out = fast::scaled_dot_product_attention(
            &q,
            &keys,
            &values,
            1.0,
            None::<fast::ScaledDotProductAttentionMask>,
            None,
        )?;
        self.output(out, b, w)
    }
}
