//! Prior correction and order debiasing (`x_prior`, `x_order`; docs/read.md, "Prior correction
//! and order debiasing"), as a [`Reader`] that wraps the model's reader.
//!
//! A small chat model's label distribution carries a prior of its own: it prefers a position
//! ("A", the first option) or a level whatever the state says. Two remedies, both computed from
//! more reads of the same model:
//!
//! - **prior** `divide`: the question is also read about a content-free state ([`PRIOR_STATE`]);
//!   the answer is the state's distribution divided by that one, label by label, renormalised.
//! - **order** `reversed_average` / `cyclic_average`: the options (or levels) are also read
//!   reversed, or in up to [`MAX_CYCLIC_SHIFTS`] cyclic shifts; each read's distribution is
//!   mapped back to the options' own order and the distributions are averaged.
//!
//! A decorator rather than a step of [`crate::answer_set`] so that every caller of a model gets
//! it the same way — `/v1/systemone` and the policies' `read` — and so that it sits *below* a
//! decision's recorder and the calibration: a recorded read holds the question as asked with its
//! corrected distribution (the request's options name the remedy), so labels join to what the
//! caller saw, a calibration is fitted on and applied to corrected answers, and a recorded
//! decision replays without a model. The answer cache sits below it: each extra read is cached
//! as an ordinary isolated read.

use crate::question::{Question, QuestionKind};
use crate::reader::{
    LabelDistribution, QuestionMode, ReadError, ReadOutcome, ReadRequest, ReadStats, Reader,
    ReaderInfo, Usage,
};
pub use crate::remedy::{OrderMode, PriorMode, UnknownMode};
use std::sync::Arc;

/// The content-free state a question's prior is read about.
pub const PRIOR_STATE: &str = "N/A";

/// The most cyclic shifts `cyclic_average` reads (a choice of `n` options reads `min(n, 4)`).
pub const MAX_CYCLIC_SHIFTS: usize = 4;

/// A prior probability is never divided by less than this: a label the model never gives
/// about "N/A" would otherwise take the whole answer.
const PRIOR_FLOOR: f64 = 1e-6;

/// The orders a question is read in: each a permutation `p` where position `j` shows the
/// question's option `p[j]`. A noul has no options to reorder (its labels are the reader's
/// own scale), so it is read as given.
pub fn orders(question: &Question, mode: OrderMode) -> Vec<Vec<usize>> {
    let n = question.label_count();
    let identity: Vec<usize> = (0..n).collect();
    if n < 2 || matches!(question.kind, QuestionKind::Noul { .. }) {
        return vec![identity];
    }
    match mode {
        OrderMode::AsGiven => vec![identity],
        OrderMode::ReversedAverage => vec![identity, (0..n).rev().collect()],
        OrderMode::CyclicAverage => {
            let k = n.min(MAX_CYCLIC_SHIFTS);
            (0..k)
                .map(|j| {
                    let shift = j * n / k;
                    (0..n).map(|p| (p + shift) % n).collect()
                })
                .collect()
        }
    }
}

/// `question` with its options (or levels) shown in `order`.
pub fn reordered(question: &Question, order: &[usize]) -> Question {
    let kind = match &question.kind {
        QuestionKind::Choice { options } => QuestionKind::Choice {
            options: order.iter().map(|&i| options[i].clone()).collect(),
        },
        QuestionKind::Score { levels } => QuestionKind::Score {
            levels: order.iter().map(|&i| levels[i].clone()).collect(),
        },
        noul @ QuestionKind::Noul { .. } => noul.clone(),
    };
    Question {
        instructions: question.instructions.clone(),
        kind,
    }
}

/// A distribution read with the options in `order`, put back in the options' own order.
fn restored(read: &[f64], order: &[usize]) -> Vec<f64> {
    let mut out = vec![0.0; read.len()];
    for (position, &option) in order.iter().enumerate() {
        out[option] = read[position];
    }
    out
}

fn normalised(mut p: Vec<f64>) -> Vec<f64> {
    let sum: f64 = p.iter().sum();
    if sum > 0.0 && sum.is_finite() {
        p.iter_mut().for_each(|x| *x /= sum);
    }
    p
}

/// `p` divided label by label by the prior `q` (floored at [`PRIOR_FLOOR`]), renormalised.
pub fn divide(p: &[f64], q: &[f64]) -> Vec<f64> {
    normalised(
        p.iter()
            .zip(q)
            .map(|(p, q)| p / q.max(PRIOR_FLOOR))
            .collect(),
    )
}

/// The answer from a question's reads in its orders (each in the order it was read, with the
/// prior read in the same order when there is one): each restored to the options' order, divided
/// by its prior, then averaged.
pub fn combine(reads: &[Vec<f64>], priors: Option<&[Vec<f64>]>, orders: &[Vec<usize>]) -> Vec<f64> {
    let n = orders
        .first()
        .map_or(0, Vec::len)
        .max(reads.first().map_or(0, Vec::len));
    let mut sum = vec![0.0; n];
    for (i, (read, order)) in reads.iter().zip(orders).enumerate() {
        let p = restored(read, order);
        let p = match priors.and_then(|q| q.get(i)) {
            Some(q) => divide(&p, &restored(q, order)),
            None => p,
        };
        sum.iter_mut().zip(&p).for_each(|(s, x)| *s += x);
    }
    normalised(sum)
}

/// The model's reader with the remedies its requests ask for; a request that asks for none is
/// passed through unchanged.
pub struct DebiasingReader {
    inner: Arc<dyn Reader>,
}

impl DebiasingReader {
    pub fn new(inner: Arc<dyn Reader>) -> Self {
        DebiasingReader { inner }
    }
}

/// One question of the expanded reads: which of the request's questions, in which order.
struct Slot {
    question: usize,
    order: usize,
}

#[async_trait::async_trait]
impl Reader for DebiasingReader {
    fn model_name(&self) -> &str {
        self.inner.model_name()
    }

    /// Every question is read in each of its orders, about the state and (with a prior) about
    /// [`PRIOR_STATE`]; the remedies are taken out of the options the model sees. Isolated
    /// questions go in one read per state; joint ones in one read per order and state, so each
    /// joint prompt lists every question at most once.
    async fn read(&self, request: ReadRequest) -> Result<ReadOutcome, ReadError> {
        let (prior, order) = (request.options.prior, request.options.order);
        if prior.is_none() && order.is_as_given() {
            return self.inner.read(request).await;
        }
        let mut options = request.options.clone();
        options.prior = PriorMode::None;
        options.order = OrderMode::AsGiven;
        let orders: Vec<Vec<Vec<usize>>> =
            request.questions.iter().map(|q| orders(q, order)).collect();
        let mut slots: Vec<Slot> = Vec::new();
        for (question, its) in orders.iter().enumerate() {
            slots.extend((0..its.len()).map(|order| Slot { question, order }));
        }
        // Groups of slots read together.
        let groups: Vec<Vec<usize>> = match options.questions {
            QuestionMode::Isolated => vec![(0..slots.len()).collect()],
            QuestionMode::Joint => {
                let most = orders.iter().map(Vec::len).max().unwrap_or(1);
                (0..most)
                    .map(|o| (0..slots.len()).filter(|&s| slots[s].order == o).collect())
                    .collect()
            }
        };
        let mut states = vec![request.state.as_str()];
        if !prior.is_none() {
            states.push(PRIOR_STATE);
        }
        // reads[state][slot]
        let mut reads: Vec<Vec<Vec<f64>>> = vec![vec![Vec::new(); slots.len()]; states.len()];
        let (mut usage, mut stats) = (Usage::default(), ReadStats::default());
        for (s, state) in states.iter().enumerate() {
            for group in &groups {
                let origin: Vec<usize> = group.iter().map(|&i| slots[i].question).collect();
                let questions = group
                    .iter()
                    .map(|&i| {
                        let slot = &slots[i];
                        reordered(
                            &request.questions[slot.question],
                            &orders[slot.question][slot.order],
                        )
                    })
                    .collect();
                let outcome = self
                    .inner
                    .read(ReadRequest {
                        state: state.to_string(),
                        questions,
                        options: options.clone(),
                        asked: request.asked_for(&origin),
                    })
                    .await
                    .map_err(|e| e.within(&origin))?;
                if outcome.distributions.len() != group.len() {
                    return Err(ReadError::internal(format!(
                        "the reader returned {} distributions for {} questions",
                        outcome.distributions.len(),
                        group.len()
                    )));
                }
                for (&i, d) in group.iter().zip(outcome.distributions) {
                    if d.0.len() != request.questions[slots[i].question].label_count() {
                        return Err(ReadError::internal(format!(
                            "the reader returned {} probabilities for a question of {} labels",
                            d.0.len(),
                            request.questions[slots[i].question].label_count()
                        )));
                    }
                    reads[s][i] = d.0;
                }
                usage.input_tokens += outcome.usage.input_tokens;
                usage.output_tokens += outcome.usage.output_tokens;
                add(&mut stats, &outcome.stats);
            }
        }
        let distributions = (0..request.questions.len())
            .map(|q| {
                let mine: Vec<usize> = (0..slots.len())
                    .filter(|&i| slots[i].question == q)
                    .collect();
                let of = |s: usize| {
                    mine.iter()
                        .map(|&i| reads[s][i].clone())
                        .collect::<Vec<_>>()
                };
                let priors = (states.len() > 1).then(|| of(1));
                LabelDistribution(combine(&of(0), priors.as_deref(), &orders[q]))
            })
            .collect();
        Ok(ReadOutcome {
            distributions,
            usage,
            stats,
        })
    }

    async fn ready(&self) -> bool {
        self.inner.ready().await
    }

    fn info(&self) -> ReaderInfo {
        self.inner.info()
    }
}

/// `more`'s costs added to `total`'s (counts and times summed, the largest batch kept, the
/// latest gauges).
fn add(total: &mut ReadStats, more: &ReadStats) {
    total.reads += more.reads;
    total.draws += more.draws;
    total.prompt_tokens += more.prompt_tokens;
    total.reused_tokens += more.reused_tokens;
    total.tokenize_seconds += more.tokenize_seconds;
    total.prefill_seconds += more.prefill_seconds;
    total.denoise_seconds += more.denoise_seconds;
    total.cache_hits += more.cache_hits;
    total.answer_cache_hits += more.answer_cache_hits;
    total.forwards += more.forwards;
    total.evaluations += more.evaluations;
    total.operations += more.operations;
    total.max_batch_requests = total.max_batch_requests.max(more.max_batch_requests);
    total.max_batch_rows = total.max_batch_rows.max(more.max_batch_rows);
    total.batch_deviation = match (total.batch_deviation, more.batch_deviation) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    };
    if more.engine.is_some() {
        total.engine = more.engine;
    }
}

#[cfg(test)]
#[path = "debias_tests.rs"]
mod tests;
