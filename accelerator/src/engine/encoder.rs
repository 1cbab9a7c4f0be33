//! The encoder read engine: a llama.cpp `laya` decision model (a ModernBERT encoder with its
//! decision head, `model::encoder`) and its [`DecisionPlanner`], answering [`ReadRequest`]s
//! from the head's scores at each option's marker (docs/models.md, "Decision models").
//!
//! Requests are read one at a time and each question's sequence alone (an encoder has no
//! prefix to share: every position sees every other), so an answer is the same bits whatever
//! else was queued.

use std::path::{Path, PathBuf};
use std::time::Instant;

use hunch_core::protocol::ModelInfo;
use hunch_core::{
    QuestionKind, ReadError, ReadOutcome, ReadRequest, ReadStats, ReaderLimits, Usage,
};

use crate::checkpoint::causal::CausalFormat;
use crate::checkpoint::encoder::{is_modern_bert, load_laya};
use crate::checkpoint::gguf::{DecisionKind, DecisionMetadataError, GgufError, GgufFile};
use crate::model::causal::CausalKernels;
use crate::model::encoder::{EncoderKernels, MarkerHead, ModernBert, QuestionType};
use crate::read::decision::{DecisionPlan, DecisionPlanner, DecisionSetupError};
use crate::scheduler::{Reply, StepOutcome};
use crate::server::info::build_backend;
use crate::server::ReadEngine;
use crate::tokenizer::chat::{ChatTokenizer, ChatTokenizerError};

use super::planner::DECISION_READ_VERSION;
use super::queue::ReadQueue;
use super::CausalEngineOptions;

/// Why an encoder model could not be made ready.
#[derive(Debug, thiserror::Error)]
pub enum EncoderEngineError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Tokenizer(#[from] ChatTokenizerError),
    #[error("{path}: {source}")]
    DecisionMetadata {
        path: PathBuf,
        source: DecisionMetadataError,
    },
    #[error(
        "{path}: a ModernBERT encoder is read only as a laya decision model (its \
         modern-bert.decision.type), and this one is {found}"
    )]
    NotLaya { path: PathBuf, found: String },
    #[error("{path}: a decision model cannot be read: {source}")]
    Decision {
        path: PathBuf,
        source: DecisionSetupError,
    },
    #[error(
        "{path}: a decision model is prompted by its own systemone template; --chat-template \
         (chat_template) does not apply to it"
    )]
    DecisionTemplateGiven { path: PathBuf },
}

/// Whether `path` holds an encoder this engine reads (a `modern-bert` GGUF), by its content.
pub fn is_encoder(path: &Path) -> bool {
    GgufFile::is_gguf(path) && GgufFile::open(path).is_ok_and(|f| is_modern_bert(&f))
}

/// A laya model ready to read.
pub struct EncoderEngine {
    encoder: ModernBert,
    head: MarkerHead,
    /// What computes the encoder and the head.
    kernels: EncoderKernels,
    planner: DecisionPlanner<ChatTokenizer>,
    queue: ReadQueue,
    info: ModelInfo,
}

impl EncoderEngine {
    /// Loads the laya GGUF at `path` (the chat engine's options that apply: the prompt limit,
    /// the queue, the kernels and the activations' rounding, and the chat-template setting,
    /// which a decision model refuses).
    pub fn load(path: &Path, options: &CausalEngineOptions) -> Result<Self, EncoderEngineError> {
        let started = Instant::now();
        let file = GgufFile::open(path)?;
        let metadata = crate::checkpoint::gguf::decision_metadata(&file)
            .map_err(|source| EncoderEngineError::DecisionMetadata {
                path: path.to_path_buf(),
                source,
            })?
            .filter(|m| m.kind == DecisionKind::Laya)
            .ok_or_else(|| EncoderEngineError::NotLaya {
                path: path.to_path_buf(),
                found: match crate::checkpoint::gguf::decision_metadata(&file) {
                    Ok(Some(m)) => format!("of decision type {}", m.kind.name()),
                    _ => "not a decision model (an embedding model, which Hunch does not read)"
                        .into(),
                },
            })?;
        if options.chat_template.is_some() {
            return Err(EncoderEngineError::DecisionTemplateGiven {
                path: path.to_path_buf(),
            });
        }
        // `--kernels mlx` keeps every product on MLX's operations; otherwise the quantised
        // ones run on the native integer products where this CPU has a fast copy of them.
        let pack = options.kernels != CausalKernels::Mlx;
        let (encoder, head) = load_laya(&file, pack)?;
        // The native kernels for attention and GELU wherever MLX runs on the CPU and the
        // products are native too (`--kernels mlx` keeps everything on MLX).
        let kernels = EncoderKernels {
            native: pack && crate::model::widened::cpu_backend().unwrap_or(false),
            precision: options.activations,
        };
        if kernels.native {
            // The native kernels split their work between the cores themselves; OpenBLAS (the
            // small products MLX still runs) on one thread leaves no worker spinning against
            // them, as for a chat model on the integer products.
            let single = crate::blas::set_threads(1);
            tracing::info!(single, "BLAS on one thread beside the native kernels");
        }
        let tokenizer = ChatTokenizer::from_gguf(&file)?;
        let max_prompt_tokens = options.max_prompt_tokens.min(encoder.config.max_positions);
        let origin = format!("{} (tokenizer.chat_template.systemone)", path.display());
        let planner = DecisionPlanner::new(tokenizer, metadata, &origin, max_prompt_tokens)
            .map_err(|source| EncoderEngineError::Decision {
                path: path.to_path_buf(),
                source,
            })?;
        let config = &encoder.config;
        tracing::info!(
            architecture = crate::checkpoint::encoder::MODERN_BERT,
            layers = config.layers,
            head_blocks = head.blocks.len(),
            hidden = config.hidden,
            vocab = encoder.vocab,
            seconds = started.elapsed().as_secs_f64(),
            "laya decision model loaded"
        );
        let info = model_info(path, &planner, max_prompt_tokens);
        Ok(EncoderEngine {
            encoder,
            head,
            kernels,
            planner,
            queue: ReadQueue::new(options.max_requests),
            info,
        })
    }

    pub fn encoder(&self) -> &ModernBert {
        &self.encoder
    }

    /// What computes the encoder and the head.
    pub fn kernels(&self) -> EncoderKernels {
        self.kernels
    }

    pub fn planner(&self) -> &DecisionPlanner<ChatTokenizer> {
        &self.planner
    }

    /// Answers one request now (tests, tools, and the engine thread's step).
    pub fn read(&mut self, request: &ReadRequest) -> Result<ReadOutcome, ReadError> {
        let started = Instant::now();
        let plan = self.planner.plan(request)?;
        let mut stats = ReadStats {
            tokenize_seconds: started.elapsed().as_secs_f64(),
            max_batch_requests: 1,
            ..ReadStats::default()
        };
        let forward_started = Instant::now();
        let scores = self.scores(request, &plan)?;
        let input_tokens: u64 = plan.sequences.iter().map(|s| s.tokens.len() as u64).sum();
        let distributions = plan.distributions(&scores)?;
        stats.prefill_seconds = forward_started.elapsed().as_secs_f64();
        stats.reads = plan.sequences.len() as u32;
        stats.forwards = plan.sequences.len() as u32;
        stats.evaluations = stats.forwards;
        stats.prompt_tokens = input_tokens;
        Ok(ReadOutcome {
            distributions,
            usage: Usage {
                input_tokens,
                output_tokens: 0,
            },
            stats,
        })
    }

    /// Each sequence's scores at its markers, in order: the encoder over the sequence, then
    /// the head for its question's type.
    pub fn scores(
        &self,
        request: &ReadRequest,
        plan: &DecisionPlan,
    ) -> Result<Vec<Vec<f32>>, ReadError> {
        let markers = plan
            .markers
            .as_ref()
            .filter(|m| m.len() == plan.sequences.len())
            .ok_or_else(|| ReadError::internal("a laya plan without one marker list a sequence"))?;
        plan.sequences
            .iter()
            .zip(markers)
            .map(|(sequence, markers)| {
                let failed = |e: crate::model::ModelError| {
                    ReadError::internal(format!("question {}: {e}", sequence.question))
                };
                let kind = match &request.questions[sequence.question].kind {
                    QuestionKind::Choice { .. } => QuestionType::Choice,
                    QuestionKind::Score { .. } => QuestionType::Score,
                    QuestionKind::Noul { .. } => QuestionType::Noul,
                };
                let encoded = self
                    .encoder
                    .forward(&sequence.tokens, self.kernels)
                    .map_err(failed)?;
                self.head
                    .scores(&encoded, kind, markers, self.kernels)
                    .map_err(failed)
            })
            .collect()
    }
}

impl ReadEngine for EncoderEngine {
    fn submit(&mut self, request: ReadRequest, reply: Reply) {
        #[cfg(feature = "fault-injection")]
        super::injected_panic_once();
        self.queue.push(request, reply);
    }

    fn has_room(&self) -> bool {
        self.queue.has_room()
    }

    fn set_queued(&mut self, _queued: usize) {}

    fn step(&mut self) -> StepOutcome {
        let Some((request, reply)) = self.queue.next() else {
            return StepOutcome::Idle;
        };
        reply.send(self.read(&request));
        StepOutcome::Worked
    }

    fn info(&self) -> Option<ModelInfo> {
        Some(self.info.clone())
    }
}

/// The model's limits and fingerprint: the file's digest, the architecture, the MLX build and
/// BLAS, the read's version and its prompt limit.
fn model_info(
    path: &Path,
    planner: &DecisionPlanner<ChatTokenizer>,
    max_prompt_tokens: usize,
) -> ModelInfo {
    let digest = crate::server::info::file_or_dir_digest(path);
    let architecture = crate::checkpoint::encoder::MODERN_BERT;
    let fingerprint = format!(
        "{digest:016x}/{architecture}-gguf-as-stored/{}/{}/float32/{DECISION_READ_VERSION}-{}/prompt{max_prompt_tokens}",
        build_backend(),
        crate::blas::active().name(),
        planner.kind().name(),
    );
    ModelInfo {
        fingerprint,
        limits: ReaderLimits {
            questions: planner.question_limits(),
            max_prompt_tokens: Some(max_prompt_tokens as u64),
            max_token_bytes: None,
            max_request_bytes: None,
            reads_question_ids: planner.reads_question_ids(),
        },
        blas_libraries: crate::blas::mapped_libraries(),
        kind: Some(hunch_core::protocol::ModelKind {
            decision_type: Some(planner.kind().name().to_string()),
            ..crate::checkpoint::stored::chat_kind(
                path,
                &CausalFormat::Gguf,
                architecture,
                "decision",
            )
        }),
    }
}
