//! The answer cache as a [`Reader`]: isolated questions it has answered before are taken from
//! the [`AnswerCache`], only the others go to the reader it wraps (docs/read.md, "The answer
//! cache").
//!
//! A decorator rather than a step of [`crate::answer_set`], so that it sits *below* whatever
//! records a decision's reads: a recorded read is the whole request and its whole outcome,
//! whether an answer came from the cache or the model, and a recorded decision replays without a
//! model either way.

use crate::cache::{AnswerCache, CacheKey};
use crate::reader::{
    LabelDistribution, QuestionMode, ReadError, ReadOutcome, ReadRequest, ReadStats, Reader,
    ReaderInfo, Usage,
};
use std::sync::Arc;

/// `inner` behind the answer cache.
pub struct CachingReader {
    inner: Arc<dyn Reader>,
    cache: Arc<AnswerCache>,
}

impl CachingReader {
    pub fn new(inner: Arc<dyn Reader>, cache: Arc<AnswerCache>) -> Self {
        CachingReader { inner, cache }
    }
}

#[async_trait::async_trait]
impl Reader for CachingReader {
    fn model_name(&self) -> &str {
        self.inner.model_name()
    }

    /// Isolated questions of a model with a fingerprint that reads no question ids are looked up
    /// (joint answers depend on the other questions, and an anonymous model could change under
    /// the cache); the misses are read in one request. `stats.answer_cache_hits` counts the
    /// answers the cache gave.
    async fn read(&self, request: ReadRequest) -> Result<ReadOutcome, ReadError> {
        let info = self.inner.info();
        let fingerprint = match (request.options.questions, info.fingerprint) {
            // A model that reads question ids answers by them and by the other questions,
            // which the key leaves out: its answers are never cached.
            (QuestionMode::Isolated, Some(fingerprint)) if !info.limits.reads_question_ids => {
                fingerprint
            }
            _ => return self.inner.read(request).await,
        };
        let keys: Vec<CacheKey> = request
            .questions
            .iter()
            .map(|q| CacheKey::new(&fingerprint, &request.state, q, &request.options))
            .collect();
        let mut distributions: Vec<Option<LabelDistribution>> =
            keys.iter().map(|k| self.cache.get(k)).collect();
        let misses: Vec<usize> = (0..keys.len())
            .filter(|&i| distributions[i].is_none())
            .collect();
        let hits = (keys.len() - misses.len()) as u32;
        let (usage, mut stats) = if misses.is_empty() {
            (Usage::default(), ReadStats::default())
        } else {
            let outcome = self
                .inner
                .read(ReadRequest {
                    state: request.state.clone(),
                    questions: misses
                        .iter()
                        .map(|&i| request.questions[i].clone())
                        .collect(),
                    options: request.options.clone(),
                    asked: request.asked_for(&misses),
                })
                .await
                .map_err(|e| e.within(&misses))?;
            if outcome.distributions.len() != misses.len() {
                return Err(ReadError::internal(format!(
                    "the reader returned {} distributions for {} questions",
                    outcome.distributions.len(),
                    misses.len()
                )));
            }
            for (&i, distribution) in misses.iter().zip(outcome.distributions) {
                self.cache.put(keys[i].clone(), distribution.clone());
                distributions[i] = Some(distribution);
            }
            (outcome.usage, outcome.stats)
        };
        stats.answer_cache_hits = hits;
        Ok(ReadOutcome {
            distributions: distributions.into_iter().flatten().collect(),
            usage,
            stats,
        })
    }

    async fn ready(&self) -> bool {
        self.inner.ready().await
    }

    fn info(&self) -> ReaderInfo {
        self.inner.info()
    }
}
