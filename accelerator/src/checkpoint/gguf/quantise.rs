//! Simple quantisers into ggml's block types, for tests that need files of those types (the
//! blocks are valid and close to the values; not ggml's error-minimising searches, which no
//! test here depends on: every check compares against the dequantised values of the very
//! blocks written).

use half::f16;

use super::types::GgmlType;

fn half(x: f32) -> [u8; 2] {
    f16::from_f32(x).to_bits().to_le_bytes()
}

/// Pseudo-random bytes (a fixed hash of the index and `seed`): blocks' fields for tests.
pub fn bytes(n: usize, seed: u32) -> Vec<u8> {
    (0..n)
        .map(|i| {
            let h = (i as u32 ^ seed.wrapping_mul(40503)).wrapping_mul(2654435761);
            (h >> 11) as u8
        })
        .collect()
}

/// `x` (a whole number of blocks of `t`) as `t`'s blocks; `None` for a type not written here.
pub fn quantise(t: GgmlType, x: &[f32]) -> Option<Vec<u8>> {
    let (len, _) = t.block()?;
    let each: fn(&[f32], &mut Vec<u8>) = match t {
        GgmlType::Q8_0 => q8_0,
        GgmlType::Q5_0 => q5_0,
        GgmlType::Q5_1 => q5_1,
        GgmlType::Q4K => |x, out| k_quant(x, out, 15),
        GgmlType::Q5K => |x, out| k_quant(x, out, 31),
        GgmlType::Q6K => q6_k,
        _ => return None,
    };
    let mut out = Vec::new();
    for block in x.chunks_exact(len as usize) {
        each(block, &mut out);
    }
    Some(out)
}

fn q8_0(x: &[f32], out: &mut Vec<u8>) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = f16::from_f32(amax / 127.0).to_f32();
    out.extend(half(d));
    for &v in x {
        let q = if d > 0.0 { (v / d).round() } else { 0.0 };
        out.push(q.clamp(-127.0, 127.0) as i8 as u8);
    }
}

/// The 5-bit codes of a Q5_0/Q5_1 block: `qh` (bit `j`: element `j`'s fifth bit), then the
/// low nibbles (element `j` low in byte `j % 16`, `j ≥ 16` high).
fn five_bit(codes: &[u8; 32], out: &mut Vec<u8>) {
    let qh = codes
        .iter()
        .enumerate()
        .fold(0u32, |h, (j, &c)| h | (u32::from(c >> 4) << j));
    out.extend(qh.to_le_bytes());
    for j in 0..16 {
        out.push((codes[j] & 0x0F) | ((codes[j + 16] & 0x0F) << 4));
    }
}

fn q5_0(x: &[f32], out: &mut Vec<u8>) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = f16::from_f32(amax / 15.0).to_f32();
    out.extend(half(d));
    let mut codes = [0u8; 32];
    for (c, &v) in codes.iter_mut().zip(x) {
        let q = if d > 0.0 { (v / d).round() } else { 0.0 };
        *c = (q + 16.0).clamp(0.0, 31.0) as u8;
    }
    five_bit(&codes, out);
}

fn q5_1(x: &[f32], out: &mut Vec<u8>) {
    let min = x.iter().copied().fold(f32::MAX, f32::min);
    let max = x.iter().copied().fold(f32::MIN, f32::max);
    let d = f16::from_f32((max - min) / 31.0).to_f32();
    let m = f16::from_f32(min).to_f32();
    out.extend(half(d));
    out.extend(half(m));
    let mut codes = [0u8; 32];
    for (c, &v) in codes.iter_mut().zip(x) {
        let q = if d > 0.0 { ((v - m) / d).round() } else { 0.0 };
        *c = q.clamp(0.0, 31.0) as u8;
    }
    five_bit(&codes, out);
}

/// Q4_K (`top` 15) or Q5_K (`top` 31): eight sub-blocks of 32, each `d·sc·q − dmin·m` with
/// 6-bit `sc` and `m`.
fn k_quant(x: &[f32], out: &mut Vec<u8>, top: u8) {
    let mut scale = [0f32; 8];
    let mut low = [0f32; 8];
    for (j, sub) in x.chunks_exact(32).enumerate() {
        let min = sub.iter().copied().fold(0f32, f32::min);
        let max = sub.iter().copied().fold(f32::MIN, f32::max);
        scale[j] = (max - min) / f32::from(top);
        low[j] = -min;
    }
    let d = f16::from_f32(scale.iter().fold(0f32, |a, &b| a.max(b)) / 63.0).to_f32();
    let dmin = f16::from_f32(low.iter().fold(0f32, |a, &b| a.max(b)) / 63.0).to_f32();
    let six = |v: f32, unit: f32| {
        if unit > 0.0 {
            (v / unit).round().clamp(0.0, 63.0) as u8
        } else {
            0
        }
    };
    let sc: Vec<u8> = scale.iter().map(|&s| six(s, d)).collect();
    let m: Vec<u8> = low.iter().map(|&l| six(l, dmin)).collect();
    out.extend(half(d));
    out.extend(half(dmin));
    let mut packed = [0u8; 12];
    for j in 0..4 {
        packed[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        packed[j + 4] = m[j] | ((m[j + 4] >> 4) << 6);
        packed[j + 8] = (sc[j + 4] & 0x0F) | ((m[j + 4] & 0x0F) << 4);
    }
    out.extend(packed);
    let mut codes = [0u8; 256];
    for (e, c) in codes.iter_mut().enumerate() {
        let j = e / 32;
        let (s, b) = (d * f32::from(sc[j]), dmin * f32::from(m[j]));
        let q = if s > 0.0 {
            ((x[e] + b) / s).round()
        } else {
            0.0
        };
        *c = q.clamp(0.0, f32::from(top)) as u8;
    }
    if top == 31 {
        let mut qh = [0u8; 32];
        for (e, &c) in codes.iter().enumerate() {
            qh[e % 32] |= (c >> 4) << (e / 32);
        }
        out.extend(qh);
    }
    // In each 64-element chunk, byte `l` holds element `l` (low) and `l + 32` (high).
    for chunk in codes.chunks_exact(64) {
        for l in 0..32 {
            out.push((chunk[l] & 0x0F) | ((chunk[l + 32] & 0x0F) << 4));
        }
    }
}

/// Q6_K: sixteen sub-blocks of 16, `d·sc·(q − 32)` with an int8 `sc`.
fn q6_k(x: &[f32], out: &mut Vec<u8>) {
    let scale: Vec<f32> = x
        .chunks_exact(16)
        .map(|sub| sub.iter().fold(0f32, |m, v| m.max(v.abs())) / 31.0)
        .collect();
    let d = f16::from_f32(scale.iter().fold(0f32, |a, &b| a.max(b)) / 127.0).to_f32();
    let sc: Vec<i8> = scale
        .iter()
        .map(|&s| {
            if d > 0.0 {
                (s / d).round().clamp(-127.0, 127.0) as i8
            } else {
                0
            }
        })
        .collect();
    let mut codes = [0u8; 256];
    for (e, c) in codes.iter_mut().enumerate() {
        let s = d * f32::from(sc[e / 16]);
        let q = if s != 0.0 { (x[e] / s).round() } else { 0.0 };
        *c = (q + 32.0).clamp(0.0, 63.0) as u8;
    }
    let (mut ql, mut qh) = ([0u8; 128], [0u8; 64]);
    for (e, &c) in codes.iter().enumerate() {
        let (a, r) = (e / 128, e % 128);
        ql[64 * a + r % 64] |= (c & 0x0F) << (4 * (r / 64));
        qh[32 * a + r % 32] |= (c >> 4) << (2 * (r / 32));
    }
    out.extend(ql);
    out.extend(qh);
    out.extend(sc.iter().map(|&s| s as u8));
    out.extend(half(d));
}

/// The values of `t`'s blocks in float32 as ggml dequantises them (the types [`quantise`]
/// writes).
pub fn dequantise(t: GgmlType, bytes: &[u8]) -> Option<Vec<f32>> {
    match t {
        GgmlType::Q8_0 => Some(
            bytes
                .chunks_exact(34)
                .flat_map(|b| {
                    let d = super::float::f16_at(b, 0);
                    b[2..].iter().map(move |&q| f32::from(q as i8) * d)
                })
                .collect(),
        ),
        _ => super::kquants::dequantise::<f32>(t, bytes),
    }
}

#[cfg(test)]
mod tests {
    use super::super::kquants;
    use super::*;

    /// What is written reads back (through the reference dequantisers) close to the values.
    #[test]
    fn quantised_blocks_read_back_close_to_their_values() {
        let x: Vec<f32> = (0..512)
            .map(|i| ((i * 7919 % 1000) as f32 / 1000.0 - 0.5) * 0.04)
            .collect();
        for (t, levels) in [
            (GgmlType::Q5_0, 31.0),
            (GgmlType::Q5_1, 31.0),
            (GgmlType::Q4K, 15.0),
            (GgmlType::Q5K, 31.0),
            (GgmlType::Q6K, 63.0),
        ] {
            let bytes = quantise(t, &x).expect("written");
            let back = kquants::dequantise::<f32>(t, &bytes).expect("read");
            let worst = x
                .iter()
                .zip(&back)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            // Half a step of a range of 0.04 (a little more: the scales are rounded too).
            assert!(worst < 0.04 / levels, "{t}: {worst}");
        }
    }
}
