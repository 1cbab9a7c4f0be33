//! [`QuantizedRows`]: a product's input rows rounded per block of 32 at a [`Precision`].

use std::fmt;

use super::{QuantError, BLOCK, ROWS, STEP};

/// How finely activations are rounded before the integer products.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Precision {
    /// Two byte codes a value: the 8-bit code and its rounding error in 1/256 steps, so a
    /// value is off by at most 1/65,024 of its block's largest magnitude (about 16 bits), for
    /// twice the byte products (the sums and the rest of the kernel are shared).
    #[default]
    Fine,
    /// One byte code a value (at most 1/254 of the block's largest magnitude off), as
    /// llama.cpp rounds activations: half the products, and on SmolLM2 label probabilities
    /// about 1e-2 from a float32 read (docs/logit-read.md, "Kernels").
    Coarse,
}

impl Precision {
    /// Its name in fingerprints and flags: `a16` or `a8`.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Fine => "a16",
            Precision::Coarse => "a8",
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Precision::Fine => "16",
            Precision::Coarse => "8",
        })
    }
}

impl std::str::FromStr for Precision {
    type Err = String;

    /// `16` (fine) or `8` (coarse): the bits an activation keeps.
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "16" => Ok(Precision::Fine),
            "8" => Ok(Precision::Coarse),
            other => Err(format!(
                "{other:?} is not an activation width; use 16 (the default) or 8"
            )),
        }
    }
}

/// Rows of activations quantised per block of 32 (reused between products: it only grows).
#[derive(Clone, Debug, Default)]
pub struct QuantizedRows {
    pub(super) rows: usize,
    pub(super) input: usize,
    pub(super) precision: Precision,
    pub(super) codes: Vec<i8>,
    /// [`Precision::Fine`]: each value's rounding error in 1/256 of its block's step.
    pub(super) fine: Vec<i8>,
    /// Per row and block: what one unit of the block's integer sum is worth (`d`, or `d / 256`
    /// where fine codes extend the codes).
    pub(super) steps: Vec<f32>,
    /// Per row and block: the sum of the block's quantised values (step · Σ integer values).
    pub(super) sums: Vec<f32>,
    /// The codes as the AVX-512 kernel reads them ([`QuantizedRows::slot`]): per group of
    /// [`ROWS`] rows, per step of 4 inputs, each row's 4 codes (and 4 fine codes) side by side,
    /// so a tile's loads walk one stream instead of one per row (rows 2 KiB apart fall in the
    /// same few L1 sets).
    pub(super) tiled: Vec<i8>,
}

impl QuantizedRows {
    /// `rows` rows of `x` (`[rows, input]`, `input` a multiple of 32) at `precision`, replacing
    /// what it held.
    pub fn quantize(
        &mut self,
        x: &[f32],
        rows: usize,
        precision: Precision,
    ) -> Result<(), QuantError> {
        let input = x.len().checked_div(rows).unwrap_or(0);
        if rows == 0 || input == 0 || x.len() != rows * input || !input.is_multiple_of(BLOCK) {
            return Err(QuantError::Shape(
                "activations are not whole rows of 32-input blocks",
            ));
        }
        self.rows = rows;
        self.input = input;
        self.precision = precision;
        self.codes.resize(x.len(), 0);
        self.steps.resize(x.len() / BLOCK, 0.0);
        self.sums.resize(x.len() / BLOCK, 0.0);
        if precision == Precision::Fine {
            self.fine.resize(x.len(), 0);
        }
        let fine = match precision {
            Precision::Fine => Some(&mut self.fine[..]),
            Precision::Coarse => None,
        };
        let out = (
            &mut self.codes[..],
            fine,
            &mut self.steps[..],
            &mut self.sums[..],
        );
        #[cfg(target_arch = "x86_64")]
        if crate::isa() == crate::Isa::Avx2Fma {
            #[target_feature(enable = "avx2,fma")]
            unsafe fn fast(x: &[f32], out: BlockOutputs<'_>) {
                quantize_blocks(x, out)
            }
            // SAFETY: `isa` found AVX2 and FMA (the loop has no fused operations to change:
            // the same bits as the portable copy).
            unsafe { fast(x, out) };
            self.interleave();
            return Ok(());
        }
        quantize_blocks(x, out);
        self.interleave();
        Ok(())
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Bytes of one row's codes per step in [`QuantizedRows::tiled`]: 4, or 8 with fine codes.
    pub(super) fn slot(&self) -> usize {
        match self.precision {
            Precision::Coarse => STEP,
            Precision::Fine => 2 * STEP,
        }
    }

    /// Bytes of one group of [`ROWS`] rows in [`QuantizedRows::tiled`].
    pub(super) fn group_bytes(&self) -> usize {
        self.input / STEP * ROWS * self.slot()
    }

    /// Fills `tiled` from the row-major codes (rows past the last of a group stay zero).
    fn interleave(&mut self) {
        let (slot, group) = (self.slot(), self.group_bytes());
        self.tiled.clear();
        self.tiled.resize(self.rows.div_ceil(ROWS) * group, 0);
        for m in 0..self.rows {
            let base = m / ROWS * group + m % ROWS * slot;
            let row = m * self.input..(m + 1) * self.input;
            for (step, four) in self.codes[row.clone()].chunks_exact(STEP).enumerate() {
                let at = base + step * ROWS * slot;
                self.tiled[at..at + STEP].copy_from_slice(four);
            }
            if self.precision == Precision::Fine {
                for (step, four) in self.fine[row].chunks_exact(STEP).enumerate() {
                    let at = base + step * ROWS * slot + STEP;
                    self.tiled[at..at + STEP].copy_from_slice(four);
                }
            }
        }
    }
}

/// Where a row-major run of blocks' codes, fine codes, steps and sums go.
type BlockOutputs<'a> = (
    &'a mut [i8],
    Option<&'a mut [i8]>,
    &'a mut [f32],
    &'a mut [f32],
);

/// Every block of `x` (a whole number of blocks) into `out`.
#[inline(always)]
pub(super) fn quantize_blocks(x: &[f32], (codes, fine, steps, sums): BlockOutputs<'_>) {
    let blocks = x
        .chunks_exact(BLOCK)
        .zip(codes.chunks_exact_mut(BLOCK))
        .zip(steps.iter_mut().zip(sums.iter_mut()));
    match fine {
        None => {
            for ((values, codes), (step, sum)) in blocks {
                quantize_block(values, codes, None, step, sum);
            }
        }
        Some(fine) => {
            for (((values, codes), (step, sum)), fine) in blocks.zip(fine.chunks_exact_mut(BLOCK)) {
                quantize_block(values, codes, Some(fine), step, sum);
            }
        }
    }
}

/// One block: `d = max|x| / 127`, `c = x / d` rounded to nearest (even); where `fine` is given,
/// the rounding error `x − d·c` in steps of `d / 256`, rounded the same way, so that
/// `256·c + fine` is `x` in steps of `d / 256`. `step` is what one unit of the block's integer
/// sum is worth and `sum` the block's quantised sum.
#[inline(always)]
fn quantize_block(
    values: &[f32],
    codes: &mut [i8],
    fine: Option<&mut [i8]>,
    step: &mut f32,
    sum: &mut f32,
) {
    let largest = values.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = largest / 127.0;
    let inverse = if d > 0.0 { 1.0 / d } else { 0.0 };
    // Adding 1.5 · 2^23 rounds a value of magnitude below 2^22 to an integer (ties to even)
    // without a libm call, so the loop vectorises on any x86-64.
    const ROUND: f32 = 12_582_912.0;
    let round = |v: f32| ((v + ROUND) - ROUND).clamp(-127.0, 127.0) as i8;
    for (c, &v) in codes.iter_mut().zip(values) {
        *c = round(v * inverse);
    }
    // The sum of the *quantised* block, so that the bias term sees the same rounded inputs as
    // the codes: the rounding error then meets the whole weight `s·q + b` (centred, small)
    // rather than `s·q` alone (codes 0..15 or 0..255 are all positive, so their error would
    // add up). On SmolLM2 this is the difference between llama.cpp-sized deviations and 3x
    // larger ones.
    let coarse_sum: i32 = codes.iter().map(|&c| c as i32).sum();
    match fine {
        None => {
            *step = d;
            *sum = d * coarse_sum as f32;
        }
        Some(fine) => {
            let fine_inverse = inverse * 256.0;
            for ((f, &c), &v) in fine.iter_mut().zip(codes.iter()).zip(values) {
                *f = round((v - d * c as f32) * fine_inverse);
            }
            let fine_sum: i32 = fine.iter().map(|&f| f as i32).sum();
            *step = d / 256.0;
            *sum = *step * (256 * coarse_sum + fine_sum) as f32;
        }
    }
}
