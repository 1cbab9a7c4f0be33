//! The GeGLU feed-forward block: `down(gelu_tanh(gate(x)) ⊙ up(x))`, no biases.

use mlx_rs::{ops, Array};

use super::{linear::Linear, ModelError};

/// `gelu_pytorch_tanh`: `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`.
pub fn gelu_tanh(x: &Array) -> Result<Array, ModelError> {
    let dtype = x.dtype();
    let c = |v: f32| Array::from_f32(v).as_dtype(dtype);
    let x3 = ops::multiply(ops::multiply(x, x)?, x)?;
    let inner = ops::multiply(
        ops::add(x, ops::multiply(x3, c(0.044715)?)?)?,
        c((2.0f64 / std::f64::consts::PI).sqrt() as f32)?,
    )?;
    let t = ops::add(ops::tanh(inner)?, c(1.0)?)?;
    Ok(ops::multiply(ops::multiply(x, t)?, c(0.5)?)?)
}

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
        let g = gelu_tanh(&self.gate.forward(x)?)?;
        let u = self.up.forward(x)?;
        self.down.forward(&ops::multiply(g, u)?)
    }
}
