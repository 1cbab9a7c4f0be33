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

use super::dims::{DimsError, ModelDims, Role, TensorSpec};
use super::quant::{self, QuantError, SourceDtype};
use super::random::{self, DenseDtype, RandomError, RandomSpec};
use super::tensors::{self, Dtype, PlannedTensor, SafetensorsWriter, TensorError, TensorSet};
use crate::tokenizer::tiny::{self, TinyTokenizerError};

/// The three on-disk layouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layout {
    Hf,
    Nvfp4,
    Affine,
}

impl std::str::FromStr for Layout {
    type Err = WriteError;
    fn from_str(s: &str) -> Result<Self, WriteError> {
        Ok(match s {
            "hf" => Layout::Hf,
            "nvfp4" => Layout::Nvfp4,
            "affine" => Layout::Affine,
            _ => return Err(WriteError::UnknownLayout(s.to_string())),
        })
    }
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Layout::Hf => "hf",
            Layout::Nvfp4 => "nvfp4",
            Layout::Affine => "affine",
        })
    }
}

/// Group size of the mlx-community layout.
pub const AFFINE_GROUP: usize = 64;
/// Bits of the mlx-community layout's experts (the config default) and of its other linears.
pub const AFFINE_EXPERT_BITS: u32 = 4;
pub const AFFINE_DENSE_BITS: u32 = 8;
/// Name of the NVFP4 layout's manifest.
pub const MANIFEST: &str = "manifest.json";
/// `format` value of that manifest.
pub const MANIFEST_FORMAT: &str = "hunch.nvfp4-experts";

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("unknown layout {0:?} (hf, nvfp4, affine)")]
    UnknownLayout(String),
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
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {why}")]
    Json { path: PathBuf, why: String },
    #[error("converting {src}: {why}")]
    Source { src: PathBuf, why: String },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> WriteError + '_ {
    move |source| WriteError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// How one tensor of the inventory is stored in a layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storage {
    Dense,
    Nvfp4,
    Affine { group_size: usize, bits: u32 },
}

/// The storage a writer chooses. Like mlx_lm's default predicate, a weight whose input dimension
/// is not a multiple of the group size stays dense (and the affine config says so with `false`).
pub fn storage_for(spec: &TensorSpec, layout: Layout) -> Storage {
    let cols = spec.shape.last().copied().unwrap_or(0);
    match (layout, spec.role) {
        (Layout::Nvfp4, Role::Experts) if cols % quant::NVFP4_GROUP == 0 => Storage::Nvfp4,
        (Layout::Affine, Role::Experts) if cols % AFFINE_GROUP == 0 => Storage::Affine {
            group_size: AFFINE_GROUP,
            bits: AFFINE_EXPERT_BITS,
        },
        (Layout::Affine, Role::Embedding | Role::Linear) if cols % AFFINE_GROUP == 0 => {
            Storage::Affine {
                group_size: AFFINE_GROUP,
                bits: AFFINE_DENSE_BITS,
            }
        }
        _ => Storage::Dense,
    }
}

/// Name of the stored (dense or packed) weight: MLX layouts give the stacked experts, which HF
/// stores as bare parameters, a `.weight` suffix (mlx_vlm's `sanitize` renames them so).
pub fn weight_name(spec: &TensorSpec, layout: Layout) -> String {
    if layout != Layout::Hf && spec.role == Role::Experts {
        format!("{}.weight", spec.name)
    } else {
        spec.name.clone()
    }
}

fn float_dtype(d: DenseDtype) -> Dtype {
    match d {
        DenseDtype::Bf16 => Dtype::BF16,
        DenseDtype::F32 => Dtype::F32,
    }
}

/// Tensors written for one inventory entry.
pub fn outputs(
    spec: &TensorSpec,
    layout: Layout,
    storage: Storage,
    dense: Dtype,
) -> Vec<PlannedTensor> {
    let w = weight_name(spec, layout);
    let base = w.strip_suffix(".weight").unwrap_or(&w).to_string();
    let mut lead = spec.shape.clone();
    let cols = lead.pop().unwrap_or(0);
    let with_last = |last: usize| {
        let mut s = lead.clone();
        s.push(last);
        s
    };
    let t = |name: String, dtype: Dtype, shape: Vec<usize>| PlannedTensor { name, dtype, shape };
    match storage {
        Storage::Dense => vec![t(w, dense, spec.shape.clone())],
        Storage::Nvfp4 => vec![
            t(w, Dtype::U32, with_last(cols / 8)),
            t(
                format!("{base}.scales"),
                Dtype::U8,
                with_last(cols / quant::NVFP4_GROUP),
            ),
            t(
                format!("{base}.global_scale"),
                Dtype::F32,
                vec![spec.shape[0]],
            ),
        ],
        Storage::Affine { group_size, bits } => vec![
            t(w, Dtype::U32, with_last(cols * bits as usize / 32)),
            t(
                format!("{base}.scales"),
                dense,
                with_last(cols / group_size),
            ),
            t(
                format!("{base}.biases"),
                dense,
                with_last(cols / group_size),
            ),
        ],
    }
}

fn float_bytes(v: &[f32], d: Dtype) -> Vec<u8> {
    match d {
        Dtype::F32 => tensors::f32_bytes(v),
        _ => tensors::bf16_bytes(v),
    }
}

/// Produce the bytes of every output of one entry from its values (already in the dense dtype).
fn encode(
    spec: &TensorSpec,
    values: &[f32],
    storage: Storage,
    dense: Dtype,
) -> Result<Vec<Vec<u8>>, WriteError> {
    let src = if dense == Dtype::F32 {
        SourceDtype::F32
    } else {
        SourceDtype::Bf16
    };
    let cols = spec.shape.last().copied().unwrap_or(0);
    let qerr = |source| WriteError::Quant {
        name: spec.name.clone(),
        source,
    };
    Ok(match storage {
        Storage::Dense => vec![float_bytes(values, dense)],
        Storage::Nvfp4 => {
            // One global scale per expert: its absmax, as mlx_lm quantises a stacked switch
            // layer one expert at a time (MLX's global_scale must be a scalar per call).
            let experts = spec.shape[0];
            let per = values.len() / experts.max(1);
            let (mut codes, mut scales, mut gs) = (Vec::new(), Vec::new(), Vec::new());
            for e in values.chunks_exact(per.max(1)) {
                let amax = e.iter().fold(0f32, |m, v| m.max(v.abs()));
                // An all-zero expert would divide by zero; any scale gives the same zero codes.
                let g = if amax > 0.0 { amax } else { 1.0 };
                let q = quant::quantize_nvfp4(e, cols, src, Some(g)).map_err(qerr)?;
                codes.extend(q.codes);
                scales.extend(q.scales);
                gs.push(g);
            }
            vec![tensors::u32_bytes(&codes), scales, tensors::f32_bytes(&gs)]
        }
        Storage::Affine { group_size, bits } => {
            let q = quant::quantize_affine(values, cols, group_size, bits, src).map_err(qerr)?;
            vec![
                tensors::u32_bytes(&q.codes),
                float_bytes(&q.scales, dense),
                float_bytes(&q.biases, dense),
            ]
        }
    })
}

/// Split a shard's members into batches of at most `threads` tensors and about 1 GiB of f32
/// values, so a full-size checkpoint does not hold several expert stacks at once.
fn batches(members: &[usize], specs: &[TensorSpec], threads: usize) -> Vec<Vec<usize>> {
    let mut out = Vec::new();
    let mut cur = Vec::new();
    let mut bytes = 0usize;
    for &i in members {
        let b = specs[i].numel() * 4;
        if !cur.is_empty() && (cur.len() >= threads || bytes + b > 1 << 30) {
            out.push(std::mem::take(&mut cur));
            bytes = 0;
        }
        cur.push(i);
        bytes += b;
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
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
    let text = serde_json::to_string_pretty(v).map_err(|e| WriteError::Json {
        path: path.to_path_buf(),
        why: e.to_string(),
    })?;
    std::fs::write(path, text + "\n").map_err(io(path))
}

/// mlx_lm's config convention: `quantization` (and a copy as `quantization_config`) holds the
/// defaults plus one entry per module that differs: a `{group_size, bits}` object, or `false`
/// for a module left unquantised.
pub fn affine_quantization_config(specs: &[TensorSpec]) -> Value {
    let mut q = Map::new();
    q.insert("group_size".into(), json!(AFFINE_GROUP));
    q.insert("bits".into(), json!(AFFINE_EXPERT_BITS));
    q.insert("mode".into(), json!("affine"));
    for s in specs {
        if s.role == Role::Vector {
            continue;
        }
        match storage_for(s, Layout::Affine) {
            Storage::Affine { bits, group_size }
                if bits == AFFINE_EXPERT_BITS && group_size == AFFINE_GROUP => {}
            Storage::Affine { bits, group_size } => {
                q.insert(
                    s.module().to_string(),
                    json!({"group_size": group_size, "bits": bits}),
                );
            }
            _ => {
                q.insert(s.module().to_string(), json!(false));
            }
        }
    }
    Value::Object(q)
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
    std::fs::create_dir_all(out).map_err(io(out))?;
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
            (st, outputs(s, layout, st, dense_t))
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
            values
                .iter_mut()
                .for_each(|v| *v = half::bf16::from_f32(*v).to_f32());
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
            "format": MANIFEST_FORMAT,
            "format_version": 1,
            "dense_dtype": "bfloat16",
            "quantization": {"experts": {
                "mode": "nvfp4", "group_size": quant::NVFP4_GROUP, "bits": 4,
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
    let text = std::fs::read_to_string(&cfg_path).map_err(io(&cfg_path))?;
    let config: Value = serde_json::from_str(&text).map_err(|e| WriteError::Json {
        path: cfg_path.clone(),
        why: e.to_string(),
    })?;
    if config.get("quantization").is_some() || src.join(MANIFEST).exists() {
        return Err(source_err(
            "is already quantised; convert from an HF (dense) checkpoint".into(),
        ));
    }
    let dims = ModelDims::from_config(&config)?;
    let files = hf_weight_files(src).map_err(|e| source_err(e.to_string()))?;
    let set = TensorSet::open(&files)?;
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
            std::fs::copy(&from, dst.join(f)).map_err(io(&from))?;
            summary.files.push(f.to_string());
        }
    }
    Ok(summary)
}

/// The safetensors files of an HF checkpoint: the index's files, or `model.safetensors`.
pub fn hf_weight_files(dir: &Path) -> Result<Vec<PathBuf>, WriteError> {
    let idx = dir.join("model.safetensors.index.json");
    if idx.is_file() {
        let text = std::fs::read_to_string(&idx).map_err(io(&idx))?;
        let v: Value = serde_json::from_str(&text).map_err(|e| WriteError::Json {
            path: idx.clone(),
            why: e.to_string(),
        })?;
        let map = v
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| WriteError::Json {
                path: idx.clone(),
                why: "no weight_map object".into(),
            })?;
        let mut files: Vec<String> = map
            .values()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect();
        files.sort();
        files.dedup();
        return Ok(files.into_iter().map(|f| dir.join(f)).collect());
    }
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok(vec![single]);
    }
    Err(WriteError::Source {
        src: dir.to_path_buf(),
        why: "neither model.safetensors nor model.safetensors.index.json".into(),
    })
}
