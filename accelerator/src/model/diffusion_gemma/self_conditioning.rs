//! Self-conditioning input of the decoder:
//! `x0 = noscale_rmsnorm(e + mlp(pre_norm(soft)))`, `soft = softmax(prev_logits) · E · √hidden`.
//! On the first step there are no previous logits: `soft = 0`, the MLP adds exactly 0 (no biases,
//! gelu(0) = 0), and only the post-norm remains, which must still be applied (docs/model.md, "Encoder and decoder").

use mlx_rs::{ops, Array, Dtype};

use super::mlp::Mlp;
use crate::model::{linear::Linear, norm::RmsNorm, ModelError};

/// The decoder's self-conditioning block.
#[derive(Clone, Debug)]
pub struct SelfConditioning {
    pre_norm: RmsNorm,
    mlp: Mlp,
    post_norm: RmsNorm,
}

impl SelfConditioning {
    /// `pre_norm` has a weight; the post-norm has none.
    pub fn new(pre_norm: RmsNorm, mlp: Mlp, eps: f32) -> Self {
        Self {
            pre_norm,
            mlp,
            post_norm: RmsNorm::no_scale(eps),
        }
    }

    /// `embedded` `[B, W, hidden]` (already × √hidden); `prev_logits` `[B or 1, W, vocab]`.
    pub fn forward(
        &self,
        embedded: &Array,
        prev_logits: Option<&Array>,
        embedding: &Linear,
        embed_scale: &Array,
    ) -> Result<Array, ModelError> {
        let Some(logits) = prev_logits else {
            return self.post_norm.forward(embedded);
        };
        let dtype = embedded.dtype();
        let probs =
            ops::softmax_axis(&logits.as_dtype(Dtype::Float32)?, -1, true)?.as_dtype(dtype)?;
        let soft = ops::multiply(embedding.forward_transposed(&probs)?, embed_scale)?;
        let s = self.pre_norm.forward(&soft)?;
        let x = ops::add(embedded, self.mlp.forward(&s)?)?;
        self.post_norm.forward(&x)
    }
}
