//! The chat-model read engine: a loaded [`CausalLm`], its [`Planner`] (the label-logit read's
//! [`LogitPlanner`] over its tokenizer, or a decision model's `read::decision`) and a prefix
//! cache of prompt chunks, answering [`ReadRequest`]s from next-token label logits
//! (docs/logit-read.md, docs/models.md "Decision models").
//!
//! Requests are read one at a time, each question's sequence alone: every answer is the same
//! bits whether its prompt's chunks were computed now or restored from the cache, and whatever
//! else was queued (the chunks' shapes depend only on their positions; `model::causal::blocks`).

use std::path::{Path, PathBuf};
use std::time::Instant;

use mlx_rs::Array;

use hunch_core::protocol::ModelInfo;
use hunch_core::{ReadError, ReadOutcome, ReadRequest, ReadStats, ReaderLimits, Usage};

use crate::checkpoint::causal::{load_model_for, AffineWeights, CausalFormat, CausalLoadError};
use crate::checkpoint::gguf::{DecisionKind, GgufError, GgufFile};
use crate::model::causal::cpu::kernels::quant::Precision;
use crate::model::causal::{CausalKernels, CausalLm, DEFAULT_CAUSAL_CHUNK};
use crate::read::decision::{DecisionPlanner, DecisionSetupError, KevSetupError, PointerHead};
use crate::read::logits::{LogitPlanner, ScoringSequence};
use crate::scheduler::{Reply, StepOutcome};
use crate::server::info::build_backend;
use crate::server::ReadEngine;
use crate::tokenizer::chat::ChatTokenizer;

use super::chunk_cache::ChunkCache;
use super::queue::ReadQueue;

mod prefill;
pub use super::planner::{Plan, Planner, DECISION_READ_VERSION, LOGIT_READ_VERSION};

/// How to serve a chat model.
#[derive(Debug, Clone)]
pub struct CausalEngineOptions {
    /// Longest sequence a question may take; longer requests are refused before any work.
    pub max_prompt_tokens: usize,
    /// Prompt tokens per chunk (the unit of prefix sharing).
    pub prefill_chunk: usize,
    /// Bytes the prefix cache may hold; 0 turns it off.
    pub prefix_cache_bytes: u64,
    /// Requests the engine takes before it reports no room.
    pub max_requests: usize,
    /// Affine-quantised weights kept quantised or widened at load.
    pub affine: AffineWeights,
    /// What runs prompt chunks: MLX, or the native CPU path (`model::causal::cpu`).
    pub kernels: CausalKernels,
    /// How finely the native path's integer products round their inputs.
    pub activations: Precision,
    /// Config keys the user said are harmless for this model (`ignore_config_keys`): skipped
    /// by the key audit instead of refused (docs/models.md, "Configs").
    pub ignore_config_keys: Vec<String>,
    /// The chat template to render prompts with instead of the checkpoint's (or where it has
    /// none): a built-in name (`chatml`, `llama3`, `gemma`) or a Jinja file's path.
    pub chat_template: Option<String>,
}

impl Default for CausalEngineOptions {
    fn default() -> Self {
        CausalEngineOptions {
            max_prompt_tokens: 12_288,
            prefill_chunk: DEFAULT_CAUSAL_CHUNK,
            prefix_cache_bytes: 1 << 30,
            max_requests: 16,
            affine: AffineWeights::Auto,
            kernels: CausalKernels::Auto,
            activations: Precision::Fine,
            ignore_config_keys: Vec::new(),
            chat_template: None,
        }
    }
}

/// Why a chat model could not be made ready.
#[derive(Debug, thiserror::Error)]
pub enum CausalEngineError {
    #[error(transparent)]
    Load(#[from] CausalLoadError),
    #[error(transparent)]
    Tokenizer(#[from] crate::tokenizer::chat::ChatTokenizerError),
    #[error(transparent)]
    Gguf(#[from] crate::checkpoint::gguf::GgufError),
    #[error("{path}: {source}")]
    Kernels {
        path: PathBuf,
        source: crate::model::ModelError,
    },
    #[error("{path}: the tokenizer cannot spell the answer labels: {why}")]
    Labels { path: PathBuf, why: String },
    #[error("{path}: {source}")]
    DecisionMetadata {
        path: PathBuf,
        source: crate::checkpoint::gguf::DecisionMetadataError,
    },
    #[error("{path}: a decision model cannot be read: {source}")]
    Decision {
        path: PathBuf,
        source: crate::read::decision::DecisionSetupError,
    },
    #[error(
        "{path}: a decision model is prompted by its own systemone template; --chat-template \
         (chat_template) does not apply to it"
    )]
    DecisionTemplateGiven { path: PathBuf },
    #[error(
        "{path}: a laya decision model is a ModernBERT encoder (general.architecture \
         modern-bert), read at its mask markers by its decision head; this file is a \
         {architecture} causal model"
    )]
    LayaNotEncoder { path: PathBuf, architecture: String },
}

/// A chat model ready to read.
pub struct CausalEngine {
    model: CausalLm,
    planner: Planner,
    cache: ChunkCache,
    chunk: usize,
    queue: ReadQueue,
    queued_outside: usize,
    info: ModelInfo,
    format: CausalFormat,
}

impl CausalEngine {
    /// Loads the GGUF file or Hugging Face folder at `path`.
    pub fn load(path: &Path, options: &CausalEngineOptions) -> Result<Self, CausalEngineError> {
        let blas = crate::blas::active();
        tracing::info!(%blas, "BLAS serving MLX's CPU matmuls");
        let started = Instant::now();
        let (mut model, format, stored_bytes) = load_model_for(
            path,
            options.affine,
            options.kernels,
            &options.ignore_config_keys,
        )?;
        let kernels =
            model
                .select_kernels(options.kernels)
                .map_err(|source| CausalEngineError::Kernels {
                    path: path.to_path_buf(),
                    source,
                })?;
        model.set_activation_precision(options.activations);
        if model.integer_products() {
            // The integer products split their work between the cores themselves; OpenBLAS
            // (the attention's small products) on one thread leaves no idle worker spinning
            // against them (docs/logit-read.md, "Kernels").
            let single = crate::blas::set_threads(1);
            tracing::info!(single, "BLAS on one thread beside the integer products");
        }
        // Quantised projections repacked for the native integer products sit beside the
        // checkpoint's own arrays.
        let weight_bytes = stored_bytes + model.packed_bytes() as u64;
        // The tokenizer is the engine's to load: the checkpoint module stays below the
        // tokenizer and the read (docs/architecture.md).
        let (tokenizer, decision) = match &format {
            CausalFormat::Gguf => {
                let file = GgufFile::open(path)?;
                let architecture = file.architecture().unwrap_or("unnamed").to_string();
                let type_key = crate::checkpoint::gguf::decision_type_key(&architecture);
                if file.string(&type_key) == Some(DecisionKind::Laya.name()) {
                    return Err(CausalEngineError::LayaNotEncoder {
                        path: path.to_path_buf(),
                        architecture,
                    });
                }
                let decision =
                    crate::checkpoint::gguf::decision_metadata(&file).map_err(|source| {
                        CausalEngineError::DecisionMetadata {
                            path: path.to_path_buf(),
                            source,
                        }
                    })?;
                (ChatTokenizer::from_gguf(&file)?, decision)
            }
            CausalFormat::HuggingFace { .. } => (ChatTokenizer::from_dir(path)?, None),
        };
        let planner = match decision {
            // A llama.cpp decision model: its own prompt and labels (docs/models.md,
            // "Decision models"), whether or not it also has a chat template.
            Some(metadata) => {
                if options.chat_template.is_some() {
                    return Err(CausalEngineError::DecisionTemplateGiven {
                        path: path.to_path_buf(),
                    });
                }
                let origin = format!("{} (tokenizer.chat_template.systemone)", path.display());
                let planner =
                    DecisionPlanner::new(tokenizer, metadata, &origin, options.max_prompt_tokens)
                        .map_err(|source| CausalEngineError::Decision {
                        path: path.to_path_buf(),
                        source,
                    })?;
                let planner = match planner.kind() {
                    DecisionKind::Kev => {
                        let head = pointer_head(path, model.config().hidden_size as usize)?;
                        planner.with_pointer_head(head)
                    }
                    _ => planner,
                };
                Planner::Decision(planner)
            }
            None => {
                let tokenizer = match &options.chat_template {
                    Some(given) => tokenizer.with_template(given)?,
                    None => tokenizer,
                };
                // A model with no template is refused here, saying so, rather than failing
                // every read (or the label check below, which renders a prompt) with a less
                // direct message.
                if !tokenizer.has_template() {
                    return Err(tokenizer.no_template_error().into());
                }
                let planner =
                    LogitPlanner::new(tokenizer, options.max_prompt_tokens).map_err(|e| {
                        CausalEngineError::Labels {
                            path: path.to_path_buf(),
                            why: e.to_string(),
                        }
                    })?;
                Planner::Chat(planner)
            }
        };
        let chunk = options.prefill_chunk.max(1);
        let config = model.config();
        tracing::info!(
            architecture = config.architecture.name(),
            format = format.name(),
            layers = config.num_layers,
            hidden = config.hidden_size,
            vocab = config.vocab_size,
            weight_mib = weight_bytes >> 20,
            kernels = %kernels,
            kernel_build = %model.kernels_name(),
            read = %planner.read_version(),
            seconds = started.elapsed().as_secs_f64(),
            "chat model loaded"
        );
        let info = model_info(path, &model, &format, &planner, options, chunk);
        Ok(CausalEngine {
            cache: ChunkCache::new(options.prefix_cache_bytes),
            model,
            planner,
            chunk,
            queue: ReadQueue::new(options.max_requests),
            queued_outside: 0,
            info,
            format,
        })
    }

    pub fn model(&self) -> &CausalLm {
        &self.model
    }

    pub fn planner(&self) -> &Planner {
        &self.planner
    }

    pub fn format(&self) -> &CausalFormat {
        &self.format
    }

    /// Bytes the prefix cache holds now.
    pub fn cached_bytes(&self) -> u64 {
        self.cache.bytes
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
        let prefill_started = Instant::now();
        let logits = match plan.markers() {
            None => self.label_logits(&plan.sequences, &mut stats)?,
            Some(markers) => self.pointer_scores(&plan.sequences, markers, &mut stats)?,
        };
        let input_tokens = plan.sequences.iter().map(|s| s.tokens.len() as u64).sum();
        let distributions = plan.distributions(&logits)?;
        stats.prefill_seconds = prefill_started.elapsed().as_secs_f64();
        stats.reads = plan.sequences.len() as u32;
        stats.evaluations = stats.forwards;
        Ok(ReadOutcome {
            distributions,
            usage: Usage {
                input_tokens,
                output_tokens: 0,
            },
            stats,
        })
    }

    /// Each sequence's label logits at its last position, in order.
    pub fn label_logits(
        &mut self,
        sequences: &[ScoringSequence],
        stats: &mut ReadStats,
    ) -> Result<Vec<Vec<f32>>, ReadError> {
        let last: Vec<Vec<usize>> = sequences
            .iter()
            .map(|s| vec![s.tokens.len().saturating_sub(1)])
            .collect();
        let hidden = self.prefill_sequences(sequences, &last, stats)?;
        sequences
            .iter()
            .zip(&hidden)
            .map(|(sequence, hidden)| {
                self.model
                    .label_logits(&hidden[0], &sequence.labels)
                    .map_err(|e| {
                        ReadError::internal(format!(
                            "question {}: label logits: {e}",
                            sequence.question
                        ))
                    })
            })
            .collect()
    }

    /// A kev model's scores for each sequence (in order): its pointer head over the final-norm
    /// hidden states at the sequence's `markers` (one per option) and at its last position
    /// (docs/models.md, "Decision models").
    pub fn pointer_scores(
        &mut self,
        sequences: &[ScoringSequence],
        markers: &[Vec<usize>],
        stats: &mut ReadStats,
    ) -> Result<Vec<Vec<f32>>, ReadError> {
        if markers.len() != sequences.len() {
            return Err(ReadError::internal("one list of markers per sequence"));
        }
        let wanted: Vec<Vec<usize>> = sequences
            .iter()
            .zip(markers)
            .map(|(s, m)| {
                let mut at = m.clone();
                at.push(s.tokens.len().saturating_sub(1));
                at
            })
            .collect();
        let hidden = self.prefill_sequences(sequences, &wanted, stats)?;
        let Planner::Decision(planner) = &self.planner else {
            return Err(ReadError::internal("a pointer read of a chat model"));
        };
        let head = planner
            .pointer_head()
            .ok_or_else(|| ReadError::internal("a kev model without its pointer head"))?;
        let values = |a: &Array| -> Result<Vec<f32>, ReadError> {
            a.try_as_slice::<f32>()
                .map(<[f32]>::to_vec)
                .map_err(|_| ReadError::internal("a hidden state is not contiguous float32"))
        };
        sequences
            .iter()
            .zip(&hidden)
            .map(|(sequence, states)| {
                let (pointer, at_markers) = states
                    .split_last()
                    .ok_or_else(|| ReadError::internal("no hidden state read"))?;
                let at_markers = at_markers
                    .iter()
                    .map(values)
                    .collect::<Result<Vec<_>, _>>()?;
                head.scores(&values(pointer)?, &at_markers).ok_or_else(|| {
                    ReadError::internal(format!(
                        "question {}: hidden states and the pointer head disagree",
                        sequence.question
                    ))
                })
            })
            .collect()
    }
}

impl ReadEngine for CausalEngine {
    fn submit(&mut self, request: ReadRequest, reply: Reply) {
        #[cfg(feature = "fault-injection")]
        super::injected_panic_once();
        self.queue.push(request, reply);
    }

    fn has_room(&self) -> bool {
        self.queue.has_room()
    }

    fn set_queued(&mut self, queued: usize) {
        self.queued_outside = queued;
    }

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

/// A kev model's pointer head (`cls.output`), over hidden states of `hidden` values; a missing
/// tensor or a wrong shape refuses the model, naming the tensor.
fn pointer_head(path: &Path, hidden: usize) -> Result<PointerHead, CausalEngineError> {
    let refused = |e: KevSetupError| CausalEngineError::Decision {
        path: path.to_path_buf(),
        source: DecisionSetupError::Kev(e),
    };
    let (weight, bias) = match crate::checkpoint::gguf::pointer_head_tensors(&GgufFile::open(path)?)
    {
        Ok(tensors) => tensors,
        Err(GgufError::Missing { name, .. }) => return Err(refused(KevSetupError::NoHead(name))),
        Err(e) => return Err(e.into()),
    };
    PointerHead::new(
        (weight.name, weight.values, &weight.shape),
        (bias.name, bias.values, &bias.shape),
        hidden,
    )
    .map_err(|e| refused(e.into()))
}

/// The model's limits and fingerprint: the checkpoint's digest, the family and layout, the MLX
/// build and BLAS, the kernels that run prompt chunks (MLX's, or the native CPU path with its
/// instruction set), the read's version and its settings (the chunk length decides the bits of
/// an answer, since chunks are the unit of computation).
fn model_info(
    path: &Path,
    model: &CausalLm,
    format: &CausalFormat,
    planner: &Planner,
    options: &CausalEngineOptions,
    chunk: usize,
) -> ModelInfo {
    let digest = crate::server::info::file_or_dir_digest(path);
    let config = model.config();
    let weights = if options.affine.dense_for(config, options.kernels) {
        "dense"
    } else {
        "as-stored"
    };
    let fingerprint = format!(
        "{digest:016x}/{}-{}-{weights}/{}/{}/float32/{}/{}/chunk{chunk}/prompt{}",
        config.architecture.name(),
        format.name(),
        build_backend(),
        crate::blas::active().name(),
        model.kernels_name(),
        planner.read_version(),
        options.max_prompt_tokens,
    );
    let max_prompt_tokens = match config.max_position_embeddings {
        Some(context) if (context as usize) < options.max_prompt_tokens => context as usize,
        _ => options.max_prompt_tokens,
    };
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
            ignored_config_keys: config.ignored_config_keys.clone(),
            decision_type: planner.decision_type().map(str::to_string),
            ..crate::checkpoint::stored::chat_kind(
                path,
                format,
                config.architecture.name(),
                planner.read_name(),
            )
        }),
    }
}
