//! Typed questions. Built once from a request (or a policy's WIT call) and never re-parsed.

use serde::{Deserialize, Serialize};

/// A caller's question id: any non-empty or empty string, any Unicode. It names an answer in the
/// response and a field in an error, and never reaches the model (internal ids are `q1…`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct QuestionId(pub String);

impl QuestionId {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for QuestionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// One named option of a choice question. `name` is the caller's (arbitrary string); the read
/// maps it to its own single-token label.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChoiceOption {
    pub name: String,
    /// Rendered description text, `None` when the caller gave none (or null).
    pub description: Option<String>,
}

/// What kind of answer a question wants, with its criteria already rendered to text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum QuestionKind {
    /// Yes/no. Distribution order: `[p_yes, p_no]`.
    Noul {
        /// Text of the `true` criterion, if any.
        yes: Option<String>,
        /// Text of the `false` criterion, if any.
        no: Option<String>,
    },
    /// Named options, in the caller's order. Distribution order: the options'.
    Choice { options: Vec<ChoiceOption> },
    /// Ordered levels, 0-based. Distribution order: the levels'.
    Score { levels: Vec<String> },
}

/// A question as the model sees it: no caller id, only text and structure. Two requests that
/// differ only in question ids produce identical `Question`s, which is what makes renaming ids
/// bit-identical by construction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Question {
    /// Rendered instructions (empty when the caller gave none or null).
    pub instructions: String,
    #[serde(flatten)]
    pub kind: QuestionKind,
}

impl Question {
    /// How many labels (and so probabilities) this question's distribution has.
    pub fn label_count(&self) -> usize {
        match &self.kind {
            QuestionKind::Noul { .. } => 2,
            QuestionKind::Choice { options } => options.len(),
            QuestionKind::Score { levels } => levels.len(),
        }
    }

    /// Bytes of text this question puts into a prompt (instructions, option names and
    /// descriptions, levels): a lower bound on its share of a prompt, before any template.
    pub fn text_bytes(&self) -> usize {
        let kind = match &self.kind {
            QuestionKind::Noul { yes, no } => {
                yes.as_ref().map_or(0, String::len) + no.as_ref().map_or(0, String::len)
            }
            QuestionKind::Choice { options } => options
                .iter()
                .map(|o| o.name.len() + o.description.as_ref().map_or(0, String::len))
                .sum(),
            QuestionKind::Score { levels } => levels.iter().map(String::len).sum(),
        };
        self.instructions.len() + kind
    }

    /// A 1-option choice or a 1-level score is answered without a model read.
    pub fn needs_read(&self) -> bool {
        self.label_count() > 1
    }
}

/// A caller's question: its id beside the id-free question a read sees. Only a model whose
/// prompt names questions by id (llama.cpp's `nimble`) is ever given ids, through
/// [`crate::ReadRequest::asked`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AskedQuestion {
    pub id: QuestionId,
    #[serde(flatten)]
    pub question: Question,
}

/// Most options a choice may have (TypeSafe's contract). A model may read fewer: its
/// [`QuestionLimits`] say how many.
pub const MAX_CHOICE_OPTIONS: usize = 255;
/// Most levels a score may have: simple-jev v1's 50 letter labels (`A`–`Z`, `a`–`x`).
/// TypeSafe's contract calls 10 the usual maximum; a model whose tokenizer cannot give 11 or
/// more levels labels of their own says so in its [`QuestionLimits`] (docs/api.md).
pub const MAX_SCORE_LEVELS: usize = 50;

/// What a model can answer: the contract's limits, or a model's own when they are smaller (a
/// tokenizer with fewer single-token choice labels reads fewer options).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuestionLimits {
    pub max_choice_options: usize,
    pub max_score_levels: usize,
}

impl Default for QuestionLimits {
    fn default() -> Self {
        QuestionLimits {
            max_choice_options: MAX_CHOICE_OPTIONS,
            max_score_levels: MAX_SCORE_LEVELS,
        }
    }
}

impl QuestionLimits {
    /// The smaller of each limit (a model's limits never exceed the contract's).
    pub fn min(self, other: QuestionLimits) -> QuestionLimits {
        QuestionLimits {
            max_choice_options: self.max_choice_options.min(other.max_choice_options),
            max_score_levels: self.max_score_levels.min(other.max_score_levels),
        }
    }
}

/// Why a question cannot be asked of a model. Every variant concerns the question's `criteria`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuestionError {
    #[error("a choice question needs 1 to {limit} options")]
    NoOptions { limit: usize },
    #[error("too many choices: {given} options, this model reads at most {limit}")]
    TooManyOptions { given: usize, limit: usize },
    #[error("option `{0}` appears twice")]
    DuplicateOption(String),
    #[error("a score question needs 1 to {limit} levels")]
    NoLevels { limit: usize },
    #[error("too many score levels: {given} levels, at most {limit}")]
    TooManyLevels { given: usize, limit: usize },
}

impl QuestionError {
    /// The `type` of the field error (FastAPI's vocabulary) a client sees.
    pub fn kind(&self) -> &'static str {
        match self {
            QuestionError::NoOptions { .. } | QuestionError::NoLevels { .. } => "too_short",
            QuestionError::TooManyOptions { .. } | QuestionError::TooManyLevels { .. } => {
                "too_long"
            }
            QuestionError::DuplicateOption(_) => "value_error",
        }
    }
}

impl Question {
    /// Checks the question against a model's limits: the one check the HTTP API, the policy
    /// `read` capability and the accelerator's read planner all use.
    pub fn validate(&self, limits: &QuestionLimits) -> Result<(), QuestionError> {
        match &self.kind {
            QuestionKind::Noul { .. } => Ok(()),
            QuestionKind::Choice { options } => {
                let limit = limits.max_choice_options;
                if options.is_empty() {
                    return Err(QuestionError::NoOptions { limit });
                }
                if options.len() > limit {
                    return Err(QuestionError::TooManyOptions {
                        given: options.len(),
                        limit,
                    });
                }
                let mut seen = std::collections::HashSet::with_capacity(options.len());
                match options.iter().find(|o| !seen.insert(o.name.as_str())) {
                    Some(dup) => Err(QuestionError::DuplicateOption(dup.name.clone())),
                    None => Ok(()),
                }
            }
            QuestionKind::Score { levels } => {
                let limit = limits.max_score_levels;
                if levels.is_empty() {
                    return Err(QuestionError::NoLevels { limit });
                }
                if levels.len() > limit {
                    return Err(QuestionError::TooManyLevels {
                        given: levels.len(),
                        limit,
                    });
                }
                Ok(())
            }
        }
    }
}

/// Questions the crate's unit tests build.
#[cfg(test)]
pub(crate) mod examples {
    use super::*;

    /// A choice among `names` (no descriptions), asked with `instructions`.
    pub fn choice(instructions: &str, names: &[&str]) -> Question {
        Question {
            instructions: instructions.into(),
            kind: QuestionKind::Choice {
                options: names
                    .iter()
                    .map(|n| ChoiceOption {
                        name: n.to_string(),
                        description: None,
                    })
                    .collect(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn choice(names: &[&str]) -> Question {
        examples::choice("", names)
    }

    fn score(n: usize) -> Question {
        Question {
            instructions: String::new(),
            kind: QuestionKind::Score {
                levels: (0..n).map(|i| i.to_string()).collect(),
            },
        }
    }

    #[test]
    fn limits_are_checked_against_the_given_model_limits() {
        let contract = QuestionLimits::default();
        assert_eq!(choice(&["a", "b"]).validate(&contract), Ok(()));
        assert!(matches!(
            choice(&[]).validate(&contract),
            Err(QuestionError::NoOptions { limit: 255 })
        ));
        let names: Vec<String> = (0..256).map(|i| format!("o{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        assert!(matches!(
            choice(&refs).validate(&contract),
            Err(QuestionError::TooManyOptions {
                given: 256,
                limit: 255
            })
        ));
        let small = QuestionLimits {
            max_choice_options: 3,
            ..contract
        };
        assert!(choice(&refs[..3]).validate(&small).is_ok());
        assert!(choice(&refs[..4]).validate(&small).is_err());
        assert_eq!(
            choice(&["a", "a"]).validate(&contract),
            Err(QuestionError::DuplicateOption("a".into()))
        );
        assert!(score(50).validate(&contract).is_ok());
        assert!(matches!(
            score(51).validate(&contract),
            Err(QuestionError::TooManyLevels {
                given: 51,
                limit: 50
            })
        ));
        let ten = QuestionLimits {
            max_score_levels: 10,
            ..contract
        };
        assert!(matches!(
            score(11).validate(&ten),
            Err(QuestionError::TooManyLevels {
                given: 11,
                limit: 10
            })
        ));
        assert!(matches!(
            score(0).validate(&contract),
            Err(QuestionError::NoLevels { .. })
        ));
        assert_eq!(contract.min(small), small);
    }
}
