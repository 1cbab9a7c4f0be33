//! The hot loops of Hunch's checkpoint tools, in a crate that dev and test builds compile
//! optimised: seeded random values ([`rng`]), float encodings ([`bytes`]) and the NVFP4 and
//! MLX-affine quantisers ([`quant`]). A full-width checkpoint is billions of values; at
//! opt-level 0 writing one took longer than CI can wait.
//!
//! Everything here is a plain (non-generic) function, so it runs as compiled here whatever the
//! caller's optimisation level.

pub mod bytes;
pub mod quant;
pub mod rng;
