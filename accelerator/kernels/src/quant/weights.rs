//! [`PackedWeight`]: an affine-quantised weight repacked for the integer products.

use super::{QuantError, BLOCK, PANEL, STEP};

/// An affine-quantised weight `[out, input]` repacked for the integer products (the layout:
/// `quant/mod.rs`, "The packed weight").
#[derive(Clone, Debug)]
pub struct PackedWeight {
    pub(super) out: usize,
    pub(super) input: usize,
    /// Scales (and biases) per row and block of 32 inputs: 1, or 2 where each half of a
    /// block (16 inputs) has its own (ggml's Q6_K).
    pub(super) parts: usize,
    /// Per panel: bytes, per step of 4 inputs 16 rows × 4 codes (`PANEL · input` bytes a
    /// panel); or, where [`PackedWeight::nibbles`], per pair of steps the same 64 bytes with
    /// the first step's codes in the low nibbles and the second's in the high ones (`PANEL ·
    /// input / 2` bytes a panel).
    pub(super) codes: Vec<u8>,
    /// Whether the codes are nibbles: every code is at most 15 (decided from the codes
    /// themselves, whatever the file's type says).
    pub(super) nibbles: bool,
    /// Per panel, per block, per part: 16 rows' scales.
    pub(super) scales: Vec<f32>,
    /// Per panel, per block, per part: 16 rows' biases; empty where `bias_offset` stands for
    /// them.
    pub(super) biases: Vec<f32>,
    /// Where every row's every bias is `offset · scale`, bit for bit (Q4_0's −8, Q5_0's −16,
    /// Q8_0's −128, Q6_K's −32; checked value by value, never assumed from a type): the
    /// offset, and each copy computes the bias as that one float32 product, the same bits as
    /// the stored value would be.
    pub(super) bias_offset: Option<f32>,
    /// The largest code (from the codes themselves): the copies whose byte products saturate
    /// or are signed (AVX2's `vpmaddubsw`, NEON's `sdot`) take a cheaper exact route where the
    /// codes are small.
    pub(super) code_max: u8,
}

/// A panel's biases as a SIMD copy reads them: stored from here on (the scales' layout), or
/// `offset · scale`, computed by the copy as that one float32 product (the stored value's
/// bits).
#[derive(Clone, Copy)]
pub(super) enum PanelBiases {
    Stored(*const f32),
    Implicit(f32),
}

/// Codes at most this are held as nibbles.
const NIBBLE_MAX: u8 = 15;

/// Where code `k` of row `r` of a panel sits in the panel's codes: its byte, and the shift of
/// its nibble (0 for byte codes). The one definition of the layout the copies read.
#[inline(always)]
pub(super) fn place(nibbles: bool, r: usize, k: usize) -> (usize, u32) {
    if nibbles {
        let byte = (k / (2 * STEP)) * PANEL * STEP + r * STEP + k % STEP;
        (byte, 4 * ((k / STEP) % 2) as u32)
    } else {
        ((k / STEP) * PANEL * STEP + r * STEP + k % STEP, 0)
    }
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

    /// From rows filled one at a time by `fill(n, row)`: codes (any byte; held as nibbles where
    /// every one is at most 15), and a scale and a bias per `scale_len` inputs, 32 (one per
    /// block) or 16 (two per block, Q6_K's sub-blocks). Only one row's parts exist unpacked at
    /// a time (and the codes as nibbles until one is above 15), so a loader can decode its
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
        let mut codes = Codes::new(panels * PANEL * input);
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
            codes.put_row(n, input, &row_codes);
            let (panel, row) = (n / PANEL, n % PANEL);
            for p in 0..blocks * parts {
                let at = (panel * blocks * parts + p) * PANEL + row;
                packed_scales[at] = row_scales[p];
                packed_biases[at] = row_biases[p];
            }
        }
        let bias_offset =
            implicit_offset(out, blocks * parts * PANEL, &packed_scales, &packed_biases);
        if bias_offset.is_some() {
            packed_biases = Vec::new();
        }
        let (codes, nibbles, code_max) = codes.finish();
        Ok(PackedWeight {
            out,
            input,
            parts,
            code_max,
            codes,
            nibbles,
            scales: packed_scales,
            biases: packed_biases,
            bias_offset,
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
        let blocks = self.input / BLOCK;
        let len = BLOCK / self.parts;
        for (k, v) in values.iter_mut().enumerate() {
            let q = self.code(panel, row, k);
            let at = (panel * blocks * self.parts + k / len) * PANEL + row;
            *v = self.scales[at] * f32::from(q) + self.bias(at);
        }
        Ok(())
    }

    /// Code `k` of row `r` of panel `panel` (the portable copy's and [`PackedWeight::row`]'s
    /// read; the SIMD copies unpack a pair of steps at a time).
    #[inline(always)]
    pub(super) fn code(&self, panel: usize, r: usize, k: usize) -> u8 {
        let (byte, shift) = place(self.nibbles, r, k);
        let code = self.codes[panel * self.panel_bytes() + byte] >> shift;
        if self.nibbles {
            code & NIBBLE_MAX
        } else {
            code
        }
    }

    /// The bias at `at` (an index of [`PackedWeight::scales`]): stored, or `offset · scale`.
    #[inline(always)]
    pub(super) fn bias(&self, at: usize) -> f32 {
        match self.bias_offset {
            Some(offset) => offset * self.scales[at],
            None => self.biases[at],
        }
    }

    /// The biases of the panel whose scales start at `first` (an index of
    /// [`PackedWeight::scales`]), as the SIMD copies read them.
    #[inline(always)]
    pub(super) fn panel_biases(&self, first: usize) -> PanelBiases {
        match self.bias_offset {
            Some(offset) => PanelBiases::Implicit(offset),
            // The stored biases have the scales' layout: `first` is inside them.
            None => PanelBiases::Stored(self.biases[first..].as_ptr()),
        }
    }

    /// Bytes of one panel's codes.
    #[inline(always)]
    pub(super) fn panel_bytes(&self) -> usize {
        PANEL * self.input / if self.nibbles { 2 } else { 1 }
    }

    /// Whether the codes are held two a byte (every code is at most 15).
    pub fn nibbles(&self) -> bool {
        self.nibbles
    }

    /// Whether the biases are left implicit (every one is the same multiple of its scale).
    pub fn implicit_biases(&self) -> bool {
        self.bias_offset.is_some()
    }

    /// Bytes it holds: half a byte or one per weight (nibbles or bytes), and four or eight per
    /// row and scale (per block of 32, or of 16; four where the biases are implicit).
    pub fn bytes(&self) -> usize {
        self.codes.len() + 4 * (self.scales.len() + self.biases.len())
    }
}

/// The offset `o` such that every row's bias is `o · scale` bit for bit, if there is one: `o`
/// from the first row with a finite non-zero scale (`bias / scale`; a division that does not
/// round-trip fails the check below, which is what decides). Rows past `out` (the last panel's
/// padding, zeros) are never stored, so they are not looked at. Scales that are not finite
/// keep the biases stored (a NaN's bits through a product are the hardware's to choose).
fn implicit_offset(out: usize, per_panel: usize, scales: &[f32], biases: &[f32]) -> Option<f32> {
    // Value `at` is row `at % PANEL` of panel `at / per_panel`.
    let real = |at: &usize| (at / per_panel) * PANEL + at % PANEL < out;
    if scales.iter().any(|s| !s.is_finite()) {
        return None;
    }
    let offset = (0..scales.len())
        .filter(real)
        .find(|&at| scales[at] != 0.0)
        .map(|at| biases[at] / scales[at])
        // Every scale zero: the biases must then be zeros of one sign (`±1 · 0`).
        .or_else(|| biases.first().map(|b| 1.0f32.copysign(*b)))?;
    let holds = (0..scales.len())
        .filter(real)
        .all(|at| (offset * scales[at]).to_bits() == biases[at].to_bits());
    holds.then_some(offset)
}

/// A weight's codes while its rows are packed: nibbles as long as every code so far is at
/// most 15, bytes from the first that is not (the rows already packed are unpacked then), so
/// a 4-bit weight never holds a byte a code, even for a moment.
struct Codes {
    bytes: Vec<u8>,
    nibbles: bool,
    /// Panels of 16 rows × `input` codes, as bytes.
    len: usize,
    max: u8,
}

impl Codes {
    fn new(len: usize) -> Self {
        Codes {
            bytes: vec![0u8; len / 2],
            nibbles: true,
            len,
            max: 0,
        }
    }

    /// Row `n`'s `input` codes into their places.
    fn put_row(&mut self, n: usize, input: usize, row: &[u8]) {
        let row_max = row.iter().copied().max().unwrap_or(0);
        self.max = self.max.max(row_max);
        if self.nibbles && row_max > NIBBLE_MAX {
            self.widen(input);
        }
        let (panel, r) = (n / PANEL, n % PANEL);
        let base = panel * PANEL * input / if self.nibbles { 2 } else { 1 };
        for (k, &c) in row.iter().enumerate() {
            let (byte, shift) = place(self.nibbles, r, k);
            self.bytes[base + byte] |= c << shift;
        }
    }

    /// The nibbles so far as bytes.
    fn widen(&mut self, input: usize) {
        let mut bytes = vec![0u8; self.len];
        let panel_codes = PANEL * input;
        for (panel, nibbles) in self.bytes.chunks_exact(panel_codes / 2).enumerate() {
            for r in 0..PANEL {
                for k in 0..input {
                    let (from, shift) = place(true, r, k);
                    let (to, _) = place(false, r, k);
                    bytes[panel * panel_codes + to] = (nibbles[from] >> shift) & NIBBLE_MAX;
                }
            }
        }
        self.bytes = bytes;
        self.nibbles = false;
    }

    /// The codes, whether they are nibbles, the largest.
    fn finish(self) -> (Vec<u8>, bool, u8) {
        (self.bytes, self.nibbles, self.max)
    }
}
