//! From the logits of a question's permitted labels to its label distribution.
//!
//! Only the permitted labels are normalised (a softmax in f64, the maximum subtracted first), so
//! the rest of the vocabulary never takes mass. Choice and score hand the host one probability
//! per option or level; the host's argmax, expectation `Σ i·p_i` and confidences
//! (`hunch_core::answer`) are v1's answers: for a score, v1's expected rubric index is that same
//! sum over the levels in order, whether the labels are digits or letters. A noul's nine digit
//! probabilities become v1's yes-probability here, because the host's noul distribution is
//! `[p_yes, p_no]`.

use hunch_core::{LabelDistribution, ReadError};

/// How a question's label probabilities become its distribution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scoring {
    /// One probability per option, in option order.
    Choice,
    /// One probability per level, in level order.
    Score,
    /// The digits `1`–`9`, folded into `[p_yes, 1 − p_yes]`.
    Noul,
}

/// How many labels a noul's rating has.
pub const NOUL_DIGITS: usize = 9;

/// Softmax over `logits` in f64, max-subtracted; refuses a non-finite logit.
pub fn softmax(logits: &[f32]) -> Result<Vec<f64>, ReadError> {
    if logits.is_empty() {
        return Err(ReadError::internal("no label logits to normalise"));
    }
    if let Some(bad) = logits.iter().find(|x| !x.is_finite()) {
        return Err(ReadError::internal(format!(
            "the model produced a non-finite label logit ({bad})"
        )));
    }
    let max = logits
        .iter()
        .fold(f64::NEG_INFINITY, |m, &x| m.max(x as f64));
    let exps: Vec<f64> = logits.iter().map(|&x| (x as f64 - max).exp()).collect();
    // The maximum contributes exp(0) = 1, so the sum is at least 1: never a division by zero.
    let total: f64 = exps.iter().sum();
    Ok(exps.into_iter().map(|e| e / total).collect())
}

/// v1's noul yes-probability from the nine rating probabilities (`p[i]` for digit `i + 1`): the
/// expected rating `r` mapped linearly from [1, 9] onto [0.01, 0.99].
pub fn noul_yes(p: &[f64]) -> f64 {
    let r: f64 = p
        .iter()
        .enumerate()
        .map(|(i, pi)| (i as f64 + 1.0) * pi)
        .sum();
    (0.01 + (r / 10.0 - 0.1) * (0.98 / 0.8)).clamp(0.01, 0.99)
}

impl Scoring {
    /// The distribution of a question from its labels' logits, in label order.
    pub fn distribution(self, label_logits: &[f32]) -> Result<LabelDistribution, ReadError> {
        if self == Scoring::Noul && label_logits.len() != NOUL_DIGITS {
            return Err(ReadError::internal(format!(
                "a noul needs {NOUL_DIGITS} label logits, got {}",
                label_logits.len()
            )));
        }
        let p = softmax(label_logits)?;
        Ok(LabelDistribution(match self {
            Scoring::Choice | Scoring::Score => p,
            Scoring::Noul => {
                let yes = noul_yes(&p);
                vec![yes, 1.0 - yes]
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hunch_core::{Answer, Question, QuestionKind};

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn softmax_normalises_only_the_given_logits() {
        let p = softmax(&[3.0, 1.0]).unwrap();
        let e = (-2.0f64).exp();
        assert!(close(p[0], 1.0 / (1.0 + e)) && close(p[1], e / (1.0 + e)));
        // v1's example: A = 3, B = 1 gives about 0.881 / 0.119.
        assert!((p[0] - 0.881).abs() < 5e-4);
        // Large logits do not overflow: the maximum is subtracted first.
        let p = softmax(&[1000.0, 1000.0, 998.0]).unwrap();
        assert!(close(p.iter().sum::<f64>(), 1.0) && close(p[0], p[1]));
        assert!(softmax(&[1.0, f32::NAN]).is_err());
        assert!(softmax(&[f32::NEG_INFINITY, 0.0]).is_err());
        assert!(softmax(&[]).is_err());
    }

    #[test]
    fn noul_maps_the_expected_rating_onto_yes() {
        let one_hot =
            |d: usize| -> Vec<f64> { (1..=9).map(|i| f64::from(u8::from(i == d))).collect() };
        assert!(close(noul_yes(&one_hot(1)), 0.01));
        assert!(close(noul_yes(&one_hot(9)), 0.99));
        assert!(close(noul_yes(&one_hot(5)), 0.5));
        // r = 3: 0.01 + (0.3 − 0.1) · 1.225 = 0.255.
        assert!(close(noul_yes(&one_hot(3)), 0.255));
        // Uniform: r = 5.
        assert!(close(noul_yes(&[1.0 / 9.0; 9]), 0.5));

        // Through the logits: 7 certain (logit far above the rest).
        let mut logits = [0.0f32; 9];
        logits[6] = 100.0;
        let d = Scoring::Noul.distribution(&logits).unwrap();
        let yes = 0.01 + (0.7 - 0.1) * (0.98 / 0.8);
        assert!((d.0[0] - yes).abs() < 1e-9 && close(d.0[0] + d.0[1], 1.0));
        assert!(Scoring::Noul.distribution(&[0.0; 2]).is_err());
    }

    #[test]
    fn the_hosts_score_is_v1s_expected_index() {
        let logits = [0.5f32, 2.0, -1.0, 1.0];
        let d = Scoring::Score.distribution(&logits).unwrap();
        let p = softmax(&logits).unwrap();
        let expected: f64 = p.iter().enumerate().map(|(i, pi)| i as f64 * pi).sum();
        let question = Question {
            instructions: String::new(),
            kind: QuestionKind::Score {
                levels: (0..4).map(|i| i.to_string()).collect(),
            },
        };
        match Answer::from_distribution(&question, &d).unwrap() {
            Answer::Score { score, .. } => assert!((score - expected).abs() < 1e-12),
            other => panic!("not a score: {other:?}"),
        }
    }

    #[test]
    fn choice_keeps_option_order() {
        let d = Scoring::Choice.distribution(&[1.0, 3.0, 2.0]).unwrap();
        assert!(d.0[1] > d.0[2] && d.0[2] > d.0[0]);
        assert!(close(d.0.iter().sum(), 1.0));
    }
}
