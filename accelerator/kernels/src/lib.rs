//! The elementwise and per-row kernels of the accelerator's native CPU forward for chat models
//! (`hunch-accelerator`'s `model::causal::cpu`): exp, the masked softmax of an attention row,
//! RMSNorm, SwiGLU and GeGLU, RoPE's rotation of one head, residual adds.
//!
//! Why here and not in MLX: MLX's x86 wheel runs these one scalar at a time (its `simd::exp`
//! is instantiated at width 1 and every fused multiply-add is a libm call), which took ~38% of a
//! chat model's prompt time on the CPU (docs/benchmarks.md, "Native CPU kernels for chat
//! models"). These are plain loops over `f32` slices that LLVM vectorises; on x86-64 they are
//! compiled a second time with AVX2 and FMA enabled and that copy runs where the CPU has both
//! (checked once per process). Everything else (aarch64, older x86) gets the portable copy.
//!
//! Sums run over eight interleaved lanes whose order depends only on the row's length, so a
//! result never depends on where a row sits in memory or on how work is split (the exactness
//! rule of docs/logit-read.md).

use std::sync::OnceLock;

pub mod attention;
pub mod quant;

/// The instruction set the kernels run with in this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// x86-64 with AVX2 and FMA: the vectorised copy, fused multiply-adds.
    Avx2Fma,
    /// Whatever the target guarantees: separate multiplies and adds (a fused one would be a
    /// libm call per element on a CPU without FMA).
    Portable,
}

impl Isa {
    /// How it is named in the model's fingerprint (the two give different last bits).
    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx2Fma => "avx2-fma",
            Isa::Portable => "portable",
        }
    }
}

/// The instruction set of this process, detected once; `HUNCH_CPU_ISA=portable` (which also
/// caps the integer products, [`quant::configured`]) keeps these kernels portable too.
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        if quant::configured() == Ok(quant::QuantIsa::Portable) {
            return Isa::Portable;
        }
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            return Isa::Avx2Fma;
        }
        Isa::Portable
    })
}

/// The cores work is split between (the integer products, their inputs' quantisation, the
/// attention's rows), detected once.
pub fn threads() -> usize {
    static THREADS: OnceLock<usize> = OnceLock::new();
    *THREADS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Runs `work` on every piece, each on a thread of its own (the last on the caller's), and
/// returns when all are done; one piece runs on the caller alone. How the integer products, their
/// inputs' quantisation and the attention's rows share the cores.
pub fn on_threads<T: Send>(mut pieces: Vec<T>, work: impl Fn(T) + Sync) {
    let Some(last) = pieces.pop() else { return };
    if pieces.is_empty() {
        work(last);
        return;
    }
    std::thread::scope(|scope| {
        let work = &work;
        for piece in pieces {
            scope.spawn(move || work(piece));
        }
        work(last);
    });
}

/// How `a · b + c` is computed: fused where the copy is compiled with FMA, else separately.
trait MulAdd {
    fn mul_add(a: f32, b: f32, c: f32) -> f32;
}

/// One rounding (`vfmadd`): only instantiated inside `target_feature(enable = "fma")` code.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
struct Fused;

impl MulAdd for Fused {
    #[inline(always)]
    fn mul_add(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }
}

/// Two roundings, no libm call.
struct Separate;

impl MulAdd for Separate {
    #[inline(always)]
    fn mul_add(a: f32, b: f32, c: f32) -> f32 {
        a * b + c
    }
}

/// Defines `pub fn $name(args)` that runs `$body::<Fused>` compiled for AVX2+FMA where the CPU
/// has them, else `$body::<Separate>`.
macro_rules! dispatch {
    ($(#[$doc:meta])* pub fn $name:ident($($arg:ident: $ty:ty),* $(,)?) => $body:ident) => {
        $(#[$doc])*
        pub fn $name($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            if isa() == Isa::Avx2Fma {
                #[target_feature(enable = "avx2,fma")]
                unsafe fn fast($($arg: $ty),*) {
                    $body::<Fused>($($arg),*)
                }
                // SAFETY: `isa` found AVX2 and FMA on this CPU.
                return unsafe { fast($($arg),*) };
            }
            $body::<Separate>($($arg),*)
        }
    };
}

/// Lanes of the interleaved sums.
const LANES: usize = 8;

/// `e^x` in float32, within ~2 ulp: Cephes' `expf` reduction and polynomial, branch-free so
/// that a loop of it vectorises. `-inf` and anything below −104 give 0 (e^−104 rounds to 0),
/// anything above 88.72284 gives `+inf`, NaN stays NaN.
#[inline(always)]
fn exp1<F: MulAdd>(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 in two parts: the first has few enough bits that `n · LN2_HI` is exact.
    const LN2_HI: f32 = 0.693_359_375;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // 1.5 · 2^23: adding it rounds to an integer held in the low mantissa bits.
    const SHIFT: f32 = 12_582_912.0;
    const LO: f32 = -104.0;
    const HI: f32 = 88.722_84;
    let clamped = if x < LO { LO } else { x };
    let clamped = if clamped > HI { HI } else { clamped };
    let t = F::mul_add(clamped, LOG2E, SHIFT);
    let n = t - SHIFT;
    let n_int = t.to_bits() as i32 - SHIFT.to_bits() as i32;
    let r = F::mul_add(n, -LN2_HI, clamped);
    let r = F::mul_add(n, -LN2_LO, r);
    let mut p = 1.987_569_2e-4;
    p = F::mul_add(p, r, 1.398_199_9e-3);
    p = F::mul_add(p, r, 8.333_452e-3);
    p = F::mul_add(p, r, 4.166_579_6e-2);
    p = F::mul_add(p, r, 1.666_666_5e-1);
    p = F::mul_add(p, r, 5.000_000_1e-1);
    let y = F::mul_add(p, r * r, r) + 1.0;
    // 2^n in two factors, each a normal float for n in [−151, 128] (so results near the ends
    // of the range, subnormal ones included, round once more at most).
    let half = n_int >> 1;
    let scale = |e: i32| f32::from_bits(((e + 127) as u32) << 23);
    let y = y * scale(half) * scale(n_int - half);
    let y = if x > HI { f32::INFINITY } else { y };
    if x.is_nan() {
        x
    } else {
        y
    }
}

fn exp_body<F: MulAdd>(xs: &mut [f32]) {
    for x in xs {
        *x = exp1::<F>(*x);
    }
}

dispatch!(
    /// `e^x` of every value, in place.
    pub fn exp(xs: &mut [f32]) => exp_body
);

/// The largest value of `xs` (−inf for none), over interleaved lanes.
#[inline(always)]
fn max_of(xs: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (lane, &v) in lanes.iter_mut().zip(chunk) {
            *lane = if v > *lane { v } else { *lane };
        }
    }
    for &v in chunks.remainder() {
        lanes[0] = if v > lanes[0] { v } else { lanes[0] };
    }
    lanes
        .iter()
        .fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m })
}

/// The lanes of a sum added in a fixed order.
#[inline(always)]
fn total(lanes: [f32; LANES]) -> f32 {
    let [a, b, c, d, e, f, g, h] = lanes;
    ((a + b) + (c + d)) + ((e + f) + (g + h))
}

#[inline(always)]
fn softmax_body<F: MulAdd>(row: &mut [f32], lo: usize, hi: usize) {
    let hi = hi.min(row.len());
    let lo = lo.min(hi);
    let (before, rest) = row.split_at_mut(lo);
    let (span, after) = rest.split_at_mut(hi - lo);
    before.fill(0.0);
    after.fill(0.0);
    if span.is_empty() {
        return;
    }
    let max = max_of(span);
    let mut lanes = [0.0f32; LANES];
    let mut chunks = span.chunks_exact_mut(LANES);
    for chunk in &mut chunks {
        for (lane, v) in lanes.iter_mut().zip(chunk.iter_mut()) {
            *v = exp1::<F>(*v - max);
            *lane += *v;
        }
    }
    for v in chunks.into_remainder() {
        *v = exp1::<F>(*v - max);
        lanes[0] += *v;
    }
    let inverse = 1.0 / total(lanes);
    for v in span.iter_mut() {
        *v *= inverse;
    }
}

dispatch!(
    /// The softmax of `row[lo..hi]` in place, with the maximum subtracted first (as MLX's
    /// precise softmax); every entry outside the span (the masked keys) becomes 0.
    pub fn softmax_span(row: &mut [f32], lo: usize, hi: usize) => softmax_body
);

use attention::attend_rows_body;

/// Query rows `queries` (`[rows, d]`, 1 to [`attention::ROWS_TOGETHER`], the heads of one kv
/// head at one position) attending to the keys `span = (lo, hi)` of `keys_t` (`[d, stride]`,
/// from [`attention::transpose_keys`]) with their `values` (`[keys, d]`): the scores times
/// `scale`, their softmax over the span (in `scores`, `[rows, stride]`, zero before `lo`), and
/// the weighted sums of the values into `out` (`[rows, d]`). A row's bits depend only on it and
/// its span's keys and values (see [`attention`]); AVX-512 registers where the CPU has them give
/// the same bits as AVX2's (the same operations per value, in the same order).
#[allow(clippy::too_many_arguments)]
pub fn attend_rows(
    queries: &[f32],
    d: usize,
    keys_t: &[f32],
    values: &[f32],
    span: (usize, usize),
    scale: f32,
    scores: &mut [f32],
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if isa() == Isa::Avx2Fma {
        static AVX512: OnceLock<bool> = OnceLock::new();
        // 512-bit registers where the CPU has them, unless `HUNCH_CPU_ISA` capped the integer
        // products below AVX-512 on a CPU that has it: a capped run then measures what a CPU
        // without AVX-512 would run (docs/benchmarks.md, "Every row beside llama.cpp"). The
        // bits are the same either way.
        let wide = || {
            let capped = quant::available().contains(&quant::QuantIsa::Avx512Vnni)
                && quant::quant_isa() != quant::QuantIsa::Avx512Vnni;
            std::is_x86_feature_detected!("avx512f") && !capped
        };
        let rows = if *AVX512.get_or_init(wide) {
            attend_rows_avx512
        } else {
            attend_rows_avx2
        };
        // SAFETY: `isa` found AVX2 and FMA on this CPU, and AVX-512 F where it is chosen.
        return unsafe { rows(queries, d, keys_t, values, span, scale, scores, out) };
    }
    attend_rows_body::<Separate>(queries, d, keys_t, values, span, scale, scores, out)
}

/// Defines an `unsafe fn $name` with [`attend_rows`]'s arguments that runs its body with fused
/// multiply-adds, compiled with the target features `$features` (the CPU must have them).
macro_rules! attend_rows_with {
    ($(#[$doc:meta])* $name:ident, $features:literal) => {
        $(#[$doc])*
        ///
        /// # Safety
        #[doc = concat!("The CPU has ", $features, ".")]
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        #[allow(clippy::too_many_arguments)]
        unsafe fn $name(
            queries: &[f32],
            d: usize,
            keys_t: &[f32],
            values: &[f32],
            span: (usize, usize),
            scale: f32,
            scores: &mut [f32],
            out: &mut [f32],
        ) {
            attend_rows_body::<Fused>(queries, d, keys_t, values, span, scale, scores, out)
        }
    };
}

attend_rows_with!(
    /// [`attend_rows`] in 256-bit registers.
    attend_rows_avx2,
    "avx2,fma"
);
attend_rows_with!(
    /// [`attend_rows`] in 512-bit registers: the same operations per value as the AVX2 copy.
    attend_rows_avx512,
    "avx512f,avx2,fma"
);

/// `1 / sqrt(mean(x²) + eps)` of one row.
#[inline(always)]
fn inverse_rms<F: MulAdd>(x: &[f32], eps: f32) -> f32 {
    let mut lanes = [0.0f32; LANES];
    let mut chunks = x.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (lane, &v) in lanes.iter_mut().zip(chunk) {
            *lane = F::mul_add(v, v, *lane);
        }
    }
    for &v in chunks.remainder() {
        lanes[0] = F::mul_add(v, v, lanes[0]);
    }
    1.0 / (total(lanes) / x.len() as f32 + eps).sqrt()
}

fn rms_norm_body<F: MulAdd>(x: &[f32], weight: Option<&[f32]>, eps: f32, out: &mut [f32]) {
    let dim = match weight {
        Some(w) => w.len(),
        None => out.len().min(x.len()),
    };
    if dim == 0 {
        return;
    }
    for (row, out) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        let r = inverse_rms::<F>(row, eps);
        match weight {
            Some(w) => {
                for ((o, &v), &w) in out.iter_mut().zip(row).zip(w) {
                    *o = v * r * w;
                }
            }
            None => {
                for (o, &v) in out.iter_mut().zip(row) {
                    *o = v * r;
                }
            }
        }
    }
}

dispatch!(
    /// RMSNorm of each row of `x` (rows of `weight.len()` values) into `out`:
    /// `x · (1/sqrt(mean(x²) + eps)) · w`, as MLX's `rms_norm` orders it. Gemma's `1 + w` is
    /// already in the weight (the loaders add it). Without a weight, `x` and `out` are one row.
    pub fn rms_norm(x: &[f32], weight: Option<&[f32]>, eps: f32, out: &mut [f32]) => rms_norm_body
);

fn rms_norm_in_place_body<F: MulAdd>(x: &mut [f32], weight: &[f32], eps: f32) {
    if weight.is_empty() {
        return;
    }
    for row in x.chunks_exact_mut(weight.len()) {
        let r = inverse_rms::<F>(row, eps);
        for (v, &w) in row.iter_mut().zip(weight) {
            *v = *v * r * w;
        }
    }
}

dispatch!(
    /// RMSNorm of each row of `weight.len()` values of `x`, in place (the per-head q/k norms).
    pub fn rms_norm_in_place(x: &mut [f32], weight: &[f32], eps: f32) => rms_norm_in_place_body
);

fn silu_mul_body<F: MulAdd>(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        let sigmoid = 1.0 / (1.0 + exp1::<F>(-*g));
        *g = *g * sigmoid * u;
    }
}

dispatch!(
    /// SwiGLU: `gate ← silu(gate) · up`, `silu(g) = g · sigmoid(g)` (MLX's order).
    pub fn silu_mul(gate: &mut [f32], up: &[f32]) => silu_mul_body
);

fn gelu_tanh_mul_body<F: MulAdd>(gate: &mut [f32], up: &[f32]) {
    const CUBIC: f32 = 0.044_715;
    // √(2/π), rounded from f64 as the accelerator's `model::fused` rounds it.
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        let inner = F::mul_add(x * x * x, CUBIC, x) * SQRT_2_OVER_PI;
        // ½(1 + tanh(y)) = sigmoid(2y): no cancellation where tanh(y) nears −1.
        let half_one_plus_tanh = 1.0 / (1.0 + exp1::<F>(-2.0 * inner));
        *g = x * half_one_plus_tanh * u;
    }
}

dispatch!(
    /// GeGLU: `gate ← gelu_tanh(gate) · up`, `gelu_tanh(x) = ½x(1 + tanh(√(2/π)(x + 0.044715x³)))`
    /// (Gemma's `gelu_pytorch_tanh`).
    pub fn gelu_tanh_mul(gate: &mut [f32], up: &[f32]) => gelu_tanh_mul_body
);

fn add_body<F: MulAdd>(x: &mut [f32], r: &[f32]) {
    for (x, &r) in x.iter_mut().zip(r) {
        *x += r;
    }
}

dispatch!(
    /// The residual add `x ← x + r`.
    pub fn add(x: &mut [f32], r: &[f32]) => add_body
);

fn scale_body<F: MulAdd>(x: &mut [f32], by: &[f32]) {
    let Some(&by) = by.first() else { return };
    for x in x.iter_mut() {
        *x *= by;
    }
}

dispatch!(
    /// `x ← x · by[0]` (Gemma's embedding scale).
    pub fn scale(x: &mut [f32], by: &[f32]) => scale_body
);

fn rope_body<F: MulAdd>(src: &[f32], cos: &[f32], sin: &[f32], dst: &mut [f32]) {
    let half = cos.len().min(sin.len());
    if src.len() < 2 * half || dst.len() < 2 * half {
        return;
    }
    let (x1, x2) = src.split_at(half);
    let (d1, d2) = dst.split_at_mut(half);
    for i in 0..half {
        let (a, b, c, s) = (x1[i], x2[i], cos[i], sin[i]);
        d1[i] = F::mul_add(a, c, -(b * s));
        d2[i] = F::mul_add(a, s, b * c);
    }
}

dispatch!(
    /// Rotate-half RoPE of one head's row (Hugging Face's order: pair `(i, i + d/2)`):
    /// `dst = (x₁·cos − x₂·sin, x₁·sin + x₂·cos)` with `cos`, `sin` of the row's position per
    /// pair.
    pub fn rope(src: &[f32], cos: &[f32], sin: &[f32], dst: &mut [f32]) => rope_body
);

#[cfg(test)]
mod tests {
    use super::*;

    fn ulps(a: f32, b: f64) -> f64 {
        let b32 = b as f32;
        if b32 == 0.0 || !b32.is_normal() {
            return if (a as f64 - b).abs() < 1e-37 {
                0.0
            } else {
                f64::INFINITY
            };
        }
        ((a as f64 - b) / (b32.abs() as f64 * f32::EPSILON as f64)).abs()
    }

    #[test]
    fn exp_is_within_two_ulp_of_f64_and_handles_the_ends() {
        let mut xs: Vec<f32> = (-1000..=887).map(|i| i as f32 * 0.1).collect();
        xs.extend([-87.5, -0.0, 1e-8, -1e-8, 88.0, 88.72, 0.693_147_2]);
        let mut ys = xs.clone();
        exp(&mut ys);
        let mut worst = 0.0f64;
        for (&x, &y) in xs.iter().zip(&ys) {
            let e = ulps(y, (x as f64).exp());
            assert!(e <= 2.0, "exp({x}) = {y}, f64 says {}", (x as f64).exp());
            worst = worst.max(e);
        }
        eprintln!("exp: worst {worst:.2} ulp over {} values", xs.len());
        let mut ends = [
            f32::NEG_INFINITY,
            -100.0,
            -104.5,
            0.0,
            89.0,
            f32::INFINITY,
            f32::NAN,
        ];
        exp(&mut ends);
        assert_eq!(ends[0], 0.0, "e^-inf");
        assert!(ends[1] < 1e-43, "e^-100 = {}", ends[1]);
        assert_eq!(ends[2], 0.0);
        assert_eq!(ends[3], 1.0);
        assert_eq!(ends[4], f32::INFINITY);
        assert_eq!(ends[5], f32::INFINITY);
        assert!(ends[6].is_nan());
        // The portable copy agrees to the same bound.
        let mut portable = xs.clone();
        exp_body::<Separate>(&mut portable);
        for (&x, &y) in xs.iter().zip(&portable) {
            assert!(ulps(y, (x as f64).exp()) <= 2.0, "portable exp({x}) = {y}");
        }
    }

    #[test]
    fn softmax_rows_sum_to_one_and_masked_keys_are_zero() {
        for len in [1usize, 7, 8, 9, 33, 200] {
            let row: Vec<f32> = (0..len)
                .map(|i| ((i * 37) % 11) as f32 * 1.7 - 9.0)
                .collect();
            for (lo, hi) in [
                (0, len),
                (len / 3, len),
                (0, len.div_ceil(2)),
                (len / 4, len - len / 4),
            ] {
                let mut got = row.clone();
                softmax_span(&mut got, lo, hi);
                let span = &row[lo..hi];
                let max = span.iter().copied().fold(f64::MIN, |m, v| m.max(v as f64));
                let sum: f64 = span.iter().map(|&v| (v as f64 - max).exp()).sum();
                let total: f64 = got.iter().map(|&v| v as f64).sum();
                assert!(
                    (total - 1.0).abs() < 1e-6,
                    "len {len} [{lo}, {hi}): sums to {total}"
                );
                for (j, &p) in got.iter().enumerate() {
                    if j < lo || j >= hi {
                        assert_eq!(p, 0.0);
                    } else {
                        let want = (row[j] as f64 - max).exp() / sum;
                        assert!((p as f64 - want).abs() < 1e-6, "p[{j}] = {p}, want {want}");
                    }
                }
            }
        }
        // An empty span zeroes the row; -inf inputs give 0.
        let mut row = vec![1.0, 2.0, 3.0];
        softmax_span(&mut row, 2, 2);
        assert_eq!(row, [0.0; 3]);
        let mut row = vec![f32::NEG_INFINITY, 0.0, 0.0];
        softmax_span(&mut row, 0, 3);
        assert_eq!(row, [0.0, 0.5, 0.5]);
    }

    #[test]
    fn rope_matches_a_scalar_reference() {
        let half = 8;
        let src: Vec<f32> = (0..2 * half)
            .map(|i| (i as f32 * 0.37).sin() * 2.0)
            .collect();
        let angles: Vec<f64> = (0..half).map(|i| 5.0 * (0.6f64).powi(i as i32)).collect();
        let cos: Vec<f32> = angles.iter().map(|a| a.cos() as f32).collect();
        let sin: Vec<f32> = angles.iter().map(|a| a.sin() as f32).collect();
        let mut dst = vec![0.0f32; 2 * half];
        rope(&src, &cos, &sin, &mut dst);
        for i in 0..half {
            let (a, b) = (src[i] as f64, src[i + half] as f64);
            let (c, s) = (angles[i].cos(), angles[i].sin());
            assert!((dst[i] as f64 - (a * c - b * s)).abs() < 1e-6);
            assert!((dst[i + half] as f64 - (a * s + b * c)).abs() < 1e-6);
        }
    }

    #[test]
    fn norms_and_gates_match_their_formulas() {
        let x: Vec<f32> = (0..24).map(|i| (i as f32 - 11.5) * 0.3).collect();
        let w: Vec<f32> = (0..12).map(|i| 0.5 + i as f32 * 0.1).collect();
        let mut out = vec![0.0f32; 24];
        rms_norm(&x, Some(&w), 1e-6, &mut out);
        let mut in_place = x.clone();
        rms_norm_in_place(&mut in_place, &w, 1e-6);
        assert_eq!(out, in_place);
        for (row, got) in x.chunks(12).zip(out.chunks(12)) {
            let ms: f64 = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / 12.0;
            let r = 1.0 / (ms + 1e-6).sqrt();
            for i in 0..12 {
                let want = row[i] as f64 * r * w[i] as f64;
                assert!((got[i] as f64 - want).abs() < 1e-5, "{} vs {want}", got[i]);
            }
        }
        let up: Vec<f32> = (0..24).map(|i| 1.0 - i as f32 * 0.05).collect();
        let mut silu = x.clone();
        silu_mul(&mut silu, &up);
        let mut gelu = x.clone();
        gelu_tanh_mul(&mut gelu, &up);
        for i in 0..24 {
            let (g, u) = (x[i] as f64, up[i] as f64);
            let want = g / (1.0 + (-g).exp()) * u;
            assert!(
                (silu[i] as f64 - want).abs() < 1e-6,
                "silu {} vs {want}",
                silu[i]
            );
            let inner = (2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g * g * g);
            let want = 0.5 * g * (1.0 + inner.tanh()) * u;
            assert!(
                (gelu[i] as f64 - want).abs() < 1e-6,
                "gelu {} vs {want}",
                gelu[i]
            );
        }
    }
}
