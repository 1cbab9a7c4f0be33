//! The reads, one folder per family (docs/architecture.md, "The accelerator's families"): how
//! typed questions become model inputs and label distributions come back.
//!
//! - [`diffusion`]: DiffusionGemma's read (docs/read.md): prompt and answer template, noise in
//!   the label slots, decoder passes per draw batch over one prefill, re-reads when uncertain.
//! - [`logits`]: a chat model's label-logit read (docs/logit-read.md): simple-jev's prompt
//!   structure v1, one scoring sequence per question, the next-token logits of single-token
//!   labels after a prefill.

pub mod diffusion;
pub mod logits;
