//! The encoder's steps that MLX's CPU backend computes one scalar at a time (the softmax's
//! exponentials, GELU's erf), on the native CPU kernels instead: bidirectional attention through
//! `hunch_kernels::attend_rows` (every key, or a symmetric window), and the gated GELU with a
//! rational erf. Both read and write plain float32 rows.

use hunch_kernels as kernels;

/// `gate[i] = gelu(gate[i]) · up[i]`, GELU in its erf form.
pub fn gelu_erf_mul(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        *g = 0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2)) * u;
    }
}

/// `gate[i] = gelu(gate[i])`, GELU in its erf form.
pub fn gelu_erf(values: &mut [f32]) {
    for v in values {
        let x = *v;
        *v = 0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2));
    }
}

/// `erf(x)` to within 5e-7, a few float32 ulps (a rational fit, 7e-8 in exact arithmetic, over
/// |x| ≤ 4, past which erf is ±1 in float32).
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    const ALPHA: [f32; 7] = [
        -2.726_142_3e-10,
        2.770_681_4e-8,
        -2.101_024e-6,
        -5.692_506_4e-5,
        -7.349_906_3e-4,
        -2.954_6e-3,
        -1.609_603_3e-2,
    ];
    const BETA: [f32; 5] = [
        -1.456_607_2e-5,
        -2.133_740_6e-4,
        -1.682_827e-3,
        -7.373_329e-3,
        -1.426_474e-2,
    ];
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let mut p = ALPHA[0];
    for &a in &ALPHA[1..] {
        p = p * x2 + a;
    }
    let mut q = BETA[0];
    for &b in &BETA[1..] {
        q = q * x2 + b;
    }
    x * p / q
}

/// Attention of `q`, `k`, `v` (`[heads, len, d]` each) into `[len, heads · d]` (each head in its
/// columns, the output projection's input): query `i` sees every key, or with `window` the keys
/// `j` with `|i − j| ≤ window`. Positions are split between the cores.
pub fn attend(
    (q, k, v): (&[f32], &[f32], &[f32]),
    heads: usize,
    d: usize,
    window: Option<usize>,
    scale: f32,
) -> Vec<f32> {
    let len = q.len() / (heads * d).max(1);
    let mut keys_t = vec![Vec::new(); heads];
    let mut stride = 0;
    for (h, keys) in keys_t.iter_mut().enumerate() {
        stride = kernels::attention::transpose_keys(&k[h * len * d..(h + 1) * len * d], d, keys);
    }
    let span = |i: usize| match window {
        Some(w) => (i.saturating_sub(w), (i + w + 1).min(len)),
        None => (0, len),
    };
    let width = heads * d;
    let mut out = vec![0.0f32; len * width];
    let threads = kernels::threads().min(len.div_ceil(16)).max(1);
    let share = len.div_ceil(threads);
    let together = kernels::attention::ROWS_TOGETHER;
    let mut pieces = Vec::with_capacity(threads);
    for (t, rows) in out.chunks_mut(share * width).enumerate() {
        pieces.push((t * share, rows));
    }
    kernels::on_threads(pieces, |(first, rows): (usize, &mut [f32])| {
        let count = rows.len() / width;
        let mut scores = vec![0.0f32; together * stride];
        let mut queries = vec![0.0f32; together * d];
        let mut result = vec![0.0f32; together * d];
        for h in 0..heads {
            let values = &v[h * len * d..(h + 1) * len * d];
            let mut i = first;
            while i < first + count {
                // Consecutive positions with one span (a global layer's all) go together.
                let mut n = 1;
                while n < together && i + n < first + count && span(i + n) == span(i) {
                    n += 1;
                }
                for r in 0..n {
                    queries[r * d..(r + 1) * d]
                        .copy_from_slice(&q[(h * len + i + r) * d..(h * len + i + r + 1) * d]);
                }
                kernels::attend_rows(
                    &queries[..n * d],
                    d,
                    &keys_t[h],
                    values,
                    span(i),
                    scale,
                    &mut scores[..n * stride],
                    &mut result[..n * d],
                );
                for r in 0..n {
                    let row = (i + r - first) * width + h * d;
                    rows[row..row + d].copy_from_slice(&result[r * d..(r + 1) * d]);
                }
                i += n;
            }
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_is_within_a_few_ulps_of_the_series() {
        // erf by its Taylor series in f64 (converges fast for |x| ≤ 3).
        let series = |x: f64| {
            let (mut term, mut sum) = (x, x);
            for n in 1..200 {
                term *= -x * x / n as f64;
                sum += term / (2 * n + 1) as f64;
            }
            sum * 2.0 / std::f64::consts::PI.sqrt()
        };
        for i in -300..=300 {
            let x = i as f64 / 100.0;
            let got = f64::from(erf(x as f32));
            assert!(
                (got - series(x)).abs() < 5e-7,
                "erf({x}) = {got}, not {}",
                series(x)
            );
        }
        assert_eq!(erf(9.0), erf(4.0));
        assert!((erf(4.0) - 1.0).abs() < 5e-7);
    }

    /// The attention of one head, written out.
    fn reference(q: &[f32], k: &[f32], v: &[f32], d: usize, window: Option<usize>) -> Vec<f32> {
        let len = q.len() / d;
        let mut out = vec![0.0; len * d];
        for i in 0..len {
            let (lo, hi) = match window {
                Some(w) => (i.saturating_sub(w), (i + w + 1).min(len)),
                None => (0, len),
            };
            let scores: Vec<f32> = (lo..hi)
                .map(|j| (0..d).map(|c| q[i * d + c] * k[j * d + c]).sum::<f32>() * 0.5)
                .collect();
            let max = scores.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let weights: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
            let total: f32 = weights.iter().sum();
            for (j, w) in (lo..hi).zip(&weights) {
                for c in 0..d {
                    out[i * d + c] += w / total * v[j * d + c];
                }
            }
        }
        out
    }

    #[test]
    fn attention_sees_every_key_or_its_window() {
        let (len, d) = (37, 4);
        let value = |n: usize| ((n * 7919 % 97) as f32 / 48.5) - 1.0;
        let q: Vec<f32> = (0..len * d).map(value).collect();
        let k: Vec<f32> = (0..len * d).map(|n| value(n + 13)).collect();
        let v: Vec<f32> = (0..len * d).map(|n| value(n + 29)).collect();
        for window in [None, Some(3), Some(40)] {
            let got = attend((&q, &k, &v), 1, d, window, 0.5);
            let want = reference(&q, &k, &v, d, window);
            for (a, b) in got.iter().zip(&want) {
                assert!((a - b).abs() < 1e-5, "{window:?}: {a} vs {b}");
            }
        }
    }
}
