//! Tools that write checkpoints: random checkpoints of any size ([`random`], [`writer`]),
//! conversion of HF checkpoints to the quantised layouts ([`writer::convert`]), the quantisers
//! ([`quant`]) and the demo checkpoint ([`demo`]). The serving code (the loader in
//! [`crate::checkpoint`], the engine, the server) never uses them; they share the on-disk
//! conventions with the loader through [`crate::checkpoint::format`].

pub mod demo;
pub mod quant;
pub mod random;
pub mod writer;

#[cfg(test)]
mod layout_tests;
#[cfg(test)]
mod path_tests;

pub use random::{DenseDtype, Preset, RandomSpec};
pub use writer::{convert, write_random_checkpoint};
