//! Integer products of affine-quantised weights (GGUF Q4_0/Q4_1/Q8_0 as the loader maps them,
//! mlx-community's 4- and 8-bit) with activations quantised to 8 bits: what a chat model's
//! projections cost on a CPU with AVX-512 VNNI, where a float32 product of widened weights runs
//! at a quarter of the rate (docs/benchmarks.md, "The read at 1B").
//!
//! A weight `W[n, k] = s[n, g] · q[n, k] + b[n, g]` (codes `q` unsigned, 4 or 8 bits, groups of
//! 32, 64 or 128 inputs) is repacked once into [`PackedWeight`]: codes as bytes in panels of 16
//! rows, four inputs of each row side by side, so that one 64-byte load feeds one `vpdpbusd` for
//! 16 outputs; scales and biases per row and per block of 32 inputs.
//!
//! Activations `x[m, k]` are quantised per row and block of 32 ([`QuantizedRows`]):
//! `x ≈ d[m, j] · c[m, k]`, `c` in −127..=127 (what llama.cpp does to activations before its
//! integer products, "Q8_0"), with each block's sum `d · Σ c`. Then
//!
//! `y[m, n] = Σ_j (s[n, j] · d[m, j]) · Σ_{k∈j} q[n, k] c[m, k]  +  Σ_j b[n, j] · d[m, j] Σ_{k∈j} c[m, k]`
//!
//! The inner sums are exact 32-bit integer sums; the outer one runs over blocks in order with
//! one fused multiply-add per term, so an output's bits depend only on its row of `x` and its
//! row of `W`, never on how many rows are multiplied together or how the work is split between
//! threads (the exactness rule of docs/logit-read.md). The portable copy computes the same
//! bits, one scalar at a time: tests hold the two together.
//!
//! The only approximation is the activations' 8 bits (a relative error of at most 1/254 of a
//! block's largest value per entry); docs/logit-read.md, "Kernels", says what it does to a read.

use std::fmt;
use std::sync::OnceLock;

/// Inputs per activation block (and per scale in a packed weight).
pub const BLOCK: usize = 32;
/// Rows of a weight per panel (one 512-bit register of 32-bit sums).
pub const PANEL: usize = 16;
/// Inputs of a row side by side in a panel (one `vpdpbusd` lane).
const STEP: usize = 4;
/// Activation rows per call of the inner kernel (eight sums and eight accumulators in
/// registers).
const ROWS: usize = 8;

/// The instruction set the integer products run with in this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantIsa {
    /// x86-64 with AVX-512 F, BW and VNNI: 64 byte products per instruction.
    Avx512Vnni,
    /// One scalar at a time: correct everywhere, and far too slow to serve a model.
    Portable,
}

impl QuantIsa {
    /// How it is named in the model's fingerprint.
    pub fn name(self) -> &'static str {
        match self {
            QuantIsa::Avx512Vnni => "int8-avx512vnni",
            QuantIsa::Portable => "int8-portable",
        }
    }
}

/// The integer products' instruction set in this process, detected once.
pub fn quant_isa() -> QuantIsa {
    static ISA: OnceLock<QuantIsa> = OnceLock::new();
    *ISA.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512vnni")
        {
            return QuantIsa::Avx512Vnni;
        }
        QuantIsa::Portable
    })
}

/// Whether the integer products are worth serving a model with here (faster than float32
/// products of widened weights).
pub fn fast() -> bool {
    quant_isa() != QuantIsa::Portable
}

/// Why a weight or an activation cannot be multiplied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuantError {
    /// Codes of a width the packing does not read (4 and 8 bits are).
    Bits(u32),
    /// A group that is not a whole number of 32-input blocks, or inputs that are not a whole
    /// number of groups.
    Group { group: usize, input: usize },
    /// Slices whose lengths disagree with the shapes given.
    Shape(&'static str),
}

impl fmt::Display for QuantError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QuantError::Bits(bits) => write!(f, "{bits}-bit codes (4 and 8 are supported)"),
            QuantError::Group { group, input } => write!(
                f,
                "groups of {group} over {input} inputs (groups must be a multiple of {BLOCK} \
                 and divide the inputs)"
            ),
            QuantError::Shape(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for QuantError {}

/// An affine-quantised weight `[out, input]` repacked for the integer products.
#[derive(Clone, Debug)]
pub struct PackedWeight {
    out: usize,
    input: usize,
    /// Per panel, per step of 4 inputs: 16 rows × 4 codes (`PANEL · input` bytes a panel).
    codes: Vec<u8>,
    /// Per panel, per block: 16 rows' scales.
    scales: Vec<f32>,
    /// Per panel, per block: 16 rows' biases.
    biases: Vec<f32>,
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
        if group == 0 || group % BLOCK != 0 || input % group != 0 {
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
        if group == 0 || group % BLOCK != 0 || input % group != 0 || input == 0 {
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
        Ok(PackedWeight {
            out,
            input,
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
    rows: usize,
    input: usize,
    precision: Precision,
    codes: Vec<i8>,
    /// [`Precision::Fine`]: each value's rounding error in 1/256 of its block's step.
    fine: Vec<i8>,
    /// Per row and block: what one unit of the block's integer sum is worth (`d`, or `d / 256`
    /// where fine codes extend the codes).
    steps: Vec<f32>,
    /// Per row and block: the sum of the block's quantised values (step · Σ integer values).
    sums: Vec<f32>,
    /// The codes as the AVX-512 kernel reads them ([`QuantizedRows::slot`]): per group of
    /// [`ROWS`] rows, per step of 4 inputs, each row's 4 codes (and 4 fine codes) side by side,
    /// so a tile's loads walk one stream instead of one per row (rows 2 KiB apart fall in the
    /// same few L1 sets).
    tiled: Vec<i8>,
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
        let input = if rows == 0 { 0 } else { x.len() / rows };
        if rows == 0 || input == 0 || x.len() != rows * input || input % BLOCK != 0 {
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
    fn slot(&self) -> usize {
        match self.precision {
            Precision::Coarse => STEP,
            Precision::Fine => 2 * STEP,
        }
    }

    /// Bytes of one group of [`ROWS`] rows in [`QuantizedRows::tiled`].
    fn group_bytes(&self) -> usize {
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
fn quantize_blocks(x: &[f32], (codes, fine, steps, sums): BlockOutputs<'_>) {
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

/// `y = x · Wᵀ`: `y` is `[x.rows(), w.out()]`, row-major. Panels are split between the
/// process's cores; every output is the same bits however they are split.
pub fn matmul(x: &QuantizedRows, w: &PackedWeight, y: &mut [f32]) -> Result<(), QuantError> {
    if x.input != w.input {
        return Err(QuantError::Shape(
            "activations and weight have different inputs",
        ));
    }
    if y.len() != x.rows * w.out {
        return Err(QuantError::Shape("the output is not [rows, out]"));
    }
    let panels = w.out.div_ceil(PANEL);
    let threads = threads().min(panels.div_ceil(4)).max(1);
    let out = OutPtr(y.as_mut_ptr());
    let share = panels.div_ceil(threads);
    let run = |from: usize| {
        let to = (from + share).min(panels);
        // SAFETY: each thread writes only the columns of its own panels, inside `y` (checked
        // above: `y` is `[rows, out]` and every panel's columns are below `out`).
        unsafe { panels_product(x, w, from..to, out) }
    };
    if threads == 1 {
        run(0);
        return Ok(());
    }
    std::thread::scope(|scope| {
        for t in 1..threads {
            let run = &run;
            scope.spawn(move || run(t * share));
        }
        run(0);
    });
    Ok(())
}

/// The cores products are split between.
fn threads() -> usize {
    static THREADS: OnceLock<usize> = OnceLock::new();
    *THREADS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// `y`'s first value, shared by threads that write disjoint columns.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: the threads given one write disjoint elements (their own panels' columns).
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// The panels `range` of `w` against every row of `x`.
///
/// # Safety
/// `out` points to `[x.rows, w.out]` values that no other thread writes in these panels'
/// columns.
unsafe fn panels_product(
    x: &QuantizedRows,
    w: &PackedWeight,
    range: std::ops::Range<usize>,
    out: OutPtr,
) {
    for panel in range {
        let cols = (w.out - panel * PANEL).min(PANEL);
        let mut m = 0;
        while m < x.rows {
            let rows = (x.rows - m).min(ROWS);
            let tile = Tile {
                panel,
                first_row: m,
                rows,
                cols,
            };
            #[cfg(target_arch = "x86_64")]
            if quant_isa() == QuantIsa::Avx512Vnni {
                // SAFETY: `quant_isa` found AVX-512 F, BW and VNNI; the caller's contract
                // covers `out`.
                unsafe { avx512::tile(x, w, tile, out) };
                m += rows;
                continue;
            }
            // SAFETY: the caller's contract covers `out`.
            unsafe { portable_tile(x, w, tile, out) };
            m += rows;
        }
    }
}

/// Up to [`ROWS`] rows of `x` against one panel of `w`.
#[derive(Clone, Copy)]
struct Tile {
    panel: usize,
    first_row: usize,
    rows: usize,
    /// Columns of the panel inside `w.out`.
    cols: usize,
}

/// The same sums as the AVX-512 kernel, in the same order, one scalar at a time.
///
/// # Safety
/// As [`panels_product`].
unsafe fn portable_tile(x: &QuantizedRows, w: &PackedWeight, t: Tile, out: OutPtr) {
    let blocks = x.input / BLOCK;
    let codes = &w.codes[t.panel * PANEL * w.input..(t.panel + 1) * PANEL * w.input];
    for i in 0..t.rows {
        let m = t.first_row + i;
        let row = &x.codes[m * x.input..(m + 1) * x.input];
        for r in 0..t.cols {
            let mut acc = 0.0f32;
            for j in 0..blocks {
                let q = |k: usize| codes[(k / STEP) * PANEL * STEP + r * STEP + k % STEP] as i32;
                let mut dot: i32 = (j * BLOCK..(j + 1) * BLOCK)
                    .map(|k| q(k) * row[k] as i32)
                    .sum();
                if x.precision == Precision::Fine {
                    let fine = &x.fine[m * x.input..(m + 1) * x.input];
                    dot = (dot << 8)
                        + (j * BLOCK..(j + 1) * BLOCK)
                            .map(|k| q(k) * fine[k] as i32)
                            .sum::<i32>();
                }
                let at = (t.panel * blocks + j) * PANEL + r;
                let s = w.scales[at] * x.steps[m * blocks + j];
                acc = (dot as f32).mul_add(s, acc);
                acc = w.biases[at].mul_add(x.sums[m * blocks + j], acc);
            }
            // SAFETY: (m, panel·16 + r) is inside `[rows, out]`; the caller's contract.
            unsafe { *out.0.add(m * w.out + t.panel * PANEL + r) = acc };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use core::arch::x86_64::*;

    use super::{OutPtr, PackedWeight, Precision, QuantizedRows, Tile, BLOCK, PANEL, ROWS, STEP};

    /// One tile; the row count picks an instantiation whose sums all live in registers.
    ///
    /// # Safety
    /// The CPU has AVX-512 F, BW and VNNI; `out` as [`super::panels_product`] says.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn tile(x: &QuantizedRows, w: &PackedWeight, t: Tile, out: OutPtr) {
        // SAFETY: passed on from the caller.
        unsafe {
            if x.precision == Precision::Fine {
                by_rows::<true>(x, w, t, out)
            } else {
                by_rows::<false>(x, w, t, out)
            }
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    #[inline]
    unsafe fn by_rows<const FINE: bool>(x: &QuantizedRows, w: &PackedWeight, t: Tile, out: OutPtr) {
        // SAFETY: passed on from the caller.
        unsafe {
            match t.rows {
                8 => rows::<8, FINE>(x, w, t, out),
                7 => rows::<7, FINE>(x, w, t, out),
                6 => rows::<6, FINE>(x, w, t, out),
                5 => rows::<5, FINE>(x, w, t, out),
                4 => rows::<4, FINE>(x, w, t, out),
                3 => rows::<3, FINE>(x, w, t, out),
                2 => rows::<2, FINE>(x, w, t, out),
                _ => rows::<1, FINE>(x, w, t, out),
            }
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    #[inline]
    unsafe fn rows<const R: usize, const FINE: bool>(
        x: &QuantizedRows,
        w: &PackedWeight,
        t: Tile,
        out: OutPtr,
    ) {
        const { assert!(R <= ROWS) };
        let blocks = x.input / BLOCK;
        let input = x.input;
        // SAFETY: every offset below stays inside the panel's codes, scales and biases (the
        // panel is `PANEL · input` codes and `blocks · PANEL` scales) and inside rows
        // `first_row..first_row + R` of `x` (R ≤ rows left, checked by the caller).
        unsafe {
            let codes = w.codes.as_ptr().add(t.panel * PANEL * input);
            let scales = w.scales.as_ptr().add(t.panel * blocks * PANEL);
            let biases = w.biases.as_ptr().add(t.panel * blocks * PANEL);
            // The tile's group in the interleaved codes (tiles start at multiples of ROWS).
            let slot = x.slot();
            let a = x.tiled.as_ptr().add(t.first_row / ROWS * x.group_bytes());
            let a_steps = x.steps.as_ptr().add(t.first_row * blocks);
            let a_sums = x.sums.as_ptr().add(t.first_row * blocks);
            let mut acc = [_mm512_setzero_ps(); R];
            for j in 0..blocks {
                // Two independent chains of sums per row (a `vpdpbusd` waits for the one
                // before it on the same register): the coarse and fine codes' where fine, the
                // even and odd steps' where not. The weight load is shared.
                let mut first = [_mm512_setzero_si512(); R];
                let mut second = [_mm512_setzero_si512(); R];
                for s in 0..BLOCK / STEP {
                    let k = j * BLOCK + s * STEP;
                    let wv = _mm512_loadu_si512(codes.add(k * PANEL).cast());
                    for i in 0..R {
                        let at = a.add((k / STEP * ROWS + i) * slot);
                        let four = at.cast::<i32>().read_unaligned();
                        let four = _mm512_set1_epi32(four);
                        if FINE {
                            first[i] = _mm512_dpbusd_epi32(first[i], wv, four);
                            let f = at.add(STEP).cast::<i32>().read_unaligned();
                            second[i] = _mm512_dpbusd_epi32(second[i], wv, _mm512_set1_epi32(f));
                        } else if s % 2 == 0 {
                            first[i] = _mm512_dpbusd_epi32(first[i], wv, four);
                        } else {
                            second[i] = _mm512_dpbusd_epi32(second[i], wv, four);
                        }
                    }
                }
                let mut dots = [_mm512_setzero_si512(); R];
                for i in 0..R {
                    // Fine: 256·coarse + fine; else the two halves' sum.
                    let high = if FINE {
                        _mm512_slli_epi32::<8>(first[i])
                    } else {
                        first[i]
                    };
                    dots[i] = _mm512_add_epi32(high, second[i]);
                }
                let sw = _mm512_loadu_ps(scales.add(j * PANEL));
                let bw = _mm512_loadu_ps(biases.add(j * PANEL));
                for i in 0..R {
                    let s = _mm512_mul_ps(sw, _mm512_set1_ps(*a_steps.add(i * blocks + j)));
                    acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots[i]), s, acc[i]);
                    let sum = _mm512_set1_ps(*a_sums.add(i * blocks + j));
                    acc[i] = _mm512_fmadd_ps(bw, sum, acc[i]);
                }
            }
            let mask: __mmask16 = if t.cols >= PANEL {
                0xFFFF
            } else {
                ((1u32 << t.cols) - 1) as __mmask16
            };
            for (i, value) in acc.iter().enumerate() {
                let at = (t.first_row + i) * w.out + t.panel * PANEL;
                _mm512_mask_storeu_ps(out.0.add(at), mask, *value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic pseudo-random stream (no dependency for tests).
    fn stream(seed: u64) -> impl FnMut() -> f32 {
        let mut state = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        }
    }

    struct Case {
        out: usize,
        input: usize,
        group: usize,
        bits: u32,
        codes: Vec<u8>,
        scales: Vec<f32>,
        biases: Vec<f32>,
    }

    fn case(out: usize, input: usize, group: usize, bits: u32, seed: u64) -> Case {
        let mut r = stream(seed);
        let levels = (1u32 << bits) as f32;
        let codes = (0..out * input)
            .map(|_| ((r() * 0.5 + 0.5) * (levels - 1.0)).round() as u8)
            .collect();
        let groups = out * input / group;
        let scales = (0..groups).map(|_| 0.01 + 0.05 * r().abs()).collect();
        let biases = (0..groups).map(|_| -0.3 * r()).collect();
        Case {
            out,
            input,
            group,
            bits,
            codes,
            scales,
            biases,
        }
    }

    impl Case {
        fn weight(&self, n: usize, k: usize) -> f64 {
            let g = n * (self.input / self.group) + k / self.group;
            self.scales[g] as f64 * self.codes[n * self.input + k] as f64 + self.biases[g] as f64
        }

        /// MLX's packing: codes from the lowest bits of each word up.
        fn packed(&self) -> Vec<u32> {
            let per = 32 / self.bits as usize;
            self.codes
                .chunks_exact(per)
                .map(|c| {
                    c.iter().enumerate().fold(0u32, |w, (i, &q)| {
                        w | (q as u32) << (i * self.bits as usize)
                    })
                })
                .collect()
        }

        fn packed_weight(&self) -> PackedWeight {
            PackedWeight::from_affine(
                &self.packed(),
                &self.scales,
                &self.biases,
                (self.out, self.input),
                self.group,
                self.bits,
            )
            .expect("packs")
        }
    }

    fn activations(rows: usize, input: usize, seed: u64) -> Vec<f32> {
        let mut r = stream(seed);
        // An outlier channel, as real activations have, so the block scales matter.
        (0..rows * input)
            .map(|i| if i % input == 5 { 20.0 * r() } else { r() })
            .collect()
    }

    fn product(x: &[f32], rows: usize, w: &PackedWeight, precision: Precision) -> Vec<f32> {
        let mut q = QuantizedRows::default();
        q.quantize(x, rows, precision).expect("quantizes");
        let mut y = vec![0.0; rows * w.out()];
        matmul(&q, w, &mut y).expect("multiplies");
        y
    }

    #[test]
    fn products_agree_with_float64_within_the_activations_rounding() {
        for (precision, steps) in [(Precision::Coarse, 254.0), (Precision::Fine, 254.0 * 256.0)] {
            for (out, input, group, bits) in [(37, 64, 32, 4), (16, 128, 64, 8), (50, 256, 128, 4)]
            {
                let c = case(out, input, group, bits, out as u64);
                let rows = 11;
                let x = activations(rows, input, 7);
                let y = product(&x, rows, &c.packed_weight(), precision);
                let mut worst = 0.0f64;
                for m in 0..rows {
                    for n in 0..out {
                        let terms = (0..input).map(|k| x[m * input + k] as f64 * c.weight(n, k));
                        let exact: f64 = terms.clone().sum();
                        let magnitude: f64 = terms.map(f64::abs).sum();
                        // Each activation is off by at most half a step (max |x| / 254 of its
                        // block, 256 times less when fine), times |W|; and float32 sums.
                        let bound: f64 = (0..input)
                            .map(|k| {
                                let block = &x[m * input + k / BLOCK * BLOCK..][..BLOCK];
                                let largest = block.iter().fold(0.0f32, |a, v| a.max(v.abs()));
                                largest as f64 / steps * c.weight(n, k).abs()
                            })
                            .sum::<f64>()
                            + 1e-6 * magnitude
                            + 1e-7;
                        let got = y[m * out + n] as f64;
                        worst = worst.max((got - exact).abs() / bound);
                        assert!(
                            (got - exact).abs() <= bound,
                            "{precision:?} [{m}, {n}] of {out}x{input}/{group}/{bits}: {got} \
                             against {exact} (bound {bound})"
                        );
                    }
                }
                eprintln!(
                    "{precision:?} {out}x{input}/{group}/{bits}: worst {worst:.2} of the bound"
                );
            }
        }
    }

    #[test]
    fn a_row_gets_the_same_bits_alone_in_any_tile_and_on_the_portable_copy() {
        let c = case(40, 96, 32, 4, 3);
        let w = c.packed_weight();
        let rows = 19;
        let x = activations(rows, 96, 11);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        for precision in [Precision::Coarse, Precision::Fine] {
            let together = product(&x, rows, &w, precision);
            for m in [0, 7, 8, 18] {
                let alone = product(&x[m * 96..(m + 1) * 96], 1, &w, precision);
                assert_eq!(
                    bits(&alone),
                    bits(&together[m * 40..(m + 1) * 40]),
                    "row {m}"
                );
            }
            // The portable copy, tile by tile, gives the same bits as whatever ran above, and
            // the portable quantisation the same codes as the vectorised one.
            let mut q = QuantizedRows::default();
            q.quantize(&x, rows, precision).expect("quantizes");
            let (mut codes, mut fine) = (vec![0i8; x.len()], vec![0i8; x.len()]);
            let (mut steps, mut sums) = (vec![0f32; x.len() / BLOCK], vec![0f32; x.len() / BLOCK]);
            let fine_out = (precision == Precision::Fine).then_some(&mut fine[..]);
            quantize_blocks(&x, (&mut codes, fine_out, &mut steps, &mut sums));
            assert_eq!(codes, q.codes, "{precision:?} codes");
            if precision == Precision::Fine {
                assert_eq!(fine, q.fine, "fine codes");
            }
            assert_eq!(bits(&steps), bits(&q.steps), "{precision:?} steps");
            assert_eq!(bits(&sums), bits(&q.sums), "{precision:?} sums");
            let mut portable = vec![0.0f32; rows * 40];
            let out = OutPtr(portable.as_mut_ptr());
            for panel in 0..40usize.div_ceil(PANEL) {
                for first_row in (0..rows).step_by(ROWS) {
                    let tile = Tile {
                        panel,
                        first_row,
                        rows: (rows - first_row).min(ROWS),
                        cols: (40 - panel * PANEL).min(PANEL),
                    };
                    // SAFETY: a single thread writes inside `portable` ([rows, 40]).
                    unsafe { portable_tile(&q, &w, tile, out) };
                }
            }
            assert_eq!(bits(&portable), bits(&together), "{precision:?}");
        }
    }

    #[test]
    fn zero_blocks_and_bad_shapes_are_handled() {
        let c = case(16, 64, 32, 8, 5);
        let w = c.packed_weight();
        for precision in [Precision::Coarse, Precision::Fine] {
            let y = product(&[0.0; 64], 1, &w, precision);
            assert!(y.iter().all(|&v| v == 0.0));
        }
        let mut q = QuantizedRows::default();
        assert!(q.quantize(&[0.0; 48], 1, Precision::Fine).is_err());
        q.quantize(&[1.0; 32], 1, Precision::Fine)
            .expect("one block");
        assert!(matmul(&q, &w, &mut [0.0; 16]).is_err());
        assert_eq!(
            PackedWeight::from_affine(&[0; 16], &[0.0; 2], &[0.0; 2], (2, 64), 32, 3).err(),
            Some(QuantError::Bits(3))
        );
        assert!(matches!(
            PackedWeight::from_affine(&[0; 8], &[0.0; 4], &[0.0; 4], (1, 64), 16, 4),
            Err(QuantError::Group { .. })
        ));
    }
}
