//! Little-endian encodings of value slices, and rounding through bf16.

use half::bf16;

/// Little-endian bytes of f32 values.
pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len() * 4);
    for x in v {
        out.extend_from_slice(&x.to_le_bytes());
    }
    out
}

/// Little-endian bytes of f32 values rounded to bf16 (nearest, ties to even).
pub fn bf16_bytes(v: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len() * 2);
    for x in v {
        out.extend_from_slice(&bf16::from_f32(*x).to_bits().to_le_bytes());
    }
    out
}

/// Little-endian bytes of u32 values.
pub fn u32_bytes(v: &[u32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len() * 4);
    for x in v {
        out.extend_from_slice(&x.to_le_bytes());
    }
    out
}

/// Round every value to the nearest bf16 (ties to even), keeping it as f32.
pub fn round_through_bf16(v: &mut [f32]) {
    for x in v {
        *x = bf16::from_f32(*x).to_f32();
    }
}

/// The largest magnitude in `v` (0 for an empty slice; NaNs are ignored).
pub fn absmax(v: &[f32]) -> f32 {
    v.iter().fold(0f32, |m, x| m.max(x.abs()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings_are_little_endian() {
        assert_eq!(f32_bytes(&[1.0]), vec![0, 0, 0x80, 0x3f]);
        assert_eq!(bf16_bytes(&[1.0, -2.0]), vec![0x80, 0x3f, 0x00, 0xc0]);
        assert_eq!(u32_bytes(&[0xDEADBEEF]), vec![0xEF, 0xBE, 0xAD, 0xDE]);
        let mut v = [1.0 + 1.0 / 512.0, 3.0];
        round_through_bf16(&mut v);
        assert_eq!(v, [1.0, 3.0]);
        assert_eq!(absmax(&[-3.0, 2.0]), 3.0);
    }
}
