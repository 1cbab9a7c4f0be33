//! ModernBERT, the encoder of llama.cpp's `modern-bert` architecture (and of the laya decision
//! models built on it, such as Julia-1 on mmBERT): token embeddings and their LayerNorm, then
//! pre-norm layers whose attention is global on every third layer (0, 3, 6, …; a file may say
//! otherwise) and within a symmetric window on the others, each with its own RoPE base;
//! a gated MLP `down(gelu(up₁(x)) · up₂(x))` over one fused `up` projection; a final LayerNorm.
//! No projection or norm has a bias; layer 0 has no attention norm.

use mlx_rs::{ops, Array};

use super::attention::{float32, gelu_erf, window_mask, BidirectionalAttention};
use super::{native, EncoderKernels};
use crate::model::{linear::Linear, norm::LayerNorm, ModelError};

/// The shape of one ModernBERT encoder.
#[derive(Clone, Debug, PartialEq)]
pub struct ModernBertConfig {
    pub hidden: i32,
    pub layers: usize,
    pub heads: i32,
    /// Per half of the gated MLP: `up` makes `2 · ffn` values.
    pub ffn: i32,
    pub eps: f32,
    /// RoPE base of the global layers.
    pub rope_base: f32,
    /// RoPE base of the windowed layers.
    pub rope_base_local: f32,
    /// Keys a windowed layer's query sees on each side (half of the GGUF's
    /// `attention.sliding_window`).
    pub window: usize,
    /// Per layer, whether it attends within the window (ModernBERT: all but every third,
    /// from layer 0).
    pub local_layers: Vec<bool>,
    /// The longest sequence the encoder was trained on.
    pub max_positions: usize,
}

impl ModernBertConfig {
    /// Whether layer `l` attends within the window.
    pub fn is_local(&self, layer: usize) -> bool {
        self.window > 0 && self.local_layers.get(layer).copied().unwrap_or(false)
    }

    pub fn head_dim(&self) -> i32 {
        self.hidden / self.heads
    }
}

/// One encoder layer.
#[derive(Clone, Debug)]
pub struct EncoderLayer {
    /// `None` on layer 0 (its input is the embeddings' norm already).
    pub attention_norm: Option<LayerNorm>,
    pub attention: BidirectionalAttention,
    pub mlp_norm: LayerNorm,
    /// `[2·ffn, hidden]`: the activated half's rows, then the gate's.
    pub up: Linear,
    /// `[hidden, ffn]`.
    pub down: Linear,
}

/// A loaded ModernBERT encoder.
#[derive(Clone, Debug)]
pub struct ModernBert {
    pub config: ModernBertConfig,
    /// `[vocab, hidden]`.
    pub embeddings: Linear,
    pub embeddings_norm: LayerNorm,
    pub layers: Vec<EncoderLayer>,
    pub final_norm: LayerNorm,
    pub vocab: usize,
}

impl ModernBert {
    /// The final norm's output at every position of `tokens`, `[1, L, hidden]` float32;
    /// `kernels` says what computes it.
    pub fn forward(&self, tokens: &[u32], kernels: EncoderKernels) -> Result<Array, ModelError> {
        if tokens.is_empty() {
            return Err(ModelError::EmptyPrompt);
        }
        if let Some(&token) = tokens.iter().find(|&&t| t as usize >= self.vocab) {
            return Err(ModelError::TokenOutOfRange {
                token,
                vocab: self.vocab as i32,
            });
        }
        let config = &self.config;
        let precision = kernels.precision;
        let len = tokens.len();
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        let ids = Array::from_slice(&ids, &[len as i32]);
        let x = float32(self.embeddings.rows(&ids)?)?.reshape(&[1, len as i32, config.hidden])?;
        let mut x = self.embeddings_norm.forward(&x)?;
        // A sequence no longer than the window needs none; MLX's attention takes it as a mask,
        // made once per sequence.
        let windowed = config.window > 0 && len > config.window + 1;
        let mask = (windowed && !kernels.native).then(|| window_mask(len, config.window));
        for (index, layer) in self.layers.iter().enumerate() {
            let normed = match &layer.attention_norm {
                Some(norm) => norm.forward(&x)?,
                None => x.clone(),
            };
            let (base, window) = if config.is_local(index) {
                let window = windowed.then_some(config.window);
                (config.rope_base_local, (mask.as_ref(), window))
            } else {
                (config.rope_base, (None, None))
            };
            let attended = layer
                .attention
                .forward(&normed, Some(base), window, kernels)?;
            x = ops::add(&x, &attended)?;
            let normed = layer.mlp_norm.forward(&x)?;
            let up = float32(layer.up.forward_native(&normed, precision)?)?;
            let gated = if kernels.native {
                gated_native(&up, config.ffn as usize)?
            } else {
                let halves = up.split_equal(2, -1)?;
                ops::multiply(&gelu_erf(&halves[0])?, &halves[1])?
            };
            x = ops::add(&x, &float32(layer.down.forward_native(&gated, precision)?)?)?;
        }
        self.final_norm.forward(&x)
    }
}

/// `gelu(first half) · second half` of each row of `up` (`[..., 2·ffn]`), natively.
fn gated_native(up: &Array, ffn: usize) -> Result<Array, ModelError> {
    let up = up.contiguous()?;
    up.eval()?;
    let values = up
        .try_as_slice::<f32>()
        .map_err(|_| ModelError::Shape("the MLP's values are not contiguous float32"))?;
    let mut out = Vec::with_capacity(values.len() / 2);
    for row in values.chunks_exact(2 * ffn) {
        let (gate, rest) = row.split_at(ffn);
        let start = out.len();
        out.extend_from_slice(gate);
        native::gelu_erf_mul(&mut out[start..], rest);
    }
    let mut shape = up.shape().to_vec();
    if let Some(last) = shape.last_mut() {
        *last = ffn as i32;
    }
    Ok(Array::from_slice(&out, &shape))
}
