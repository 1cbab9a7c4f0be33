//! The shapes a DiffusionGemma checkpoint must have, read from its `config.json`, and the list
//! of its tensors (docs/model.md, "Tensor names"). Writers, the converter and the layout validators all
//! work from this one inventory, so they cannot disagree about a name or a shape.

pub use crate::model::diffusion_gemma::config::layer_types_for;
use crate::model::diffusion_gemma::config::{AttentionKind, LayerGeometry};
use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum DimsError {
    #[error("config.json: text_config.{0} is missing or not a positive integer")]
    Missing(String),
    #[error("config.json: {0}")]
    Invalid(String),
}

/// Attention shape of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerDims {
    pub sliding: bool,
    pub head_dim: usize,
    pub kv_heads: usize,
    /// Full layers of the released model have no `v_proj` (values are the raw `k_proj` output).
    pub has_v_proj: bool,
}

/// Every dimension that decides a tensor shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelDims {
    pub vocab: usize,
    pub hidden: usize,
    pub intermediate: usize,
    pub moe_intermediate: usize,
    pub heads: usize,
    pub experts: usize,
    pub top_k: usize,
    pub layers: Vec<LayerDims>,
}

fn uint(tc: &Value, key: &str) -> Result<usize, DimsError> {
    tc.get(key)
        .and_then(Value::as_u64)
        .filter(|&v| v > 0)
        .map(|v| v as usize)
        .ok_or_else(|| DimsError::Missing(key.to_string()))
}

impl ModelDims {
    /// Read from a top-level `config.json` (with `text_config`) or a bare text config. The
    /// layers' attention shapes come from the model's own reading of the config
    /// ([`LayerGeometry`]: both spellings of the full-attention shape, the default layer
    /// pattern), so the inventory and the model cannot disagree about a layer.
    pub fn from_config(config: &Value) -> Result<Self, DimsError> {
        let tc = config.get("text_config").unwrap_or(config);
        uint(tc, "num_hidden_layers")?;
        uint(tc, "head_dim")?;
        uint(tc, "num_key_value_heads")?;
        let invalid = |e: &dyn std::fmt::Display| DimsError::Invalid(e.to_string());
        let geometry = LayerGeometry::deserialize(tc).map_err(|e| invalid(&e))?;
        let layers = geometry
            .layers()
            .map_err(|e| invalid(&e))?
            .into_iter()
            .map(|l| LayerDims {
                sliding: l.kind == AttentionKind::Sliding,
                // Checked positive by `layers`.
                head_dim: l.head_dim as usize,
                kv_heads: l.num_kv_heads as usize,
                // Values are the raw `k_proj` output only in full layers with `k_eq_v`.
                has_v_proj: !l.k_eq_v,
            })
            .collect();
        Ok(Self {
            vocab: uint(tc, "vocab_size")?,
            hidden: uint(tc, "hidden_size")?,
            intermediate: uint(tc, "intermediate_size")?,
            moe_intermediate: uint(tc, "moe_intermediate_size")?,
            heads: uint(tc, "num_attention_heads")?,
            experts: uint(tc, "num_experts")?,
            top_k: uint(tc, "top_k_experts")?,
            layers,
        })
    }

    /// Every tensor of the HF layout, in `save_pretrained`'s grouping (decoder first, then the
    /// encoder's layer scalars), with the initialisation a random checkpoint uses.
    pub fn tensors(&self) -> Vec<TensorSpec> {
        let (h, i, mi, e) = (
            self.hidden,
            self.intermediate,
            self.moe_intermediate,
            self.experts,
        );
        let hf = h as f32;
        let mut v = Vec::new();
        let mut add = |name: String, shape: Vec<usize>, role: Role, init: Init| {
            v.push(TensorSpec {
                name,
                shape,
                role,
                init,
            })
        };
        let around = Init::Around {
            center: 1.0,
            rel: 0.1,
        };
        // Embedding std 3/sqrt(H): x·sqrt(H) has rms ~3 and tied logits have std ~3, so the
        // softcap is mildly active (docs/checkpoint-layouts.md, "Random checkpoints").
        add(
            "model.decoder.embed_tokens.weight".into(),
            vec![self.vocab, h],
            Role::Embedding,
            Init::Normal(3.0 / hf.sqrt()),
        );
        add(
            "model.decoder.norm.weight".into(),
            vec![h],
            Role::Vector,
            around,
        );
        let p = "model.decoder.self_conditioning";
        add(
            format!("{p}.pre_norm.weight"),
            vec![h],
            Role::Vector,
            around,
        );
        for proj in ["gate_proj", "up_proj"] {
            add(
                format!("{p}.{proj}.weight"),
                vec![i, h],
                Role::Linear,
                Init::Normal(1.0 / hf.sqrt()),
            );
        }
        add(
            format!("{p}.down_proj.weight"),
            vec![h, i],
            Role::Linear,
            Init::Normal(1.0 / (i as f32).sqrt()),
        );
        for (n, l) in self.layers.iter().enumerate() {
            let p = format!("model.decoder.layers.{n}");
            for norm in [
                "input_layernorm",
                "post_attention_layernorm",
                "pre_feedforward_layernorm",
                "post_feedforward_layernorm",
                "post_feedforward_layernorm_1",
                "post_feedforward_layernorm_2",
                "pre_feedforward_layernorm_2",
            ] {
                add(format!("{p}.{norm}.weight"), vec![h], Role::Vector, around);
            }
            let a = format!("{p}.self_attn");
            let (nh, hd, nkv) = (self.heads, l.head_dim, l.kv_heads);
            let std_h = Init::Normal(1.0 / hf.sqrt());
            add(
                format!("{a}.q_proj.weight"),
                vec![nh * hd, h],
                Role::Linear,
                std_h,
            );
            add(
                format!("{a}.k_proj.weight"),
                vec![nkv * hd, h],
                Role::Linear,
                std_h,
            );
            if l.has_v_proj {
                add(
                    format!("{a}.v_proj.weight"),
                    vec![nkv * hd, h],
                    Role::Linear,
                    std_h,
                );
            }
            add(
                format!("{a}.o_proj.weight"),
                vec![h, nh * hd],
                Role::Linear,
                Init::Normal(1.0 / ((nh * hd) as f32).sqrt()),
            );
            // Attention scale is 1.0: q_norm·k_norm ≈ 1.44/sqrt(hd) keeps scores at std ~1.4.
            let qk = Init::Around {
                center: 1.2 * (hd as f32).powf(-0.25),
                rel: 0.1,
            };
            add(format!("{a}.q_norm.weight"), vec![hd], Role::Vector, qk);
            add(format!("{a}.k_norm.weight"), vec![hd], Role::Vector, qk);
            add(
                format!("{p}.mlp.gate_proj.weight"),
                vec![i, h],
                Role::Linear,
                std_h,
            );
            add(
                format!("{p}.mlp.up_proj.weight"),
                vec![i, h],
                Role::Linear,
                std_h,
            );
            add(
                format!("{p}.mlp.down_proj.weight"),
                vec![h, i],
                Role::Linear,
                Init::Normal(1.0 / (i as f32).sqrt()),
            );
            // Router input has rms H^-0.5, so proj std 1 gives scores of std ~1.
            add(
                format!("{p}.router.proj.weight"),
                vec![e, h],
                Role::Linear,
                Init::Normal(1.0),
            );
            add(format!("{p}.router.scale"), vec![h], Role::Vector, around);
            add(
                format!("{p}.router.per_expert_scale"),
                vec![e],
                Role::Vector,
                around,
            );
            add(
                format!("{p}.experts.gate_up_proj"),
                vec![e, 2 * mi, h],
                Role::Experts,
                std_h,
            );
            add(
                format!("{p}.experts.down_proj"),
                vec![e, h, mi],
                Role::Experts,
                Init::Normal(1.0 / (mi as f32).sqrt()),
            );
            add(
                format!("{p}.layer_scalar"),
                vec![1],
                Role::Vector,
                Init::Uniform { lo: 0.6, hi: 1.0 },
            );
        }
        for n in 0..self.layers.len() {
            add(
                format!("model.encoder.language_model.layers.{n}.layer_scalar"),
                vec![1],
                Role::Vector,
                Init::Uniform { lo: 0.6, hi: 1.0 },
            );
        }
        v
    }
}

/// What a tensor is, which decides how each layout stores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The token embedding (tied lm_head): 8-bit affine in the mlx-community layout.
    Embedding,
    /// A 2-D linear weight `[out, in]`: 8-bit affine in the mlx-community layout.
    Linear,
    /// Stacked experts `[E, out, in]`: NVFP4 or 4-bit affine.
    Experts,
    /// Norm weights, scales, per-expert scales, layer scalars: never quantised.
    Vector,
}

/// Random initialisation (the recipes of docs/checkpoint-layouts.md, "Random checkpoints").
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    Normal(f32),
    /// `center · (1 + rel · N(0,1))`: perturbed around a constant so every tensor matters.
    Around {
        center: f32,
        rel: f32,
    },
    Uniform {
        lo: f32,
        hi: f32,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct TensorSpec {
    pub name: String,
    pub shape: Vec<usize>,
    pub role: Role,
    pub init: Init,
}

impl TensorSpec {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Module path: the name without a trailing `.weight` (how MLX names quantised modules).
    pub fn module(&self) -> &str {
        self.name.strip_suffix(".weight").unwrap_or(&self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_hf_serialised_tiny_config() {
        let text = include_str!("../../tests/data/tiny-hf-config.json");
        let cfg: Value = serde_json::from_str(text).expect("json");
        let d = ModelDims::from_config(&cfg).expect("dims");
        assert_eq!(d.layers.len(), 6);
        assert_eq!(
            d.layers[5],
            LayerDims {
                sliding: false,
                head_dim: 32,
                kv_heads: 1,
                has_v_proj: false
            }
        );
        assert_eq!(
            d.layers[0],
            LayerDims {
                sliding: true,
                head_dim: 16,
                kv_heads: 2,
                has_v_proj: true
            }
        );
        // 159 tensors in the real save_pretrained output, of which the vision tower is the rest
        let t = d.tensors();
        assert_eq!(
            t.iter()
                .filter(|t| t.name.contains("layers.5.self_attn.v_proj"))
                .count(),
            0
        );
        assert_eq!(t.len(), 6 + 6 * 22 - 1 + 6);
        // names and shapes equal the non-vision tensors transformers wrote for this config
        let header: Value =
            serde_json::from_str(include_str!("../../tests/data/tiny-hf-header.json"))
                .expect("json");
        let hf = header.as_object().expect("object");
        let text_only: Vec<_> = hf.keys().filter(|k| !k.contains("vision")).collect();
        assert_eq!(text_only.len(), t.len());
        for s in &t {
            let shape: Vec<usize> =
                serde_json::from_value(hf[&s.name]["shape"].clone()).expect(&s.name);
            assert_eq!(shape, s.shape, "{}", s.name);
        }
    }

    #[test]
    fn accepts_the_released_spelling() {
        let cfg = serde_json::json!({"text_config": {
            "num_hidden_layers": 2, "head_dim": 16, "num_key_value_heads": 2, "global_head_dim": 32,
            "num_global_key_value_heads": 1, "vocab_size": 512, "hidden_size": 64,
            "intermediate_size": 96, "moe_intermediate_size": 32, "num_attention_heads": 4,
            "num_experts": 8, "top_k_experts": 2}});
        let d = ModelDims::from_config(&cfg).expect("dims");
        assert_eq!(
            d.layers[1],
            LayerDims {
                sliding: false,
                head_dim: 32,
                kv_heads: 1,
                has_v_proj: false
            }
        );
        let mut bad = cfg.clone();
        bad["text_config"]["hidden_size"] = Value::from("x");
        assert_eq!(
            ModelDims::from_config(&bad),
            Err(DimsError::Missing("hidden_size".into()))
        );
    }

    #[test]
    fn layer_pattern() {
        assert_eq!(
            layer_types_for(7)
                .iter()
                .filter(|t| *t == "full_attention")
                .count(),
            2
        );
        assert_eq!(
            layer_types_for(4).last().map(String::as_str),
            Some("full_attention")
        );
    }
}
