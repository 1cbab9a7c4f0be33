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
    /// Per row and block: what one unit of the block's integer sum is worth (`d`, or `d / 256`
    /// where fine codes extend the codes).
    pub(super) steps: Vec<f32>,
    /// Per row and block: the sum of the block's quantised values (step · Σ integer values).
    pub(super) sums: Vec<f32>,
    /// Per row, block and half (16 inputs): the half's quantised sum, likewise (for weights
    /// with a scale per 16 inputs).
    pub(super) half_sums: Vec<f32>,
    /// The codes as the AVX-512 kernel reads them ([`QuantizedRows::slot`]): per group of
    /// [`ROWS`] rows, per step of 4 inputs, each row's 4 codes (and, at [`Precision::Fine`], its
    /// 4 fine codes: each value's rounding error in 1/256 of its block's step) side by side, so
    /// a tile's loads walk one stream instead of one per row (rows 2 KiB apart fall in the same
    /// few L1 sets). Rows past the last of a group stay zero.
    pub(super) tiled: Vec<i8>,
}

/// Values a thread quantises at the least when the rows are split between threads (below it,
/// starting a thread costs more than it saves).
const PER_THREAD: usize = 1 << 16;

impl QuantizedRows {
    /// `rows` rows of `x` (`[rows, input]`, `input` a multiple of 32) at `precision`, replacing
    /// what it held. Groups of [`ROWS`] rows are split between the process's cores; every
    /// value is the same bits however they are split, and on the portable copy.
    pub fn quantize(
        &mut self,
        x: &[f32],
        rows: usize,
        precision: Precision,
    ) -> Result<(), QuantError> {
        self.quantize_with(super::quant_isa(), x, rows, precision)
    }

    /// [`QuantizedRows::quantize`] on the copy that goes with `isa` (for tests and benchmarks:
    /// every copy gives the same bits); an error where this CPU cannot run it.
    pub fn quantize_with(
        &mut self,
        isa: super::QuantIsa,
        x: &[f32],
        rows: usize,
        precision: Precision,
    ) -> Result<(), QuantError> {
        let block = super::block_fn(isa).ok_or(QuantError::Isa(isa))?;
        self.quantize_on(x, rows, precision, block)
    }

    /// [`QuantizedRows::quantize`], each block through `block`.
    pub(super) fn quantize_on(
        &mut self,
        x: &[f32],
        rows: usize,
        precision: Precision,
        block: BlockFn,
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
        let blocks = input / BLOCK;
        self.steps.resize(rows * blocks, 0.0);
        self.sums.resize(rows * blocks, 0.0);
        self.half_sums.resize(2 * rows * blocks, 0.0);
        let group = self.group_bytes();
        self.tiled.clear();
        self.tiled.resize(rows.div_ceil(ROWS) * group, 0);
        let slot = self.slot();
        let groups = self
            .tiled
            .chunks_mut(group)
            .zip(x.chunks(ROWS * input))
            .zip(self.steps.chunks_mut(ROWS * blocks))
            .zip(self.sums.chunks_mut(ROWS * blocks))
            .zip(self.half_sums.chunks_mut(2 * ROWS * blocks))
            .map(|((((tiled, x), steps), sums), half_sums)| RowGroup {
                tiled,
                x,
                steps,
                sums,
                half_sums,
            });
        let threads = crate::threads()
            .min(x.len() / PER_THREAD)
            .min(rows.div_ceil(ROWS))
            .max(1);
        let mut groups: Vec<RowGroup<'_>> = groups.collect();
        let share = groups.len().div_ceil(threads).max(1);
        let mut pieces = Vec::with_capacity(threads);
        while groups.len() > share {
            let rest = groups.split_off(share);
            pieces.push(std::mem::replace(&mut groups, rest));
        }
        pieces.push(groups);
        crate::on_threads(pieces, |groups| {
            for g in groups {
                g.quantize(input, slot, precision, block);
            }
        });
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

    /// Where input `k` of row `m`'s code sits in [`QuantizedRows::tiled`] (its fine code is
    /// [`STEP`] bytes further on).
    pub(super) fn at(&self, m: usize, k: usize) -> usize {
        m / ROWS * self.group_bytes() + (k / STEP * ROWS + m % ROWS) * self.slot() + k % STEP
    }
}

/// One group of [`ROWS`] rows: its input values and where their codes, steps and sums go.
struct RowGroup<'a> {
    tiled: &'a mut [i8],
    x: &'a [f32],
    steps: &'a mut [f32],
    sums: &'a mut [f32],
    half_sums: &'a mut [f32],
}

impl RowGroup<'_> {
    fn quantize(self, input: usize, slot: usize, precision: Precision, block: BlockFn) {
        let blocks = input / BLOCK;
        let fine_wanted = precision == Precision::Fine;
        let (mut codes, mut fine) = ([0i8; BLOCK], [0i8; BLOCK]);
        for (i, row) in self.x.chunks_exact(input).enumerate() {
            for (j, values) in row.chunks_exact(BLOCK).enumerate() {
                let values: &[f32; BLOCK] = values.try_into().expect("a whole block");
                let fine_out = fine_wanted.then_some(&mut fine);
                let (step, sum) = block(values, &mut codes, fine_out);
                self.steps[i * blocks + j] = step;
                self.sums[i * blocks + j] = sum;
                // Each half's sum from the codes themselves, in this one portable place, so
                // every copy of the block's quantisation gives the same bits.
                for h in 0..2 {
                    let half = 16 * h..16 * h + 16;
                    let coarse: i32 = codes[half.clone()].iter().map(|&c| c as i32).sum();
                    let units = if fine_wanted {
                        256 * coarse + fine[half].iter().map(|&f| f as i32).sum::<i32>()
                    } else {
                        coarse
                    };
                    self.half_sums[(i * blocks + j) * 2 + h] = step * units as f32;
                }
                // The block's 8 steps of 4 inputs, each into this row's slot of its step.
                for s in 0..BLOCK / STEP {
                    let at = ((j * BLOCK / STEP + s) * ROWS + i) * slot;
                    self.tiled[at..at + STEP].copy_from_slice(&codes[s * STEP..][..STEP]);
                    if fine_wanted {
                        self.tiled[at + STEP..at + 2 * STEP]
                            .copy_from_slice(&fine[s * STEP..][..STEP]);
                    }
                }
            }
        }
    }
}

/// Quantises one block of 32 values into codes (and fine codes where given); returns the
/// block's step and quantised sum.
pub(super) type BlockFn =
    fn(&[f32; BLOCK], &mut [i8; BLOCK], Option<&mut [i8; BLOCK]>) -> (f32, f32);

/// Adding 1.5 · 2^23 rounds a value of magnitude below 2^22 to an integer (ties to even)
/// without a libm call; the SIMD copies do the same two operations.
pub(super) const ROUND: f32 = 12_582_912.0;

/// One block: `d = max|x| / 127`, `c = x / d` rounded to nearest (even); where `fine` is given,
/// the rounding error `x − d·c` in steps of `d / 256`, rounded the same way, so that
/// `256·c + fine` is `x` in steps of `d / 256`. Returns what one unit of the block's integer
/// sum is worth and the block's quantised sum.
pub(super) fn quantize_block(
    values: &[f32; BLOCK],
    codes: &mut [i8; BLOCK],
    fine: Option<&mut [i8; BLOCK]>,
) -> (f32, f32) {
    let largest = values.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = largest / 127.0;
    let inverse = if d > 0.0 { 1.0 / d } else { 0.0 };
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
    let fine_sum = fine.map(|fine| {
        let fine_inverse = inverse * 256.0;
        for ((f, &c), &v) in fine.iter_mut().zip(codes.iter()).zip(values) {
            *f = round((v - d * c as f32) * fine_inverse);
        }
        fine.iter().map(|&f| f as i32).sum()
    });
    block_sums(d, coarse_sum, fine_sum)
}

/// A block's step and quantised sum from its scale `d` and integer sums (shared by both
/// copies of the block's quantisation, so they cannot drift apart).
#[inline(always)]
pub(super) fn block_sums(d: f32, coarse_sum: i32, fine_sum: Option<i32>) -> (f32, f32) {
    match fine_sum {
        None => (d, d * coarse_sum as f32),
        Some(fine_sum) => {
            let step = d / 256.0;
            (step, step * (256 * coarse_sum + fine_sum) as f32)
        }
    }
}
