//! Rotary position embeddings, rotate-half (non-interleaved) convention, via `fast::rope`.
//!
//! Sliding layers use default RoPE (all pairs rotate, inverse frequency `θ^(-2i/d)`). Full layers
//! use "proportional" RoPE: only the first `partial_rotary_factor · d/2` pairs rotate, with the
//! exponent still over the full head dimension; the others get frequency 0. `fast::rope` takes
//! *periods* in `freqs`, so the non-rotating pairs get an infinite period (docs/model.md, "Attention").

use mlx_rs::{fast, Array};

use super::config::RopeConfig;
use crate::model::ModelError;

/// RoPE of one attention kind.
#[derive(Clone, Debug)]
pub struct Rope {
    dims: i32,
    base: Option<f32>,
    freqs: Option<Array>,
}

impl Rope {
    /// RoPE over heads of `head_dim` with the given configuration.
    pub fn new(config: &RopeConfig, head_dim: i32) -> Self {
        if config.partial_rotary_factor >= 1.0 {
            return Self {
                dims: head_dim,
                base: Some(config.theta),
                freqs: None,
            };
        }
        let pairs = head_dim / 2;
        let rotated = (config.partial_rotary_factor * head_dim as f32 / 2.0).round() as i32;
        let periods: Vec<f32> = (0..pairs)
            .map(|i| {
                if i < rotated {
                    // Computed in f64 so the period matches the reference's rounding to f32.
                    (config.theta as f64).powf(2.0 * i as f64 / head_dim as f64) as f32
                } else {
                    f32::INFINITY
                }
            })
            .collect();
        Self {
            dims: head_dim,
            base: None,
            freqs: Some(Array::from_slice(&periods, &[pairs])),
        }
    }

    /// Rotates `x` of shape `[B, heads, L, head_dim]` for positions `offset .. offset + L`.
    pub fn forward(&self, x: &Array, offset: i32) -> Result<Array, ModelError> {
        Ok(fast::rope(
            x,
            self.dims,
            false,
            self.base,
            1.0,
            offset,
            self.freqs.as_ref(),
        )?)
    }
}
