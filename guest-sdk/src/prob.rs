//! Sound combinators for calibrated probabilities.
//!
//! Two readings of a state are rarely independent (the same model read the same text), so the
//! default way to combine events is by **Fréchet bounds**, which hold for *any* dependence:
//! `P(A ∧ B) ∈ [max(0, a + b − 1), min(a, b)]`, `P(A ∨ B) ∈ [max(a, b), min(1, a + b)]`. A policy
//! that knows two events are independent says so explicitly (`and_independent`) and gets a point.
//! Thresholds on an interval only decide when the whole interval is on one side; otherwise they
//! abstain — that is what makes a decision on bounds sound.

/// A probability in [0, 1]. Never NaN.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct Prob(f64);

impl Prob {
    pub const ZERO: Prob = Prob(0.0);
    pub const ONE: Prob = Prob(1.0);

    /// `None` unless `p` is a number in [0, 1].
    pub fn new(p: f64) -> Option<Prob> {
        (0.0..=1.0).contains(&p).then_some(Prob(p))
    }

    /// Clamps into [0, 1]; NaN becomes 0 (no evidence) rather than poisoning every later step.
    pub fn clamped(p: f64) -> Prob {
        if p.is_nan() {
            Prob(0.0)
        } else {
            Prob(p.clamp(0.0, 1.0))
        }
    }

    pub fn value(self) -> f64 {
        self.0
    }

    /// P(¬A) = 1 − a (also `!p`).
    pub fn complement(self) -> Prob {
        Prob(1.0 - self.0)
    }

    /// P(A ∧ B) assuming A and B independent: a·b.
    pub fn and_independent(self, other: Prob) -> Prob {
        Prob(self.0 * other.0)
    }

    /// P(A ∨ B) assuming A and B independent: 1 − (1 − a)(1 − b).
    pub fn or_independent(self, other: Prob) -> Prob {
        Prob::clamped(1.0 - (1.0 - self.0) * (1.0 - other.0))
    }

    /// P(A ∧ B) under any dependence (Fréchet): [max(0, a + b − 1), min(a, b)].
    pub fn and(self, other: Prob) -> Bounds {
        Bounds {
            lo: Prob::clamped(self.0 + other.0 - 1.0),
            hi: Prob(self.0.min(other.0)),
        }
    }

    /// P(A ∨ B) under any dependence (Fréchet): [max(a, b), min(1, a + b)].
    pub fn or(self, other: Prob) -> Bounds {
        Bounds {
            lo: Prob(self.0.max(other.0)),
            hi: Prob::clamped(self.0 + other.0),
        }
    }

    /// The degenerate interval [p, p].
    pub fn exact(self) -> Bounds {
        Bounds { lo: self, hi: self }
    }
}

/// An interval [lo, hi] known to contain a probability.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bounds {
    pub lo: Prob,
    pub hi: Prob,
}

impl Bounds {
    /// P(¬A) ∈ [1 − hi, 1 − lo] (also `!bounds`).
    pub fn complement(self) -> Bounds {
        Bounds {
            lo: self.hi.complement(),
            hi: self.lo.complement(),
        }
    }

    /// Fréchet conjunction of two intervals: monotone in each argument, so the ends combine.
    pub fn and(self, other: Bounds) -> Bounds {
        Bounds {
            lo: self.lo.and(other.lo).lo,
            hi: self.hi.and(other.hi).hi,
        }
    }

    /// Fréchet disjunction of two intervals.
    pub fn or(self, other: Bounds) -> Bounds {
        Bounds {
            lo: self.lo.or(other.lo).lo,
            hi: self.hi.or(other.hi).hi,
        }
    }

    pub fn width(self) -> f64 {
        self.hi.0 - self.lo.0
    }

    /// The midpoint, for display only: deciding on it would throw the soundness away.
    pub fn mid(self) -> f64 {
        (self.lo.0 + self.hi.0) / 2.0
    }
}

impl std::ops::Not for Prob {
    type Output = Prob;
    fn not(self) -> Prob {
        self.complement()
    }
}

impl std::ops::Not for Bounds {
    type Output = Bounds;
    fn not(self) -> Bounds {
        self.complement()
    }
}

/// P(all of them) under any dependence.
pub fn all(events: &[Prob]) -> Bounds {
    events
        .iter()
        .fold(Prob::ONE.exact(), |acc, p| acc.and(p.exact()))
}

/// P(any of them) under any dependence.
pub fn any(events: &[Prob]) -> Bounds {
    events
        .iter()
        .fold(Prob::ZERO.exact(), |acc, p| acc.or(p.exact()))
}

/// P(all of them) assuming mutual independence.
pub fn all_independent(events: &[Prob]) -> Prob {
    events
        .iter()
        .fold(Prob::ONE, |acc, p| acc.and_independent(*p))
}

/// P(any of them) assuming mutual independence.
pub fn any_independent(events: &[Prob]) -> Prob {
    events
        .iter()
        .fold(Prob::ZERO, |acc, p| acc.or_independent(*p))
}

/// A yes / no / abstain verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Yes,
    No,
    /// Not enough evidence either way: hand it to a human, ask another question, …
    Abstain,
}

/// "Yes when P ≥ `yes_at`, no when P ≤ `no_at`, otherwise abstain".
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Threshold {
    yes_at: f64,
    no_at: f64,
}

/// A threshold whose `no_at` is above its `yes_at` would say yes and no at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct InvalidThreshold;

impl std::fmt::Display for InvalidThreshold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a threshold needs 0 <= no_at < yes_at <= 1")
    }
}

impl std::error::Error for InvalidThreshold {}

impl Threshold {
    /// Needs `0 ≤ no_at < yes_at ≤ 1`.
    pub fn new(yes_at: f64, no_at: f64) -> Result<Threshold, InvalidThreshold> {
        if (0.0..=1.0).contains(&yes_at) && (0.0..=1.0).contains(&no_at) && no_at < yes_at {
            Ok(Threshold { yes_at, no_at })
        } else {
            Err(InvalidThreshold)
        }
    }

    pub fn decide(self, p: Prob) -> Verdict {
        self.decide_bounds(p.exact())
    }

    /// Decides only when the whole interval is past a cut.
    pub fn decide_bounds(self, b: Bounds) -> Verdict {
        if b.lo.0 >= self.yes_at {
            Verdict::Yes
        } else if b.hi.0 <= self.no_at {
            Verdict::No
        } else {
            Verdict::Abstain
        }
    }
}

/// Why an expectation cannot be taken.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ExpectationError {
    /// One value per probability is needed.
    LengthMismatch { probabilities: usize, values: usize },
    /// Probabilities must be in [0, 1] and sum to 1 (±1e-6).
    NotADistribution,
}

impl std::fmt::Display for ExpectationError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExpectationError::LengthMismatch {
                probabilities,
                values,
            } => write!(f, "{probabilities} probabilities but {values} values"),
            ExpectationError::NotADistribution => f.write_str("not a probability distribution"),
        }
    }
}

impl std::error::Error for ExpectationError {}

/// E[v] = Σ pᵢ·vᵢ over a label distribution, e.g. the expected cost of a ticket's urgency levels.
pub fn expected_value(probabilities: &[f64], values: &[f64]) -> Result<f64, ExpectationError> {
    if probabilities.len() != values.len() {
        return Err(ExpectationError::LengthMismatch {
            probabilities: probabilities.len(),
            values: values.len(),
        });
    }
    let total: f64 = probabilities.iter().sum();
    if probabilities.iter().any(|p| !(0.0..=1.0).contains(p)) || (total - 1.0).abs() > 1e-6 {
        return Err(ExpectationError::NotADistribution);
    }
    Ok(probabilities.iter().zip(values).map(|(p, v)| p * v).sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(x: f64) -> Prob {
        Prob::new(x).unwrap()
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn prob_refuses_nonsense_and_clamps() {
        assert!(Prob::new(1.5).is_none());
        assert!(Prob::new(f64::NAN).is_none());
        assert!(Prob::new(-0.1).is_none());
        assert_eq!(Prob::clamped(f64::NAN), Prob::ZERO);
        assert_eq!(Prob::clamped(2.0), Prob::ONE);
        assert!(close(p(0.3).complement().value(), 0.7));
        assert_eq!(!p(0.25), p(0.75));
    }

    #[test]
    fn independence_gives_points() {
        assert!(close(p(0.5).and_independent(p(0.4)).value(), 0.2));
        assert!(close(p(0.5).or_independent(p(0.4)).value(), 0.7));
        assert!(close(
            all_independent(&[p(0.5), p(0.5), p(0.5)]).value(),
            0.125
        ));
        assert!(close(any_independent(&[p(0.5), p(0.5)]).value(), 0.75));
        assert_eq!(all_independent(&[]), Prob::ONE);
        assert_eq!(any_independent(&[]), Prob::ZERO);
    }

    #[test]
    fn frechet_bounds_match_the_textbook() {
        let and = p(0.7).and(p(0.6));
        assert!(close(and.lo.value(), 0.3) && close(and.hi.value(), 0.6));
        let and = p(0.2).and(p(0.3));
        assert_eq!(and.lo, Prob::ZERO);
        let or = p(0.7).or(p(0.6));
        assert!(close(or.lo.value(), 0.7) && or.hi == Prob::ONE);
        // De Morgan holds on intervals: ¬(A ∧ B) = ¬A ∨ ¬B.
        let lhs = !p(0.7).and(p(0.6));
        let rhs = (!p(0.7)).or(!p(0.6));
        assert!(close(lhs.lo.value(), rhs.lo.value()) && close(lhs.hi.value(), rhs.hi.value()));
    }

    #[test]
    fn frechet_bounds_contain_every_joint_distribution() {
        // For a grid of marginals and every feasible P(A∧B), the bounds contain the truth and the
        // independent point lies inside the bounds.
        for ai in 0..=10 {
            for bi in 0..=10 {
                let (a, b) = (ai as f64 / 10.0, bi as f64 / 10.0);
                let bounds = p(a).and(p(b));
                let or_bounds = p(a).or(p(b));
                let lo = (a + b - 1.0).max(0.0);
                let hi = a.min(b);
                for k in 0..=20 {
                    let joint = lo + (hi - lo) * k as f64 / 20.0;
                    assert!(
                        bounds.lo.value() <= joint + 1e-12 && joint <= bounds.hi.value() + 1e-12
                    );
                    let union = a + b - joint;
                    assert!(or_bounds.lo.value() <= union + 1e-12);
                    assert!(union <= or_bounds.hi.value() + 1e-12);
                }
                let ind = p(a).and_independent(p(b)).value();
                assert!(bounds.lo.value() <= ind + 1e-12 && ind <= bounds.hi.value() + 1e-12);
            }
        }
    }

    #[test]
    fn nary_bounds_fold() {
        let b = all(&[p(0.9), p(0.9), p(0.9)]);
        assert!((b.lo.value() - 0.7).abs() < 1e-9 && close(b.hi.value(), 0.9));
        let b = any(&[p(0.1), p(0.2)]);
        assert!(close(b.lo.value(), 0.2) && (b.hi.value() - 0.3).abs() < 1e-12);
        assert_eq!(all(&[]), Prob::ONE.exact());
    }

    #[test]
    fn thresholds_abstain_between_cuts_and_on_wide_bounds() {
        let t = Threshold::new(0.8, 0.2).unwrap();
        assert_eq!(t.decide(p(0.85)), Verdict::Yes);
        assert_eq!(t.decide(p(0.8)), Verdict::Yes);
        assert_eq!(t.decide(p(0.1)), Verdict::No);
        assert_eq!(t.decide(p(0.5)), Verdict::Abstain);
        // The midpoint (0.6) would be a confident-looking number; the interval says "unsure".
        let wide = p(0.9).and(p(0.5));
        assert_eq!(t.decide_bounds(wide), Verdict::Abstain);
        assert_eq!(t.decide_bounds(p(0.95).and(p(0.9))), Verdict::Yes);
        assert_eq!(Threshold::new(0.2, 0.8), Err(InvalidThreshold));
        assert_eq!(Threshold::new(1.2, 0.1), Err(InvalidThreshold));
    }

    #[test]
    fn expectations_check_their_inputs() {
        assert!(close(
            expected_value(&[0.2, 0.3, 0.5], &[0.0, 10.0, 100.0]).unwrap(),
            53.0
        ));
        assert_eq!(
            expected_value(&[1.0], &[1.0, 2.0]),
            Err(ExpectationError::LengthMismatch {
                probabilities: 1,
                values: 2
            })
        );
        assert_eq!(
            expected_value(&[0.5, 0.6], &[1.0, 2.0]),
            Err(ExpectationError::NotADistribution)
        );
    }
}
