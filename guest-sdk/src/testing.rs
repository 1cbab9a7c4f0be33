//! A scripted host for native unit tests of policies: answers every question from a closure,
//! computing the derived fields with the server's own answer math (`hunch-core`), and records
//! every read so tests can assert on what a policy asked.

use crate::answer::{Answer, AnswerValue, Answers, ChoiceAnswer, ScoreAnswer};
use crate::policy::{Host, Level, ReadError, ReadErrorKind};
use crate::prob::Prob;
use crate::question::{Question, QuestionKind, QuestionSet};

type Script = Box<dyn FnMut(&str, &Question, &str) -> Vec<f64>>;

/// A host whose reads are answered by `script(state, question, id)` → the label distribution.
pub struct ScriptedHost {
    script: Script,
    /// Every set read, in order.
    pub reads: Vec<QuestionSet>,
    pub logs: Vec<(Level, String)>,
}

impl ScriptedHost {
    pub fn new(script: impl FnMut(&str, &Question, &str) -> Vec<f64> + 'static) -> Self {
        ScriptedHost {
            script: Box::new(script),
            reads: Vec::new(),
            logs: Vec::new(),
        }
    }

    /// Answers by question id from a table; unknown ids get a uniform distribution.
    pub fn by_id(table: &[(&str, &[f64])]) -> Self {
        let table: Vec<(String, Vec<f64>)> = table
            .iter()
            .map(|(id, d)| (id.to_string(), d.to_vec()))
            .collect();
        ScriptedHost::new(move |_, q, id| {
            table
                .iter()
                .find(|(k, _)| k == id)
                .map(|(_, d)| d.clone())
                .unwrap_or_else(|| uniform(q))
        })
    }

    /// How many questions were asked over all reads.
    pub fn questions_asked(&self) -> usize {
        self.reads.iter().map(|s| s.questions.len()).sum()
    }
}

fn label_count(q: &Question) -> usize {
    match &q.kind {
        QuestionKind::Noul(_) => 2,
        QuestionKind::Choice(o) => o.len(),
        QuestionKind::Score(l) => l.len(),
    }
}

/// The uniform distribution over a question's labels.
pub fn uniform(q: &Question) -> Vec<f64> {
    let n = label_count(q).max(1);
    vec![1.0 / n as f64; n]
}

fn to_core(q: &Question) -> hunch_core::Question {
    use hunch_core::question as core;
    let kind = match &q.kind {
        QuestionKind::Noul(c) => core::QuestionKind::Noul {
            yes: c.yes.clone(),
            no: c.no.clone(),
        },
        QuestionKind::Choice(o) => core::QuestionKind::Choice {
            options: o
                .iter()
                .map(|o| core::ChoiceOption {
                    name: o.name.clone(),
                    description: o.description.clone(),
                })
                .collect(),
        },
        QuestionKind::Score(l) => core::QuestionKind::Score { levels: l.clone() },
    };
    core::Question {
        instructions: q.instructions.clone(),
        kind,
    }
}

impl Host for ScriptedHost {
    fn read(&mut self, set: &QuestionSet) -> Result<Answers, ReadError> {
        self.reads.push(set.clone());
        let mut answers = Vec::new();
        for (i, (q, id)) in set.questions.iter().zip(set.resolved_ids()).enumerate() {
            let dist = hunch_core::LabelDistribution((self.script)(&set.state, q, &id));
            let core_q = to_core(q);
            let answer =
                hunch_core::Answer::from_distribution(&core_q, &dist).map_err(|e| ReadError {
                    kind: ReadErrorKind::InvalidQuestion,
                    message: e.to_string(),
                    question: Some(i as u32),
                })?;
            let value = match &answer {
                hunch_core::Answer::Noul { noul } => AnswerValue::Noul(Prob::clamped(*noul)),
                hunch_core::Answer::Choice {
                    choice,
                    confidence,
                    probabilities,
                } => AnswerValue::Choice(ChoiceAnswer {
                    choice: choice.clone(),
                    confidence: *confidence,
                    probabilities: probabilities.clone(),
                }),
                hunch_core::Answer::Score {
                    score,
                    confidence,
                    probabilities,
                    ..
                } => AnswerValue::Score(ScoreAnswer {
                    score: *score,
                    confidence: *confidence,
                    probabilities: probabilities.clone(),
                }),
            };
            answers.push(Answer {
                id,
                distribution: answer.distribution(),
                value,
            });
        }
        Ok(Answers {
            answers,
            input_tokens: set.state.len() as u64,
            output_tokens: set.questions.len() as u64,
        })
    }

    fn read_batch(&mut self, sets: &[QuestionSet]) -> Vec<Result<Answers, ReadError>> {
        sets.iter().map(|s| self.read(s)).collect()
    }

    fn log(&mut self, level: Level, message: &str) {
        self.logs.push((level, message.to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::question::{choice, noul, score};

    #[test]
    fn scripted_answers_carry_the_servers_derived_fields() {
        let mut host = ScriptedHost::by_id(&[("team", &[0.1, 0.7, 0.2]), ("ok", &[0.9, 0.1])]);
        let set = QuestionSet::new("ticket")
            .ask(noul("ok?").id("ok"))
            .ask(choice("team?", ["a", "b", "c"]).id("team"))
            .ask(score("urgency?", ["low", "high"]));
        let a = host.read(&set).unwrap();
        assert_eq!(a.noul("ok").unwrap().value(), 0.9);
        let team = a.choice("team").unwrap();
        assert_eq!(team.choice, "b");
        assert!((team.confidence - (0.7 - 1.0 / 3.0) / (2.0 / 3.0)).abs() < 1e-9);
        assert_eq!(a.score("2").unwrap().score, 0.5);
        assert_eq!(host.questions_asked(), 3);
    }
}
