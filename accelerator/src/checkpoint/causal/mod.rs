//! Causal chat models from the files users hold: a Hugging Face folder (`config.json`,
//! safetensors in bf16/f16/f32 or mlx-community's affine 4/8-bit) or one GGUF file (llama.cpp,
//! Ollama, LM Studio). What a checkpoint is comes from its content: a GGUF's magic and
//! `general.architecture`, a folder's `config.json` `model_type` and its tensors' dtypes and
//! shapes (docs/checkpoint-layouts.md, "Chat models").
//!
//! - `hf`: a folder's config and tensors (`model.layers.N.…` names);
//! - `gguf`: a GGUF's tensors (`blk.N.…` names, llama.cpp's q/k row order undone);
//! - `gguf_config`: a GGUF's metadata as each family's configuration;
//! - this file: [`CausalWeights`], what both give the builder, and [`load`], which picks one and
//!   builds the model and its tokenizer.

mod gguf;
mod gguf_config;
mod hf;

pub use hf::config_from_json;

use std::path::{Path, PathBuf};

use mlx_rs::{Array, Dtype};

use crate::checkpoint::gguf::{GgufError, GgufFile};
use crate::model::causal::blocks::layer_attention_geometry;
use crate::model::causal::blocks::ProjectionBiases;
use crate::model::causal::{
    CausalAttention, CausalConfig, CausalKernels, CausalLm, CausalRope, DecoderLayer, GatedMlp,
};
use crate::model::{linear::Linear, norm::RmsNorm, ModelError};

/// Why a chat model could not be loaded; each names the file and what is wrong with it.
#[derive(Debug, thiserror::Error)]
pub enum CausalLoadError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {why}")]
    Config { path: PathBuf, why: String },
    #[error("{path}: tensor {name}: {why}")]
    Tensor {
        path: PathBuf,
        name: String,
        why: String,
    },
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Tensors(#[from] crate::checkpoint::LoadError),
    #[error("building the model: {0}")]
    Model(#[from] ModelError),
}

/// Which file layout a path holds, told apart by content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CausalFormat {
    /// A GGUF file.
    Gguf,
    /// A Hugging Face folder of a causal chat architecture (`model_type`).
    HuggingFace { model_type: String },
}

impl CausalFormat {
    /// `Some` when `path` is for this family to load or refuse: a file that starts with GGUF's
    /// magic, or a folder whose `config.json` names a `model_type` (top level, or a multimodal
    /// config's `text_config`) other than DiffusionGemma's — so an architecture Hunch does not
    /// serve (`qwen2_moe`, `phi3`, …) is refused by its name here, never handed to the
    /// DiffusionGemma loader. `None` leaves the path to the diffusion family.
    pub fn detect(path: &Path) -> Option<CausalFormat> {
        if path.is_file() {
            return GgufFile::is_gguf(path).then_some(CausalFormat::Gguf);
        }
        let text = std::fs::read_to_string(path.join("config.json")).ok()?;
        let json: serde_json::Value = serde_json::from_str(&text).ok()?;
        let model_type = hf::text_config(&json)
            .get("model_type")?
            .as_str()?
            .to_owned();
        let top = json
            .get("model_type")
            .and_then(|v| v.as_str())
            .unwrap_or_default();
        let diffusion = |t: &str| t.starts_with("diffusion_gemma");
        (!diffusion(&model_type) && !diffusion(top))
            .then_some(CausalFormat::HuggingFace { model_type })
    }

    /// How it is named in logs and the fingerprint.
    pub fn name(&self) -> &'static str {
        match self {
            CausalFormat::Gguf => "gguf",
            CausalFormat::HuggingFace { .. } => "hf",
        }
    }
}

/// Whether affine-quantised weights are kept quantised or widened to dense float32 at load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AffineWeights {
    /// On MLX's CPU backend: kept quantised where the native path's integer products run them
    /// (any copy but the portable one: AVX2 or NEON at least; kernels `auto` or `native`), else
    /// dense float32 when the whole model fits [`AUTO_DENSE_LIMIT`] that way. Quantised on every
    /// other backend.
    #[default]
    Auto,
    /// Kept as stored (packed codes, scales and biases).
    Quantized,
    /// Dequantised to dense float32.
    Dense,
}

/// Largest model (in float32 bytes) [`AffineWeights::Auto`] widens on the CPU. MLX 0.32's CPU
/// backend runs `quantized_matmul` one scalar at a time, while float32 products go to the BLAS:
/// on SmolLM2-135M's Q4_1 GGUF a read took 12x as long quantised (docs/benchmarks.md, "Chat
/// models"). Past this size the memory matters more than the speed.
pub const AUTO_DENSE_LIMIT: u64 = 6 << 30;

impl AffineWeights {
    /// Whether a model of `config` loads dense under this policy on the current backend, its
    /// prompt chunks to run on `kernels`.
    pub fn dense_for(self, config: &CausalConfig, kernels: CausalKernels) -> bool {
        match self {
            AffineWeights::Quantized => false,
            AffineWeights::Dense => true,
            AffineWeights::Auto => {
                let integer_products =
                    kernels != CausalKernels::Mlx && hunch_kernels::quant::fast();
                crate::model::widened::cpu_backend().unwrap_or(false)
                    && !integer_products
                    && 4 * parameters(config) <= AUTO_DENSE_LIMIT
            }
        }
    }
}

/// The weights a model of `config` has (embedding, head unless tied, layers).
pub fn parameters(config: &CausalConfig) -> u64 {
    let (h, i) = (config.hidden_size as u64, config.intermediate_size as u64);
    let q = (config.num_heads * config.head_dim) as u64;
    let kv = (config.num_kv_heads * config.head_dim) as u64;
    let embedding = config.vocab_size as u64 * h;
    let head = if config.tie_word_embeddings {
        0
    } else {
        embedding
    };
    let layer = h * (2 * q + 2 * kv) + 3 * h * i;
    embedding + head + config.num_layers as u64 * layer
}

/// The model alone, without its tokenizer: its layout and the bytes its weights hold, for
/// prompt chunks on the default kernels (`auto`).
pub fn load_model(
    path: &Path,
    affine: AffineWeights,
) -> Result<(CausalLm, CausalFormat, u64), CausalLoadError> {
    load_model_for(path, affine, CausalKernels::Auto, &[])
}

/// [`load_model`] for prompt chunks on `kernels` (which decides what `Auto` widens), with the
/// config keys `ignored` the user said are harmless (`ignore_config_keys`).
pub fn load_model_for(
    path: &Path,
    affine: AffineWeights,
    kernels: CausalKernels,
    ignored: &[String],
) -> Result<(CausalLm, CausalFormat, u64), CausalLoadError> {
    let format = CausalFormat::detect(path).ok_or_else(|| CausalLoadError::Config {
        path: path.to_path_buf(),
        why: format!(
            "neither a GGUF file nor a folder whose config.json names a model_type ({})",
            crate::model::causal::config::SERVED_MODEL_TYPES
        ),
    })?;
    let (model, weight_bytes) = match &format {
        CausalFormat::Gguf => {
            let mut weights = gguf::GgufWeights::new(GgufFile::open(path)?, ignored)?;
            let dense = affine.dense_for(weights.config(), kernels);
            weights.pack_for_native(!dense && packs_for_native(kernels));
            let model = build(path, weights.config().clone(), &weights, dense)?;
            (
                model,
                loaded_bytes(weights.loaded_bytes(), weights.config(), dense),
            )
        }
        CausalFormat::HuggingFace { .. } => {
            let weights = hf::HfWeights::open(path, ignored)?;
            let dense = affine.dense_for(weights.config(), kernels);
            let model = build(path, weights.config().clone(), &weights, dense)?;
            (
                model,
                loaded_bytes(weights.loaded_bytes(), weights.config(), dense),
            )
        }
    };
    Ok((model, format, weight_bytes))
}

/// Whether a GGUF's block-quantised matrices are packed for the native integer products at
/// load (and so never exist as MLX arrays): where prompt chunks will run on the native path
/// (`auto` on MLX's CPU backend, or `native`) and the integer products will run them (fast
/// here, or `native` asks for them anyway: `cpu::prepare`'s rule). Elsewhere (`mlx`, another
/// backend) they load as MLX arrays, the K-quants dequantised (docs/models.md, "GGUF types").
fn packs_for_native(kernels: CausalKernels) -> bool {
    match kernels {
        CausalKernels::Mlx => false,
        CausalKernels::Native => true,
        CausalKernels::Auto => {
            hunch_kernels::quant::fast() && crate::model::widened::cpu_backend().unwrap_or(false)
        }
    }
}

/// What a checkpoint layout gives the builder, by Hugging Face module name
/// (`model.layers.3.self_attn.q_proj`, `model.norm`, `lm_head`).
pub(crate) trait CausalWeights {
    /// The model's configuration.
    fn config(&self) -> &CausalConfig;
    /// Whether the module has weights in the checkpoint.
    fn contains(&self, module: &str) -> bool;
    /// A linear map `[out, in]` (dense or affine).
    fn linear(&self, module: &str, out: i32, input: i32) -> Result<Linear, CausalLoadError>;
    /// A norm's weight `[len]` in float32, as the norm applies it (Gemma's `1 + w` included).
    fn norm(&self, module: &str, len: i32) -> Result<Array, CausalLoadError>;
    /// A linear module's bias `[len]` in float32, `None` where the checkpoint has none.
    fn bias(&self, module: &str, len: i32) -> Result<Option<Array>, CausalLoadError>;
}

/// What the weights hold once loaded: as the layout stores them, or widened to float32.
fn loaded_bytes(stored: u64, config: &CausalConfig, dense: bool) -> u64 {
    if dense {
        stored.max(4 * parameters(config))
    } else {
        stored
    }
}

/// An affine weight dequantised to dense float32 (evaluated now, so the packed arrays and their
/// mapping are released), or the weight as it was.
fn widen(linear: Linear, dense: bool) -> Result<Linear, CausalLoadError> {
    match linear {
        Linear::Affine(q) if dense => {
            let w = mlx_rs::ops::dequantize(&q.weight, &q.scales, &q.biases, q.group_size, q.bits)
                .and_then(|w| w.as_dtype(Dtype::Float32))
                .map_err(ModelError::from)?;
            w.eval().map_err(ModelError::from)?;
            Ok(Linear::dense(w))
        }
        other => Ok(other),
    }
}

/// A weights source whose affine linears come out dense when `dense`.
struct Widened<'a, W: CausalWeights> {
    inner: &'a W,
    dense: bool,
}

impl<W: CausalWeights> CausalWeights for Widened<'_, W> {
    fn config(&self) -> &CausalConfig {
        self.inner.config()
    }
    fn contains(&self, module: &str) -> bool {
        self.inner.contains(module)
    }
    fn linear(&self, module: &str, out: i32, input: i32) -> Result<Linear, CausalLoadError> {
        widen(self.inner.linear(module, out, input)?, self.dense)
    }
    fn norm(&self, module: &str, len: i32) -> Result<Array, CausalLoadError> {
        self.inner.norm(module, len)
    }
    fn bias(&self, module: &str, len: i32) -> Result<Option<Array>, CausalLoadError> {
        self.inner.bias(module, len)
    }
}

/// Builds the stack from `weights` under `config`, affine weights widened when `dense`.
fn build(
    path: &Path,
    config: CausalConfig,
    weights: &impl CausalWeights,
    dense: bool,
) -> Result<CausalLm, CausalLoadError> {
    let weights = &Widened {
        inner: weights,
        dense,
    };
    let eps = config.rms_norm_eps;
    let (hidden, heads, kv_heads, head_dim) = (
        config.hidden_size,
        config.num_heads,
        config.num_kv_heads,
        config.head_dim,
    );
    let norm = |module: &str, len: i32| -> Result<RmsNorm, CausalLoadError> {
        Ok(RmsNorm::new(weights.norm(module, len)?, eps))
    };
    let mut layers = Vec::with_capacity(config.num_layers as usize);
    for i in 0..config.num_layers as usize {
        let p = format!("model.layers.{i}");
        let (rope, window) = layer_attention_geometry(&config, i);
        let qk_norm = |which: &str| -> Result<Option<RmsNorm>, CausalLoadError> {
            if config.qk_norm() {
                Ok(Some(norm(&format!("{p}.self_attn.{which}"), head_dim)?))
            } else {
                Ok(None)
            }
        };
        // The config says which projections have biases; a checkpoint that disagrees is refused
        // rather than read with its biases dropped or invented.
        let bias =
            |which: &str, len: i32, declared: bool| -> Result<Option<Array>, CausalLoadError> {
                let module = format!("{p}.self_attn.{which}");
                match (weights.bias(&module, len)?, declared) {
                    (Some(b), true) => Ok(Some(b)),
                    (None, false) => Ok(None),
                    (Some(_), false) => Err(CausalLoadError::Tensor {
                        path: path.to_path_buf(),
                        name: format!("{module}.bias"),
                        why: "is in the checkpoint but the config declares no such bias".into(),
                    }),
                    (None, true) => Err(CausalLoadError::Tensor {
                        path: path.to_path_buf(),
                        name: format!("{module}.bias"),
                        why: "is missing; the config declares biases on this projection".into(),
                    }),
                }
            };
        let (q_out, kv_out) = (heads * head_dim, kv_heads * head_dim);
        let biases = ProjectionBiases {
            q: bias("q_proj", q_out, config.qkv_bias)?,
            k: bias("k_proj", kv_out, config.qkv_bias)?,
            v: bias("v_proj", kv_out, config.qkv_bias)?,
            o: bias("o_proj", hidden, config.o_bias)?,
        };
        let attention = CausalAttention {
            biases,
            q_proj: weights.linear(&format!("{p}.self_attn.q_proj"), heads * head_dim, hidden)?,
            k_proj: weights.linear(
                &format!("{p}.self_attn.k_proj"),
                kv_heads * head_dim,
                hidden,
            )?,
            v_proj: weights.linear(
                &format!("{p}.self_attn.v_proj"),
                kv_heads * head_dim,
                hidden,
            )?,
            o_proj: weights.linear(&format!("{p}.self_attn.o_proj"), hidden, heads * head_dim)?,
            q_norm: qk_norm("q_norm")?,
            k_norm: qk_norm("k_norm")?,
            rope: CausalRope::new(&rope, head_dim),
            num_heads: heads,
            num_kv_heads: kv_heads,
            head_dim,
            // YaRN scales the rotated queries and keys alike: the scores by its square.
            scale: config.attention_scale * rope.attention_factor().powi(2),
            window,
        };
        let inner = config.intermediate_size;
        let mlp = GatedMlp {
            gate: weights.linear(&format!("{p}.mlp.gate_proj"), inner, hidden)?,
            up: weights.linear(&format!("{p}.mlp.up_proj"), inner, hidden)?,
            down: weights.linear(&format!("{p}.mlp.down_proj"), hidden, inner)?,
            activation: config.activation,
        };
        // Llama names its pre-MLP norm `post_attention_layernorm`; Gemma uses that name for the
        // norm after attention and calls the pre-MLP one `pre_feedforward_layernorm`.
        let layer = if config.sandwich_norms() {
            DecoderLayer {
                input_norm: norm(&format!("{p}.input_layernorm"), hidden)?,
                attention,
                post_attention_norm: Some(norm(&format!("{p}.post_attention_layernorm"), hidden)?),
                pre_mlp_norm: norm(&format!("{p}.pre_feedforward_layernorm"), hidden)?,
                mlp,
                post_mlp_norm: Some(norm(&format!("{p}.post_feedforward_layernorm"), hidden)?),
            }
        } else {
            DecoderLayer {
                input_norm: norm(&format!("{p}.input_layernorm"), hidden)?,
                attention,
                post_attention_norm: None,
                pre_mlp_norm: norm(&format!("{p}.post_attention_layernorm"), hidden)?,
                mlp,
                post_mlp_norm: None,
            }
        };
        layers.push(layer);
    }
    let embedding = weights.linear("model.embed_tokens", config.vocab_size, hidden)?;
    // A checkpoint without a head is tied whatever its config says (Gemma and SmolLM2 GGUFs
    // have no `output` tensor).
    let head = if !config.tie_word_embeddings && weights.contains("lm_head") {
        Some(weights.linear("lm_head", config.vocab_size, hidden)?)
    } else {
        None
    };
    let final_norm = norm("model.norm", hidden)?;
    Ok(CausalLm::new(config, embedding, layers, final_norm, head)?)
}

/// An array in float32 (a bias as the products' outputs are), evaluated.
fn float32(stored: Array) -> Result<Array, CausalLoadError> {
    let w = stored.as_dtype(Dtype::Float32).map_err(ModelError::from)?;
    w.eval().map_err(ModelError::from)?;
    Ok(w)
}

/// A norm weight in float32, `+ 1` where the architecture applies `1 + w` and the layout stores
/// `w` (Hugging Face; llama.cpp's converter already adds the one).
fn norm_weight(stored: Array, add_one: bool) -> Result<Array, CausalLoadError> {
    let w = stored.as_dtype(Dtype::Float32).map_err(ModelError::from)?;
    if add_one {
        Ok(mlx_rs::ops::add(&w, Array::from_f32(1.0)).map_err(ModelError::from)?)
    } else {
        Ok(w)
    }
}
