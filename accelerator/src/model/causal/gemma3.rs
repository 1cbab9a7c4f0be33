//! Gemma 3 (text): RMSNorms applied as `1 + w`, four per layer (before and after attention and
//! the MLP), embeddings scaled by √hidden, q/k norms, GeGLU (tanh GELU), and local
//! sliding-window layers (their own rope: θ `rope_local_base_freq`, no scaling, in the old
//! dialect; `rope_parameters.sliding_attention` in transformers 5) interleaved with global ones
//! (`rope_theta` and `rope_scaling`, or `rope_parameters.full_attention`: Gemma 3 4B–27B scale
//! them linearly by 8). Scores are scaled by `query_pre_attn_scalar^-½`. Missing keys take
//! `Gemma3TextConfig`'s defaults, which multimodal checkpoints rely on.

use super::config::{
    hf_ropes, layer_types, Activation, Architecture, CausalConfig, ConfigError, HfObject,
};
use super::keys::{audit, check_quantization_config, shown, HF_HARMLESS};
use super::llama::Shape;

/// The keys of a Gemma 3 text config this reader honours.
const HONOURED: &[&str] = &[
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
    "rope_local_base_freq",
    "sliding_window",
    "sliding_window_pattern",
    "_sliding_window_pattern",
    "layer_types",
    "query_pre_attn_scalar",
    "hidden_activation",
    "hidden_act",
    "final_logit_softcapping",
    "attn_logit_softcapping",
    "max_position_embeddings",
    "tie_word_embeddings",
    "attention_bias",
    "use_bidirectional_attention",
];

/// The top-level keys of a multimodal (`model_type: gemma3`) config beside its `text_config`:
/// the vision tower and image tokens, which a text-only read does not use.
pub const MULTIMODAL_KEYS: &[&str] = &[
    "text_config",
    "vision_config",
    "boi_token_index",
    "eoi_token_index",
    "image_token_index",
    "mm_tokens_per_image",
    "tie_word_embeddings",
];

const GELU_TANH: &[(&str, Activation)] = &[("gelu_pytorch_tanh", Activation::GeluTanh)];

/// The config of a `model_type: gemma3_text` object (or a multimodal `gemma3`'s
/// `text_config`, which the caller passes).
pub fn config_from_hf(hf: &HfObject<'_>, ignored: &[String]) -> Result<CausalConfig, ConfigError> {
    let ignored_config_keys = audit(hf.map, "gemma3", hf.prefix, HONOURED, HF_HARMLESS, ignored)?;
    check_quantization_config(hf.map)?;
    if let Some(cap) = hf.get("attn_logit_softcapping") {
        // Gemma 2's attention softcap: Gemma 3 dropped it, and this stack does not apply it.
        return Err(ConfigError::Unsupported {
            key: format!("{}attn_logit_softcapping", hf.prefix),
            value: shown(cap),
            why: "attention soft-capping is not implemented (Gemma 3 has none)".into(),
        });
    }
    hf.require_bool(
        "use_bidirectional_attention",
        false,
        "bidirectional attention (an encoder's) is not implemented",
    )?;
    let activation = hf.activation("hidden_activation", "gelu_pytorch_tanh", GELU_TANH)?;
    if hf.get("hidden_act").is_some() {
        hf.activation("hidden_act", "gelu_pytorch_tanh", GELU_TANH)?;
    }
    // Gemma3TextConfig's defaults (transformers 4.50+), which the multimodal configs of
    // Gemma 3 4B/12B/27B rely on for heads and head size.
    let hidden_size = hf.int("hidden_size")?;
    let num_heads = hf.int_or("num_attention_heads", 8)?;
    let num_layers = hf.int("num_hidden_layers")?;
    let head_dim = hf.int_or("head_dim", 256)?;
    let shape = Shape {
        hidden_size,
        num_layers,
        num_heads,
        num_kv_heads: hf.int_or("num_key_value_heads", 4)?,
        head_dim,
    };
    let sliding_layers = match layer_types(hf, num_layers)? {
        Some(types) => types,
        None => {
            let pattern = match hf.opt_int("sliding_window_pattern")? {
                Some(p) => p,
                None => hf.int_or("_sliding_window_pattern", 6)?,
            };
            if pattern <= 0 {
                return Err(ConfigError::Invalid {
                    key: format!("{}sliding_window_pattern", hf.prefix),
                    value: pattern.to_string(),
                    why: "must be positive".into(),
                });
            }
            (0..num_layers).map(|i| (i + 1) % pattern != 0).collect()
        }
    };
    let local_theta = hf.float_or("rope_local_base_freq", 10_000.0)?;
    let (rope, rope_local) = hf_ropes(hf, 1_000_000.0, Some(local_theta))?;
    let bias = hf.bool_or("attention_bias", false)?;
    let config = CausalConfig {
        architecture: Architecture::Gemma3,
        vocab_size: hf.int_or("vocab_size", 262_208)?,
        hidden_size: shape.hidden_size,
        intermediate_size: hf.int("intermediate_size")?,
        num_layers: shape.num_layers,
        num_heads: shape.num_heads,
        num_kv_heads: shape.num_kv_heads,
        head_dim: shape.head_dim,
        rms_norm_eps: hf.float_or("rms_norm_eps", 1e-6)? as f32,
        rope,
        rope_local,
        sliding_layers,
        sliding_window: hf.int_or("sliding_window", 4096)?,
        attention_scale: (hf.float_or("query_pre_attn_scalar", 256.0)? as f32).powf(-0.5),
        activation,
        tie_word_embeddings: hf.bool_or("tie_word_embeddings", true)?,
        final_logit_softcapping: hf.opt_float("final_logit_softcapping")?.map(|v| v as f32),
        max_position_embeddings: hf.max_positions(131_072)?,
        qkv_bias: bias,
        o_bias: bias,
        ignored_config_keys,
    };
    config.validate().map_err(ConfigError::Inconsistent)?;
    Ok(config)
}
