//! The read one request at a time, without the scheduler: each planned read gets its own
//! prefill and decoder passes. It is the plain statement of what a read computes, and the
//! scheduler's batched answers are checked against it (`tests/batching.rs`); the sidecar never
//! serves from it, so it is built only for tests (feature `testing`).

use super::plan::{Planner, ReadTokenizer};
use super::{Need, ReadSettings, RequestProgress, SlotRows};
use crate::model::ModelError;
use hunch_core::{ReadError, ReadOutcome, ReadRequest};
use std::time::Instant;

/// Logits rows read at the slot positions: `[draw][slot][vocab]`, flattened.
#[derive(Debug, Clone)]
pub struct SlotLogits {
    pub draws: usize,
    pub slots: usize,
    pub vocab: usize,
    pub values: Vec<f32>,
}

impl SlotLogits {
    pub fn row(&self, draw: usize, slot: usize) -> &[f32] {
        let start = (draw * self.slots + slot) * self.vocab;
        &self.values[start..start + self.vocab]
    }
}

/// The model as the read uses it: one prefill per read, then read-only decoder passes over a
/// batch of canvases.
pub trait Denoiser {
    type Prefill;
    /// Noise ids are drawn from `[0, vocab_size)`.
    fn vocab_size(&self) -> u32;
    fn prefill(&self, prompt_ids: &[u32]) -> Result<Self::Prefill, ModelError>;
    /// One first-step decoder pass (no self-conditioning) over `canvases` (all the same width),
    /// returning the softcapped fp32 logits at `positions` of every canvas.
    fn slot_logits(
        &self,
        prefill: &Self::Prefill,
        canvases: &[Vec<u32>],
        positions: &[usize],
    ) -> Result<SlotLogits, ModelError>;
}

/// Runs a whole read request one read at a time: plans it (all failures surface before any
/// prefill), then for each planned read one prefill and one or two batched decoder passes.
pub fn execute<T: ReadTokenizer, D: Denoiser>(
    planner: &Planner<T>,
    model: &D,
    settings: &ReadSettings,
    request: &ReadRequest,
) -> Result<ReadOutcome, ReadError> {
    let mut progress = RequestProgress::start(planner, settings, model.vocab_size(), request)?;
    for read in 0..progress.read_count() {
        let t = Instant::now();
        let prefill = model
            .prefill(progress.prompt_ids(read))
            .map_err(|e| ReadError::internal(e.to_string()))?;
        progress.stats.prefill_seconds += t.elapsed().as_secs_f64();
        progress.prefilled(read)?;
        let t = Instant::now();
        while let Some(Need::Draws {
            canvases,
            positions,
        }) = progress.need(read)
        {
            let logits = model
                .slot_logits(&prefill, &canvases, &positions)
                .map_err(|e| ReadError::internal(e.to_string()))?;
            progress.drawn(read, SlotRows::Full(&logits.values))?;
        }
        progress.stats.denoise_seconds += t.elapsed().as_secs_f64();
    }
    progress.finish()
}
