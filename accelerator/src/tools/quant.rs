//! Pure-Rust NVFP4 and MLX-affine quantisers and dequantisers, bit-exact with MLX 0.32.2's
//! `mx.quantize` / `mx.dequantize` on the CPU.
//!
//! The arithmetic below was derived by probing MLX and is pinned by
//! `tests/data/quant_vectors.safetensors` (made by `tests/gen/make_quant_vectors.py`, which also
//! asserts that a numpy model of exactly these steps matches MLX). Each step says which rounding
//! MLX performs, because moving one rounding changes a few codes in every thousand.
//!
//! Inputs are rows of `f32` values together with the [`SourceDtype`] they came from: MLX computes
//! some intermediates in the input dtype, so a bf16 weight rounds where an f32 weight does not.

use half::bf16;

/// The dtype the weight had when MLX saw it; decides where intermediates are rounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceDtype {
    F32,
    Bf16,
}

impl SourceDtype {
    fn round(self, x: f32) -> f32 {
        match self {
            SourceDtype::F32 => x,
            SourceDtype::Bf16 => bf16::from_f32(x).to_f32(),
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum QuantError {
    #[error("cannot quantise {len} values in groups of {group}: the last dimension ({cols}) must be a multiple of the group size")]
    BadShape {
        len: usize,
        cols: usize,
        group: usize,
    },
    #[error("affine quantisation supports 4 or 8 bits, not {0}")]
    BadBits(u32),
}

/// NVFP4 group size: one E4M3 scale per 16 inputs.
pub use crate::checkpoint::format::NVFP4_GROUP;
/// `global_scale = NVFP4_GLOBAL_DIVISOR × weight_scale_2` (448 · 6: E4M3 max × E2M1 max).
pub const NVFP4_GLOBAL_DIVISOR: f32 = 2688.0;

/// E2M1 magnitudes for codes 0..8 (bit 3 is the sign).
pub const E2M1_VALUES: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// Value of an FP8 E4M3 byte (bias 7, no infinities, `0x7F`/`0xFF` are NaN).
pub fn e4m3_to_f32(b: u8) -> f32 {
    E4M3_LUT[usize::from(b)]
}

/// All 256 E4M3 values, built at compile time from the bit layout.
static E4M3_LUT: [f32; 256] = e4m3_lut();

const fn e4m3_lut() -> [f32; 256] {
    let mut t = [0f32; 256];
    let mut b = 0;
    while b < 256 {
        let e = ((b >> 3) & 0x0F) as u32;
        let m = (b & 0x07) as u32;
        let mag = if e == 15 && m == 7 {
            f32::NAN
        } else if e == 0 {
            // subnormal: m/8 · 2^-6 = m · 2^-9, exact
            m as f32 * f32::from_bits((127 - 9) << 23)
        } else {
            f32::from_bits(((e + 127 - 7) << 23) | (m << 20))
        };
        t[b] = if b & 0x80 != 0 { -mag } else { mag };
        b += 1;
    }
    t
}

/// Nearest E4M3 byte of a non-negative value, ties to even, saturating at 448 (MLX's `to_fp8`).
pub fn f32_to_e4m3(x: f32) -> u8 {
    if x.is_nan() || x <= 0.0 {
        return 0;
    }
    if x >= 448.0 {
        return 126;
    }
    // The positive finite codes 0..=126 are monotonic in value, so a binary search finds the
    // bracketing pair; values are exact in f32 and so is the tie test.
    let (mut lo, mut hi) = (0u8, 126u8);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if e4m3_to_f32(mid) <= x {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let (vl, vh) = (e4m3_to_f32(lo), e4m3_to_f32(hi));
    if vl == x {
        return lo;
    }
    let (dl, dh) = (x - vl, vh - x);
    if dl < dh || (dl == dh && lo % 2 == 0) {
        lo
    } else {
        hi
    }
}

/// Mid-points between consecutive E2M1 magnitudes; a value equal to one rounds down.
const E2M1_MIDPOINTS: [f32; 7] = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0];

/// E2M1 code of a value: nearest, **ties toward zero**, saturating at ±6, and code 0 (not the
/// negative zero 8) for anything that rounds to zero — all three as MLX does.
pub fn f32_to_e2m1(x: f32) -> u8 {
    if x.is_nan() {
        return 0;
    }
    let a = x.abs();
    let code = E2M1_MIDPOINTS.iter().take_while(|&&m| a > m).count() as u8;
    if code == 0 {
        0
    } else if x < 0.0 {
        code | 8
    } else {
        code
    }
}

/// Value of an E2M1 code (low 4 bits).
pub fn e2m1_to_f32(code: u8) -> f32 {
    let v = E2M1_VALUES[usize::from(code & 7)];
    if code & 8 != 0 {
        -v
    } else {
        v
    }
}

/// Packed NVFP4 tensor: `codes` are 8 E2M1 codes per little-endian u32 (element `8j+k` in bits
/// `4k..4k+4`), `scales` one E4M3 byte per 16 inputs, both row-major like the input.
#[derive(Debug, Clone, PartialEq)]
pub struct Nvfp4 {
    pub codes: Vec<u32>,
    pub scales: Vec<u8>,
}

fn check_rows(len: usize, cols: usize, group: usize) -> Result<(), QuantError> {
    if cols == 0 || !cols.is_multiple_of(group) || !len.is_multiple_of(cols) {
        return Err(QuantError::BadShape { len, cols, group });
    }
    Ok(())
}

/// `mx.quantize(w, group_size=16, bits=4, mode="nvfp4", global_scale=gs)` for a row-major matrix
/// with `cols` columns. `global_scale` is MLX's absmax convention (`w ≈ e2m1 · e4m3 · gs / 2688`).
pub fn quantize_nvfp4(
    w: &[f32],
    cols: usize,
    src: SourceDtype,
    global_scale: Option<f32>,
) -> Result<Nvfp4, QuantError> {
    check_rows(w.len(), cols, NVFP4_GROUP)?;
    let mut codes = Vec::with_capacity(w.len() / 8);
    let mut scales = Vec::with_capacity(w.len() / NVFP4_GROUP);
    // MLX multiplies by 2688/gs (one f32 rounding of the quotient), it does not divide by gs/2688.
    let to_block = global_scale.map(|gs| NVFP4_GLOBAL_DIVISOR / gs);
    for group in w.chunks_exact(NVFP4_GROUP) {
        let amax = group.iter().fold(0f32, |m, &v| m.max(v.abs()));
        // amax / 6 is computed in the input dtype, the global factor in f32.
        let mut s = src.round(amax / 6.0);
        if let Some(k) = to_block {
            s *= k;
        }
        let sb = f32_to_e4m3(s);
        scales.push(sb);
        let e = e4m3_to_f32(sb);
        for eight in group.chunks_exact(8) {
            let mut word = 0u32;
            for (k, &v) in eight.iter().enumerate() {
                // A zero block scale gives code 0 everywhere (MLX writes no inf/NaN codes).
                let x = if e == 0.0 {
                    0.0
                } else {
                    let q = src.round(v / e);
                    match to_block {
                        Some(k) => q * k,
                        None => q,
                    }
                };
                word |= u32::from(f32_to_e2m1(x)) << (4 * k);
            }
            codes.push(word);
        }
    }
    Ok(Nvfp4 { codes, scales })
}

/// `mx.dequantize(..., mode="nvfp4", global_scale=gs, dtype=float32)`:
/// `e2m1 · (e4m3 · (gs / 2688))`, in f32, in that association (MLX's).
pub fn dequantize_nvfp4(q: &Nvfp4, global_scale: Option<f32>) -> Vec<f32> {
    let factor = global_scale.map(|gs| gs / NVFP4_GLOBAL_DIVISOR);
    let mut out = Vec::with_capacity(q.codes.len() * 8);
    for (i, &word) in q.codes.iter().enumerate() {
        let sb = q.scales.get(i / 2).copied().unwrap_or(0);
        let mut e = e4m3_to_f32(sb);
        if let Some(f) = factor {
            e *= f;
        }
        for k in 0..8 {
            out.push(e2m1_to_f32(((word >> (4 * k)) & 0xF) as u8) * e);
        }
    }
    out
}

/// Affine-quantised tensor as MLX stores it: `codes` packed `32/bits` per little-endian u32,
/// `scales`/`biases` one per group, already rounded to the input dtype (held here as f32).
#[derive(Debug, Clone, PartialEq)]
pub struct Affine {
    pub codes: Vec<u32>,
    pub scales: Vec<f32>,
    pub biases: Vec<f32>,
    pub bits: u32,
    pub group_size: usize,
}

/// `mx.quantize(w, group_size, bits, mode="affine")` (bits 4 or 8).
pub fn quantize_affine(
    w: &[f32],
    cols: usize,
    group_size: usize,
    bits: u32,
    src: SourceDtype,
) -> Result<Affine, QuantError> {
    if bits != 4 && bits != 8 {
        return Err(QuantError::BadBits(bits));
    }
    check_rows(w.len(), cols, group_size)?;
    let per_word = (32 / bits) as usize;
    if !group_size.is_multiple_of(per_word) {
        return Err(QuantError::BadShape {
            len: w.len(),
            cols,
            group: group_size,
        });
    }
    let n_bins = ((1u32 << bits) - 1) as f32;
    let n_groups = w.len() / group_size;
    let mut codes = Vec::with_capacity(w.len() / per_word);
    let mut scales = Vec::with_capacity(n_groups);
    let mut biases = Vec::with_capacity(n_groups);
    for group in w.chunks_exact(group_size) {
        let (mut wmin, mut wmax) = (f32::INFINITY, f32::NEG_INFINITY);
        for &v in group {
            wmin = wmin.min(v);
            wmax = wmax.max(v);
        }
        // The extreme with the larger magnitude is represented exactly (as code 0 or n_bins):
        // MLX picks it as the "edge" and snaps the scale so that edge / scale is an integer.
        let mask = wmin.abs() > wmax.abs();
        let mut scale = ((wmax - wmin) / n_bins).max(1e-7);
        if !mask {
            scale = -scale;
        }
        let edge = if mask { wmin } else { wmax };
        let q0 = (edge / scale).round_ties_even();
        let mut bias = 0.0;
        if q0 != 0.0 {
            scale = edge / q0;
            bias = edge;
        }
        for chunk in group.chunks_exact(per_word) {
            let mut word = 0u32;
            for (k, &v) in chunk.iter().enumerate() {
                // Codes use the f32 scale/bias; only the stored scale/bias are rounded.
                let q = ((v - bias) / scale).round_ties_even().clamp(0.0, n_bins);
                word |= (q as u32) << (bits as usize * k);
            }
            codes.push(word);
        }
        scales.push(src.round(scale));
        biases.push(src.round(bias));
    }
    Ok(Affine {
        codes,
        scales,
        biases,
        bits,
        group_size,
    })
}

/// `mx.dequantize(..., mode="affine")`: `scale · q + bias` in the scales' dtype, i.e. with a
/// rounding after the product and after the sum for bf16 (not a fused multiply-add).
pub fn dequantize_affine(q: &Affine, src: SourceDtype) -> Vec<f32> {
    let per_word = (32 / q.bits) as usize;
    let mask = (1u32 << q.bits) - 1;
    let words_per_group = q.group_size / per_word;
    let mut out = Vec::with_capacity(q.codes.len() * per_word);
    for (i, &word) in q.codes.iter().enumerate() {
        let g = i / words_per_group.max(1);
        let (s, b) = (
            q.scales.get(g).copied().unwrap_or(0.0),
            q.biases.get(g).copied().unwrap_or(0.0),
        );
        for k in 0..per_word {
            let c = ((word >> (q.bits as usize * k)) & mask) as f32;
            out.push(src.round(src.round(s * c) + b));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::tensors::{Dtype, SafetensorsFile};

    fn vectors() -> SafetensorsFile {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/quant_vectors.safetensors"
        );
        SafetensorsFile::open(path).expect("test vectors present")
    }

    fn load(f: &SafetensorsFile, name: &str) -> (Vec<f32>, SourceDtype, Vec<usize>) {
        let t = f.tensor(name).expect(name);
        let src = match t.dtype {
            Dtype::BF16 => SourceDtype::Bf16,
            _ => SourceDtype::F32,
        };
        (t.to_f32().expect("float tensor"), src, t.shape.to_vec())
    }

    fn prefixes(f: &SafetensorsFile, start: &str) -> Vec<String> {
        let mut p: Vec<String> = f
            .names()
            .filter(|n| n.starts_with(start) && n.ends_with(".w"))
            .map(|n| n.trim_end_matches(".w").to_string())
            .collect();
        p.sort();
        p
    }

    #[test]
    fn e4m3_roundtrip_and_ties() {
        for b in 0u8..127 {
            assert_eq!(f32_to_e4m3(e4m3_to_f32(b)), b, "code {b}");
        }
        assert_eq!(e4m3_to_f32(126), 448.0);
        assert!(e4m3_to_f32(0x7F).is_nan());
        assert_eq!(f32_to_e4m3(1000.0), 126);
        // 1.0625 lies halfway between 1.0 (code 56, even) and 1.125 (code 57)
        assert_eq!(f32_to_e4m3(1.0625), 56);
    }

    #[test]
    fn e2m1_ties_go_toward_zero() {
        let cases = [
            (0.25, 0),
            (0.75, 1),
            (1.25, 2),
            (1.75, 3),
            (2.5, 4),
            (3.5, 5),
            (5.0, 6),
        ];
        for (x, c) in cases {
            assert_eq!(f32_to_e2m1(x), c, "{x}");
            assert_eq!(f32_to_e2m1(-x), if c == 0 { 0 } else { c | 8 }, "-{x}");
        }
        assert_eq!(f32_to_e2m1(-0.1), 0);
        assert_eq!(f32_to_e2m1(7.0), 7);
    }

    #[test]
    fn nvfp4_matches_mlx_bit_for_bit() {
        let f = vectors();
        let names = prefixes(&f, "nvfp4_");
        assert_eq!(names.len(), 12);
        for p in names {
            let (w, src, shape) = load(&f, &format!("{p}.w"));
            let gs = f
                .tensor(&format!("{p}.global_scale"))
                .ok()
                .map(|t| t.to_f32().expect("f32")[0]);
            let q = quantize_nvfp4(&w, shape[1], src, gs).expect("quantise");
            let codes = f
                .tensor(&format!("{p}.codes"))
                .expect("codes")
                .to_u32()
                .expect("u32");
            let scales = f
                .tensor(&format!("{p}.scales"))
                .expect("scales")
                .bytes
                .to_vec();
            assert_eq!(q.scales, scales, "{p} scales");
            assert_eq!(q.codes, codes, "{p} codes");
            let (deq, _, _) = load(&f, &format!("{p}.deq"));
            let mine = dequantize_nvfp4(&q, gs);
            assert_eq!(mine.len(), deq.len());
            for (i, (a, b)) in mine.iter().zip(&deq).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "{p} dequantised element {i}: {a} vs {b}"
                );
            }
        }
    }

    #[test]
    fn affine_matches_mlx_bit_for_bit() {
        let f = vectors();
        let names = prefixes(&f, "affine");
        assert_eq!(names.len(), 12);
        for p in names {
            let bits = if p.starts_with("affine4") { 4 } else { 8 };
            let (w, src, shape) = load(&f, &format!("{p}.w"));
            let q = quantize_affine(&w, shape[1], 64, bits, src).expect("quantise");
            let codes = f
                .tensor(&format!("{p}.codes"))
                .expect("codes")
                .to_u32()
                .expect("u32");
            assert_eq!(q.codes, codes, "{p} codes");
            let (scales, _, _) = load(&f, &format!("{p}.scales"));
            let (biases, _, _) = load(&f, &format!("{p}.biases"));
            assert_eq!(q.scales, scales, "{p} scales");
            assert_eq!(q.biases, biases, "{p} biases");
            let (deq, _, _) = load(&f, &format!("{p}.deq"));
            let mine = dequantize_affine(&q, src);
            for (i, (a, b)) in mine.iter().zip(&deq).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "{p} dequantised element {i}: {a} vs {b}"
                );
            }
        }
    }

    #[test]
    fn shape_errors_are_reported() {
        assert!(matches!(
            quantize_nvfp4(&[0.0; 24], 24, SourceDtype::F32, None),
            Err(QuantError::BadShape { .. })
        ));
        assert_eq!(
            quantize_affine(&[0.0; 64], 64, 64, 3, SourceDtype::F32),
            Err(QuantError::BadBits(3))
        );
    }
}
