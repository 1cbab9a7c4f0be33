//! RMSNorm: `x / sqrt(mean(x²) + eps) · w` (no `1 + w` offset), and the weightless variant used by
//! the value norm, the router and the self-conditioning post-norm.

use mlx_rs::{fast, Array};

use super::ModelError;

/// RMSNorm with an optional learned weight (`None` = "no-scale" norm).
#[derive(Clone, Debug)]
pub struct RmsNorm {
    weight: Option<Array>,
    eps: f32,
}

impl RmsNorm {
    /// A norm that multiplies by `weight` (shape `[dim]`).
    pub fn new(weight: Array, eps: f32) -> Self {
        Self {
            weight: Some(weight),
            eps,
        }
    }

    /// The weightless ("no-scale") norm.
    pub fn no_scale(eps: f32) -> Self {
        Self { weight: None, eps }
    }

    /// The learned weight, if any (the native CPU path reads it; `causal::cpu`).
    pub(crate) fn weight(&self) -> Option<&Array> {
        self.weight.as_ref()
    }

    /// The epsilon added to the mean square.
    pub(crate) fn eps(&self) -> f32 {
        self.eps
    }

    /// Normalises over the last axis.
    pub fn forward(&self, x: &Array) -> Result<Array, ModelError> {
        Ok(fast::rms_norm(x, self.weight.as_ref(), self.eps)?)
    }
}

/// LayerNorm: `(x − mean) / sqrt(var + eps) · w + b`, the weight and the bias each optional
/// (ModernBERT's own norms carry no bias; the laya head's do).
#[derive(Clone, Debug)]
pub struct LayerNorm {
    weight: Option<Array>,
    bias: Option<Array>,
    eps: f32,
}

impl LayerNorm {
    /// A norm with `weight` and, where given, `bias` (each `[dim]`).
    pub fn new(weight: Array, bias: Option<Array>, eps: f32) -> Self {
        Self {
            weight: Some(weight),
            bias,
            eps,
        }
    }

    /// Normalises over the last axis.
    pub fn forward(&self, x: &Array) -> Result<Array, ModelError> {
        Ok(fast::layer_norm(
            x,
            self.weight.as_ref(),
            self.bias.as_ref(),
            self.eps,
        )?)
    }
}
