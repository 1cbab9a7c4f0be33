//! The read engines the sidecar runs on its engine thread, one per model family:
//!
//! - [`diffusion`]: DiffusionGemma, read by denoising label slots ([`MlxEngine`]);
//! - [`causal`]: chat models (Llama, Qwen3, Gemma 3), read from next-token label logits
//!   ([`CausalEngine`], docs/logit-read.md), and llama.cpp's decision models of the same
//!   families, read by their own prompt (`planner`, docs/models.md "Decision models").
//!
//! - [`encoder`]: llama.cpp's `laya` decision models, a ModernBERT encoder read at each
//!   option's marker by its decision head ([`EncoderEngine`]).
//!
//! [`load_engine`]'s choice between them goes by the checkpoint's content.

pub mod causal;
mod chunk_cache;
#[cfg(test)]
mod decision_tests;
mod diffusion;
pub mod encoder;
mod planner;
mod queue;
mod refusal;

pub use causal::{CausalEngine, CausalEngineError, CausalEngineOptions};
pub use diffusion::*;
pub use encoder::{EncoderEngine, EncoderEngineError};

/// Only with the `fault-injection` feature, which only the test command turns on
/// (`scripts/test.sh`), so that no build of the sidecar a user runs can reach it: with
/// `HUNCH_TEST_ENGINE_PANIC_ONCE=PATH` set, the engine thread panics at its first request unless
/// PATH exists, creating PATH first (so the restarted sidecar serves). The end-to-end test of
/// the host's supervisor uses it (`tests/tests/real_faults.rs`); a panic is how a bug in the
/// model code would kill the thread.
#[cfg(feature = "fault-injection")]
pub(crate) fn injected_panic_once() {
    if let Some(path) = std::env::var_os("HUNCH_TEST_ENGINE_PANIC_ONCE") {
        let created = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path);
        if created.is_ok() {
            panic!("injected engine fault (HUNCH_TEST_ENGINE_PANIC_ONCE)");
        }
    }
}

/// The engine of whichever family a checkpoint belongs to.
pub enum Engine {
    Diffusion(Box<MlxEngine>),
    Causal(Box<CausalEngine>),
    Encoder(Box<EncoderEngine>),
}

/// Why no engine could be loaded.
#[derive(Debug, thiserror::Error)]
pub enum AnyEngineError {
    #[error(transparent)]
    Diffusion(#[from] EngineError),
    #[error(transparent)]
    Causal(#[from] CausalEngineError),
    #[error(transparent)]
    Encoder(#[from] EncoderEngineError),
}

/// Loads `path` with the family its content names: a GGUF of llama.cpp's `modern-bert` is an
/// encoder (a laya decision model); another GGUF file, or a folder whose `config.json` names a
/// chat architecture, is a chat model; any other folder is read as DiffusionGemma (whose
/// loader says what is wrong with it if it is not one).
pub fn load_engine(
    path: &std::path::Path,
    diffusion: &EngineOptions,
    causal: &CausalEngineOptions,
) -> Result<Engine, AnyEngineError> {
    if encoder::is_encoder(path) {
        Ok(Engine::Encoder(Box::new(EncoderEngine::load(
            path, causal,
        )?)))
    } else if crate::checkpoint::causal::CausalFormat::detect(path).is_some() {
        Ok(Engine::Causal(Box::new(CausalEngine::load(path, causal)?)))
    } else {
        Ok(Engine::Diffusion(Box::new(MlxEngine::load(
            path, diffusion,
        )?)))
    }
}

impl crate::server::ReadEngine for Engine {
    fn submit(&mut self, request: hunch_core::ReadRequest, reply: crate::scheduler::Reply) {
        match self {
            Engine::Diffusion(e) => e.submit(request, reply),
            Engine::Causal(e) => e.submit(request, reply),
            Engine::Encoder(e) => e.submit(request, reply),
        }
    }

    fn has_room(&self) -> bool {
        match self {
            Engine::Diffusion(e) => e.has_room(),
            Engine::Causal(e) => e.has_room(),
            Engine::Encoder(e) => e.has_room(),
        }
    }

    fn set_queued(&mut self, queued: usize) {
        match self {
            Engine::Diffusion(e) => e.set_queued(queued),
            Engine::Causal(e) => e.set_queued(queued),
            Engine::Encoder(e) => e.set_queued(queued),
        }
    }

    fn step(&mut self) -> crate::scheduler::StepOutcome {
        match self {
            Engine::Diffusion(e) => e.step(),
            Engine::Causal(e) => e.step(),
            Engine::Encoder(e) => e.step(),
        }
    }

    fn info(&self) -> Option<hunch_core::protocol::ModelInfo> {
        match self {
            Engine::Diffusion(e) => e.info(),
            Engine::Causal(e) => e.info(),
            Engine::Encoder(e) => e.info(),
        }
    }
}
