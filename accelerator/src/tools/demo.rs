//! The demo checkpoint: a small random DiffusionGemma the sidecar serves when no model is given
//! (`hunch-accelerator demo` writes it; `scripts/serve.sh` runs that). Its answers carry no
//! meaning.

use std::path::{Path, PathBuf};

use super::random::{Preset, RandomSpec};
use super::writer::write_random_checkpoint;
use crate::checkpoint::Layout;

/// The demo checkpoint could not be written.
#[derive(Debug, thiserror::Error)]
#[error("writing the demo checkpoint to {dir}: {message}")]
pub struct DemoError {
    /// Where it was being written.
    pub dir: PathBuf,
    /// What failed.
    pub message: String,
}

/// Version of the demo checkpoint: bump it when its recipe changes so old caches are not reused.
pub const DEMO_VERSION: &str = "demo-v1";

/// Where the demo checkpoint is cached: `$HUNCH_CACHE_DIR`, else `$XDG_CACHE_HOME/hunch`, else
/// `~/.cache/hunch`, else the system temp dir.
pub fn demo_dir() -> PathBuf {
    let base = std::env::var_os("HUNCH_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("hunch")))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/hunch")))
        .unwrap_or_else(|| std::env::temp_dir().join("hunch"));
    base.join(DEMO_VERSION)
}

/// Writes the demo checkpoint (a small random DiffusionGemma in the HF layout with a tiny
/// tokenizer, deterministic from a fixed seed) unless a complete one is already cached.
/// Returns its directory. Its answers carry no meaning.
pub fn ensure_demo_checkpoint(dir: &Path) -> Result<PathBuf, DemoError> {
    let done = dir.join(".complete");
    if done.exists() {
        return Ok(dir.to_path_buf());
    }
    let fail = |message: String| DemoError {
        dir: dir.to_path_buf(),
        message,
    };
    // Write into a sibling temp dir and rename, so a crash never leaves a half checkpoint that
    // looks complete.
    let parent = dir.parent().unwrap_or(dir);
    std::fs::create_dir_all(parent).map_err(|e| fail(e.to_string()))?;
    let staging = parent.join(format!(".{}-staging-{}", DEMO_VERSION, std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    let mut spec = RandomSpec::new(Preset::Tiny, Layout::Hf);
    spec.seed = 20_261_129;
    // Wide enough for the reference canvas of 64 and a real-looking prompt.
    for kv in ["vocab_size=4096", "top.canvas_length=64"] {
        spec.set(kv).map_err(|e| fail(e.to_string()))?;
    }
    write_random_checkpoint(&staging, &spec).map_err(|e| fail(e.to_string()))?;
    std::fs::write(staging.join(".complete"), DEMO_VERSION).map_err(|e| fail(e.to_string()))?;
    let _ = std::fs::remove_dir_all(dir);
    std::fs::rename(&staging, dir).map_err(|e| fail(e.to_string()))?;
    Ok(dir.to_path_buf())
}
