//! # hunch-accelerator
//!
//! The sidecar process that serves System One reads to the Hunch host, on MLX from Rust
//! (mlx-rs), for two model families, each in a folder of its own under `model/`, `read/` and
//! `engine/` (docs/architecture.md, "The accelerator's families"):
//!
//! * [`model`]: the math over shared blocks (linear, norms, fused kernels, chunk K/V):
//!   [`model::diffusion_gemma`] (DiffusionGemma, the diffusion LM, one type per block) and
//!   [`model::causal`] (chat models: Llama, Qwen3, Gemma 3, one file per architecture).
//! * [`checkpoint`]: loading, kept apart from the math. Memory-mapped safetensors
//!   ([`checkpoint::tensors`]), DiffusionGemma's layout found from its tensors
//!   ([`checkpoint::layout`]), chat models from Hugging Face folders and GGUF files
//!   ([`checkpoint::causal`], [`checkpoint::gguf`]).
//! * [`tools`]: writing checkpoints (random ones, conversion, quantisers, the demo checkpoint);
//!   not used by the serving code.
//! * [`tokenizer`]: DiffusionGemma's `tokenizer.json`; chat models' tokenizers and templates
//!   ([`tokenizer::chat`]).
//! * [`read`]: the reads: [`read::diffusion`] (prompt, canvas, slots, noise draws, re-reads)
//!   and [`read::logits`] (simple-jev's prompt structure v1 over next-token label logits).
//! * [`engine`]: one engine per family; [`server`]: the sidecar's HTTP face and its engine
//!   thread.
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

pub mod blas;
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
