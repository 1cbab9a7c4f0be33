//! Joins labels to recorded distributions: each label becomes an [`Example`] of the question the
//! model was asked, or a [`Problem`] saying why it could not. What is recorded comes from a
//! decision log (a `/v1/systemone` decision, [`RecordedDecision`], or a policy decision,
//! [`RecordedPolicyDecision`]) or a `hunch batch` output (`super::batch`), all as [`Recorded`]
//! answers.

use super::labels::{LabelKey, LabelLine};
use super::question_key;
use crate::decision::event::ReadEvent;
use hunch_core::calibration::Example;
use hunch_core::{LabelDistribution, Question, QuestionId, QuestionKind};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};

/// A recorded `/v1/systemone` decision with its questions typed (by the caller, which owns
/// request validation) and its reads.
#[derive(Debug, Clone)]
pub struct RecordedDecision<'a> {
    pub decision_id: &'a str,
    /// The request's questions, in request order.
    pub questions: Vec<(QuestionId, Question)>,
    pub reads: &'a [ReadEvent],
}

impl RecordedDecision<'_> {
    /// Each question with the raw distribution a read recorded for it.
    pub fn recorded(&self) -> Recorded {
        Recorded {
            key: LabelKey::Decision(self.decision_id.to_string()),
            no_question: "the decision has no question with this id",
            answers: Ok(self
                .questions
                .iter()
                .map(|(id, question)| RecordedAnswer {
                    id: id.clone(),
                    question: question.clone(),
                    distribution: recorded_distribution(self.reads, question).ok_or_else(|| {
                        "no recorded read answered this question (an answer-cache hit, a failed read, or a question needing no read)".into()
                    }),
                })
                .collect()),
        }
    }
}

/// A recorded policy decision (`/v1/policies/NAME`): it has no request listing its questions,
/// so its answers are its reads' questions, named by the ids the policy gave them
/// (`question_ids`). One label applies to one answer: an id asked in several answered reads is
/// used only when all of them asked the identical question of the identical state (the first is
/// used), and is reported as ambiguous otherwise (docs/calibration.md).
#[derive(Debug, Clone)]
pub struct RecordedPolicyDecision<'a> {
    pub decision_id: &'a str,
    pub reads: &'a [ReadEvent],
}

/// A question a policy decision asked under an id: in which read (its index in the event's
/// `reads`), and what that read answered it with.
struct Asked<'a> {
    read: usize,
    event: &'a ReadEvent,
    question: &'a Question,
    distribution: Option<&'a LabelDistribution>,
}

impl RecordedPolicyDecision<'_> {
    /// Each question id the policy asked in a recorded read, with its distribution or why there
    /// is none usable.
    pub fn recorded(&self) -> Recorded {
        let key = LabelKey::Decision(self.decision_id.to_string());
        let no_question = NOT_IN_A_READ;
        // Reads whose ids do not line up with their questions name nothing.
        let named: Vec<(usize, &ReadEvent)> = self
            .reads
            .iter()
            .enumerate()
            .filter(|(_, r)| r.question_ids.len() == r.questions.len())
            .filter(|(_, r)| !r.questions.is_empty())
            .collect();
        if named.is_empty() && !self.reads.is_empty() {
            return Recorded {
                key,
                no_question,
                answers: Err(NO_QUESTION_IDS.into()),
            };
        }
        let mut by_id: Vec<(&QuestionId, Vec<Asked>)> = Vec::new();
        for (read, event) in named {
            for (j, (id, question)) in event.question_ids.iter().zip(&event.questions).enumerate() {
                let asked = Asked {
                    read,
                    event,
                    question,
                    distribution: event.distributions.as_ref().and_then(|d| d.get(j)),
                };
                match by_id.iter_mut().find(|(known, _)| *known == id) {
                    Some((_, all)) => all.push(asked),
                    None => by_id.push((id, vec![asked])),
                }
            }
        }
        Recorded {
            key,
            no_question,
            answers: Ok(by_id
                .into_iter()
                .filter_map(|(id, all)| policy_answer(id, &all))
                .collect()),
        }
    }
}

/// Why a label names an id no read of a policy decision asked.
const NOT_IN_A_READ: &str = "no recorded read of this policy decision asked a question with \
    this id (a question answered from the answer cache, or needing no read, is in no read)";

/// Why the labels of a policy decision logged before reads recorded ids cannot be used.
const NO_QUESTION_IDS: &str = "the decision's reads do not record the policy's question ids (a \
    log written before Hunch recorded them), so its labels cannot be joined";

/// The answer a label of `id` applies to, among every read that asked it (`all`); `None` when
/// none did.
fn policy_answer(id: &QuestionId, all: &[Asked]) -> Option<RecordedAnswer> {
    let answered: Vec<&Asked> = all.iter().filter(|a| a.distribution.is_some()).collect();
    let first = answered.first().copied().or_else(|| all.first())?;
    let distribution = match answered
        .iter()
        .find(|a| a.question != first.question || a.event.state_sha256 != first.event.state_sha256)
    {
        Some(other) => Err(ambiguous(first, other)),
        None => match first.distribution {
            Some(d) => normalised(first.question, d.probabilities()).ok_or_else(|| {
                "the recorded distribution is not a distribution of this question".into()
            }),
            None => Err(match &first.event.error {
                Some(e) => format!("the read that asked this question failed ({e})"),
                None => "the read that asked this question recorded no distribution".into(),
            }),
        },
    };
    Some(RecordedAnswer {
        id: id.clone(),
        question: first.question.clone(),
        distribution,
    })
}

/// Why a label cannot tell which of two answers it is for.
fn ambiguous(a: &Asked, b: &Asked) -> String {
    let what = if a.question != b.question {
        format!(
            "different questions ({:?} and {:?})",
            a.question.instructions, b.question.instructions
        )
    } else {
        let short = |s: &str| s.chars().take(12).collect::<String>();
        format!(
            "the same question of different states (sha256 {}… and {}…)",
            short(&a.event.state_sha256),
            short(&b.event.state_sha256)
        )
    };
    let (first, second) = (a.read + 1, b.read + 1);
    format!(
        "ambiguous: reads {first} and {second} of this decision asked {what} under this id, \
         and a label applies to one answer; give them distinct ids in the policy"
    )
}

/// One labellable record: its questions and what each was answered from, or why none of it can
/// be used (a batch line that failed, or lacks what fitting needs).
#[derive(Debug, Clone)]
pub struct Recorded {
    pub key: LabelKey,
    /// Why a label naming a question id that is not among `answers` cannot be used.
    pub no_question: &'static str,
    pub answers: Result<Vec<RecordedAnswer>, String>,
}

/// A question of a record and the raw distribution (normalised) it was answered from, or why
/// there is none.
#[derive(Debug, Clone)]
pub struct RecordedAnswer {
    pub id: QuestionId,
    pub question: Question,
    pub distribution: Result<Vec<f64>, String>,
}

/// A label that could not be used, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Problem {
    /// Line of the labels file.
    pub line: usize,
    /// The decision the line labels (empty for a `custom_id` line or a line that names none).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub decision_id: String,
    /// The `hunch batch` line the line labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub question_id: Option<String>,
    pub reason: String,
}

impl Problem {
    /// A problem of the labels line `line` that names `key`.
    pub fn of(
        line: usize,
        key: Option<&LabelKey>,
        question_id: Option<&str>,
        reason: String,
    ) -> Problem {
        Problem {
            line,
            decision_id: match key {
                Some(LabelKey::Decision(id)) => id.clone(),
                _ => String::new(),
            },
            custom_id: match key {
                Some(LabelKey::Custom(id)) => Some(id.clone()),
                _ => None,
            },
            question_id: question_id.map(str::to_owned),
            reason,
        }
    }

    /// The decision or batch line it is about, for people.
    pub fn record(&self) -> &str {
        self.custom_id.as_deref().unwrap_or(&self.decision_id)
    }
}

/// Every labelled answer of one question.
#[derive(Debug, Clone)]
pub struct QuestionSet {
    pub question: Question,
    /// The caller ids it was asked under (for people reading the report).
    pub ids: Vec<String>,
    pub examples: Vec<Example>,
}

/// The labelled answers by question key, and the labels that could not be used.
#[derive(Debug, Default)]
pub struct Dataset {
    pub questions: BTreeMap<String, QuestionSet>,
    pub problems: Vec<Problem>,
}

/// Joins `labels` to `records` by decision id or custom id.
pub fn join(labels: &[LabelLine], records: &[Recorded]) -> Dataset {
    let by_key: HashMap<&LabelKey, &Recorded> = records.iter().map(|r| (&r.key, r)).collect();
    let mut out = Dataset::default();
    for line in labels {
        let problem = |question_id: Option<&str>, reason: String| {
            Problem::of(line.line, Some(&line.key), question_id, reason)
        };
        let Some(record) = by_key.get(&line.key) else {
            out.problems.push(problem(
                None,
                match &line.key {
                    LabelKey::Decision(_) => {
                        "no /v1/systemone or policy decision with this id in the logs"
                    }
                    LabelKey::Custom(_) => "no line with this custom_id in the batch outputs",
                }
                .into(),
            ));
            continue;
        };
        let answers = match &record.answers {
            Ok(a) => a,
            Err(reason) => {
                out.problems.push(problem(None, reason.clone()));
                continue;
            }
        };
        for (qid, label) in &line.labels {
            let Some(answer) = answers.iter().find(|a| a.id.0 == *qid) else {
                out.problems
                    .push(problem(Some(qid), record.no_question.to_string()));
                continue;
            };
            // Without an answer there is nothing to label (and an ambiguous id has no one
            // question to check the label against).
            let probabilities = match &answer.distribution {
                Ok(p) => p.clone(),
                Err(reason) => {
                    out.problems.push(problem(Some(qid), reason.clone()));
                    continue;
                }
            };
            let index = match label_index(&answer.question, label) {
                Ok(i) => i,
                Err(reason) => {
                    out.problems.push(problem(Some(qid), reason));
                    continue;
                }
            };
            let set = out
                .questions
                .entry(question_key(&answer.question))
                .or_insert_with(|| QuestionSet {
                    question: answer.question.clone(),
                    ids: Vec::new(),
                    examples: Vec::new(),
                });
            if !set.ids.contains(qid) {
                set.ids.push(qid.clone());
            }
            set.examples.push(Example {
                probabilities,
                label: index,
            });
        }
    }
    out
}

/// `p` normalised as the answer math does; `None` when it is not a distribution of
/// `question`'s labels.
pub fn normalised(question: &Question, p: &[f64]) -> Option<Vec<f64>> {
    let total: f64 = p.iter().sum();
    let valid = p.len() == question.label_count()
        && p.iter().all(|x| x.is_finite() && *x >= 0.0)
        && total > 0.0
        && total.is_finite();
    valid.then(|| p.iter().map(|x| x / total).collect())
}

/// The distribution a read recorded for `question`, normalised as the answer math does; `None`
/// when no read holds it (or what it holds is not a distribution).
fn recorded_distribution(reads: &[ReadEvent], question: &Question) -> Option<Vec<f64>> {
    reads.iter().find_map(|read| {
        let j = read.questions.iter().position(|q| q == question)?;
        normalised(
            question,
            read.distributions.as_ref()?.get(j)?.probabilities(),
        )
    })
}

/// The label's index in the question's distribution: `true`/`false` for a noul (`[yes, no]`),
/// an option name for a choice, a level index or level text for a score.
pub fn label_index(question: &Question, label: &Value) -> Result<usize, String> {
    match (&question.kind, label) {
        (QuestionKind::Noul { .. }, Value::Bool(yes)) => Ok(if *yes { 0 } else { 1 }),
        (QuestionKind::Noul { .. }, other) => {
            Err(format!("a noul's label is true or false, got {other}"))
        }
        (QuestionKind::Choice { options }, Value::String(name)) => {
            options.iter().position(|o| o.name == *name).ok_or_else(|| {
                let names: Vec<&str> = options.iter().map(|o| o.name.as_str()).collect();
                format!("{name:?} is not an option of this choice ({names:?})")
            })
        }
        (QuestionKind::Choice { .. }, other) => {
            Err(format!("a choice's label is an option name, got {other}"))
        }
        (QuestionKind::Score { levels }, Value::Number(n)) => n
            .as_u64()
            .and_then(|i| usize::try_from(i).ok())
            .filter(|i| *i < levels.len())
            .ok_or_else(|| format!("level {n} is not one of 0..{}", levels.len())),
        (QuestionKind::Score { levels }, Value::String(text)) => levels
            .iter()
            .position(|l| l == text)
            .ok_or_else(|| format!("{text:?} is not a level of this score")),
        (QuestionKind::Score { .. }, other) => Err(format!(
            "a score's label is a level index or level text, got {other}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calibration::fixtures::{choice, noul, read};
    use serde_json::json;

    #[test]
    fn labels_join_to_their_reads_and_every_miss_is_reported() {
        let choice = choice("team?", &["a", "b"]);
        // Isolated mode: one read per question, in any order.
        let reads = vec![
            read(vec![choice.clone()], vec![vec![0.2, 0.6]]),
            read(vec![noul("urgent?")], vec![vec![0.9, 0.1]]),
        ];
        let decision = RecordedDecision {
            decision_id: "d1",
            questions: vec![
                (QuestionId("u".into()), noul("urgent?")),
                (QuestionId("t".into()), choice.clone()),
                (QuestionId("cached".into()), noul("other?")),
            ],
            reads: &reads,
        };
        let labels = super::super::labels::parse_labels(
            r#"{"decision_id": "d1", "labels": {"u": false, "t": "b", "cached": true, "nope": 1}}
{"decision_id": "d1", "labels": {"t": "c", "u": "yes"}}
{"decision_id": "gone", "labels": {"u": true}}"#,
        )
        .0;
        let data = join(&labels, &[decision.recorded()]);
        assert_eq!(data.questions.len(), 2);
        let u = &data.questions[&question_key(&noul("urgent?"))];
        assert_eq!(u.examples[0].label, 1);
        assert_eq!(u.examples[0].probabilities, vec![0.9, 0.1]);
        let t = &data.questions[&question_key(&choice)];
        // Normalised as the answer math does.
        assert!((t.examples[0].probabilities[1] - 0.75).abs() < 1e-12);
        let reasons: Vec<(Option<&str>, &str)> = data
            .problems
            .iter()
            .map(|p| (p.question_id.as_deref(), p.reason.as_str()))
            .collect();
        assert_eq!(reasons.len(), 5, "{reasons:?}");
        assert!(reasons
            .iter()
            .any(|(q, r)| *q == Some("cached") && r.contains("no recorded read")));
        assert!(reasons
            .iter()
            .any(|(q, r)| *q == Some("nope") && r.contains("no question")));
        assert!(reasons
            .iter()
            .any(|(q, r)| *q == Some("t") && r.contains("not an option")));
        assert!(reasons
            .iter()
            .any(|(q, r)| *q == Some("u") && r.contains("true or false")));
        assert!(reasons
            .iter()
            .any(|(q, r)| q.is_none() && r.contains("no /v1/systemone or policy decision")));
    }

    /// A read of `state` whose questions the policy named `ids`.
    fn named(
        state: &str,
        ids: &[&str],
        questions: Vec<Question>,
        dists: Vec<Vec<f64>>,
    ) -> ReadEvent {
        let mut r = read(questions, dists);
        r.state_sha256 = crate::decision::event::sha256_hex(state.as_bytes());
        r.question_ids = ids.iter().map(|i| QuestionId((*i).into())).collect();
        r
    }

    #[test]
    fn a_policy_decisions_labels_join_by_the_ids_its_reads_recorded() {
        let mut failed = named("s", &["down"], vec![noul("down?")], vec![]);
        failed.distributions = None;
        failed.error = Some(hunch_core::ReadError::Timeout);
        let reads = vec![
            named(
                "s",
                &["urgent", "spam"],
                vec![noul("urgent?"), noul("spam?")],
                vec![vec![0.8, 0.2], vec![0.3, 0.9]],
            ),
            // The same question of the same state again (a retry): one answer, the first used.
            named(
                "s",
                &["urgent"],
                vec![noul("urgent?")],
                vec![vec![0.7, 0.3]],
            ),
            // `team` names two different questions; `tone` the same question of two states.
            named(
                "s",
                &["team", "tone"],
                vec![noul("billing?"), noul("angry?")],
                vec![vec![0.5, 0.5], vec![0.4, 0.6]],
            ),
            named(
                "other",
                &["team", "tone"],
                vec![noul("sales?"), noul("angry?")],
                vec![vec![0.5, 0.5], vec![0.1, 0.9]],
            ),
            failed,
        ];
        let decision = RecordedPolicyDecision {
            decision_id: "p1",
            reads: &reads,
        };
        let labels = super::super::labels::parse_labels(
            r#"{"decision_id": "p1", "labels": {"urgent": true, "spam": false, "team": true, "tone": false, "down": true, "cached": true}}"#,
        )
        .0;
        let data = join(&labels, &[decision.recorded()]);
        let urgent = &data.questions[&question_key(&noul("urgent?"))];
        assert_eq!(urgent.ids, ["urgent"]);
        assert_eq!(urgent.examples.len(), 1, "one label, one answer");
        assert_eq!(urgent.examples[0].probabilities, vec![0.8, 0.2]);
        assert_eq!(urgent.examples[0].label, 0);
        let spam = &data.questions[&question_key(&noul("spam?"))];
        assert!(
            (spam.examples[0].probabilities[0] - 0.25).abs() < 1e-12,
            "normalised"
        );
        assert_eq!(data.questions.len(), 2);
        let reason = |id: &str| {
            data.problems
                .iter()
                .find(|p| p.question_id.as_deref() == Some(id))
                .map(|p| p.reason.clone())
                .unwrap_or_default()
        };
        let team = reason("team");
        assert!(
            team.contains("ambiguous") && team.contains("reads 3 and 4"),
            "{team}"
        );
        assert!(
            team.contains("billing?") && team.contains("sales?"),
            "{team}"
        );
        let tone = reason("tone");
        assert!(
            tone.contains("ambiguous") && tone.contains("different states"),
            "{tone}"
        );
        assert!(reason("down").contains("failed"), "{}", reason("down"));
        assert!(
            reason("cached").contains("no recorded read"),
            "{}",
            reason("cached")
        );
        assert_eq!(data.problems.len(), 4, "{:?}", data.problems);
        assert!(data.problems.iter().all(|p| p.decision_id == "p1"));

        // A log written before reads recorded the ids: said once for the decision.
        let old = vec![read(vec![noul("urgent?")], vec![vec![0.8, 0.2]])];
        let old = RecordedPolicyDecision {
            decision_id: "p0",
            reads: &old,
        };
        let labels = super::super::labels::parse_labels(
            r#"{"decision_id": "p0", "labels": {"urgent": true}}"#,
        )
        .0;
        let data = join(&labels, &[old.recorded()]);
        assert!(data.questions.is_empty());
        assert_eq!(data.problems.len(), 1);
        assert!(data.problems[0]
            .reason
            .contains("do not record the policy's question ids"));
    }

    #[test]
    fn score_labels_are_indices_or_level_texts() {
        let q = Question {
            instructions: "how bad?".into(),
            kind: QuestionKind::Score {
                levels: vec!["low".into(), "high".into()],
            },
        };
        assert_eq!(label_index(&q, &json!(1)), Ok(1));
        assert_eq!(label_index(&q, &json!("low")), Ok(0));
        assert!(label_index(&q, &json!(2)).is_err());
        assert!(label_index(&q, &json!(-1)).is_err());
    }
}
