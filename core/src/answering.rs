//! Answering a question set with a reader: the one orchestration the System One API and the
//! policies' `read`/`read-batch` both use (docs/read.md, "Answering a question set").
//!
//! 1. every question is checked against the reader's limits;
//! 2. questions with one label are answered without a read;
//! 3. the rest go to the reader in one request (it plans isolated or joint reads from the mode),
//!    after checking the request against the reader's size limits;
//! 4. answers are built in the set's order, and a reader's error about a question is mapped back
//!    to that question's index in the set and its id.
//!
//! The answer cache is not a step here but a reader ([`CachingReader`], built by
//! [`AnswerSettings::reader`]) that the caller puts below whatever records its reads.

use crate::answer::Answer;
use crate::cache::AnswerCache;
use crate::caching::CachingReader;
use crate::debias::{DebiasingReader, OrderMode, PriorMode};
pub use crate::question::AskedQuestion;
use crate::question::{Question, QuestionId};
use crate::reader::{
    LabelDistribution, QuestionMode, ReadError, ReadOptions, ReadRequest, ReadStats, Reader,
    ReaderInfo, ReaderLimits, RequestQuestions, Usage,
};
use std::sync::Arc;

/// How a server asks its questions, for the raw API and the policies alike: the question mode
/// when a request (or a policy) does not choose one, and the answer cache when it is on.
#[derive(Debug, Clone)]
pub struct AnswerSettings {
    pub questions: QuestionMode,
    pub cache: Option<Arc<AnswerCache>>,
    /// The prior remedy when a request (or a model's settings) does not choose one
    /// (docs/read.md, "Prior correction and order debiasing").
    pub prior: PriorMode,
    /// The order remedy likewise.
    pub order: OrderMode,
}

impl AnswerSettings {
    /// The reader questions are asked through: `inner`, behind the answer cache when it is on,
    /// behind the prior and order remedies a request asks for ([`DebiasingReader`]; above the
    /// cache, so each of their extra reads is cached like any other).
    pub fn reader(&self, inner: Arc<dyn Reader>) -> Arc<dyn Reader> {
        let cached = match &self.cache {
            Some(cache) => Arc::new(CachingReader::new(inner, cache.clone())),
            None => inner,
        };
        Arc::new(DebiasingReader::new(cached))
    }
}

/// The server's defaults: isolated questions (`--questions`), no answer cache. (A bare read
/// request's own default mode is joint, the wire default; a server asks isolated unless told.)
impl Default for AnswerSettings {
    fn default() -> Self {
        AnswerSettings {
            questions: QuestionMode::Isolated,
            cache: None,
            prior: PriorMode::None,
            order: OrderMode::AsGiven,
        }
    }
}

/// Every answer of a set, in the set's order, with what it cost.
#[derive(Debug, Clone, PartialEq)]
pub struct AnsweredSet {
    pub answers: Vec<Answer>,
    /// Tokens of the reads performed (cached answers count none).
    pub usage: Usage,
    pub stats: ReadStats,
    /// Answers taken from the answer cache (`stats.answer_cache_hits`).
    pub cache_hits: u32,
}

/// Why a set could not be answered: the reader's error, with the question it concerns (its
/// index in the set and its id) when it concerns one.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{error}")]
pub struct SetError {
    /// For [`ReadError::InvalidQuestion`], its `question` is the index in the set.
    pub error: ReadError,
    pub question_id: Option<QuestionId>,
}

impl SetError {
    fn new(error: ReadError, questions: &[AskedQuestion]) -> Self {
        let question_id = match &error {
            ReadError::InvalidQuestion { question, .. } => {
                questions.get(*question).map(|q| q.id.clone())
            }
            _ => None,
        };
        SetError { error, question_id }
    }
}

/// Answers `questions` about `state` with `reader`; see the module's steps.
pub async fn answer_set(
    reader: &dyn Reader,
    state: &str,
    questions: &[AskedQuestion],
    options: &ReadOptions,
) -> Result<AnsweredSet, SetError> {
    let fail = |error: ReadError| SetError::new(error, questions);
    let ReaderInfo { limits, .. } = reader.info();
    for (index, asked) in questions.iter().enumerate() {
        asked.question.validate(&limits.questions).map_err(|e| {
            fail(ReadError::InvalidQuestion {
                question: index,
                message: e.to_string(),
            })
        })?;
    }

    let mut distributions: Vec<Option<LabelDistribution>> = vec![None; questions.len()];
    let to_read: Vec<usize> = (0..questions.len())
        .filter(|&i| questions[i].question.needs_read())
        .collect();

    let (usage, stats) = if to_read.is_empty() {
        (Usage::default(), ReadStats::default())
    } else {
        let request = ReadRequest {
            state: state.to_string(),
            questions: to_read
                .iter()
                .map(|&i| questions[i].question.clone())
                .collect(),
            options: options.clone(),
            // Every read carries the caller's ids and the whole set, for a model whose prompt
            // names them; the sidecar's client leaves them out for every other model
            // ([`ReaderLimits::reads_question_ids`]), so no other read ever sees an id.
            asked: Some(RequestQuestions::new(questions.to_vec(), to_read.clone())),
        };
        check_size(&request, &limits, reader.model_name()).map_err(fail)?;
        let outcome = reader
            .read(request)
            .await
            .map_err(|e| fail(e.within(&to_read)))?;
        if outcome.distributions.len() != to_read.len() {
            return Err(fail(ReadError::internal(format!(
                "the reader returned {} distributions for {} questions",
                outcome.distributions.len(),
                to_read.len()
            ))));
        }
        for (&index, distribution) in to_read.iter().zip(outcome.distributions) {
            distributions[index] = Some(distribution);
        }
        (outcome.usage, outcome.stats)
    };

    let mut answers = Vec::with_capacity(questions.len());
    for (index, (asked, distribution)) in questions.iter().zip(distributions).enumerate() {
        let answer = match distribution {
            Some(d) => Answer::from_distribution(&asked.question, &d).map_err(|e| {
                fail(ReadError::internal(format!(
                    "question {:?}: {e}",
                    asked.id.as_str()
                )))
            })?,
            None => Answer::without_read(&asked.question).ok_or_else(|| {
                fail(ReadError::internal(format!(
                    "question {index} was not read"
                )))
            })?,
        };
        answers.push(answer);
    }
    Ok(AnsweredSet {
        answers,
        usage,
        cache_hits: stats.answer_cache_hits,
        stats,
    })
}

/// Refuses, before sending, a request the reader has said it cannot take: a body over its size
/// limit, or a prompt whose text alone (state and questions, without any template) is more bytes
/// than the reader's context can hold at the most bytes one token can cover.
fn check_size(request: &ReadRequest, limits: &ReaderLimits, model: &str) -> Result<(), ReadError> {
    if let (Some(max_tokens), Some(token_bytes)) =
        (limits.max_prompt_tokens, limits.max_token_bytes)
    {
        let texts = request.questions.iter().map(Question::text_bytes);
        // The longest prompt: one question's (isolated) or all of them (joint).
        let questions = match request.options.questions {
            QuestionMode::Isolated => texts.max().unwrap_or(0),
            QuestionMode::Joint => texts.sum(),
        };
        let bytes = (request.state.len() + questions) as u64;
        let at_least = bytes.div_ceil(token_bytes.max(1));
        if at_least > max_tokens {
            return Err(ReadError::TooLarge {
                message: format!(
                    "Prompt too long: at least {at_least} tokens (a state and questions of \
                     {bytes} bytes), and model {model} reads at most {max_tokens} tokens"
                ),
            });
        }
    }
    if let Some(max_bytes) = limits.max_request_bytes {
        // The body as it is sent: the ids and the whole set only to a model that reads them.
        let sent;
        let request = if request.asked.is_some() && !limits.reads_question_ids {
            sent = ReadRequest {
                asked: None,
                ..request.clone()
            };
            &sent
        } else {
            request
        };
        let bytes = serde_json::to_vec(request).map(|b| b.len()).unwrap_or(0) as u64;
        if bytes > max_bytes {
            return Err(ReadError::TooLarge {
                message: format!(
                    "the read is {bytes} bytes of state and questions; model {model} takes at \
                     most {max_bytes} bytes per read"
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::question::{ChoiceOption, QuestionKind, QuestionLimits};
    use crate::reader::ReadOutcome;
    use std::sync::Mutex;

    /// Answers each question with `[0.75, 0.25, …]`-shaped distributions, or fails; remembers
    /// what it was asked.
    struct Stub {
        error: Option<ReadError>,
        limits: ReaderLimits,
        fingerprint: Option<String>,
        asked: Mutex<Vec<ReadRequest>>,
    }

    impl Stub {
        fn new() -> Self {
            Stub {
                error: None,
                limits: ReaderLimits::default(),
                fingerprint: Some("fp".into()),
                asked: Mutex::new(Vec::new()),
            }
        }
        fn asked(&self) -> Vec<ReadRequest> {
            self.asked.lock().unwrap().clone()
        }
    }

    #[async_trait::async_trait]
    impl Reader for Stub {
        fn model_name(&self) -> &str {
            "m"
        }
        async fn read(&self, request: ReadRequest) -> Result<crate::ReadOutcome, ReadError> {
            self.asked.lock().unwrap().push(request.clone());
            if let Some(e) = &self.error {
                return Err(e.clone());
            }
            Ok(ReadOutcome {
                distributions: request
                    .questions
                    .iter()
                    .map(|q| {
                        let n = q.label_count();
                        let mut d = vec![0.25 / (n - 1) as f64; n];
                        d[0] = 0.75;
                        LabelDistribution(d)
                    })
                    .collect(),
                usage: Usage {
                    input_tokens: 10 * request.questions.len() as u64,
                    output_tokens: 2,
                },
                stats: ReadStats::default(),
            })
        }
        fn info(&self) -> ReaderInfo {
            ReaderInfo {
                limits: self.limits,
                fingerprint: self.fingerprint.clone(),
                kind: None,
            }
        }
    }

    fn asked(id: &str, kind: QuestionKind) -> AskedQuestion {
        AskedQuestion {
            id: QuestionId(id.into()),
            question: Question {
                instructions: format!("{id}?"),
                kind,
            },
        }
    }

    fn noul(id: &str) -> AskedQuestion {
        asked(
            id,
            QuestionKind::Noul {
                yes: None,
                no: None,
            },
        )
    }

    fn choice(id: &str, n: usize) -> AskedQuestion {
        asked(
            id,
            QuestionKind::Choice {
                options: (0..n)
                    .map(|i| ChoiceOption {
                        name: format!("o{i}"),
                        description: None,
                    })
                    .collect(),
            },
        )
    }

    fn isolated() -> ReadOptions {
        ReadOptions {
            questions: QuestionMode::Isolated,
            ..Default::default()
        }
    }

    /// `answer_set` with isolated questions and the default answering.
    async fn answer(
        reader: &Stub,
        state: &str,
        set: &[AskedQuestion],
    ) -> Result<AnsweredSet, SetError> {
        answer_set(reader, state, set, &isolated()).await
    }

    #[tokio::test]
    async fn one_label_questions_are_not_read_and_answers_keep_the_set_order() {
        let reader = Stub::new();
        let set = vec![choice("only", 1), noul("a"), choice("c", 3)];
        let out = answer(&reader, "s", &set).await.unwrap();
        assert_eq!(reader.asked()[0].questions.len(), 2);
        assert_eq!(out.answers.len(), 3);
        assert_eq!(out.answers[0].distribution(), vec![1.0]);
        assert_eq!(out.answers[1].distribution(), vec![0.75, 0.25]);
        assert_eq!(out.usage.input_tokens, 20);
        assert_eq!(reader.asked()[0].options.questions, QuestionMode::Isolated);
    }

    #[tokio::test]
    async fn a_reader_error_names_the_question_by_its_index_in_the_set_and_its_id() {
        let mut reader = Stub::new();
        // The reader saw [a, b] (the 1-option question is not read) and blames its question 1.
        reader.error = Some(ReadError::InvalidQuestion {
            question: 1,
            message: "labels do not fit".into(),
        });
        let set = vec![choice("only", 1), noul("a"), noul("b")];
        let err = answer(&reader, "s", &set).await.unwrap_err();
        assert!(matches!(
            err.error,
            ReadError::InvalidQuestion { question: 2, .. }
        ));
        assert_eq!(err.question_id, Some(QuestionId("b".into())));
    }

    #[tokio::test]
    async fn questions_beyond_the_readers_limits_are_refused_before_any_read() {
        let mut reader = Stub::new();
        reader.limits.questions = QuestionLimits {
            max_choice_options: 3,
            ..Default::default()
        };
        let set = vec![noul("a"), choice("big", 4)];
        let err = answer(&reader, "s", &set).await.unwrap_err();
        assert!(matches!(
            err.error,
            ReadError::InvalidQuestion { question: 1, .. }
        ));
        assert_eq!(err.question_id, Some(QuestionId("big".into())));
        assert!(reader.asked().is_empty());
    }

    #[tokio::test]
    async fn a_read_too_large_for_the_reader_is_refused_before_sending() {
        let mut reader = Stub::new();
        reader.limits.max_request_bytes = Some(1000);
        let set = vec![noul("a")];
        let err = answer(&reader, &"x".repeat(2000), &set).await.unwrap_err();
        assert!(matches!(err.error, ReadError::TooLarge { .. }), "{err:?}");
        let mut reader = Stub::new();
        reader.limits.max_prompt_tokens = Some(100);
        reader.limits.max_token_bytes = Some(4);
        let err = answer(&reader, &"x".repeat(401), &set).await.unwrap_err();
        assert!(matches!(err.error, ReadError::TooLarge { .. }), "{err:?}");
        // A huge question counts too (here 401 bytes of instructions with a 1-byte state).
        let mut huge = noul("h");
        huge.question.instructions = "y".repeat(400);
        let err = answer(&reader, "s", &[huge]).await.unwrap_err();
        assert!(matches!(err.error, ReadError::TooLarge { .. }), "{err:?}");
        assert!(reader.asked().is_empty());
        // At the bound it is sent: the reader decides on the exact token count.
        // 398 bytes of state and the 2 of "a?": 100 tokens at least, not more.
        answer(&reader, &"x".repeat(398), &set).await.unwrap();
    }

    #[tokio::test]
    async fn cached_answers_are_identical_cost_nothing_and_only_serve_isolated_reads() {
        let stub = Arc::new(Stub::new());
        let settings = AnswerSettings {
            cache: Some(Arc::new(AnswerCache::new(1 << 20))),
            ..AnswerSettings::default()
        };
        let reader = settings.reader(stub.clone());
        let ask = |set: Vec<AskedQuestion>, options: ReadOptions| {
            let reader = reader.clone();
            async move {
                answer_set(reader.as_ref(), "s", &set, &options)
                    .await
                    .unwrap()
            }
        };
        let first = ask(vec![noul("a"), noul("b")], isolated()).await;
        assert_eq!(first.cache_hits, 0);
        // `b` renamed and asked with a new question: `b` is a hit, only `c` is read.
        let again = ask(vec![noul("c"), noul("b")], isolated()).await;
        assert_eq!(again.cache_hits, 1);
        assert_eq!(again.answers[1], first.answers[1]);
        assert_eq!(stub.asked().len(), 2);
        assert_eq!(stub.asked()[1].questions.len(), 1);
        assert_eq!(again.usage.input_tokens, 10);
        // All cached: no read, no tokens.
        let cached = ask(vec![noul("b")], isolated()).await;
        assert_eq!(cached.usage, Usage::default());
        assert_eq!(stub.asked().len(), 2);
        // Joint mode never consults it.
        let j = ask(vec![noul("b")], ReadOptions::default()).await;
        assert_eq!(j.cache_hits, 0);
        assert_eq!(stub.asked().len(), 3);
        // A reader without a fingerprint is never cached.
        let mut anonymous = Stub::new();
        anonymous.fingerprint = None;
        let anonymous = Arc::new(anonymous);
        let reader = settings.reader(anonymous.clone());
        for _ in 0..2 {
            answer_set(reader.as_ref(), "s", &[noul("b")], &isolated())
                .await
                .unwrap();
        }
        assert_eq!(anonymous.asked().len(), 2);
    }

    #[tokio::test]
    async fn every_read_carries_the_ids_and_the_whole_set_beside_its_questions() {
        let reader = Stub::new();
        let set = vec![choice("only", 1), noul("a"), choice("c", 3)];
        answer(&reader, "s", &set).await.unwrap();
        let sent = &reader.asked()[0];
        let asked = sent.asked.as_ref().expect("asked");
        // The whole set, the unread question too, and where the read's questions are in it.
        assert_eq!(asked.questions, set);
        assert_eq!(asked.positions, vec![1, 2]);
        assert_eq!(asked.id(1).map(QuestionId::as_str), Some("c"));
        // The questions themselves carry no id: renaming one changes only `asked`.
        let mut renamed = set.clone();
        renamed[1].id = QuestionId("z".into());
        answer(&reader, "s", &renamed).await.unwrap();
        assert_eq!(reader.asked()[1].questions, sent.questions);
        assert_ne!(reader.asked()[1].asked, sent.asked);
    }

    #[tokio::test]
    async fn a_model_that_reads_ids_is_never_answered_from_the_cache() {
        let mut stub = Stub::new();
        stub.limits.reads_question_ids = true;
        let stub = Arc::new(stub);
        let settings = AnswerSettings {
            cache: Some(Arc::new(AnswerCache::new(1 << 20))),
            ..AnswerSettings::default()
        };
        let reader = settings.reader(stub.clone());
        for id in ["a", "b"] {
            let out = answer_set(reader.as_ref(), "s", &[noul(id)], &isolated())
                .await
                .unwrap();
            assert_eq!(out.cache_hits, 0);
        }
        assert_eq!(stub.asked().len(), 2);
        assert_eq!(
            stub.asked()[1].asked.as_ref().and_then(|a| a.id(0)),
            Some(&QuestionId("b".into()))
        );
    }

    #[tokio::test]
    async fn the_size_check_counts_the_ids_only_for_a_model_that_reads_them() {
        let set: Vec<AskedQuestion> = (0..40).map(|i| noul(&format!("{i:0>30}"))).collect();
        let bare = ReadRequest {
            state: "s".into(),
            questions: set.iter().map(|q| q.question.clone()).collect(),
            options: isolated(),
            asked: None,
        };
        let bytes = serde_json::to_vec(&bare).unwrap().len() as u64;
        let mut reader = Stub::new();
        reader.limits.max_request_bytes = Some(bytes);
        assert!(answer(&reader, "s", &set).await.is_ok());
        reader.limits.reads_question_ids = true;
        let err = answer(&reader, "s", &set).await.expect_err("ids count");
        assert!(matches!(err.error, ReadError::TooLarge { .. }), "{err}");
    }

    #[tokio::test]
    async fn a_reader_above_the_cache_sees_every_question_and_every_answer() {
        // What a decision's recorder sees: the whole request and outcome, hits included.
        let stub = Arc::new(Stub::new());
        let settings = AnswerSettings {
            cache: Some(Arc::new(AnswerCache::new(1 << 20))),
            ..AnswerSettings::default()
        };
        let reader = settings.reader(stub.clone());
        let request = |names: &[&str]| ReadRequest {
            state: "s".into(),
            questions: names.iter().map(|n| noul(n).question).collect(),
            options: isolated(),
            asked: None,
        };
        reader.read(request(&["a"])).await.unwrap();
        let both = reader.read(request(&["b", "a"])).await.unwrap();
        assert_eq!(both.distributions.len(), 2);
        assert_eq!(both.stats.answer_cache_hits, 1);
        // Only `b` reached the model; a question it refuses is named in the whole request.
        assert_eq!(stub.asked()[1].questions.len(), 1);
        let mut refusing = Stub::new();
        refusing.error = Some(ReadError::InvalidQuestion {
            question: 0,
            message: "no".into(),
        });
        let reader = settings.reader(Arc::new(refusing));
        let Err(ReadError::InvalidQuestion { question, .. }) =
            reader.read(request(&["a", "c"])).await
        else {
            panic!("the refusal was lost");
        };
        assert_eq!(question, 1);
    }
}
