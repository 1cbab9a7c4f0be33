//! Test doubles for the policy runtime (also used by the benchmark): a reader that answers at
//! once, uniformly or from a script.

use hunch_core::{LabelDistribution, ReadError, ReadOutcome, ReadRequest, Reader, Usage};
use std::sync::atomic::{AtomicU64, Ordering};

type Script = dyn Fn(&ReadRequest, usize) -> Vec<f64> + Send + Sync;

/// Answers every question instantly.
pub struct InstantReader {
    script: Option<Box<Script>>,
    /// Reads served, for assertions.
    pub reads: AtomicU64,
}

impl InstantReader {
    /// Uniform distributions.
    pub fn uniform() -> Self {
        InstantReader {
            script: None,
            reads: AtomicU64::new(0),
        }
    }

    /// `script(request, question_index)` → the distribution.
    pub fn scripted(
        script: impl Fn(&ReadRequest, usize) -> Vec<f64> + Send + Sync + 'static,
    ) -> Self {
        InstantReader {
            script: Some(Box::new(script)),
            reads: AtomicU64::new(0),
        }
    }
}

#[async_trait::async_trait]
impl Reader for InstantReader {
    fn model_name(&self) -> &str {
        "instant"
    }

    async fn read(&self, request: ReadRequest) -> Result<ReadOutcome, ReadError> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        let distributions = request
            .questions
            .iter()
            .enumerate()
            .map(|(i, q)| match &self.script {
                Some(s) => LabelDistribution(s(&request, i)),
                None => {
                    let n = q.label_count().max(1);
                    LabelDistribution(vec![1.0 / n as f64; n])
                }
            })
            .collect();
        Ok(ReadOutcome {
            distributions,
            usage: Usage {
                input_tokens: request.state.len() as u64 / 4 + 1,
                output_tokens: request.questions.len() as u64,
            },
            stats: Default::default(),
        })
    }
}
