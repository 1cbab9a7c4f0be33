//! ggml's K-quants (256-element super-blocks of 16 or 32 sub-blocks, each with its own small
//! integer scale): dequantised to float at load.
//!
//! Their sub-block scales are products of an f16 and a 4- or 6-bit integer, which neither f16
//! nor bf16 holds exactly, and Q6_K's sub-blocks are 16 long, shorter than MLX's smallest group;
//! so unlike Q4_0, Q4_1 and Q8_0 they have no exact MLX affine form. Each function computes in
//! f32 in the order ggml's (and gguf-py's) reference dequantisers do, so the values agree bit
//! for bit before the final rounding to the requested dtype.

use super::blocks;
use super::float::{f16_at, Float};
use super::types::{GgmlType, QK_K};

const N: usize = QK_K as usize;

/// A block dequantiser: one block's bytes into its elements.
type Dequantise = fn(&[u8], &mut [f32]);

/// `(elements per block, dequantiser)` of a type this reader dequantises at load.
fn dequantiser(ggml_type: GgmlType) -> Option<(usize, Dequantise)> {
    Some(match ggml_type {
        GgmlType::Q5_0 => (blocks::BLOCK, blocks::q5_0),
        GgmlType::Q5_1 => (blocks::BLOCK, blocks::q5_1),
        GgmlType::Q8_1 => (blocks::BLOCK, blocks::q8_1),
        GgmlType::Q2K => (N, q2_k),
        GgmlType::Q3K => (N, q3_k),
        GgmlType::Q4K => (N, q4_k),
        GgmlType::Q5K => (N, q5_k),
        GgmlType::Q6K => (N, q6_k),
        GgmlType::Q8K => (N, q8_k),
        _ => return None,
    })
}

/// Every element of a tensor of a dequantised type, in `T` (`None` for another type). `bytes`
/// holds whole blocks (checked at open).
pub(super) fn dequantise<T: Float>(ggml_type: GgmlType, bytes: &[u8]) -> Option<Vec<T>> {
    let (len, each) = dequantiser(ggml_type)?;
    let (_, block_bytes) = ggml_type.block()?;
    let chunks = bytes.chunks_exact(block_bytes as usize);
    let mut out = Vec::with_capacity(chunks.len() * len);
    // One block at a time through a small f32 buffer, so a large tensor never has a second,
    // f32 copy beside the one in `T`.
    let mut buf = [0f32; N];
    for block in chunks {
        each(block, &mut buf[..len]);
        out.extend(buf[..len].iter().map(|&x| T::from_f32(x)));
    }
    Some(out)
}

/// Q2_K (84 bytes: 16 scale bytes, 64 bytes of 2-bit codes, f16 `d`, f16 `dmin`). Each scale
/// byte holds a sub-block's 4-bit scale (low) and 4-bit min (high); element
/// `128h + 32s + l` is bits `2s..2s + 2` of code byte `32h + l`.
fn q2_k(b: &[u8], out: &mut [f32]) {
    let (scales, qs) = (&b[0..16], &b[16..80]);
    let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
    for (e, y) in out.iter_mut().enumerate() {
        let (h, s, l) = (e / 128, (e / 32) % 4, e % 32);
        let q = (qs[32 * h + l] >> (2 * s)) & 3;
        let sc = scales[e / 16];
        let dl = d * f32::from(sc & 0x0F);
        let ml = dmin * f32::from(sc >> 4);
        *y = dl * f32::from(q) - ml;
    }
}

/// Q3_K (110 bytes: 32 bytes of high bits, 64 bytes of 2-bit codes, 12 bytes of 6-bit scales,
/// f16 `d`). The code of element `e` is its two low bits (as in Q2_K) minus 4 where its bit in
/// the high mask (bit `e / 32` of byte `e % 32`) is clear; scale `i` is the nibble
/// `i / 8` of byte `i % 8` with, above it, bits `2(i / 4)..` of byte `8 + i % 4`, minus 32.
fn q3_k(b: &[u8], out: &mut [f32]) {
    let (hmask, qs, packed) = (&b[0..32], &b[32..96], &b[96..108]);
    let d = f16_at(b, 108);
    let mut dl = [0f32; 16];
    for (i, dl) in dl.iter_mut().enumerate() {
        let low = (packed[i % 8] >> (4 * (i / 8))) & 0x0F;
        let high = (packed[8 + i % 4] >> (2 * (i / 4))) & 0x03;
        let scale = i32::from(low | (high << 4)) - 32;
        *dl = d * scale as f32;
    }
    for (e, y) in out.iter_mut().enumerate() {
        let (h, s, l) = (e / 128, (e / 32) % 4, e % 32);
        let low = i32::from((qs[32 * h + l] >> (2 * s)) & 3);
        let high_set = (hmask[e % 32] >> (e / 32)) & 1 == 1;
        let q = if high_set { low } else { low - 4 };
        *y = dl[e / 16] * q as f32;
    }
}

/// Q4_K's and Q5_K's 12 bytes of eight 6-bit scales and eight 6-bit mins. Sub-blocks 0–3 take
/// the low six bits of bytes 0–3 (scales) and 4–7 (mins); sub-blocks 4–7 take a nibble of bytes
/// 8–11 (low: scale, high: min) with the top two bits of bytes 0–3 (scales) or 4–7 (mins).
pub(super) fn scales_and_mins(p: &[u8]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut m = [0u8; 8];
    for j in 0..4 {
        sc[j] = p[j] & 0x3F;
        m[j] = p[j + 4] & 0x3F;
        sc[j + 4] = (p[j + 8] & 0x0F) | ((p[j] >> 6) << 4);
        m[j + 4] = (p[j + 8] >> 4) | ((p[j + 4] >> 6) << 4);
    }
    (sc, m)
}

/// The low four bits of Q4_K's and Q5_K's element `e`: in each 64-element chunk `c`, the low
/// nibbles of bytes `32c..32c + 32` then their high nibbles.
pub(super) fn nibble(qs: &[u8], e: usize) -> u8 {
    let (c, h, l) = (e / 64, (e / 32) % 2, e % 32);
    (qs[32 * c + l] >> (4 * h)) & 0x0F
}

/// Q4_K (144 bytes: f16 `d`, f16 `dmin`, 12 scale bytes, 128 bytes of nibbles): eight
/// sub-blocks of 32, `w = d · sc · q − dmin · m`.
fn q4_k(b: &[u8], out: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (sc, m) = scales_and_mins(&b[4..16]);
    let qs = &b[16..144];
    for (e, y) in out.iter_mut().enumerate() {
        let sub = e / 32;
        let dl = d * f32::from(sc[sub]);
        let ml = dmin * f32::from(m[sub]);
        *y = dl * f32::from(nibble(qs, e)) - ml;
    }
}

/// Q5_K (176 bytes: as Q4_K with 32 bytes of fifth bits before the nibbles; element `e`'s is
/// bit `e / 32` of byte `e % 32`).
fn q5_k(b: &[u8], out: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (sc, m) = scales_and_mins(&b[4..16]);
    let (qh, qs) = (&b[16..48], &b[48..176]);
    for (e, y) in out.iter_mut().enumerate() {
        let sub = e / 32;
        let dl = d * f32::from(sc[sub]);
        let ml = dmin * f32::from(m[sub]);
        let fifth = (qh[e % 32] >> (e / 32)) & 1;
        *y = dl * f32::from(nibble(qs, e) | (fifth << 4)) - ml;
    }
}

/// Q6_K (210 bytes: 128 bytes of low nibbles, 64 bytes of high bit pairs, 16 × i8 scales,
/// f16 `d`): sixteen sub-blocks of 16, `w = d · sc · (q − 32)`. In each half `a` of 128,
/// element `128a + 64h + m` has the nibble `h` of low byte `64a + m`, and element
/// `128a + 32s + l` the bit pair `s` of high byte `32a + l`.
fn q6_k(b: &[u8], out: &mut [f32]) {
    let (ql, qh, scales) = (&b[0..128], &b[128..192], &b[192..208]);
    let d = f16_at(b, 208);
    for (e, y) in out.iter_mut().enumerate() {
        let (a, r) = (e / 128, e % 128);
        let low = (ql[64 * a + r % 64] >> (4 * (r / 64))) & 0x0F;
        let high = (qh[32 * a + r % 32] >> (2 * (r / 32))) & 0x03;
        let q = i32::from(low | (high << 4)) - 32;
        let dl = d * f32::from(scales[e / 16] as i8);
        *y = dl * q as f32;
    }
}

/// Q8_K (292 bytes: f32 `d`, 256 × i8, 16 × i16 sums for ggml's dot products): `w = d · q`.
fn q8_k(b: &[u8], out: &mut [f32]) {
    let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    for (y, &q) in out.iter_mut().zip(&b[4..260]) {
        *y = d * f32::from(q as i8);
    }
}

#[cfg(test)]
mod tests {
    use super::super::quantise::bytes;
    use super::*;
    use half::{bf16, f16};

    fn half(x: f32) -> Vec<u8> {
        f16::from_f32(x).to_bits().to_le_bytes().to_vec()
    }

    fn run(f: Dequantise, block: &[u8]) -> Vec<f32> {
        let mut out = vec![0f32; N];
        f(block, &mut out);
        out
    }

    // The expectations below restate ggml's reference loops (dequantize_row_q*_K in
    // ggml-quants.c) in their own shape, independent of the element-indexed code above.

    #[test]
    fn q2_k_matches_the_reference_loop() {
        let block = [bytes(16, 1), bytes(64, 2), half(0.125), half(-0.03)].concat();
        let (d, dmin) = (f16_at(&block, 80), f16_at(&block, 82));
        let mut want = Vec::new();
        let mut is = 0;
        for n in 0..2 {
            let q = &block[16 + 32 * n..];
            for shift in [0, 2, 4, 6] {
                for half in 0..2 {
                    let sc = block[is];
                    is += 1;
                    for l in 0..16 {
                        let code = (q[16 * half + l] >> shift) & 3;
                        let (dl, ml) = (d * (sc & 15) as f32, dmin * (sc >> 4) as f32);
                        want.push(dl * code as f32 - ml);
                    }
                }
            }
        }
        assert_eq!(run(q2_k, &block), want);
    }

    #[test]
    fn q3_k_matches_the_reference_loop() {
        let block = [bytes(32, 3), bytes(64, 4), bytes(12, 5), half(0.0625)].concat();
        let d = f16_at(&block, 108);
        // ggml unpacks the scales as four u32 words with masks.
        let mut aux = [0u32; 4];
        for (i, w) in aux.iter_mut().take(3).enumerate() {
            let p = &block[96 + 4 * i..];
            *w = u32::from_le_bytes([p[0], p[1], p[2], p[3]]);
        }
        let (k1, k2, tmp) = (0x0303_0303u32, 0x0f0f_0f0fu32, aux[2]);
        aux[2] = ((aux[0] >> 4) & k2) | (((tmp >> 4) & k1) << 4);
        aux[3] = ((aux[1] >> 4) & k2) | (((tmp >> 6) & k1) << 4);
        aux[0] = (aux[0] & k2) | ((tmp & k1) << 4);
        aux[1] = (aux[1] & k2) | (((tmp >> 2) & k1) << 4);
        let scales: Vec<i8> = aux
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .map(|b| b as i8)
            .collect();
        let mut want = Vec::new();
        let (mut is, mut m) = (0, 1u8);
        for n in 0..2 {
            let q = &block[32 + 32 * n..];
            for shift in [0, 2, 4, 6] {
                for half in 0..2 {
                    let dl = d * (scales[is] as i32 - 32) as f32;
                    is += 1;
                    for l in 0..16 {
                        let i = 16 * half + l;
                        let low = ((q[i] >> shift) & 3) as i32;
                        let high = if block[i] & m != 0 { 0 } else { 4 };
                        want.push(dl * (low - high) as f32);
                    }
                }
                m <<= 1;
            }
        }
        assert_eq!(run(q3_k, &block), want);
    }

    /// ggml's `get_scale_min_k4`.
    fn scale_min(j: usize, q: &[u8]) -> (u8, u8) {
        if j < 4 {
            (q[j] & 63, q[j + 4] & 63)
        } else {
            (
                (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
                (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
            )
        }
    }

    #[test]
    fn q4_k_and_q5_k_match_the_reference_loops() {
        let head = [half(0.01), half(0.02), bytes(12, 6)].concat();
        let (qh, qs) = (bytes(32, 7), bytes(128, 8));
        let (d, dmin) = (f16_at(&head, 0), f16_at(&head, 2));
        let (mut want4, mut want5) = (Vec::new(), Vec::new());
        let (mut u1, mut u2) = (1u8, 2u8);
        for j in 0..4 {
            let (sc1, m1) = scale_min(2 * j, &head[4..]);
            let (sc2, m2) = scale_min(2 * j + 1, &head[4..]);
            let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
            let (d2, m2) = (d * sc2 as f32, dmin * m2 as f32);
            let q = &qs[32 * j..];
            for l in 0..32 {
                want4.push(d1 * (q[l] & 0xF) as f32 - m1);
                let h = if qh[l] & u1 != 0 { 16 } else { 0 };
                want5.push(d1 * ((q[l] & 0xF) + h) as f32 - m1);
            }
            for l in 0..32 {
                want4.push(d2 * (q[l] >> 4) as f32 - m2);
                let h = if qh[l] & u2 != 0 { 16 } else { 0 };
                want5.push(d2 * ((q[l] >> 4) + h) as f32 - m2);
            }
            u1 <<= 2;
            u2 <<= 2;
        }
        assert_eq!(run(q4_k, &[&head[..], &qs].concat()), want4);
        assert_eq!(run(q5_k, &[&head[..], &qh, &qs].concat()), want5);
    }

    #[test]
    fn q6_k_matches_the_reference_loop() {
        let block = [bytes(128, 9), bytes(64, 10), bytes(16, 11), half(0.004)].concat();
        let d = f16_at(&block, 208);
        let mut want = vec![0f32; N];
        for n in 0..2 {
            let (ql, qh) = (&block[64 * n..], &block[128 + 32 * n..]);
            let sc = |i: usize| d * (block[192 + 8 * n + i] as i8) as f32;
            for l in 0..32 {
                let is = l / 16;
                let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
                let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                let y = &mut want[128 * n..];
                y[l] = sc(is) * q1 as f32;
                y[l + 32] = sc(is + 2) * q2 as f32;
                y[l + 64] = sc(is + 4) * q3 as f32;
                y[l + 96] = sc(is + 6) * q4 as f32;
            }
        }
        assert_eq!(run(q6_k, &block), want);
    }

    #[test]
    fn q8_k_is_its_scale_times_its_codes() {
        let block = [0.5f32.to_le_bytes().to_vec(), bytes(256, 12), vec![0; 32]].concat();
        let got = run(q8_k, &block);
        for (e, y) in got.iter().enumerate() {
            assert_eq!(*y, 0.5 * (block[4 + e] as i8) as f32);
        }
    }

    #[test]
    fn dequantise_converts_whole_tensors_to_the_requested_dtype() {
        let block = [bytes(128, 9), bytes(64, 10), bytes(16, 11), half(0.004)].concat();
        let two = [block.clone(), block.clone()].concat();
        let f32s = dequantise::<f32>(GgmlType::Q6K, &two).expect("Q6_K dequantises");
        let bf16s = dequantise::<bf16>(GgmlType::Q6K, &two).expect("Q6_K dequantises");
        assert_eq!(f32s.len(), 2 * N);
        assert_eq!(f32s[..N], run(q6_k, &block)[..]);
        assert_eq!(f32s[..N], f32s[N..]);
        assert!(bf16s
            .iter()
            .zip(&f32s)
            .all(|(b, f)| *b == bf16::from_f32(*f)));
        assert!(dequantise::<f32>(GgmlType::Q4_0, &two).is_none());
    }
}
