//! Planning a read: questions → internal ids and labels → groups that fit a canvas → for each
//! group the prompt ids, the canvas and each question's slot. Everything that can make a request
//! fail is found here, before the model is touched.

use super::prompt::{
    answer_text, choice_label_candidates, python_strip, score_labels, system_text, AnswerFormat,
    LineStyle, PromptQuestion, EMPTY_THOUGHT, TURN_CLOSE,
};
use crate::tokenizer::TokenizerError;
use hunch_core::{Question, QuestionKind, QuestionLimits, QuestionMode, MAX_CHOICE_OPTIONS};
/// Canvas widths are multiples of this.
pub const CANVAS_STEP: usize = 16;
/// The widest canvas a read may use, whatever the configuration says.
pub const MAX_CANVAS_CAP: usize = 128;

/// What the planner needs from a tokenizer. Implemented by the checkpoint's tokenizer; the read
/// never tokenises a label on its own, only whole texts.
pub trait ReadTokenizer {
    /// Token ids of `text` without added special tokens; special-token texts in it map to their
    /// single ids.
    fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError>;
    /// The chat prompt (system + user, generation prompt, thinking off) as token ids.
    fn chat_prompt_ids(&self, system: &str, user: &str) -> Result<Vec<u32>, TokenizerError>;
    /// The id of a special token by its text.
    fn token_id(&self, token: &str) -> Option<u32>;
    /// The padding id that fills the canvas after the turn close.
    fn pad_id(&self) -> u32;
}

/// Why a read cannot be planned.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    /// `question` indexes the request's questions. A 422 naming that question.
    #[error("question {question}: {message}")]
    Question { question: usize, message: String },
    /// The prompt is longer than the configured cap: a 400.
    #[error("Prompt too long: {tokens} tokens exceeds max context window of {max} tokens")]
    PromptTooLong { tokens: usize, max: usize },
    /// The tokenizer lacks something the read needs (a broken checkpoint).
    #[error("tokenizer: {0}")]
    Tokenizer(String),
}

/// Read settings that come from the model's configuration, not the request.
#[derive(Debug, Clone)]
pub struct PlanSettings {
    /// Widest canvas: `min(configured cap, 128, checkpoint canvas_length)`.
    pub canvas_cap: usize,
    /// Longest prompt a read may prefill.
    pub max_prompt_tokens: usize,
}

/// One question's slot on a canvas: its position and the token id of each label there.
#[derive(Debug, Clone, PartialEq)]
pub struct Slot {
    pub position: usize,
    pub label_ids: Vec<u32>,
}

/// One read: a prompt, its canvas, the questions it answers and where their labels go.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedRead {
    /// Indices into the request's questions, in order.
    pub questions: Vec<usize>,
    pub prompt_ids: Vec<u32>,
    pub canvas: Vec<u32>,
    pub slots: Vec<Slot>,
    /// Canvas tokens the answer occupies: the template and the turn close.
    pub rows: usize,
    /// The rendered system prompt, kept for logs and tests.
    pub system: String,
    /// Which group of its plan this read is: its noise seeds derive from the base seed and this.
    /// An isolated read is group 0 of its own one-question plan, as a one-question request.
    pub seed_group: usize,
}

/// Every read of a request, or certainty for questions that need none.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadPlan {
    pub reads: Vec<PlannedRead>,
    /// Indices of questions answered without a read (one option or level).
    pub forced: Vec<usize>,
    /// The answer format of the joint plan; an isolated plan's reads are each `Lines`.
    pub format: AnswerFormat,
    pub mode: QuestionMode,
}

impl ReadPlan {
    /// Joint: the reference's usage, the longest read prompt as input and the answer rows as
    /// output. Isolated: every read's prompt and answer rows, summed (each is a read performed).
    pub fn usage(&self) -> hunch_core::Usage {
        let prompts = self.reads.iter().map(|r| r.prompt_ids.len());
        let input = match self.mode {
            QuestionMode::Joint => prompts.max().unwrap_or(0),
            QuestionMode::Isolated => prompts.sum(),
        };
        hunch_core::Usage {
            input_tokens: input as u64,
            output_tokens: self.reads.iter().map(|r| r.rows).sum::<usize>() as u64,
        }
    }
}

/// Builds read plans for one tokenizer. Made once per model: it tokenises the canvas head and
/// finds the choice labels that are single tokens for this tokenizer.
pub struct Planner<T> {
    tokenizer: T,
    head: Vec<u32>,
    turn_close: u32,
    pad: u32,
    choice_labels: Vec<String>,
    settings: PlanSettings,
}

impl<T: ReadTokenizer> Planner<T> {
    pub fn new(tokenizer: T, settings: PlanSettings) -> Result<Self, PlanError> {
        let head = tokenizer
            .encode(EMPTY_THOUGHT)
            .map_err(|e| PlanError::Tokenizer(e.to_string()))?;
        let turn_close = tokenizer
            .token_id(TURN_CLOSE)
            .ok_or_else(|| PlanError::Tokenizer(format!("no {TURN_CLOSE} token")))?;
        let pad = tokenizer.pad_id();
        let choice_labels = single_token_labels(&tokenizer)?;
        Ok(Planner {
            tokenizer,
            head,
            turn_close,
            pad,
            choice_labels,
            settings,
        })
    }

    pub fn tokenizer(&self) -> &T {
        &self.tokenizer
    }

    pub fn settings(&self) -> &PlanSettings {
        &self.settings
    }

    /// The choice labels this tokenizer supports, in order.
    pub fn choice_labels(&self) -> &[String] {
        &self.choice_labels
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>, PlanError> {
        self.tokenizer
            .encode(text)
            .map_err(|e| PlanError::Tokenizer(e.to_string()))
    }

    /// What this model can answer: the contract's limits, fewer options when the tokenizer has
    /// fewer single-token choice labels.
    pub fn question_limits(&self) -> QuestionLimits {
        QuestionLimits {
            max_choice_options: self.choice_labels.len(),
            // The reference read (djev) labels scores of up to TypeSafe's usual ten levels.
            max_score_levels: 10,
        }
        .min(QuestionLimits::default())
    }

    /// Plans the reads of `questions` about `state` in `mode`. Isolated: each question that
    /// needs a read gets exactly the plan of a one-question request (prompt, canvas, slots, seed
    /// group 0); joint: [`Planner::plan`].
    pub fn plan_mode(
        &self,
        state: &str,
        questions: &[Question],
        mode: QuestionMode,
    ) -> Result<ReadPlan, PlanError> {
        if mode == QuestionMode::Joint {
            return self.plan(state, questions);
        }
        let mut reads = Vec::new();
        let mut forced = Vec::new();
        for (index, question) in questions.iter().enumerate() {
            let alone = self
                .plan(state, std::slice::from_ref(question))
                .map_err(|e| match e {
                    PlanError::Question { message, .. } => PlanError::Question {
                        question: index,
                        message,
                    },
                    other => other,
                })?;
            if alone.reads.is_empty() {
                forced.push(index);
            }
            for mut read in alone.reads {
                read.questions = vec![index];
                reads.push(read);
            }
        }
        Ok(ReadPlan {
            reads,
            forced,
            format: AnswerFormat::for_question_count(1),
            mode,
        })
    }

    /// Plans every read for `state` (already rendered text) and `questions`, all in one prompt
    /// (split into groups only when the canvas cannot hold every answer): the joint read.
    pub fn plan(&self, state: &str, questions: &[Question]) -> Result<ReadPlan, PlanError> {
        let mut prompt_questions: Vec<(usize, PromptQuestion)> = Vec::new();
        let mut forced = Vec::new();
        for (index, question) in questions.iter().enumerate() {
            self.check_limits(index, question)?;
            if !question.needs_read() {
                forced.push(index);
                continue;
            }
            let id = format!("q{}", prompt_questions.len() + 1);
            prompt_questions.push((index, self.prompt_question(id, question)));
        }
        let format = AnswerFormat::for_question_count(prompt_questions.len());
        let groups = self.groups(&prompt_questions, format)?;
        let state = python_strip(state);
        let mut reads = Vec::with_capacity(groups.len());
        for (seed_group, group) in groups.into_iter().enumerate() {
            let members: Vec<&PromptQuestion> =
                group.iter().map(|&i| &prompt_questions[i].1).collect();
            let system = system_text(&members, format);
            let prompt_ids = self
                .tokenizer
                .chat_prompt_ids(&system, state)
                .map_err(|e| PlanError::Tokenizer(e.to_string()))?;
            if prompt_ids.len() > self.settings.max_prompt_tokens {
                return Err(PlanError::PromptTooLong {
                    tokens: prompt_ids.len(),
                    max: self.settings.max_prompt_tokens,
                });
            }
            let indices: Vec<usize> = group.iter().map(|&i| prompt_questions[i].0).collect();
            let (canvas, slots) = self.canvas(&members, &indices, format)?;
            let rows = canvas
                .iter()
                .position(|&t| t == self.turn_close)
                .map(|p| p + 1)
                .unwrap_or(canvas.len());
            reads.push(PlannedRead {
                questions: indices,
                prompt_ids,
                canvas,
                slots,
                rows,
                system,
                seed_group,
            });
        }
        Ok(ReadPlan {
            reads,
            forced,
            format,
            mode: QuestionMode::Joint,
        })
    }

    fn check_limits(&self, index: usize, question: &Question) -> Result<(), PlanError> {
        question
            .validate(&self.question_limits())
            .map_err(|e| PlanError::Question {
                question: index,
                message: e.to_string(),
            })
    }

    fn prompt_question(&self, id: String, question: &Question) -> PromptQuestion {
        let text = |s: &Option<String>| s.as_deref().map(python_strip).unwrap_or("").to_string();
        let (style, labels, options) = match &question.kind {
            QuestionKind::Noul { yes, no } => (
                LineStyle::Noul,
                vec!["yes".to_string(), "no".to_string()],
                vec![("yes".to_string(), text(yes)), ("no".to_string(), text(no))],
            ),
            QuestionKind::Choice { options } => (
                LineStyle::Choice,
                self.choice_labels[..options.len()].to_vec(),
                options
                    .iter()
                    .map(|o| (o.name.clone(), text(&o.description)))
                    .collect(),
            ),
            QuestionKind::Score { levels } => (
                LineStyle::Score,
                score_labels(levels.len()),
                levels
                    .iter()
                    .enumerate()
                    .map(|(i, l)| (i.to_string(), python_strip(l).to_string()))
                    .collect(),
            ),
        };
        PromptQuestion {
            id,
            instructions: python_strip(&question.instructions).to_string(),
            style,
            labels,
            options,
        }
    }

    /// Packs questions, in order, into the fewest groups whose answer template (head + answer +
    /// turn close) fits the canvas cap. Returns indices into `questions`.
    fn groups(
        &self,
        questions: &[(usize, PromptQuestion)],
        format: AnswerFormat,
    ) -> Result<Vec<Vec<usize>>, PlanError> {
        let mut groups = Vec::new();
        let mut group: Vec<usize> = Vec::new();
        for i in 0..questions.len() {
            let mut trial = group.clone();
            trial.push(i);
            let members: Vec<&PromptQuestion> = trial.iter().map(|&t| &questions[t].1).collect();
            let answer = answer_text(&members, &vec![0; members.len()], format);
            let needed = self.head.len() + self.encode(&answer)?.len() + 1;
            // A question that does not fit even alone still gets its own read, with a canvas
            // just wide enough (the reference does the same rather than refuse it).
            if needed > self.settings.canvas_cap && !group.is_empty() {
                groups.push(std::mem::take(&mut group));
                group.push(i);
            } else {
                group = trial;
            }
        }
        if !group.is_empty() {
            groups.push(group);
        }
        Ok(groups)
    }

    /// The canvas of one read and each question's slot: every label must change exactly one
    /// template token, at the same position for all of a question's labels.
    fn canvas(
        &self,
        members: &[&PromptQuestion],
        indices: &[usize],
        format: AnswerFormat,
    ) -> Result<(Vec<u32>, Vec<Slot>), PlanError> {
        let base = vec![0usize; members.len()];
        let mut template = self.head.clone();
        template.extend(self.encode(&answer_text(members, &base, format))?);
        let mut slots = Vec::with_capacity(members.len());
        for (qi, q) in members.iter().enumerate() {
            let not_one_slot = || PlanError::Question {
                question: indices[qi],
                message: "labels do not share one template slot for this model's tokenizer".into(),
            };
            let mut position: Option<usize> = None;
            let mut label_ids = vec![0u32; q.labels.len()];
            for (li, label_id) in label_ids.iter_mut().enumerate().skip(1) {
                let mut choice = base.clone();
                choice[qi] = li;
                let mut ids = self.head.clone();
                ids.extend(self.encode(&answer_text(members, &choice, format))?);
                if ids.len() != template.len() {
                    return Err(not_one_slot());
                }
                let diffs: Vec<usize> = (0..ids.len()).filter(|&i| ids[i] != template[i]).collect();
                if diffs.len() != 1 || position.is_some_and(|p| p != diffs[0]) {
                    return Err(not_one_slot());
                }
                position = Some(diffs[0]);
                *label_id = ids[diffs[0]];
            }
            let position = position.ok_or_else(not_one_slot)?;
            label_ids[0] = template[position];
            let mut distinct = label_ids.clone();
            distinct.sort_unstable();
            distinct.dedup();
            if distinct.len() != label_ids.len() {
                return Err(PlanError::Question {
                    question: indices[qi],
                    message: "two labels tokenize to the same id".into(),
                });
            }
            slots.push(Slot {
                position,
                label_ids,
            });
        }
        let needed = template.len() + 1;
        let width = self
            .settings
            .canvas_cap
            .min(needed.div_ceil(CANVAS_STEP) * CANVAS_STEP);
        let mut canvas = template;
        canvas.push(self.turn_close);
        canvas.resize(width.max(needed), self.pad);
        Ok((canvas, slots))
    }
}

/// Choice labels that stay one token after `"q1: "`, distinct, in the reference's order: a
/// candidate is kept when `"q1: " + label` tokenises to the same prefix as `"q1: A"` and one
/// final token not seen before.
fn single_token_labels<T: ReadTokenizer>(tokenizer: &T) -> Result<Vec<String>, PlanError> {
    let base = tokenizer
        .encode("q1: A")
        .map_err(|e| PlanError::Tokenizer(e.to_string()))?;
    let mut labels = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for label in choice_label_candidates() {
        let ids = tokenizer
            .encode(&format!("q1: {label}"))
            .map_err(|e| PlanError::Tokenizer(e.to_string()))?;
        let same_shape = ids.len() == base.len()
            && !ids.is_empty()
            && ids[..ids.len() - 1] == base[..base.len() - 1];
        if same_shape && seen.insert(ids[ids.len() - 1]) {
            labels.push(label);
            if labels.len() == MAX_CHOICE_OPTIONS {
                break;
            }
        }
    }
    Ok(labels)
}

#[cfg(test)]
mod tests;
