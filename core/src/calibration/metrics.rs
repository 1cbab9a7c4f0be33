//! How well distributions fit labels: negative log-likelihood, Brier score, expected calibration
//! error on equal-mass bins, accuracy, and the bins a reliability diagram draws.

use super::fit::PROBABILITY_FLOOR;
use crate::answer::argmax;
use serde::{Deserialize, Serialize};

/// Bins of the expected calibration error: equal-mass (each holds as many answers as the others,
/// give or take one), which is less noisy than equal-width bins where answers crowd near 1.
pub const ECE_BINS: usize = 10;

/// One bin of a reliability diagram: answers whose top probability falls in it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReliabilityBin {
    /// How many answers the bin holds.
    pub count: usize,
    /// Mean top probability of those answers.
    pub confidence: f64,
    /// Share of them whose most likely label was right.
    pub accuracy: f64,
}

/// The metrics of a set of distributions against their labels.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    /// Mean `−ln p(label)`, nats (probabilities floored at 1e-12).
    pub nll: f64,
    /// Mean `Σ_k (p_k − 1[k = label])²` over all labels of the question.
    pub brier: f64,
    /// `Σ_bins (n_bin / n)·|accuracy_bin − confidence_bin|` on [`ECE_BINS`] equal-mass bins of
    /// the top probability.
    pub ece: f64,
    /// Share of answers whose most likely label (first on ties) is the label.
    pub accuracy: f64,
    pub bins: Vec<ReliabilityBin>,
}

/// Metrics of `predictions` (distribution, label index) pairs; `None` when there are none.
pub fn measure(predictions: &[(Vec<f64>, usize)]) -> Option<Metrics> {
    let n = predictions.len();
    if n == 0 {
        return None;
    }
    let mut nll = 0.0;
    let mut brier = 0.0;
    let mut right = 0usize;
    // (top probability, right) per answer, for the bins.
    let mut tops: Vec<(f64, bool)> = Vec::with_capacity(n);
    for (p, label) in predictions {
        nll -= p
            .get(*label)
            .copied()
            .unwrap_or(0.0)
            .max(PROBABILITY_FLOOR)
            .ln();
        brier += p
            .iter()
            .enumerate()
            .map(|(k, pk)| (pk - if k == *label { 1.0 } else { 0.0 }).powi(2))
            .sum::<f64>();
        let best = argmax(p);
        let is_right = best == *label;
        right += usize::from(is_right);
        tops.push((p.get(best).copied().unwrap_or(0.0), is_right));
    }
    let bins = equal_mass_bins(&mut tops, ECE_BINS);
    let ece = bins
        .iter()
        .map(|b| b.count as f64 / n as f64 * (b.accuracy - b.confidence).abs())
        .sum();
    Some(Metrics {
        nll: nll / n as f64,
        brier: brier / n as f64,
        ece,
        accuracy: right as f64 / n as f64,
        bins,
    })
}

/// Sorts by top probability and cuts into `bins` runs of near-equal size (fewer when there are
/// fewer answers than bins).
fn equal_mass_bins(tops: &mut [(f64, bool)], bins: usize) -> Vec<ReliabilityBin> {
    tops.sort_by(|a, b| a.0.total_cmp(&b.0));
    let n = tops.len();
    let bins = bins.min(n).max(1);
    (0..bins)
        .map(|i| {
            let slice = &tops[i * n / bins..(i + 1) * n / bins];
            let count = slice.len().max(1) as f64;
            ReliabilityBin {
                count: slice.len(),
                confidence: slice.iter().map(|t| t.0).sum::<f64>() / count,
                accuracy: slice.iter().filter(|t| t.1).count() as f64 / count,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perfect_certain_answers_score_zero_everywhere() {
        let m = measure(&[(vec![1.0, 0.0], 0), (vec![0.0, 1.0], 1)]).unwrap();
        assert_eq!((m.nll, m.brier, m.ece, m.accuracy), (0.0, 0.0, 0.0, 1.0));
    }

    #[test]
    fn known_values() {
        // Two answers at 0.8 for label 0; one right, one wrong.
        let m = measure(&[(vec![0.8, 0.2], 0), (vec![0.8, 0.2], 1)]).unwrap();
        let nll = (-(0.8f64.ln()) - 0.2f64.ln()) / 2.0;
        assert!((m.nll - nll).abs() < 1e-12);
        // (0.04 + 0.04 + 0.64 + 0.64) / 2
        assert!((m.brier - 0.68).abs() < 1e-12);
        // Both bins: confidence 0.8, accuracy 1 and 0 → mean gap 0.5.
        assert!((m.ece - 0.5).abs() < 1e-12);
        assert_eq!(m.accuracy, 0.5);
        assert_eq!(m.bins.len(), 2);
    }

    #[test]
    fn equal_mass_bins_split_evenly_and_keep_every_answer() {
        let preds: Vec<(Vec<f64>, usize)> = (0..95)
            .map(|i| {
                let p = 0.5 + i as f64 / 200.0;
                (vec![p, 1.0 - p], i % 2)
            })
            .collect();
        let m = measure(&preds).unwrap();
        assert_eq!(m.bins.len(), ECE_BINS);
        assert_eq!(m.bins.iter().map(|b| b.count).sum::<usize>(), 95);
        assert!(m.bins.iter().all(|b| b.count == 9 || b.count == 10));
        assert!(m
            .bins
            .windows(2)
            .all(|w| w[0].confidence <= w[1].confidence));
    }

    #[test]
    fn nothing_to_measure_is_none() {
        assert!(measure(&[]).is_none());
    }
}
