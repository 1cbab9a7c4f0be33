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

    /// A 1-option choice or a 1-level score is answered without a model read.
    pub fn needs_read(&self) -> bool {
        self.label_count() > 1
    }
}
