//! The element types dequantised GGUF tensors are written in, and reading ggml's little-endian
//! f16 scales: shared by the simple blocks (`blocks`) and the K-quants (`kquants`).

use half::{bf16, f16};

/// An output element type: MLX holds these as they are.
pub(super) trait Float: Copy + 'static {
    fn from_f32(x: f32) -> Self;
}

impl Float for f32 {
    fn from_f32(x: f32) -> Self {
        x
    }
}

impl Float for f16 {
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
}

impl Float for bf16 {
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
}

/// The little-endian f16 at `at`, widened.
pub(super) fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}
