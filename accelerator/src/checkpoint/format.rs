//! The on-disk conventions of the three checkpoint layouts, in one place that both the loader
//! ([`super::layout`]) and the writers ([`super::writer`]) use: file names, the tensors each
//! layout stores for one logical weight, and mlx_lm's `quantization` block in `config.json`.
//! Nothing here reads or writes a file (docs/checkpoint-layouts.md).

use serde_json::{json, Map, Value};

use super::dims::{Role, TensorSpec};
use super::tensors::{Dtype, PlannedTensor};

/// HF's shard index (`{"weight_map": {tensor: file}}`), also written by mlx_lm.
pub const INDEX: &str = "model.safetensors.index.json";
/// The weights of an unsharded checkpoint.
pub const SINGLE_FILE: &str = "model.safetensors";
/// The manifest super-decider's NVFP4 export carries (and Hunch's writer imitates). Only its
/// tensor→file map is read; its other keys, a `format` tag included, are ignored.
pub const MANIFEST: &str = "manifest.json";

/// Inputs per group of the mlx-community affine layout.
pub const AFFINE_GROUP: usize = 64;
/// Bits of the affine layout's experts (the config default).
pub const AFFINE_EXPERT_BITS: u32 = 4;
/// Bits of the affine layout's other linears (embedding, attention, dense MLPs, router).
pub const AFFINE_DENSE_BITS: u32 = 8;
/// Inputs per E4M3 block scale in NVFP4.
pub const NVFP4_GROUP: usize = 16;

/// The three on-disk layouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layout {
    /// Hugging Face `save_pretrained`: every tensor dense.
    Hf,
    /// super-decider: experts NVFP4 with a per-expert global scale, everything else dense.
    Nvfp4,
    /// mlx-community: MLX affine codes, described by `quantization` in config.json.
    Affine,
}

impl Layout {
    /// Every layout, in the order detection prefers one when several fit.
    pub const ALL: [Layout; 3] = [Layout::Affine, Layout::Nvfp4, Layout::Hf];
}

/// A layout name that is none of `hf`, `nvfp4`, `affine`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown layout {0:?} (hf, nvfp4, affine)")]
pub struct UnknownLayout(pub String);

impl std::str::FromStr for Layout {
    type Err = UnknownLayout;
    fn from_str(s: &str) -> Result<Self, UnknownLayout> {
        Ok(match s {
            "hf" => Layout::Hf,
            "nvfp4" => Layout::Nvfp4,
            "affine" => Layout::Affine,
            _ => return Err(UnknownLayout(s.to_string())),
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

/// How one tensor of the inventory is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storage {
    /// One float tensor of the logical shape.
    Dense,
    /// `.weight` U32 codes, `.scales` U8 E4M3, `.global_scale` F32 per expert.
    Nvfp4,
    /// `.weight` U32 codes, `.scales` and `.biases` float per group.
    Affine {
        /// Inputs per group.
        group_size: usize,
        /// Bits per code.
        bits: u32,
    },
}

/// The storage a layout uses for a tensor by convention. Like mlx_lm's default predicate, a
/// weight whose input width is not a multiple of the group size stays dense. The affine loader
/// reads the storage from config.json instead ([`affine_storage`]); this is what the writer
/// puts there.
pub fn storage_for(spec: &TensorSpec, layout: Layout) -> Storage {
    let cols = spec.shape.last().copied().unwrap_or(0);
    match (layout, spec.role) {
        (Layout::Nvfp4, Role::Experts) if cols % NVFP4_GROUP == 0 => Storage::Nvfp4,
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

/// The tensors a layout stores for one inventory entry, in order: the weight (or codes), then
/// scales, then biases or global scale. `dense` is the float type of dense tensors, scales and
/// biases (a reader accepts any float type there).
pub fn stored_tensors(
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
                with_last(cols / NVFP4_GROUP),
            ),
            t(
                format!("{base}.global_scale"),
                Dtype::F32,
                vec![spec.shape.first().copied().unwrap_or(1)],
            ),
        ],
        Storage::Affine { group_size, bits } => vec![
            t(w, Dtype::U32, with_last(cols * bits as usize / 32)),
            t(
                format!("{base}.scales"),
                dense,
                with_last(cols / group_size.max(1)),
            ),
            t(
                format!("{base}.biases"),
                dense,
                with_last(cols / group_size.max(1)),
            ),
        ],
    }
}

/// The `quantization` block of a config.json (mlx_lm writes it, and a copy as
/// `quantization_config`), if it describes MLX affine quantisation: a block without `mode`
/// (older mlx_lm) or with `"mode": "affine"`. A block naming another mode (`nvfp4`, `mxfp4`) or
/// an HF `quant_method` is not affine.
pub fn affine_block(config: &Value) -> Option<&Value> {
    let q = config
        .get("quantization")
        .or_else(|| config.get("quantization_config"))?;
    if !q.is_object() || q.get("quant_method").is_some() {
        return None;
    }
    match q.get("mode").and_then(Value::as_str) {
        None | Some("affine") => Some(q),
        Some(_) => None,
    }
}

/// A `quantization` entry that cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("quantization entry for {module}: {why}")]
pub struct QuantizationEntryError {
    /// The module (or `(default)`).
    pub module: String,
    /// What is wrong.
    pub why: String,
}

/// Storage of a module in an affine checkpoint, from its `quantization` block: an entry per
/// module (`{group_size, bits}`, `false` for dense, `true` for the defaults) over the block's
/// default `group_size` / `bits` (64 / 4 when absent).
pub fn affine_storage(q: &Value, spec: &TensorSpec) -> Result<Storage, QuantizationEntryError> {
    if spec.role == Role::Vector {
        return Ok(Storage::Dense);
    }
    let bad = |why: String| QuantizationEntryError {
        module: spec.module().to_string(),
        why,
    };
    let get = |v: &Value, k: &str, dflt: Option<u64>| v.get(k).and_then(Value::as_u64).or(dflt);
    let dg = get(q, "group_size", Some(AFFINE_GROUP as u64));
    let db = get(q, "bits", Some(AFFINE_EXPERT_BITS as u64));
    let storage = |g: Option<u64>, b: Option<u64>| match (g, b) {
        (Some(g), Some(b)) if g > 0 && matches!(b, 2 | 3 | 4 | 5 | 6 | 8) => Ok(Storage::Affine {
            group_size: g as usize,
            bits: b as u32,
        }),
        (g, b) => Err(bad(format!(
            "group_size {g:?} / bits {b:?} is not an affine quantisation MLX runs"
        ))),
    };
    match q.get(spec.module()) {
        Some(Value::Bool(false)) => Ok(Storage::Dense),
        Some(Value::Bool(true)) | None => storage(dg, db),
        Some(o @ Value::Object(_)) => {
            if let Some(m) = o.get("mode").and_then(Value::as_str) {
                if m != "affine" {
                    return Err(bad(format!("mode {m:?} is not supported")));
                }
            }
            storage(get(o, "group_size", dg), get(o, "bits", db))
        }
        Some(other) => Err(bad(format!("unexpected value {other}"))),
    }
}

/// mlx_lm's `quantization` block for the storage [`storage_for`] gives the affine layout: the
/// defaults plus one entry per module that differs.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_affine_blocks_are_affine() {
        let cfg = |q: Value| json!({ "quantization": q });
        assert!(affine_block(&cfg(json!({"group_size": 64, "bits": 4}))).is_some());
        assert!(affine_block(&cfg(json!({"mode": "affine"}))).is_some());
        assert!(affine_block(&cfg(json!({"mode": "nvfp4", "group_size": 16}))).is_none());
        assert!(
            affine_block(&json!({"quantization_config": {"quant_method": "modelopt"}})).is_none()
        );
        assert!(affine_block(&json!({})).is_none());
        assert_eq!("nvfp4".parse::<Layout>(), Ok(Layout::Nvfp4));
        assert!("gguf".parse::<Layout>().is_err());
    }
}
