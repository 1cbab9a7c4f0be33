//! Temperature scaling (Guo et al., 2017) and, optionally, per-option offsets ("vector scaling"
//! with one shared scale): calibrated log-probabilities are `ln p / T + b`, renormalised.

use super::Example;
use serde::{Deserialize, Serialize};

/// Probabilities below this count as this in a log-likelihood: a label the model gave zero
/// probability costs `-ln(1e-12) ≈ 27.6` nats instead of infinity, so one such label cannot
/// make every temperature equally bad.
pub const PROBABILITY_FLOOR: f64 = 1e-12;

/// The inverse temperature is searched in `[1/50, 50]`: beyond it a calibration would either
/// erase the model's answer or turn every answer into certainty, which labels never justify.
const MIN_INVERSE_TEMPERATURE: f64 = 0.02;
const MAX_INVERSE_TEMPERATURE: f64 = 50.0;

/// A fitted calibration for one question.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calibrator {
    /// `T > 0`: above 1 flattens (the model was over-confident), below 1 sharpens.
    pub temperature: f64,
    /// Per-label offsets added to the scaled log-probabilities (choices with enough labels);
    /// `None` for a temperature alone, which never changes the most likely label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offsets: Option<Vec<f64>>,
}

impl Calibrator {
    /// The calibration that changes nothing.
    pub fn identity() -> Calibrator {
        Calibrator {
            temperature: 1.0,
            offsets: None,
        }
    }

    /// The calibrated distribution. A zero probability stays zero (its log is −∞ whatever the
    /// temperature), the result sums to one, and the same input gives the same bits every time.
    pub fn apply(&self, probabilities: &[f64]) -> Vec<f64> {
        let beta = 1.0 / self.temperature;
        let offsets = self.offsets.as_deref();
        scaled_softmax(probabilities, beta, offsets)
    }
}

/// `softmax(β·ln p + b)`, computed stably (the largest exponent is subtracted first).
fn scaled_softmax(p: &[f64], beta: f64, offsets: Option<&[f64]>) -> Vec<f64> {
    let logits: Vec<f64> = p
        .iter()
        .enumerate()
        .map(|(i, &pi)| {
            if pi > 0.0 {
                beta * pi.ln() + offsets.and_then(|b| b.get(i)).copied().unwrap_or(0.0)
            } else {
                f64::NEG_INFINITY
            }
        })
        .collect();
    let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if !max.is_finite() {
        // Nothing to scale (an all-zero distribution): leave it as it came.
        return p.to_vec();
    }
    let exps: Vec<f64> = logits.iter().map(|z| (z - max).exp()).collect();
    let total: f64 = exps.iter().sum();
    exps.iter().map(|e| e / total).collect()
}

/// What may be fitted.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FitOptions {
    /// Fit per-label offsets too.
    pub offsets: bool,
    /// L2 penalty on the offsets, per example: keeps them near zero where labels say little.
    pub offset_penalty: f64,
}

impl Default for FitOptions {
    fn default() -> Self {
        FitOptions {
            offsets: false,
            offset_penalty: 1e-3,
        }
    }
}

/// Mean negative log-likelihood of the labels under `softmax(β·ln p + b)`.
fn mean_nll(examples: &[Example], beta: f64, offsets: Option<&[f64]>) -> f64 {
    let total: f64 = examples
        .iter()
        .map(|e| {
            let q = scaled_softmax(&e.probabilities, beta, offsets);
            -q.get(e.label)
                .copied()
                .unwrap_or(0.0)
                .max(PROBABILITY_FLOOR)
                .ln()
        })
        .sum();
    total / examples.len().max(1) as f64
}

/// Golden-section search for the minimum of `f` on `[lo, hi]` in log space. The NLL is convex in
/// β (the scaled logits are linear in β and log-sum-exp is convex), hence unimodal in ln β too.
fn golden_section(f: impl Fn(f64) -> f64, lo: f64, hi: f64) -> f64 {
    let ratio = (5f64.sqrt() - 1.0) / 2.0;
    let (mut a, mut b) = (lo.ln(), hi.ln());
    let mut c = b - ratio * (b - a);
    let mut d = a + ratio * (b - a);
    let (mut fc, mut fd) = (f(c.exp()), f(d.exp()));
    // 80 steps shrink the interval by 0.618^80 ≈ 2e-17 of its width: far below any tolerance.
    for _ in 0..80 {
        if fc <= fd {
            b = d;
            d = c;
            fd = fc;
            c = b - ratio * (b - a);
            fc = f(c.exp());
        } else {
            a = c;
            c = d;
            fc = fd;
            d = a + ratio * (b - a);
            fd = f(d.exp());
        }
    }
    ((a + b) / 2.0).exp()
}

/// Fits a calibration to `examples` by minimising the mean negative log-likelihood. With no
/// examples the identity comes back.
pub fn fit(examples: &[Example], options: FitOptions) -> Calibrator {
    if examples.is_empty() {
        return Calibrator::identity();
    }
    let beta = golden_section(
        |beta| mean_nll(examples, beta, None),
        MIN_INVERSE_TEMPERATURE,
        MAX_INVERSE_TEMPERATURE,
    );
    if !options.offsets {
        return Calibrator {
            temperature: 1.0 / beta,
            offsets: None,
        };
    }
    let (beta, offsets) = fit_offsets(examples, beta, options.offset_penalty);
    Calibrator {
        temperature: 1.0 / beta,
        offsets: Some(offsets),
    }
}

/// Joint gradient descent on (β, b) from the temperature-only optimum, with a backtracking line
/// search; the objective (NLL + penalty·|b|²) is convex, so descent reaches its minimum.
fn fit_offsets(examples: &[Example], beta0: f64, penalty: f64) -> (f64, Vec<f64>) {
    let k = examples
        .iter()
        .map(|e| e.probabilities.len())
        .max()
        .unwrap_or(0);
    let objective = |beta: f64, b: &[f64]| {
        mean_nll(examples, beta, Some(b)) + penalty * b.iter().map(|x| x * x).sum::<f64>()
    };
    let mut beta = beta0;
    let mut b = vec![0.0; k];
    let mut value = objective(beta, &b);
    for _ in 0..500 {
        // Gradient of the mean NLL: for each example, (q − onehot)·(ln p, 1).
        let mut g_beta = 0.0;
        let mut g_b = vec![0.0; k];
        for e in examples {
            let q = scaled_softmax(&e.probabilities, beta, Some(&b));
            for (i, (&qi, &pi)) in q.iter().zip(&e.probabilities).enumerate() {
                let residual = qi - if i == e.label { 1.0 } else { 0.0 };
                if pi > 0.0 {
                    g_beta += residual * pi.ln().max(PROBABILITY_FLOOR.ln());
                }
                g_b[i] += residual;
            }
        }
        let n = examples.len() as f64;
        g_beta /= n;
        for (g, bi) in g_b.iter_mut().zip(&b) {
            *g = *g / n + 2.0 * penalty * bi;
        }
        let norm2 = g_beta * g_beta + g_b.iter().map(|g| g * g).sum::<f64>();
        if norm2 < 1e-18 {
            break;
        }
        let mut step = 1.0;
        let mut improved = false;
        while step > 1e-10 {
            let nb = (beta - step * g_beta).clamp(MIN_INVERSE_TEMPERATURE, MAX_INVERSE_TEMPERATURE);
            let nbias: Vec<f64> = b.iter().zip(&g_b).map(|(bi, g)| bi - step * g).collect();
            let candidate = objective(nb, &nbias);
            if candidate < value - 1e-4 * step * norm2 {
                beta = nb;
                b = nbias;
                value = candidate;
                improved = true;
                break;
            }
            step /= 2.0;
        }
        if !improved {
            break;
        }
    }
    (beta, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_identity_changes_nothing_but_rounding() {
        let p = [0.7, 0.2, 0.1];
        let q = Calibrator::identity().apply(&p);
        for (a, b) in p.iter().zip(&q) {
            assert!((a - b).abs() < 1e-15);
        }
    }

    #[test]
    fn a_temperature_above_one_flattens_and_keeps_the_argmax_and_zeros() {
        let c = Calibrator {
            temperature: 2.0,
            offsets: None,
        };
        let q = c.apply(&[0.9, 0.1, 0.0]);
        assert!(q[0] < 0.9 && q[0] > q[1] && q[1] > 0.1);
        assert_eq!(q[2], 0.0);
        assert!((q.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        // 0.9^(1/2) : 0.1^(1/2) = 3 : 1.
        assert!((q[0] - 0.75).abs() < 1e-12);
    }

    #[test]
    fn golden_section_finds_a_known_minimum() {
        let x = golden_section(|x| (x.ln() - 0.5).powi(2), 0.02, 50.0);
        assert!((x - 0.5f64.exp()).abs() < 1e-6, "{x}");
    }

    #[test]
    fn offsets_recover_a_bias_towards_one_option() {
        // The model says uniform over three options, but the labels are 60/20/20: only offsets
        // (never a temperature) can move a uniform distribution.
        let mut examples = Vec::new();
        for i in 0..500 {
            let label = if i % 5 < 3 { 0 } else { 1 + i % 2 };
            examples.push(Example {
                probabilities: vec![1.0 / 3.0; 3],
                label,
            });
        }
        let c = fit(
            &examples,
            FitOptions {
                offsets: true,
                offset_penalty: 0.0,
            },
        );
        let q = c.apply(&[1.0 / 3.0; 3]);
        assert!((q[0] - 0.6).abs() < 0.01, "{q:?}");
    }
}
