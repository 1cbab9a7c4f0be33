//! Capturing reads at the [`Reader`] boundary, and answering them again from a record.
//!
//! [`RecordingReader`] wraps whatever reader a decision uses and keeps every request and outcome,
//! however the caller orchestrates its questions. [`ReadBook`] is the other direction: recorded
//! reads by (state hash, rendered questions), answered again without a model — what `hunch
//! replay` and a shadow candidate (reads it shares with the active version) use.

use crate::decision::event::{sha256_hex, ReadEvent};
use hunch_core::{Question, ReadError, ReadOutcome, ReadRequest, Reader, ReaderInfo};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The reads of one decision, shared by its recording readers.
pub type ReadLog = Arc<Mutex<Vec<ReadEvent>>>;

/// A read as an event: the state text kept unless `omit_state`.
pub fn read_event(
    request: &ReadRequest,
    result: &Result<ReadOutcome, ReadError>,
    elapsed_ms: f64,
    omit_state: bool,
) -> ReadEvent {
    let (distributions, usage, stats, error) = match result {
        Ok(o) => (
            Some(o.distributions.clone()),
            o.usage,
            o.stats.clone(),
            None,
        ),
        Err(e) => (
            None,
            Default::default(),
            Default::default(),
            Some(e.clone()),
        ),
    };
    ReadEvent {
        state: (!omit_state).then(|| request.state.clone()),
        state_sha256: sha256_hex(request.state.as_bytes()),
        questions: request.questions.clone(),
        options: request.options.clone(),
        distributions,
        usage,
        stats,
        elapsed_ms,
        error,
    }
}

/// Records every read it passes to `inner` into a shared [`ReadLog`].
pub struct RecordingReader {
    inner: Arc<dyn Reader>,
    log: ReadLog,
    omit_state: bool,
}

impl RecordingReader {
    pub fn new(inner: Arc<dyn Reader>, log: ReadLog, omit_state: bool) -> Self {
        RecordingReader {
            inner,
            log,
            omit_state,
        }
    }
}

#[async_trait::async_trait]
impl Reader for RecordingReader {
    fn model_name(&self) -> &str {
        self.inner.model_name()
    }

    async fn read(&self, request: ReadRequest) -> Result<ReadOutcome, ReadError> {
        let started = Instant::now();
        let result = self.inner.read(request.clone()).await;
        let event = read_event(
            &request,
            &result,
            started.elapsed().as_secs_f64() * 1e3,
            self.omit_state,
        );
        self.log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(event);
        result
    }

    async fn ready(&self) -> bool {
        self.inner.ready().await
    }

    fn info(&self) -> ReaderInfo {
        self.inner.info()
    }
}

/// What a read is matched on: the state's hash and the questions exactly as rendered.
fn key(state_sha256: &str, questions: &[Question]) -> String {
    // Questions serialise deterministically (struct field order, arrays in order).
    let q = serde_json::to_string(questions).unwrap_or_default();
    format!("{state_sha256}\n{q}")
}

/// Successful recorded reads, by what they were asked.
#[derive(Debug, Default, Clone)]
pub struct ReadBook {
    outcomes: HashMap<String, ReadOutcome>,
}

impl ReadBook {
    pub fn new<'a>(reads: impl IntoIterator<Item = &'a ReadEvent>) -> Self {
        let mut outcomes = HashMap::new();
        for r in reads {
            if let Some(d) = &r.distributions {
                outcomes
                    .entry(key(&r.state_sha256, &r.questions))
                    .or_insert_with(|| ReadOutcome {
                        distributions: d.clone(),
                        usage: r.usage,
                        stats: Default::default(),
                    });
            }
        }
        ReadBook { outcomes }
    }

    pub fn len(&self) -> usize {
        self.outcomes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.outcomes.is_empty()
    }

    pub fn lookup(&self, request: &ReadRequest) -> Option<ReadOutcome> {
        self.outcomes
            .get(&key(
                &sha256_hex(request.state.as_bytes()),
                &request.questions,
            ))
            .cloned()
    }
}

/// Answers from a [`ReadBook`]; what the book does not hold goes to `fallback` (a model) or, with
/// none, fails as unavailable. Counts both so a caller can tell a pure replay from one that
/// needed a model.
pub struct BookReader {
    model: String,
    book: ReadBook,
    fallback: Option<Arc<dyn Reader>>,
    pub answered: AtomicU64,
    pub missed: AtomicU64,
}

impl BookReader {
    pub fn new(model: &str, book: ReadBook, fallback: Option<Arc<dyn Reader>>) -> Self {
        BookReader {
            model: model.to_string(),
            book,
            fallback,
            answered: AtomicU64::new(0),
            missed: AtomicU64::new(0),
        }
    }

    pub fn missed(&self) -> u64 {
        self.missed.load(Ordering::Relaxed)
    }
}

#[async_trait::async_trait]
impl Reader for BookReader {
    fn model_name(&self) -> &str {
        &self.model
    }

    async fn read(&self, request: ReadRequest) -> Result<ReadOutcome, ReadError> {
        if let Some(outcome) = self.book.lookup(&request) {
            self.answered.fetch_add(1, Ordering::Relaxed);
            return Ok(outcome);
        }
        self.missed.fetch_add(1, Ordering::Relaxed);
        match &self.fallback {
            Some(reader) => reader.read(request).await,
            None => Err(ReadError::unavailable(
                "this read is not in the decision log and no model was given",
                std::time::Duration::from_secs(1),
            )),
        }
    }

    async fn ready(&self) -> bool {
        match &self.fallback {
            Some(reader) => reader.ready().await,
            None => true,
        }
    }

    /// The fallback model's: what the book cannot answer goes there, so its limits apply and
    /// its fingerprint keys cached answers. Without one, nothing is known (the recorded model
    /// may not be served any more).
    fn info(&self) -> ReaderInfo {
        self.fallback
            .as_ref()
            .map(|reader| reader.info())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hunch_core::{LabelDistribution, QuestionKind};

    /// Answers every noul 0.7 and counts its reads.
    #[derive(Default)]
    struct Fixed {
        reads: AtomicU64,
    }

    #[async_trait::async_trait]
    impl Reader for Fixed {
        fn model_name(&self) -> &str {
            "fixed"
        }
        async fn read(&self, r: ReadRequest) -> Result<ReadOutcome, ReadError> {
            self.reads.fetch_add(1, Ordering::Relaxed);
            Ok(ReadOutcome {
                distributions: vec![LabelDistribution(vec![0.7, 0.3]); r.questions.len()],
                usage: Default::default(),
                stats: Default::default(),
            })
        }
        fn info(&self) -> ReaderInfo {
            ReaderInfo::unknown()
        }
    }

    fn request(state: &str) -> ReadRequest {
        ReadRequest {
            state: state.into(),
            questions: vec![Question {
                instructions: "?".into(),
                kind: QuestionKind::Noul {
                    yes: None,
                    no: None,
                },
            }],
            options: Default::default(),
        }
    }

    #[tokio::test]
    async fn recorded_reads_are_answered_again_without_the_model() {
        let log = ReadLog::default();
        let live = Arc::new(Fixed::default());
        let recording = RecordingReader::new(live.clone(), log.clone(), true);
        let first = recording.read(request("s")).await.unwrap();
        let reads = log.lock().unwrap().clone();
        assert_eq!(reads.len(), 1);
        assert!(reads[0].state.is_none(), "state text left out");
        assert_eq!(reads[0].state_sha256, sha256_hex(b"s"));

        let book = BookReader::new("m", ReadBook::new(&reads), None);
        let again = book.read(request("s")).await.unwrap();
        assert_eq!(again.distributions, first.distributions);
        assert!(matches!(
            book.read(request("other")).await,
            Err(ReadError::Unavailable { .. })
        ));
        assert_eq!(
            (book.answered.load(Ordering::Relaxed), book.missed()),
            (1, 1)
        );
        assert_eq!(live.reads.load(Ordering::Relaxed), 1);
    }
}
