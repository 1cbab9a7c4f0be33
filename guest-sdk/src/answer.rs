//! Typed answers, as the host computed them (the SDK never recomputes the answer math).

use crate::prob::Prob;

/// The derived fields of a choice.
#[derive(Debug, Clone, PartialEq)]
pub struct ChoiceAnswer {
    /// The most probable option (first wins ties).
    pub choice: String,
    pub confidence: f64,
    /// Every option with its probability, in the question's order.
    pub probabilities: Vec<(String, f64)>,
}

impl ChoiceAnswer {
    /// P(option); 0 for a name that is not an option.
    pub fn p(&self, option: &str) -> Prob {
        self.probabilities
            .iter()
            .find(|(name, _)| name == option)
            .map(|(_, p)| Prob::clamped(*p))
            .unwrap_or(Prob::ZERO)
    }
}

/// The derived fields of a score.
#[derive(Debug, Clone, PartialEq)]
pub struct ScoreAnswer {
    /// Expected level (0-based).
    pub score: f64,
    pub confidence: f64,
    /// P(level i), in level order.
    pub probabilities: Vec<f64>,
}

impl ScoreAnswer {
    /// P(level ≥ `level`): the mass at or above a level, for "at least high" thresholds.
    pub fn p_at_least(&self, level: usize) -> Prob {
        Prob::clamped(self.probabilities.iter().skip(level).sum())
    }
}

/// The derived fields, by kind.
#[derive(Debug, Clone, PartialEq)]
pub enum AnswerValue {
    /// P(yes).
    Noul(Prob),
    Choice(ChoiceAnswer),
    Score(ScoreAnswer),
}

/// One answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub id: String,
    /// The normalised label distribution, in the question's label order.
    pub distribution: Vec<f64>,
    pub value: AnswerValue,
}

/// Why an answer could not be taken as asked: a policy bug, reported as a policy error.
#[derive(Debug, Clone, PartialEq)]
pub enum AnswerLookupError {
    Missing(String),
    WrongKind { id: String, expected: &'static str },
}

impl std::fmt::Display for AnswerLookupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AnswerLookupError::Missing(id) => write!(f, "no answer for question `{id}`"),
            AnswerLookupError::WrongKind { id, expected } => {
                write!(f, "question `{id}` is not a {expected}")
            }
        }
    }
}

impl std::error::Error for AnswerLookupError {}

/// The answers to one question set.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Answers {
    pub answers: Vec<Answer>,
    pub input_tokens: u64,
    pub output_tokens: u64,
}

impl Answers {
    pub fn get(&self, id: &str) -> Result<&Answer, AnswerLookupError> {
        self.answers
            .iter()
            .find(|a| a.id == id)
            .ok_or_else(|| AnswerLookupError::Missing(id.to_string()))
    }

    /// P(yes) of a noul.
    pub fn noul(&self, id: &str) -> Result<Prob, AnswerLookupError> {
        match &self.get(id)?.value {
            AnswerValue::Noul(p) => Ok(*p),
            _ => Err(AnswerLookupError::WrongKind {
                id: id.to_string(),
                expected: "noul",
            }),
        }
    }

    pub fn choice(&self, id: &str) -> Result<&ChoiceAnswer, AnswerLookupError> {
        match &self.get(id)?.value {
            AnswerValue::Choice(c) => Ok(c),
            _ => Err(AnswerLookupError::WrongKind {
                id: id.to_string(),
                expected: "choice",
            }),
        }
    }

    pub fn score(&self, id: &str) -> Result<&ScoreAnswer, AnswerLookupError> {
        match &self.get(id)?.value {
            AnswerValue::Score(s) => Ok(s),
            _ => Err(AnswerLookupError::WrongKind {
                id: id.to_string(),
                expected: "score",
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Answers {
        Answers {
            answers: vec![
                Answer {
                    id: "vat".into(),
                    distribution: vec![0.9, 0.1],
                    value: AnswerValue::Noul(Prob::clamped(0.9)),
                },
                Answer {
                    id: "team".into(),
                    distribution: vec![0.7, 0.3],
                    value: AnswerValue::Choice(ChoiceAnswer {
                        choice: "billing".into(),
                        confidence: 0.4,
                        probabilities: vec![("billing".into(), 0.7), ("tech".into(), 0.3)],
                    }),
                },
                Answer {
                    id: "risk".into(),
                    distribution: vec![0.2, 0.3, 0.5],
                    value: AnswerValue::Score(ScoreAnswer {
                        score: 1.3,
                        confidence: 0.5,
                        probabilities: vec![0.2, 0.3, 0.5],
                    }),
                },
            ],
            input_tokens: 10,
            output_tokens: 3,
        }
    }

    #[test]
    fn lookups_are_typed() {
        let a = sample();
        assert_eq!(a.noul("vat").unwrap().value(), 0.9);
        assert_eq!(a.choice("team").unwrap().p("tech").value(), 0.3);
        assert_eq!(a.choice("team").unwrap().p("nope"), Prob::ZERO);
        assert!((a.score("risk").unwrap().p_at_least(1).value() - 0.8).abs() < 1e-12);
        assert_eq!(
            a.noul("team"),
            Err(AnswerLookupError::WrongKind {
                id: "team".into(),
                expected: "noul"
            })
        );
        assert_eq!(
            a.score("x").unwrap_err(),
            AnswerLookupError::Missing("x".into())
        );
    }
}
