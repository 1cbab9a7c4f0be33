//! Loading checkpoints: tensor sources (memory-mapped safetensors shards) and the assembly of a
//! [`DiffusionGemma`] from a [`WeightLayout`], which says how each logical weight is stored.
//!
//! Layouts: [`hf`] (Hugging Face BF16/F32, single file or sharded) and [`quantized`] (NVFP4
//! experts, MLX affine). Quantised layouts implement [`WeightLayout`] and build [`Linear`] /
//! [`Experts`] through their public constructors; [`load`] picks one with [`detect_layout`].

pub mod hf;
pub mod quantized;

use std::{
    collections::HashMap,
    ffi::c_void,
    fs::File,
    path::{Path, PathBuf},
    sync::Arc,
};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use memmap2::{MmapMut, MmapOptions};
use mlx_rs::{Array, Dtype};

use crate::model::{
    attention::Attention,
    config::{AttentionKind, Config, ConfigError},
    layer::{Layer, LayerNorms},
    mlp::Mlp,
    moe::{Moe, Router},
    norm::RmsNorm,
    rope::Rope,
    self_conditioning::SelfConditioning,
    ActivationDtype, DiffusionGemma, Experts, Linear, ModelError,
};

/// How to load a model.
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// Activation (and dense weight) dtype.
    pub dtype: ActivationDtype,
    /// Draw a progress bar on stderr (hidden anyway when stderr is not a terminal).
    pub progress: bool,
}

/// Why a checkpoint could not be loaded. Every variant names what to look at.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A file could not be opened or mapped.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// `config.json` is unreadable or describes an unsupported model.
    #[error("{path}: {}", describe_config_error(source))]
    Config {
        /// The config file.
        path: PathBuf,
        /// What is wrong with it.
        source: ConfigError,
    },
    /// A safetensors header or shard index is malformed.
    #[error("{path}: {message}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The directory holds no layout this build can read.
    #[error("{dir}: no checkpoint layout recognised (expected model.safetensors or model.safetensors.index.json with config.json)")]
    UnknownLayout {
        /// The directory.
        dir: PathBuf,
    },
    /// A tensor the model needs is not in the checkpoint.
    #[error("tensor {name} (expected shape {expected:?}) is missing from {files}")]
    MissingTensor {
        /// Its name.
        name: String,
        /// The shape the model expects.
        expected: Vec<i32>,
        /// The files searched.
        files: String,
    },
    /// A tensor has the wrong shape.
    #[error("tensor {name} in {file} has shape {found:?}, expected {expected:?}")]
    ShapeMismatch {
        /// Its name.
        name: String,
        /// The file holding it.
        file: PathBuf,
        /// Shape on disk.
        found: Vec<i32>,
        /// Shape the model expects.
        expected: Vec<i32>,
    },
    /// A tensor's dtype cannot be used.
    #[error("tensor {name} in {file} has dtype {dtype}, which {why}")]
    Dtype {
        /// Its name.
        name: String,
        /// The file holding it.
        file: PathBuf,
        /// The safetensors dtype.
        dtype: String,
        /// Why it is refused.
        why: &'static str,
    },
    /// MLX failed while preparing a tensor.
    #[error("MLX while loading {name}: {source}")]
    Mlx {
        /// The tensor.
        name: String,
        /// The MLX error.
        source: mlx_rs::error::Exception,
    },
    /// Assembling the model failed.
    #[error("assembling the model: {0}")]
    Model(#[from] ModelError),
    /// Detecting or validating a quantised layout failed (names tensor, file and shapes).
    /// Boxed: the validator's error is large and load errors travel through `Result`s.
    #[error(transparent)]
    Layout(Box<layout::LayoutError>),
}

/// Where named tensors come from.
pub trait TensorSource {
    /// Whether the source holds `name`.
    fn contains(&self, name: &str) -> bool;
    /// The tensor `name`, checked against `expected` shape, in its stored dtype.
    fn tensor(&self, name: &str, expected: &[i32]) -> Result<Array, LoadError>;
    /// The stored dtype of `name`, if present.
    fn dtype_of(&self, name: &str) -> Option<Dtype>;
}

struct TensorEntry {
    shard: usize,
    dtype: Dtype,
    dtype_name: String,
    shape: Vec<i32>,
    /// Absolute byte range in the shard's mapping.
    start: usize,
    end: usize,
}

struct Shard {
    path: PathBuf,
    /// Private (copy-on-write) mapping: MLX may donate an input buffer to an output and write
    /// into it; with a private mapping that only copies the touched pages, never the file.
    map: Arc<MmapMut>,
}

/// Memory-mapped safetensors files. Arrays are built over the mapped bytes (no second copy of
/// the weights in memory; MLX keeps the mapping alive until its last array goes).
pub struct SafetensorsShards {
    shards: Vec<Shard>,
    index: HashMap<String, TensorEntry>,
}

fn mlx_dtype(name: &str) -> Option<Dtype> {
    Some(match name {
        "F32" => Dtype::Float32,
        "F16" => Dtype::Float16,
        "BF16" => Dtype::Bfloat16,
        "U8" => Dtype::Uint8,
        "U32" => Dtype::Uint32,
        "I32" => Dtype::Int32,
        "I64" => Dtype::Int64,
        "U16" => Dtype::Uint16,
        "I8" => Dtype::Int8,
        "I16" => Dtype::Int16,
        "U64" => Dtype::Uint64,
        "BOOL" => Dtype::Bool,
        _ => return None,
    })
}

fn dtype_size(dtype: Dtype) -> usize {
    match dtype {
        Dtype::Bool | Dtype::Uint8 | Dtype::Int8 => 1,
        Dtype::Float16 | Dtype::Bfloat16 | Dtype::Uint16 | Dtype::Int16 => 2,
        Dtype::Float32 | Dtype::Uint32 | Dtype::Int32 => 4,
        _ => 8,
    }
}

unsafe extern "C" fn release_mapping(payload: *mut c_void) {
    // SAFETY: `payload` is the `Box<Arc<MmapMut>>` leaked in `SafetensorsShards::tensor`, and MLX
    // calls this exactly once, when the array's buffer is released.
    drop(unsafe { Box::from_raw(payload as *mut Arc<MmapMut>) });
}

impl SafetensorsShards {
    /// Maps every file and reads its header.
    pub fn open(files: &[PathBuf]) -> Result<Self, LoadError> {
        let mut shards = Vec::with_capacity(files.len());
        let mut index = HashMap::new();
        for (i, path) in files.iter().enumerate() {
            let io = |source| LoadError::Io {
                path: path.clone(),
                source,
            };
            let file = File::open(path).map_err(io)?;
            // SAFETY: a private mapping; the file must not be truncated while loaded (as for any
            // memory-mapped model loader).
            let map = unsafe { MmapOptions::new().map_copy(&file) }.map_err(io)?;
            let format = |message: String| LoadError::Format {
                path: path.clone(),
                message,
            };
            let (header_len, metadata) = safetensors::SafeTensors::read_metadata(&map[..])
                .map_err(|e| match truncation(&map[..]) {
                    // The crate's own words for a short file ("incomplete metadata, file not
                    // fully covered") do not say the file is cut off; an operator needs that.
                    Some(why) => format(format!("{why} (safetensors: {e})")),
                    None => format(e.to_string()),
                })?;
            let data_start = 8 + header_len;
            for (name, info) in metadata.tensors() {
                let dtype_name = format!("{:?}", info.dtype);
                let Some(dtype) = mlx_dtype(&dtype_name) else {
                    // Kept so that asking for it gives a precise error; never used otherwise.
                    index.insert(
                        name.clone(),
                        TensorEntry {
                            shard: i,
                            dtype: Dtype::Uint8,
                            dtype_name,
                            shape: vec![],
                            start: 0,
                            end: 0,
                        },
                    );
                    continue;
                };
                let shape = info.shape.iter().map(|&d| d as i32).collect();
                let (a, b) = info.data_offsets;
                index.insert(
                    name.clone(),
                    TensorEntry {
                        shard: i,
                        dtype,
                        dtype_name,
                        shape,
                        start: data_start + a,
                        end: data_start + b,
                    },
                );
            }
            shards.push(Shard {
                path: path.clone(),
                map: Arc::new(map),
            });
        }
        Ok(Self { shards, index })
    }

    fn files(&self) -> String {
        self.shards
            .iter()
            .map(|s| s.path.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Names of every tensor in the files.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.index.keys().map(String::as_str)
    }
}

impl TensorSource for SafetensorsShards {
    fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    fn dtype_of(&self, name: &str) -> Option<Dtype> {
        self.index.get(name).map(|e| e.dtype)
    }

    fn tensor(&self, name: &str, expected: &[i32]) -> Result<Array, LoadError> {
        let entry = self
            .index
            .get(name)
            .ok_or_else(|| LoadError::MissingTensor {
                name: name.to_owned(),
                expected: expected.to_vec(),
                files: self.files(),
            })?;
        let shard = &self.shards[entry.shard];
        if mlx_dtype(&entry.dtype_name).is_none() {
            return Err(LoadError::Dtype {
                name: name.to_owned(),
                file: shard.path.clone(),
                dtype: entry.dtype_name.clone(),
                why: "MLX cannot hold",
            });
        }
        if entry.shape != expected {
            return Err(LoadError::ShapeMismatch {
                name: name.to_owned(),
                file: shard.path.clone(),
                found: entry.shape.clone(),
                expected: expected.to_vec(),
            });
        }
        let elements: usize = entry.shape.iter().map(|&d| d as usize).product();
        let bytes = &shard.map[entry.start..entry.end];
        if bytes.len() != elements * dtype_size(entry.dtype) {
            return Err(LoadError::Format {
                path: shard.path.clone(),
                message: format!("tensor {name}: byte range does not match its shape and dtype"),
            });
        }
        let ptr = bytes.as_ptr();
        let aligned = (ptr as usize).is_multiple_of(dtype_size(entry.dtype));
        // SAFETY: `ptr` points at `bytes.len()` readable bytes of the mapping, which the boxed
        // Arc handed to MLX as payload keeps alive until MLX releases the array (or, for the
        // copying constructor, for the duration of the call). Shape and dtype match the length
        // (checked above).
        let array = unsafe {
            if aligned && elements > 0 {
                let payload = Box::into_raw(Box::new(Arc::clone(&shard.map))) as *mut c_void;
                Array::from_ptr(mlx_sys::mlx_array_new_data_managed_payload(
                    ptr as *mut c_void,
                    entry.shape.as_ptr(),
                    entry.shape.len() as i32,
                    entry.dtype as mlx_sys::mlx_dtype,
                    payload,
                    Some(release_mapping),
                ))
            } else {
                // Misaligned for its element type (or empty): let MLX copy it.
                Array::from_ptr(mlx_sys::mlx_array_new_data(
                    ptr as *const c_void,
                    entry.shape.as_ptr(),
                    entry.shape.len() as i32,
                    entry.dtype as mlx_sys::mlx_dtype,
                ))
            }
        };
        Ok(array)
    }
}

/// How a layout stores the logical weights of DiffusionGemma. Names passed in are the Hugging
/// Face names of §1.8 (a layout with other names maps them itself).
pub trait WeightLayout {
    /// A plain tensor (norm weights, scalars, router scales) in the activation dtype.
    fn tensor(&self, name: &str, shape: &[i32], dtype: Dtype) -> Result<Array, LoadError>;
    /// A linear map `prefix` (HF: `prefix.weight` `[out, in]`).
    fn linear(&self, prefix: &str, out: i32, inp: i32, dtype: Dtype) -> Result<Linear, LoadError>;
    /// Stacked experts `prefix` (HF: `prefix` `[E, out, in]`, no `.weight`).
    fn experts(
        &self,
        prefix: &str,
        num: i32,
        out: i32,
        inp: i32,
        dtype: Dtype,
    ) -> Result<Experts, LoadError>;
    /// The stored dtype of the embedding (fixes the rounding of √hidden).
    fn embedding_dtype(&self) -> Dtype;
}

fn eval_named(name: &str, arrays: &[&Array]) -> Result<(), LoadError> {
    mlx_rs::transforms::eval(arrays.iter().copied()).map_err(|source| LoadError::Mlx {
        name: name.to_owned(),
        source,
    })
}

/// Builds the model from any layout (names of diffusiongemma.md §1.8).
pub fn assemble(
    layout: &dyn WeightLayout,
    config: Config,
    options: &LoadOptions,
) -> Result<DiffusionGemma, LoadError> {
    let dt = options.dtype.dtype();
    let c = &config;
    let h = c.hidden_size;
    let eps = c.rms_norm_eps;
    let bar = if options.progress {
        ProgressBar::with_draw_target(
            Some(c.num_layers() as u64 + 1),
            ProgressDrawTarget::stderr(),
        )
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("loading {msg} [{bar:30}] {pos}/{len} layers")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message("DiffusionGemma");

    let norm = |name: String, dim: i32| -> Result<RmsNorm, LoadError> {
        let w = layout.tensor(&name, &[dim], dt)?;
        eval_named(&name, &[&w])?;
        Ok(RmsNorm::new(w, eps))
    };
    let base = "model.decoder";
    let embedding = layout.linear(&format!("{base}.embed_tokens"), c.vocab_size, h, dt)?;
    let sc = format!("{base}.self_conditioning");
    let self_conditioning = SelfConditioning::new(
        norm(format!("{sc}.pre_norm.weight"), h)?,
        Mlp::new(
            layout.linear(&format!("{sc}.gate_proj"), c.intermediate_size, h, dt)?,
            layout.linear(&format!("{sc}.up_proj"), c.intermediate_size, h, dt)?,
            layout.linear(&format!("{sc}.down_proj"), h, c.intermediate_size, dt)?,
        ),
        eps,
    );
    let final_norm = norm(format!("{base}.norm.weight"), h)?;
    bar.inc(1);

    let mut layers = Vec::with_capacity(c.num_layers());
    for (i, lc) in c.layers.iter().enumerate() {
        let p = format!("{base}.layers.{i}");
        let a = format!("{p}.self_attn");
        let (hd, nkv, nh) = (lc.head_dim, lc.num_kv_heads, c.num_attention_heads);
        let rope = Rope::new(
            match lc.kind {
                AttentionKind::Sliding => &c.rope_sliding,
                AttentionKind::Full => &c.rope_full,
            },
            hd,
        );
        let v_proj = if lc.k_eq_v {
            None
        } else {
            Some(layout.linear(&format!("{a}.v_proj"), nkv * hd, h, dt)?)
        };
        let attention = Attention::new(
            lc,
            nh,
            layout.linear(&format!("{a}.q_proj"), nh * hd, h, dt)?,
            layout.linear(&format!("{a}.k_proj"), nkv * hd, h, dt)?,
            v_proj,
            layout.linear(&format!("{a}.o_proj"), h, nh * hd, dt)?,
            norm(format!("{a}.q_norm.weight"), hd)?,
            norm(format!("{a}.k_norm.weight"), hd)?,
            rope,
            eps,
        );
        let mlp = Mlp::new(
            layout.linear(&format!("{p}.mlp.gate_proj"), c.intermediate_size, h, dt)?,
            layout.linear(&format!("{p}.mlp.up_proj"), c.intermediate_size, h, dt)?,
            layout.linear(&format!("{p}.mlp.down_proj"), h, c.intermediate_size, dt)?,
        );
        let router = Router::new(
            layout.linear(&format!("{p}.router.proj"), c.num_experts, h, dt)?,
            layout.tensor(&format!("{p}.router.scale"), &[h], dt)?,
            layout.tensor(
                &format!("{p}.router.per_expert_scale"),
                &[c.num_experts],
                Dtype::Float32,
            )?,
            eps,
            h,
            c.top_k_experts,
        );
        let mi = c.moe_intermediate_size;
        let moe = Moe::new(
            router,
            layout.experts(
                &format!("{p}.experts.gate_up_proj"),
                c.num_experts,
                2 * mi,
                h,
                dt,
            )?,
            layout.experts(&format!("{p}.experts.down_proj"), c.num_experts, h, mi, dt)?,
            mi,
        );
        let norms = LayerNorms {
            input_layernorm: norm(format!("{p}.input_layernorm.weight"), h)?,
            post_attention_layernorm: norm(format!("{p}.post_attention_layernorm.weight"), h)?,
            pre_feedforward_layernorm: norm(format!("{p}.pre_feedforward_layernorm.weight"), h)?,
            post_feedforward_layernorm_1: norm(
                format!("{p}.post_feedforward_layernorm_1.weight"),
                h,
            )?,
            pre_feedforward_layernorm_2: norm(
                format!("{p}.pre_feedforward_layernorm_2.weight"),
                h,
            )?,
            post_feedforward_layernorm_2: norm(
                format!("{p}.post_feedforward_layernorm_2.weight"),
                h,
            )?,
            post_feedforward_layernorm: norm(format!("{p}.post_feedforward_layernorm.weight"), h)?,
        };
        // The only text tensors where encoder and decoder differ (§1.4).
        let encoder_scalar = layout.tensor(
            &format!("model.encoder.language_model.layers.{i}.layer_scalar"),
            &[1],
            dt,
        )?;
        let decoder_scalar = layout.tensor(&format!("{p}.layer_scalar"), &[1], dt)?;
        layers.push(Layer::new(
            attention,
            mlp,
            moe,
            norms,
            encoder_scalar,
            decoder_scalar,
        ));
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(DiffusionGemma::new(
        config,
        embedding,
        layout.embedding_dtype(),
        layers,
        final_norm,
        self_conditioning,
        options.dtype,
    )?)
}

/// Why `config.json` was refused, in an operator's words: the path is printed before it, so the
/// file name is not repeated, and a syntax error says plainly that the file is not JSON.
fn describe_config_error(error: &ConfigError) -> String {
    match error {
        ConfigError::Json(e) if e.is_syntax() || e.is_eof() => format!("not valid JSON ({e})"),
        ConfigError::Json(e) => format!("not a DiffusionGemma config ({e})"),
        ConfigError::Invalid(message) => message.clone(),
    }
}

/// Largest header the safetensors format allows (the `safetensors` crate's limit); a bigger
/// length prefix means the file is not safetensors at all, not that it is cut short.
const MAX_SAFETENSORS_HEADER: u64 = 100_000_000;

/// If `bytes`, a safetensors file that failed to parse, is shorter than its own header says, how
/// short: "truncated: N bytes, but its header describes M (K missing)". `None` when the file is
/// broken some other way (the parser's error then stands alone).
fn truncation(bytes: &[u8]) -> Option<String> {
    let len = bytes.len() as u64;
    let Some(prefix) = bytes.get(..8) else {
        return Some(format!(
            "truncated: {len} bytes, shorter than the 8-byte header length"
        ));
    };
    let header_len = u64::from_le_bytes(prefix.try_into().ok()?);
    if header_len > MAX_SAFETENSORS_HEADER {
        return None;
    }
    let header_end = 8 + header_len;
    if len < header_end {
        return Some(format!(
            "truncated: {len} bytes, but its header alone takes {header_end}"
        ));
    }
    let header: serde_json::Value =
        serde_json::from_slice(bytes.get(8..usize::try_from(header_end).ok()?)?).ok()?;
    let data_end = header
        .as_object()?
        .iter()
        .filter(|(name, _)| name.as_str() != "__metadata__")
        .filter_map(|(_, t)| t.get("data_offsets")?.get(1)?.as_u64())
        .max()?;
    let expected = header_end.checked_add(data_end)?;
    (len < expected).then(|| {
        format!(
            "truncated: {len} bytes, but its header describes {expected} ({} missing)",
            expected - len
        )
    })
}

/// Loads a checkpoint directory in any of the three layouts ([`detect_layout`]: NVFP4 when a
/// `manifest.json` is present, affine when config.json has a `quantization` block, else HF).
pub fn load(dir: &Path, options: &LoadOptions) -> Result<DiffusionGemma, LoadError> {
    let config_path = dir.join("config.json");
    let text = std::fs::read_to_string(&config_path).map_err(|source| LoadError::Io {
        path: config_path.clone(),
        source,
    })?;
    let config = Config::from_json(&text).map_err(|source| LoadError::Config {
        path: config_path.clone(),
        source,
    })?;
    match detect_layout(dir)? {
        Layout::Hf => assemble(&hf::HfLayout::open(dir)?, config, options),
        Layout::Nvfp4 | Layout::Affine => {
            assemble(&quantized::QuantizedLayout::open(dir)?, config, options)
        }
    }
}

impl DiffusionGemma {
    /// Loads the checkpoint in `dir` (see [`load`]).
    pub fn load(dir: &Path, options: &LoadOptions) -> Result<Self, LoadError> {
        load(dir, options)
    }
}

// On-disk layouts beyond HF: their writers, quantisers and parsers (docs/checkpoint-layouts.md).
pub mod dims;
pub mod layout;
pub mod quant;
pub mod random;
pub mod tensors;
pub mod writer;

pub use layout::{detect_layout, Checkpoint, QuantMode, QuantizedWeight, Weight};
pub use random::{DenseDtype, Preset, RandomSpec};
pub use writer::{convert, write_random_checkpoint, Layout};

#[cfg(test)]
mod load_error_tests {
    use super::*;

    /// A one-tensor safetensors file (a 4×4 f32 of zeros).
    fn small_safetensors() -> Vec<u8> {
        let data = vec![0u8; 64];
        let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![4, 4], &data)
            .expect("a valid view");
        safetensors::serialize([("w", view)], None).expect("serialises")
    }

    #[test]
    fn a_truncated_safetensors_file_is_called_truncated_with_its_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("model.safetensors");
        let bytes = small_safetensors();
        let full = bytes.len();
        std::fs::write(&path, &bytes[..full - 10]).expect("write");
        let Err(error) = SafetensorsShards::open(std::slice::from_ref(&path)) else {
            panic!("a truncated file opened");
        };
        let message = error.to_string();
        assert!(
            message.starts_with(&path.display().to_string()),
            "{message}"
        );
        assert!(
            message.contains(&format!(
                "truncated: {} bytes, but its header describes {full} (10 missing)",
                full - 10
            )),
            "{message}"
        );
        // Cut inside the header, and before the length prefix ends.
        std::fs::write(&path, &bytes[..20]).expect("write");
        let Err(error) = SafetensorsShards::open(std::slice::from_ref(&path)) else {
            panic!("a truncated file opened");
        };
        assert!(
            error
                .to_string()
                .contains("truncated: 20 bytes, but its header alone takes"),
            "{error}"
        );
        assert_eq!(
            truncation(&bytes[..5]).as_deref(),
            Some("truncated: 5 bytes, shorter than the 8-byte header length")
        );
        // The whole file is not truncated, and garbage is not called truncated.
        assert_eq!(truncation(&bytes), None);
        assert_eq!(truncation(&[0xff; 64]), None);
    }

    #[test]
    fn a_config_json_that_is_not_json_says_so_with_its_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("config.json"), "this is { not JSON").expect("write");
        let Err(error) = load(dir.path(), &LoadOptions::default()) else {
            panic!("a config that is not JSON loaded");
        };
        let message = error.to_string();
        let path = dir.path().join("config.json").display().to_string();
        assert!(
            message.starts_with(&format!("{path}: not valid JSON (")),
            "{message}"
        );
        // Valid JSON that is not a DiffusionGemma config says that instead.
        std::fs::write(dir.path().join("config.json"), "{\"a\": 1}").expect("write");
        let Err(error) = load(dir.path(), &LoadOptions::default()) else {
            panic!("a config without text_config loaded");
        };
        assert!(
            error
                .to_string()
                .starts_with(&format!("{path}: not a DiffusionGemma config (")),
            "{error}"
        );
    }
}
