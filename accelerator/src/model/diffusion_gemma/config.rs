//! The model configuration, read from a checkpoint's `config.json` (top level + `text_config`).
//!
//! Accepts both spellings of the full-attention geometry: the released checkpoint's
//! `num_global_key_value_heads` / `global_head_dim`, and the `per_layer_config` map that
//! transformers writes when it serialises a config (docs/model.md, "Configuration").

use std::collections::HashMap;

use serde::Deserialize;

/// Which attention a layer uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionKind {
    /// Local attention over the last `sliding_window` positions (encoder) / the last
    /// `sliding_window - 1` prompt positions (decoder).
    Sliding,
    /// Attention over the whole sequence.
    Full,
}

/// RoPE flavour of one attention kind.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeConfig {
    /// `rope_theta`.
    pub theta: f32,
    /// Fraction of the frequency pairs that rotate ("proportional" RoPE); 1.0 for default RoPE.
    pub partial_rotary_factor: f32,
}

/// Geometry of one layer's attention.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerConfig {
    /// Sliding or full attention.
    pub kind: AttentionKind,
    /// Per-head dimension.
    pub head_dim: i32,
    /// Number of key/value heads.
    pub num_kv_heads: i32,
    /// Values are the raw `k_proj` output (no `v_proj`): full layers with `attention_k_eq_v`.
    pub k_eq_v: bool,
}

/// Everything the forward pass needs, flattened from the checkpoint's config.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Vocabulary size (rows of the embedding).
    pub vocab_size: i32,
    /// Residual width.
    pub hidden_size: i32,
    /// Dense MLP (and self-conditioning MLP) width.
    pub intermediate_size: i32,
    /// Per-expert MLP width.
    pub moe_intermediate_size: i32,
    /// Number of experts.
    pub num_experts: i32,
    /// Experts per token.
    pub top_k_experts: i32,
    /// Query heads (both layer kinds).
    pub num_attention_heads: i32,
    /// Sliding window of the encoder's local attention.
    pub sliding_window: i32,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f32,
    /// Final logit softcap (30 for the released model).
    pub final_logit_softcapping: Option<f32>,
    /// Per-layer attention geometry.
    pub layers: Vec<LayerConfig>,
    /// RoPE of sliding layers.
    pub rope_sliding: RopeConfig,
    /// RoPE of full layers.
    pub rope_full: RopeConfig,
    /// Generation canvas length (top level; a read uses its own canvas width).
    pub canvas_length: Option<i32>,
    /// Longest sequence (prompt + canvas) the positions were trained for.
    pub max_position_embeddings: Option<i32>,
    /// Padding token id.
    pub pad_token_id: Option<u32>,
    /// Begin-of-sequence token id.
    pub bos_token_id: Option<u32>,
}

/// Why a `config.json` could not be turned into a [`Config`].
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Not valid JSON or a required field is missing / mistyped.
    #[error("config.json: {0}")]
    Json(#[from] serde_json::Error),
    /// Valid JSON that does not describe a DiffusionGemma this code can run.
    #[error("config.json: {0}")]
    Invalid(String),
}

#[derive(Deserialize)]
struct RawTop {
    text_config: RawText,
    canvas_length: Option<i32>,
    tie_word_embeddings: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
struct RawPerLayer {
    head_dim: Option<i32>,
    num_key_value_heads: Option<i32>,
}

#[derive(Deserialize)]
struct RawRope {
    rope_theta: f32,
    #[serde(default)]
    rope_type: Option<String>,
    #[serde(default)]
    partial_rotary_factor: Option<f32>,
}

#[derive(Deserialize)]
struct RawRopeParameters {
    sliding_attention: RawRope,
    full_attention: RawRope,
}

/// The attention geometry of every layer as `text_config` spells it. The one reading of layer
/// types and per-layer shapes: the model ([`Config`]) and the checkpoint's tensor inventory
/// (`checkpoint::dims`) both take their layers from [`LayerGeometry::layers`].
#[derive(Debug, Clone, Deserialize)]
pub struct LayerGeometry {
    num_hidden_layers: usize,
    layer_types: Option<Vec<String>>,
    num_key_value_heads: i32,
    head_dim: i32,
    num_global_key_value_heads: Option<i32>,
    global_head_dim: Option<i32>,
    per_layer_config: Option<HashMap<String, RawPerLayer>>,
    attention_k_eq_v: Option<bool>,
}

/// The released layer pattern, for a config without `layer_types`: 5 sliding then 1 full,
/// repeated, with the last layer forced to full (as transformers does).
pub fn layer_types_for(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            if i % 6 == 5 || i + 1 == n {
                "full_attention"
            } else {
                "sliding_attention"
            }
            .to_owned()
        })
        .collect()
}

impl LayerGeometry {
    /// Each layer's attention kind and shape. Full layers take `per_layer_config`'s shape, else
    /// the `global_*` one, else the sliding layers'.
    pub fn layers(&self) -> Result<Vec<LayerConfig>, ConfigError> {
        let n = self.num_hidden_layers;
        let layer_types = match &self.layer_types {
            Some(types) => types.clone(),
            None => layer_types_for(n),
        };
        if layer_types.len() != n {
            return Err(ConfigError::Invalid(format!(
                "layer_types has {} entries for {n} layers",
                layer_types.len(),
            )));
        }
        // transformers treats a missing `attention_k_eq_v` as true (docs/model.md).
        let k_eq_v = self.attention_k_eq_v.unwrap_or(true);
        let mut layers = Vec::with_capacity(n);
        for (i, ty) in layer_types.iter().enumerate() {
            let kind = match ty.as_str() {
                "sliding_attention" => AttentionKind::Sliding,
                "full_attention" => AttentionKind::Full,
                other => {
                    return Err(ConfigError::Invalid(format!(
                        "layer {i}: unknown layer type {other:?}"
                    )))
                }
            };
            let layer = match kind {
                AttentionKind::Sliding => LayerConfig {
                    kind,
                    head_dim: self.head_dim,
                    num_kv_heads: self.num_key_value_heads,
                    k_eq_v: false,
                },
                AttentionKind::Full => {
                    let over = self
                        .per_layer_config
                        .as_ref()
                        .and_then(|p| p.get(&i.to_string()));
                    LayerConfig {
                        kind,
                        head_dim: over
                            .and_then(|o| o.head_dim)
                            .or(self.global_head_dim)
                            .unwrap_or(self.head_dim),
                        num_kv_heads: over
                            .and_then(|o| o.num_key_value_heads)
                            .or(self.num_global_key_value_heads)
                            .unwrap_or(self.num_key_value_heads),
                        k_eq_v,
                    }
                }
            };
            if layer.head_dim <= 0 || layer.num_kv_heads <= 0 {
                return Err(ConfigError::Invalid(format!(
                    "layer {i}: head_dim {} and {} key/value heads must be positive",
                    layer.head_dim, layer.num_kv_heads
                )));
            }
            layers.push(layer);
        }
        Ok(layers)
    }
}

#[derive(Deserialize)]
struct RawText {
    vocab_size: i32,
    hidden_size: i32,
    intermediate_size: i32,
    moe_intermediate_size: i32,
    #[serde(flatten)]
    geometry: LayerGeometry,
    num_attention_heads: i32,
    sliding_window: i32,
    rope_parameters: RawRopeParameters,
    num_experts: i32,
    top_k_experts: i32,
    rms_norm_eps: f32,
    final_logit_softcapping: Option<f32>,
    hidden_activation: Option<String>,
    tie_word_embeddings: Option<bool>,
    max_position_embeddings: Option<i32>,
    pad_token_id: Option<u32>,
    bos_token_id: Option<u32>,
}

impl Config {
    /// Parses the text of a checkpoint's `config.json`.
    pub fn from_json(text: &str) -> Result<Config, ConfigError> {
        Self::from_value(&serde_json::from_str(text)?)
    }

    /// The config a checkpoint's parsed `config.json` describes.
    pub fn from_value(value: &serde_json::Value) -> Result<Config, ConfigError> {
        let raw = RawTop::deserialize(value)?;
        let t = raw.text_config;
        // The unembedding is the embedding matrix; an untied lm_head would be silently ignored.
        if raw.tie_word_embeddings == Some(false) || t.tie_word_embeddings == Some(false) {
            return Err(ConfigError::Invalid(
                "tie_word_embeddings is false; only the tied unembedding is supported".into(),
            ));
        }
        if let Some(act) = &t.hidden_activation {
            if act != "gelu_pytorch_tanh" {
                return Err(ConfigError::Invalid(format!(
                    "hidden_activation {act:?} is not supported (only gelu_pytorch_tanh)"
                )));
            }
        }
        let layers = t.geometry.layers()?;
        let rope = |r: &RawRope, name: &str| -> Result<RopeConfig, ConfigError> {
            match r.rope_type.as_deref().unwrap_or("default") {
                "default" => Ok(RopeConfig {
                    theta: r.rope_theta,
                    partial_rotary_factor: 1.0,
                }),
                "proportional" => Ok(RopeConfig {
                    theta: r.rope_theta,
                    partial_rotary_factor: r.partial_rotary_factor.unwrap_or(1.0),
                }),
                other => Err(ConfigError::Invalid(format!(
                    "rope_parameters.{name}: rope_type {other:?} is not supported"
                ))),
            }
        };
        Ok(Config {
            vocab_size: t.vocab_size,
            hidden_size: t.hidden_size,
            intermediate_size: t.intermediate_size,
            moe_intermediate_size: t.moe_intermediate_size,
            num_experts: t.num_experts,
            top_k_experts: t.top_k_experts,
            num_attention_heads: t.num_attention_heads,
            sliding_window: t.sliding_window,
            rms_norm_eps: t.rms_norm_eps,
            final_logit_softcapping: t.final_logit_softcapping,
            layers,
            rope_sliding: rope(&t.rope_parameters.sliding_attention, "sliding_attention")?,
            rope_full: rope(&t.rope_parameters.full_attention, "full_attention")?,
            canvas_length: raw.canvas_length,
            max_position_embeddings: t.max_position_embeddings,
            pad_token_id: t.pad_token_id,
            bos_token_id: t.bos_token_id,
        })
    }

    /// Number of transformer layers.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RELEASED_TEXT: &str = r#"{"text_config": {
        "vocab_size": 262144, "hidden_size": 2816, "intermediate_size": 2112,
        "moe_intermediate_size": 704, "num_hidden_layers": 6, "num_attention_heads": 16,
        "num_key_value_heads": 8, "head_dim": 256, "num_global_key_value_heads": 2,
        "global_head_dim": 512, "sliding_window": 1024, "num_experts": 128, "top_k_experts": 8,
        "rms_norm_eps": 1e-6, "final_logit_softcapping": 30.0,
        "layer_types": ["sliding_attention","sliding_attention","sliding_attention",
                        "sliding_attention","sliding_attention","full_attention"],
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "rope_theta": 1000000.0,
                               "partial_rotary_factor": 0.25}}}}"#;

    #[test]
    fn global_spelling_and_missing_k_eq_v() -> Result<(), ConfigError> {
        let c = Config::from_json(RELEASED_TEXT)?;
        assert_eq!(c.layers[0].head_dim, 256);
        assert_eq!(c.layers[0].num_kv_heads, 8);
        assert!(!c.layers[0].k_eq_v);
        assert_eq!(c.layers[5].kind, AttentionKind::Full);
        assert_eq!(c.layers[5].head_dim, 512);
        assert_eq!(c.layers[5].num_kv_heads, 2);
        assert!(c.layers[5].k_eq_v, "a missing attention_k_eq_v means true");
        assert_eq!(c.rope_full.partial_rotary_factor, 0.25);
        Ok(())
    }

    #[test]
    fn per_layer_spelling() -> Result<(), Box<dyn std::error::Error>> {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/tiny-hf/config.json"
        ))?;
        let c = Config::from_json(&text)?;
        assert_eq!(c.layers[5].head_dim, 32);
        assert_eq!(c.layers[5].num_kv_heads, 1);
        assert_eq!(c.layers[4].head_dim, 16);
        assert_eq!(c.layers[4].num_kv_heads, 2);
        Ok(())
    }
}
