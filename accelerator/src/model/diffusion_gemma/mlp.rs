//! The GeGLU feed-forward block: `down(gelu_tanh(gate(x)) ⊙ up(x))`, no biases.

use mlx_rs::Array;

use crate::model::{fused, linear::Linear, ModelError};

/// Dense GeGLU MLP (also the self-conditioning MLP).
#[derive(Clone, Debug)]
pub struct Mlp {
    gate: Linear,
    up: Linear,
    down: Linear,
}

impl Mlp {
    /// From the three projections (`gate`, `up`: hidden → inner; `down`: inner → hidden).
    pub fn new(gate: Linear, up: Linear, down: Linear) -> Self {
        Self { gate, up, down }
    }

    /// Applies the MLP over the last axis.
    pub fn forward(&self, x: &Array) -> Result<Array, ModelError> {
        let g = self.gate.forward(x)?;
        let u = self.up.forward(x)?;
        self.down.forward(&fused::geglu(&g, &u)?)
    }
}
