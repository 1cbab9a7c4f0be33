//! Which read plans a causal model's requests: the label-logit read of a chat model
//! (`read::logits`), or a llama.cpp decision model's own (`read::decision`), chosen at load
//! from the checkpoint's metadata. Both hand the engine token sequences whose last position's
//! label logits it computes (a kev model: its pointer head's scores at its markers,
//! [`Plan::markers`]); the plan turns those into each question's distribution.

use hunch_core::{LabelDistribution, QuestionLimits, ReadError, ReadRequest};

use crate::read::decision::{DecisionPlanner, Readout};
use crate::read::logits::{LogitPlanner, ScoringSequence};
use crate::tokenizer::chat::ChatTokenizer;

/// The name of the chat read in fingerprints (the v1 prompt structure over label logits).
pub const LOGIT_READ_VERSION: &str = "logits-v1";
/// The name of the decision-model read in fingerprints.
pub const DECISION_READ_VERSION: &str = "decision-v1";

/// The planner of one loaded model.
pub enum Planner {
    Chat(LogitPlanner<ChatTokenizer>),
    Decision(DecisionPlanner<ChatTokenizer>),
}

/// One request's sequences and how their label logits become its distributions.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// One per question (the chat read), or one per question and variant (a decision model).
    pub sequences: Vec<ScoringSequence>,
    /// A decision model's readouts, one per question; `None`: one sequence per question.
    readouts: Option<Vec<Readout>>,
    /// A kev model's marker positions, one list per sequence: its scores are its pointer
    /// head's at those positions, not label logits.
    markers: Option<Vec<Vec<usize>>>,
}

impl Planner {
    pub fn plan(&self, request: &ReadRequest) -> Result<Plan, ReadError> {
        Ok(match self {
            Planner::Chat(p) => Plan {
                sequences: p.plan(request)?.sequences,
                readouts: None,
                markers: None,
            },
            Planner::Decision(p) => {
                let plan = p.plan(request)?;
                Plan {
                    sequences: plan.sequences,
                    readouts: Some(plan.readouts),
                    markers: plan.markers,
                }
            }
        })
    }

    pub fn question_limits(&self) -> QuestionLimits {
        match self {
            Planner::Chat(p) => p.question_limits(),
            Planner::Decision(p) => p.question_limits(),
        }
    }

    /// Whether the model's prompt names questions by the caller's ids (a nimble decision model):
    /// its reads need them ([`hunch_core::ReadRequest::asked`]).
    pub fn reads_question_ids(&self) -> bool {
        match self {
            Planner::Chat(_) => false,
            Planner::Decision(p) => p.reads_question_ids(),
        }
    }

    /// The read's name in fingerprints and `/v1/models` (`x_read`).
    pub fn read_name(&self) -> &'static str {
        match self {
            Planner::Chat(_) => LOGIT_READ_VERSION,
            Planner::Decision(_) => "decision",
        }
    }

    /// The read's version in fingerprints.
    pub fn read_version(&self) -> String {
        match self {
            Planner::Chat(_) => LOGIT_READ_VERSION.to_string(),
            Planner::Decision(p) => format!("{DECISION_READ_VERSION}-{}", p.kind().name()),
        }
    }

    /// A decision model's type (`openjev`, `lev`, `pplx-decider`).
    pub fn decision_type(&self) -> Option<&'static str> {
        match self {
            Planner::Chat(_) => None,
            Planner::Decision(p) => Some(p.kind().name()),
        }
    }

    pub fn tokenizer(&self) -> &ChatTokenizer {
        match self {
            Planner::Chat(p) => p.tokenizer(),
            Planner::Decision(p) => p.tokenizer(),
        }
    }
}

impl Plan {
    /// A kev model's marker positions, one list per sequence (`None`: a label-logit read).
    pub fn markers(&self) -> Option<&[Vec<usize>]> {
        self.markers.as_deref()
    }

    /// Each question's distribution, from each sequence's label logits (in sequence order).
    pub fn distributions(&self, logits: &[Vec<f32>]) -> Result<Vec<LabelDistribution>, ReadError> {
        match &self.readouts {
            None => self
                .sequences
                .iter()
                .zip(logits)
                .map(|(sequence, logits)| sequence.distribution(logits))
                .collect(),
            Some(readouts) => crate::read::decision::distributions(readouts, logits),
        }
    }
}
