//! The aarch64 copies of the integer kernel: plain NEON, the dot-product extension (`sdot`) and
//! the int8 matrix extension (`usdot`); and the activations' quantisation on NEON. A panel's
//! step (16 rows × 4 codes) is four 128-bit registers of 4 rows each (from nibble codes, the
//! same four registers of a pair of steps give both steps' registers, by `& 15` and `>> 4`); a
//! tile runs one or two of its rows at a time against the whole panel.
//!
//! **Why the sums are exact** (the portable copy's bits follow as on x86, `avx2.rs`):
//!
//! - NEON: codes widened to 16 bits multiply the activations' codes widened likewise, each
//!   product |q·c| ≤ 255·128 = 32,640 < 32,767 exact in 16 bits; `sadalp` adds pairs of them
//!   into 32-bit lanes, and `addp` a row's two lanes: exact.
//! - dotprod: `sdot` multiplies *signed* bytes into 32-bit sums, exactly. Codes up to 127 are
//!   the same as signed bytes; larger ones (8-bit weights) go in as `q − 128` (the top bit
//!   flipped) and the block gets `128 · Σ c` back, `Σ c` from one more `sdot` against ones
//!   (per half, over the half's codes, where the weight has a scale per 16 inputs).
//! - i8mm: `usdot` multiplies unsigned by signed bytes, like `vpdpbusd`: exact as it is.
//!
//! The intrinsics of `sdot` and `usdot` are not stable Rust yet, so those two instructions are
//! written as inline assembly inside functions compiled with the extension enabled.

use core::arch::aarch64::*;
use core::arch::asm;

use super::activations::{block_sums, ROUND};
use super::{OutPtr, PackedWeight, Precision, QuantizedRows, Tile, BLOCK, PAIR, PANEL, ROWS, STEP};

/// Rows of a panel in one 128-bit register of sums.
const QUARTER: usize = 4;

/// A block's exact integer sums for the rows of one pass: per row, the panel's 16 outputs in
/// four registers of 4 (`256 · coarse + fine` where fine).
type Dots<const R: usize> = [[int32x4_t; 4]; R];

/// Where a block's codes are: the panel's codes, the tile's group of activation codes, the
/// bytes a row's codes take per step, the pass's first row in the group.
#[derive(Clone, Copy)]
struct Codes {
    w: *const u8,
    a: *const i8,
    slot: usize,
    first: usize,
}

impl Codes {
    /// The four registers of each step of the pair at input `k` (a multiple of [`PAIR`]):
    /// loaded from byte codes, or from one step's bytes of nibbles split in two (`v & 15` the
    /// first step's, `v >> 4` the second's; `quant/mod.rs`, "The packed weight").
    ///
    /// # Safety
    /// `k` is a pair inside the panel's inputs; `NIBBLES` is the weight's layout.
    #[inline(always)]
    unsafe fn pair<const NIBBLES: bool>(self, k: usize) -> [[uint8x16_t; 4]; 2] {
        // SAFETY: the panel holds `PANEL · input` codes, a pair of steps 128 of them (64 bytes
        // of nibbles, or 128 of bytes).
        unsafe {
            if NIBBLES {
                let at = self.w.add(k / PAIR * PANEL * STEP);
                let v = [0, 1, 2, 3].map(|g| vld1q_u8(at.add(16 * g)));
                let low = vdupq_n_u8(0x0F);
                [v.map(|v| vandq_u8(v, low)), v.map(|v| vshrq_n_u8::<4>(v))]
            } else {
                let step =
                    |k: usize| [0, 1, 2, 3].map(|g| vld1q_u8(self.w.add(k * PANEL + 16 * g)));
                [step(k), step(k + STEP)]
            }
        }
    }

    /// Row `i` of the pass's 4 codes at step `k` (its fine ones `STEP` bytes on), repeated in
    /// every 32-bit lane.
    ///
    /// # Safety
    /// Row `first + i` and step `k` are inside the group; `fine` only at [`Precision::Fine`].
    #[inline(always)]
    unsafe fn activation(self, k: usize, i: usize, fine: bool) -> int8x16_t {
        // SAFETY: the caller's contract; codes need not be aligned (read_unaligned).
        unsafe {
            let at = self
                .a
                .add((k / STEP * ROWS + self.first + i) * self.slot + if fine { STEP } else { 0 });
            vreinterpretq_s8_s32(vdupq_n_s32(at.cast::<i32>().read_unaligned()))
        }
    }
}

/// The first input of step `s` of part `h` (of `PARTS`) of block `j` (`s` even: a pair's).
#[inline(always)]
fn part_input<const PARTS: usize>(j: usize, h: usize, s: usize) -> usize {
    j * BLOCK + (h * (BLOCK / STEP / PARTS) + s) * STEP
}

/// `acc += Σ_4 a·b` per 32-bit lane, signed bytes (`sdot`).
#[target_feature(enable = "neon,dotprod")]
#[inline]
fn sdot(mut acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    // SAFETY: registers only; the function is compiled with the dot-product extension.
    unsafe {
        asm!(
            "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    acc
}

/// `acc += Σ_4 a·b` per 32-bit lane, `a` unsigned and `b` signed bytes (`usdot`).
#[target_feature(enable = "neon,i8mm")]
#[inline]
fn usdot(mut acc: int32x4_t, a: uint8x16_t, b: int8x16_t) -> int32x4_t {
    // SAFETY: registers only; the function is compiled with the int8 matrix extension.
    unsafe {
        asm!(
            "usdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    acc
}

/// Block `j`'s (part `h`'s) sums on plain NEON (products widened to 16 bits).
///
/// # Safety
/// As [`Codes`] says, for the pass's rows and block `j`.
#[target_feature(enable = "neon")]
#[inline]
unsafe fn dots_neon<const R: usize, const FINE: bool, const PARTS: usize, const NIBBLES: bool>(
    c: Codes,
    j: usize,
    h: usize,
    _wide: bool,
) -> Dots<R> {
    let zero = vdupq_n_s32(0);
    // Per row, per half register: rows (2h, 2h + 1)'s pairs of products, two lanes a row.
    let mut coarse = [[zero; 8]; R];
    let mut finer = [[zero; 8]; R];
    // SAFETY: passed on from the caller.
    unsafe {
        for s in (0..BLOCK / STEP / PARTS).step_by(2) {
            let pair_at = part_input::<PARTS>(j, h, s);
            for (d, wv) in c.pair::<NIBBLES>(pair_at).into_iter().enumerate() {
                let k = pair_at + d * STEP;
                let mut w16 = [vdupq_n_s16(0); 8];
                for g in 0..4 {
                    w16[2 * g] = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(wv[g])));
                    w16[2 * g + 1] = vreinterpretq_s16_u16(vmovl_high_u8(wv[g]));
                }
                for i in 0..R {
                    let a = vmovl_s8(vget_low_s8(c.activation(k, i, false)));
                    for h in 0..8 {
                        coarse[i][h] = vpadalq_s16(coarse[i][h], vmulq_s16(w16[h], a));
                    }
                    if FINE {
                        let f = vmovl_s8(vget_low_s8(c.activation(k, i, true)));
                        for h in 0..8 {
                            finer[i][h] = vpadalq_s16(finer[i][h], vmulq_s16(w16[h], f));
                        }
                    }
                }
            }
        }
    }
    let mut dots = [[zero; 4]; R];
    for i in 0..R {
        for g in 0..4 {
            let d = vpaddq_s32(coarse[i][2 * g], coarse[i][2 * g + 1]);
            dots[i][g] = if FINE {
                let f = vpaddq_s32(finer[i][2 * g], finer[i][2 * g + 1]);
                vaddq_s32(vshlq_n_s32::<8>(d), f)
            } else {
                d
            };
        }
    }
    dots
}

/// Block `j`'s (part `h`'s) sums with `sdot` (codes above 127 offset by −128, and corrected).
///
/// # Safety
/// As [`Codes`] says, for the pass's rows and block `j`.
#[target_feature(enable = "neon,dotprod")]
#[inline]
unsafe fn dots_dotprod<
    const R: usize,
    const FINE: bool,
    const PARTS: usize,
    const NIBBLES: bool,
>(
    c: Codes,
    j: usize,
    h: usize,
    wide: bool,
) -> Dots<R> {
    let zero = vdupq_n_s32(0);
    let mut coarse = [[zero; 4]; R];
    let mut finer = [[zero; 4]; R];
    // Where wide, Σ c (and Σ fine) of the block's (part's) codes in every lane.
    let mut sums = [zero; R];
    let mut fine_sums = [zero; R];
    let flip = vdupq_n_u8(0x80);
    let ones = vdupq_n_s8(1);
    // SAFETY: passed on from the caller.
    unsafe {
        for s in (0..BLOCK / STEP / PARTS).step_by(2) {
            let pair_at = part_input::<PARTS>(j, h, s);
            for (d, wv) in c.pair::<NIBBLES>(pair_at).into_iter().enumerate() {
                let k = pair_at + d * STEP;
                let wv = wv.map(|w| vreinterpretq_s8_u8(if wide { veorq_u8(w, flip) } else { w }));
                for i in 0..R {
                    let a = c.activation(k, i, false);
                    for g in 0..4 {
                        coarse[i][g] = sdot(coarse[i][g], wv[g], a);
                    }
                    if wide {
                        sums[i] = sdot(sums[i], ones, a);
                    }
                    if FINE {
                        let f = c.activation(k, i, true);
                        for g in 0..4 {
                            finer[i][g] = sdot(finer[i][g], wv[g], f);
                        }
                        if wide {
                            fine_sums[i] = sdot(fine_sums[i], ones, f);
                        }
                    }
                }
            }
        }
    }
    let mut dots = [[zero; 4]; R];
    for i in 0..R {
        // Σ q·c = Σ (q − 128)·c + 128·Σ c (zero where not wide).
        let back = vshlq_n_s32::<7>(sums[i]);
        let fine_back = vshlq_n_s32::<7>(fine_sums[i]);
        for g in 0..4 {
            let d = vaddq_s32(coarse[i][g], back);
            dots[i][g] = if FINE {
                let f = vaddq_s32(finer[i][g], fine_back);
                vaddq_s32(vshlq_n_s32::<8>(d), f)
            } else {
                d
            };
        }
    }
    dots
}

/// Block `j`'s (part `h`'s) sums with `usdot`.
///
/// # Safety
/// As [`Codes`] says, for the pass's rows and block `j`.
#[target_feature(enable = "neon,i8mm")]
#[inline]
unsafe fn dots_i8mm<const R: usize, const FINE: bool, const PARTS: usize, const NIBBLES: bool>(
    c: Codes,
    j: usize,
    h: usize,
    _wide: bool,
) -> Dots<R> {
    let zero = vdupq_n_s32(0);
    let mut coarse = [[zero; 4]; R];
    let mut finer = [[zero; 4]; R];
    // SAFETY: passed on from the caller.
    unsafe {
        for s in (0..BLOCK / STEP / PARTS).step_by(2) {
            let pair_at = part_input::<PARTS>(j, h, s);
            for (d, wv) in c.pair::<NIBBLES>(pair_at).into_iter().enumerate() {
                let k = pair_at + d * STEP;
                for i in 0..R {
                    let a = c.activation(k, i, false);
                    for g in 0..4 {
                        coarse[i][g] = usdot(coarse[i][g], wv[g], a);
                    }
                    if FINE {
                        let f = c.activation(k, i, true);
                        for g in 0..4 {
                            finer[i][g] = usdot(finer[i][g], wv[g], f);
                        }
                    }
                }
            }
        }
    }
    let mut dots = coarse;
    if FINE {
        for i in 0..R {
            for g in 0..4 {
                dots[i][g] = vaddq_s32(vshlq_n_s32::<8>(coarse[i][g]), finer[i][g]);
            }
        }
    }
    dots
}

/// `pub(super) unsafe fn $tile`: one tile, `$pass` rows at a time, each block's integer sums
/// (each half's, where the weight has a scale per 16 inputs) from `$dots`, then the portable
/// copy's float operations in its order.
macro_rules! tile_copy {
    ($(#[$doc:meta])* $tile:ident, $features:literal, $dots:ident, $pass:literal) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// The CPU has the copy's features; `out` as [`super::panels_product`] says.
        #[target_feature(enable = $features)]
        pub(super) unsafe fn $tile(x: &QuantizedRows, w: &PackedWeight, t: Tile, out: OutPtr) {
            #[target_feature(enable = $features)]
            #[inline]
            unsafe fn rows<const R: usize, const FINE: bool, const PARTS: usize, const NIBBLES: bool>(
                x: &QuantizedRows,
                w: &PackedWeight,
                t: Tile,
                first: usize,
                out: OutPtr,
            ) {
                let blocks = x.input / BLOCK;
                let wide = w.code_max > 127;
                // SAFETY: every offset stays inside the panel's codes, scales and biases (the
                // panel is `PANEL · input` codes, bytes or nibbles, and `blocks · PARTS ·
                // PANEL` scales, and biases unless implicit; `PARTS` and `NIBBLES` the
                // weight's) and inside rows `first_row + first..+ R` of `x` (inside the tile).
                unsafe {
                    let c = Codes {
                        w: w.codes.as_ptr().add(t.panel * w.panel_bytes()),
                        a: x.tiled.as_ptr().add(t.first_row / ROWS * x.group_bytes()),
                        slot: x.slot(),
                        first,
                    };
                    let (scales, biases) = (t.scales, t.biases);
                    let row = (t.first_row + first) * blocks;
                    // Each part's quantised sum: the block's, or its half's.
                    let sums = if PARTS == 1 {
                        x.sums.as_ptr().add(row)
                    } else {
                        x.half_sums.as_ptr().add(row * 2)
                    };
                    let mut acc = [[vdupq_n_f32(0.0); 4]; R];
                    for j in 0..blocks {
                        for h in 0..PARTS {
                            let dots = $dots::<R, FINE, PARTS, NIBBLES>(c, j, h, wide);
                            let part = (j * PARTS + h) * PANEL;
                            let sw = [0, 1, 2, 3].map(|g| vld1q_f32(scales.add(part + g * QUARTER)));
                            let bw = [0, 1, 2, 3].map(|g| vld1q_f32(biases.add(part + g * QUARTER)));
                            for i in 0..R {
                                let at = i * blocks + j;
                                let step = vdupq_n_f32(*x.steps.as_ptr().add(row + at));
                                let sum = vdupq_n_f32(*sums.add(at * PARTS + h));
                                for g in 0..4 {
                                    let (sw, bw) = (sw[g], bw[g]);
                                    let s = vmulq_f32(sw, step);
                                    let a = vfmaq_f32(acc[i][g], vcvtq_f32_s32(dots[i][g]), s);
                                    acc[i][g] = vfmaq_f32(a, bw, sum);
                                }
                            }
                        }
                    }
                    store(&acc, t, first, w.out, out);
                }
            }
            /// The tile's passes on the weight's layout (`NIBBLES`).
            #[target_feature(enable = $features)]
            #[inline]
            unsafe fn passes<const NIBBLES: bool>(
                x: &QuantizedRows,
                w: &PackedWeight,
                t: Tile,
                out: OutPtr,
            ) {
                let fine = x.precision == Precision::Fine;
                let halves = w.parts > 1;
                let mut first = 0;
                while first < t.rows {
                    let n = (t.rows - first).min($pass);
                    // SAFETY: passed on from the caller; the pass is inside the tile.
                    unsafe {
                        match (fine, halves, n) {
                            (true, false, 1) => rows::<1, true, 1, NIBBLES>(x, w, t, first, out),
                            (true, false, _) => {
                                rows::<$pass, true, 1, NIBBLES>(x, w, t, first, out)
                            }
                            (false, false, 1) => rows::<1, false, 1, NIBBLES>(x, w, t, first, out),
                            (false, false, _) => {
                                rows::<$pass, false, 1, NIBBLES>(x, w, t, first, out)
                            }
                            (true, true, 1) => rows::<1, true, 2, NIBBLES>(x, w, t, first, out),
                            (true, true, _) => rows::<$pass, true, 2, NIBBLES>(x, w, t, first, out),
                            (false, true, 1) => rows::<1, false, 2, NIBBLES>(x, w, t, first, out),
                            (false, true, _) => {
                                rows::<$pass, false, 2, NIBBLES>(x, w, t, first, out)
                            }
                        }
                    }
                    first += n;
                }
            }
            // SAFETY: passed on from the caller; `NIBBLES` is the weight's layout.
            unsafe {
                if w.nibbles {
                    passes::<true>(x, w, t, out)
                } else {
                    passes::<false>(x, w, t, out)
                }
            }
        }
    };
}

tile_copy!(
    /// One tile on plain NEON.
    tile, "neon", dots_neon, 1
);
tile_copy!(
    /// One tile with the dot-product extension.
    tile_dotprod, "neon,dotprod", dots_dotprod, 2
);
tile_copy!(
    /// One tile with the int8 matrix extension.
    tile_i8mm, "neon,i8mm", dots_i8mm, 2
);

/// A pass's rows of sums into `out`, only the columns inside `width`.
///
/// # Safety
/// As [`super::panels_product`] says of `out`.
#[target_feature(enable = "neon")]
#[inline]
unsafe fn store<const R: usize>(
    acc: &[[float32x4_t; 4]; R],
    t: Tile,
    first: usize,
    width: usize,
    out: OutPtr,
) {
    for (i, row) in acc.iter().enumerate() {
        let at = (t.first_row + first + i) * width + t.panel * PANEL;
        for (g, value) in row.iter().enumerate() {
            let from = g * QUARTER;
            // SAFETY: row and columns inside `[rows, out]`: the caller's contract.
            unsafe {
                if from + QUARTER <= t.cols {
                    vst1q_f32(out.0.add(at + from), *value);
                } else if from < t.cols {
                    let mut lanes = [0.0f32; QUARTER];
                    vst1q_f32(lanes.as_mut_ptr(), *value);
                    for (l, v) in lanes.iter().enumerate().take(t.cols - from) {
                        *out.0.add(at + from + l) = *v;
                    }
                }
            }
        }
    }
}

/// [`super::activations::quantize_block`] on NEON: the same operations on 4 values at a time
/// (multiplies and adds kept apart, as in the portable copy), so the same bits.
///
/// # Safety
/// The CPU has NEON.
#[target_feature(enable = "neon")]
pub(super) unsafe fn quantize_block(
    values: &[f32; BLOCK],
    codes: &mut [i8; BLOCK],
    fine: Option<&mut [i8; BLOCK]>,
) -> (f32, f32) {
    // SAFETY: every load and store is inside the 32-value arrays (eight quarters of 4).
    unsafe {
        let v: [float32x4_t; 8] = core::array::from_fn(|q| vld1q_f32(values.as_ptr().add(4 * q)));
        // The largest magnitude: `max` is exact, so its order does not matter.
        let m = v
            .iter()
            .fold(vdupq_n_f32(0.0), |m, q| vmaxq_f32(m, vabsq_f32(*q)));
        let largest = vmaxvq_f32(m).max(0.0);
        let d = largest / 127.0;
        let inverse = if d > 0.0 { 1.0 / d } else { 0.0 };
        let round = |r: float32x4_t| {
            let r = vsubq_f32(vaddq_f32(r, vdupq_n_f32(ROUND)), vdupq_n_f32(ROUND));
            vminq_f32(vmaxq_f32(r, vdupq_n_f32(-127.0)), vdupq_n_f32(127.0))
        };
        let rounded = v.map(|q| round(vmulq_f32(q, vdupq_n_f32(inverse))));
        // Whole numbers already: converting toward zero changes nothing.
        let ints = rounded.map(|r| vcvtq_s32_f32(r));
        store_codes(&ints, codes);
        let coarse_sum = sum_i32(&ints);
        let fine_sum = fine.map(|fine| {
            let fine_inverse = vdupq_n_f32(inverse * 256.0);
            let mut fine_ints = [vdupq_n_s32(0); 8];
            for q in 0..8 {
                let error = vsubq_f32(v[q], vmulq_f32(vdupq_n_f32(d), rounded[q]));
                fine_ints[q] = vcvtq_s32_f32(round(vmulq_f32(error, fine_inverse)));
            }
            store_codes(&fine_ints, fine);
            sum_i32(&fine_ints)
        });
        block_sums(d, coarse_sum, fine_sum)
    }
}

/// 32 integers in −127..=127 as bytes, in order (narrowing keeps every value in range).
#[target_feature(enable = "neon")]
#[inline]
fn store_codes(ints: &[int32x4_t; 8], codes: &mut [i8; BLOCK]) {
    for h in 0..2 {
        let narrow = |q: usize| vcombine_s16(vmovn_s32(ints[q]), vmovn_s32(ints[q + 1]));
        let low = narrow(4 * h);
        let high = narrow(4 * h + 2);
        let bytes = vcombine_s8(vmovn_s16(low), vmovn_s16(high));
        // SAFETY: 16 bytes at 0 or 16 of a 32-byte array.
        unsafe { vst1q_s8(codes.as_mut_ptr().add(16 * h), bytes) };
    }
}

/// The exact sum of 32 small integers (their order does not matter).
#[target_feature(enable = "neon")]
#[inline]
fn sum_i32(ints: &[int32x4_t; 8]) -> i32 {
    vaddvq_s32(ints.iter().fold(vdupq_n_s32(0), |s, q| vaddq_s32(s, *q)))
}
