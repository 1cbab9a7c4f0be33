//! The `reader` capability: turns a policy's question sets into `hunch_core` read requests for
//! the policy's reader, answers them with `Answer::from_distribution` (the server's only answer
//! math), counts reads and questions against the invocation's limits, and records every read for
//! the response.

use crate::policy::bindings::hunch::policy::reader;
use crate::policy::bindings::types as wit;
use crate::policy::limits::{Limit, LimitExceeded, Limits};
use futures_util::future::join_all;
use hunch_core::{
    Answer, ChoiceOption, LabelDistribution, Question, QuestionKind, ReadError, ReadRequest,
    Reader, Usage,
};
use serde::Serialize;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

/// One question as the policy asked it.
#[derive(Debug, Clone, Serialize)]
pub struct RecordedQuestion {
    pub id: String,
    #[serde(flatten)]
    pub question: Question,
}

/// One answer as the policy received it.
#[derive(Debug, Clone, Serialize)]
pub struct RecordedAnswer {
    pub id: String,
    #[serde(flatten)]
    pub answer: Answer,
}

/// One read a policy made, for the invocation report.
#[derive(Debug, Clone, Serialize)]
pub struct ReadRecord {
    pub state: String,
    pub questions: Vec<RecordedQuestion>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answers: Option<Vec<RecordedAnswer>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ReadError>,
    pub usage: Usage,
    pub elapsed_ms: f64,
}

/// Per-invocation state of the reader capability.
pub struct ReadCapability {
    /// `None` while describing a policy (describe must not read) or when the policy's reader is
    /// not configured: reads then fail with `unavailable`, which the policy may handle.
    reader: Option<Arc<dyn Reader>>,
    limits: Limits,
    reads: u32,
    questions: u32,
    pub records: Vec<ReadRecord>,
    pub usage: Usage,
    /// Wall time spent in reads (batches count once).
    pub read_ms: f64,
}

impl ReadCapability {
    pub fn new(reader: Option<Arc<dyn Reader>>, limits: Limits) -> Self {
        ReadCapability {
            reader,
            limits,
            reads: 0,
            questions: 0,
            records: Vec::new(),
            usage: Usage::default(),
            read_ms: 0.0,
        }
    }

    /// Counts `sets` against the limits before anything is read, so a batch that would break a
    /// limit reads nothing.
    fn admit(&mut self, sets: &[wit::QuestionSet]) -> Result<(), LimitExceeded> {
        let reads = self.reads.saturating_add(sets.len() as u32);
        if reads > self.limits.max_reads {
            return Err(LimitExceeded::new(
                Limit::Reads,
                self.limits.max_reads as u64,
                format!("read number {reads} refused"),
            ));
        }
        let asked: usize = sets.iter().map(|s| s.questions.len()).sum();
        let questions = self.questions.saturating_add(asked as u32);
        if questions > self.limits.max_questions {
            return Err(LimitExceeded::new(
                Limit::Questions,
                self.limits.max_questions as u64,
                format!("question number {questions} refused"),
            ));
        }
        if let Some(big) = sets
            .iter()
            .find(|s| s.state.len() as u64 > self.limits.max_state_bytes)
        {
            return Err(LimitExceeded::new(
                Limit::StateSize,
                self.limits.max_state_bytes,
                format!("a state of {} bytes", big.state.len()),
            ));
        }
        self.reads = reads;
        self.questions = questions;
        Ok(())
    }

    async fn read_sets(
        &mut self,
        sets: Vec<wit::QuestionSet>,
    ) -> wasmtime::Result<Vec<Result<wit::Answers, wit::ReadError>>> {
        self.admit(&sets).map_err(wasmtime::Error::new)?;
        let started = Instant::now();
        let reader = self.reader.clone();
        // Independent sets are read concurrently: the reader batches or queues them as it sees fit.
        let outcomes = join_all(sets.into_iter().map(|set| read_one(reader.clone(), set))).await;
        self.read_ms += started.elapsed().as_secs_f64() * 1e3;
        let mut results = Vec::with_capacity(outcomes.len());
        for (result, record) in outcomes {
            self.usage.input_tokens += record.usage.input_tokens;
            self.usage.output_tokens += record.usage.output_tokens;
            self.records.push(record);
            results.push(result);
        }
        Ok(results)
    }
}

impl reader::Host for ReadCapability {
    async fn read(
        &mut self,
        state: String,
        questions: Vec<wit::Question>,
    ) -> wasmtime::Result<Result<wit::Answers, wit::ReadError>> {
        let mut results = self
            .read_sets(vec![wit::QuestionSet { state, questions }])
            .await?;
        Ok(results.pop().unwrap_or_else(|| {
            Err(to_wit_error(&ReadError::internal(
                "the read produced no result",
            )))
        }))
    }

    async fn read_batch(
        &mut self,
        sets: Vec<wit::QuestionSet>,
    ) -> wasmtime::Result<Vec<Result<wit::Answers, wit::ReadError>>> {
        self.read_sets(sets).await
    }
}

/// A WIT question as a typed core question, refusing what no reader could answer.
fn to_core(q: &wit::Question) -> Result<Question, String> {
    let kind = match &q.kind {
        wit::QuestionKind::Noul(c) => QuestionKind::Noul {
            yes: c.yes.clone(),
            no: c.no.clone(),
        },
        wit::QuestionKind::Choice(options) => {
            if options.is_empty() {
                return Err("a choice needs at least one option".into());
            }
            let mut seen = HashSet::new();
            if let Some(dup) = options.iter().find(|o| !seen.insert(o.name.as_str())) {
                return Err(format!("option `{}` appears twice", dup.name));
            }
            QuestionKind::Choice {
                options: options
                    .iter()
                    .map(|o| ChoiceOption {
                        name: o.name.clone(),
                        description: o.description.clone(),
                    })
                    .collect(),
            }
        }
        wit::QuestionKind::Score(levels) => {
            if levels.is_empty() {
                return Err("a score needs at least one level".into());
            }
            QuestionKind::Score {
                levels: levels.clone(),
            }
        }
    };
    Ok(Question {
        instructions: q.instructions.clone(),
        kind,
    })
}

fn invalid_question(index: usize, message: String) -> ReadError {
    ReadError::InvalidQuestion {
        question: index,
        message,
    }
}

/// Reads one set; never traps (limits were checked by `admit`).
async fn read_one(
    reader: Option<Arc<dyn Reader>>,
    set: wit::QuestionSet,
) -> (Result<wit::Answers, wit::ReadError>, ReadRecord) {
    let started = Instant::now();
    let mut record = ReadRecord {
        state: set.state.clone(),
        questions: Vec::new(),
        answers: None,
        error: None,
        usage: Usage::default(),
        elapsed_ms: 0.0,
    };
    let result = answer_set(reader, &set, &mut record).await;
    record.elapsed_ms = started.elapsed().as_secs_f64() * 1e3;
    match result {
        Ok(answers) => {
            let wit_answers = wit::Answers {
                answers: answers
                    .iter()
                    .map(|a| to_wit_answer(&a.id, &a.answer))
                    .collect(),
                input_tokens: record.usage.input_tokens,
                output_tokens: record.usage.output_tokens,
            };
            record.answers = Some(answers);
            (Ok(wit_answers), record)
        }
        Err(e) => {
            let wit_error = to_wit_error(&e);
            record.error = Some(e);
            (Err(wit_error), record)
        }
    }
}

async fn answer_set(
    reader: Option<Arc<dyn Reader>>,
    set: &wit::QuestionSet,
    record: &mut ReadRecord,
) -> Result<Vec<RecordedAnswer>, ReadError> {
    let mut questions = Vec::with_capacity(set.questions.len());
    for (i, q) in set.questions.iter().enumerate() {
        let question = to_core(q).map_err(|m| invalid_question(i, m))?;
        questions.push(RecordedQuestion {
            id: q.id.clone(),
            question,
        });
    }
    record.questions = questions.clone();
    // Questions with one label are certain and cost no read (as in the System One API).
    let needing: Vec<usize> = (0..questions.len())
        .filter(|&i| questions[i].question.needs_read())
        .collect();
    let mut distributions: Vec<Option<LabelDistribution>> = vec![None; questions.len()];
    if !needing.is_empty() {
        let reader = reader.ok_or_else(|| ReadError::Unavailable {
            message: "no reader is configured for this policy".into(),
            retry_after_seconds: 1,
        })?;
        let request = ReadRequest {
            state: set.state.clone(),
            questions: needing
                .iter()
                .map(|&i| questions[i].question.clone())
                .collect(),
            options: Default::default(),
        };
        let outcome = reader.read(request).await?;
        if outcome.distributions.len() != needing.len() {
            return Err(ReadError::internal(format!(
                "the reader returned {} distributions for {} questions",
                outcome.distributions.len(),
                needing.len()
            )));
        }
        record.usage = outcome.usage;
        for (&i, d) in needing.iter().zip(outcome.distributions) {
            distributions[i] = Some(d);
        }
    }
    let mut answers = Vec::with_capacity(questions.len());
    for (i, (q, d)) in questions.iter().zip(distributions).enumerate() {
        let answer = match d {
            Some(d) => Answer::from_distribution(&q.question, &d)
                .map_err(|e| ReadError::internal(format!("question {i}: {e}")))?,
            None => Answer::without_read(&q.question)
                .ok_or_else(|| ReadError::internal(format!("question {i} was not read")))?,
        };
        answers.push(RecordedAnswer {
            id: q.id.clone(),
            answer,
        });
    }
    Ok(answers)
}

fn to_wit_answer(id: &str, answer: &Answer) -> wit::Answer {
    let value = match answer {
        Answer::Noul { noul } => wit::AnswerValue::Noul(*noul),
        Answer::Choice {
            choice, confidence, ..
        } => wit::AnswerValue::Choice(wit::ChoiceAnswer {
            choice: choice.clone(),
            confidence: *confidence,
        }),
        Answer::Score {
            score, confidence, ..
        } => wit::AnswerValue::Score(wit::ScoreAnswer {
            score: *score,
            confidence: *confidence,
        }),
    };
    wit::Answer {
        id: id.to_string(),
        distribution: answer.distribution(),
        value,
    }
}

fn to_wit_error(e: &ReadError) -> wit::ReadError {
    let (kind, question) = match e {
        ReadError::InvalidQuestion { question, .. } => {
            (wit::ReadErrorKind::InvalidQuestion, Some(*question as u32))
        }
        ReadError::TooLarge { .. } => (wit::ReadErrorKind::TooLarge, None),
        ReadError::Unavailable { .. } => (wit::ReadErrorKind::Unavailable, None),
        ReadError::Timeout => (wit::ReadErrorKind::Timeout, None),
        ReadError::Rejected { .. } => (wit::ReadErrorKind::Rejected, None),
        ReadError::Internal { .. } => (wit::ReadErrorKind::Internal, None),
    };
    wit::ReadError {
        kind,
        message: e.to_string(),
        question,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::InstantReader;

    fn q(id: &str, kind: wit::QuestionKind) -> wit::Question {
        wit::Question {
            id: id.into(),
            instructions: "?".into(),
            kind,
        }
    }

    fn noul(id: &str) -> wit::Question {
        q(
            id,
            wit::QuestionKind::Noul(wit::NoulCriteria {
                yes: None,
                no: None,
            }),
        )
    }

    fn set(questions: Vec<wit::Question>) -> wit::QuestionSet {
        wit::QuestionSet {
            state: "s".into(),
            questions,
        }
    }

    fn cap(limits: Limits) -> ReadCapability {
        ReadCapability::new(Some(Arc::new(InstantReader::uniform())), limits)
    }

    #[tokio::test]
    async fn answers_come_from_the_core_math_in_question_order() {
        let mut c = cap(Limits::default());
        let options = vec![
            wit::ChoiceOption {
                name: "a".into(),
                description: None,
            },
            wit::ChoiceOption {
                name: "b".into(),
                description: None,
            },
        ];
        let out = c
            .read_sets(vec![set(vec![
                noul("x"),
                q("only", wit::QuestionKind::Score(vec!["one".into()])),
                q("c", wit::QuestionKind::Choice(options)),
            ])])
            .await
            .unwrap();
        let answers = out[0].as_ref().unwrap();
        assert_eq!(answers.answers.len(), 3);
        assert!(matches!(answers.answers[0].value, wit::AnswerValue::Noul(p) if p == 0.5));
        // A one-level score is certain and was not sent to the reader.
        assert!(
            matches!(&answers.answers[1].value, wit::AnswerValue::Score(s) if s.confidence == 1.0)
        );
        assert!(
            matches!(&answers.answers[2].value, wit::AnswerValue::Choice(ch) if ch.choice == "a")
        );
        assert_eq!(c.records.len(), 1);
        assert_eq!(c.records[0].questions.len(), 3);
    }

    #[tokio::test]
    async fn malformed_questions_are_read_errors_not_traps() {
        let mut c = cap(Limits::default());
        let dup = vec![
            wit::ChoiceOption {
                name: "a".into(),
                description: None,
            },
            wit::ChoiceOption {
                name: "a".into(),
                description: None,
            },
        ];
        let out = c
            .read_sets(vec![set(vec![
                noul("ok"),
                q("d", wit::QuestionKind::Choice(dup)),
            ])])
            .await
            .unwrap();
        let err = out[0].as_ref().unwrap_err();
        assert_eq!(err.kind, wit::ReadErrorKind::InvalidQuestion);
        assert_eq!(err.question, Some(1));
    }

    #[tokio::test]
    async fn the_read_limit_traps_with_its_name_and_reads_nothing() {
        let mut c = cap(Limits {
            max_reads: 2,
            ..Limits::default()
        });
        let err = c
            .read_sets(vec![set(vec![noul("a")]); 3])
            .await
            .unwrap_err();
        let limit = err.downcast_ref::<LimitExceeded>().unwrap();
        assert_eq!(limit.limit, Limit::Reads);
        assert!(c.records.is_empty());
        assert!(c.read_sets(vec![set(vec![noul("a")]); 2]).await.is_ok());
    }

    #[tokio::test]
    async fn the_question_limit_counts_over_reads() {
        let mut c = cap(Limits {
            max_questions: 3,
            ..Limits::default()
        });
        c.read_sets(vec![set(vec![noul("a"), noul("b")])])
            .await
            .unwrap();
        let err = c
            .read_sets(vec![set(vec![noul("c"), noul("d")])])
            .await
            .unwrap_err();
        assert_eq!(
            err.downcast_ref::<LimitExceeded>().unwrap().limit,
            Limit::Questions
        );
    }

    #[tokio::test]
    async fn without_a_reader_reads_are_unavailable() {
        let mut c = ReadCapability::new(None, Limits::default());
        let out = c.read_sets(vec![set(vec![noul("a")])]).await.unwrap();
        assert_eq!(
            out[0].as_ref().unwrap_err().kind,
            wit::ReadErrorKind::Unavailable
        );
    }
}
