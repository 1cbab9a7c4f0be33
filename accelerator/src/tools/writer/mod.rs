//! Writers of the three checkpoint layouts, from any source of f32 tensor values: the random
//! generator ([`write_random_checkpoint`]) or an HF checkpoint on disk ([`convert`]).
//!
//! Layouts (docs/checkpoint-layouts.md):
//! - [`Layout::Hf`]: `save_pretrained`'s names, dense bf16/f32, `model.safetensors` or shards +
//!   `model.safetensors.index.json`.
//! - [`Layout::Nvfp4`]: super-decider's: stacked, gate/up-fused experts in NVFP4
//!   (`experts.{gate_up,down}_proj.{weight,scales,global_scale}`), everything else bf16, no
//!   vision tower, shards + `manifest.json`.
//! - [`Layout::Affine`]: mlx-community's: MLX affine group 64, experts 4-bit, embedding /
//!   attention / dense MLPs / router 8-bit, `quantization` in config.json.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

mod convert;
mod encode;
mod stream;

pub use convert::{convert, convert_with};
pub use stream::{bf16_bytes, f32_bytes, u32_bytes, SafetensorsWriter};

use super::quant::QuantError;
use super::random::{self, DenseDtype, RandomError, RandomSpec};
use crate::checkpoint::dims::{DimsError, ModelDims, TensorSpec};
use crate::checkpoint::format::{
    affine_quantization_config, storage_for, stored_tensors, Layout, Storage, UnknownLayout,
    MANIFEST, NVFP4_GROUP,
};
use crate::checkpoint::tensors::{Dtype, PlannedTensor, TensorError};
use crate::checkpoint::FileError;
use crate::tokenizer::tiny::{self, TinyTokenizerError};
use encode::{batches, encode};

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error(transparent)]
    UnknownLayout(#[from] UnknownLayout),
    #[error(transparent)]
    Tensor(#[from] TensorError),
    #[error(transparent)]
    Dims(#[from] DimsError),
    #[error(transparent)]
    Random(#[from] RandomError),
    #[error(transparent)]
    Tokenizer(#[from] TinyTokenizerError),
    #[error("tensor {name}: {source}")]
    Quant { name: String, source: QuantError },
    #[error(transparent)]
    File(#[from] FileError),
    #[error("converting {src}: {why}")]
    Source { src: PathBuf, why: String },
}

fn float_dtype(d: DenseDtype) -> Dtype {
    match d {
        DenseDtype::Bf16 => Dtype::BF16,
        DenseDtype::F32 => Dtype::F32,
    }
}

/// Result of a write.
#[derive(Debug, Clone)]
pub struct WriteSummary {
    pub dir: PathBuf,
    pub layout: Layout,
    pub files: Vec<String>,
    pub tensors: usize,
    pub bytes: u64,
}

fn write_json(path: &Path, v: &Value) -> Result<(), WriteError> {
    let text = serde_json::to_string_pretty(v).map_err(|e| FileError::json(path, e))?;
    Ok(std::fs::write(path, text + "\n").map_err(FileError::io(path))?)
}

/// Layout, dense dtype and shard size of a write.
#[derive(Debug, Clone, Copy)]
pub struct WriteOptions {
    pub layout: Layout,
    pub dense: DenseDtype,
    pub max_shard_bytes: u64,
}

/// Write every tensor of `dims` in `opts.layout` under `out`, taking values from `source`
/// (which returns f32 values; they are rounded to `dense` before storing or quantising).
pub fn write_layout(
    out: &Path,
    dims: &ModelDims,
    config: &Value,
    generation_config: Option<&Value>,
    opts: WriteOptions,
    source: &(dyn Fn(&TensorSpec) -> Result<Vec<f32>, WriteError> + Sync),
) -> Result<WriteSummary, WriteError> {
    let WriteOptions {
        layout,
        dense,
        max_shard_bytes,
    } = opts;
    std::fs::create_dir_all(out).map_err(FileError::io(out))?;
    let dense_t = match layout {
        // "everything else BF16" in the super-decider layout
        Layout::Nvfp4 => Dtype::BF16,
        _ => float_dtype(dense),
    };
    let specs = dims.tensors();
    let planned: Vec<(Storage, Vec<PlannedTensor>)> = specs
        .iter()
        .map(|s| {
            let st = storage_for(s, layout);
            (st, stored_tensors(s, layout, st, dense_t))
        })
        .collect();
    // Greedy sharding in inventory order; one entry's outputs stay in one file.
    let mut shards: Vec<Vec<usize>> = vec![Vec::new()];
    let mut cur = 0u64;
    for (i, (_, outs)) in planned.iter().enumerate() {
        let b: u64 = outs.iter().map(|t| t.nbytes() as u64).sum();
        if cur > 0 && cur + b > max_shard_bytes {
            shards.push(Vec::new());
            cur = 0;
        }
        cur += b;
        if let Some(last) = shards.last_mut() {
            last.push(i);
        }
    }
    let n = shards.len();
    let file_name = |k: usize| {
        if n == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{n:05}.safetensors", k + 1)
        }
    };
    let mut weight_map = Map::new();
    let mut manifest_tensors = Map::new();
    let mut shard_info = Vec::new();
    let mut total = 0u64;
    let mut count = 0usize;
    let mut meta = BTreeMap::new();
    meta.insert(
        "format".to_string(),
        if layout == Layout::Hf { "pt" } else { "mlx" }.to_string(),
    );
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(8);
    let produce = |i: usize| -> Result<Vec<Vec<u8>>, WriteError> {
        let spec = &specs[i];
        let mut values = source(spec)?;
        if values.len() != spec.numel() {
            return Err(WriteError::Source {
                src: out.to_path_buf(),
                why: format!(
                    "{} has {} values, expected {:?}",
                    spec.name,
                    values.len(),
                    spec.shape
                ),
            });
        }
        if dense_t == Dtype::BF16 {
            // Quantise what a bf16 checkpoint holds, so random nvfp4/affine = convert(random hf).
            hunch_codec::bytes::round_through_bf16(&mut values);
        }
        encode(spec, &values, planned[i].0, dense_t)
    };
    for (k, members) in shards.iter().enumerate() {
        let fname = file_name(k);
        let path = out.join(&fname);
        let plan: Vec<PlannedTensor> = members
            .iter()
            .flat_map(|&i| planned[i].1.iter().cloned())
            .collect();
        let mut bytes = 0u64;
        for t in &plan {
            weight_map.insert(t.name.clone(), json!(fname));
            manifest_tensors.insert(
                t.name.clone(),
                json!({"shard": fname, "dtype": t.dtype.name(), "shape": t.shape}),
            );
            bytes += t.nbytes() as u64;
        }
        let n_tensors = plan.len();
        let mut w = SafetensorsWriter::create(&path, plan, &meta)?;
        // Values are produced and encoded on several threads, a bounded batch at a time, and
        // written in plan order; the output does not depend on the thread count.
        for batch in batches(members, &specs, threads) {
            let results: Vec<Result<Vec<Vec<u8>>, WriteError>> = std::thread::scope(|sc| {
                let handles: Vec<_> = batch
                    .iter()
                    .map(|&i| sc.spawn(move || produce(i)))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join().unwrap_or_else(|_| {
                            Err(WriteError::Source {
                                src: out.to_path_buf(),
                                why: "a tensor worker panicked".into(),
                            })
                        })
                    })
                    .collect()
            });
            for (&i, r) in batch.iter().zip(results) {
                for (t, b) in planned[i].1.iter().zip(r?) {
                    w.write(&t.name, &b)?;
                }
            }
        }
        w.finish()?;
        shard_info.push(json!({"file": fname, "bytes": bytes, "tensors": n_tensors}));
        total += bytes;
        count += n_tensors;
    }
    let mut files: Vec<String> = (0..n).map(file_name).collect();

    let mut config = config.clone();
    if let Value::Object(m) = &mut config {
        // config.json names the dtype the dense tensors are stored in
        let name = if dense_t == Dtype::F32 {
            "float32"
        } else {
            "bfloat16"
        };
        m.insert("dtype".into(), json!(name));
        match layout {
            Layout::Hf => {}
            Layout::Nvfp4 => {
                // text-only: the vision tower is removed
                m.remove("vision_config");
            }
            Layout::Affine => {
                m.remove("vision_config");
                let q = affine_quantization_config(&specs);
                m.insert("quantization".into(), q.clone());
                m.insert("quantization_config".into(), q);
            }
        }
    }
    write_json(&out.join("config.json"), &config)?;
    files.push("config.json".into());
    if let Some(g) = generation_config {
        write_json(&out.join("generation_config.json"), g)?;
        files.push("generation_config.json".into());
    }
    // HF writes an index only when sharded; mlx_lm's save always writes one.
    if (layout == Layout::Hf && n > 1) || layout == Layout::Affine {
        let idx = json!({"metadata": {"total_size": total}, "weight_map": weight_map});
        write_json(&out.join("model.safetensors.index.json"), &idx)?;
        files.push("model.safetensors.index.json".into());
    }
    if layout == Layout::Nvfp4 {
        let manifest = json!({
                        "dense_dtype": "bfloat16",
            "quantization": {"experts": {
                "mode": "nvfp4", "group_size": NVFP4_GROUP, "bits": 4,
                "weight": "uint32, 8 E2M1 codes per word, low nibble first",
                "scales": "uint8 E4M3, one per 16 inputs",
                "global_scale": "float32 [experts], absmax convention: w = e2m1 * e4m3 * global_scale / 2688"
            }},
            "total_size": total,
            "shards": shard_info,
            "weight_map": weight_map,
            "tensors": manifest_tensors,
        });
        write_json(&out.join(MANIFEST), &manifest)?;
        files.push(MANIFEST.into());
    }
    Ok(WriteSummary {
        dir: out.to_path_buf(),
        layout,
        files,
        tensors: count,
        bytes: total,
    })
}

/// Write a random checkpoint (and, unless disabled, a tiny `tokenizer.json`) to `out_dir`.
pub fn write_random_checkpoint(
    out_dir: &Path,
    spec: &RandomSpec,
) -> Result<WriteSummary, WriteError> {
    let (config, gen) = random::build_config(spec.preset, &spec.overrides)?;
    let dims = ModelDims::from_config(&config)?;
    let seed = spec.seed;
    let source = |t: &TensorSpec| Ok(random::generate(t, seed));
    let mut summary = write_layout(
        out_dir,
        &dims,
        &config,
        Some(&gen),
        WriteOptions {
            layout: spec.layout,
            dense: spec.dtype,
            max_shard_bytes: spec.max_shard_bytes,
        },
        &source,
    )?;
    if spec.tokenizer {
        tiny::write_tiny_tokenizer(&out_dir.join("tokenizer.json"), dims.vocab)?;
        summary.files.push("tokenizer.json".into());
    }
    Ok(summary)
}
