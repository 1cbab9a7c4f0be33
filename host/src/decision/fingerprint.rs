//! What exactly a served model is, for decision events: a checkpoint is its config, its tensor
//! index (every tensor's name, dtype, shape and offsets), the activation dtype and the MLX
//! backend; a remote model is its URL and name. Computed once at startup.

use crate::config::Source;
use crate::decision::event::sha256_hex;
use serde_json::{json, Value};
use std::io::Read;
use std::path::Path;

/// The largest safetensors header read (the index of one file).
const MAX_HEADER_BYTES: u64 = 64 << 20;

/// The MLX backend the workspace was built for (the same variable selects it for the
/// accelerator's build).
fn backend() -> &'static str {
    match option_env!("HUNCH_MLX_BACKEND") {
        Some(b) if !b.is_empty() => b,
        _ if cfg!(target_os = "macos") => "metal",
        _ => "cpu",
    }
}

/// The activation dtype the sidecars are started with (`--dtype X` or `--dtype=X` among the
/// sidecar arguments; the accelerator's default otherwise).
fn dtype(sidecar_args: &[String]) -> String {
    let mut it = sidecar_args.iter();
    while let Some(a) = it.next() {
        if let Some(v) = a.strip_prefix("--dtype=") {
            return v.to_string();
        }
        if a == "--dtype" {
            if let Some(v) = it.next() {
                return v.clone();
            }
        }
    }
    "float32".to_string()
}

pub fn fingerprint(source: &Source, sidecar_args: &[String]) -> Value {
    match source {
        Source::Sidecar { dir } => json!({
            "kind": "checkpoint",
            "dir": dir.display().to_string(),
            "config_sha256": std::fs::read(dir.join("config.json")).ok().map(|b| sha256_hex(&b)),
            "tensor_index_sha256": tensor_index_hash(dir),
            "dtype": dtype(sidecar_args),
            "backend": backend(),
        }),
        Source::Accelerator { url } => json!({"kind": "accelerator", "url": url}),
        Source::Upstream {
            url, remote_model, ..
        } => json!({"kind": "upstream", "url": url, "model": remote_model}),
    }
}

/// sha256 over the safetensors headers of the checkpoint's files, in file-name order.
fn tensor_index_hash(dir: &Path) -> Option<String> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return None;
    }
    let mut all = Vec::new();
    for f in files {
        all.extend_from_slice(f.file_name()?.to_string_lossy().as_bytes());
        all.push(0);
        all.extend_from_slice(&safetensors_header(&f)?);
    }
    Some(sha256_hex(&all))
}

fn safetensors_header(path: &Path) -> Option<Vec<u8>> {
    let mut file = std::fs::File::open(path).ok()?;
    let mut len = [0u8; 8];
    file.read_exact(&mut len).ok()?;
    let n = u64::from_le_bytes(len);
    if n > MAX_HEADER_BYTES {
        return None;
    }
    let mut header = vec![0u8; n as usize];
    file.read_exact(&mut header).ok()?;
    Some(header)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_is_its_config_tensor_index_dtype_and_backend() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), b"{}").unwrap();
        let mut st = 2u64.to_le_bytes().to_vec();
        st.extend_from_slice(b"{}");
        std::fs::write(dir.path().join("model.safetensors"), &st).unwrap();
        let source = Source::Sidecar {
            dir: dir.path().to_path_buf(),
        };
        let f = fingerprint(&source, &["--dtype=bfloat16".into()]);
        assert_eq!(f["config_sha256"], sha256_hex(b"{}"));
        assert!(f["tensor_index_sha256"].is_string());
        assert_eq!(f["dtype"], "bfloat16");
        assert_eq!(fingerprint(&source, &[])["dtype"], "float32");
        let up = Source::Upstream {
            url: "http://u".into(),
            remote_model: "m".into(),
            key: Some("secret".into()),
        };
        assert_eq!(
            fingerprint(&up, &[]),
            json!({"kind": "upstream", "url": "http://u", "model": "m"})
        );
    }
}
