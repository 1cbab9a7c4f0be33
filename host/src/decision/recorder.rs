//! Capturing reads at the [`Reader`] boundary, and answering them again from a record.
//!
//! [`RecordingReader`] wraps whatever reader a decision uses and keeps every request and outcome,
//! however the caller orchestrates its questions. [`ReadBook`] is the other direction: recorded
//! reads by (state hash, rendered questions, read options), answered again without a model —
//! what `hunch replay` and a shadow candidate (reads it shares with the active version) use.
//!
//! In isolated mode an answer depends only on the state, its own question and the seed settings
//! (docs/read.md), so the book also answers question by question: a candidate that adds one
//! question to a recorded set gets the recorded answers for the others, and only the new
//! question goes to the model (or, with no model, makes the read "not in the log").
//!
//! A read request carries no caller ids (they never reach the model), so the caller names the
//! questions of the set it is answering with [`asking`]; the recording reader then records each
//! read's `question_ids`, which is what labels join on (docs/calibration.md).

use crate::decision::event::{sha256_hex, ReadEvent};
use hunch_core::{
    AskedQuestion, LabelDistribution, Question, QuestionId, QuestionMode, ReadError, ReadOptions,
    ReadOutcome, ReadRequest, Reader, ReaderInfo,
};
use std::collections::HashMap;
use std::future::Future;
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
        question_ids: Vec::new(),
        options: request.options.clone(),
        distributions,
        calibrated: None,
        usage,
        stats,
        elapsed_ms,
        error,
    }
}

tokio::task_local! {
    /// The caller's questions of the set being answered (see [`asking`]).
    static ASKED: Vec<AskedQuestion>;
}

/// Runs `answering` (the reads of one question set) with the set's questions known to every
/// [`RecordingReader`] it reads through, so each read it records names its questions by the
/// caller's ids. A scope rather than an argument because the [`Reader`] interface, shared with
/// the model sidecar's protocol, carries no ids; each future of a concurrent batch has its own
/// scope.
pub async fn asking<F: Future>(asked: &[AskedQuestion], answering: F) -> F::Output {
    ASKED.scope(asked.to_vec(), answering).await
}

/// The caller's ids of `questions`, a read made for the set `asked`. The orchestration
/// (`hunch_core::answer_set`) reads an in-order subset of the set (the questions that need a read
/// and were not answered from the cache), so each question is matched to the next asked question
/// equal to it. Empty when they do not align: a read made outside [`asking`], or one a reader
/// between the caller and the recorder rewrote.
fn question_ids(asked: &[AskedQuestion], questions: &[Question]) -> Vec<QuestionId> {
    let mut rest = asked.iter();
    let mut ids = Vec::with_capacity(questions.len());
    for q in questions {
        match rest.find(|a| a.question == *q) {
            Some(a) => ids.push(a.id.clone()),
            None => return Vec::new(),
        }
    }
    ids
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
        let mut event = read_event(
            &request,
            &result,
            started.elapsed().as_secs_f64() * 1e3,
            self.omit_state,
        );
        event.question_ids = ASKED
            .try_with(|asked| question_ids(asked, &request.questions))
            .unwrap_or_default();
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

/// What a read is matched on: the state's hash, the questions exactly as rendered and the read
/// options (a joint read never answers an isolated one, nor one seed another).
fn key(state_sha256: &str, questions: &[Question], options: &ReadOptions) -> String {
    // Questions and options serialise deterministically (struct field order, arrays in order).
    let q = serde_json::to_string(questions).unwrap_or_default();
    let o = serde_json::to_string(options).unwrap_or_default();
    format!("{state_sha256}\n{q}\n{o}")
}

/// What one isolated question's answer is matched on.
fn question_key(state_sha256: &str, question: &Question, options: &ReadOptions) -> String {
    key(state_sha256, std::slice::from_ref(question), options)
}

/// Successful recorded reads, by what they were asked, and isolated answers by question.
#[derive(Debug, Default, Clone)]
pub struct ReadBook {
    outcomes: HashMap<String, ReadOutcome>,
    isolated: HashMap<String, LabelDistribution>,
}

/// What the book holds for a request.
#[derive(Debug, Clone, PartialEq)]
pub enum Lookup {
    /// The whole request, as recorded.
    Whole(ReadOutcome),
    /// An isolated request: the recorded answer of each question, where the book has one.
    Questions(Vec<Option<LabelDistribution>>),
}

impl ReadBook {
    pub fn new<'a>(reads: impl IntoIterator<Item = &'a ReadEvent>) -> Self {
        let mut outcomes = HashMap::new();
        let mut isolated = HashMap::new();
        for r in reads {
            let Some(d) = &r.distributions else { continue };
            outcomes
                .entry(key(&r.state_sha256, &r.questions, &r.options))
                .or_insert_with(|| ReadOutcome {
                    distributions: d.clone(),
                    usage: r.usage,
                    stats: Default::default(),
                });
            if r.options.questions == QuestionMode::Isolated && d.len() == r.questions.len() {
                for (q, dist) in r.questions.iter().zip(d) {
                    isolated
                        .entry(question_key(&r.state_sha256, q, &r.options))
                        .or_insert_with(|| dist.clone());
                }
            }
        }
        ReadBook { outcomes, isolated }
    }

    pub fn len(&self) -> usize {
        self.outcomes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.outcomes.is_empty()
    }

    /// The recorded answer to `request`: the whole read, else (isolated) question by question;
    /// `None` when the book holds nothing for it.
    pub fn lookup(&self, request: &ReadRequest) -> Option<Lookup> {
        let state = sha256_hex(request.state.as_bytes());
        if let Some(o) = self
            .outcomes
            .get(&key(&state, &request.questions, &request.options))
        {
            return Some(Lookup::Whole(o.clone()));
        }
        if request.options.questions != QuestionMode::Isolated {
            return None;
        }
        let found: Vec<Option<LabelDistribution>> = request
            .questions
            .iter()
            .map(|q| {
                self.isolated
                    .get(&question_key(&state, q, &request.options))
                    .cloned()
            })
            .collect();
        found
            .iter()
            .any(Option::is_some)
            .then_some(Lookup::Questions(found))
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
        let found = match self.book.lookup(&request) {
            Some(Lookup::Whole(outcome)) => {
                self.answered.fetch_add(1, Ordering::Relaxed);
                return Ok(outcome);
            }
            Some(Lookup::Questions(found)) if found.iter().all(Option::is_some) => {
                self.answered.fetch_add(1, Ordering::Relaxed);
                return Ok(ReadOutcome {
                    distributions: found.into_iter().flatten().collect(),
                    usage: Default::default(),
                    stats: Default::default(),
                });
            }
            Some(Lookup::Questions(found)) => found,
            None => vec![None; request.questions.len()],
        };
        self.missed.fetch_add(1, Ordering::Relaxed);
        let Some(reader) = &self.fallback else {
            return Err(ReadError::unavailable(
                "this read is not in the decision log and no model was given",
                std::time::Duration::from_secs(1),
            ));
        };
        if found.iter().all(Option::is_none) {
            return reader.read(request).await;
        }
        // Isolated: only the questions the book lacks go to the model; each answer is the same
        // as it would be in the whole set.
        let missing: Vec<usize> = (0..found.len()).filter(|&i| found[i].is_none()).collect();
        let asked = ReadRequest {
            state: request.state.clone(),
            questions: missing
                .iter()
                .map(|&i| request.questions[i].clone())
                .collect(),
            options: request.options.clone(),
            asked: request.asked_for(&missing),
        };
        let read = reader.read(asked).await?;
        let mut fresh = read.distributions.into_iter();
        let mut distributions = Vec::with_capacity(found.len());
        for f in found {
            match f.or_else(|| fresh.next()) {
                Some(d) => distributions.push(d),
                None => {
                    return Err(ReadError::internal(
                        "the model answered fewer questions than it was asked",
                    ))
                }
            }
        }
        Ok(ReadOutcome {
            distributions,
            usage: read.usage,
            stats: read.stats,
        })
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
    use hunch_core::QuestionKind;

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
            asked: None,
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

    fn noul(instructions: &str) -> Question {
        Question {
            instructions: instructions.into(),
            kind: QuestionKind::Noul {
                yes: None,
                no: None,
            },
        }
    }

    /// Defect: the book matched whole requests only, so in isolated mode a candidate that adds
    /// one question re-asked every question, and replay called it "a read not in the log".
    #[tokio::test]
    async fn isolated_reads_are_answered_question_by_question() {
        let isolated = ReadOptions {
            questions: QuestionMode::Isolated,
            ..Default::default()
        };
        let asked = |questions: Vec<Question>, options: &ReadOptions| ReadRequest {
            state: "s".into(),
            questions,
            options: options.clone(),
            asked: None,
        };
        let recorded = ReadEvent {
            state: None,
            state_sha256: sha256_hex(b"s"),
            questions: vec![noul("a"), noul("b")],
            question_ids: Vec::new(),
            options: isolated.clone(),
            distributions: Some(vec![
                LabelDistribution(vec![0.9, 0.1]),
                LabelDistribution(vec![0.2, 0.8]),
            ]),
            calibrated: None,
            usage: Default::default(),
            stats: Default::default(),
            elapsed_ms: 1.0,
            error: None,
        };
        let live = Arc::new(Fixed::default());
        let book = BookReader::new("m", ReadBook::new([&recorded]), Some(live.clone()));
        // A subset, and the set in another order: answered from the record alone.
        let b = book.read(asked(vec![noul("b")], &isolated)).await.unwrap();
        assert_eq!(b.distributions, [LabelDistribution(vec![0.2, 0.8])]);
        let ba = book
            .read(asked(vec![noul("b"), noul("a")], &isolated))
            .await
            .unwrap();
        assert_eq!(ba.distributions[1], LabelDistribution(vec![0.9, 0.1]));
        assert_eq!(live.reads.load(Ordering::Relaxed), 0);
        // One new question: only it goes to the model, the others keep their recorded answers.
        let abc = book
            .read(asked(vec![noul("a"), noul("c"), noul("b")], &isolated))
            .await
            .unwrap();
        assert_eq!(
            abc.distributions,
            [
                LabelDistribution(vec![0.9, 0.1]),
                LabelDistribution(vec![0.7, 0.3]),
                LabelDistribution(vec![0.2, 0.8]),
            ]
        );
        assert_eq!(live.reads.load(Ordering::Relaxed), 1);
        // A joint read is never answered from isolated records.
        let joint = ReadOptions {
            questions: QuestionMode::Joint,
            ..Default::default()
        };
        assert!(book.book.lookup(&asked(vec![noul("a")], &joint)).is_none());
    }

    fn asked(id: &str, question: Question) -> AskedQuestion {
        AskedQuestion {
            id: QuestionId(id.into()),
            question,
        }
    }

    fn ids(ids: &[QuestionId]) -> Vec<&str> {
        ids.iter().map(QuestionId::as_str).collect()
    }

    #[test]
    fn a_reads_questions_are_named_by_the_next_asked_question_equal_to_each() {
        let set = [
            asked("a", noul("same")),
            asked("b", noul("other")),
            asked("c", noul("same")),
        ];
        // The set whole, a subset (b answered without a read), and an identical question twice.
        assert_eq!(
            ids(&question_ids(
                &set,
                &[noul("same"), noul("other"), noul("same")]
            )),
            ["a", "b", "c"]
        );
        assert_eq!(
            ids(&question_ids(&set, &[noul("same"), noul("same")])),
            ["a", "c"]
        );
        assert_eq!(ids(&question_ids(&set, &[noul("other")])), ["b"]);
        // Not an in-order subset of the set: named by nothing rather than wrongly.
        assert!(question_ids(&set, &[noul("other"), noul("other")]).is_empty());
        assert!(question_ids(&set, &[noul("never asked")]).is_empty());
    }

    /// Defect: a read event kept the rendered questions but not the caller's ids, so labels of a
    /// policy decision (which has no request listing its questions) could not be joined.
    #[tokio::test]
    async fn reads_within_asking_record_the_callers_ids_and_concurrent_sets_keep_their_own() {
        let log = ReadLog::default();
        let recording = RecordingReader::new(Arc::new(Fixed::default()), log.clone(), false);
        let one_level = Question {
            instructions: "certain".into(),
            kind: QuestionKind::Score {
                levels: vec!["only".into()],
            },
        };
        let first = vec![
            asked("urgent", noul("urgent?")),
            asked("sure", one_level),
            asked("spam", noul("spam?")),
        ];
        let second = vec![asked("urgent-again", noul("urgent?"))];
        let options = ReadOptions::default();
        let answer = |set: &Vec<AskedQuestion>, state: &'static str| {
            let (recording, options) = (&recording, &options);
            let set = set.clone();
            async move {
                asking(
                    &set,
                    hunch_core::answer_set(recording, state, &set, options),
                )
                .await
                .unwrap()
            }
        };
        futures_util::future::join(answer(&first, "s1"), answer(&second, "s2")).await;
        // Outside any set: no ids.
        recording.read(request("s3")).await.unwrap();
        let reads = log.lock().unwrap().clone();
        let by_state = |s: &[u8]| {
            let r = reads
                .iter()
                .find(|r| r.state_sha256 == sha256_hex(s))
                .unwrap();
            ids(&r.question_ids)
                .into_iter()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        // The one-level score needed no read, so it is in no read.
        assert_eq!(by_state(b"s1"), ["urgent", "spam"]);
        assert_eq!(by_state(b"s2"), ["urgent-again"]);
        assert!(by_state(b"s3").is_empty());
        let text = serde_json::to_string(&reads[2]).unwrap();
        assert!(!text.contains("question_ids"), "absent, not empty: {text}");
    }

    #[test]
    fn a_read_logged_before_question_ids_were_recorded_still_parses() {
        let old: ReadEvent = serde_json::from_value(serde_json::json!({
            "state_sha256": "x", "questions": [noul("urgent?")], "elapsed_ms": 1.0,
            "distributions": [[0.9, 0.1]]
        }))
        .unwrap();
        assert!(old.question_ids.is_empty());
        assert_eq!(old.questions, [noul("urgent?")]);
    }
}
