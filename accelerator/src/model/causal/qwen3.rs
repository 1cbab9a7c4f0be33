//! Qwen3 (dense): Llama's stack with a per-head RMSNorm on queries and keys before RoPE, and a
//! `head_dim` of its own (not `hidden / heads`); `attention_bias` puts biases on all four
//! attention projections. Its chat template has a thinking switch, which the read turns off
//! (`tokenizer::chat`).

use super::config::{hf_ropes, Activation, Architecture, CausalConfig, ConfigError, HfObject};
use super::keys::{audit, check_quantization_config, HF_HARMLESS};
use super::llama::Shape;

/// The config of a `model_type: qwen3` object.
pub fn config_from_hf(hf: &HfObject<'_>, ignored: &[String]) -> Result<CausalConfig, ConfigError> {
    let honoured = super::qwen2::HONOURED;
    let ignored_config_keys = audit(hf.map, "qwen3", hf.prefix, honoured, HF_HARMLESS, ignored)?;
    check_quantization_config(hf.map)?;
    let shape = Shape::read(hf)?;
    let (rope, rope_local) = hf_ropes(hf, 10_000.0, None)?;
    let (sliding_layers, sliding_window) = super::qwen2::sliding(hf, shape.num_layers)?;
    let bias = hf.bool_or("attention_bias", false)?;
    let config = CausalConfig {
        architecture: Architecture::Qwen3,
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
        sliding_layers,
        sliding_window,
        attention_scale: (shape.head_dim as f32).powf(-0.5),
        activation: hf.activation("hidden_act", "silu", &[("silu", Activation::Silu)])?,
        tie_word_embeddings: hf.bool_or("tie_word_embeddings", false)?,
        final_logit_softcapping: None,
        max_position_embeddings: hf.max_positions(32_768)?,
        qkv_bias: bias,
        o_bias: bias,
        ignored_config_keys,
    };
    config.validate().map_err(ConfigError::Inconsistent)?;
    Ok(config)
}
