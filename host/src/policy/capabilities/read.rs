//! The `reader` capability: turns a policy's question sets into typed `hunch_core` questions,
//! answers them with hunch-core's one orchestration ([`hunch_core::answer_set`], the same as the
//! System One API: limits, reads, error mapping to the set's index and id, answer cache), counts
//! reads and questions against the invocation's limits, and records every read for the response.
//! With a calibration, answers are computed from calibrated distributions exactly as
//! `/v1/systemone`'s are (the same [`CalibratingReader`] around the decision's recording reader,
//! so the record keeps the raw distributions).

use crate::calibration::file::Calibrations;
use crate::calibration::serve::CalibratingReader;
use crate::decision::recorder::asking;
use crate::policy::bindings::hunch::policy::reader;
use crate::policy::bindings::types as wit;
use crate::policy::limits::{Limit, LimitExceeded, Limits};
use futures_util::future::join_all;
use hunch_core::AnswerSettings;
use hunch_core::{
    answer_set, Answer, AskedQuestion, ChoiceOption, Question, QuestionKind, ReadError,
    ReadOptions, Reader, Usage,
};
use serde::Serialize;
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
    /// The question mode (the policy's `NAME.toml`, else the server's) and the answer cache.
    answering: AnswerSettings,
    /// What answers are calibrated with (docs/calibration.md), for the whole invocation.
    calibration: Option<Arc<Calibrations>>,
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
            answering: AnswerSettings::default(),
            calibration: None,
            reads: 0,
            questions: 0,
            records: Vec::new(),
            usage: Usage::default(),
            read_ms: 0.0,
        }
    }

    /// Reads in `answering`'s question mode, with its answer cache.
    pub fn with_answering(mut self, answering: AnswerSettings) -> Self {
        self.answering = answering;
        self
    }

    /// Calibrates every answer with `calibration` (where it covers the question). The answer
    /// cache, when on, is part of the reader below the decision's recorder and holds raw
    /// answers, so cached answers are calibrated like read ones.
    pub fn with_calibration(mut self, calibration: Option<Arc<Calibrations>>) -> Self {
        self.calibration = calibration;
        self
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
        let reader = match (&self.reader, &self.calibration) {
            (Some(inner), Some(c)) => Some(Arc::new(CalibratingReader {
                inner: inner.clone(),
                calibrations: c.clone(),
            }) as Arc<dyn Reader>),
            (reader, _) => reader.clone(),
        };
        let answering = &self.answering;
        // Independent sets are read concurrently: the reader batches or queues them as it sees fit.
        let outcomes = join_all(
            sets.into_iter()
                .map(|set| read_one(reader.clone(), answering, set)),
        )
        .await;
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

/// A WIT question as a typed core question (its limits are checked by the orchestration,
/// against the reader's own).
fn to_core(q: &wit::Question) -> Question {
    let kind = match &q.kind {
        wit::QuestionKind::Noul(c) => QuestionKind::Noul {
            yes: c.yes.clone(),
            no: c.no.clone(),
        },
        wit::QuestionKind::Choice(options) => QuestionKind::Choice {
            options: options
                .iter()
                .map(|o| ChoiceOption {
                    name: o.name.clone(),
                    description: o.description.clone(),
                })
                .collect(),
        },
        wit::QuestionKind::Score(levels) => QuestionKind::Score {
            levels: levels.clone(),
        },
    };
    Question {
        instructions: q.instructions.clone(),
        kind,
    }
}

/// Reads one set; never traps (limits were checked by `admit`).
async fn read_one(
    reader: Option<Arc<dyn Reader>>,
    answering: &AnswerSettings,
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
    let result = answer_policy_set(reader, answering, &set, &mut record).await;
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

async fn answer_policy_set(
    reader: Option<Arc<dyn Reader>>,
    answering: &AnswerSettings,
    set: &wit::QuestionSet,
    record: &mut ReadRecord,
) -> Result<Vec<RecordedAnswer>, ReadError> {
    let asked: Vec<AskedQuestion> = set
        .questions
        .iter()
        .map(|q| AskedQuestion {
            id: hunch_core::QuestionId(q.id.clone()),
            question: to_core(q),
        })
        .collect();
    record.questions = asked
        .iter()
        .map(|a| RecordedQuestion {
            id: a.id.0.clone(),
            question: a.question.clone(),
        })
        .collect();
    // The server's remedies (a policy has no per-request say): in the options, so the
    // decision's record names them and a replay reproduces them.
    let options = ReadOptions {
        questions: answering.questions,
        prior: answering.prior,
        order: answering.order,
        ..ReadOptions::default()
    };
    let answered = match &reader {
        // Within `asking`, so the decision's record names each read's questions by the ids the
        // policy gave them (what labels of a policy decision join on).
        Some(reader) => {
            // The answer cache, when on, is part of the reader (below the decision's recorder).
            asking(
                &asked,
                answer_set(reader.as_ref(), &set.state, &asked, &options),
            )
            .await
        }
        // Without a reader only questions that need no read can be answered.
        None => answer_set(&NoReader, &set.state, &asked, &options).await,
    }
    .map_err(|e| e.error)?;
    record.usage = answered.usage;
    Ok(asked
        .into_iter()
        .zip(answered.answers)
        .map(|(a, answer)| RecordedAnswer { id: a.id.0, answer })
        .collect())
}

/// The reader of a policy that has none (while describing, or not configured): every read is
/// `unavailable`, which the policy may handle.
struct NoReader;

#[async_trait::async_trait]
impl Reader for NoReader {
    fn model_name(&self) -> &str {
        ""
    }

    fn info(&self) -> hunch_core::ReaderInfo {
        hunch_core::ReaderInfo::unknown()
    }

    async fn read(
        &self,
        _request: hunch_core::ReadRequest,
    ) -> Result<hunch_core::ReadOutcome, ReadError> {
        Err(ReadError::Unavailable {
            message: "no reader is configured for this policy".into(),
            retry_after_seconds: 1,
        })
    }
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
    wit::ReadError {
        kind: e.kind().into(),
        message: e.to_string(),
        question: match e {
            ReadError::InvalidQuestion { question, .. } => Some(*question as u32),
            _ => None,
        },
    }
}

#[cfg(test)]
#[path = "read_tests.rs"]
mod tests;
