//! Tools that write checkpoints: random checkpoints of any size ([`random`], [`writer`]),
//! conversion of HF checkpoints to the quantised layouts ([`writer::convert`]), the quantisers
//! ([`quant`]) and the demo checkpoint ([`demo`]). The serving code (the loader in
//! [`crate::checkpoint`], the engine, the server) never uses them; they share the on-disk
//! conventions with the loader through [`crate::checkpoint::format`].

pub mod bench;
pub mod demo;
pub mod quant;
pub mod random;
pub mod writer;

#[cfg(test)]
mod layout_tests;
#[cfg(test)]
mod path_tests;

pub use random::{DenseDtype, Preset, RandomSpec};
pub use writer::{convert, write_random_checkpoint};

/// The default model's GGUF (SmolLM2-135M-Instruct Q4_1) for the tests that read a real model:
/// `HUNCH_SMOLLM2_GGUF`, else the file in the models cache (`HUNCH_MODELS_CACHE`, else
/// `~/.cache/hunch/models`). A missing file fails the calling test, unless `HUNCH_TEST_SKIP`
/// lists `smollm2` (then `None`: skipped on purpose, never by accident).
pub fn smollm2_for_tests() -> Option<std::path::PathBuf> {
    use std::path::PathBuf;
    let path = std::env::var_os("HUNCH_SMOLLM2_GGUF")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HUNCH_MODELS_CACHE")
                .map(PathBuf::from)
                .or_else(|| {
                    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/hunch/models"))
                })
                .map(|c| c.join("SmolLM2-135M-Instruct.Q4_1.gguf"))
        })?;
    if path.is_file() {
        return Some(path);
    }
    let skip = std::env::var("HUNCH_TEST_SKIP").unwrap_or_default();
    assert!(
        skip.split(',').any(|s| s.trim() == "smollm2"),
        "{} is missing: run scripts/fetch-default-model.sh (or set HUNCH_TEST_SKIP=smollm2 to \
         skip the tests that need it on purpose)",
        path.display()
    );
    None
}
