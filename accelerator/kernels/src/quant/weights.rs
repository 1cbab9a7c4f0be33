//! [`PackedWeight`]: an affine-quantised weight repacked for the integer products.

use super::{QuantError, BLOCK, PANEL, STEP};

/// An affine-quantised weight `[out, input]` repacked for the integer products.
#[derive(Clone, Debug)]
pub struct PackedWeight {
    pub(super) out: usize,
    pub(super) input: usize,
    /// Per panel, per step of 4 inputs: 16 rows × 4 codes (`PANEL · input` bytes a panel).
    pub(super) codes: Vec<u8>,
    /// Per panel, per block: 16 rows' scales.
    pub(super) scales: Vec<f32>,
    /// Per panel, per block: 16 rows' biases.
    pub(super) biases: Vec<f32>,
    /// The largest code (from the codes themselves): the copies whose byte products saturate
    /// or are signed (AVX2's `vpmaddubsw`, NEON's `sdot`) take a cheaper exact route where the
    /// codes are small.
    pub(super) code_max: u8,
}

impl PackedWeight {
    /// From MLX's affine layout (what `mlx.core.quantize` returns, and what the loaders make of
    /// GGUF's Q4_0/Q4_1/Q8_0): `packed` `[out, input · bits / 32]` words holding codes from
    /// the lowest bits up, `scales` and `biases` `[out, input / group]`.
    pub fn from_affine(
        packed: &[u32],
        scales: &[f32],
        biases: &[f32],
        (out, input): (usize, usize),
        group: usize,
        bits: u32,
    ) -> Result<Self, QuantError> {
        if bits != 4 && bits != 8 {
            return Err(QuantError::Bits(bits));
        }
        let per_word = 32 / bits as usize;
        let words = input / per_word;
        if group == 0 || !group.is_multiple_of(BLOCK) || !input.is_multiple_of(group) {
            return Err(QuantError::Group { group, input });
        }
        if packed.len() != out * words {
            return Err(QuantError::Shape("packed codes and [out, input] disagree"));
        }
        let mask = (1u32 << bits) - 1;
        let code = |n: usize, k: usize| -> u8 {
            let word = packed[n * words + k / per_word];
            ((word >> (bits as usize * (k % per_word))) & mask) as u8
        };
        Self::from_codes(code, scales, biases, (out, input), group)
    }

    /// From codes given one at a time (`code(n, k)`), and `scales`, `biases` `[out, input /
    /// group]`.
    pub fn from_codes(
        code: impl Fn(usize, usize) -> u8,
        scales: &[f32],
        biases: &[f32],
        (out, input): (usize, usize),
        group: usize,
    ) -> Result<Self, QuantError> {
        if group == 0 || !group.is_multiple_of(BLOCK) || !input.is_multiple_of(group) || input == 0
        {
            return Err(QuantError::Group { group, input });
        }
        let groups = input / group;
        if scales.len() != out * groups || biases.len() != out * groups {
            return Err(QuantError::Shape(
                "scales or biases and [out, input / group] disagree",
            ));
        }
        let panels = out.div_ceil(PANEL);
        let blocks = input / BLOCK;
        // Rows past `out` in the last panel stay zero (codes, scales and biases): they add
        // nothing and are never stored.
        let mut codes = vec![0u8; panels * PANEL * input];
        let mut packed_scales = vec![0.0f32; panels * blocks * PANEL];
        let mut packed_biases = vec![0.0f32; panels * blocks * PANEL];
        for n in 0..out {
            let (panel, row) = (n / PANEL, n % PANEL);
            let base = panel * PANEL * input;
            for k in 0..input {
                codes[base + (k / STEP) * PANEL * STEP + row * STEP + k % STEP] = code(n, k);
            }
            for j in 0..blocks {
                let at = (panel * blocks + j) * PANEL + row;
                packed_scales[at] = scales[n * groups + j * BLOCK / group];
                packed_biases[at] = biases[n * groups + j * BLOCK / group];
            }
        }
        let code_max = codes.iter().copied().max().unwrap_or(0);
        Ok(PackedWeight {
            out,
            input,
            code_max,
            codes,
            scales: packed_scales,
            biases: packed_biases,
        })
    }

    pub fn out(&self) -> usize {
        self.out
    }

    pub fn input(&self) -> usize {
        self.input
    }

    /// Bytes it holds (one per weight, eight per row and block of 32).
    pub fn bytes(&self) -> usize {
        self.codes.len() + 4 * (self.scales.len() + self.biases.len())
    }
}
