//! The System One decision read (docs/read.md, following oMLX's port of djev): typed
//! questions → prompt and answer template → noise in the label slots → one batched decoder pass
//! per draw batch over one prefill → label probabilities, re-read when uncertain, averaged.
//!
//! A request's questions are read jointly (one prompt listing them all, the reference read) or
//! isolated (each question read alone, exactly as a one-question request); the request's
//! `options.questions` says which, and the plan is the only place that differs.
//!
//! The read is written against two small traits — [`ReadTokenizer`] and [`Denoiser`] — so the
//! algorithm can be tested exactly without a model, and the model can be swapped (dtype, layout,
//! device) without touching it.

pub mod draws;
/// The one-read-at-a-time path the scheduler's answers are checked against (tests only).
#[cfg(any(test, feature = "testing"))]
mod one_at_a_time;
pub mod plan;
pub mod prompt;
#[cfg(test)]
mod reduce_tests;
pub mod rng;
#[cfg(any(test, feature = "testing"))]
pub use one_at_a_time::{execute, Denoiser, SlotLogits};

use draws::{
    draw_seeds, group_seed, mean_distribution, needs_reread, noised_canvas, reread_seeds,
    SlotReading, SlotRows, DEFAULT_SEED, MAX_DRAWS,
};
use hunch_core::{LabelDistribution, ReadError, ReadOutcome, ReadRequest, ReadStats};
pub use plan::{
    PlanError, PlanSettings, PlannedRead, Planner, ReadPlan, ReadTokenizer, Slot, MAX_CANVAS_CAP,
};
use std::time::Instant;

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

/// What a read in progress needs next.
#[derive(Debug, Clone, PartialEq)]
pub enum Need {
    /// Its prompt prefilled ([`RequestProgress::prompt_ids`]).
    Prefill,
    /// One batched first-step decoder pass over these canvases, reading the logits at
    /// `positions` of each.
    Draws {
        canvases: Vec<Vec<u32>>,
        positions: Vec<usize>,
    },
}

#[derive(Debug, Clone, PartialEq)]
enum Stage {
    Prefill,
    /// Draws with these seeds are next.
    Draws(Vec<u64>),
    /// The first draw, when the re-read rule may still add more.
    FirstDraw,
    Done,
}

#[derive(Debug, Clone)]
struct ReadState {
    seed: u64,
    stage: Stage,
    readings: Vec<Vec<SlotReading>>,
}

/// One request's reads in progress: the algorithm as a state machine that a driver feeds with
/// prefills and decoder logits. [`execute`] drives it one read at a time; the accelerator's
/// scheduler drives many requests at once and batches their needs into shared forwards. Both
/// get the same answers because everything that decides an answer (prompts, canvases, seeds,
/// the re-read rule, averaging) lives here.
#[derive(Debug, Clone)]
pub struct RequestProgress {
    plan: ReadPlan,
    draws: Option<u32>,
    rereads: bool,
    vocab: u32,
    reads: Vec<ReadState>,
    distributions: Vec<Option<LabelDistribution>>,
    /// Filled in by the driver (timings, cache and batch figures) and by the progress itself
    /// (reads, draws, prompt tokens).
    pub stats: ReadStats,
}

impl RequestProgress {
    /// Plans `request` (every failure surfaces here, before any model work).
    pub fn start<T: ReadTokenizer>(
        planner: &Planner<T>,
        settings: &ReadSettings,
        vocab: u32,
        request: &ReadRequest,
    ) -> Result<Self, ReadError> {
        if let Some(draws) = request.options.draws {
            if draws == 0 || draws > MAX_DRAWS {
                return Err(ReadError::TooLarge {
                    message: format!("x_draws must be between 1 and {MAX_DRAWS}"),
                });
            }
        }
        let started = Instant::now();
        let plan = planner.plan_mode(
            &request.state,
            &request.questions,
            request.options.questions,
        )?;
        let stats = ReadStats {
            tokenize_seconds: started.elapsed().as_secs_f64(),
            ..ReadStats::default()
        };
        let mut distributions: Vec<Option<LabelDistribution>> = vec![None; request.questions.len()];
        for &i in &plan.forced {
            distributions[i] = Some(LabelDistribution(vec![1.0]));
        }
        let base_seed = request.options.seed.unwrap_or(DEFAULT_SEED);
        let reads = plan
            .reads
            .iter()
            .map(|planned| ReadState {
                seed: group_seed(base_seed, planned.seed_group),
                stage: Stage::Prefill,
                readings: Vec::new(),
            })
            .collect();
        Ok(RequestProgress {
            plan,
            draws: request.options.draws,
            rereads: settings.rereads,
            vocab,
            reads,
            distributions,
            stats,
        })
    }

    /// Model reads (prefills) the request needs.
    pub fn read_count(&self) -> usize {
        self.reads.len()
    }

    /// The prompt of read `read`.
    pub fn prompt_ids(&self, read: usize) -> &[u32] {
        &self.plan.reads[read].prompt_ids
    }

    /// What read `read` needs next; `None` once it is done.
    pub fn need(&self, read: usize) -> Option<Need> {
        let state = self.reads.get(read)?;
        let planned = &self.plan.reads[read];
        let seeds = match &state.stage {
            Stage::Prefill => return Some(Need::Prefill),
            Stage::Done => return None,
            Stage::FirstDraw => vec![state.seed],
            Stage::Draws(seeds) => seeds.clone(),
        };
        Some(Need::Draws {
            canvases: seeds
                .iter()
                .map(|&s| noised_canvas(&planned.canvas, &planned.slots, s, self.vocab))
                .collect(),
            positions: planned.slots.iter().map(|s| s.position).collect(),
        })
    }

    /// Read `read` has its prompt prefilled.
    pub fn prefilled(&mut self, read: usize) -> Result<(), ReadError> {
        let draws = self.draws;
        let state = self.state_in(read, |s| matches!(s, Stage::Prefill))?;
        state.stage = match draws {
            Some(n) => Stage::Draws(draw_seeds(state.seed, n as usize)),
            None => Stage::FirstDraw,
        };
        self.stats.reads += 1;
        self.stats.prompt_tokens += self.plan.reads[read].prompt_ids.len() as u64;
        Ok(())
    }

    /// The label ids of read `read`'s slots, in slot order (what a device-side reduction of
    /// its logits gathers).
    pub fn slot_labels(&self, read: usize) -> Vec<Vec<u32>> {
        self.plan.reads[read]
            .slots
            .iter()
            .map(|s| s.label_ids.clone())
            .collect()
    }

    /// The slot rows of the draws read `read` asked for, `[draw][slot]` in order.
    pub fn drawn(&mut self, read: usize, rows: SlotRows<'_>) -> Result<(), ReadError> {
        let rereads = self.rereads;
        let planned = &self.plan.reads[read];
        let slots = planned.slots.len();
        let state = self
            .reads
            .get_mut(read)
            .ok_or_else(|| ReadError::internal(format!("no read {read}")))?;
        let draws = match &state.stage {
            Stage::FirstDraw => 1,
            Stage::Draws(seeds) => seeds.len(),
            other => {
                return Err(ReadError::internal(format!(
                    "read {read} got logits while {other:?}"
                )))
            }
        };
        let vocab = self.vocab as usize;
        if slots == 0 || rows.len(vocab) != draws * slots {
            return Err(ReadError::internal(format!(
                "decoder returned {} slot rows, expected {}",
                rows.len(vocab),
                draws * slots
            )));
        }
        let batch: Vec<Vec<SlotReading>> = (0..draws)
            .map(|draw| {
                planned
                    .slots
                    .iter()
                    .enumerate()
                    .map(|(k, slot)| rows.read(draw * slots + k, &slot.label_ids, vocab))
                    .collect::<Result<Vec<_>, _>>()
            })
            .collect::<Result<_, _>>()
            .map_err(|e: draws::SlotRowError| ReadError::internal(e.to_string()))?;
        let reread = matches!(state.stage, Stage::FirstDraw)
            && rereads
            && batch.first().is_some_and(|first| needs_reread(first));
        state.readings.extend(batch);
        self.stats.draws += draws as u32;
        state.stage = if reread {
            Stage::Draws(reread_seeds(state.seed))
        } else {
            Stage::Done
        };
        if state.stage == Stage::Done {
            for (si, &question) in planned.questions.iter().enumerate() {
                let per_draw: Vec<&SlotReading> = state.readings.iter().map(|d| &d[si]).collect();
                self.distributions[question] =
                    Some(LabelDistribution(mean_distribution(&per_draw)));
            }
        }
        Ok(())
    }

    fn state_in(
        &mut self,
        read: usize,
        expected: impl Fn(&Stage) -> bool,
    ) -> Result<&mut ReadState, ReadError> {
        match self.reads.get_mut(read) {
            Some(state) if expected(&state.stage) => Ok(state),
            Some(state) => Err(ReadError::internal(format!(
                "read {read} is {:?}",
                state.stage
            ))),
            None => Err(ReadError::internal(format!("no read {read}"))),
        }
    }

    /// Whether read `read` is done (cheaper than asking [`RequestProgress::need`], which builds
    /// the next canvases).
    pub fn read_done(&self, read: usize) -> bool {
        self.reads.get(read).is_none_or(|r| r.stage == Stage::Done)
    }

    /// Whether every read is done.
    pub fn is_done(&self) -> bool {
        self.reads.iter().all(|r| r.stage == Stage::Done)
    }

    /// The answer, once every read is done.
    pub fn finish(self) -> Result<ReadOutcome, ReadError> {
        let usage = self.plan.usage();
        let distributions = self
            .distributions
            .into_iter()
            .enumerate()
            .map(|(i, d)| {
                d.ok_or_else(|| ReadError::internal(format!("question {i} was not read")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ReadOutcome {
            distributions,
            usage,
            stats: self.stats,
        })
    }
}

impl ReadTokenizer for crate::tokenizer::Tokenizer {
    fn encode(&self, text: &str) -> Result<Vec<u32>, crate::tokenizer::TokenizerError> {
        crate::tokenizer::Tokenizer::encode(self, text)
    }

    fn chat_prompt_ids(
        &self,
        system: &str,
        user: &str,
    ) -> Result<Vec<u32>, crate::tokenizer::TokenizerError> {
        crate::tokenizer::Tokenizer::encode(self, &crate::tokenizer::render_chat(system, user))
    }

    fn token_id(&self, token: &str) -> Option<u32> {
        crate::tokenizer::Tokenizer::token_id(self, token)
    }

    fn pad_id(&self) -> u32 {
        self.special().pad
    }
}
