//! What the calibration module's unit tests build their inputs from.

use crate::decision::event::ReadEvent;
use hunch_core::{ChoiceOption, LabelDistribution, Question, QuestionKind};

/// A yes/no question with these instructions and no criteria.
pub fn noul(text: &str) -> Question {
    Question {
        instructions: text.into(),
        kind: QuestionKind::Noul {
            yes: None,
            no: None,
        },
    }
}

/// A choice between `options` (no descriptions) with these instructions.
pub fn choice(text: &str, options: &[&str]) -> Question {
    Question {
        instructions: text.into(),
        kind: QuestionKind::Choice {
            options: options
                .iter()
                .map(|n| ChoiceOption {
                    name: (*n).into(),
                    description: None,
                })
                .collect(),
        },
    }
}

/// A successful read of `questions` that answered `dists` (one per question).
pub fn read(questions: Vec<Question>, dists: Vec<Vec<f64>>) -> ReadEvent {
    ReadEvent {
        state: None,
        state_sha256: String::new(),
        questions,
        question_ids: Vec::new(),
        options: Default::default(),
        distributions: Some(dists.into_iter().map(LabelDistribution).collect()),
        calibrated: None,
        usage: Default::default(),
        stats: Default::default(),
        elapsed_ms: 0.0,
        error: None,
    }
}
