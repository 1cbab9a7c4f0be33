//! The decision head of llama.cpp's `laya` models, over a ModernBERT encoder's output: the
//! question type's row of `token_types` added at every position, then PyTorch
//! `nn.TransformerEncoderLayer` blocks (pre-norm, biased projections and norms, ReLU, no RoPE,
//! every key visible), then at each option's marker a scorer: LayerNorm, a biased linear map,
//! GELU (erf), and one value `w · h + b` (docs/models.md, "Decision models").
//!
//! llama-server reads the head's output as one score per question type and takes the
//! question's column; the type enters the head only through its embedding, so computing the
//! question's own type is the same number.

use mlx_rs::{ops, Array};

use super::attention::{biased, float32, gelu_erf, BidirectionalAttention};
use super::{native, EncoderKernels};
use crate::model::{linear::Linear, norm::LayerNorm, ModelError};

/// The row of `token_types` (and llama-server's output column) of each question type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuestionType {
    Choice = 0,
    Score = 1,
    Noul = 2,
}

impl QuestionType {
    /// The row index.
    pub fn row(self) -> i32 {
        self as i32
    }
}

/// One of the head's blocks.
#[derive(Clone, Debug)]
pub struct HeadBlock {
    pub attention_norm: LayerNorm,
    pub attention: BidirectionalAttention,
    pub mlp_norm: LayerNorm,
    /// `[ffn, hidden]` and its bias.
    pub up: Linear,
    pub up_bias: Array,
    /// `[hidden, ffn]` and its bias.
    pub down: Linear,
    pub down_bias: Array,
}

/// The whole head.
#[derive(Clone, Debug)]
pub struct MarkerHead {
    /// `[3, hidden]`, a row per [`QuestionType`].
    pub type_embeddings: Array,
    pub blocks: Vec<HeadBlock>,
    pub scorer_norm: LayerNorm,
    /// `[hidden, hidden]` and its bias.
    pub scorer: Linear,
    pub scorer_bias: Array,
    /// `[hidden]` and `[1]`: the score of a marker's scorer state.
    pub output: Array,
    pub output_bias: Array,
}

impl MarkerHead {
    /// The score at each of `markers` (positions of `encoded`, the encoder's `[1, L, hidden]`
    /// output) for a question of type `kind`; `kernels` says what computes it.
    pub fn scores(
        &self,
        encoded: &Array,
        kind: QuestionType,
        markers: &[usize],
        kernels: EncoderKernels,
    ) -> Result<Vec<f32>, ModelError> {
        let precision = kernels.precision;
        let len = encoded.dim(1) as usize;
        if markers.iter().any(|&m| m >= len) {
            return Err(ModelError::Shape("a marker lies past its sequence"));
        }
        let row = self
            .type_embeddings
            .take_axis(Array::from_slice(&[kind.row()], &[1]), 0)?;
        let mut x = ops::add(encoded, &row)?;
        for block in &self.blocks {
            let normed = block.attention_norm.forward(&x)?;
            let attended = block
                .attention
                .forward(&normed, None, (None, None), kernels)?;
            x = ops::add(&x, &attended)?;
            let normed = block.mlp_norm.forward(&x)?;
            let up = biased(
                float32(block.up.forward_native(&normed, precision)?)?,
                Some(&block.up_bias),
            )?;
            let up = ops::maximum(&up, Array::from_f32(0.0))?;
            let down = biased(
                float32(block.down.forward_native(&up, precision)?)?,
                Some(&block.down_bias),
            )?;
            x = ops::add(&x, &down)?;
        }
        let at: Vec<i32> = markers.iter().map(|&m| m as i32).collect();
        let hidden = x.dim(2);
        let states = x
            .reshape(&[len as i32, hidden])?
            .take_axis(Array::from_slice(&at, &[at.len() as i32]), 0)?;
        let h = self.scorer_norm.forward(&states)?;
        let h = biased(
            float32(self.scorer.forward_native(&h, precision)?)?,
            Some(&self.scorer_bias),
        )?;
        let h = if kernels.native {
            let h = h.contiguous()?;
            h.eval()?;
            let mut values = h
                .try_as_slice::<f32>()
                .map_err(|_| ModelError::Shape("the scorer's values are not contiguous"))?
                .to_vec();
            native::gelu_erf(&mut values);
            Array::from_slice(&values, h.shape())
        } else {
            gelu_erf(&h)?
        };
        let scores = ops::add(&ops::matmul(&h, &self.output)?, &self.output_bias)?;
        scores.eval()?;
        Ok(scores
            .try_as_slice::<f32>()
            .map_err(|_| ModelError::Shape("the scores are not contiguous float32"))?
            .to_vec())
    }
}
