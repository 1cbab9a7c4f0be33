//! The Hunch accelerator.

pub mod tokenizer;

/// Checkpoint layouts: the three on-disk formats, their writers, quantisers and parsers.
///
/// Declared inline because `checkpoint/mod.rs` belongs to the HF loader; when both land, these
/// declarations move into that file unchanged.
pub mod checkpoint {
    pub mod quant;
    pub mod tensors;
}
