//! Llama (Llama 2/3.x, SmolLM2) and Mistral: RMSNorm, RoPE (θ and the config's adjustment),
//! grouped-query attention, SwiGLU; Mistral's layers may all attend over a sliding window. The
//! stack is the shared one in `blocks`; what is the family's own is the reading of its
//! `config.json`, in either transformers dialect, with every key accounted for
//! (docs/models.md, "Configs").

use super::config::{
    hf_ropes, Activation, Architecture, CausalConfig, ConfigError, HfObject, RopeSpec,
};
use super::keys::{audit, check_quantization_config, HF_HARMLESS};

/// The keys every Llama-descended config (Llama, Mistral, Qwen2, Qwen3) states alike.
pub(super) const SHARED_KEYS: &[&str] = &[
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "rms_norm_eps",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "max_position_embeddings",
    "tie_word_embeddings",
    "hidden_act",
    "attention_bias",
];

/// Llama's and Mistral's own keys beside [`SHARED_KEYS`].
const OWN_KEYS: &[&str] = &[
    "mlp_bias",
    "sliding_window",
    // SmolLM2's: its rope is not interleaved (true would be; refused below).
    "rope_interleaved",
];

/// Keys that SmolLM2's configs carry for other runtimes and that change nothing here.
const LLAMA_HARMLESS: &[&str] = &["is_llama_config", "transformers.js_config"];

/// The config of a `model_type: llama` or `mistral` object; `ignored`: keys the user said to
/// skip.
pub fn config_from_hf(
    hf: &HfObject<'_>,
    model_type: &str,
    ignored: &[String],
) -> Result<CausalConfig, ConfigError> {
    let mistral = model_type == "mistral";
    let family = if mistral { "mistral" } else { "llama" };
    let harmless: Vec<&str> = HF_HARMLESS.iter().chain(LLAMA_HARMLESS).copied().collect();
    let honoured: Vec<&str> = SHARED_KEYS.iter().chain(OWN_KEYS).copied().collect();
    let ignored_config_keys = audit(hf.map, family, hf.prefix, &honoured, &harmless, ignored)?;
    check_quantization_config(hf.map)?;
    hf.require_bool("mlp_bias", false, "biases in the MLP are not implemented")?;
    hf.require_bool(
        "rope_interleaved",
        false,
        "an interleaved rope is not implemented (Hugging Face's rotate-half order is)",
    )?;
    let bias = hf.bool_or("attention_bias", false)?;
    let (rope, rope_local) = hf_ropes(hf, 10_000.0, None)?;
    // LlamaConfig has no sliding window; MistralConfig's applies to every layer.
    let window = if mistral {
        hf.opt_int("sliding_window")?
    } else {
        match hf.get("sliding_window") {
            None => None,
            Some(value) => {
                return Err(ConfigError::Unsupported {
                    key: format!("{}sliding_window", hf.prefix),
                    value: super::keys::shown(value),
                    why: "Llama layers have no sliding window (a Mistral config would say \
                          model_type mistral)"
                        .into(),
                })
            }
        }
    };
    let layers = hf.int("num_hidden_layers")?.max(0) as usize;
    descended(
        hf,
        Descended {
            architecture: Architecture::Llama,
            sliding_layers: vec![window.is_some(); layers],
            sliding_window: window.unwrap_or(0),
            ropes: (rope, rope_local),
            qkv_bias: bias,
            o_bias: bias,
            tie_default: false,
            max_positions_default: 2_048,
            ignored_config_keys,
        },
    )
}

/// What a Llama-descended family settles itself; [`descended`] reads the rest, the same way
/// for all of them.
pub(super) struct Descended {
    pub architecture: Architecture,
    pub sliding_layers: Vec<bool>,
    pub sliding_window: i32,
    /// Full-attention and sliding layers' rope.
    pub ropes: (RopeSpec, RopeSpec),
    pub qkv_bias: bool,
    pub o_bias: bool,
    /// The family class's `tie_word_embeddings` and `max_position_embeddings` defaults.
    pub tie_default: bool,
    pub max_positions_default: i32,
    pub ignored_config_keys: Vec<String>,
}

/// The configuration of a Llama-descended family: SwiGLU, `head_dim^-½` scores, no soft-cap.
pub(super) fn descended(hf: &HfObject<'_>, own: Descended) -> Result<CausalConfig, ConfigError> {
    let shape = Shape::read(hf)?;
    let (rope, rope_local) = own.ropes;
    let config = CausalConfig {
        architecture: own.architecture,
        vocab_size: hf.int("vocab_size")?,
        hidden_size: shape.hidden_size,
        intermediate_size: hf.int("intermediate_size")?,
        num_layers: shape.num_layers,
        num_heads: shape.num_heads,
        num_kv_heads: shape.num_kv_heads,
        head_dim: shape.head_dim,
        rms_norm_eps: hf.float_or("rms_norm_eps", 1e-6)? as f32,
        rope,
        rope_local,
        sliding_layers: own.sliding_layers,
        sliding_window: own.sliding_window,
        attention_scale: (shape.head_dim as f32).powf(-0.5),
        activation: hf.activation("hidden_act", "silu", &[("silu", Activation::Silu)])?,
        tie_word_embeddings: hf.bool_or("tie_word_embeddings", own.tie_default)?,
        final_logit_softcapping: None,
        max_position_embeddings: hf.max_positions(own.max_positions_default)?,
        qkv_bias: own.qkv_bias,
        o_bias: own.o_bias,
        ignored_config_keys: own.ignored_config_keys,
    };
    config.validate().map_err(ConfigError::Inconsistent)?;
    Ok(config)
}

/// The attention geometry every Llama-descended config states the same way.
pub(super) struct Shape {
    pub hidden_size: i32,
    pub num_layers: i32,
    pub num_heads: i32,
    pub num_kv_heads: i32,
    pub head_dim: i32,
}

impl Shape {
    pub(super) fn read(hf: &HfObject<'_>) -> Result<Shape, ConfigError> {
        let hidden_size = hf.int("hidden_size")?;
        let num_heads = hf.int("num_attention_heads")?;
        if num_heads <= 0 {
            return Err(ConfigError::Invalid {
                key: format!("{}num_attention_heads", hf.prefix),
                value: num_heads.to_string(),
                why: "must be positive".into(),
            });
        }
        Ok(Shape {
            hidden_size,
            num_layers: hf.int("num_hidden_layers")?,
            num_heads,
            num_kv_heads: hf.int_or("num_key_value_heads", num_heads)?,
            head_dim: hf.int_or("head_dim", hidden_size / num_heads)?,
        })
    }
}
