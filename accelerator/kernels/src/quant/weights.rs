//! [`PackedWeight`]: an affine-quantised weight repacked for the integer products.

use super::{QuantError, BLOCK, PANEL, STEP};

/// An affine-quantised weight `[out, input]` repacked for the integer products.
#[derive(Clone, Debug)]
pub struct PackedWeight {
    pub(super) out: usize,
    pub(super) input: usize,
    /// Scales (and biases) per row and block of 32 inputs: 1, or 2 where each half of a
    /// block (16 inputs) has its own (ggml's Q6_K).
    pub(super) parts: usize,
    /// Per panel, per step of 4 inputs: 16 rows × 4 codes (`PANEL · input` bytes a panel).
    pub(super) codes: Vec<u8>,
    /// Per panel, per block, per part: 16 rows' scales.
    pub(super) scales: Vec<f32>,
    /// Per panel, per block, per part: 16 rows' biases.
    pub(super) biases: Vec<f32>,
    /// The largest code (from the codes themselves): the copies whose byte products saturate
    /// or are signed (AVX2's `vpmaddubsw`, NEON's `sdot`) take a cheaper exact route where the
    /// codes are small.
    pub(super) code_max: u8,
}

/// One row of a weight as [`PackedWeight::from_rows`] asks for it: its codes (`input`), and
/// its scales and biases (one per `scale_len` inputs), all to be filled.
pub struct RowParts<'a> {
    pub codes: &'a mut [u8],
    pub scales: &'a mut [f32],
    pub biases: &'a mut [f32],
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
        Self::from_rows((out, input), BLOCK, |n, row| {
            for (k, c) in row.codes.iter_mut().enumerate() {
                *c = code(n, k);
            }
            for j in 0..input / BLOCK {
                row.scales[j] = scales[n * groups + j * BLOCK / group];
                row.biases[j] = biases[n * groups + j * BLOCK / group];
            }
        })
    }

    /// From rows filled one at a time by `fill(n, row)`: codes (any byte), and a scale and a
    /// bias per `scale_len` inputs, 32 (one per block) or 16 (two per block, Q6_K's
    /// sub-blocks). Only one row's parts exist unpacked at a time, so a loader can decode its
    /// file's blocks straight into the packing.
    pub fn from_rows(
        (out, input): (usize, usize),
        scale_len: usize,
        mut fill: impl FnMut(usize, RowParts<'_>),
    ) -> Result<Self, QuantError> {
        if input == 0 || !input.is_multiple_of(BLOCK) {
            return Err(QuantError::Group {
                group: scale_len,
                input,
            });
        }
        let parts = match scale_len {
            BLOCK => 1,
            16 => 2,
            _ => {
                return Err(QuantError::Group {
                    group: scale_len,
                    input,
                })
            }
        };
        let panels = out.div_ceil(PANEL);
        let blocks = input / BLOCK;
        // Rows past `out` in the last panel stay zero (codes, scales and biases): they add
        // nothing and are never stored.
        let mut codes = vec![0u8; panels * PANEL * input];
        let mut packed_scales = vec![0.0f32; panels * blocks * parts * PANEL];
        let mut packed_biases = vec![0.0f32; panels * blocks * parts * PANEL];
        let mut row_codes = vec![0u8; input];
        let mut row_scales = vec![0.0f32; blocks * parts];
        let mut row_biases = vec![0.0f32; blocks * parts];
        for n in 0..out {
            row_codes.fill(0);
            row_scales.fill(0.0);
            row_biases.fill(0.0);
            fill(
                n,
                RowParts {
                    codes: &mut row_codes,
                    scales: &mut row_scales,
                    biases: &mut row_biases,
                },
            );
            let (panel, row) = (n / PANEL, n % PANEL);
            let base = panel * PANEL * input;
            for (k, &c) in row_codes.iter().enumerate() {
                codes[base + (k / STEP) * PANEL * STEP + row * STEP + k % STEP] = c;
            }
            for p in 0..blocks * parts {
                let at = (panel * blocks * parts + p) * PANEL + row;
                packed_scales[at] = row_scales[p];
                packed_biases[at] = row_biases[p];
            }
        }
        let code_max = codes.iter().copied().max().unwrap_or(0);
        Ok(PackedWeight {
            out,
            input,
            parts,
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

    /// Inputs per scale: 32, or 16.
    pub fn scale_len(&self) -> usize {
        BLOCK / self.parts
    }

    /// Row `n`'s values as the products use them, `scale · code + bias` in float32 (the
    /// product `scale · code` is exact for every layout the loaders make: GGUF's scales have at
    /// most 18 significant bits and its codes at most 8, so this is one rounding, of the sum,
    /// the same one ggml's dequantisers make). `values` has `input` entries.
    pub fn row(&self, n: usize, values: &mut [f32]) -> Result<(), QuantError> {
        if n >= self.out || values.len() != self.input {
            return Err(QuantError::Shape(
                "a row outside the weight, or of another length",
            ));
        }
        let (panel, row) = (n / PANEL, n % PANEL);
        let base = panel * PANEL * self.input;
        let blocks = self.input / BLOCK;
        let len = BLOCK / self.parts;
        for (k, v) in values.iter_mut().enumerate() {
            let q = self.codes[base + (k / STEP) * PANEL * STEP + row * STEP + k % STEP];
            let at = (panel * blocks * self.parts + k / len) * PANEL + row;
            *v = self.scales[at] * f32::from(q) + self.biases[at];
        }
        Ok(())
    }

    /// Bytes it holds (one per weight, and eight per row and scale: per block of 32, or of 16).
    pub fn bytes(&self) -> usize {
        self.codes.len() + 4 * (self.scales.len() + self.biases.len())
    }
}
