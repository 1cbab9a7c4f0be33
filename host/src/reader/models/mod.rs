//! Many models under one memory budget (docs/models.md): the parts that decide, each pure and
//! tested on its own.
//!
//! - [`budget`]: the default budget, what the machine has less a reserve.
//! - [`discovery`]: the checkpoints under the `--models-dir` roots, sized before loading.
//! - [`eviction`]: which idle models to unload, before a load, so that the new one fits.
//! - [`load_eta`]: the seconds a load has left, from its progress or the pace of earlier loads.
//! - [`resident`]: a sidecar process's measured resident bytes.
//! - [`settings`]: per-model settings, `hunch-models.toml` at a models directory's root.

pub mod budget;
pub mod discovery;
pub mod eviction;
pub mod load_eta;
pub mod resident;
pub mod settings;
