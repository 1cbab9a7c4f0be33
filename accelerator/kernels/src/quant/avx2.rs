//! The 256-bit x86-64 copies of the integer kernel: AVX2 (`vpmaddubsw` + `vpmaddwd`, as ggml
//! does) and AVX-VNNI (the VEX `vpdpbusd`); and the activations' quantisation on AVX2. Each
//! tile runs a half panel (8 outputs, one register of sums) at a time, a few rows at a time so
//! that the sums stay in AVX2's 16 registers.
//!
//! **Why the AVX2 sums are exact.** `vpmaddubsw` multiplies unsigned bytes (the weight's codes
//! `q`) by signed bytes (the activations' codes `c`, any i8: |c| ≤ 128) and adds adjacent pairs
//! into 16 bits *with signed saturation*: with 8-bit codes a pair reaches 2·255·127 = 64,770
//! and would saturate at 32,767. So the codes multiplied are never above 63:
//!
//! - a weight whose codes are all ≤ 63 ([`PackedWeight::code_max`] says, from the codes: 4-bit
//!   nibbles, Q5's 5-bit and Q6_K's 6-bit codes) multiplies them as they are;
//! - any other splits each code `q = 16·h + l` (`h = q >> 4`, `l = q & 15`, both ≤ 15) and sums
//!   `16·Σ h·c + Σ l·c`.
//!
//! A pair is then at most 2·63·128 = 16,128 in magnitude (no saturation). Each 16-bit lane sums
//! the products of a few steps, two a step, and is widened into 32 bits (`vpmaddwd` against
//! ones, sixteens for `h`) before it can wrap: codes ≤ 15 over a part's up to 8 steps (16·15·128
//! = 30,720 < 32,767), codes ≤ 31 over 4 steps (8·31·128 = 31,744) and codes ≤ 63 over 2 (4·63·128
//! = 32,256). The 32-bit sum of a block (or half block, for a weight with a scale per 16 inputs)
//! is exact, |Σ q·c| ≤ 32·255·128 < 2^21, so `256·coarse + fine` (the coarse lanes widened
//! against 256s) fits 32 bits too. Exact integer sums in any order are the portable copy's
//! sums; the float part below is its operations in its order (`vfmadd` is `mul_add`, and a
//! weight with two parts a block takes half 0's two terms, then half 1's), so every output has
//! its bits (`copies_tests.rs` checks it with codes 255, 63 and 31 against activations ±127, one
//! scale a block or two).
//!
//! `vpdpbusd` (AVX-VNNI) sums four products into 32 bits without saturation: exact as it is.

use core::arch::x86_64::*;

use super::activations::{block_sums, ROUND};
use super::{OutPtr, PackedWeight, Precision, QuantizedRows, Tile, BLOCK, PAIR, PANEL, ROWS, STEP};

/// Outputs of a panel in one register of 32-bit sums.
const HALF: usize = PANEL / 2;

/// Codes up to this multiply unsplit on AVX2 (see the module's proof).
const UNSPLIT_MAX: u8 = 63;

/// How often a weight's 16-bit sums are widened to 32 bits, in pairs of steps: as rarely as its
/// largest code allows (four products of a pair of steps a lane, `4 · W · code_max · 128 ≤
/// 32,767`; the module's proof). A part has at most four pairs, so 4 is "once a part".
fn widen_every(code_max: u8) -> usize {
    match code_max {
        0..=15 => 4,
        16..=31 => 2,
        _ => 1,
    }
}

/// One tile on AVX2: for each half panel, rows a few at a time.
///
/// # Safety
/// The CPU has AVX2 and FMA; `out` as [`super::panels_product`] says.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn tile(x: &QuantizedRows, w: &PackedWeight, t: Tile, out: OutPtr) {
    let fine = x.precision == Precision::Fine;
    // Nibble codes are at most 15 (never split, widened once a part), and this says so where
    // the match below reads the layout.
    let split = !w.nibbles && w.code_max > UNSPLIT_MAX;
    let widen = if w.nibbles {
        4
    } else {
        widen_every(w.code_max)
    };
    // Split fine codes hold four sums a row: two rows keep them in registers.
    let chunk = if fine && split { 2 } else { 4 };
    for half in 0..t.cols.div_ceil(HALF) {
        let mut first = 0;
        while first < t.rows {
            let n = (t.rows - first).min(chunk);
            let p = Pass { half, first, n };
            // SAFETY: passed on from the caller; the pass is inside the tile.
            unsafe {
                match (fine, split, w.parts == 1, w.nibbles) {
                    (true, true, true, _) => by_rows::<true, true, 4, 1, false>(x, w, t, p, out),
                    (false, true, true, _) => by_rows::<false, true, 4, 1, false>(x, w, t, p, out),
                    (true, true, false, _) => by_rows::<true, true, 4, 2, false>(x, w, t, p, out),
                    (false, true, false, _) => by_rows::<false, true, 4, 2, false>(x, w, t, p, out),
                    (true, false, true, true) => {
                        by_rows::<true, false, 4, 1, true>(x, w, t, p, out)
                    }
                    (false, false, true, true) => {
                        by_rows::<false, false, 4, 1, true>(x, w, t, p, out)
                    }
                    (true, false, false, true) => {
                        by_rows::<true, false, 4, 2, true>(x, w, t, p, out)
                    }
                    (false, false, false, true) => {
                        by_rows::<false, false, 4, 2, true>(x, w, t, p, out)
                    }
                    (fine, false, one, false) => unsplit_bytes(fine, one, widen, x, w, t, p, out),
                }
            }
            first += n;
        }
    }
}

/// A pass over byte codes ≤ [`UNSPLIT_MAX`], widened every `widen` pairs of steps.
///
/// # Safety
/// As [`tile`]'s, and the weight's codes are at most [`UNSPLIT_MAX`] and `widen` is
/// [`widen_every`]'s for them.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)] // The layout's four choices, matched once.
unsafe fn unsplit_bytes(
    fine: bool,
    one_part: bool,
    widen: usize,
    x: &QuantizedRows,
    w: &PackedWeight,
    t: Tile,
    p: Pass,
    out: OutPtr,
) {
    // SAFETY: passed on from the caller.
    unsafe {
        match (fine, one_part, widen) {
            (true, true, 4) => by_rows::<true, false, 4, 1, false>(x, w, t, p, out),
            (true, true, 2) => by_rows::<true, false, 2, 1, false>(x, w, t, p, out),
            (true, true, _) => by_rows::<true, false, 1, 1, false>(x, w, t, p, out),
            (true, false, 4) => by_rows::<true, false, 4, 2, false>(x, w, t, p, out),
            (true, false, 2) => by_rows::<true, false, 2, 2, false>(x, w, t, p, out),
            (true, false, _) => by_rows::<true, false, 1, 2, false>(x, w, t, p, out),
            (false, true, 4) => by_rows::<false, false, 4, 1, false>(x, w, t, p, out),
            (false, true, 2) => by_rows::<false, false, 2, 1, false>(x, w, t, p, out),
            (false, true, _) => by_rows::<false, false, 1, 1, false>(x, w, t, p, out),
            (false, false, 4) => by_rows::<false, false, 4, 2, false>(x, w, t, p, out),
            (false, false, 2) => by_rows::<false, false, 2, 2, false>(x, w, t, p, out),
            (false, false, _) => by_rows::<false, false, 1, 2, false>(x, w, t, p, out),
        }
    }
}

/// Rows `first..first + n` of a tile against half `half` of its panel.
#[derive(Clone, Copy)]
struct Pass {
    half: usize,
    first: usize,
    n: usize,
}

#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn by_rows<
    const FINE: bool,
    const SPLIT: bool,
    const WIDEN: usize,
    const PARTS: usize,
    const NIBBLES: bool,
>(
    x: &QuantizedRows,
    w: &PackedWeight,
    t: Tile,
    p: Pass,
    out: OutPtr,
) {
    // SAFETY: passed on from the caller.
    unsafe {
        match p.n {
            4 => rows::<4, FINE, SPLIT, WIDEN, PARTS, NIBBLES>(x, w, t, p, out),
            3 => rows::<3, FINE, SPLIT, WIDEN, PARTS, NIBBLES>(x, w, t, p, out),
            2 => rows::<2, FINE, SPLIT, WIDEN, PARTS, NIBBLES>(x, w, t, p, out),
            _ => rows::<1, FINE, SPLIT, WIDEN, PARTS, NIBBLES>(x, w, t, p, out),
        }
    }
}

/// A half panel's 32-byte operands of the pair of steps at input `k` (a multiple of
/// [`PAIR`]): two loads of byte codes, or one of nibbles split into the same two registers
/// (`v & 15` the first step's, `(v >> 4) & 15` the second's; `quant/mod.rs`, "The packed
/// weight").
///
/// # Safety
/// `codes` is a half panel's first code; the pair is inside the panel's codes.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn pair<const NIBBLES: bool>(codes: *const u8, k: usize) -> [__m256i; 2] {
    // SAFETY: the caller's contract: a half pair is 32 bytes of nibbles, or 32 bytes of each
    // step's bytes.
    unsafe {
        if NIBBLES {
            let v = _mm256_loadu_si256(codes.add(k / PAIR * PANEL * STEP).cast());
            let low = _mm256_set1_epi8(0x0F);
            [
                _mm256_and_si256(v, low),
                _mm256_and_si256(_mm256_srli_epi16::<4>(v), low),
            ]
        } else {
            [
                _mm256_loadu_si256(codes.add(k * PANEL).cast()),
                _mm256_loadu_si256(codes.add((k + STEP) * PANEL).cast()),
            ]
        }
    }
}

/// A row's 16-bit lanes widened to 32 bits and weighed by `unit`: `unit · Σ l`, or `unit ·
/// (16·Σ h + Σ l)` where split (`unit` 256 for coarse codes beside fine ones, else 1: `256 ·
/// coarse + fine` is the 16-bit activations' sum, and fits 32 bits, the module's proof).
#[target_feature(enable = "avx2,fma")]
#[inline]
fn widened<const SPLIT: bool>(l: __m256i, h: __m256i, unit: i16) -> __m256i {
    let low = _mm256_madd_epi16(l, _mm256_set1_epi16(unit));
    if SPLIT {
        _mm256_add_epi32(_mm256_madd_epi16(h, _mm256_set1_epi16(16 * unit)), low)
    } else {
        low
    }
}

#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn rows<
    const R: usize,
    const FINE: bool,
    const SPLIT: bool,
    const WIDEN: usize,
    const PARTS: usize,
    const NIBBLES: bool,
>(
    x: &QuantizedRows,
    w: &PackedWeight,
    t: Tile,
    p: Pass,
    out: OutPtr,
) {
    const { assert!(R <= ROWS) };
    const { assert!(WIDEN == 1 || WIDEN == 2 || WIDEN == 4) };
    let blocks = x.input / BLOCK;
    // The coarse codes' weight in a row's 32-bit sum.
    let coarse_unit: i16 = if FINE { 256 } else { 1 };
    // SAFETY: every offset below stays inside the panel's codes, scales and biases (the
    // panel is `PANEL · input` codes, bytes or nibbles, and `blocks · PARTS · PANEL` scales,
    // and biases unless implicit; `PARTS` and `NIBBLES` the weight's, passed by `tile`; a
    // half is the first or last 8 rows of each 16, the first or last 32 bytes of each 64)
    // and inside rows `first_row + first..+ R` of `x` (inside the tile).
    unsafe {
        let codes = w
            .codes
            .as_ptr()
            .add(t.panel * w.panel_bytes() + p.half * HALF * STEP);
        let scales = t.scales.add(p.half * HALF);
        let biases = t.biases.add(p.half * HALF);
        let slot = x.slot();
        let a = x.tiled.as_ptr().add(t.first_row / ROWS * x.group_bytes());
        let rows = Rows::new::<PARTS>(x, t.first_row + p.first);
        let nibble = _mm256_set1_epi8(0x0F);
        let zero = _mm256_setzero_si256();
        let mut acc = [_mm256_setzero_ps(); R];
        // Steps of 4 inputs per part (a part: the inputs one scale covers, 32 or 16).
        let steps = BLOCK / STEP / PARTS;
        let pairs = steps / 2;
        for j in 0..blocks {
            for h in 0..PARTS {
                // Each row's exact 32-bit sum of the part, and the 16-bit sums since the last
                // widening: of the low (or only) and high nibbles, coarse and fine codes.
                let mut dot = [zero; R];
                let (mut lo, mut hi) = ([zero; R], [zero; R]);
                let (mut fine_lo, mut fine_hi) = ([zero; R], [zero; R]);
                for s in 0..pairs {
                    let pair_at = j * BLOCK + (h * steps + 2 * s) * STEP;
                    for (d, wv) in pair::<NIBBLES>(codes, pair_at).into_iter().enumerate() {
                        let k = pair_at + d * STEP;
                        // A byte code split in two where it must be (`q = 16·h + l`).
                        let (wl, wh) = if SPLIT {
                            (
                                _mm256_and_si256(wv, nibble),
                                _mm256_and_si256(_mm256_srli_epi16::<4>(wv), nibble),
                            )
                        } else {
                            (wv, zero)
                        };
                        for i in 0..R {
                            let at = a.add((k / STEP * ROWS + p.first + i) * slot);
                            let c = _mm256_set1_epi32(at.cast::<i32>().read_unaligned());
                            lo[i] = _mm256_add_epi16(lo[i], _mm256_maddubs_epi16(wl, c));
                            if SPLIT {
                                hi[i] = _mm256_add_epi16(hi[i], _mm256_maddubs_epi16(wh, c));
                            }
                            if FINE {
                                let f = at.add(STEP).cast::<i32>().read_unaligned();
                                let f = _mm256_set1_epi32(f);
                                let fl = _mm256_maddubs_epi16(wl, f);
                                fine_lo[i] = _mm256_add_epi16(fine_lo[i], fl);
                                if SPLIT {
                                    let fh = _mm256_maddubs_epi16(wh, f);
                                    fine_hi[i] = _mm256_add_epi16(fine_hi[i], fh);
                                }
                            }
                        }
                    }
                    if (s + 1) % WIDEN == 0 || s + 1 == pairs {
                        for i in 0..R {
                            let mut sum = widened::<SPLIT>(lo[i], hi[i], coarse_unit);
                            if FINE {
                                let fine = widened::<SPLIT>(fine_lo[i], fine_hi[i], 1);
                                sum = _mm256_add_epi32(sum, fine);
                            }
                            dot[i] = _mm256_add_epi32(dot[i], sum);
                            (lo[i], hi[i], fine_lo[i], fine_hi[i]) = (zero, zero, zero, zero);
                        }
                    }
                }
                let part = (j * PARTS + h) * PANEL;
                let sw = _mm256_loadu_ps(scales.add(part));
                let bw = _mm256_loadu_ps(biases.add(part));
                for i in 0..R {
                    let (step, sum) = rows.terms::<PARTS>(i, j, h);
                    accumulate(&mut acc[i], dot[i], sw, bw, step, sum);
                }
            }
        }
        store(&acc, t, p, w.out, out);
    }
}

/// A pass's rows of activation steps and quantised sums (per block, or per half block where
/// the weight has two parts a block).
#[derive(Clone, Copy)]
struct Rows {
    steps: *const f32,
    sums: *const f32,
    blocks: usize,
}

impl Rows {
    /// From row `first` of `x` on; `PARTS` the weight's.
    ///
    /// # Safety
    /// Row `first` is one of `x`'s.
    #[inline(always)]
    unsafe fn new<const PARTS: usize>(x: &QuantizedRows, first: usize) -> Self {
        let blocks = x.input / BLOCK;
        // SAFETY: row `first` starts inside each of the three arrays.
        unsafe {
            Rows {
                steps: x.steps.as_ptr().add(first * blocks),
                sums: if PARTS == 1 {
                    x.sums.as_ptr().add(first * blocks)
                } else {
                    x.half_sums.as_ptr().add(first * blocks * 2)
                },
                blocks,
            }
        }
    }

    /// Row `i`'s step of block `j` and the quantised sum of its part `h`, as the portable copy
    /// reads them.
    ///
    /// # Safety
    /// Row `i` of the pass is one of `x`'s, `j` one of its blocks, `h < PARTS`.
    #[inline(always)]
    unsafe fn terms<const PARTS: usize>(self, i: usize, j: usize, h: usize) -> (f32, f32) {
        let at = i * self.blocks + j;
        // SAFETY: the caller's contract.
        unsafe { (*self.steps.add(at), *self.sums.add(at * PARTS + h)) }
    }
}

/// `acc += dot · (sw · step) ; acc += bw · sum`, as the portable copy does.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn accumulate(acc: &mut __m256, dot: __m256i, sw: __m256, bw: __m256, step: f32, sum: f32) {
    let s = _mm256_mul_ps(sw, _mm256_set1_ps(step));
    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), s, *acc);
    *acc = _mm256_fmadd_ps(bw, _mm256_set1_ps(sum), *acc);
}

/// The pass's rows of sums into `out`, only the columns inside `w.out`.
///
/// # Safety
/// As [`super::panels_product`] says of `out`.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn store<const R: usize>(acc: &[__m256; R], t: Tile, p: Pass, width: usize, out: OutPtr) {
    let cols = (t.cols - p.half * HALF).min(HALF);
    let mask = _mm256_cmpgt_epi32(
        _mm256_set1_epi32(cols as i32),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
    );
    for (i, value) in acc.iter().enumerate() {
        let at = (t.first_row + p.first + i) * width + t.panel * PANEL + p.half * HALF;
        // SAFETY: row and columns inside `[rows, out]`: the caller's contract.
        unsafe {
            if cols == HALF {
                _mm256_storeu_ps(out.0.add(at), *value);
            } else {
                _mm256_maskstore_ps(out.0.add(at), mask, *value);
            }
        }
    }
}

/// One tile on AVX-VNNI: the AVX2 copy's passes with `vpdpbusd` for the byte products.
///
/// # Safety
/// The CPU has AVX-VNNI, AVX2 and FMA; `out` as [`super::panels_product`] says.
#[target_feature(enable = "avx2,fma,avxvnni")]
pub(super) unsafe fn tile_vnni(x: &QuantizedRows, w: &PackedWeight, t: Tile, out: OutPtr) {
    let fine = x.precision == Precision::Fine;
    for half in 0..t.cols.div_ceil(HALF) {
        let mut first = 0;
        while first < t.rows {
            let n = (t.rows - first).min(4);
            let p = Pass { half, first, n };
            // SAFETY: passed on from the caller; the pass is inside the tile.
            unsafe {
                match (fine, w.parts, w.nibbles) {
                    (true, 1, false) => by_rows_vnni::<true, 1, false>(x, w, t, p, out),
                    (false, 1, false) => by_rows_vnni::<false, 1, false>(x, w, t, p, out),
                    (true, _, false) => by_rows_vnni::<true, 2, false>(x, w, t, p, out),
                    (false, _, false) => by_rows_vnni::<false, 2, false>(x, w, t, p, out),
                    (true, 1, true) => by_rows_vnni::<true, 1, true>(x, w, t, p, out),
                    (false, 1, true) => by_rows_vnni::<false, 1, true>(x, w, t, p, out),
                    (true, _, true) => by_rows_vnni::<true, 2, true>(x, w, t, p, out),
                    (false, _, true) => by_rows_vnni::<false, 2, true>(x, w, t, p, out),
                }
            }
            first += n;
        }
    }
}

#[target_feature(enable = "avx2,fma,avxvnni")]
#[inline]
unsafe fn by_rows_vnni<const FINE: bool, const PARTS: usize, const NIBBLES: bool>(
    x: &QuantizedRows,
    w: &PackedWeight,
    t: Tile,
    p: Pass,
    out: OutPtr,
) {
    // SAFETY: passed on from the caller.
    unsafe {
        match p.n {
            4 => rows_vnni::<4, FINE, PARTS, NIBBLES>(x, w, t, p, out),
            3 => rows_vnni::<3, FINE, PARTS, NIBBLES>(x, w, t, p, out),
            2 => rows_vnni::<2, FINE, PARTS, NIBBLES>(x, w, t, p, out),
            _ => rows_vnni::<1, FINE, PARTS, NIBBLES>(x, w, t, p, out),
        }
    }
}

#[target_feature(enable = "avx2,fma,avxvnni")]
#[inline]
unsafe fn rows_vnni<const R: usize, const FINE: bool, const PARTS: usize, const NIBBLES: bool>(
    x: &QuantizedRows,
    w: &PackedWeight,
    t: Tile,
    p: Pass,
    out: OutPtr,
) {
    const { assert!(R <= ROWS) };
    let blocks = x.input / BLOCK;
    // SAFETY: the offsets of the AVX2 copy's `rows`, which stay inside the tile.
    unsafe {
        let codes = w
            .codes
            .as_ptr()
            .add(t.panel * w.panel_bytes() + p.half * HALF * STEP);
        let scales = t.scales.add(p.half * HALF);
        let biases = t.biases.add(p.half * HALF);
        let slot = x.slot();
        let a = x.tiled.as_ptr().add(t.first_row / ROWS * x.group_bytes());
        let rows = Rows::new::<PARTS>(x, t.first_row + p.first);
        let mut acc = [_mm256_setzero_ps(); R];
        let steps = BLOCK / STEP / PARTS;
        for j in 0..blocks {
            for h in 0..PARTS {
                // Two independent chains a row, as in the AVX-512 copy: coarse and fine codes'
                // where fine, even and odd steps' where not.
                let mut first = [_mm256_setzero_si256(); R];
                let mut second = [_mm256_setzero_si256(); R];
                for s in (0..steps).step_by(2) {
                    let pair_at = j * BLOCK + (h * steps + s) * STEP;
                    for (d, wv) in pair::<NIBBLES>(codes, pair_at).into_iter().enumerate() {
                        let k = pair_at + d * STEP;
                        for i in 0..R {
                            let at = a.add((k / STEP * ROWS + p.first + i) * slot);
                            let c = _mm256_set1_epi32(at.cast::<i32>().read_unaligned());
                            if FINE {
                                first[i] = _mm256_dpbusd_avx_epi32(first[i], wv, c);
                                let f = at.add(STEP).cast::<i32>().read_unaligned();
                                let f = _mm256_set1_epi32(f);
                                second[i] = _mm256_dpbusd_avx_epi32(second[i], wv, f);
                            } else if d == 0 {
                                first[i] = _mm256_dpbusd_avx_epi32(first[i], wv, c);
                            } else {
                                second[i] = _mm256_dpbusd_avx_epi32(second[i], wv, c);
                            }
                        }
                    }
                }
                let part = (j * PARTS + h) * PANEL;
                let sw = _mm256_loadu_ps(scales.add(part));
                let bw = _mm256_loadu_ps(biases.add(part));
                for i in 0..R {
                    let high = if FINE {
                        _mm256_slli_epi32::<8>(first[i])
                    } else {
                        first[i]
                    };
                    let dot = _mm256_add_epi32(high, second[i]);
                    let (step, sum) = rows.terms::<PARTS>(i, j, h);
                    accumulate(&mut acc[i], dot, sw, bw, step, sum);
                }
            }
        }
        store(&acc, t, p, w.out, out);
    }
}

/// [`super::activations::quantize_block`] on AVX2: the same operations on 8 values at a time
/// (multiplies and adds kept apart, as in the portable copy), so the same bits.
///
/// # Safety
/// The CPU has AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn quantize_block(
    values: &[f32; BLOCK],
    codes: &mut [i8; BLOCK],
    fine: Option<&mut [i8; BLOCK]>,
) -> (f32, f32) {
    // SAFETY: every load and store is inside the 32-value arrays (four quarters of 8).
    unsafe {
        let v = [0, 8, 16, 24].map(|at| _mm256_loadu_ps(values.as_ptr().add(at)));
        let magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
        let abs = v.map(|q| _mm256_and_ps(q, magnitude));
        // The largest magnitude: `max` is exact, so its order does not matter.
        let m = _mm256_max_ps(_mm256_max_ps(abs[0], abs[1]), _mm256_max_ps(abs[2], abs[3]));
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let m = _mm_max_ss(m, _mm_shuffle_ps::<1>(m, m));
        let largest = _mm_cvtss_f32(m).max(0.0);
        let d = largest / 127.0;
        let inverse = if d > 0.0 { 1.0 / d } else { 0.0 };
        let round = |r: __m256| {
            let r = _mm256_sub_ps(
                _mm256_add_ps(r, _mm256_set1_ps(ROUND)),
                _mm256_set1_ps(ROUND),
            );
            _mm256_min_ps(
                _mm256_max_ps(r, _mm256_set1_ps(-127.0)),
                _mm256_set1_ps(127.0),
            )
        };
        let rounded = v.map(|q| round(_mm256_mul_ps(q, _mm256_set1_ps(inverse))));
        let ints = rounded.map(|r| _mm256_cvtps_epi32(r));
        store_codes(&ints, codes);
        let coarse_sum = sum_i32(&ints);
        let fine_sum = fine.map(|fine| {
            let fine_inverse = _mm256_set1_ps(inverse * 256.0);
            let mut fine_ints = [_mm256_setzero_si256(); 4];
            for q in 0..4 {
                let error = _mm256_sub_ps(v[q], _mm256_mul_ps(_mm256_set1_ps(d), rounded[q]));
                fine_ints[q] = _mm256_cvtps_epi32(round(_mm256_mul_ps(error, fine_inverse)));
            }
            store_codes(&fine_ints, fine);
            sum_i32(&fine_ints)
        });
        block_sums(d, coarse_sum, fine_sum)
    }
}

/// 32 integers in −127..=127 as bytes, in order (the packs saturate, which values in range
/// never reach; the permute undoes their lane interleaving).
#[target_feature(enable = "avx2")]
#[inline]
fn store_codes(ints: &[__m256i; 4], codes: &mut [i8; BLOCK]) {
    let low = _mm256_packs_epi32(ints[0], ints[1]);
    let high = _mm256_packs_epi32(ints[2], ints[3]);
    let bytes = _mm256_packs_epi16(low, high);
    let ordered = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    // SAFETY: 32 bytes into a 32-byte array.
    unsafe { _mm256_storeu_si256(codes.as_mut_ptr().cast(), ordered) };
}

/// The exact sum of 32 small integers (their order does not matter).
#[target_feature(enable = "avx2")]
#[inline]
fn sum_i32(ints: &[__m256i; 4]) -> i32 {
    let s = _mm256_add_epi32(
        _mm256_add_epi32(ints[0], ints[1]),
        _mm256_add_epi32(ints[2], ints[3]),
    );
    let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}
