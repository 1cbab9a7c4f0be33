//! Query rows' attention over a span of keys, in an order that depends only on the row and the
//! span: each score is its own sum over the head's dimensions, in order; each output value its
//! own sum over the span's keys, in order. So a row gets the same bits whatever other rows are
//! computed with it, however a prompt is split into chunks, and however many keys past its span
//! the chunk holds (docs/logit-read.md, "Exactness"): what lets a prompt's shared prefix end at
//! any token.
//!
//! Rows that share a span and keys (the query heads of one kv head at one position) go
//! together, up to [`ROWS_TOGETHER`], so that each key and value is loaded once for all of them:
//! the keys and values stream from L2 once per group of rows instead of once per row.

use super::{softmax_body, MulAdd};

/// Keys a score block covers (one 512-bit or two 256-bit registers).
pub const KEY_BLOCK: usize = 16;
/// Query rows computed together at most.
pub const ROWS_TOGETHER: usize = 4;
/// Score blocks computed together (with four rows: eight 512-bit registers of sums).
const BLOCKS_TOGETHER: usize = 2;
/// Output values summed together in registers.
const VALUE_PIECE: usize = 64;

/// Keys `[n, d]` transposed into `out` as `[d, stride]`, `stride` being `n` rounded up to a
/// whole [`KEY_BLOCK`] (the padding zero); returns `stride`.
pub fn transpose_keys(keys: &[f32], d: usize, out: &mut Vec<f32>) -> usize {
    let n = keys.len().checked_div(d).unwrap_or(0);
    let stride = n.div_ceil(KEY_BLOCK) * KEY_BLOCK;
    out.clear();
    out.resize(d * stride, 0.0);
    for (key, row) in keys.chunks_exact(d.max(1)).enumerate() {
        for (i, &v) in row.iter().enumerate() {
            out[i * stride + key] = v;
        }
    }
    stride
}

/// `queries` (`[rows, d]`, 1 to [`ROWS_TOGETHER`] rows) attending to the keys `lo..hi`; `scores`
/// holds `rows` rows of at least `hi` scores, `out` `[rows, d]`.
// Inlined into the dispatcher's copies (else its multiply-adds are libm calls).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn attend_rows_body<F: MulAdd>(
    queries: &[f32],
    d: usize,
    keys_t: &[f32],
    values: &[f32],
    (lo, hi): (usize, usize),
    scale: f32,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let rows = queries.len().checked_div(d).unwrap_or(0);
    let stride = keys_t.len().checked_div(d).unwrap_or(0);
    assert!(
        (1..=ROWS_TOGETHER).contains(&rows)
            && queries.len() == rows * d
            && stride.is_multiple_of(KEY_BLOCK)
            && lo <= hi
            && hi <= stride
            && values.len() >= hi * d
            && scores.len() >= rows * stride
            && out.len() == rows * d,
        "attention rows: shapes disagree"
    );
    match rows {
        4 => rows_of::<F, 4>(
            queries,
            d,
            keys_t,
            stride,
            values,
            (lo, hi),
            scale,
            scores,
            out,
        ),
        3 => rows_of::<F, 3>(
            queries,
            d,
            keys_t,
            stride,
            values,
            (lo, hi),
            scale,
            scores,
            out,
        ),
        2 => rows_of::<F, 2>(
            queries,
            d,
            keys_t,
            stride,
            values,
            (lo, hi),
            scale,
            scores,
            out,
        ),
        _ => rows_of::<F, 1>(
            queries,
            d,
            keys_t,
            stride,
            values,
            (lo, hi),
            scale,
            scores,
            out,
        ),
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn rows_of<F: MulAdd, const R: usize>(
    queries: &[f32],
    d: usize,
    keys_t: &[f32],
    stride: usize,
    values: &[f32],
    (lo, hi): (usize, usize),
    scale: f32,
    scores: &mut [f32],
    out: &mut [f32],
) {
    // Scores of the span's keys (blocks start on multiples of KEY_BLOCK; a score computed past
    // the span is ignored, and each score is its own sum, so the blocking changes no bits).
    let mut block = lo / KEY_BLOCK * KEY_BLOCK;
    while block < hi {
        if hi - block > (BLOCKS_TOGETHER - 1) * KEY_BLOCK {
            score_blocks::<F, R, BLOCKS_TOGETHER>(queries, d, keys_t, stride, block, scale, scores);
            block += BLOCKS_TOGETHER * KEY_BLOCK;
        } else {
            score_blocks::<F, R, 1>(queries, d, keys_t, stride, block, scale, scores);
            block += KEY_BLOCK;
        }
    }
    for r in 0..R {
        softmax_body::<F>(&mut scores[r * stride..r * stride + hi], lo, hi);
    }
    // The weighted values, a piece of the head's dimensions at a time, keys in order.
    let mut from = 0;
    while from < d {
        let width = (d - from).min(VALUE_PIECE);
        if width == VALUE_PIECE {
            let mut acc = [[0.0f32; VALUE_PIECE]; R];
            for key in lo..hi {
                let v = &values[key * d + from..][..VALUE_PIECE];
                for (r, sums) in acc.iter_mut().enumerate() {
                    let p = scores[r * stride + key];
                    for (a, &v) in sums.iter_mut().zip(v) {
                        *a = F::mul_add(p, v, *a);
                    }
                }
            }
            for (r, sums) in acc.iter().enumerate() {
                out[r * d + from..][..VALUE_PIECE].copy_from_slice(sums);
            }
        } else {
            for r in 0..R {
                let piece = &mut out[r * d + from..][..width];
                piece.fill(0.0);
                for key in lo..hi {
                    let p = scores[r * stride + key];
                    for (a, &v) in piece.iter_mut().zip(&values[key * d + from..][..width]) {
                        *a = F::mul_add(p, v, *a);
                    }
                }
            }
        }
        from += width;
    }
}

/// `B` blocks of scores from `block` on for `R` rows: `scale · Σ_i q[i] · k[key][i]`, `i` in
/// order.
#[inline(always)]
fn score_blocks<F: MulAdd, const R: usize, const B: usize>(
    queries: &[f32],
    d: usize,
    keys_t: &[f32],
    stride: usize,
    block: usize,
    scale: f32,
    scores: &mut [f32],
) {
    let mut acc = [[[0.0f32; KEY_BLOCK]; B]; R];
    for i in 0..d {
        let keys = &keys_t[i * stride + block..][..B * KEY_BLOCK];
        for (r, row) in acc.iter_mut().enumerate() {
            let qi = queries[r * d + i];
            for (sums, keys) in row.iter_mut().zip(keys.chunks_exact(KEY_BLOCK)) {
                for (a, &k) in sums.iter_mut().zip(keys) {
                    *a = F::mul_add(qi, k, *a);
                }
            }
        }
    }
    // Scores past the row's end (the last block's padding) are not kept.
    for (r, row) in acc.iter().enumerate() {
        for (b, sums) in row.iter().enumerate() {
            for (l, &sum) in sums.iter().enumerate() {
                let key = block + b * KEY_BLOCK + l;
                if key < stride {
                    scores[r * stride + key] = sum * scale;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{transpose_keys, ROWS_TOGETHER};
    use crate::attend_rows;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let x = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed);
                (x >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0
            })
            .collect()
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|f| f.to_bits()).collect()
    }

    /// `rows` query rows of `q` against `keys`/`vals` (`[n, d]`) over `span`.
    fn attend(q: &[f32], d: usize, keys: &[f32], vals: &[f32], span: (usize, usize)) -> Vec<f32> {
        let rows = q.len() / d;
        let mut keys_t = Vec::new();
        let stride = transpose_keys(keys, d, &mut keys_t);
        let mut scores = vec![0.0; rows * stride];
        let mut out = vec![0.0; rows * d];
        let scale = 1.0 / (d as f32).sqrt();
        attend_rows(q, d, &keys_t, vals, span, scale, &mut scores, &mut out);
        out
    }

    #[test]
    fn rows_match_float64_and_keep_their_bits_alone_together_and_whatever_keys_follow() {
        for d in [64, 80, 128] {
            let keys_len = 150;
            let (keys, vals) = (values(keys_len * d, 1), values(keys_len * d, 2));
            let q = values(ROWS_TOGETHER * d, 3);
            let scale = 1.0 / (d as f32).sqrt();
            for (lo, hi) in [(0, 1), (0, 37), (5, 100), (17, 150)] {
                let together = attend(&q, d, &keys, &vals, (lo, hi));
                for r in 0..ROWS_TOGETHER {
                    let row = &q[r * d..(r + 1) * d];
                    // Float64 reference.
                    let s: Vec<f64> = (lo..hi)
                        .map(|k| {
                            let dot: f64 =
                                (0..d).map(|i| row[i] as f64 * keys[k * d + i] as f64).sum();
                            scale as f64 * dot
                        })
                        .collect();
                    let max = s.iter().cloned().fold(f64::MIN, f64::max);
                    let e: Vec<f64> = s.iter().map(|v| (v - max).exp()).collect();
                    let total: f64 = e.iter().sum();
                    for j in 0..d {
                        let want: f64 = (lo..hi)
                            .map(|k| e[k - lo] / total * vals[k * d + j] as f64)
                            .sum();
                        let got = together[r * d + j] as f64;
                        assert!(
                            (got - want).abs() < 1e-5,
                            "d {d} span {lo}..{hi} [{r}, {j}]"
                        );
                    }
                    // Alone, and against only the span's keys: the same bits.
                    let alone = attend(row, d, &keys[..hi * d], &vals[..hi * d], (lo, hi));
                    assert_eq!(
                        bits(&alone),
                        bits(&together[r * d..(r + 1) * d]),
                        "d {d} {lo}..{hi} row {r}"
                    );
                }
                // 256- and 512-bit registers: the same bits.
                #[cfg(target_arch = "x86_64")]
                if crate::isa() == crate::Isa::Avx2Fma && std::is_x86_feature_detected!("avx512f") {
                    let mut keys_t = Vec::new();
                    let stride = transpose_keys(&keys, d, &mut keys_t);
                    let mut scores = vec![0.0; ROWS_TOGETHER * stride];
                    let (mut narrow, mut wide) = (vec![0.0; q.len()], vec![0.0; q.len()]);
                    // SAFETY: AVX2, FMA and AVX-512 F were detected.
                    unsafe {
                        crate::attend_rows_avx2(
                            &q,
                            d,
                            &keys_t,
                            &vals,
                            (lo, hi),
                            scale,
                            &mut scores,
                            &mut narrow,
                        );
                        crate::attend_rows_avx512(
                            &q,
                            d,
                            &keys_t,
                            &vals,
                            (lo, hi),
                            scale,
                            &mut scores,
                            &mut wide,
                        );
                    }
                    assert_eq!(bits(&narrow), bits(&wide), "d {d} span {lo}..{hi}: widths");
                }
            }
        }
    }
}
