//! What a loaded model tells its host in `/health` (docs/accelerator-protocol.md): its limits, so
//! the host refuses a read that can never fit before sending it, and a fingerprint of everything
//! an answer depends on besides the request, so the host can cache isolated answers safely.

use crate::tokenizer::Tokenizer;
use hunch_core::protocol::ModelInfo;
use hunch_core::{QuestionLimits, ReaderLimits, READ_ALGORITHM_VERSION};
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// The MLX backend and version this binary was built against (set by `build.rs`).
pub fn build_backend() -> String {
    format!(
        "mlx-{}-{}",
        option_env!("HUNCH_BUILT_MLX_VERSION").unwrap_or("unknown"),
        option_env!("HUNCH_BUILT_MLX_BACKEND").unwrap_or("unknown"),
    )
}

/// The settings besides the checkpoint that decide an answer.
#[derive(Debug, Clone)]
pub struct AnswerSettings {
    /// The activation dtype the model was loaded with (`auto` already resolved for the device).
    pub dtype: String,
    pub canvas_cap: usize,
    pub max_prompt_tokens: usize,
    pub rereads: bool,
}

/// Builds the model's info: the limits its planner enforces and its fingerprint: the
/// checkpoint's digest, the MLX build, the BLAS serving this process (chosen at start-up, not at
/// build time: the sums of a matmul differ between BLAS libraries), the dtype, the read
/// algorithm's version ([`READ_ALGORITHM_VERSION`], owned by `hunch-core`) and the read
/// settings. The one identity of the model: the host's events, answer cache and `/v1/models`
/// all use it.
pub fn model_info(
    dir: &Path,
    tokenizer: &Tokenizer,
    questions: QuestionLimits,
    settings: &AnswerSettings,
) -> ModelInfo {
    // Diffusion reads are versioned by READ_ALGORITHM_VERSION, already in the fingerprint.
    let kind = crate::checkpoint::stored::diffusion_kind(dir, "diffusion");
    let checkpoint = checkpoint_digest(dir);
    let fingerprint = format!(
        "{:016x}/{}-{}/{}/{}/canvas{}/prompt{}/rereads-{}",
        checkpoint,
        build_backend(),
        crate::blas::active().name(),
        settings.dtype,
        READ_ALGORITHM_VERSION,
        settings.canvas_cap,
        settings.max_prompt_tokens,
        settings.rereads
    );
    ModelInfo {
        fingerprint,
        limits: ReaderLimits {
            questions,
            max_prompt_tokens: Some(settings.max_prompt_tokens as u64),
            max_token_bytes: max_token_bytes(tokenizer),
            // The server fills in its body limit.
            max_request_bytes: None,
            reads_question_ids: false,
        },
        blas_libraries: crate::blas::mapped_libraries(),
        kind: Some(kind),
    }
}

/// 64-bit FNV-1a: stable across builds and platforms (the fingerprint is compared between
/// processes), and plenty to tell checkpoints apart.
#[derive(Debug, Clone, Copy)]
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// Bytes hashed at each end of a file: a safetensors header (names, shapes, dtypes, offsets)
/// and samples of its first and last tensors tell two checkpoints apart without reading
/// gigabytes at startup.
const SAMPLE_BYTES: u64 = 256 * 1024;

/// Digest of a checkpoint directory: every file's name, size and modification time, and the
/// first and last [`SAMPLE_BYTES`] of each. Files that cannot be read still count by name.
pub fn checkpoint_digest(dir: &Path) -> u64 {
    let mut hash = Fnv::new();
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
                .map(|e| e.file_name())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    for name in names {
        hash.write(name.as_encoded_bytes());
        hash.write(&[0]);
        hash_file(&mut hash, &dir.join(&name));
    }
    hash.0
}

/// [`checkpoint_digest`] of a directory, or of one file (a GGUF): its name and the same
/// size, time and samples.
pub fn file_or_dir_digest(path: &Path) -> u64 {
    if !path.is_file() {
        return checkpoint_digest(path);
    }
    let mut hash = Fnv::new();
    if let Some(name) = path.file_name() {
        hash.write(name.as_encoded_bytes());
        hash.write(&[0]);
    }
    hash_file(&mut hash, path);
    hash.0
}

/// A file's size, modification time and first and last [`SAMPLE_BYTES`] into `hash` (nothing
/// when it cannot be opened).
fn hash_file(hash: &mut Fnv, path: &Path) {
    let Ok(mut file) = std::fs::File::open(path) else {
        return;
    };
    let meta = file.metadata().ok();
    let size = meta.as_ref().map_or(0, |m| m.len());
    hash.write(&size.to_le_bytes());
    if let Some(modified) = meta
        .and_then(|m| m.modified().ok())
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
    {
        hash.write(&modified.as_nanos().to_le_bytes());
    }
    let mut sample = Vec::new();
    let _ = (&mut file).take(SAMPLE_BYTES).read_to_end(&mut sample);
    if size > SAMPLE_BYTES && file.seek(SeekFrom::Start(size - SAMPLE_BYTES)).is_ok() {
        let _ = (&mut file).take(SAMPLE_BYTES).read_to_end(&mut sample);
    }
    hash.write(&sample);
}

/// Normalizers that map each character to one or more characters (a `Replace` only when its
/// pattern is a string no longer than its replacement): with only these, a token covers at most
/// 4 input bytes (one UTF-8 character) per character of its text.
const NON_SHRINKING_NORMALIZERS: &[&str] = &["Replace", "Prepend", "Sequence", "NFD", "NFKD"];

/// An upper bound on the input bytes one token can cover, or `None` when the tokenizer's
/// normalizer might drop characters (then no bound exists).
pub fn max_token_bytes(tokenizer: &Tokenizer) -> Option<u64> {
    let inner = tokenizer.inner();
    if let Some(normalizer) = inner.get_normalizer() {
        let json = serde_json::to_value(normalizer).ok()?;
        if !only_types(&json, NON_SHRINKING_NORMALIZERS) {
            return None;
        }
    }
    let longest = inner
        .get_vocab(true)
        .keys()
        .map(|t| t.chars().count())
        .max()?;
    Some(4 * longest.max(1) as u64)
}

/// Whether every `"type"` in a normalizer's JSON is one of `allowed`.
fn only_types(value: &serde_json::Value, allowed: &[&str]) -> bool {
    match value {
        serde_json::Value::Object(map) => {
            if map.get("type").and_then(|t| t.as_str()) == Some("Replace") {
                let pattern = map
                    .get("pattern")
                    .and_then(|p| p.get("String"))
                    .and_then(|p| p.as_str());
                let content = map.get("content").and_then(|c| c.as_str()).unwrap_or("");
                if pattern.is_none_or(|p| p.chars().count() > content.chars().count()) {
                    return false;
                }
            }
            map.iter().all(|(k, v)| {
                if k == "type" {
                    v.as_str().is_some_and(|t| allowed.contains(&t))
                } else {
                    only_types(v, allowed)
                }
            })
        }
        serde_json::Value::Array(items) => items.iter().all(|v| only_types(v, allowed)),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_changes_with_any_file_and_not_without() {
        let dir = std::env::temp_dir().join(format!("hunch-digest-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("a.safetensors"), vec![1u8; 600 * 1024]).unwrap();
        std::fs::write(dir.join("config.json"), "{}").unwrap();
        let first = checkpoint_digest(&dir);
        assert_eq!(first, checkpoint_digest(&dir));
        let mut tail = vec![1u8; 600 * 1024];
        *tail.last_mut().unwrap() = 2;
        std::fs::write(dir.join("a.safetensors"), tail).unwrap();
        assert_ne!(first, checkpoint_digest(&dir));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_info_reports_the_blas_libraries_this_process_has_mapped() {
        use crate::tools::random::{Preset, RandomSpec};
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path();
        let spec = RandomSpec::new(Preset::Tiny, crate::checkpoint::Layout::Hf);
        crate::tools::writer::write_random_checkpoint(dir, &spec).expect("a random checkpoint");
        let tokenizer = Tokenizer::from_dir(dir).expect("its tokenizer");
        let settings = AnswerSettings {
            dtype: "float32".into(),
            canvas_cap: 64,
            max_prompt_tokens: 1024,
            rereads: false,
        };
        let info = model_info(dir, &tokenizer, QuestionLimits::default(), &settings);
        assert_eq!(info.blas_libraries, crate::blas::mapped_libraries());
        if cfg!(target_os = "linux") {
            // MLX, linked into this test, brings the BLAS it bundles.
            assert!(!info.blas_libraries.is_empty());
        }
        // Not part of the identity: the fingerprint names the BLAS chosen, not the files.
        assert!(!info.fingerprint.contains(".so"), "{}", info.fingerprint);
    }

    #[test]
    fn normalizers_that_may_drop_characters_give_no_bound() {
        let ok = serde_json::json!({"type": "Sequence", "normalizers": [
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]});
        assert!(only_types(&ok, NON_SHRINKING_NORMALIZERS));
        let drop =
            serde_json::json!({"type": "Replace", "pattern": {"String": "ab"}, "content": ""});
        assert!(!only_types(&drop, NON_SHRINKING_NORMALIZERS));
        let strip = serde_json::json!({"type": "Sequence", "normalizers": [{"type": "Strip"}]});
        assert!(!only_types(&strip, NON_SHRINKING_NORMALIZERS));
    }
}
