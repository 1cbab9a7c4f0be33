//! `hunch-accelerator`: DiffusionGemma on MLX — checkpoints, the forward pass, and the System One
//! decision read — served to the Hunch host as a sidecar process.

pub mod read;
