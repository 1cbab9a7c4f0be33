//! One transformer layer, shared by encoder and decoder (which differ only in attention mode and
//! in their `layer_scalar`):
//!
//! ```text
//! h   = x + post_attention_layernorm(attn(input_layernorm(x)))
//! d   = post_feedforward_layernorm_1(mlp(pre_feedforward_layernorm(h)))
//! m   = post_feedforward_layernorm_2(moe(route on h, experts on pre_feedforward_layernorm_2(h)))
//! out = (h + post_feedforward_layernorm(d + m)) · layer_scalar
//! ```

use mlx_rs::{ops, Array};

use super::{
    attention::{Attention, Segment},
    mlp::Mlp,
    moe::Moe,
};
use crate::model::kv::LayerKv;
use crate::model::{norm::RmsNorm, ModelError};

/// The seven weighted norms of a layer.
#[derive(Clone, Debug)]
pub struct LayerNorms {
    /// Before attention.
    pub input_layernorm: RmsNorm,
    /// On the attention output.
    pub post_attention_layernorm: RmsNorm,
    /// Before the dense MLP.
    pub pre_feedforward_layernorm: RmsNorm,
    /// On the dense MLP output.
    pub post_feedforward_layernorm_1: RmsNorm,
    /// Before the experts.
    pub pre_feedforward_layernorm_2: RmsNorm,
    /// On the MoE output.
    pub post_feedforward_layernorm_2: RmsNorm,
    /// On the sum of both branches.
    pub post_feedforward_layernorm: RmsNorm,
}

/// A transformer layer: its blocks and both layer scalars.
#[derive(Clone, Debug)]
pub struct Layer {
    pub attention: Attention,
    pub mlp: Mlp,
    pub moe: Moe,
    pub norms: LayerNorms,
    /// `model.encoder.language_model.layers.N.layer_scalar` (shape `[1]`).
    pub encoder_scalar: Array,
    /// `model.decoder.layers.N.layer_scalar` (shape `[1]`).
    pub decoder_scalar: Array,
}

impl Layer {
    fn feed_forward(
        &self,
        x: &Array,
        attn_out: &Array,
        scalar: &Array,
        segments: &[i32],
    ) -> Result<Array, ModelError> {
        let n = &self.norms;
        let h = ops::add(x, n.post_attention_layernorm.forward(attn_out)?)?;
        let d = n.post_feedforward_layernorm_1.forward(
            &self
                .mlp
                .forward(&n.pre_feedforward_layernorm.forward(&h)?)?,
        )?;
        // The MoE works on tokens: flatten [B, L, H] → [B·L, H] and back.
        let shape = h.shape().to_vec();
        let hidden = shape[shape.len() - 1];
        let flat = h.reshape(&[-1, hidden])?;
        let e_in = n.pre_feedforward_layernorm_2.forward(&flat)?;
        let m = self.moe.forward(&flat, &e_in, segments)?.reshape(&shape)?;
        let m = n.post_feedforward_layernorm_2.forward(&m)?;
        let out = ops::add(&h, n.post_feedforward_layernorm.forward(&ops::add(d, m)?)?)?;
        Ok(ops::multiply(out, scalar)?)
    }

    /// The layer over a batch of segments laid end to end in `x` `[1, N, hidden]` (see
    /// [`Attention::forward`]). Prompt chunks take the encoder's `layer_scalar`, canvases the
    /// decoder's. Returns the output and each prompt chunk's K/V for this layer.
    pub fn forward(
        &self,
        x: &Array,
        segments: &[Segment<'_>],
    ) -> Result<(Array, Vec<LayerKv>), ModelError> {
        let a = self.norms.input_layernorm.forward(x)?;
        let (attn, kvs) = self.attention.forward(&a, segments)?;
        let chunks = segments.iter().filter(|s| s.is_chunk()).count();
        let scalar = if chunks == segments.len() {
            self.encoder_scalar.clone()
        } else if chunks == 0 {
            self.decoder_scalar.clone()
        } else {
            // Mixed batch: one scalar per row, `[1, N, 1]`. Multiplying by a broadcast column
            // gives each row the same IEEE products as multiplying by the scalar alone.
            let columns = segments
                .iter()
                .map(|s| {
                    let scalar = if s.is_chunk() {
                        &self.encoder_scalar
                    } else {
                        &self.decoder_scalar
                    };
                    ops::broadcast_to(scalar.reshape(&[1, 1, 1])?, &[1, s.rows, 1])
                })
                .collect::<Result<Vec<_>, _>>()?;
            ops::concatenate(&columns, 1)?
        };
        let rows: Vec<i32> = segments.iter().map(|s| s.rows).collect();
        Ok((self.feed_forward(x, &attn, &scalar, &rows)?, kvs))
    }

    /// Whether the layer's attention is sliding-window.
    pub fn is_sliding(&self) -> bool {
        self.attention.is_sliding()
    }
}
