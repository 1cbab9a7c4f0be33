//! Gemma 3 (text): RMSNorms applied as `1 + w`, four per layer (before and after attention and
//! the MLP), embeddings scaled by √hidden, q/k norms, GeGLU (tanh GELU), and local
//! sliding-window layers (their own RoPE base, no scaling) interleaved with global ones (the
//! config's `rope_theta` and `rope_scaling`). Scores are scaled by `query_pre_attn_scalar^-½`.

use super::config::{
    rope_scaling_from_json, Activation, Architecture, CausalConfig, JsonConfig, RopeScaling,
    RopeSpec,
};

/// The config of a `model_type: gemma3_text` checkpoint (or a multimodal `gemma3` one's
/// `text_config`, which the caller passes).
pub fn config_from_json(value: &serde_json::Value) -> Result<CausalConfig, String> {
    let json = JsonConfig { value };
    if json.optional_float("attn_logit_softcapping")?.is_some() {
        // Gemma 2's attention softcap: Gemma 3 dropped it, and this stack does not apply it.
        return Err("attn_logit_softcapping is set; Gemma 3 has none and it is not applied".into());
    }
    let hidden_size = json.int("hidden_size")?;
    let num_heads = json.int_or("num_attention_heads", 8)?;
    let num_layers = json.int("num_hidden_layers")?;
    let head_dim = json.int_or("head_dim", 256)?;
    let sliding_layers = match json.get("layer_types").and_then(|v| v.as_array()) {
        Some(types) => types
            .iter()
            .map(|t| match t.as_str() {
                Some("sliding_attention") => Ok(true),
                Some("full_attention") => Ok(false),
                other => Err(format!("layer_types holds {other:?}")),
            })
            .collect::<Result<Vec<bool>, String>>()?,
        None => {
            let pattern = json.int_or("sliding_window_pattern", 6)?.max(1);
            (0..num_layers).map(|i| (i + 1) % pattern != 0).collect()
        }
    };
    let config = CausalConfig {
        architecture: Architecture::Gemma3,
        vocab_size: json.int_or("vocab_size", 262_208)?,
        hidden_size,
        intermediate_size: json.int("intermediate_size")?,
        num_layers,
        num_heads,
        num_kv_heads: json.int_or("num_key_value_heads", 4)?,
        head_dim,
        rms_norm_eps: json.float_or("rms_norm_eps", 1e-6)?,
        rope: RopeSpec {
            theta: json.float_or("rope_theta", 1_000_000.0)?,
            scaling: rope_scaling_from_json(json.get("rope_scaling"))?,
        },
        rope_local: RopeSpec {
            theta: json.float_or("rope_local_base_freq", 10_000.0)?,
            scaling: RopeScaling::None,
        },
        sliding_layers,
        sliding_window: json.int_or("sliding_window", 4096)?,
        attention_scale: json
            .float_or("query_pre_attn_scalar", head_dim as f32)?
            .powf(-0.5),
        activation: Activation::GeluTanh,
        tie_word_embeddings: json.bool_or("tie_word_embeddings", true)?,
        final_logit_softcapping: json.optional_float("final_logit_softcapping")?,
        max_position_embeddings: json
            .int_or("max_position_embeddings", 0)
            .ok()
            .filter(|&n| n > 0),
    };
    config.validate()?;
    Ok(config)
}
