//! The AVX-512 VNNI kernel (up to [`ROWS`] rows against one panel of 16 outputs) and the
//! activations' quantisation on AVX-512.

use core::arch::x86_64::*;

use super::activations::{block_sums, ROUND};
use super::{OutPtr, PackedWeight, Precision, QuantizedRows, Tile, BLOCK, PAIR, PANEL, ROWS, STEP};

/// One tile; the row count picks an instantiation whose sums all live in registers.
///
/// # Safety
/// The CPU has AVX-512 F, BW and VNNI; `out` as [`super::panels_product`] says.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn tile(x: &QuantizedRows, w: &PackedWeight, t: Tile, out: OutPtr) {
    // SAFETY: passed on from the caller.
    unsafe {
        match (x.precision == Precision::Fine, w.parts, w.nibbles) {
            (true, 1, false) => by_rows::<true, 1, false>(x, w, t, out),
            (false, 1, false) => by_rows::<false, 1, false>(x, w, t, out),
            (true, _, false) => by_rows::<true, 2, false>(x, w, t, out),
            (false, _, false) => by_rows::<false, 2, false>(x, w, t, out),
            (true, 1, true) => by_rows::<true, 1, true>(x, w, t, out),
            (false, 1, true) => by_rows::<false, 1, true>(x, w, t, out),
            (true, _, true) => by_rows::<true, 2, true>(x, w, t, out),
            (false, _, true) => by_rows::<false, 2, true>(x, w, t, out),
        }
    }
}

/// The 64-byte operands of the pair of steps at input `k` (a multiple of [`PAIR`]) of a
/// panel's codes: two loads of byte codes, or one of nibbles split into the same two
/// registers (`v & 15` the first step's, `(v >> 4) & 15` the second's; `quant/mod.rs`, "The
/// packed weight").
///
/// # Safety
/// The pair is inside the panel's codes.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
unsafe fn pair<const NIBBLES: bool>(codes: *const u8, k: usize) -> [__m512i; 2] {
    // SAFETY: the caller's contract: a pair is 64 bytes of nibbles or 128 of bytes.
    unsafe {
        if NIBBLES {
            let v = _mm512_loadu_si512(codes.add(k / PAIR * PANEL * STEP).cast());
            let low = _mm512_set1_epi8(0x0F);
            [
                _mm512_and_si512(v, low),
                _mm512_and_si512(_mm512_srli_epi16::<4>(v), low),
            ]
        } else {
            [
                _mm512_loadu_si512(codes.add(k * PANEL).cast()),
                _mm512_loadu_si512(codes.add((k + STEP) * PANEL).cast()),
            ]
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
unsafe fn by_rows<const FINE: bool, const PARTS: usize, const NIBBLES: bool>(
    x: &QuantizedRows,
    w: &PackedWeight,
    t: Tile,
    out: OutPtr,
) {
    // SAFETY: passed on from the caller.
    unsafe {
        match t.rows {
            8 => rows::<8, FINE, PARTS, NIBBLES>(x, w, t, out),
            7 => rows::<7, FINE, PARTS, NIBBLES>(x, w, t, out),
            6 => rows::<6, FINE, PARTS, NIBBLES>(x, w, t, out),
            5 => rows::<5, FINE, PARTS, NIBBLES>(x, w, t, out),
            4 => rows::<4, FINE, PARTS, NIBBLES>(x, w, t, out),
            3 => rows::<3, FINE, PARTS, NIBBLES>(x, w, t, out),
            2 => rows::<2, FINE, PARTS, NIBBLES>(x, w, t, out),
            _ => rows::<1, FINE, PARTS, NIBBLES>(x, w, t, out),
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
unsafe fn rows<const R: usize, const FINE: bool, const PARTS: usize, const NIBBLES: bool>(
    x: &QuantizedRows,
    w: &PackedWeight,
    t: Tile,
    out: OutPtr,
) {
    const { assert!(R <= ROWS) };
    let blocks = x.input / BLOCK;
    // SAFETY: every offset below stays inside the panel's codes, scales and biases (the
    // panel is `PANEL · input` codes, bytes or nibbles as `NIBBLES` says, and `blocks · PARTS
    // · PANEL` scales, and biases unless implicit; `PARTS` and `NIBBLES` are the weight's,
    // passed by `tile`) and inside rows `first_row..first_row + R` of `x` (R ≤ rows left,
    // checked by the caller).
    unsafe {
        let codes = w.codes.as_ptr().add(t.panel * w.panel_bytes());
        let (scales, biases) = (t.scales, t.biases);
        // The tile's group in the interleaved codes (tiles start at multiples of ROWS).
        let slot = x.slot();
        let a = x.tiled.as_ptr().add(t.first_row / ROWS * x.group_bytes());
        let a_steps = x.steps.as_ptr().add(t.first_row * blocks);
        let a_sums = x.sums.as_ptr().add(t.first_row * blocks);
        let a_halves = x.half_sums.as_ptr().add(t.first_row * blocks * 2);
        let mut acc = [_mm512_setzero_ps(); R];
        // Steps of 4 inputs per part (a part: the inputs one scale covers, 32 or 16).
        let steps = BLOCK / STEP / PARTS;
        for j in 0..blocks {
            for h in 0..PARTS {
                // Two independent chains of sums per row (a `vpdpbusd` waits for the one
                // before it on the same register): the coarse and fine codes' where fine, the
                // even and odd steps' where not. The weight load is shared.
                let mut first = [_mm512_setzero_si512(); R];
                let mut second = [_mm512_setzero_si512(); R];
                // The pair's two steps written out: the coarse path feeds one chain from each
                // (the even and odd steps', as before nibbles), the fine one both chains from
                // both.
                for pair_index in 0..steps / 2 {
                    let k = j * BLOCK + (h * steps + 2 * pair_index) * STEP;
                    let [w0, w1] = pair::<NIBBLES>(codes, k);
                    for i in 0..R {
                        let at0 = a.add((k / STEP * ROWS + i) * slot);
                        let at1 = a.add(((k / STEP + 1) * ROWS + i) * slot);
                        let c0 = _mm512_set1_epi32(at0.cast::<i32>().read_unaligned());
                        let c1 = _mm512_set1_epi32(at1.cast::<i32>().read_unaligned());
                        if FINE {
                            let f0 =
                                _mm512_set1_epi32(at0.add(STEP).cast::<i32>().read_unaligned());
                            let f1 =
                                _mm512_set1_epi32(at1.add(STEP).cast::<i32>().read_unaligned());
                            first[i] = _mm512_dpbusd_epi32(first[i], w0, c0);
                            second[i] = _mm512_dpbusd_epi32(second[i], w0, f0);
                            first[i] = _mm512_dpbusd_epi32(first[i], w1, c1);
                            second[i] = _mm512_dpbusd_epi32(second[i], w1, f1);
                        } else {
                            first[i] = _mm512_dpbusd_epi32(first[i], w0, c0);
                            second[i] = _mm512_dpbusd_epi32(second[i], w1, c1);
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
                let part = (j * PARTS + h) * PANEL;
                let sw = _mm512_loadu_ps(scales.add(part));
                let bw = _mm512_loadu_ps(biases.add(part));
                for i in 0..R {
                    let s = _mm512_mul_ps(sw, _mm512_set1_ps(*a_steps.add(i * blocks + j)));
                    acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots[i]), s, acc[i]);
                    let sum = if PARTS == 1 {
                        *a_sums.add(i * blocks + j)
                    } else {
                        *a_halves.add((i * blocks + j) * 2 + h)
                    };
                    acc[i] = _mm512_fmadd_ps(bw, _mm512_set1_ps(sum), acc[i]);
                }
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

/// [`super::activations::quantize_block`] on AVX-512: the same operations on 16 values at a
/// time (multiplies and adds kept apart, as in the portable copy), so the same bits.
///
/// # Safety
/// The CPU has AVX-512 F and BW.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn quantize_block(
    values: &[f32; BLOCK],
    codes: &mut [i8; BLOCK],
    fine: Option<&mut [i8; BLOCK]>,
) -> (f32, f32) {
    // SAFETY: every load and store is inside the 32-value arrays (two halves of 16).
    unsafe {
        let halves = [
            _mm512_loadu_ps(values.as_ptr()),
            _mm512_loadu_ps(values.as_ptr().add(16)),
        ];
        // The largest magnitude: `max` is exact, so its order does not matter.
        let largest = _mm512_reduce_max_ps(_mm512_max_ps(
            _mm512_abs_ps(halves[0]),
            _mm512_abs_ps(halves[1]),
        ))
        .max(0.0);
        let d = largest / 127.0;
        let inverse = if d > 0.0 { 1.0 / d } else { 0.0 };
        let round = |v: __m512| {
            let r = _mm512_sub_ps(
                _mm512_add_ps(v, _mm512_set1_ps(ROUND)),
                _mm512_set1_ps(ROUND),
            );
            _mm512_min_ps(
                _mm512_max_ps(r, _mm512_set1_ps(-127.0)),
                _mm512_set1_ps(127.0),
            )
        };
        let mut rounded = [_mm512_setzero_ps(); 2];
        let mut coarse_sum = _mm512_setzero_si512();
        for (h, half) in halves.iter().enumerate() {
            rounded[h] = round(_mm512_mul_ps(*half, _mm512_set1_ps(inverse)));
            let ints = _mm512_cvtps_epi32(rounded[h]);
            coarse_sum = _mm512_add_epi32(coarse_sum, ints);
            _mm_storeu_si128(
                codes.as_mut_ptr().add(16 * h).cast(),
                _mm512_cvtepi32_epi8(ints),
            );
        }
        let fine_sum = fine.map(|fine| {
            let fine_inverse = _mm512_set1_ps(inverse * 256.0);
            let mut sum = _mm512_setzero_si512();
            for (h, half) in halves.iter().enumerate() {
                let error = _mm512_sub_ps(*half, _mm512_mul_ps(_mm512_set1_ps(d), rounded[h]));
                let ints = _mm512_cvtps_epi32(round(_mm512_mul_ps(error, fine_inverse)));
                sum = _mm512_add_epi32(sum, ints);
                _mm_storeu_si128(
                    fine.as_mut_ptr().add(16 * h).cast(),
                    _mm512_cvtepi32_epi8(ints),
                );
            }
            _mm512_reduce_add_epi32(sum)
        });
        block_sums(d, _mm512_reduce_add_epi32(coarse_sum), fine_sum)
    }
}
