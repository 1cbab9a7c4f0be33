//! The NVFP4 and MLX-affine quantisers live in the optimised `hunch-codec` crate; this module
//! names them for the tools and pins them bit-for-bit against MLX's own output.

pub use hunch_codec::quant::*;

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

    /// The uint32 vector `name`.
    fn u32s(f: &SafetensorsFile, name: &str) -> Vec<u32> {
        f.tensor(name).expect(name).to_u32().expect("u32")
    }

    /// `mine` equals `want` bit for bit, element by element (`p` names the vector).
    fn assert_bit_identical(p: &str, mine: &[f32], want: &[f32]) {
        for (i, (a, b)) in mine.iter().zip(want).enumerate() {
            assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "{p} dequantised element {i}: {a} vs {b}"
            );
        }
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
            let codes = u32s(&f, &format!("{p}.codes"));
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
            assert_bit_identical(&p, &mine, &deq);
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
            let codes = u32s(&f, &format!("{p}.codes"));
            assert_eq!(q.codes, codes, "{p} codes");
            let (scales, _, _) = load(&f, &format!("{p}.scales"));
            let (biases, _, _) = load(&f, &format!("{p}.biases"));
            assert_eq!(q.scales, scales, "{p} scales");
            assert_eq!(q.biases, biases, "{p} biases");
            let (deq, _, _) = load(&f, &format!("{p}.deq"));
            let mine = dequantize_affine(&q, src);
            assert_bit_identical(&p, &mine, &deq);
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
