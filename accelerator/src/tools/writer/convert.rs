//! Converting a dense (HF) checkpoint on disk into any layout, quantising in Rust.

use std::path::Path;

use serde_json::Value;

use super::{write_layout, WriteError, WriteOptions, WriteSummary};
use crate::checkpoint::dims::{ModelDims, TensorSpec};
use crate::checkpoint::files::weight_files;
use crate::checkpoint::format::{affine_block, Layout};
use crate::checkpoint::layout::read_json;
use crate::checkpoint::tensors::TensorSet;
use crate::checkpoint::FileError;
use crate::tools::random::DenseDtype;

/// Files beside the weights that a converted checkpoint keeps.
const CARRIED_FILES: [&str; 5] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
];

/// Convert an HF checkpoint at `src` into `layout` at `dst`, quantising in Rust.
pub fn convert(src: &Path, dst: &Path, layout: Layout) -> Result<WriteSummary, WriteError> {
    convert_with(src, dst, layout, DenseDtype::Bf16, 5000 << 20)
}

/// [`convert`] with the dense dtype and shard size chosen.
pub fn convert_with(
    src: &Path,
    dst: &Path,
    layout: Layout,
    dense: DenseDtype,
    max_shard_bytes: u64,
) -> Result<WriteSummary, WriteError> {
    let source_err = |why: String| WriteError::Source {
        src: src.to_path_buf(),
        why,
    };
    let cfg_path = src.join("config.json");
    let config = read_json(&cfg_path)?;
    let dims = ModelDims::from_config(&config)?;
    let files = weight_files(src).map_err(|e| source_err(e.to_string()))?;
    let set = TensorSet::open(&files.files)?;
    // The source must hold dense weights: judged from its tensors, like the loader does.
    let quantised = affine_block(&config).is_some() || set.names().any(|n| n.ends_with(".scales"));
    if quantised {
        return Err(source_err(
            "is already quantised; convert from an HF (dense) checkpoint".into(),
        ));
    }
    let source = |t: &TensorSpec| -> Result<Vec<f32>, WriteError> {
        let view = set
            .get(&t.name)
            .ok_or_else(|| source_err(format!("tensor {} is missing", t.name)))?;
        if view.shape != t.shape.as_slice() {
            return Err(source_err(format!(
                "tensor {} has shape {:?}, config.json implies {:?}",
                t.name, view.shape, t.shape
            )));
        }
        Ok(view.to_f32()?)
    };
    let gen_path = src.join("generation_config.json");
    let gen: Option<Value> = std::fs::read_to_string(&gen_path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    let mut summary = write_layout(
        dst,
        &dims,
        &config,
        gen.as_ref(),
        WriteOptions {
            layout,
            dense,
            max_shard_bytes,
        },
        &source,
    )?;
    for f in CARRIED_FILES {
        let from = src.join(f);
        if from.is_file() {
            std::fs::copy(&from, dst.join(f)).map_err(FileError::io(&from))?;
            summary.files.push(f.to_string());
        }
    }
    Ok(summary)
}
