//! Qwen3 (dense): Llama's stack with a per-head RMSNorm on queries and keys before RoPE, and a
//! `head_dim` of its own (not `hidden / heads`). Its chat template has a thinking switch, which
//! the read turns off (`tokenizer::chat`).

use super::config::{Architecture, CausalConfig};

/// The config of a `model_type: qwen3` checkpoint.
pub fn config_from_json(value: &serde_json::Value) -> Result<CausalConfig, String> {
    super::llama::base_config(value, Architecture::Qwen3, 1e-6, false)
}
