//! The label-logit planner: a `ReadRequest` → one token sequence per question, with the ids of
//! the labels whose next-token logits make the question's distribution.

use super::labels::{question_labels, LabelError, LabelFailure, LabelTables};
use super::prompt::{briefing, probe_messages, system_message, user_message};
use super::score::Scoring;
use super::PromptTokenizer;
use hunch_core::{LabelDistribution, QuestionLimits, ReadError, ReadRequest};

/// Plans label-logit reads for one tokenizer. Built once per model: construction checks every
/// label of every scheme at the template's answer boundary.
pub struct LogitPlanner<T: PromptTokenizer> {
    tokenizer: T,
    max_prompt_tokens: usize,
    tables: LabelTables,
}

/// The sequences of one request, one per question, in request order.
#[derive(Debug, Clone, PartialEq)]
pub struct LogitPlan {
    pub sequences: Vec<ScoringSequence>,
}

/// One question's forward pass: score the next token after `tokens`.
#[derive(Debug, Clone, PartialEq)]
pub struct ScoringSequence {
    /// The question's index in the request.
    pub question: usize,
    /// The BOS (if the model wants one), then the rendered template and prefill.
    pub tokens: Vec<u32>,
    /// The label token ids, one per distribution entry's label, in label order (noul: the digits
    /// `1`–`9`).
    pub labels: Vec<u32>,
    pub scoring: Scoring,
}

impl ScoringSequence {
    /// The question's distribution from the logits of [`labels`](Self::labels) at the last
    /// position, in the same order.
    pub fn distribution(&self, label_logits: &[f32]) -> Result<LabelDistribution, ReadError> {
        if label_logits.len() != self.labels.len() {
            return Err(ReadError::internal(format!(
                "question {}: {} label logits for {} labels",
                self.question,
                label_logits.len(),
                self.labels.len()
            )));
        }
        self.scoring.distribution(label_logits)
    }
}

/// `tokenizer`'s label tables, checked after the probe prompt rendered by its template.
pub fn label_tables<T: PromptTokenizer>(tokenizer: &T) -> Result<LabelTables, LabelError> {
    let (system, user) = probe_messages();
    let rendered = tokenizer
        .render_chat(&system, &user)
        .map_err(LabelError::Render)?;
    LabelTables::new(tokenizer, &rendered)
}

impl<T: PromptTokenizer> LogitPlanner<T> {
    /// A planner over `tokenizer`, refusing sequences longer than `max_prompt_tokens`.
    pub fn new(tokenizer: T, max_prompt_tokens: usize) -> Result<Self, LabelError> {
        let tables = label_tables(&tokenizer)?;
        Ok(LogitPlanner {
            tokenizer,
            max_prompt_tokens,
            tables,
        })
    }

    pub fn tokenizer(&self) -> &T {
        &self.tokenizer
    }

    /// How many choice options (at most 255) and score levels (at most v1's 50) this tokenizer's
    /// labels can name.
    pub fn question_limits(&self) -> QuestionLimits {
        self.tables.limits()
    }

    /// The choice labels, in option order: v1's 50 letters, then this tokenizer's extras.
    pub fn choice_labels(&self) -> &[String] {
        self.tables.choice_labels()
    }

    /// One scoring sequence per question of `request`. The request's `draws` and `seed` do not
    /// matter: the read is one deterministic pass.
    pub fn plan(&self, request: &ReadRequest) -> Result<LogitPlan, ReadError> {
        let limits = self.question_limits();
        let mut sequences = Vec::with_capacity(request.questions.len());
        for (index, question) in request.questions.iter().enumerate() {
            let invalid = |message: String| ReadError::InvalidQuestion {
                question: index,
                message,
            };
            question
                .validate(&limits)
                .map_err(|e| invalid(e.to_string()))?;
            let labels = question_labels(question, self.tables.choice_labels());
            let needed = match labels.scoring {
                Scoring::Noul => super::score::NOUL_DIGITS,
                Scoring::Choice | Scoring::Score => question.label_count(),
            };
            if labels.texts.len() != needed {
                // `validate` holds the limits the labels give, so this is a defence only.
                return Err(invalid(format!(
                    "this model has labels for {} of the question's {needed} entries",
                    labels.texts.len()
                )));
            }

            let system = system_message(briefing(request, index));
            let user = user_message(&request.state, question, &labels);
            let rendered = self
                .tokenizer
                .render_chat(&system, &user)
                .map_err(|e| ReadError::internal(format!("chat template: {e}")))?;
            let text = format!("{rendered}{}", labels.prefill.text());
            let ids = self
                .tokenizer
                .encode(&text)
                .map_err(|e| ReadError::internal(format!("tokenizer: {e}")))?;

            let bos = self.tokenizer.bos_for(&rendered);
            let length = ids.len() + usize::from(bos.is_some());
            if length > self.max_prompt_tokens {
                return Err(ReadError::TooLarge {
                    message: format!(
                        "question {index}: the prompt is {length} tokens, this model reads at \
                         most {}",
                        self.max_prompt_tokens
                    ),
                });
            }

            let label_ids = self
                .tables
                .resolve(&self.tokenizer, &text, &ids, &labels)
                .map_err(|failure| match failure {
                    LabelFailure::Label(message) => invalid(message),
                    LabelFailure::Tokenizer(e) => ReadError::internal(format!("tokenizer: {e}")),
                })?;

            let mut tokens = Vec::with_capacity(length);
            tokens.extend(bos);
            tokens.extend(ids);
            sequences.push(ScoringSequence {
                question: index,
                tokens,
                labels: label_ids,
                scoring: labels.scoring,
            });
        }
        Ok(LogitPlan { sequences })
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
