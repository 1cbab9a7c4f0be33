//! Cut-points for yes/no questions: the lowest probability of "yes" at which acting alone is
//! right often enough, measured on held-out answers.

use serde::{Deserialize, Serialize};

/// The precisions deployment teams gate on.
pub const TARGET_PRECISIONS: [f64; 3] = [0.9, 0.95, 0.99];

/// Acting when `P(yes) ≥ threshold` was right in `precision` of the `support` held-out cases at
/// or above it, which are `coverage` of all cases.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CutPoint {
    pub target_precision: f64,
    /// `None` when no threshold reaches the target (then coverage and support are 0).
    pub threshold: Option<f64>,
    pub precision: Option<f64>,
    pub coverage: f64,
    pub support: usize,
}

/// For each of [`TARGET_PRECISIONS`], the lowest threshold (so the largest coverage) among the
/// observed `P(yes)` values whose precision reaches it. `cases` are (P(yes), the label is yes).
pub fn cut_points(cases: &[(f64, bool)]) -> Vec<CutPoint> {
    let mut sorted: Vec<(f64, bool)> = cases.to_vec();
    // Highest first: walking down adds cases to the "act" side one threshold at a time.
    sorted.sort_by(|a, b| b.0.total_cmp(&a.0));
    let n = sorted.len();
    // (threshold, precision, support) for every distinct observed value, highest first.
    let mut candidates = Vec::new();
    let mut yes = 0usize;
    let mut i = 0;
    while i < n {
        let t = sorted[i].0;
        while i < n && sorted[i].0 == t {
            yes += usize::from(sorted[i].1);
            i += 1;
        }
        candidates.push((t, yes as f64 / i as f64, i));
    }
    TARGET_PRECISIONS
        .iter()
        .map(|&target| {
            match candidates
                .iter()
                .filter(|c| c.1 >= target)
                .min_by(|a, b| a.0.total_cmp(&b.0))
            {
                Some(&(t, precision, support)) => CutPoint {
                    target_precision: target,
                    threshold: Some(t),
                    precision: Some(precision),
                    coverage: support as f64 / n.max(1) as f64,
                    support,
                },
                None => CutPoint {
                    target_precision: target,
                    threshold: None,
                    precision: None,
                    coverage: 0.0,
                    support: 0,
                },
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lowest_threshold_reaching_the_target_is_chosen() {
        // 10 cases at 0.9 (all yes), 10 at 0.6 (5 yes), 10 at 0.2 (0 yes).
        let mut cases = Vec::new();
        for i in 0..10 {
            cases.push((0.9, true));
            cases.push((0.6, i < 5));
            cases.push((0.2, false));
        }
        let cps = cut_points(&cases);
        assert_eq!(cps.len(), 3);
        for cp in &cps {
            assert_eq!(cp.threshold, Some(0.9));
            assert_eq!(cp.support, 10);
            assert!((cp.coverage - 1.0 / 3.0).abs() < 1e-12);
        }
    }

    #[test]
    fn an_unreachable_target_says_so() {
        let cps = cut_points(&[(0.9, true), (0.8, false), (0.7, true)]);
        // Precision at 0.9 is 1.0: every target is reached there, with coverage 1/3.
        assert_eq!(cps[2].threshold, Some(0.9));
        let cps = cut_points(&[(0.9, false), (0.8, true)]);
        assert!(cps.iter().all(|c| c.threshold.is_none() && c.support == 0));
    }
}
