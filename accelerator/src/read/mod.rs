//! The reads, one folder per family (docs/architecture.md, "The accelerator's families"): how
//! typed questions become model inputs and label distributions come back.
//!
//! - [`diffusion`]: DiffusionGemma's read (docs/read.md): prompt and answer template, noise in
//!   the label slots, decoder passes per draw batch over one prefill, re-reads when uncertain.
//! - [`logits`]: a chat model's label-logit read (docs/logit-read.md): simple-jev's prompt
//!   structure v1, one scoring sequence per question, the next-token logits of single-token
//!   labels after a prefill.
//! - [`decision`]: a llama.cpp decision model's read (docs/models.md, "Decision models"): its
//!   own `systemone` prompt, its labels, its fitted temperatures, as llama-server reads it.

pub mod decision;
pub mod diffusion;
pub mod logits;
