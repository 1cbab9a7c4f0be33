//! GGUF's block types decoded straight into the native integer products' packing
//! ([`PackedWeight`]), one row at a time: no float copy of a tensor is ever made
//! (docs/checkpoint-layouts.md, "GGUF blocks on the native path").
//!
//! Every type here is affine per group: `w = scale · q + bias` with unsigned codes `q` (at most
//! 8 bits) and, per 32 inputs (16 for Q6_K), a scale and a bias computed in float32 exactly as
//! ggml's dequantisers compute them, so `scale · q + bias` in float32 is ggml's dequantised value
//! bit for bit (each `scale · q` is exact: the scales have at most 18 significant bits):
//! - Q4_0 `d · (q − 8)`: scale `d`, bias `−8d`; Q4_1 `d · q + m`: scale `d`, bias `m`;
//! - Q8_0 `d · q`, `q` signed: codes `q + 128`, bias `−128d`;
//! - Q5_0 `d · (q − 16)`: bias `−16d`; Q5_1 `d · q + m`: bias `m` (5-bit codes);
//! - Q4_K, Q5_K: per sub-block of 32, scale `d · sc`, bias `−(dmin · m)` (4- or 5-bit codes);
//! - Q6_K: per sub-block of 16, scale `d · sc` (`sc` an int8), bias `−32 · d · sc`, codes the
//!   stored unsigned 6 bits (ggml subtracts 32 from them).
//!
//! The packing holds the 4-bit types' codes as nibbles, the K-quants' scales and free biases as
//! their files do (a small integer times a float16 unit per 256 elements, given beside the
//! values by [`factors`]), and leaves the biases that are a fixed multiple of their scale (Q4_0's,
//! Q5_0's, Q8_0's, Q6_K's: `−32 · s` is exact, a power of two) implicit, all decided from the
//! values (`hunch_kernels::quant`, "The packed weight").

use std::sync::Arc;

use hunch_kernels::quant::{PackedWeight, RowParts};
use memmap2::MmapMut;

use crate::model::linear::RowSource;
use crate::model::ModelError;

use super::error::GgufError;
use super::file::{GgufFile, GgufTensorInfo};
use super::float::f16_at;
use super::kquants::{nibble, scales_and_mins};
use super::types::GgmlType;

/// One block's codes (its elements), scales and biases (one per `scale_len` elements).
type BlockFn = fn(&[u8], &mut [u8], &mut [f32], &mut [f32]);

/// `(elements per block, bytes per block, inputs per scale, decoder)` of a type packed here.
fn decoder(t: GgmlType) -> Option<(usize, usize, usize, BlockFn)> {
    Some(match t {
        GgmlType::Q4_0 => (32, 18, 32, q4_0),
        GgmlType::Q4_1 => (32, 20, 32, q4_1),
        GgmlType::Q8_0 => (32, 34, 32, q8_0),
        GgmlType::Q5_0 => (32, 22, 32, q5_0),
        GgmlType::Q5_1 => (32, 24, 32, q5_1),
        GgmlType::Q4K => (256, 144, 32, q4_k),
        GgmlType::Q5K => (256, 176, 32, q5_k),
        GgmlType::Q6K => (256, 210, 16, q6_k),
        _ => return None,
    })
}

/// One K-quant block's scales and biases as its file holds them: per block (a 256-element
/// super-block) a unit for the scales and one for the biases, per scale a small integer of each.
type FactorFn = fn(&[u8], &mut f32, &mut [i8], &mut f32, &mut [i8]);

/// The K-quants' factors (their blocks are 256 elements: one unit each), for the packing to
/// keep instead of float32 scales and biases where each product is the decoder's value, bit for
/// bit (it checks every one).
fn factors(t: GgmlType) -> Option<FactorFn> {
    Some(match t {
        GgmlType::Q4K | GgmlType::Q5K => k_factors,
        GgmlType::Q6K => q6_k_factors,
        _ => return None,
    })
}

/// Whether tensors of type `t` can be packed for the integer products.
pub fn packs(t: GgmlType) -> bool {
    decoder(t).is_some()
}

/// Bytes a packed `[rows, cols]` tensor of type `t` holds ([`PackedWeight::bytes`]), from its
/// type before it is read: half a byte a code for the 4-bit types (their codes are at most 15,
/// which the packing holds as nibbles), a byte for the others; for the scales, and the biases
/// but where the type's bias is a fixed multiple of its scale (Q4_0's, Q5_0's, Q8_0's, Q6_K's,
/// which the packing leaves implicit), four bytes each, or for the K-quants one each and four
/// per 256 inputs (their factors). The packing decides all three from the values themselves: a
/// Q5 tensor whose codes all happen to be below 16 takes less than this, and a tensor of those
/// four types whose every scale is zero, with zeros of both signs among its biases, keeps them.
pub fn packed_bytes(t: GgmlType, rows: u64, cols: u64) -> Option<u64> {
    let (_, _, scale_len, _) = decoder(t)?;
    let panel_rows = rows.div_ceil(16) * 16;
    let nibbles = matches!(t, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q4K);
    let implicit = matches!(
        t,
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::Q6K
    );
    let codes = panel_rows * cols / if nibbles { 2 } else { 1 };
    let values = panel_rows * cols / scale_len as u64;
    // A byte a value and four a unit where factored, else four a value.
    let one = if factors(t).is_some() {
        values + 4 * panel_rows * cols.div_ceil(256)
    } else {
        4 * values
    };
    Some(codes + one + if implicit { 0 } else { one })
}

/// Element `j < 32` of a block's 16 nibble bytes (low nibbles first, then high).
fn low_nibble(qs: &[u8], j: usize) -> u8 {
    if j < 16 {
        qs[j] & 0x0F
    } else {
        qs[j - 16] >> 4
    }
}

fn q4_0(b: &[u8], codes: &mut [u8], scales: &mut [f32], biases: &mut [f32]) {
    let d = f16_at(b, 0);
    for (j, c) in codes.iter_mut().enumerate() {
        *c = low_nibble(&b[2..18], j);
    }
    (scales[0], biases[0]) = (d, -8.0 * d);
}

fn q4_1(b: &[u8], codes: &mut [u8], scales: &mut [f32], biases: &mut [f32]) {
    for (j, c) in codes.iter_mut().enumerate() {
        *c = low_nibble(&b[4..20], j);
    }
    (scales[0], biases[0]) = (f16_at(b, 0), f16_at(b, 2));
}

fn q8_0(b: &[u8], codes: &mut [u8], scales: &mut [f32], biases: &mut [f32]) {
    let d = f16_at(b, 0);
    for (c, &q) in codes.iter_mut().zip(&b[2..34]) {
        // The signed code plus 128: flipping the top bit.
        *c = q ^ 0x80;
    }
    (scales[0], biases[0]) = (d, -128.0 * d);
}

/// Q5_0's and Q5_1's codes: the low nibbles as in Q4_0, bit `j` of the 32-bit `qh` the fifth
/// bit of element `j`.
fn five_bit_codes(qh: &[u8], qs: &[u8], codes: &mut [u8]) {
    let high = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    for (j, c) in codes.iter_mut().enumerate() {
        *c = low_nibble(qs, j) | ((((high >> j) & 1) as u8) << 4);
    }
}

fn q5_0(b: &[u8], codes: &mut [u8], scales: &mut [f32], biases: &mut [f32]) {
    let d = f16_at(b, 0);
    five_bit_codes(&b[2..6], &b[6..22], codes);
    (scales[0], biases[0]) = (d, -16.0 * d);
}

fn q5_1(b: &[u8], codes: &mut [u8], scales: &mut [f32], biases: &mut [f32]) {
    five_bit_codes(&b[4..8], &b[8..24], codes);
    (scales[0], biases[0]) = (f16_at(b, 0), f16_at(b, 2));
}

/// Q4_K's and Q5_K's sub-block scales `d · sc` and biases `−(dmin · m)`.
fn k_scales(b: &[u8], scales: &mut [f32], biases: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (sc, m) = scales_and_mins(&b[4..16]);
    for sub in 0..8 {
        scales[sub] = d * f32::from(sc[sub]);
        biases[sub] = -(dmin * f32::from(m[sub]));
    }
}

/// Q4_K's and Q5_K's factors: `d` and the 6-bit `sc` of each scale `d · sc`, `−dmin` and the
/// 6-bit `m` of each bias `−(dmin · m)` (the same bits: a product's sign is its factors').
fn k_factors(
    b: &[u8],
    scale_unit: &mut f32,
    scale_small: &mut [i8],
    bias_unit: &mut f32,
    bias_small: &mut [i8],
) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (sc, m) = scales_and_mins(&b[4..16]);
    (*scale_unit, *bias_unit) = (d, -dmin);
    for sub in 0..8 {
        // 6-bit values: exact as signed bytes.
        (scale_small[sub], bias_small[sub]) = (sc[sub] as i8, m[sub] as i8);
    }
}

fn q4_k(b: &[u8], codes: &mut [u8], scales: &mut [f32], biases: &mut [f32]) {
    k_scales(b, scales, biases);
    for (e, c) in codes.iter_mut().enumerate() {
        *c = nibble(&b[16..144], e);
    }
}

fn q5_k(b: &[u8], codes: &mut [u8], scales: &mut [f32], biases: &mut [f32]) {
    k_scales(b, scales, biases);
    let (qh, qs) = (&b[16..48], &b[48..176]);
    for (e, c) in codes.iter_mut().enumerate() {
        *c = nibble(qs, e) | (((qh[e % 32] >> (e / 32)) & 1) << 4);
    }
}

/// Q6_K: element `128a + r`'s low nibble is nibble `r / 64` of byte `64a + r % 64`, its high
/// bit pair pair `r / 32` of byte `128 + 32a + r % 32` (as `kquants::q6_k` reads them).
fn q6_k(b: &[u8], codes: &mut [u8], scales: &mut [f32], biases: &mut [f32]) {
    let (ql, qh) = (&b[0..128], &b[128..192]);
    let d = f16_at(b, 208);
    for (e, c) in codes.iter_mut().enumerate() {
        let (a, r) = (e / 128, e % 128);
        let low = (ql[64 * a + r % 64] >> (4 * (r / 64))) & 0x0F;
        let high = (qh[32 * a + r % 32] >> (2 * (r / 32))) & 0x03;
        *c = low | (high << 4);
    }
    for (i, (s, bias)) in scales.iter_mut().zip(biases.iter_mut()).enumerate() {
        *s = d * f32::from(b[192 + i] as i8);
        *bias = -32.0 * *s;
    }
}

/// Q6_K's factors: `d` and the int8 `sc` of each scale `d · sc` (its biases are implicit, `−32`
/// times the scale, so none are given).
fn q6_k_factors(b: &[u8], scale_unit: &mut f32, scale_small: &mut [i8], _: &mut f32, _: &mut [i8]) {
    *scale_unit = f16_at(b, 208);
    for (i, s) in scale_small.iter_mut().enumerate() {
        *s = b[192 + i] as i8;
    }
}

/// A 2-D tensor's rows over the file's mapping, each dequantised as it is read into the values
/// its packing would hold (the same decoders, `scale · q + bias` in float32): for the
/// embedding and the head, whose reads gather a few rows, so only those rows' pages are ever
/// read into memory.
#[derive(Debug)]
pub struct GgufRows {
    map: Arc<MmapMut>,
    /// Where the tensor's bytes start in the mapping.
    start: usize,
    rows: usize,
    cols: usize,
    ggml_type: GgmlType,
}

impl RowSource for GgufRows {
    fn shape(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    fn row(&self, n: usize, values: &mut [f32]) -> Result<(), ModelError> {
        let (len, block_bytes, scale_len, decode) =
            decoder(self.ggml_type).ok_or(ModelError::Shape("a row of an unpacked type"))?;
        if n >= self.rows || values.len() != self.cols {
            return Err(ModelError::Shape(
                "a row outside the tensor, or of another length",
            ));
        }
        let row_bytes = self.cols / len * block_bytes;
        let bytes = &self.map[self.start + n * row_bytes..][..row_bytes];
        let (mut codes, mut scales, mut biases) = ([0u8; 256], [0f32; 16], [0f32; 16]);
        let parts = len / scale_len;
        for (block, out) in bytes
            .chunks_exact(block_bytes)
            .zip(values.chunks_exact_mut(len))
        {
            decode(
                block,
                &mut codes[..len],
                &mut scales[..parts],
                &mut biases[..parts],
            );
            for (k, v) in out.iter_mut().enumerate() {
                let p = k / scale_len;
                *v = scales[p] * f32::from(codes[k]) + biases[p];
            }
        }
        Ok(())
    }
}

impl GgufFile {
    /// The 2-D tensor `info`'s rows over the mapping ([`GgufRows`]); `Err` as [`GgufFile::pack`].
    pub fn rows(&self, info: &GgufTensorInfo) -> Result<GgufRows, GgufError> {
        let (rows, cols) = self.packable(info)?;
        Ok(GgufRows {
            map: Arc::clone(&self.map),
            start: (self.data_start + info.offset) as usize,
            rows,
            cols,
            ggml_type: info.ggml_type,
        })
    }

    /// `(rows, cols)` of a 2-D tensor of a type packed here, whose bytes are whole rows of
    /// blocks.
    fn packable(&self, info: &GgufTensorInfo) -> Result<(usize, usize), GgufError> {
        let fail = |why: String| self.tensor_error(info, why);
        let (len, block_bytes, _, _) = decoder(info.ggml_type)
            .ok_or_else(|| fail("not a type the integer products take".into()))?;
        let &[cols, rows] = info.dims.as_slice() else {
            return Err(fail(format!(
                "{} dimensions; a packed weight has 2",
                info.dims.len()
            )));
        };
        let (rows, cols) = (rows as usize, cols as usize);
        let bytes = self.bytes_of(info);
        if cols % len != 0 || bytes.len() != rows * (cols / len * block_bytes) {
            return Err(fail(format!(
                "{} bytes, not the {} of {rows} rows of {cols} {} values",
                bytes.len(),
                rows * (cols / len) * block_bytes,
                info.ggml_type
            )));
        }
        Ok((rows, cols))
    }

    /// The 2-D tensor `info` (`[out, in]` row-major) packed for the integer products, its row
    /// `n` taken from the file's row `order[n]` where an order is given (llama.cpp's q/k rows
    /// put back). `Err` for a type not packed here, or another shape.
    pub fn pack(
        &self,
        info: &GgufTensorInfo,
        order: Option<&[usize]>,
    ) -> Result<PackedWeight, GgufError> {
        let fail = |why: String| self.tensor_error(info, why);
        let (rows, cols) = self.packable(info)?;
        let (len, block_bytes, scale_len, decode) = decoder(info.ggml_type)
            .ok_or_else(|| fail("not a type the integer products take".into()))?;
        if let Some(order) = order {
            if order.len() != rows || order.iter().any(|&r| r >= rows) {
                return Err(fail("a row order that is not one of its rows".into()));
            }
        }
        let bytes = self.bytes_of(info);
        let row_bytes = cols / len * block_bytes;
        let factor = factors(info.ggml_type);
        let per_block = len / scale_len;
        let packed = PackedWeight::from_rows((rows, cols), scale_len, |n, row: RowParts<'_>| {
            let source = order.map_or(n, |o| o[n]);
            let blocks = || bytes[source * row_bytes..][..row_bytes].chunks_exact(block_bytes);
            let scales = row.scales.values.chunks_exact_mut(per_block);
            let biases = row.biases.values.chunks_exact_mut(per_block);
            for (((block, codes), scales), biases) in blocks()
                .zip(row.codes.chunks_exact_mut(len))
                .zip(scales)
                .zip(biases)
            {
                decode(block, codes, scales, biases);
            }
            // The K-quants' blocks are one unit each (256 elements).
            if let Some(factor) = factor {
                let (s, b) = (row.scales, row.biases);
                for ((((block, su), ss), bu), bs) in blocks()
                    .zip(s.units.iter_mut())
                    .zip(s.small.chunks_exact_mut(per_block))
                    .zip(b.units.iter_mut())
                    .zip(b.small.chunks_exact_mut(per_block))
                {
                    factor(block, su, ss, bu, bs);
                }
            }
        })
        .map_err(|e| fail(e.to_string()))?;
        self.release(info);
        Ok(packed)
    }
}

#[cfg(test)]
mod tests {
    use super::super::quantise::bytes;
    use half::f16;

    use super::super::kquants;
    use super::*;
    use crate::model::linear::RowSource;

    /// A block of `t` of random bytes with its f16 fields set to finite values of both signs
    /// and several magnitudes (random bytes there could be NaN or infinite, which no quantiser
    /// writes).
    fn block(t: GgmlType, seed: u32) -> Vec<u8> {
        let (_, size, _, _) = decoder(t).expect("a packed type");
        let mut b = bytes(size, seed);
        let mut half_at = |at: usize, i: u32| {
            let values = [0.0123f32, -0.5, 3.75e-4, 1.5, -2.0e-3, 7.0e-6, 0.0];
            let v = values[((seed + i) % values.len() as u32) as usize];
            b[at..at + 2].copy_from_slice(&f16::from_f32(v).to_bits().to_le_bytes());
        };
        match t {
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => half_at(0, 0),
            GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4K | GgmlType::Q5K => {
                half_at(0, 0);
                half_at(2, 3);
            }
            GgmlType::Q6K => half_at(208, 0),
            _ => unreachable!("not a packed type"),
        }
        b
    }

    /// Each type's packing reads back (`PackedWeight::row`) as the reference dequantisers'
    /// float32 values, bit for bit, over rows of several blocks and a partial panel.
    #[test]
    fn packed_values_are_ggmls_dequantised_values_bit_for_bit() {
        for t in [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q8_0,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
            GgmlType::Q4K,
            GgmlType::Q5K,
            GgmlType::Q6K,
        ] {
            let (len, _, _, _) = decoder(t).expect("packed");
            let (rows, per_row) = (19usize, 512 / len);
            let data: Vec<u8> = (0..rows * per_row)
                // 11, prime to the 7 float16 values `block` draws from, so that blocks differ
                // in their scales (with 7 every block of a tensor had the same ones, which made
                // Q4_1's biases one multiple of its scales).
                .flat_map(|i| block(t, 11 * i as u32 + t.id()))
                .collect();
            let want: Vec<f32> = match t {
                GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0 => {
                    // Their reference is the MLX affine repacking's own test; here the scalar
                    // formula through the dequantisers' helpers.
                    reference_simple(t, &data)
                }
                _ => kquants::dequantise::<f32>(t, &data).expect("dequantises"),
            };
            let dir = tempfile::tempdir().expect("tempdir");
            let path = super::super::writer::Writer::new()
                .tensor("w", &[512, rows as u64], t.id(), data)
                .write(dir.path(), "w.gguf");
            let file = GgufFile::open(&path).expect("opens");
            let info = file.tensor("w").expect("listed").clone();
            let packed = file.pack(&info, None).expect("packs");
            let mut row = vec![0f32; 512];
            let mut mismatches = 0;
            for n in 0..rows {
                packed.row(n, &mut row).expect("a row");
                for (k, v) in row.iter().enumerate() {
                    let w = want[n * 512 + k];
                    // Bit for bit, but for the sign of a zero (a zero scale times a negative
                    // code): both add nothing to a product.
                    if v.to_bits() != w.to_bits() && !(*v == 0.0 && w == 0.0) {
                        mismatches += 1;
                        assert!(
                            mismatches > 3,
                            "{t} [{n}, {k}]: {v} against {}",
                            want[n * 512 + k]
                        );
                    }
                }
            }
            assert_eq!(mismatches, 0, "{t}");
            // Nibbles for the 4-bit types' codes, implicit biases where the type's bias is a
            // multiple of its scale (decided from the values), and the estimate made from the
            // type before loading is what the packing holds.
            let four_bit = matches!(t, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q4K);
            assert_eq!(packed.nibbles(), four_bit, "{t} nibbles");
            let multiple = matches!(
                t,
                GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::Q6K
            );
            assert_eq!(packed.implicit_biases(), multiple, "{t} implicit biases");
            // The K-quants' scales (and free biases) as their files hold them.
            let k = matches!(t, GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K);
            let free = matches!(t, GgmlType::Q4K | GgmlType::Q5K);
            assert_eq!(packed.factored(), (k, free), "{t} factored");
            assert_eq!(
                packed_bytes(t, rows as u64, 512),
                Some(packed.bytes() as u64),
                "{t} bytes"
            );
            // Its rows over the mapping read the same values.
            let mapped = file.rows(&info).expect("rows");
            for n in [0, 7, rows - 1] {
                let mut from_map = vec![0f32; 512];
                mapped.row(n, &mut from_map).expect("a row");
                packed.row(n, &mut row).expect("a row");
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&from_map), bits(&row), "{t} row {n} over the mapping");
            }
            // A row order takes the rows it names.
            let order: Vec<usize> = (0..rows).rev().collect();
            let reversed = file.pack(&info, Some(&order)).expect("packs");
            reversed.row(0, &mut row).expect("a row");
            assert_eq!(row[..], want[(rows - 1) * 512..][..512], "{t} reordered");
        }
    }

    /// ggml's `dequantize_row_q4_0`, `_q4_1`, `_q8_0`, element by element.
    fn reference_simple(t: GgmlType, data: &[u8]) -> Vec<f32> {
        let size = decoder(t).expect("packed").1;
        let mut out = Vec::new();
        for b in data.chunks_exact(size) {
            let d = f16_at(b, 0);
            for j in 0..32 {
                out.push(match t {
                    GgmlType::Q4_0 => (low_nibble(&b[2..18], j) as i32 - 8) as f32 * d,
                    GgmlType::Q4_1 => low_nibble(&b[4..20], j) as f32 * d + f16_at(b, 2),
                    _ => (b[2 + j] as i8) as f32 * d,
                });
            }
        }
        out
    }
}
