//! RoPE on the native path: the cosines and sines of one chunk's positions, made once per chunk
//! for each distinct rotary embedding of the model (Gemma 3's local and global layers differ),
//! and their application to a projection, head by head.
//!
//! The angles are computed as MLX's `fast::rope` computes them on the CPU, in float32:
//! `θ = (position · scale) · inverse_frequency`, where the inverse frequencies come from the
//! layer's [`CausalRope`] (θ-based, or the Llama 3 / `rope_freqs` periods), so linear scaling
//! (`scale = 1/factor`) and the frequency adjustments are those of the MLX path.

use crate::model::causal::blocks::CausalRope;
use crate::model::ModelError;

use super::kernels;

/// The cosines and sines of `len` positions from `start`, per rotary pair.
pub(super) struct RopeTable {
    /// What it was made from (tables are shared by layers that rotate alike).
    inverse: Vec<f32>,
    scale: f32,
    half: usize,
    /// `[len, half]`.
    cos: Vec<f32>,
    /// `[len, half]`.
    sin: Vec<f32>,
}

impl RopeTable {
    /// For `rope` over positions `start .. start + len`.
    pub(super) fn new(rope: &CausalRope, start: usize, len: usize) -> Result<Self, ModelError> {
        let inverse = rope.inverse_frequencies()?;
        let scale = rope.position_scale();
        let half = inverse.len();
        let mut cos = Vec::with_capacity(len * half);
        let mut sin = Vec::with_capacity(len * half);
        for l in 0..len {
            let position = (start + l) as f32 * scale;
            for &f in &inverse {
                let theta = position * f;
                cos.push(theta.cos());
                sin.push(theta.sin());
            }
        }
        Ok(RopeTable {
            inverse,
            scale,
            half,
            cos,
            sin,
        })
    }

    /// Whether `rope` rotates exactly as this table does.
    pub(super) fn rotates_like(&self, rope: &CausalRope) -> bool {
        rope.position_scale() == self.scale
            && rope
                .inverse_frequencies()
                .is_ok_and(|inverse| inverse == self.inverse)
    }

    /// Rotates `src` (`[len, heads · head_dim]`, a projection's rows) into `dst` laid out head by
    /// head (`[heads, len, head_dim]`, the K/V cache's layout and the one attention reads).
    pub(super) fn apply(
        &self,
        src: &[f32],
        heads: usize,
        dst: &mut [f32],
    ) -> Result<(), ModelError> {
        let head_dim = 2 * self.half;
        let len = self.cos.len() / self.half.max(1);
        if head_dim == 0 || src.len() != len * heads * head_dim || dst.len() != src.len() {
            return Err(ModelError::Shape("rope: projection and table disagree"));
        }
        for l in 0..len {
            let cos = &self.cos[l * self.half..(l + 1) * self.half];
            let sin = &self.sin[l * self.half..(l + 1) * self.half];
            for h in 0..heads {
                let from = (l * heads + h) * head_dim;
                let to = (h * len + l) * head_dim;
                kernels::rope(
                    &src[from..from + head_dim],
                    cos,
                    sin,
                    &mut dst[to..to + head_dim],
                );
            }
        }
        Ok(())
    }
}

/// Each of `len` rows of `heads · head_dim` values laid out head by head: `[heads, len, head_dim]`
/// (the values, which are not rotated).
pub(super) fn heads_first(src: &[f32], heads: usize, head_dim: usize, dst: &mut [f32]) {
    let row = heads * head_dim;
    if row == 0 {
        return;
    }
    let len = src.len() / row;
    for (l, values) in src.chunks_exact(row).enumerate() {
        for (h, head) in values.chunks_exact(head_dim).enumerate() {
            let to = (h * len + l) * head_dim;
            dst[to..to + head_dim].copy_from_slice(head);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::causal::config::{RopeScaling, RopeSpec};

    /// The rotation against a scalar reference in f64 of the same float32 angles, and the MLX
    /// path's `fast::rope` on the same input (positions past the first chunk, linear scaling).
    #[test]
    fn rotation_matches_a_scalar_reference_and_mlx() {
        let (heads, head_dim, len, start) = (3usize, 8usize, 5usize, 17usize);
        for scaling in [RopeScaling::None, RopeScaling::Linear { factor: 4.0 }] {
            let spec = RopeSpec {
                theta: 10_000.0,
                scaling,
            };
            let rope = CausalRope::new(&spec, head_dim as i32);
            let table = RopeTable::new(&rope, start, len).expect("table");
            let src: Vec<f32> = (0..len * heads * head_dim)
                .map(|i| ((i * 13) % 7) as f32 * 0.25 - 0.8)
                .collect();
            let mut dst = vec![0.0f32; src.len()];
            table.apply(&src, heads, &mut dst).expect("apply");
            let inverse = rope.inverse_frequencies().expect("frequencies");
            let half = head_dim / 2;
            for l in 0..len {
                for h in 0..heads {
                    for i in 0..half {
                        let theta = ((start + l) as f32 * rope.position_scale()) * inverse[i];
                        let (c, s) = ((theta as f64).cos(), (theta as f64).sin());
                        let x = |j: usize| src[(l * heads + h) * head_dim + j] as f64;
                        let got = |j: usize| dst[(h * len + l) * head_dim + j] as f64;
                        assert!((got(i) - (x(i) * c - x(i + half) * s)).abs() < 1e-5);
                        assert!((got(i + half) - (x(i) * s + x(i + half) * c)).abs() < 1e-5);
                    }
                }
            }
            // MLX's own rotation of `[1, heads, len, head_dim]`.
            let mut heads_major = vec![0.0f32; src.len()];
            heads_first(&src, heads, head_dim, &mut heads_major);
            let x = mlx_rs::Array::from_slice(
                &heads_major,
                &[1, heads as i32, len as i32, head_dim as i32],
            );
            let mlx = rope.forward(&x, start as i32).expect("mlx rope");
            let worst = mlx
                .as_slice::<f32>()
                .iter()
                .zip(&dst)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(worst < 1e-5, "native rope differs from MLX's by {worst}");
        }
    }
}
