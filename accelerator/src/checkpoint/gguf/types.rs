//! ggml's tensor types (their ids, names and block sizes) and the float dtypes a load makes.

use std::fmt;

use mlx_rs::Dtype;

/// A tensor's storage type, as ggml numbers them (`enum ggml_type` in ggml.h).
///
/// Types this reader cannot load still parse, so a file opens and lists them; [`GgmlType::Other`]
/// keeps an id no version of ggml known here defines.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    F64,
    I8,
    I16,
    I32,
    I64,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    IQ1_M,
    TQ1_0,
    TQ2_0,
    MXFP4,
    Other(u32),
}

/// Super-block length of the K-quants (`QK_K`).
pub const QK_K: u64 = 256;

/// Every known type: its id, llama.cpp's name, elements per block and bytes per block (the
/// sizes of `block_*` in ggml-common.h).
const TYPES: [(GgmlType, u32, &str, u64, u64); 32] = [
    (GgmlType::F32, 0, "F32", 1, 4),
    (GgmlType::F16, 1, "F16", 1, 2),
    (GgmlType::Q4_0, 2, "Q4_0", 32, 18),
    (GgmlType::Q4_1, 3, "Q4_1", 32, 20),
    (GgmlType::Q5_0, 6, "Q5_0", 32, 22),
    (GgmlType::Q5_1, 7, "Q5_1", 32, 24),
    (GgmlType::Q8_0, 8, "Q8_0", 32, 34),
    // ggml's block_q8_1 holds two halves and 32 codes (gguf-py's table says 40, a leftover of
    // its older float layout; no converter writes weights in this activation type anyway).
    (GgmlType::Q8_1, 9, "Q8_1", 32, 36),
    (GgmlType::Q2K, 10, "Q2_K", QK_K, 84),
    (GgmlType::Q3K, 11, "Q3_K", QK_K, 110),
    (GgmlType::Q4K, 12, "Q4_K", QK_K, 144),
    (GgmlType::Q5K, 13, "Q5_K", QK_K, 176),
    (GgmlType::Q6K, 14, "Q6_K", QK_K, 210),
    (GgmlType::Q8K, 15, "Q8_K", QK_K, 292),
    (GgmlType::IQ2_XXS, 16, "IQ2_XXS", QK_K, 66),
    (GgmlType::IQ2_XS, 17, "IQ2_XS", QK_K, 74),
    (GgmlType::IQ3_XXS, 18, "IQ3_XXS", QK_K, 98),
    (GgmlType::IQ1_S, 19, "IQ1_S", QK_K, 50),
    (GgmlType::IQ4_NL, 20, "IQ4_NL", 32, 18),
    (GgmlType::IQ3_S, 21, "IQ3_S", QK_K, 110),
    (GgmlType::IQ2_S, 22, "IQ2_S", QK_K, 82),
    (GgmlType::IQ4_XS, 23, "IQ4_XS", QK_K, 136),
    (GgmlType::I8, 24, "I8", 1, 1),
    (GgmlType::I16, 25, "I16", 1, 2),
    (GgmlType::I32, 26, "I32", 1, 4),
    (GgmlType::I64, 27, "I64", 1, 8),
    (GgmlType::F64, 28, "F64", 1, 8),
    (GgmlType::IQ1_M, 29, "IQ1_M", QK_K, 56),
    (GgmlType::BF16, 30, "BF16", 1, 2),
    (GgmlType::TQ1_0, 34, "TQ1_0", QK_K, 54),
    (GgmlType::TQ2_0, 35, "TQ2_0", QK_K, 66),
    (GgmlType::MXFP4, 39, "MXFP4", 32, 17),
];

impl GgmlType {
    fn entry(self) -> Option<(GgmlType, u32, &'static str, u64, u64)> {
        TYPES.into_iter().find(|e| e.0 == self)
    }

    /// The type with ggml id `id` (an unknown id is kept as [`GgmlType::Other`]).
    pub fn from_id(id: u32) -> GgmlType {
        TYPES
            .into_iter()
            .find(|e| e.1 == id)
            .map_or(GgmlType::Other(id), |e| e.0)
    }

    /// ggml's id of the type.
    pub fn id(self) -> u32 {
        match self {
            GgmlType::Other(id) => id,
            known => known.entry().map_or(u32::MAX, |e| e.1),
        }
    }

    /// `(elements per block, bytes per block)`; `None` for an unknown id, whose size nobody
    /// here can tell.
    pub fn block(self) -> Option<(u64, u64)> {
        self.entry().map(|e| (e.3, e.4))
    }

    /// Whether the type is stored as one of the float dtypes MLX holds as they are.
    pub fn is_dense_float(self) -> bool {
        matches!(self, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
    }

    /// Bits per code when the type maps exactly onto MLX's affine quantisation (group 32).
    pub fn affine_bits(self) -> Option<i32> {
        match self {
            GgmlType::Q4_0 | GgmlType::Q4_1 => Some(4),
            GgmlType::Q8_0 => Some(8),
            _ => None,
        }
    }

    /// Whether this reader dequantises the type to float at load.
    pub fn is_dequantised(self) -> bool {
        matches!(
            self,
            GgmlType::Q5_0
                | GgmlType::Q5_1
                | GgmlType::Q8_1
                | GgmlType::Q2K
                | GgmlType::Q3K
                | GgmlType::Q4K
                | GgmlType::Q5K
                | GgmlType::Q6K
                | GgmlType::Q8K
        )
    }

    /// Whether [`super::GgufFile::load`] can load tensors of this type.
    pub fn is_supported(self) -> bool {
        self.is_dense_float() || self.affine_bits().is_some() || self.is_dequantised()
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.entry() {
            Some(e) => f.write_str(e.2),
            None => write!(f, "type {}", self.id()),
        }
    }
}

/// The float dtype a load makes what it computes in: dequantised tensors, and the scales and
/// biases of affine ones.
///
/// GGUF stores its block scales as f16, so [`FloatDtype::F16`] and [`FloatDtype::F32`] hold
/// them exactly and [`FloatDtype::BF16`] rounds them to 8 significant bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FloatDtype {
    F16,
    BF16,
    F32,
}

impl FloatDtype {
    pub fn dtype(self) -> Dtype {
        match self {
            FloatDtype::F16 => Dtype::Float16,
            FloatDtype::BF16 => Dtype::Bfloat16,
            FloatDtype::F32 => Dtype::Float32,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> u64 {
        match self {
            FloatDtype::F16 | FloatDtype::BF16 => 2,
            FloatDtype::F32 => 4,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_names_round_trip() {
        for (t, id, name, _, _) in TYPES {
            assert_eq!(GgmlType::from_id(id), t);
            assert_eq!(t.id(), id);
            assert_eq!(t.to_string(), name);
        }
        assert_eq!(GgmlType::from_id(4), GgmlType::Other(4));
        assert_eq!(GgmlType::Other(4).to_string(), "type 4");
        assert_eq!(GgmlType::Q4K.to_string(), "Q4_K");
    }
}
