//! Calibration of label distributions against a user's labels: the pure math.
//!
//! - [`fit`]: a temperature on the log-probabilities (and, for choices with enough labels,
//!   per-option offsets) fitted by minimising the negative log-likelihood.
//! - [`metrics`]: NLL, Brier score, expected calibration error on equal-mass bins, accuracy, and
//!   the reliability bins a diagram draws.
//! - [`cut_points`]: the probability to gate on for a target held-out precision.
//! - [`cross_validate`]: k-fold fitting, so every reported number is measured on labels the
//!   calibration was not fitted on.
//!
//! Reading decision logs and labels, and the file format, belong to the host.

pub mod cross_validate;
pub mod cut_points;
pub mod fit;
pub mod metrics;

pub use cross_validate::{
    cross_validate, CalibrationError, CrossValidated, FOLDS, MIN_LABELS, OFFSET_MIN_PER_LABEL,
};
pub use cut_points::{cut_points, CutPoint, TARGET_PRECISIONS};
pub use fit::{fit, Calibrator, FitOptions};
pub use metrics::{measure, Metrics, ReliabilityBin, ECE_BINS};

/// One labelled answer: the model's distribution and the index of the right label.
#[derive(Debug, Clone, PartialEq)]
pub struct Example {
    pub probabilities: Vec<f64>,
    pub label: usize,
}
