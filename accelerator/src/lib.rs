//! `hunch-accelerator`: DiffusionGemma on MLX — checkpoints, the forward pass, and the System One
//! decision read — served to the Hunch host as a sidecar process.

pub mod read;
pub mod server;
pub mod tokenizer;

/// Checkpoint layouts: the three on-disk formats, their writers, quantisers and parsers.
///
/// Declared inline because `checkpoint/mod.rs` belongs to the HF loader; when both land, these
/// declarations move into that file unchanged.
pub mod checkpoint {
    pub mod dims;
    pub mod layout;
    pub mod quant;
    pub mod random;
    pub mod tensors;
    pub mod writer;

    pub use layout::{detect_layout, Checkpoint, QuantMode, QuantizedWeight, Weight};
    pub use random::{Preset, RandomSpec};
    pub use writer::{convert, write_random_checkpoint, Layout};
}
