//! ggml's 32-element block formats: Q4_0, Q4_1 and Q8_0 repacked into MLX's affine layout
//! (exactly: the same codes, scales and offsets), and Q5_0, Q5_1 and Q8_1 dequantised.
//!
//! MLX's affine quantisation computes `w = scale · q + bias` per group of `group_size` codes,
//! the codes packed low bits first into little-endian uint32 words (for 4 bits, element `8k + j`
//! of a row in bits `4j..4j + 4` of word `k`; for 8 bits, element `4k + j` in byte `j`). With a
//! group of 32 one ggml block is one MLX group:
//! - Q4_0 `w = d · (q − 8)`: scale `d`, bias `−8d`;
//! - Q4_1 `w = d · q + m`: scale `d`, bias `m`;
//! - Q8_0 `w = d · q`, `q` signed: codes `q + 128`, scale `d`, bias `−128d`.

use super::float::{f16_at, Float};
use super::types::GgmlType;

/// Elements per block of every format here.
pub const BLOCK: usize = 32;

/// Codes, scales and biases of an affine tensor, in the order of its blocks.
pub(super) struct AffineParts<T> {
    /// `elements · bits / 32` words.
    pub codes: Vec<u32>,
    /// One per block.
    pub scales: Vec<T>,
    pub biases: Vec<T>,
}

/// Repacks the blocks of a Q4_0, Q4_1 or Q8_0 tensor (`None` for any other type). `bytes`
/// holds whole blocks (checked at open).
pub(super) fn affine<T: Float>(ggml_type: GgmlType, bytes: &[u8]) -> Option<AffineParts<T>> {
    let (block_bytes, words) = match ggml_type {
        GgmlType::Q4_0 => (18, 4),
        GgmlType::Q4_1 => (20, 4),
        GgmlType::Q8_0 => (34, 8),
        _ => return None,
    };
    let blocks = bytes.len() / block_bytes;
    let mut parts = AffineParts {
        codes: Vec::with_capacity(blocks * words),
        scales: Vec::with_capacity(blocks),
        biases: Vec::with_capacity(blocks),
    };
    for block in bytes.chunks_exact(block_bytes) {
        let d = f16_at(block, 0);
        match ggml_type {
            GgmlType::Q4_0 => {
                push_nibbles(&mut parts.codes, &block[2..18]);
                parts.scales.push(T::from_f32(d));
                parts.biases.push(T::from_f32(-8.0 * d));
            }
            GgmlType::Q4_1 => {
                push_nibbles(&mut parts.codes, &block[4..20]);
                parts.scales.push(T::from_f32(d));
                parts.biases.push(T::from_f32(f16_at(block, 2)));
            }
            _ => {
                // Flipping the sign bit is adding 128 to a two's-complement byte.
                for q in block[2..34].chunks_exact(4) {
                    let unsigned = [q[0] ^ 0x80, q[1] ^ 0x80, q[2] ^ 0x80, q[3] ^ 0x80];
                    parts.codes.push(u32::from_le_bytes(unsigned));
                }
                parts.scales.push(T::from_f32(d));
                parts.biases.push(T::from_f32(-128.0 * d));
            }
        }
    }
    Some(parts)
}

/// ggml's 16 bytes of nibbles (element `j` in the low nibble of byte `j`, element `j + 16` in
/// its high nibble) as MLX's four words (elements in order, four bits each, low bits first).
fn push_nibbles(codes: &mut Vec<u32>, qs: &[u8]) {
    let element = |e: usize| {
        if e < 16 {
            u32::from(qs[e] & 0x0F)
        } else {
            u32::from(qs[e - 16] >> 4)
        }
    };
    for word in 0..4 {
        let mut w = 0u32;
        for j in 0..8 {
            w |= element(8 * word + j) << (4 * j);
        }
        codes.push(w);
    }
}

/// The 5-bit codes of a Q5_0 or Q5_1 block: the low nibbles as in Q4_0, bit `j` of the 32-bit
/// `qh` the fifth bit of element `j`.
fn five_bit(qh: &[u8], qs: &[u8], out: &mut [f32], map: impl Fn(u32) -> f32) {
    let high = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    for (j, y) in out.iter_mut().enumerate().take(BLOCK) {
        let low = if j < 16 {
            qs[j] & 0x0F
        } else {
            qs[j - 16] >> 4
        };
        let q = u32::from(low) | (((high >> j) & 1) << 4);
        *y = map(q);
    }
}

/// Q5_0 (22 bytes: f16 `d`, 4 bytes `qh`, 16 bytes `qs`): `w = d · (q − 16)`.
pub(super) fn q5_0(block: &[u8], out: &mut [f32]) {
    let d = f16_at(block, 0);
    five_bit(&block[2..6], &block[6..22], out, |q| {
        d * (q as i32 - 16) as f32
    });
}

/// Q5_1 (24 bytes: f16 `d`, f16 `m`, 4 bytes `qh`, 16 bytes `qs`): `w = d · q + m`.
pub(super) fn q5_1(block: &[u8], out: &mut [f32]) {
    let (d, m) = (f16_at(block, 0), f16_at(block, 2));
    five_bit(&block[4..8], &block[8..24], out, |q| d * q as f32 + m);
}

/// Q8_1 (36 bytes: f16 `d`, f16 sum, 32 × i8): `w = d · q` (the sum only serves ggml's dot
/// products).
pub(super) fn q8_1(block: &[u8], out: &mut [f32]) {
    let d = f16_at(block, 0);
    for (y, &q) in out.iter_mut().zip(&block[4..36]) {
        *y = d * f32::from(q as i8);
    }
}

#[cfg(test)]
mod tests {
    use half::f16;
    use mlx_rs::{ops, Array};

    use super::*;

    /// Pseudo-random code bytes (a fixed hash of the index and `seed`).
    fn codes(n: usize, seed: u32) -> Vec<u8> {
        (0..n)
            .map(|i| {
                let h = (i as u32 ^ seed.wrapping_mul(40503)).wrapping_mul(2654435761);
                (h >> 13) as u8
            })
            .collect()
    }

    fn half(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_bits().to_le_bytes()
    }

    /// `rows` rows of `blocks_per_row` blocks each, each block `make(index)`.
    fn tensor(rows: usize, per_row: usize, make: impl Fn(usize) -> Vec<u8>) -> Vec<u8> {
        (0..rows * per_row).flat_map(make).collect()
    }

    /// Through MLX's own dequantize: the repacked parts give back the scalar formula exactly.
    fn check_affine(ggml_type: GgmlType, bytes: &[u8], rows: i32, cols: i32, want: &[f32]) {
        let bits = ggml_type.affine_bits().expect("an affine type");
        let parts = affine::<f32>(ggml_type, bytes).expect("an affine type");
        let w = Array::from_slice(&parts.codes, &[rows, cols * bits / 32]);
        let s = Array::from_slice(&parts.scales, &[rows, cols / 32]);
        let b = Array::from_slice(&parts.biases, &[rows, cols / 32]);
        let got = ops::dequantize(&w, &s, &b, 32, bits).expect("dequantize");
        assert_eq!(got.shape(), &[rows, cols]);
        let got = got.as_slice::<f32>();
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert_eq!(g, w, "{ggml_type} element {i}");
        }
    }

    #[test]
    fn q4_0_repacks_exactly_onto_mlx_affine() {
        let ds = [0.5f32, -0.0375, 3.25, 1e-3, -2.0, 0.125];
        let bytes = tensor(2, 3, |b| [&half(ds[b])[..], &codes(16, b as u32)].concat());
        let mut want = Vec::new();
        for (b, block) in bytes.chunks_exact(18).enumerate() {
            let d = f16::from_f32(ds[b]).to_f32();
            for j in 0..32 {
                let q = if j < 16 {
                    block[2 + j] & 15
                } else {
                    block[2 + j - 16] >> 4
                };
                want.push(d * (q as f32 - 8.0));
            }
        }
        check_affine(GgmlType::Q4_0, &bytes, 2, 96, &want);
    }

    #[test]
    fn q4_1_repacks_exactly_onto_mlx_affine() {
        let dm = [(0.25f32, -1.5f32), (0.01, 0.3), (-0.5, 2.0), (1.0, 0.0)];
        let bytes = tensor(2, 2, |b| {
            [&half(dm[b].0)[..], &half(dm[b].1), &codes(16, 7 + b as u32)].concat()
        });
        let mut want = Vec::new();
        for (b, block) in bytes.chunks_exact(20).enumerate() {
            let d = f16::from_f32(dm[b].0).to_f32();
            let m = f16::from_f32(dm[b].1).to_f32();
            for j in 0..32 {
                let q = if j < 16 {
                    block[4 + j] & 15
                } else {
                    block[4 + j - 16] >> 4
                };
                want.push(d * q as f32 + m);
            }
        }
        check_affine(GgmlType::Q4_1, &bytes, 2, 64, &want);
    }

    #[test]
    fn q8_0_repacks_exactly_onto_mlx_affine() {
        let ds = [0.02f32, -0.7, 1.5, 0.001];
        let bytes = tensor(4, 1, |b| {
            // Every i8 value appears, the extremes included.
            let qs: Vec<u8> = (0..32).map(|j| (b * 64 + j * 8 + 128) as u8).collect();
            [&half(ds[b])[..], &qs].concat()
        });
        let mut want = Vec::new();
        for (b, block) in bytes.chunks_exact(34).enumerate() {
            let d = f16::from_f32(ds[b]).to_f32();
            want.extend(block[2..].iter().map(|&q| d * (q as i8) as f32));
        }
        check_affine(GgmlType::Q8_0, &bytes, 4, 32, &want);
    }

    #[test]
    fn five_bit_and_q8_1_blocks_follow_the_scalar_formula() {
        let qh = 0xA5C3_0F81u32.to_le_bytes();
        let qs = codes(16, 3);
        let fifth = |j: usize| ((u32::from_le_bytes(qh) >> j) & 1) as u8;
        let code = |j: usize| {
            let low = if j < 16 { qs[j] & 15 } else { qs[j - 16] >> 4 };
            (low | (fifth(j) << 4)) as f32
        };
        let mut out = [0f32; 32];

        let block = [&half(0.375)[..], &qh, &qs].concat();
        q5_0(&block, &mut out);
        for (j, y) in out.iter().enumerate() {
            assert_eq!(*y, 0.375 * (code(j) - 16.0), "Q5_0 element {j}");
        }

        let block = [&half(0.375)[..], &half(-1.25), &qh, &qs].concat();
        q5_1(&block, &mut out);
        for (j, y) in out.iter().enumerate() {
            assert_eq!(*y, 0.375 * code(j) - 1.25, "Q5_1 element {j}");
        }

        let block = [&half(-0.5)[..], &half(9.0), &codes(32, 1)].concat();
        q8_1(&block, &mut out);
        for (j, y) in out.iter().enumerate() {
            assert_eq!(*y, -0.5 * (block[4 + j] as i8) as f32, "Q8_1 element {j}");
        }
    }
}
