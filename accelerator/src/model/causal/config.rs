//! What a causal chat model's forward pass needs, flattened from wherever the checkpoint keeps
//! it: a Hugging Face `config.json` in either transformers dialect (each family's file reads its
//! own keys: [`super::llama`], [`super::qwen2`], [`super::qwen3`], [`super::gemma3`]) or a GGUF's
//! metadata (`checkpoint::causal::gguf_config`). Every value the shared blocks use is a field
//! here, so the same model in any of its forms gives an equal [`CausalConfig`] (tests say so per
//! family), and [`HfObject`] reads a config object strictly: a value of the wrong type is an
//! error naming the key, never a default.

pub use super::keys::ConfigError;
pub use super::rope::{RopeScaling, RopeSpec};

/// The architectures the causal family covers (docs/logit-read.md, "Models").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    /// Llama 2/3, SmolLM2, Mistral-style dense models: RMSNorm, RoPE, GQA, SwiGLU.
    Llama,
    /// Qwen2/2.5: Llama with biases on the query, key and value projections.
    Qwen2,
    /// Qwen3: Llama plus per-head RMSNorm on queries and keys.
    Qwen3,
    /// Gemma 3 (text): `(1 + w)` norms around both blocks, embeddings scaled by √hidden,
    /// q/k norms, GeGLU, interleaved sliding-window and global layers.
    Gemma3,
}

/// The Hugging Face `model_type`s served, for refusals.
pub const SERVED_MODEL_TYPES: &str =
    "llama, mistral, qwen2, qwen3, gemma3_text and gemma3 (chat models), and DiffusionGemma";

/// The GGUF architectures served, for refusals.
pub const SERVED_GGUF_ARCHITECTURES: &str = "llama, qwen2, qwen3 and gemma3";

impl Architecture {
    /// The name used in logs, errors and the model's fingerprint.
    pub fn name(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Qwen2 => "qwen2",
            Architecture::Qwen3 => "qwen3",
            Architecture::Gemma3 => "gemma3",
        }
    }

    /// From a Hugging Face `model_type` (the top level's, or `text_config`'s).
    pub fn from_model_type(model_type: &str) -> Option<Architecture> {
        Some(match model_type {
            "llama" | "mistral" => Architecture::Llama,
            "qwen2" => Architecture::Qwen2,
            "qwen3" => Architecture::Qwen3,
            "gemma3_text" | "gemma3" => Architecture::Gemma3,
            _ => return None,
        })
    }

    /// From a GGUF's `general.architecture`.
    pub fn from_gguf(name: &str) -> Option<Architecture> {
        Some(match name {
            "llama" => Architecture::Llama,
            "qwen2" => Architecture::Qwen2,
            "qwen3" => Architecture::Qwen3,
            "gemma3" => Architecture::Gemma3,
            _ => return None,
        })
    }
}

/// The feed-forward gate's activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// SwiGLU (`silu(gate) ⊙ up`).
    Silu,
    /// GeGLU with the tanh approximation of GELU.
    GeluTanh,
}

/// The flattened configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct CausalConfig {
    pub architecture: Architecture,
    pub vocab_size: i32,
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub num_layers: i32,
    pub num_heads: i32,
    pub num_kv_heads: i32,
    pub head_dim: i32,
    pub rms_norm_eps: f32,
    /// RoPE of full-attention layers.
    pub rope: RopeSpec,
    /// RoPE of sliding-window layers (Gemma 3's local base); equal to `rope` elsewhere.
    pub rope_local: RopeSpec,
    /// Per layer: whether it attends over a sliding window of [`Self::sliding_window`].
    pub sliding_layers: Vec<bool>,
    pub sliding_window: i32,
    /// Attention scores are multiplied by this (`head_dim^-½`, Gemma: `query_pre_attn_scalar^-½`).
    pub attention_scale: f32,
    pub activation: Activation,
    /// The output head is the embedding (no `lm_head` / `output` tensor).
    pub tie_word_embeddings: bool,
    /// `tanh(x / cap) · cap` on the final logits (Gemma 2 style; Gemma 3 has none).
    pub final_logit_softcapping: Option<f32>,
    /// Longest context the model was trained for (prompts past it are refused).
    pub max_position_embeddings: Option<i32>,
    /// Biases on the query, key and value projections (Qwen2; `attention_bias` elsewhere).
    pub qkv_bias: bool,
    /// A bias on the output projection (`attention_bias` of Llama, Qwen3 and Gemma 3).
    pub o_bias: bool,
    /// Config keys the user said to ignore that this checkpoint holds (`ignore_config_keys`),
    /// listed in `/v1/models`.
    pub ignored_config_keys: Vec<String>,
}

impl CausalConfig {
    /// Whether layer `i` has per-head q/k norms.
    pub fn qk_norm(&self) -> bool {
        matches!(
            self.architecture,
            Architecture::Qwen3 | Architecture::Gemma3
        )
    }

    /// Whether layers carry Gemma's extra norms after attention and after the MLP.
    pub fn sandwich_norms(&self) -> bool {
        self.architecture == Architecture::Gemma3
    }

    /// Whether norm weights are applied as `1 + w` (stored as offsets from one).
    pub fn norm_offset(&self) -> bool {
        self.architecture == Architecture::Gemma3
    }

    /// The factor embeddings are multiplied by before the first layer, if any: √hidden for
    /// Gemma, rounded to bfloat16 as mlx-lm and the Gemma reference compute it.
    pub fn embedding_scale(&self) -> Option<f32> {
        (self.architecture == Architecture::Gemma3).then(|| {
            let exact = (self.hidden_size as f32).sqrt();
            half::bf16::from_f32(exact).to_f32()
        })
    }

    /// Checks the numbers fit together, naming the one that does not.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_layers),
            ("num_attention_heads", self.num_heads),
            ("num_key_value_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
        ];
        for (name, value) in positive {
            if value <= 0 {
                return Err(format!("{name} is {value}; it must be positive"));
            }
        }
        if self.num_heads % self.num_kv_heads != 0 {
            return Err(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.num_heads, self.num_kv_heads
            ));
        }
        if self.head_dim % 2 != 0 {
            return Err(format!(
                "head_dim {} is odd; RoPE rotates pairs",
                self.head_dim
            ));
        }
        if self.sliding_layers.len() != self.num_layers as usize {
            return Err(format!(
                "{} layer types for {} layers",
                self.sliding_layers.len(),
                self.num_layers
            ));
        }
        if self.sliding_layers.iter().any(|&s| s) && self.sliding_window <= 0 {
            return Err(format!(
                "sliding_window is {} but some layers slide",
                self.sliding_window
            ));
        }
        self.rope.validate("full-attention layers")?;
        self.rope_local.validate("sliding-window layers")?;
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            return Err(format!(
                "rms_norm_eps {} is not positive",
                self.rms_norm_eps
            ));
        }
        Ok(())
    }
}

/// A config object (the top of a `config.json`, or its `text_config`) read strictly: a key of the
/// wrong type is an error that names it; a missing key takes the default the family's
/// transformers class gives it (what the checkpoint's authors meant by leaving it out).
pub struct HfObject<'a> {
    pub map: &'a serde_json::Map<String, serde_json::Value>,
    /// Prepended to key names in errors (`"text_config."` inside a multimodal config).
    pub prefix: &'a str,
}

impl<'a> HfObject<'a> {
    fn key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    fn present(&self, key: &str) -> Option<&'a serde_json::Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn wrong(&self, key: &str, value: &serde_json::Value, what: &str) -> ConfigError {
        ConfigError::Invalid {
            key: self.key(key),
            value: super::keys::shown(value),
            why: format!("is not {what}"),
        }
    }

    /// A required integer.
    pub fn int(&self, key: &str) -> Result<i32, ConfigError> {
        match self.present(key) {
            None => Err(ConfigError::Missing {
                key: self.key(key),
                why: "every checkpoint of the family states it".into(),
            }),
            Some(v) => v
                .as_i64()
                .and_then(|n| i32::try_from(n).ok())
                .ok_or_else(|| self.wrong(key, v, "an integer")),
        }
    }

    pub fn opt_int(&self, key: &str) -> Result<Option<i32>, ConfigError> {
        match self.present(key) {
            None => Ok(None),
            Some(_) => self.int(key).map(Some),
        }
    }

    pub fn int_or(&self, key: &str, default: i32) -> Result<i32, ConfigError> {
        Ok(self.opt_int(key)?.unwrap_or(default))
    }

    pub fn opt_float(&self, key: &str) -> Result<Option<f64>, ConfigError> {
        match self.present(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.wrong(key, v, "a number")),
        }
    }

    pub fn float_or(&self, key: &str, default: f64) -> Result<f64, ConfigError> {
        Ok(self.opt_float(key)?.unwrap_or(default))
    }

    pub fn bool_or(&self, key: &str, default: bool) -> Result<bool, ConfigError> {
        match self.present(key) {
            None => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| self.wrong(key, v, "a boolean")),
        }
    }

    pub fn str_or(&self, key: &str, default: &'a str) -> Result<&'a str, ConfigError> {
        match self.present(key) {
            None => Ok(default),
            Some(v) => v.as_str().ok_or_else(|| self.wrong(key, v, "a string")),
        }
    }

    pub fn get(&self, key: &str) -> Option<&'a serde_json::Value> {
        self.present(key)
    }

    /// A key whose only implemented value is `expected`: any other is refused, naming `why`.
    pub fn require_bool(&self, key: &str, expected: bool, why: &str) -> Result<(), ConfigError> {
        let value = self.bool_or(key, expected)?;
        if value != expected {
            return Err(ConfigError::Unsupported {
                key: self.key(key),
                value: value.to_string(),
                why: why.to_owned(),
            });
        }
        Ok(())
    }

    /// The feed-forward activation under `key`, which must be one the family implements.
    pub fn activation(
        &self,
        key: &str,
        default: &'a str,
        allowed: &[(&str, Activation)],
    ) -> Result<Activation, ConfigError> {
        let name = self.str_or(key, default)?;
        allowed
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, a)| *a)
            .ok_or_else(|| ConfigError::Unsupported {
                key: self.key(key),
                value: format!("{name:?}"),
                why: format!(
                    "is not implemented for this family ({} is)",
                    allowed
                        .iter()
                        .map(|(n, _)| *n)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            })
    }

    /// The longest context, `default` (the family class's) when not stated.
    pub fn max_positions(&self, default: i32) -> Result<Option<i32>, ConfigError> {
        match self.int_or("max_position_embeddings", default)? {
            n if n <= 0 => Err(ConfigError::Invalid {
                key: self.key("max_position_embeddings"),
                value: n.to_string(),
                why: "must be positive".into(),
            }),
            n => Ok(Some(n)),
        }
    }
}

/// Which layers slide, from transformers 5's `layer_types` (`None` when the config has none).
pub fn layer_types(hf: &HfObject<'_>, num_layers: i32) -> Result<Option<Vec<bool>>, ConfigError> {
    let Some(value) = hf.get("layer_types") else {
        return Ok(None);
    };
    let types = value.as_array().ok_or_else(|| ConfigError::Invalid {
        key: hf.key("layer_types"),
        value: super::keys::shown(value),
        why: "is not a list".into(),
    })?;
    if types.len() != num_layers.max(0) as usize {
        return Err(ConfigError::Inconsistent(format!(
            "{}layer_types has {} entries for {num_layers} layers",
            hf.prefix,
            types.len()
        )));
    }
    types
        .iter()
        .map(|t| match t.as_str() {
            Some("sliding_attention") => Ok(true),
            Some("full_attention") => Ok(false),
            _ => Err(ConfigError::Unsupported {
                key: hf.key("layer_types"),
                value: super::keys::shown(t),
                why: "only full_attention and sliding_attention layers are implemented".into(),
            }),
        })
        .collect::<Result<Vec<bool>, ConfigError>>()
        .map(Some)
}

/// The rope of full-attention layers, and of sliding ones where the config gives them their
/// own, from either dialect: transformers 5's `rope_parameters` (one dict, or one per layer
/// type), else the older top-level `rope_theta` and `rope_scaling`. `default_theta` is the
/// family class's default θ, `local_theta` the sliding layers' default base (Gemma 3's
/// `rope_local_base_freq`, already read with its default; `None`: as the full layers). A config
/// holding both dialects must have them agree.
pub fn hf_ropes(
    hf: &HfObject<'_>,
    default_theta: f64,
    local_theta: Option<f64>,
) -> Result<(RopeSpec, RopeSpec), ConfigError> {
    let max = hf.opt_int("max_position_embeddings")?.map(i64::from);
    let top_theta = hf.opt_float("rope_theta")?;
    let old = || -> Result<(RopeSpec, RopeSpec), ConfigError> {
        let full = RopeSpec::from_hf_dict(
            &hf.key("rope_scaling"),
            hf.get("rope_scaling"),
            Some(top_theta.unwrap_or(default_theta)),
            max,
        )?;
        let local = match local_theta {
            Some(theta) => RopeSpec::plain(theta as f32),
            None => full.clone(),
        };
        Ok((full, local))
    };
    let Some(params) = hf.get("rope_parameters") else {
        return old();
    };
    let key = hf.key("rope_parameters");
    let per_type = params.as_object().is_some_and(|m| {
        !m.is_empty()
            && m.values().all(|v| v.is_object())
            && m.keys().all(|k| k.ends_with("_attention"))
    });
    let (full, local) = if per_type {
        let map = params
            .as_object()
            .ok_or_else(|| ConfigError::Inconsistent(key.clone()))?;
        for name in map.keys() {
            if name != "full_attention" && name != "sliding_attention" {
                return Err(ConfigError::Unsupported {
                    key: format!("{key}.{name}"),
                    value: super::keys::shown(&map[name]),
                    why: "only full_attention and sliding_attention layers are implemented".into(),
                });
            }
        }
        let full = RopeSpec::from_hf_dict(
            &format!("{key}.full_attention"),
            map.get("full_attention"),
            Some(top_theta.unwrap_or(default_theta)),
            max,
        )?;
        let local = match map.get("sliding_attention") {
            Some(dict) => RopeSpec::from_hf_dict(
                &format!("{key}.sliding_attention"),
                Some(dict),
                Some(local_theta.unwrap_or(default_theta)),
                max,
            )?,
            None => full.clone(),
        };
        (full, local)
    } else {
        let full = RopeSpec::from_hf_dict(
            &key,
            Some(params),
            Some(top_theta.unwrap_or(default_theta)),
            max,
        )?;
        let local = match local_theta {
            Some(theta) => RopeSpec::plain(theta as f32),
            None => full.clone(),
        };
        (full, local)
    };
    // Older keys beside the new ones (a config converted by hand, or written for both
    // versions) must say the same thing, or which one the authors meant is unknown.
    if top_theta.is_some() || hf.get("rope_scaling").is_some() {
        let (old_full, _) = old()?;
        if old_full != full {
            return Err(ConfigError::Inconsistent(format!(
                "{key} ({full:?}) and the older rope_theta / rope_scaling ({old_full:?}) disagree"
            )));
        }
    }
    Ok((full, local))
}
