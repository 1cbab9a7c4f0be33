//! Llama (Llama 2/3.x, SmolLM2, Mistral-style dense models): RMSNorm, RoPE (θ and the Llama 3
//! frequency adjustment from the config), grouped-query attention, SwiGLU. The stack is the
//! shared one in `blocks`; what is Llama's own is the reading of its `config.json`.

use super::config::{
    rope_scaling_from_json, Activation, Architecture, CausalConfig, JsonConfig, RopeSpec,
};

/// The config of a `model_type: llama` (or `mistral`) checkpoint.
pub fn config_from_json(value: &serde_json::Value) -> Result<CausalConfig, String> {
    base_config(value, Architecture::Llama, 1e-6, false)
}

/// The keys Llama and its descendants (Qwen3) share, with the family's own defaults.
pub(super) fn base_config(
    value: &serde_json::Value,
    architecture: Architecture,
    default_eps: f32,
    default_tied: bool,
) -> Result<CausalConfig, String> {
    let json = JsonConfig { value };
    let hidden_size = json.int("hidden_size")?;
    let num_heads = json.int("num_attention_heads")?;
    let num_layers = json.int("num_hidden_layers")?;
    if num_heads <= 0 {
        return Err(format!("num_attention_heads is {num_heads}"));
    }
    let rope = RopeSpec {
        theta: json.float_or("rope_theta", 10_000.0)?,
        scaling: rope_scaling_from_json(json.get("rope_scaling"))?,
    };
    let head_dim = json.int_or("head_dim", hidden_size / num_heads)?;
    let config = CausalConfig {
        architecture,
        vocab_size: json.int("vocab_size")?,
        hidden_size,
        intermediate_size: json.int("intermediate_size")?,
        num_layers,
        num_heads,
        num_kv_heads: json.int_or("num_key_value_heads", num_heads)?,
        head_dim,
        rms_norm_eps: json.float_or("rms_norm_eps", default_eps)?,
        rope_local: rope.clone(),
        rope,
        sliding_layers: vec![false; num_layers.max(0) as usize],
        sliding_window: 0,
        attention_scale: (head_dim as f32).powf(-0.5),
        activation: Activation::Silu,
        tie_word_embeddings: json.bool_or("tie_word_embeddings", default_tied)?,
        final_logit_softcapping: None,
        max_position_embeddings: json
            .int_or("max_position_embeddings", 0)
            .ok()
            .filter(|&n| n > 0),
    };
    config.validate()?;
    Ok(config)
}
