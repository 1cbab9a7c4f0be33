//! The calibration file `hunch calibrate` writes (and `--json` prints): per question, what was
//! fitted and what it does on held-out folds; the questions refused; the labels not used.

use super::dataset::{Dataset, Problem};
use hunch_core::calibration::{
    cross_validate, cut_points, measure, CalibrationError, Calibrator, CutPoint, Metrics, ECE_BINS,
    FOLDS, MIN_LABELS,
};
use hunch_core::{Question, QuestionKind};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// The format's name and version, first in every file.
pub const FORMAT: &str = "hunch-calibration/1";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CalibrationFile {
    pub format: String,
    /// How the numbers were measured.
    pub folds: usize,
    pub ece_bins: usize,
    pub ece_binning: String,
    pub min_labels: usize,
    pub questions: Vec<QuestionCalibration>,
    #[serde(default)]
    pub refused: Vec<Refused>,
    /// All held-out answers of the fitted questions together; absent when none was fitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overall: Option<BeforeAfter>,
    /// Labels that were not used, and why.
    #[serde(default)]
    pub problems: Vec<Problem>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BeforeAfter {
    pub labels: usize,
    pub before: Metrics,
    pub after: Metrics,
}

/// One question's calibration.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QuestionCalibration {
    /// sha256 of the rendered question ([`super::question_key`]): what serving matches on.
    pub key: String,
    /// The caller ids it was labelled under (informational).
    pub ids: Vec<String>,
    pub question: Question,
    pub temperature: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offsets: Option<Vec<f64>>,
    /// How many labels it was fitted on.
    pub labels: usize,
    pub fold_temperatures: Vec<f64>,
    /// Measured on held-out folds.
    pub before: Metrics,
    pub after: Metrics,
    /// Nouls only: gate on the calibrated `P(yes)`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cut_points: Vec<CutPoint>,
}

impl QuestionCalibration {
    pub fn calibrator(&self) -> Calibrator {
        Calibrator {
            temperature: self.temperature,
            offsets: self.offsets.clone(),
        }
    }
}

/// A question that was not fitted.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Refused {
    pub key: String,
    pub ids: Vec<String>,
    pub labels: usize,
    pub needed: usize,
    pub reason: String,
}

/// Fits every question of `data`.
pub fn fit_dataset(data: Dataset) -> CalibrationFile {
    let mut questions = Vec::new();
    let mut refused = Vec::new();
    let mut pooled_before = Vec::new();
    let mut pooled_after = Vec::new();
    for (key, set) in data.questions {
        let choice_labels = match &set.question.kind {
            QuestionKind::Choice { options } => Some(options.len()),
            _ => None,
        };
        match cross_validate(&set.examples, choice_labels) {
            Ok(cv) => {
                let cut_points = match set.question.kind {
                    QuestionKind::Noul { .. } => cut_points(
                        &cv.held_out
                            .iter()
                            .zip(&set.examples)
                            .map(|(p, e)| (p[0], e.label == 0))
                            .collect::<Vec<_>>(),
                    ),
                    _ => Vec::new(),
                };
                for (e, p) in set.examples.iter().zip(&cv.held_out) {
                    pooled_before.push((e.probabilities.clone(), e.label));
                    pooled_after.push((p.clone(), e.label));
                }
                questions.push(QuestionCalibration {
                    key,
                    ids: set.ids,
                    question: set.question,
                    temperature: cv.calibrator.temperature,
                    offsets: cv.calibrator.offsets,
                    labels: set.examples.len(),
                    fold_temperatures: cv.fold_temperatures,
                    before: cv.before,
                    after: cv.after,
                    cut_points,
                });
            }
            Err(e @ CalibrationError::TooFewLabels { given, needed }) => refused.push(Refused {
                key,
                ids: set.ids,
                labels: given,
                needed,
                reason: e.to_string(),
            }),
        }
    }
    let overall = match (measure(&pooled_before), measure(&pooled_after)) {
        (Some(before), Some(after)) => Some(BeforeAfter {
            labels: pooled_before.len(),
            before,
            after,
        }),
        _ => None,
    };
    CalibrationFile {
        format: FORMAT.into(),
        folds: FOLDS,
        ece_bins: ECE_BINS,
        ece_binning: "equal-mass bins of the top probability".into(),
        min_labels: MIN_LABELS,
        questions,
        refused,
        overall,
        problems: data.problems,
    }
}

/// A loaded calibration, ready to apply: calibrators by question key, and the file's id.
#[derive(Debug, Clone)]
pub struct Calibrations {
    pub id: String,
    by_key: HashMap<String, Calibrator>,
    /// The whole file, for what shows it (the console's calibration page).
    pub file: std::sync::Arc<CalibrationFile>,
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("not a calibration file: {0}")]
    NotJson(#[from] serde_json::Error),
    #[error("format {0:?}, this version reads {FORMAT:?}")]
    Format(String),
    #[error("question {key}: temperature {temperature} is not a positive finite number")]
    Temperature { key: String, temperature: f64 },
    #[error("question {key}: {offsets} offsets for {labels} labels")]
    Offsets {
        key: String,
        offsets: usize,
        labels: usize,
    },
}

impl Calibrations {
    /// Parses and checks a calibration file's bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Calibrations, LoadError> {
        let file: CalibrationFile = serde_json::from_slice(bytes)?;
        if file.format != FORMAT {
            return Err(LoadError::Format(file.format));
        }
        let mut by_key = HashMap::new();
        for q in &file.questions {
            if !(q.temperature.is_finite() && q.temperature > 0.0) {
                return Err(LoadError::Temperature {
                    key: q.key.clone(),
                    temperature: q.temperature,
                });
            }
            if let Some(o) = &q.offsets {
                if o.len() != q.question.label_count() || o.iter().any(|x| !x.is_finite()) {
                    return Err(LoadError::Offsets {
                        key: q.key.clone(),
                        offsets: o.len(),
                        labels: q.question.label_count(),
                    });
                }
            }
            // The key is recomputed from the question, so a hand-edited key cannot make a
            // calibration apply to another question.
            by_key.insert(super::question_key(&q.question), q.calibrator());
        }
        Ok(Calibrations {
            id: super::file_id(bytes),
            by_key,
            file: std::sync::Arc::new(file),
        })
    }

    /// The calibrator fitted for `question`, if any.
    pub fn for_question(&self, question: &Question) -> Option<&Calibrator> {
        self.by_key.get(&super::question_key(question))
    }

    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calibration::dataset::QuestionSet;
    use crate::calibration::fixtures;
    use hunch_core::calibration::Example;

    fn dataset(n: usize) -> Dataset {
        let mut data = Dataset::default();
        let examples = (0..n)
            .map(|i| {
                let p = 0.55 + 0.4 * (i % 10) as f64 / 10.0;
                Example {
                    probabilities: vec![p, 1.0 - p],
                    // Over-confident: right only 60% of the time whatever it says.
                    label: usize::from(i % 5 >= 3),
                }
            })
            .collect();
        data.questions.insert(
            super::super::question_key(&fixtures::noul("urgent?")),
            QuestionSet {
                question: fixtures::noul("urgent?"),
                ids: vec!["urgent".into()],
                examples,
            },
        );
        data
    }

    #[test]
    fn a_fitted_file_round_trips_and_applies_to_its_question_only() {
        let file = fit_dataset(dataset(100));
        assert_eq!(file.questions.len(), 1);
        let q = &file.questions[0];
        assert!(
            q.temperature > 1.0,
            "over-confident → T > 1, got {}",
            q.temperature
        );
        assert_eq!(q.cut_points.len(), 3);
        let bytes = serde_json::to_vec(&file).unwrap();
        let loaded = Calibrations::from_bytes(&bytes).unwrap();
        assert_eq!(loaded.id, super::super::file_id(&bytes));
        assert!(loaded.for_question(&fixtures::noul("urgent?")).is_some());
        let mut other = fixtures::noul("urgent?");
        other.instructions = "urgent!".into();
        assert!(loaded.for_question(&other).is_none());
    }

    #[test]
    fn too_few_labels_are_refused_with_the_numbers() {
        let file = fit_dataset(dataset(MIN_LABELS - 1));
        assert!(file.questions.is_empty());
        assert_eq!(file.refused[0].labels, MIN_LABELS - 1);
        assert_eq!(file.refused[0].needed, MIN_LABELS);
        assert!(file.refused[0].reason.contains(&MIN_LABELS.to_string()));
    }

    #[test]
    fn broken_files_are_refused() {
        let mut file = fit_dataset(dataset(100));
        file.questions[0].temperature = 0.0;
        let bytes = serde_json::to_vec(&file).unwrap();
        assert!(matches!(
            Calibrations::from_bytes(&bytes),
            Err(LoadError::Temperature { .. })
        ));
        assert!(Calibrations::from_bytes(b"{}").is_err());
    }
}
