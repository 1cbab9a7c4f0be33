//! The one place that turns label distributions into System One answers: choice argmax (first
//! wins ties), score expectation, legends, probabilities keyed by option, and TypeSafe's
//! confidence formulas. Nothing else in Hunch computes these numbers.

use crate::question::{Question, QuestionKind};
use crate::reader::LabelDistribution;
use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;

/// An answer in TypeSafe's 0.2.0 shape.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    Noul {
        noul: f64,
    },
    Choice {
        choice: String,
        confidence: f64,
        /// Every option, in the question's order.
        probabilities: Vec<(String, f64)>,
    },
    Score {
        score: f64,
        confidence: f64,
        /// Level texts, in order (`legend["0"]` = first).
        legend: Vec<String>,
        probabilities: Vec<f64>,
    },
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AnswerError {
    #[error("the reader returned {got} probabilities for a question with {expected} labels")]
    WrongLength { expected: usize, got: usize },
    #[error("the reader returned a probability that is not a finite non-negative number")]
    NotFinite,
    #[error("the reader returned probabilities that sum to zero")]
    ZeroMass,
}

/// Normalises to sum 1 in f64, refusing NaN, infinities and negative mass: no NaN ever reaches a
/// client.
fn normalised(dist: &LabelDistribution, expected: usize) -> Result<Vec<f64>, AnswerError> {
    let p = dist.probabilities();
    if p.len() != expected {
        return Err(AnswerError::WrongLength {
            expected,
            got: p.len(),
        });
    }
    if p.iter().any(|x| !x.is_finite() || *x < 0.0) {
        return Err(AnswerError::NotFinite);
    }
    let total: f64 = p.iter().sum();
    if total <= 0.0 || !total.is_finite() {
        return Err(AnswerError::ZeroMass);
    }
    Ok(p.iter().map(|x| x / total).collect())
}

/// Index of the largest probability; the first wins ties.
pub fn argmax(p: &[f64]) -> usize {
    let mut best = 0;
    for (i, &x) in p.iter().enumerate() {
        if x > p[best] {
            best = i;
        }
    }
    best
}

/// Choice confidence: `(max p − 1/K) / (1 − 1/K)`, clamped to [0, 1]; 1 for a single option.
pub fn choice_confidence(p: &[f64]) -> f64 {
    let k = p.len();
    if k <= 1 {
        return 1.0;
    }
    let max = p[argmax(p)];
    let uniform = 1.0 / k as f64;
    ((max - uniform) / (1.0 - uniform)).clamp(0.0, 1.0)
}

/// Score confidence: `max(0, 1 − Σ p_i·|i − mode| / U)` with `U = (1/n)·Σ|i − (n−1)/2|`, the
/// mean distance from the centre; 1 for a single level.
pub fn score_confidence(p: &[f64]) -> f64 {
    let n = p.len();
    if n <= 1 {
        return 1.0;
    }
    let mode = argmax(p) as f64;
    let centre = (n as f64 - 1.0) / 2.0;
    let u: f64 = (0..n).map(|i| (i as f64 - centre).abs()).sum::<f64>() / n as f64;
    let spread: f64 = p
        .iter()
        .enumerate()
        .map(|(i, pi)| pi * (i as f64 - mode).abs())
        .sum();
    (1.0 - spread / u).clamp(0.0, 1.0)
}

impl Answer {
    /// The answer to `question` from its label distribution.
    pub fn from_distribution(
        question: &Question,
        dist: &LabelDistribution,
    ) -> Result<Answer, AnswerError> {
        let p = normalised(dist, question.label_count())?;
        Ok(match &question.kind {
            QuestionKind::Noul { .. } => Answer::Noul { noul: p[0] },
            QuestionKind::Choice { options } => Answer::Choice {
                choice: options[argmax(&p)].name.clone(),
                confidence: choice_confidence(&p),
                probabilities: options.iter().map(|o| o.name.clone()).zip(p).collect(),
            },
            QuestionKind::Score { levels } => Answer::Score {
                score: p.iter().enumerate().map(|(i, pi)| i as f64 * pi).sum(),
                confidence: score_confidence(&p),
                legend: levels.clone(),
                probabilities: p,
            },
        })
    }

    /// The answer to a question that needs no read (one option or one level): certainty.
    /// Returns `None` for a question that does need a read.
    pub fn without_read(question: &Question) -> Option<Answer> {
        if question.needs_read() {
            return None;
        }
        let certain = LabelDistribution(vec![1.0]);
        Answer::from_distribution(question, &certain).ok()
    }

    /// The label distribution this answer was built from, in the question's order.
    pub fn distribution(&self) -> Vec<f64> {
        match self {
            Answer::Noul { noul } => vec![*noul, 1.0 - noul],
            Answer::Choice { probabilities, .. } => probabilities.iter().map(|(_, p)| *p).collect(),
            Answer::Score { probabilities, .. } => probabilities.clone(),
        }
    }
}

impl Serialize for Answer {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Answer::Noul { noul } => {
                let mut map = serializer.serialize_map(Some(2))?;
                map.serialize_entry("type", "noul")?;
                map.serialize_entry("noul", noul)?;
                map.end()
            }
            Answer::Choice {
                choice,
                confidence,
                probabilities,
            } => {
                let mut map = serializer.serialize_map(Some(4))?;
                map.serialize_entry("type", "choice")?;
                map.serialize_entry("choice", choice)?;
                map.serialize_entry("confidence", confidence)?;
                map.serialize_entry("probabilities", &OrderedMap(probabilities))?;
                map.end()
            }
            Answer::Score {
                score,
                confidence,
                legend,
                probabilities,
            } => {
                let legend: Vec<(String, &String)> = legend
                    .iter()
                    .enumerate()
                    .map(|(i, l)| (i.to_string(), l))
                    .collect();
                let probs: Vec<(String, f64)> = probabilities
                    .iter()
                    .enumerate()
                    .map(|(i, p)| (i.to_string(), *p))
                    .collect();
                let mut map = serializer.serialize_map(Some(5))?;
                map.serialize_entry("type", "score")?;
                map.serialize_entry("score", score)?;
                map.serialize_entry("confidence", confidence)?;
                map.serialize_entry("legend", &OrderedMap(&legend))?;
                map.serialize_entry("probabilities", &OrderedMap(&probs))?;
                map.end()
            }
        }
    }
}

/// A list of pairs serialised as a JSON object in list order.
struct OrderedMap<'a, K, V>(&'a [(K, V)]);

impl<K: Serialize, V: Serialize> Serialize for OrderedMap<'_, K, V> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (k, v) in self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 5e-3
    }

    fn choice(names: &[&str]) -> Question {
        crate::question::examples::choice("pick", names)
    }

    fn score(n: usize) -> Question {
        Question {
            instructions: "rate".into(),
            kind: QuestionKind::Score {
                levels: (0..n).map(|i| format!("level {i}")).collect(),
            },
        }
    }

    #[test]
    fn typesafe_worked_choice_confidences() {
        // TypeSafe's documented examples (rounded to two decimals there).
        assert!(close(choice_confidence(&[0.84, 0.16, 0.0]), 0.76));
        assert!(close(choice_confidence(&[0.34, 0.40, 0.02, 0.24]), 0.20));
        assert!(close(choice_confidence(&[0.04, 0.35, 0.61]), 0.415));
        assert_eq!(choice_confidence(&[0.25; 4]), 0.0);
        assert_eq!(choice_confidence(&[0.0, 1.0, 0.0]), 1.0);
    }

    #[test]
    fn score_confidence_follows_the_contract() {
        // n = 3: U = (1 + 0 + 1)/3 = 2/3; mode 1; spread 0.11 → 1 − 0.165 = 0.835.
        assert!((score_confidence(&[0.0, 0.89, 0.11]) - (1.0 - 0.11 / (2.0 / 3.0))).abs() < 1e-12);
        assert_eq!(score_confidence(&[1.0]), 1.0);
        assert_eq!(score_confidence(&[0.0, 0.0, 1.0]), 1.0);
        // Mass far from the mode clamps at 0, never negative.
        assert_eq!(
            score_confidence(&[0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5]),
            0.0
        );
    }

    #[test]
    fn choice_argmax_first_wins_ties_and_keys_every_option() {
        let q = choice(&["billing", "technical", "sales"]);
        let a = Answer::from_distribution(&q, &LabelDistribution(vec![0.4, 0.4, 0.2])).unwrap();
        let json = serde_json::to_string(&a).unwrap();
        assert!(json.starts_with(r#"{"type":"choice","choice":"billing","confidence":0.1"#));
        assert!(json.ends_with(r#""probabilities":{"billing":0.4,"technical":0.4,"sales":0.2}}"#));
    }

    #[test]
    fn score_is_the_expectation_and_legend_echoes_levels() {
        let q = score(3);
        let a = Answer::from_distribution(&q, &LabelDistribution(vec![0.2, 0.3, 0.5])).unwrap();
        match &a {
            Answer::Score { score, legend, .. } => {
                assert!((score - 1.3).abs() < 1e-12);
                assert_eq!(legend[2], "level 2");
            }
            other => panic!("not a score: {other:?}"),
        }
        let v = serde_json::to_value(&a).unwrap();
        assert_eq!(v["legend"]["0"], "level 0");
        assert_eq!(v["probabilities"]["2"], 0.5);
    }

    #[test]
    fn distributions_are_renormalised_and_nan_is_refused() {
        let q = choice(&["a", "b"]);
        let a = Answer::from_distribution(&q, &LabelDistribution(vec![2.0, 2.0])).unwrap();
        assert_eq!(a.distribution(), vec![0.5, 0.5]);
        assert_eq!(
            Answer::from_distribution(&q, &LabelDistribution(vec![f64::NAN, 1.0])),
            Err(AnswerError::NotFinite)
        );
        assert_eq!(
            Answer::from_distribution(&q, &LabelDistribution(vec![1.0])),
            Err(AnswerError::WrongLength {
                expected: 2,
                got: 1
            })
        );
    }

    #[test]
    fn single_option_questions_need_no_read() {
        let one = choice(&["only"]);
        let a = Answer::without_read(&one).unwrap();
        assert_eq!(
            a,
            Answer::Choice {
                choice: "only".into(),
                confidence: 1.0,
                probabilities: vec![("only".into(), 1.0)]
            }
        );
        let level = Answer::without_read(&score(1)).unwrap();
        assert!(
            matches!(level, Answer::Score { score, confidence, .. } if score == 0.0 && confidence == 1.0)
        );
        assert!(Answer::without_read(&choice(&["a", "b"])).is_none());
    }
}
