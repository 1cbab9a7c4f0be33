//! # hunch-accelerator
//!
//! DiffusionGemma (the diffusion LM behind System One reads) on MLX, from Rust (mlx-rs), and the
//! sidecar process that serves its reads to the Hunch host.
//!
//! * [`model`]: the math, one type per block ([`model::attention::Attention`],
//!   [`model::mlp::Mlp`], [`model::moe::Moe`], [`model::layer::Layer`], …) and the whole
//!   [`DiffusionGemma`].
//! * [`checkpoint`]: loading. Memory-mapped safetensors ([`checkpoint::tensors`]), the layout
//!   found from the tensors ([`checkpoint::layout`]), the three layouts' arrays in MLX.
//! * [`tools`]: writing checkpoints (random ones, conversion, quantisers, the demo checkpoint);
//!   not used by the serving code.
//! * [`tokenizer`]: the checkpoint's `tokenizer.json`, special tokens by text, the chat format.
//! * [`read`]: the System One decision read (prompt, canvas, slots, noise draws, re-reads).
//! * [`server`]: the sidecar's HTTP face and its engine thread.
//!
//! The API the decision read uses:
//!
//! ```no_run
//! # use hunch_accelerator::{DiffusionGemma, LoadOptions};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let model = DiffusionGemma::load("ckpt".as_ref(), &LoadOptions::default())?;
//! let cache = model.prefill(&[2, 105, 9038])?; // encoder, batch 1, positions 0..P
//! // B canvases of equal width W at positions P..P+W → softcapped f32 logits [B, W, vocab]
//! let logits = model.denoise(&cache, &[vec![5; 16], vec![7; 16]], None)?;
//! # Ok(()) }
//! ```
//!
//! MLX is not thread-safe: [`DiffusionGemma`] and [`PromptCache`] are `Send` but not `Sync`;
//! give them to one worker thread (or a mutex) and send it work.
//!
//! Building needs MLX: see `docs/mlx-on-linux.md` (the `mlx-sys` build fetches MLX's PyPI wheel).

pub mod checkpoint;
pub mod engine;
pub mod model;
pub mod read;
pub mod scheduler;
pub mod server;
pub mod tokenizer;
pub mod tools;

pub use checkpoint::{LoadError, LoadOptions};
/// Re-exported so callers can hold logits without depending on mlx-rs themselves.
pub use mlx_rs::Array;
pub use model::{
    ActivationDtype, Config, DiffusionGemma, Experts, Linear, ModelError, PromptCache,
};
