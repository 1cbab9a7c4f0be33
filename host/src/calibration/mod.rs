//! Calibration from labelled decisions: joining a labels file to the distributions a decision
//! log ([`dataset`]) or a `hunch batch` output ([`batch`]) recorded, read by [`sources`]; fitting
//! and measuring each question with hunch-core's calibration math, and the calibration file
//! ([`file`]); serving it ([`serve`], for `/v1/systemone` and policies' reads alike).
//! `hunch calibrate` (`cli/calibrate.rs`) is its command line; docs/calibration.md says what is
//! fitted and how to read the numbers.

pub mod batch;
pub mod dataset;
pub mod file;
#[cfg(test)]
mod fixtures;
pub mod labels;
pub mod replay;
pub mod report;
pub mod serve;
pub mod sources;

use hunch_core::Question;
use sha2::{Digest, Sha256};

/// What a calibration is keyed by: sha256 (hex) of the question exactly as the model was asked
/// it (rendered instructions and criteria, no caller id), so a calibration never applies to a
/// question it was not fitted on.
pub fn question_key(question: &Question) -> String {
    // Serialising a `Question` cannot fail (strings and vectors only); an empty key would never
    // match a served question, so a failure could only leave it uncalibrated.
    let bytes = serde_json::to_vec(question).unwrap_or_default();
    hex(&Sha256::digest(&bytes))
}

/// sha256 (hex) of a calibration file's bytes: the id decisions and `/v1/models` name it by.
pub fn file_id(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use hunch_core::QuestionKind;

    #[test]
    fn the_key_follows_the_rendered_question_only() {
        let q = |instructions: &str| Question {
            instructions: instructions.into(),
            kind: QuestionKind::Noul {
                yes: None,
                no: None,
            },
        };
        assert_eq!(question_key(&q("urgent?")), question_key(&q("urgent?")));
        assert_ne!(question_key(&q("urgent?")), question_key(&q("Urgent?")));
        assert_eq!(question_key(&q("x")).len(), 64);
    }
}
