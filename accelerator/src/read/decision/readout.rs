//! From a decision question's label logits to its distribution, as llama-server's
//! `format_answer` computes it: a softmax over each variant's label logits at the fitted
//! temperature (in f64, the maximum subtracted in f32 first), the variants averaged (the
//! second one's entries put back in the question's order), then
//!
//! - noul: `[P(true), P(false)]`; lev: the expected rating `Σ p_i · i / 8` as P(true);
//! - choice and score: one probability per option or level, in the question's order.
//!
//! The host turns these into answers with the same formulas llama-server uses (argmax with
//! the first of equal maxima, `Σ i·p_i`, TypeSafe's confidences; `hunch_core::answer`).

use std::collections::BTreeMap;
use std::ops::Range;

use crate::checkpoint::gguf::DecisionKind;
use hunch_core::{LabelDistribution, Question, QuestionKind, ReadError};

use super::LEV_RATINGS;

/// How one question's sequences become its distribution.
#[derive(Debug, Clone, PartialEq)]
pub struct Readout {
    /// The question's sequences in the plan: its variants, in order.
    pub sequences: Range<usize>,
    pub temperature: f32,
    shape: Shape,
    /// Label logits each variant reads (the question's options, or lev's 9 ratings).
    outputs: usize,
    variants: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// P(true) is the entry at this index.
    Noul { true_at: usize },
    /// P(true) is the expected rating.
    NoulScale,
    /// One entry per option or level.
    Each,
}

impl Readout {
    /// The readout of `question` on a model of `kind` with these fitted temperatures.
    pub fn new(
        kind: DecisionKind,
        question: &Question,
        temperatures: &BTreeMap<String, f32>,
    ) -> Readout {
        let options = question.label_count();
        let (shape, outputs) = match (&question.kind, kind) {
            (QuestionKind::Noul { .. }, DecisionKind::Lev) => (Shape::NoulScale, LEV_RATINGS),
            // openjev lists `true` first, the others `false` first.
            (QuestionKind::Noul { .. }, DecisionKind::Openjev) => (Shape::Noul { true_at: 0 }, 2),
            (QuestionKind::Noul { .. }, _) => (Shape::Noul { true_at: 1 }, 2),
            _ => (Shape::Each, options),
        };
        let variants = match (&question.kind, kind) {
            (QuestionKind::Choice { .. }, DecisionKind::Lev) if options > 1 => 2,
            _ => 1,
        };
        Readout {
            sequences: 0..0,
            temperature: temperature(kind, question, temperatures),
            shape,
            outputs,
            variants,
        }
    }

    /// The same readout over the plan's sequences `range`.
    pub fn over(mut self, range: Range<usize>) -> Readout {
        self.sequences = range;
        self
    }

    /// How many prompts the question takes (lev's choices: two).
    pub fn variants(&self) -> usize {
        self.variants
    }

    /// How many label logits each prompt is read at.
    pub fn outputs(&self) -> usize {
        self.outputs
    }

    /// The distribution from each variant's label logits, in variant order.
    pub fn distribution(&self, logits: &[Vec<f32>]) -> Result<LabelDistribution, ReadError> {
        if logits.len() != self.variants {
            return Err(ReadError::internal(format!(
                "{} variants read for a question of {}",
                logits.len(),
                self.variants
            )));
        }
        let n = self.outputs;
        let mut probs = vec![0.0f64; n];
        for (variant, scores) in logits.iter().enumerate() {
            if scores.len() != n {
                return Err(ReadError::internal(format!(
                    "{} label logits for {n} labels",
                    scores.len()
                )));
            }
            if let Some(bad) = scores.iter().find(|s| !s.is_finite()) {
                return Err(ReadError::internal(format!(
                    "the model produced a non-finite label logit ({bad})"
                )));
            }
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let exps: Vec<f64> = scores
                .iter()
                .map(|&s| (f64::from(s - max) / f64::from(self.temperature)).exp())
                .collect();
            let sum: f64 = exps.iter().sum();
            for (i, e) in exps.iter().enumerate() {
                // The second variant lists the options in reverse.
                let at = if variant == 0 { i } else { n - 1 - i };
                probs[at] += e / sum / logits.len() as f64;
            }
        }
        Ok(LabelDistribution(match self.shape {
            Shape::Each => probs,
            Shape::Noul { true_at } => vec![probs[true_at], probs[1 - true_at]],
            Shape::NoulScale => {
                let yes: f64 = probs
                    .iter()
                    .enumerate()
                    .map(|(i, p)| p * i as f64 / (n - 1) as f64)
                    .sum();
                vec![yes, 1.0 - yes]
            }
        }))
    }
}

/// The fitted temperature of `question`: `<type>.<bucket>`, else `<type>`, else 1. The buckets
/// are the option counts the temperatures were fitted on (lev: `small` ≤ 8, `mid` ≤ 26,
/// `large`; the others: `2`, `3_5`, `6_10`, `11`); a noul counts its two options.
fn temperature(
    kind: DecisionKind,
    question: &Question,
    temperatures: &BTreeMap<String, f32>,
) -> f32 {
    let n = question.label_count();
    let bucket = match kind {
        DecisionKind::Lev => match n {
            0..=8 => "small",
            9..=26 => "mid",
            _ => "large",
        },
        _ => match n {
            0..=2 => "2",
            3..=5 => "3_5",
            6..=10 => "6_10",
            _ => "11",
        },
    };
    let name = match question.kind {
        QuestionKind::Noul { .. } => "noul",
        QuestionKind::Choice { .. } => "choice",
        QuestionKind::Score { .. } => "score",
    };
    temperatures
        .get(&format!("{name}.{bucket}"))
        .or_else(|| temperatures.get(name))
        .copied()
        .unwrap_or(1.0)
}
