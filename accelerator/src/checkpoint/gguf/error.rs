//! What can go wrong reading a GGUF file; every message names the file.

use std::path::PathBuf;

use super::types::GgmlType;

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The header (magic, version, counts, metadata, tensor infos) does not parse; `offset` is
    /// where in the file the reader was.
    #[error("{path}: not a readable GGUF file: {why} (at byte {offset})")]
    Format {
        path: PathBuf,
        offset: u64,
        why: String,
    },
    #[error("{path}: tensor {name} ({ggml_type}, at data offset {offset}): {why}")]
    Tensor {
        path: PathBuf,
        name: String,
        ggml_type: GgmlType,
        offset: u64,
        why: String,
    },
    #[error(
        "{path}: tensor {name} is stored as {ggml_type}, which this reader cannot load \
         (it loads F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K, and \
         Q2_K, Q3_K, Q8_1 and Q8_K dequantised to float); re-quantise the model to one of \
         those, e.g. Q4_K_M or Q8_0"
    )]
    Unsupported {
        path: PathBuf,
        name: String,
        ggml_type: GgmlType,
    },
    #[error("{path}: no tensor named {name}")]
    Missing { path: PathBuf, name: String },
    #[error("{path}: metadata {key}: {why}")]
    Metadata {
        path: PathBuf,
        key: String,
        why: String,
    },
}
