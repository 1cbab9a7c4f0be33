//! k-fold cross-validation: every answer is calibrated by a fit that never saw its label, and
//! the metrics before and after are measured on those held-out answers only.

use super::fit::{fit, Calibrator, FitOptions};
use super::metrics::{measure, Metrics};
use super::Example;
use serde::{Deserialize, Serialize};

/// Folds of the cross-validation.
pub const FOLDS: usize = 5;
/// Fewest labels a question is fitted with: below it, each fold's fit rests on too few answers
/// for its held-out numbers to mean anything.
pub const MIN_LABELS: usize = 30;
/// Per-option offsets are tried only when every option of a choice has at least this many labels.
pub const OFFSET_MIN_PER_LABEL: usize = 20;

/// A question's calibration and what it does on held-out folds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CrossValidated {
    /// Fitted on all the labels: what is served.
    pub calibrator: Calibrator,
    /// The raw distributions against the labels.
    pub before: Metrics,
    /// Each answer calibrated by the fit on the other folds.
    pub after: Metrics,
    /// The temperature each fold's fit found (how stable the fit is).
    pub fold_temperatures: Vec<f64>,
    /// Whether offsets were tried, and whether they beat a temperature alone on held-out NLL.
    pub offsets_tried: bool,
    /// The held-out calibrated distributions, in the examples' order.
    #[serde(skip)]
    pub held_out: Vec<Vec<f64>>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CalibrationError {
    #[error("{given} labels, at least {needed} are needed to fit and test a calibration")]
    TooFewLabels { given: usize, needed: usize },
}

/// A fixed permutation (SplitMix64-seeded Fisher–Yates), so a calibration is reproducible from
/// its labels alone and folds do not follow the log's time order.
fn fold_of(n: usize, folds: usize) -> Vec<usize> {
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    let mut fold = vec![0; n];
    for (position, &index) in order.iter().enumerate() {
        fold[index] = position % folds;
    }
    fold
}

fn held_out(
    examples: &[Example],
    folds: &[usize],
    options: FitOptions,
) -> (Vec<Vec<f64>>, Vec<f64>) {
    let mut out = vec![Vec::new(); examples.len()];
    let mut temperatures = Vec::with_capacity(FOLDS);
    for k in 0..FOLDS {
        let train: Vec<Example> = examples
            .iter()
            .zip(folds)
            .filter(|(_, f)| **f != k)
            .map(|(e, _)| e.clone())
            .collect();
        let c = fit(&train, options);
        temperatures.push(c.temperature);
        for (i, e) in examples.iter().enumerate() {
            if folds[i] == k {
                out[i] = c.apply(&e.probabilities);
            }
        }
    }
    (out, temperatures)
}

/// Fits a temperature (and, for a choice whose every option has enough labels, offsets when they
/// beat a temperature alone on held-out NLL) with [`FOLDS`]-fold cross-validation.
/// `labels_per_option` is the number of labels of a choice (offsets are never tried on nouls and
/// scores: a temperature keeps their order of likelihoods, which is what their users read).
pub fn cross_validate(
    examples: &[Example],
    choice_labels: Option<usize>,
) -> Result<CrossValidated, CalibrationError> {
    if examples.len() < MIN_LABELS {
        return Err(CalibrationError::TooFewLabels {
            given: examples.len(),
            needed: MIN_LABELS,
        });
    }
    let folds = fold_of(examples.len(), FOLDS);
    let pairs = |ps: &[Vec<f64>]| -> Vec<(Vec<f64>, usize)> {
        ps.iter()
            .cloned()
            .zip(examples.iter().map(|e| e.label))
            .collect()
    };
    let raw: Vec<Vec<f64>> = examples.iter().map(|e| e.probabilities.clone()).collect();
    let plain = FitOptions::default();
    let (mut predictions, mut temperatures) = held_out(examples, &folds, plain);
    let mut options = plain;
    let offsets_tried = choice_labels.is_some_and(|k| {
        (0..k).all(|label| {
            examples.iter().filter(|e| e.label == label).count() >= OFFSET_MIN_PER_LABEL
        })
    });
    if offsets_tried {
        let with = FitOptions {
            offsets: true,
            ..plain
        };
        let (p, t) = held_out(examples, &folds, with);
        let nll = |ps: &[Vec<f64>]| measure(&pairs(ps)).map_or(f64::INFINITY, |m| m.nll);
        if nll(&p) < nll(&predictions) {
            predictions = p;
            temperatures = t;
            options = with;
        }
    }
    let (Some(before), Some(after)) = (measure(&pairs(&raw)), measure(&pairs(&predictions))) else {
        return Err(CalibrationError::TooFewLabels {
            given: examples.len(),
            needed: MIN_LABELS,
        });
    };
    Ok(CrossValidated {
        calibrator: fit(examples, options),
        before,
        after,
        fold_temperatures: temperatures,
        offsets_tried,
        held_out: predictions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator for the tests' synthetic labelled sets.
    struct Rng(u64);
    impl Rng {
        fn uniform(&mut self) -> f64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
        }
        fn draw(&mut self, p: &[f64]) -> usize {
            let mut u = self.uniform();
            for (i, pi) in p.iter().enumerate() {
                if u < *pi {
                    return i;
                }
                u -= pi;
            }
            p.len() - 1
        }
    }

    /// `n` model distributions over `k` labels (random logits with spread), each labelled by a
    /// draw from the distribution the model *should* have given: its own at temperature `true_t`.
    fn labelled(n: usize, k: usize, true_t: f64, seed: u64) -> Vec<Example> {
        let mut rng = Rng(seed);
        (0..n)
            .map(|_| {
                let logits: Vec<f64> = (0..k).map(|_| 4.0 * (rng.uniform() - 0.5) * 2.0).collect();
                let model = Calibrator::identity()
                    .apply(&logits.iter().map(|z| z.exp()).collect::<Vec<_>>());
                let truth = Calibrator {
                    temperature: true_t,
                    offsets: None,
                }
                .apply(&model);
                let label = rng.draw(&truth);
                Example {
                    probabilities: model,
                    label,
                }
            })
            .collect()
    }

    // Tolerance: with 2000 labels the NLL's curvature puts the standard error of 1/T near 2–3%;
    // 10% of T is several standard errors, so these tests fail on a wrong fit, not on noise.
    const TOLERANCE: f64 = 0.10;

    #[test]
    fn an_over_confident_model_is_recovered_and_held_out_ece_falls() {
        // Labels follow the model flattened by T = 2: the model is over-confident.
        let examples = labelled(2000, 2, 2.0, 1);
        let cv = cross_validate(&examples, None).unwrap();
        let t = cv.calibrator.temperature;
        assert!((t - 2.0).abs() / 2.0 < TOLERANCE, "T = {t}");
        assert!(
            cv.after.ece < cv.before.ece,
            "{:?} → {:?}",
            cv.before.ece,
            cv.after.ece
        );
        assert!(cv.after.nll < cv.before.nll);
        // A temperature never moves the most likely label.
        assert_eq!(cv.after.accuracy, cv.before.accuracy);
    }

    #[test]
    fn an_under_confident_choice_is_recovered() {
        // T = 0.5: the model is under-confident; labels are sharper than it says.
        let examples = labelled(2000, 4, 0.5, 2);
        let cv = cross_validate(&examples, None).unwrap();
        let t = cv.calibrator.temperature;
        assert!((t - 0.5).abs() / 0.5 < TOLERANCE, "T = {t}");
        assert!(cv.after.ece < cv.before.ece);
    }

    #[test]
    fn a_calibrated_model_is_left_nearly_unchanged() {
        let examples = labelled(2000, 3, 1.0, 3);
        let cv = cross_validate(&examples, Some(3)).unwrap();
        let t = cv.calibrator.temperature;
        assert!((t - 1.0).abs() < TOLERANCE, "T = {t}");
        // Held-out NLL may not get worse by more than noise when there is nothing to fix.
        assert!(cv.after.nll <= cv.before.nll + 0.01);
        let p = [0.6, 0.3, 0.1];
        let q = cv.calibrator.apply(&p);
        for (a, b) in p.iter().zip(&q) {
            assert!((a - b).abs() < 0.05, "{p:?} → {q:?}");
        }
    }

    #[test]
    fn too_few_labels_are_refused_with_the_numbers() {
        let examples = labelled(MIN_LABELS - 1, 2, 1.0, 4);
        assert_eq!(
            cross_validate(&examples, None).unwrap_err(),
            CalibrationError::TooFewLabels {
                given: MIN_LABELS - 1,
                needed: MIN_LABELS
            }
        );
    }

    #[test]
    fn folds_are_balanced_and_fixed() {
        let f = fold_of(103, FOLDS);
        assert_eq!(f, fold_of(103, FOLDS));
        for k in 0..FOLDS {
            let c = f.iter().filter(|x| **x == k).count();
            assert!(c == 20 || c == 21);
        }
    }
}
