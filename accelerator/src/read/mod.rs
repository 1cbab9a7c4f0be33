//! The System One decision read (diffusiongemma.md §3, following oMLX's port of djev): typed
//! questions → prompt and answer template → noise in the label slots → one batched decoder pass
//! per draw batch over one prefill → label probabilities, re-read when uncertain, averaged.
//!
//! The read is written against two small traits — [`ReadTokenizer`] and [`Denoiser`] — so the
//! algorithm can be tested exactly without a model, and the model can be swapped (dtype, layout,
//! device) without touching it.

pub mod draws;
pub mod plan;
pub mod prompt;
pub mod rng;

use draws::{
    draw_seeds, group_seed, mean_distribution, needs_reread, noised_canvas, read_slot,
    reread_seeds, SlotReading, DEFAULT_SEED, MAX_DRAWS,
};
use hunch_core::{LabelDistribution, ReadError, ReadOutcome, ReadRequest, ReadStats};
pub use plan::{
    PlanError, PlanSettings, PlannedRead, Planner, ReadPlan, ReadTokenizer, Slot, MAX_CANVAS_CAP,
};
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
    fn prefill(&self, prompt_ids: &[u32]) -> Result<Self::Prefill, String>;
    /// One first-step decoder pass (no self-conditioning) over `canvases` (all the same width),
    /// returning the softcapped fp32 logits at `positions` of every canvas.
    fn slot_logits(
        &self,
        prefill: &Self::Prefill,
        canvases: &[Vec<u32>],
        positions: &[usize],
    ) -> Result<SlotLogits, String>;
}

/// Per-model read switches.
#[derive(Debug, Clone)]
pub struct ReadSettings {
    /// The auto re-read rule (three more draws when the first is uncertain).
    pub rereads: bool,
}

impl From<PlanError> for ReadError {
    fn from(e: PlanError) -> Self {
        match e {
            PlanError::Question { question, message } => {
                ReadError::InvalidQuestion { question, message }
            }
            PlanError::PromptTooLong { .. } => ReadError::TooLarge {
                message: e.to_string(),
            },
            PlanError::Tokenizer(m) => ReadError::internal(format!("tokenizer: {m}")),
        }
    }
}

/// Runs a whole read request: plans it (all failures surface before any prefill), then for each
/// planned read one prefill and one or two batched decoder passes.
pub fn execute<T: ReadTokenizer, D: Denoiser>(
    planner: &Planner<T>,
    model: &D,
    settings: &ReadSettings,
    request: &ReadRequest,
) -> Result<ReadOutcome, ReadError> {
    if let Some(draws) = request.options.draws {
        if draws == 0 || draws > MAX_DRAWS {
            return Err(ReadError::TooLarge {
                message: format!("x_draws must be between 1 and {MAX_DRAWS}"),
            });
        }
    }
    let started = Instant::now();
    let plan = planner.plan(&request.state, &request.questions)?;
    let mut stats = ReadStats {
        tokenize_seconds: started.elapsed().as_secs_f64(),
        ..ReadStats::default()
    };

    let mut distributions: Vec<Option<LabelDistribution>> = vec![None; request.questions.len()];
    for &i in &plan.forced {
        distributions[i] = Some(LabelDistribution(vec![1.0]));
    }
    let base_seed = request.options.seed.unwrap_or(DEFAULT_SEED);
    let vocab = model.vocab_size();
    for (k, read) in plan.reads.iter().enumerate() {
        let seed = group_seed(base_seed, k);
        let t = Instant::now();
        let prefill = model
            .prefill(&read.prompt_ids)
            .map_err(ReadError::internal)?;
        stats.prefill_seconds += t.elapsed().as_secs_f64();
        stats.reads += 1;
        stats.prompt_tokens += read.prompt_ids.len() as u64;

        let t = Instant::now();
        let draw_batch = |seeds: &[u64]| -> Result<Vec<Vec<SlotReading>>, ReadError> {
            let canvases: Vec<Vec<u32>> = seeds
                .iter()
                .map(|&s| noised_canvas(&read.canvas, &read.slots, s, vocab))
                .collect();
            let positions: Vec<usize> = read.slots.iter().map(|s| s.position).collect();
            let logits = model
                .slot_logits(&prefill, &canvases, &positions)
                .map_err(ReadError::internal)?;
            Ok((0..seeds.len())
                .map(|d| {
                    read.slots
                        .iter()
                        .enumerate()
                        .map(|(si, slot)| read_slot(logits.row(d, si), &slot.label_ids))
                        .collect()
                })
                .collect())
        };
        let readings = match request.options.draws {
            Some(n) => draw_batch(&draw_seeds(seed, n as usize))?,
            None => {
                let mut readings = draw_batch(&[seed])?;
                if settings.rereads && needs_reread(&readings[0]) {
                    readings.extend(draw_batch(&reread_seeds(seed))?);
                }
                readings
            }
        };
        stats.denoise_seconds += t.elapsed().as_secs_f64();
        stats.draws += readings.len() as u32;

        for (si, &question) in read.questions.iter().enumerate() {
            let per_draw: Vec<&SlotReading> = readings.iter().map(|d| &d[si]).collect();
            distributions[question] = Some(LabelDistribution(mean_distribution(&per_draw)));
        }
    }
    let distributions = distributions
        .into_iter()
        .enumerate()
        .map(|(i, d)| d.ok_or_else(|| ReadError::internal(format!("question {i} was not read"))))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ReadOutcome {
        distributions,
        usage: plan.usage(),
        stats,
    })
}

impl ReadTokenizer for crate::tokenizer::Tokenizer {
    fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        crate::tokenizer::Tokenizer::encode(self, text).map_err(|e| e.to_string())
    }

    fn chat_prompt_ids(&self, system: &str, user: &str) -> Result<Vec<u32>, String> {
        crate::tokenizer::Tokenizer::encode(self, &crate::tokenizer::render_chat(system, user))
            .map_err(|e| e.to_string())
    }

    fn token_id(&self, token: &str) -> Option<u32> {
        crate::tokenizer::Tokenizer::token_id(self, token)
    }

    fn pad_id(&self) -> u32 {
        self.special().pad
    }
}
