//! DiffusionGemma's read engine: a loaded checkpoint, its tokenizer and read planner, answering
//! [`ReadRequest`]s. Lives on the sidecar's engine thread.

use crate::checkpoint::LoadOptions;
use crate::model::{ActivationDtype, DiffusionGemma};
use crate::read::diffusion::{PlanSettings, Planner, ReadSettings, MAX_CANVAS_CAP};
use crate::scheduler::{
    measure_batch_deviation, Batching, Reply, Scheduler, SchedulerConfig, StepOutcome,
};
use crate::server::info::{model_info, AnswerSettings};
use crate::server::ReadEngine;
use crate::tokenizer::Tokenizer;
use hunch_core::protocol::ModelInfo;
use hunch_core::{ReadError, ReadOutcome, ReadRequest};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// How to serve a checkpoint.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    pub dtype: ActivationDtype,
    /// Widest canvas asked for (clamped to 128 and to the checkpoint's `canvas_length`).
    pub canvas_cap: usize,
    pub max_prompt_tokens: usize,
    pub rereads: bool,
    pub progress: bool,
    /// Batching, memory budget, prefill chunk and prefix cache.
    pub scheduler: SchedulerConfig,
    /// Measure the batch deviation at load (a few small forwards) so batched answers can report
    /// it.
    pub probe_batching: bool,
    /// Count the MLX operations each step builds into `ReadStats.operations` (benchmarks).
    pub count_operations: bool,
    /// Bytes the weights converted at load may take (`None`: the machine's available memory);
    /// a load that needs more is refused before allocating.
    pub memory_limit: Option<u64>,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            dtype: ActivationDtype::Float32,
            canvas_cap: 64,
            max_prompt_tokens: 12_288,
            rereads: true,
            progress: false,
            scheduler: SchedulerConfig::default(),
            probe_batching: true,
            count_operations: false,
            memory_limit: None,
        }
    }
}

/// Why a model could not be made ready.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Load(#[from] crate::checkpoint::LoadError),
    #[error(transparent)]
    Tokenizer(#[from] crate::tokenizer::TokenizerError),
    #[error("{dir}: {message}")]
    Plan { dir: PathBuf, message: String },
}

/// A model ready to read, with the scheduler that batches its work.
pub struct MlxEngine {
    planner: Planner<Tokenizer>,
    model: DiffusionGemma,
    settings: ReadSettings,
    scheduler: Scheduler,
    /// Limits and fingerprint, reported to the host in `/health`.
    info: ModelInfo,
}

impl MlxEngine {
    /// Loads `dir` (any supported layout) and its `tokenizer.json`.
    pub fn load(dir: &Path, options: &EngineOptions) -> Result<Self, EngineError> {
        // Chosen before the first matmul (HUNCH_BLAS unless the program chose already).
        let blas = crate::blas::active();
        tracing::info!(%blas, "BLAS serving MLX's CPU matmuls");
        let tokenizer = Tokenizer::from_dir(dir)?;
        let model = DiffusionGemma::load(
            dir,
            &LoadOptions {
                dtype: options.dtype,
                progress: options.progress,
                memory_limit: options.memory_limit,
            },
        )?;
        let canvas_cap = options.canvas_cap.min(MAX_CANVAS_CAP).min(
            model
                .config()
                .canvas_length
                .map(|c| c.max(1) as usize)
                .unwrap_or(MAX_CANVAS_CAP),
        );
        let planner = Planner::new(
            tokenizer,
            PlanSettings {
                canvas_cap,
                max_prompt_tokens: options.max_prompt_tokens,
            },
        )
        .map_err(|e| EngineError::Plan {
            dir: dir.to_path_buf(),
            message: e.to_string(),
        })?;
        let mut scheduler = Scheduler::new(&model, options.scheduler.clone());
        scheduler.count_operations(options.count_operations);
        if options.probe_batching {
            match measure_batch_deviation(&model, scheduler.config().prefill_chunk) {
                Ok(deviation) => {
                    tracing::info!(
                        deviation,
                        "batch invariance probe: largest |Δp| alone vs batched"
                    );
                    scheduler.set_batch_deviation(Some(deviation));
                }
                Err(e) => {
                    // Not a reason to refuse service, but answers must not claim exactness:
                    // unmeasured, batched answers carry no deviation figure.
                    tracing::warn!(error = %e, "batch invariance probe failed");
                }
            }
        }
        let info = model_info(
            dir,
            planner.tokenizer(),
            planner.question_limits(),
            &AnswerSettings {
                dtype: format!("{:?}", options.dtype).to_lowercase(),
                canvas_cap,
                max_prompt_tokens: options.max_prompt_tokens,
                rereads: options.rereads,
            },
        );
        let config = scheduler.config();
        if config.batching == Batching::Auto && scheduler.request_limit() < config.max_requests {
            tracing::info!(
                deviation = ?scheduler.batch_deviation(),
                "batching across requests is not measured exact here: reading one request at a \
                 time so every answer equals the read alone (--batching on for throughput)"
            );
        }
        Ok(MlxEngine {
            info,
            planner,
            model,
            settings: ReadSettings {
                rereads: options.rereads,
            },
            scheduler,
        })
    }

    /// Answers one request on its own, stepping the scheduler until it is done (tests, tools).
    pub fn read(&mut self, request: &ReadRequest) -> Result<ReadOutcome, ReadError> {
        let slot: Arc<Mutex<Option<Result<ReadOutcome, ReadError>>>> = Arc::default();
        let sink = slot.clone();
        self.submit(
            request.clone(),
            Reply::new(move |outcome| {
                if let Ok(mut s) = sink.lock() {
                    *s = Some(outcome);
                }
            }),
        );
        loop {
            if let Some(outcome) = slot.lock().ok().and_then(|mut s| s.take()) {
                return outcome;
            }
            if self.step() == StepOutcome::Idle {
                return Err(ReadError::internal(
                    "the scheduler went idle without an answer",
                ));
            }
        }
    }

    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    /// The scheduler, to change what it reports or allows (tests, tools).
    pub fn scheduler_mut(&mut self) -> &mut Scheduler {
        &mut self.scheduler
    }

    pub fn model(&self) -> &DiffusionGemma {
        &self.model
    }

    pub fn planner(&self) -> &Planner<Tokenizer> {
        &self.planner
    }
}

impl ReadEngine for MlxEngine {
    fn submit(&mut self, request: ReadRequest, reply: Reply) {
        #[cfg(feature = "fault-injection")]
        super::injected_panic_once();
        let vocab = self.model.config().vocab_size as u32;
        self.scheduler
            .submit(&self.planner, &self.settings, vocab, &request, reply);
    }

    fn has_room(&self) -> bool {
        self.scheduler.has_room()
    }

    fn set_queued(&mut self, queued: usize) {
        self.scheduler.set_queued(queued);
    }

    fn step(&mut self) -> StepOutcome {
        self.scheduler.step(&self.model)
    }

    fn info(&self) -> Option<ModelInfo> {
        Some(self.info.clone())
    }
}

/// The model as the one-read-at-a-time path's denoiser (tests only, feature `testing`).
#[cfg(any(test, feature = "testing"))]
mod model_denoiser {
    use crate::model::{DiffusionGemma, ModelError, PromptCache};
    use crate::read::diffusion::{Denoiser, SlotLogits};

    /// [`DiffusionGemma`] as the read's [`Denoiser`], prefilling in chunks of `chunk` tokens: the
    /// one-read-at-a-time path ([`crate::read::diffusion::execute`]) that the scheduler's answers are checked
    /// against.
    pub struct ModelDenoiser<'a> {
        pub model: &'a DiffusionGemma,
        pub chunk: usize,
    }

    impl Denoiser for ModelDenoiser<'_> {
        type Prefill = PromptCache;

        fn vocab_size(&self) -> u32 {
            self.model.config().vocab_size as u32
        }

        fn prefill(&self, prompt_ids: &[u32]) -> Result<PromptCache, ModelError> {
            self.model.prefill_chunked(prompt_ids, self.chunk)
        }

        fn slot_logits(
            &self,
            prefill: &PromptCache,
            canvases: &[Vec<u32>],
            positions: &[usize],
        ) -> Result<SlotLogits, ModelError> {
            let logits = self.model.denoise_at(prefill, canvases, positions)?;
            let values = logits
                .try_as_slice::<f32>()
                .map_err(|_| ModelError::Shape("logits are not contiguous float32"))?
                .to_vec();
            let vocab = self.model.config().vocab_size as usize;
            if values.len() != canvases.len() * positions.len() * vocab {
                return Err(ModelError::Shape(
                    "the decoder returned a logit count other than canvases x positions x vocab",
                ));
            }
            Ok(SlotLogits {
                draws: canvases.len(),
                slots: positions.len(),
                vocab,
                values,
            })
        }
    }
}
#[cfg(any(test, feature = "testing"))]
pub use model_denoiser::ModelDenoiser;
