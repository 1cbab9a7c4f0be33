//! Qwen3 (dense): Llama's stack with a per-head RMSNorm on queries and keys before RoPE, and a
//! `head_dim` of its own (not `hidden / heads`); `attention_bias` puts biases on all four
//! attention projections. Its chat template has a thinking switch, which the read turns off
//! (`tokenizer::chat`).

use super::config::{hf_ropes, Architecture, CausalConfig, ConfigError, HfObject};
use super::keys::{audit, check_quantization_config, HF_HARMLESS};
use super::llama::{descended, Descended};

/// The config of a `model_type: qwen3` object.
pub fn config_from_hf(hf: &HfObject<'_>, ignored: &[String]) -> Result<CausalConfig, ConfigError> {
    let honoured = super::qwen2::honoured();
    let ignored_config_keys = audit(hf.map, "qwen3", hf.prefix, &honoured, HF_HARMLESS, ignored)?;
    check_quantization_config(hf.map)?;
    let (sliding_layers, sliding_window) = super::qwen2::sliding(hf, hf.int("num_hidden_layers")?)?;
    let bias = hf.bool_or("attention_bias", false)?;
    descended(
        hf,
        Descended {
            architecture: Architecture::Qwen3,
            sliding_layers,
            sliding_window,
            ropes: hf_ropes(hf, 10_000.0, None)?,
            qkv_bias: bias,
            o_bias: bias,
            tie_default: false,
            max_positions_default: 32_768,
            ignored_config_keys,
        },
    )
}
