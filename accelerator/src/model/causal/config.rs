//! What a causal chat model's forward pass needs, flattened from wherever the checkpoint keeps
//! it: a Hugging Face `config.json` (the architecture files read their own keys) or a GGUF's
//! metadata (`checkpoint::causal::gguf`).

/// The architectures the causal family covers (docs/logit-read.md, "Models").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    /// Llama 2/3, SmolLM2, Mistral-style dense models: RMSNorm, RoPE, GQA, SwiGLU.
    Llama,
    /// Qwen3: Llama plus per-head RMSNorm on queries and keys.
    Qwen3,
    /// Gemma 3 (text): `(1 + w)` norms around both blocks, embeddings scaled by √hidden,
    /// q/k norms, GeGLU, interleaved sliding-window and global layers.
    Gemma3,
}

impl Architecture {
    /// The name used in logs, errors and the model's fingerprint.
    pub fn name(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Qwen3 => "qwen3",
            Architecture::Gemma3 => "gemma3",
        }
    }

    /// From a Hugging Face `model_type` (the top level's, or `text_config`'s).
    pub fn from_model_type(model_type: &str) -> Option<Architecture> {
        Some(match model_type {
            "llama" | "mistral" => Architecture::Llama,
            "qwen3" => Architecture::Qwen3,
            "gemma3_text" | "gemma3" => Architecture::Gemma3,
            _ => return None,
        })
    }

    /// From a GGUF's `general.architecture`.
    pub fn from_gguf(name: &str) -> Option<Architecture> {
        Some(match name {
            "llama" => Architecture::Llama,
            "qwen3" => Architecture::Qwen3,
            "gemma3" => Architecture::Gemma3,
            _ => return None,
        })
    }
}

/// How positions rotate on one kind of layer.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeSpec {
    /// Base θ.
    pub theta: f32,
    /// Frequency adjustment.
    pub scaling: RopeScaling,
}

/// RoPE frequency adjustments found in chat models' configs.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    /// Plain `θ^(-2i/d)`.
    None,
    /// Positions divided by `factor` (Gemma 3's global layers).
    Linear { factor: f32 },
    /// Llama 3.1's smooth interpolation between low and high frequencies.
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_max_position_embeddings: f32,
    },
    /// Each pair's period multiplied by its own factor: llama.cpp's `rope_freqs` tensor, in
    /// which its converter stores the Llama 3 adjustment already computed.
    Factors(Vec<f32>),
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
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            return Err(format!(
                "rms_norm_eps {} is not positive",
                self.rms_norm_eps
            ));
        }
        Ok(())
    }
}

/// `rope_scaling` as Hugging Face configs write it (`rope_type`, or the older `type`).
pub fn rope_scaling_from_json(value: Option<&serde_json::Value>) -> Result<RopeScaling, String> {
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok(RopeScaling::None);
    };
    let kind = value
        .get("rope_type")
        .or_else(|| value.get("type"))
        .and_then(|v| v.as_str())
        .unwrap_or("default");
    let number = |key: &str| -> Result<f32, String> {
        value
            .get(key)
            .and_then(|v| v.as_f64())
            .map(|v| v as f32)
            .ok_or_else(|| format!("rope_scaling of type {kind} has no number {key}"))
    };
    match kind {
        "default" => Ok(RopeScaling::None),
        "linear" => Ok(RopeScaling::Linear {
            factor: number("factor")?,
        }),
        "llama3" => Ok(RopeScaling::Llama3 {
            factor: number("factor")?,
            low_freq_factor: number("low_freq_factor")?,
            high_freq_factor: number("high_freq_factor")?,
            original_max_position_embeddings: number("original_max_position_embeddings")?,
        }),
        other => Err(format!(
            "rope_scaling type {other:?} is not supported (default, linear and llama3 are)"
        )),
    }
}

/// Typed reads of a `config.json` object, each error naming the key.
pub struct JsonConfig<'a> {
    pub value: &'a serde_json::Value,
}

impl JsonConfig<'_> {
    pub fn int(&self, key: &str) -> Result<i32, String> {
        self.value
            .get(key)
            .and_then(|v| v.as_i64())
            .and_then(|v| i32::try_from(v).ok())
            .ok_or_else(|| format!("config.json has no integer {key}"))
    }

    pub fn int_or(&self, key: &str, default: i32) -> Result<i32, String> {
        match self.value.get(key) {
            None | Some(serde_json::Value::Null) => Ok(default),
            Some(_) => self.int(key),
        }
    }

    pub fn float_or(&self, key: &str, default: f32) -> Result<f32, String> {
        match self.value.get(key) {
            None | Some(serde_json::Value::Null) => Ok(default),
            Some(v) => v
                .as_f64()
                .map(|v| v as f32)
                .ok_or_else(|| format!("config.json's {key} is not a number")),
        }
    }

    pub fn optional_float(&self, key: &str) -> Result<Option<f32>, String> {
        match self.value.get(key) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(v) => v
                .as_f64()
                .map(|v| Some(v as f32))
                .ok_or_else(|| format!("config.json's {key} is not a number")),
        }
    }

    pub fn bool_or(&self, key: &str, default: bool) -> Result<bool, String> {
        match self.value.get(key) {
            None | Some(serde_json::Value::Null) => Ok(default),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| format!("config.json's {key} is not a boolean")),
        }
    }

    pub fn get(&self, key: &str) -> Option<&serde_json::Value> {
        self.value.get(key)
    }
}
