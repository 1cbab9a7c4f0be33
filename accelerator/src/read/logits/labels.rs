//! Answer labels: v1's label schemes, Hunch's choice labels past v1's 50 letters, and the check
//! that every label is one distinct token at the rendered answer boundary.
//!
//! # Why a per-tokenizer table is exact
//!
//! A label `L` is usable after a rendered prompt `R` when `encode(R + L) == encode(R) + [id]`.
//! Checking that for every label on every request re-encodes the whole prompt once per label
//! (255 labels × a 500-token prompt). Instead, the table checks every label once, at
//! construction, after a probe prompt, and a request reuses the result when its prompt ends the
//! same way.
//!
//! Both tokenizer families a chat model comes with split the text at special (added) tokens
//! before anything else: Hugging Face `tokenizers` extracts added tokens first and normalises,
//! pre-tokenises and merges each stretch of text between them on its own; llama.cpp partitions
//! the text at special tokens and tokenises each raw fragment alone. A fragment's ids depend on
//! its text and on what precedes it only through the special token before it (llama.cpp's SPM
//! space prefix after a special token, an added token's `rstrip`). So when `R = X + S + T` with
//! `S` a special token and `T` free of special tokens, `encode(R + L) = encode(X + S) + seg(T + L)`,
//! and the check reduces to `seg(T + L) == seg(T) + [id]`: a function of `S`, `T` and `L` alone.
//! A request whose prompt ends in the probe's `S + T` (the assistant opening of the template and
//! the prefill), with the tokenizer reporting its last special token where the probe's was, gets
//! exactly the probe's answer for every label. A request that does not gets every label checked
//! on its own prompt.

use super::score::Scoring;
use super::PromptTokenizer;
use hunch_core::{Question, QuestionKind, QuestionLimits, MAX_CHOICE_OPTIONS};
use std::collections::{HashMap, HashSet};

/// The unfinished assistant answer appended to the rendered chat template: the next token the
/// model predicts is the label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Prefill {
    /// `{"answer": "` — letter labels (choice; score above 10 levels).
    Letter,
    /// `{"answer": ` (one trailing space) — digit labels (score up to 10 levels; noul).
    Digit,
}

impl Prefill {
    pub const ALL: [Prefill; 2] = [Prefill::Letter, Prefill::Digit];

    pub fn text(self) -> &'static str {
        match self {
            Prefill::Letter => "{\"answer\": \"",
            Prefill::Digit => "{\"answer\": ",
        }
    }
}

/// How many letters v1 defines: `A`–`Z`, then `a`–`x`.
pub const V1_LETTERS: usize = 50;
/// Most score levels v1 can label (its letters).
pub const MAX_SCORE_LEVELS: usize = V1_LETTERS;
/// Score levels up to this many use digit labels, more use letters.
const MAX_DIGIT_LEVELS: usize = 10;

/// Why a planner could not be built: the tokenizer failed on the probe prompt.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LabelError {
    #[error("the chat template failed on the probe prompt: {0}")]
    Render(String),
    #[error("the tokenizer failed on the probe prompt: {0}")]
    Encode(String),
}

/// v1's letter labels, in order.
pub fn v1_letters() -> impl Iterator<Item = String> {
    ('A'..='Z').chain('a'..='x').map(String::from)
}

/// The labels tried, in this fixed order, for choice options past v1's 50 letters: `y`, `z`,
/// then the upper-case pairs `AA`, `AB`, … `ZZ`, then the lower-case pairs `aa` … `zz`. A
/// tokenizer keeps those that are one distinct token at the answer boundary.
pub fn extra_candidates() -> impl Iterator<Item = String> {
    let pairs = |range: std::ops::RangeInclusive<char>| {
        range
            .clone()
            .flat_map(move |a| range.clone().map(move |b| format!("{a}{b}")))
    };
    ["y", "z"]
        .into_iter()
        .map(String::from)
        .chain(pairs('A'..='Z'))
        .chain(pairs('a'..='z'))
}

/// The first `n` choice labels of a tokenizer for which every candidate is a single token.
pub fn unfiltered_choice_labels(n: usize) -> Vec<String> {
    v1_letters().chain(extra_candidates()).take(n).collect()
}

fn digits(range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|d| d.to_string()).collect()
}

/// A question's label scheme: what it is scored as, its prefill and its label texts in
/// distribution order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuestionLabels {
    pub scoring: Scoring,
    pub prefill: Prefill,
    /// One per option or level; noul: the digits `1`–`9`. Fewer than the question needs when the
    /// labels run out (the planner refuses such a question).
    pub texts: Vec<String>,
}

/// The labels of `question`, choice labels taken from `choice_labels` (a tokenizer's, or
/// [`unfiltered_choice_labels`]).
pub fn question_labels(question: &Question, choice_labels: &[String]) -> QuestionLabels {
    match &question.kind {
        QuestionKind::Choice { options } => QuestionLabels {
            scoring: Scoring::Choice,
            prefill: Prefill::Letter,
            texts: choice_labels.iter().take(options.len()).cloned().collect(),
        },
        QuestionKind::Score { levels } if levels.len() <= MAX_DIGIT_LEVELS => QuestionLabels {
            scoring: Scoring::Score,
            prefill: Prefill::Digit,
            texts: digits(0..levels.len()),
        },
        QuestionKind::Score { levels } => QuestionLabels {
            scoring: Scoring::Score,
            prefill: Prefill::Letter,
            texts: v1_letters().take(levels.len()).collect(),
        },
        QuestionKind::Noul { .. } => QuestionLabels {
            scoring: Scoring::Noul,
            prefill: Prefill::Digit,
            texts: digits(1..10),
        },
    }
}

/// Where a rendered prompt stops depending on what precedes it: the text after the last special
/// token (`tail`, ending in the prefill) and the ids it encodes to there.
#[derive(Debug, Clone)]
struct Boundary {
    tail: String,
    tail_ids: Vec<u32>,
}

/// What each label does after one prefill, learnt on the probe prompt.
#[derive(Debug, Clone)]
struct KindTable {
    /// `None`: the probe has no special token to cut at (or the cut did not behave as one), so
    /// every request checks its labels on its own prompt.
    boundary: Option<Boundary>,
    /// Label text → its token id, or why it is not one token.
    labels: HashMap<String, Result<u32, String>>,
}

/// A tokenizer's labels, checked at the answer boundary of each prefill.
#[derive(Debug, Clone)]
pub struct LabelTables {
    letter: KindTable,
    digit: KindTable,
    /// Choice labels in order: v1's letters while each is one distinct token, then (only when
    /// all 50 are) the extra candidates that are, up to [`MAX_CHOICE_OPTIONS`].
    choice: Vec<String>,
    limits: QuestionLimits,
}

/// The id `label` adds after a prompt that encodes to `base`, given what the prompt followed by
/// the label encodes to; or why it is not exactly one token there.
pub fn boundary_token(base: &[u32], with_label: &[u32], label: &str) -> Result<u32, String> {
    if with_label.len() == base.len() + 1 && with_label.starts_with(base) {
        return Ok(with_label[base.len()]);
    }
    if with_label.starts_with(base) {
        return Err(format!(
            "label `{label}` is not a single token at the answer boundary: it tokenised to {:?}",
            &with_label[base.len()..]
        ));
    }
    // The label merged with the end of the prompt: show where the two encodings part.
    let common = base
        .iter()
        .zip(with_label)
        .take_while(|(a, b)| a == b)
        .count();
    Err(format!(
        "label `{label}` is not a single token at the answer boundary: it merges with the \
         prompt's end, whose tokens {:?} become {:?}",
        &base[common..],
        &with_label[common..]
    ))
}

fn encode<T: PromptTokenizer>(tokenizer: &T, text: &str) -> Result<Vec<u32>, LabelError> {
    tokenizer.encode(text).map_err(LabelError::Encode)
}

impl KindTable {
    /// Checks `labels` after `probe` (a rendered prompt ending in the prefill).
    fn build<T: PromptTokenizer>(
        tokenizer: &T,
        probe: &str,
        labels: &[String],
    ) -> Result<KindTable, LabelError> {
        let base = encode(tokenizer, probe)?;
        let mut table = KindTable {
            boundary: Self::boundary(tokenizer, probe, &base)?,
            labels: HashMap::with_capacity(labels.len()),
        };
        for label in labels {
            // The outcome is recorded in the table: a label that is not one token here is
            // refused when a question needs it, not at load.
            let _recorded = table.check(tokenizer, probe, &base, label)?;
        }
        Ok(table)
    }

    fn check<T: PromptTokenizer>(
        &mut self,
        tokenizer: &T,
        probe: &str,
        base: &[u32],
        label: &str,
    ) -> Result<Result<u32, String>, LabelError> {
        let with_label = encode(tokenizer, &format!("{probe}{label}"))?;
        let result = boundary_token(base, &with_label, label);
        self.labels.insert(label.to_string(), result.clone());
        Ok(result)
    }

    /// The probe's cut after its last special token, when the tokenizer names one and encoding
    /// the two sides apart agrees with encoding the whole (a sanity check of the split).
    fn boundary<T: PromptTokenizer>(
        tokenizer: &T,
        probe: &str,
        base: &[u32],
    ) -> Result<Option<Boundary>, LabelError> {
        let Some(cut) = tokenizer.last_special_end(probe) else {
            return Ok(None);
        };
        let (Some(head), Some(tail)) = (probe.get(..cut), probe.get(cut..)) else {
            return Ok(None);
        };
        let head_ids = encode(tokenizer, head)?;
        if cut == 0 || !base.starts_with(&head_ids) {
            return Ok(None);
        }
        Ok(Some(Boundary {
            tail: tail.to_string(),
            tail_ids: base[head_ids.len()..].to_vec(),
        }))
    }
}

impl LabelTables {
    /// Checks every label of every scheme after `rendered`, a probe prompt of `tokenizer`'s
    /// template (`prompt::probe_messages` rendered).
    pub fn new<T: PromptTokenizer>(
        tokenizer: &T,
        rendered: &str,
    ) -> Result<LabelTables, LabelError> {
        let digit_probe = format!("{rendered}{}", Prefill::Digit.text());
        let digit = KindTable::build(tokenizer, &digit_probe, &digits(0..10))?;

        let letter_probe = format!("{rendered}{}", Prefill::Letter.text());
        let letters: Vec<String> = v1_letters().collect();
        let mut letter = KindTable::build(tokenizer, &letter_probe, &letters)?;

        let mut choice = Vec::new();
        let mut ids = HashSet::new();
        for label in &letters {
            match letter.labels.get(label) {
                Some(Ok(id)) if ids.insert(*id) => choice.push(label.clone()),
                _ => break,
            }
        }
        if choice.len() == V1_LETTERS {
            let base = encode(tokenizer, &letter_probe)?;
            for label in extra_candidates() {
                if choice.len() >= MAX_CHOICE_OPTIONS {
                    break;
                }
                if let Ok(id) = letter.check(tokenizer, &letter_probe, &base, &label)? {
                    if ids.insert(id) {
                        choice.push(label);
                    }
                }
            }
        }

        let distinct_prefix = |table: &KindTable, labels: &[String]| {
            let mut seen = HashSet::new();
            labels
                .iter()
                .take_while(|l| matches!(table.labels.get(*l), Some(Ok(id)) if seen.insert(*id)))
                .count()
        };
        let digit_levels = distinct_prefix(&digit, &digits(0..10));
        let letter_levels = distinct_prefix(&letter, &letters);
        // The largest n such that every score of 1..=n levels is answerable: digits label up to
        // ten levels, v1's letters more.
        let max_score_levels = if digit_levels < MAX_DIGIT_LEVELS {
            digit_levels
        } else if letter_levels > MAX_DIGIT_LEVELS {
            letter_levels
        } else {
            MAX_DIGIT_LEVELS
        };
        let limits = QuestionLimits {
            max_choice_options: choice.len(),
            max_score_levels,
        };
        Ok(LabelTables {
            letter,
            digit,
            choice,
            limits,
        })
    }

    /// The choice labels, in option order.
    pub fn choice_labels(&self) -> &[String] {
        &self.choice
    }

    /// How many options and levels this tokenizer's labels can name.
    pub fn limits(&self) -> QuestionLimits {
        self.limits
    }

    /// The token ids of `labels` after a request's prompt `text` (ending in the prefill), which
    /// encodes to `ids`; or why a label is not one distinct token there.
    pub fn resolve<T: PromptTokenizer>(
        &self,
        tokenizer: &T,
        text: &str,
        ids: &[u32],
        labels: &QuestionLabels,
    ) -> Result<Vec<u32>, LabelFailure> {
        let table = match labels.prefill {
            Prefill::Letter => &self.letter,
            Prefill::Digit => &self.digit,
        };
        let same_boundary = table.boundary.as_ref().is_some_and(|b| {
            text.ends_with(&b.tail)
                && tokenizer.last_special_end(text) == Some(text.len() - b.tail.len())
                && ids.ends_with(&b.tail_ids)
        });
        let mut out = Vec::with_capacity(labels.texts.len());
        let mut seen = HashMap::with_capacity(labels.texts.len());
        for label in &labels.texts {
            let id = match table.labels.get(label) {
                Some(known) if same_boundary => known.clone(),
                _ => {
                    let with_label = tokenizer
                        .encode(&format!("{text}{label}"))
                        .map_err(LabelFailure::Tokenizer)?;
                    boundary_token(ids, &with_label, label)
                }
            }
            .map_err(LabelFailure::Label)?;
            if let Some(first) = seen.insert(id, label) {
                return Err(LabelFailure::Label(format!(
                    "labels `{first}` and `{label}` are the same token ({id}) at the answer boundary"
                )));
            }
            out.push(id);
        }
        Ok(out)
    }
}

/// Why a question's labels could not be resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelFailure {
    /// A label is not one distinct token: the question cannot be asked of this model.
    Label(String),
    /// The tokenizer failed.
    Tokenizer(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_are_fixed_and_distinct() {
        let all = unfiltered_choice_labels(MAX_CHOICE_OPTIONS);
        assert_eq!(all.len(), MAX_CHOICE_OPTIONS);
        assert_eq!(all[0], "A");
        assert_eq!(all[25], "Z");
        assert_eq!(all[26], "a");
        assert_eq!(all[49], "x");
        assert_eq!(all[50], "y");
        assert_eq!(all[51], "z");
        assert_eq!(all[52], "AA");
        assert_eq!(all[53], "AB");
        assert_eq!(all[78], "BA");
        assert_eq!(all[254], "HU");
        assert_eq!(all.iter().collect::<HashSet<_>>().len(), all.len());
        assert_eq!(extra_candidates().count(), 2 + 2 * 26 * 26);
    }

    #[test]
    fn boundary_token_explains_failures() {
        assert_eq!(boundary_token(&[1, 2], &[1, 2, 7], "A"), Ok(7));
        let split = boundary_token(&[1, 2], &[1, 2, 7, 8], "AB").unwrap_err();
        assert!(
            split.contains("`AB`") && split.contains("[7, 8]"),
            "{split}"
        );
        let merged = boundary_token(&[1, 2], &[1, 9], "A").unwrap_err();
        assert!(merged.contains("merges") && merged.contains("[2]") && merged.contains("[9]"));
    }
}
