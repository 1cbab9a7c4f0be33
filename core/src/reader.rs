//! The `Reader` abstraction: "answer these typed questions about this state with label
//! distributions". The raw System One API and the policy runtime both call it; the accelerator
//! sidecar and an upstream System One server implement it.

use crate::question::{AskedQuestion, Question, QuestionId, QuestionLimits};
use crate::remedy::{OrderMode, PriorMode};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// One read request: a state and the questions that need a model read, in request order. No
/// caller ids: errors about a question name its index in `questions`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReadRequest {
    /// The state rendered to text (see [`crate::text::render_value`]).
    pub state: String,
    pub questions: Vec<Question>,
    #[serde(default)]
    pub options: ReadOptions,
    /// The caller's request around these questions: only for a model whose prompt names each
    /// question by its id and lists the request's questions (llama.cpp's `nimble`;
    /// [`ReaderLimits::reads_question_ids`]). Every other read ignores it, and the host sends it
    /// to no other model, so ids never reach their reads. Absent: a host that predates it (a
    /// model that needs it refuses the read, naming it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asked: Option<RequestQuestions>,
}

/// Every question of the caller's request, with its id, and where this read's questions are
/// among them ([`ReadRequest::asked`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestQuestions {
    /// The request's questions in its order, those answered without a read too (as asked: a
    /// remedy's reordered read still lists the question as the caller gave it).
    pub questions: Vec<AskedQuestion>,
    /// For each question of the read, its place in [`questions`](Self::questions).
    pub positions: Vec<usize>,
}

impl RequestQuestions {
    /// The request's questions, the read being of those at `positions`.
    pub fn new(questions: Vec<AskedQuestion>, positions: Vec<usize>) -> Self {
        RequestQuestions {
            questions,
            positions,
        }
    }

    /// The same request for a read of this read's questions at `picks` (in that order).
    pub fn select(&self, picks: &[usize]) -> RequestQuestions {
        RequestQuestions {
            questions: self.questions.clone(),
            positions: picks
                .iter()
                .filter_map(|&i| self.positions.get(i).copied())
                .collect(),
        }
    }

    /// The id of the read's question `index`, when the positions cover it.
    pub fn id(&self, index: usize) -> Option<&QuestionId> {
        let position = *self.positions.get(index)?;
        self.questions.get(position).map(|q| &q.id)
    }
}

impl ReadRequest {
    /// [`asked`](Self::asked) for a read of this read's questions at `picks`.
    pub fn asked_for(&self, picks: &[usize]) -> Option<RequestQuestions> {
        self.asked.as_ref().map(|a| a.select(picks))
    }
}

/// Server extensions a plain client never sends; defaults reproduce the reference read.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReadOptions {
    /// Base seed of the noise draws (reference: 42).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Exact number of noise draws per read; `None` = the automatic re-read rule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draws: Option<u32>,
    /// Whether each question is read alone or all in one prompt. Absent means `joint`: what a
    /// host that does not know the field always got. Hunch's host always sends it.
    #[serde(default)]
    pub questions: QuestionMode,
    /// Whether the question's prior (its distribution about a content-free state) is divided
    /// out (`x_prior`). Taken out by [`crate::DebiasingReader`] before the model's reader.
    #[serde(default, skip_serializing_if = "PriorMode::is_none")]
    pub prior: PriorMode,
    /// In which orders the options are read and averaged (`x_order`); likewise.
    #[serde(default, skip_serializing_if = "OrderMode::is_as_given")]
    pub order: OrderMode,
}

/// How the questions of one request are read (docs/read.md, "Isolated and joint reads").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QuestionMode {
    /// Each question that needs a read is read alone, exactly as a one-question request: its
    /// answer depends only on the model, the state, that question and the seed settings.
    Isolated,
    /// One prompt lists every question (the reference read; answers depend on each other).
    #[default]
    Joint,
}

impl QuestionMode {
    pub fn as_str(self) -> &'static str {
        match self {
            QuestionMode::Isolated => "isolated",
            QuestionMode::Joint => "joint",
        }
    }
}

impl std::str::FromStr for QuestionMode {
    type Err = UnknownQuestionMode;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "isolated" => Ok(QuestionMode::Isolated),
            "joint" => Ok(QuestionMode::Joint),
            other => Err(UnknownQuestionMode(other.to_string())),
        }
    }
}

/// A question mode that is neither `isolated` nor `joint`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown question mode `{0}` (expected `isolated` or `joint`)")]
pub struct UnknownQuestionMode(pub String);

/// What a reader can take, learnt from it (an accelerator reports its own in `/health`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReaderLimits {
    #[serde(default)]
    pub questions: QuestionLimits,
    /// Longest prompt, in tokens, one read may prefill.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_prompt_tokens: Option<u64>,
    /// Most bytes one token's text can cover (so a text of `n` bytes is at least
    /// `n / max_token_bytes` tokens, which lets a host refuse a prompt that can never fit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_token_bytes: Option<u64>,
    /// Largest read request body, in bytes, the reader accepts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_request_bytes: Option<u64>,
    /// The model's prompt names each question by the caller's id and lists the request's
    /// questions (llama.cpp's `nimble`): its reads need [`ReadRequest::asked`], and its answers
    /// depend on ids and on the other questions, so they are never cached. Absent (false) for
    /// every other model, and from an older sidecar.
    #[serde(default, skip_serializing_if = "is_false")]
    pub reads_question_ids: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// Probabilities over a question's labels, in the question's label order
/// (noul: `[yes, no]`; choice: options; score: levels). Finite, non-negative, summing to 1.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct LabelDistribution(pub Vec<f64>);

impl LabelDistribution {
    pub fn probabilities(&self) -> &[f64] {
        &self.0
    }
}

/// Token usage as the contract counts it: integers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// What a read cost, for logs and metrics.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReadStats {
    /// Model reads (one prefill each).
    pub reads: u32,
    /// Noise draws over all reads.
    pub draws: u32,
    /// Prompt tokens over all reads.
    pub prompt_tokens: u64,
    /// Prompt tokens served from the prefix cache.
    pub reused_tokens: u64,
    pub tokenize_seconds: f64,
    pub prefill_seconds: f64,
    pub denoise_seconds: f64,
    /// Reads whose prompt started from a cached prefix.
    #[serde(default)]
    pub cache_hits: u32,
    /// Answers the host's answer cache gave instead of the model ([`crate::CachingReader`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub answer_cache_hits: u32,
    /// Forward passes this request's rows took part in.
    #[serde(default)]
    pub forwards: u32,
    /// Blocking evaluations (waits for the device) of the engine steps this request took part
    /// in; a step may chain several forward passes lazily into one.
    #[serde(default)]
    pub evaluations: u32,
    /// MLX operations built for those steps (0 unless the engine counts them: the sidecar's
    /// `--count-ops`, for benchmarks).
    #[serde(default)]
    pub operations: u64,
    /// The most requests whose rows shared one forward pass with this one (1: always alone).
    #[serde(default)]
    pub max_batch_requests: u32,
    /// The most rows (prompt-chunk tokens plus canvas tokens) of a forward this request took part
    /// in.
    #[serde(default)]
    pub max_batch_rows: u32,
    /// Present when this request shared a forward pass with another request: the largest
    /// |Δ probability| the engine measured between a read alone and the same read in a batch
    /// (its startup probe on this model and backend). `0.0` means batching is bit-exact here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_deviation: Option<f64>,
    /// The engine's gauges when this request finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<EngineGauges>,
}

/// A snapshot of an accelerator's scheduler and prefix cache, carried back with each read so the
/// host can publish them without polling.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct EngineGauges {
    /// Requests admitted and not yet answered (being read or waiting for a batch slot).
    pub active_requests: u32,
    /// Requests queued behind the engine, not yet admitted.
    pub queued_requests: u32,
    /// Bytes of K/V held by the prefix cache.
    pub cache_bytes: u64,
    /// Prompt chunks held by the prefix cache.
    pub cache_entries: u64,
    /// Bytes of prompt K/V held by reads in flight.
    pub inflight_kv_bytes: u64,
    /// The prefix cache's byte bound (0: a sidecar that does not say), so the host can publish
    /// the cache's utilisation as a fraction.
    #[serde(default)]
    pub cache_capacity_bytes: u64,
}

/// The answer to a [`ReadRequest`]: one distribution per question, same order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReadOutcome {
    pub distributions: Vec<LabelDistribution>,
    pub usage: Usage,
    #[serde(default)]
    pub stats: ReadStats,
}

/// The kind of a [`ReadError`], without its message: what status mapping, policies (the WIT
/// `read-error-kind`) and decision records need, so nobody matches on a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReadErrorKind {
    InvalidQuestion,
    TooLarge,
    Unavailable,
    Timeout,
    Rejected,
    Internal,
}

impl ReadErrorKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ReadErrorKind::InvalidQuestion => "invalid_question",
            ReadErrorKind::TooLarge => "too_large",
            ReadErrorKind::Unavailable => "unavailable",
            ReadErrorKind::Timeout => "timeout",
            ReadErrorKind::Rejected => "rejected",
            ReadErrorKind::Internal => "internal",
        }
    }
}

/// Why a read failed. Each variant maps to exactly one HTTP status in the API layer, and only the
/// ones that can succeed on retry map to a 5xx.
#[derive(Debug, Clone, PartialEq, thiserror::Error, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ReadError {
    /// A question the model cannot answer as asked (e.g. its labels do not occupy one token
    /// slot). `question` is its index in the request's `questions`. Never succeeds on retry: 422.
    #[error("question {question}: {message}")]
    InvalidQuestion { question: usize, message: String },
    /// The request as a whole is beyond a limit of the model (prompt too long, …): 400.
    #[error("{message}")]
    TooLarge { message: String },
    /// Not able to take it now (queue full, loading, restarting): 503 with `Retry-After`.
    #[error("{message}")]
    Unavailable {
        message: String,
        retry_after_seconds: u64,
    },
    /// Did not finish in time: 504.
    #[error("read timed out")]
    Timeout,
    /// An upstream server said no in a way that is the caller's fault: passed through as 4xx.
    #[error("upstream rejected the request ({status}): {message}")]
    Rejected { status: u16, message: String },
    /// Anything else (a bug, a broken model output): 500, logged.
    #[error("internal read error: {message}")]
    Internal { message: String },
}

impl ReadError {
    pub fn kind(&self) -> ReadErrorKind {
        match self {
            ReadError::InvalidQuestion { .. } => ReadErrorKind::InvalidQuestion,
            ReadError::TooLarge { .. } => ReadErrorKind::TooLarge,
            ReadError::Unavailable { .. } => ReadErrorKind::Unavailable,
            ReadError::Timeout => ReadErrorKind::Timeout,
            ReadError::Rejected { .. } => ReadErrorKind::Rejected,
            ReadError::Internal { .. } => ReadErrorKind::Internal,
        }
    }

    /// This error of a read of the questions `sent` (their indices in a larger set), counted in
    /// that set: the reader names a question by its place among those it was sent, its caller
    /// by its place in the set.
    pub fn within(self, sent: &[usize]) -> Self {
        match self {
            ReadError::InvalidQuestion { question, message } => ReadError::InvalidQuestion {
                question: sent.get(question).copied().unwrap_or(question),
                message,
            },
            other => other,
        }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        ReadError::Internal {
            message: message.into(),
        }
    }

    pub fn unavailable(message: impl Into<String>, retry_after: Duration) -> Self {
        ReadError::Unavailable {
            message: message.into(),
            retry_after_seconds: retry_after.as_secs().max(1),
        }
    }
}

/// The version of the read algorithm (prompt, answer template, canvas, seeds, draws, re-read rule,
/// averaging). Bump it whenever a change can change an answer: the sidecar puts it in its model
/// fingerprint, so cached answers of the previous version stop matching, and decision events
/// record it, so a replay knows recorded distributions came from another algorithm.
pub const READ_ALGORITHM_VERSION: &str = "read-2";

/// What a reader is, besides its name: what it can take and what its answers depend on. Every
/// reader returns one, and a reader that wraps another returns the inner reader's, so no layer
/// between a caller and the model can hide the model's limits or its identity.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReaderInfo {
    /// What the reader can take, as far as it is known (the contract's limits otherwise).
    pub limits: ReaderLimits,
    /// Identifies everything an isolated answer depends on besides the request (weights,
    /// backend, activation dtype, BLAS, [`READ_ALGORITHM_VERSION`]): the
    /// sidecar's `ModelInfo` fingerprint. `None`: unknown, so answers are never cached.
    pub fingerprint: Option<String>,
    /// What kind of model answers (family, architecture, layout, quantisation), when the
    /// reader's model reported it.
    pub kind: Option<ModelKind>,
}

impl ReaderInfo {
    /// A reader that knows nothing about the model behind it: the contract's limits, no
    /// fingerprint.
    pub fn unknown() -> Self {
        ReaderInfo::default()
    }
}

/// What a loaded model is, in words an operator reads in `/v1/models`: the family and read that
/// answer, the architecture, the checkpoint's layout and how its matrices are stored, all found
/// from the checkpoint's content (docs/accelerator-protocol.md; the sidecar sends it in `/health`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelKind {
    /// `diffusion-gemma` or `chat` (a causal chat model read from its label logits).
    pub family: String,
    /// `diffusiongemma`, `llama`, `qwen3`, `gemma3`.
    pub architecture: String,
    /// How the checkpoint is laid out on disk: `gguf`, `hf`, `mlx-affine`, `nvfp4`.
    pub layout: String,
    /// The storage types of its matrices, the one holding the most weights first, joined by
    /// `+`: `Q4_1+Q8_0`, `BF16`, `affine-4bit-g64`.
    pub quantization: String,
    /// The read the model answers with: `diffusion`, `logits-v1`, or `decision` (a llama.cpp
    /// decision model read by its own prompt).
    pub read: String,
    /// A decision model's type (`openjev`, `lev`, `pplx-decider`, `nimble`, `kev`, `laya`; GGUF
    /// `{arch}.decision.type`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision_type: Option<String>,
    /// The name the checkpoint gives itself (GGUF `general.name`), when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Config keys the load skipped because the user said they are harmless
    /// (`ignore_config_keys`), so `/v1/models` shows what was not checked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ignored_config_keys: Vec<String>,
}

/// Answers typed questions about a state with label distributions.
///
/// [`Reader::info`] has no default on purpose: a wrapper (a gate, a recorder, a replay book)
/// must say what it forwards, so it cannot silently drop the model's limits or fingerprint.
#[async_trait::async_trait]
pub trait Reader: Send + Sync {
    /// The real model name this reader serves (what responses report in `model`).
    fn model_name(&self) -> &str;

    /// Reads every question of `request`; `request.questions` all need a read
    /// ([`Question::needs_read`]). The outcome has one distribution per question.
    async fn read(&self, request: ReadRequest) -> Result<ReadOutcome, ReadError>;

    /// Whether the reader can take reads now (for `/readyz`).
    async fn ready(&self) -> bool {
        true
    }

    /// The model's limits and fingerprint, as of now (a sidecar learns them when it is loaded,
    /// and forgets them when it restarts).
    fn info(&self) -> ReaderInfo;
}
