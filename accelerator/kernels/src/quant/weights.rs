//! [`PackedWeight`]: an affine-quantised weight repacked for the integer products.

use super::scales::{
    implicit_offset, Biases, Geometry, PanelValues, Parts, PartsBuilder, RowValues,
};
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
    /// Per panel, per block, per part: 16 rows' scales (`scales.rs`).
    pub(super) scales: Parts,
    /// Likewise the biases, or none where each is the same multiple of its scale.
    pub(super) biases: Biases,
    /// The largest code (from the codes themselves): the copies whose byte products saturate
    /// or are signed (AVX2's `vpmaddubsw`, NEON's `sdot`) take a cheaper exact route where the
    /// codes are small.
    pub(super) code_max: u8,
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
/// its scales and biases (one per `scale_len` inputs, each optionally also as a small integer
/// times a unit per 256 inputs), all to be filled.
pub struct RowParts<'a> {
    pub codes: &'a mut [u8],
    pub scales: RowValues<'a>,
    pub biases: RowValues<'a>,
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
                row.scales.values[j] = scales[n * groups + j * BLOCK / group];
                row.biases.values[j] = biases[n * groups + j * BLOCK / group];
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
        let g = Geometry { blocks, parts };
        // Rows past `out` in the last panel stay zero (codes, scales and biases): they add
        // nothing and are never stored.
        let mut codes = Codes::new(panels * PANEL * input);
        let mut scales = PartsBuilder::new(g, panels);
        let mut biases = PartsBuilder::new(g, panels);
        let mut row_codes = vec![0u8; input];
        let mut row = [(); 2].map(|_| {
            (
                vec![0.0f32; blocks * parts],
                vec![0.0f32; g.supers()],
                vec![0i8; blocks * parts],
            )
        });
        for n in 0..out {
            row_codes.fill(0);
            for (values, units, small) in row.iter_mut() {
                values.fill(0.0);
                units.fill(0.0);
                small.fill(0);
            }
            let [(sv, su, ss), (bv, bu, bs)] = &mut row;
            fill(
                n,
                RowParts {
                    codes: &mut row_codes,
                    scales: RowValues {
                        values: sv.as_mut_slice(),
                        units: su.as_mut_slice(),
                        small: ss.as_mut_slice(),
                    },
                    biases: RowValues {
                        values: bv.as_mut_slice(),
                        units: bu.as_mut_slice(),
                        small: bs.as_mut_slice(),
                    },
                },
            );
            codes.put_row(n, input, &row_codes);
            scales.put_row(n, sv, su, ss);
            biases.put_row(n, bv, bu, bs);
        }
        let biases = match implicit_offset(out, g.per_panel(), scales.floats(), biases.floats()) {
            Some(offset) => Biases::Implicit(offset),
            None => Biases::Stored(biases.finish()),
        };
        let (codes, nibbles, code_max) = codes.finish();
        Ok(PackedWeight {
            out,
            input,
            parts,
            code_max,
            codes,
            nibbles,
            scales: scales.finish(),
            biases,
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
            *v = self.scale(at) * f32::from(q) + self.bias(at);
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

    /// Where its scales and biases are.
    #[inline(always)]
    pub(super) fn geometry(&self) -> Geometry {
        Geometry {
            blocks: self.input / BLOCK,
            parts: self.parts,
        }
    }

    /// The scale at `at` (per panel, per block, per part, 16 rows).
    #[inline(always)]
    pub(super) fn scale(&self, at: usize) -> f32 {
        self.scales.value(self.geometry(), at)
    }

    /// The bias at `at`: stored, or `offset · scale`.
    #[inline(always)]
    pub(super) fn bias(&self, at: usize) -> f32 {
        match &self.biases {
            Biases::Implicit(offset) => offset * self.scale(at),
            Biases::Stored(parts) => parts.value(self.geometry(), at),
        }
    }

    /// Panel `panel`'s scales and biases as float32 values (`scales.rs`, [`PanelValues`]).
    pub(super) fn panel_values<'a>(
        &'a self,
        panel: usize,
        values: &'a mut PanelValues,
    ) -> (&'a [f32], &'a [f32]) {
        values.of(self.geometry(), &self.scales, &self.biases, panel)
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
        matches!(self.biases, Biases::Implicit(_))
    }

    /// Whether the scales (and stored biases) are held as small integers times a unit per 256
    /// inputs: `(scales, biases)`.
    pub fn factored(&self) -> (bool, bool) {
        (
            matches!(self.scales, Parts::Factored { .. }),
            matches!(self.biases, Biases::Stored(Parts::Factored { .. })),
        )
    }

    /// Bytes it holds: half a byte or one per weight (nibbles or bytes), and for each scale and
    /// bias four, or one (and four per 256 inputs) where factored, or none (implicit biases).
    pub fn bytes(&self) -> usize {
        self.codes.len() + self.scales.bytes() + self.biases.bytes()
    }
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
