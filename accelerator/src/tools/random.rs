//! Random DiffusionGemma checkpoints of any size, deterministic from a seed.
//!
//! Presets and initialisation follow the recipe docs/checkpoint-layouts.md ("Random checkpoints")
//! describes (tiny ≈ 4 MB … full = the real
//! 26B-A4B shapes); `--set key=value` overrides any text_config field. Each tensor draws from
//! its own generator seeded by (seed, tensor name), so a tensor's values do not depend on which
//! other tensors exist or on the order they are written in. The values are not numpy's: the
//! reference maker and this one agree on shapes, names, configs and distributions, not on bits.

use serde_json::{json, Map, Value};

use crate::checkpoint::dims::{layer_types_for, DimsError, Init, ModelDims, TensorSpec};
use crate::checkpoint::format::Layout;

/// What to generate.
#[derive(Debug, Clone)]
pub struct RandomSpec {
    pub preset: Preset,
    /// text_config overrides (`--set key=value`); a key `top.K` sets top-level field `K`.
    pub overrides: Vec<(String, Value)>,
    pub seed: u64,
    pub layout: Layout,
    /// Dense tensors in bf16 (default, as released) or f32.
    pub dtype: DenseDtype,
    /// Shard size limit in bytes; above it the layout writes several files.
    pub max_shard_bytes: u64,
    /// Also write a tiny `tokenizer.json` of the vocabulary size.
    pub tokenizer: bool,
}

impl RandomSpec {
    pub fn new(preset: Preset, layout: Layout) -> Self {
        Self {
            preset,
            overrides: Vec::new(),
            seed: 0,
            layout,
            dtype: DenseDtype::Bf16,
            max_shard_bytes: 5000 << 20,
            tokenizer: true,
        }
    }

    /// Parse `key=value` (value as JSON, else as a string) and add it.
    pub fn set(&mut self, kv: &str) -> Result<(), RandomError> {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| RandomError::BadOverride(kv.to_string()))?;
        if k.is_empty() {
            return Err(RandomError::BadOverride(kv.to_string()));
        }
        let value = serde_json::from_str(v).unwrap_or_else(|_| Value::String(v.to_string()));
        self.overrides.push((k.to_string(), value));
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DenseDtype {
    Bf16,
    F32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    Tiny,
    Small,
    Mid,
    Full,
}

impl std::str::FromStr for Preset {
    type Err = RandomError;
    fn from_str(s: &str) -> Result<Self, RandomError> {
        Ok(match s {
            "tiny" => Preset::Tiny,
            "small" => Preset::Small,
            "mid" => Preset::Mid,
            "full" => Preset::Full,
            _ => return Err(RandomError::UnknownPreset(s.to_string())),
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RandomError {
    #[error("unknown preset {0:?} (tiny, small, mid, full)")]
    UnknownPreset(String),
    #[error("override {0:?} is not key=value")]
    BadOverride(String),
    #[error(transparent)]
    Dims(#[from] DimsError),
}

/// text_config of the released model (docs/model.md, "Configuration").
fn base_text_config() -> Map<String, Value> {
    let v = json!({
        "model_type": "diffusion_gemma_text",
        "vocab_size": 262144, "hidden_size": 2816, "intermediate_size": 2112,
        "moe_intermediate_size": 704, "num_hidden_layers": 30, "num_attention_heads": 16,
        "num_key_value_heads": 8, "head_dim": 256, "num_global_key_value_heads": 2,
        "global_head_dim": 512, "num_experts": 128, "top_k_experts": 8, "sliding_window": 1024,
        "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6,
        "final_logit_softcapping": 30.0, "max_position_embeddings": 262144,
        "attention_bias": false, "attention_dropout": 0.0, "pad_token_id": 0, "eos_token_id": 1,
        "bos_token_id": 2, "tie_word_embeddings": true, "use_bidirectional_attention": "vision",
        "initializer_range": 0.02,
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                               "rope_theta": 1000000.0}
        }
    });
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

fn preset_fields(p: Preset) -> Value {
    match p {
        // ~4 MB
        Preset::Tiny => json!({"vocab_size": 2048, "hidden_size": 128, "intermediate_size": 192,
            "moe_intermediate_size": 64, "num_hidden_layers": 6, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 32, "num_global_key_value_heads": 1,
            "global_head_dim": 64, "num_experts": 8, "top_k_experts": 2, "sliding_window": 1024}),
        // ~60 MB
        Preset::Small => json!({"vocab_size": 8192, "hidden_size": 512, "intermediate_size": 256,
            "moe_intermediate_size": 128, "num_hidden_layers": 6, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 128, "num_global_key_value_heads": 1,
            "global_head_dim": 256, "num_experts": 16, "top_k_experts": 4, "sliding_window": 1024}),
        // ~815 MB
        Preset::Mid => json!({"vocab_size": 32768, "hidden_size": 1024, "intermediate_size": 768,
            "moe_intermediate_size": 256, "num_hidden_layers": 12, "num_attention_heads": 8,
            "num_key_value_heads": 4, "head_dim": 128, "num_global_key_value_heads": 1,
            "global_head_dim": 256, "num_experts": 32, "top_k_experts": 8, "sliding_window": 1024}),
        // the real shapes (~52 GB bf16)
        Preset::Full => json!({}),
    }
}

/// Recursively sort object keys, as HF's `to_json_string(sort_keys=True)` does.
pub(crate) fn sorted(v: Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut items: Vec<(String, Value)> = m.into_iter().collect();
            items.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(items.into_iter().map(|(k, v)| (k, sorted(v))).collect())
        }
        Value::Array(a) => Value::Array(a.into_iter().map(sorted).collect()),
        other => other,
    }
}

/// `config.json` and `generation_config.json` for a preset and overrides.
///
/// The text_config is written in HF's serialised spelling (`per_layer_config` for the full
/// layers instead of `global_head_dim` / `num_global_key_value_heads`), like the config
/// `save_pretrained` wrote for `reference/tiny-hf`; the top level and generation config are
/// the released model's (text-only: no vision_config).
pub fn build_config(
    preset: Preset,
    overrides: &[(String, Value)],
) -> Result<(Value, Value), RandomError> {
    let mut tc = base_text_config();
    if let Value::Object(p) = preset_fields(preset) {
        tc.extend(p);
    }
    let mut top_over = Map::new();
    for (k, v) in overrides {
        match k.strip_prefix("top.") {
            Some(top) => {
                top_over.insert(top.to_string(), v.clone());
            }
            None => {
                tc.insert(k.clone(), v.clone());
            }
        }
    }
    if !overrides.iter().any(|(k, _)| k == "layer_types") {
        let n = tc
            .get("num_hidden_layers")
            .and_then(Value::as_u64)
            .unwrap_or(0) as usize;
        tc.insert("layer_types".into(), json!(layer_types_for(n)));
    }
    // Validate through the same reader every consumer uses.
    let dims = ModelDims::from_config(&Value::Object(tc.clone()))?;
    let mut per_layer = Map::new();
    for (i, l) in dims.layers.iter().enumerate() {
        if !l.sliding {
            per_layer.insert(
                i.to_string(),
                json!({"head_dim": l.head_dim, "num_key_value_heads": l.kv_heads}),
            );
        }
    }
    tc.remove("global_head_dim");
    tc.remove("num_global_key_value_heads");
    tc.insert("per_layer_config".into(), Value::Object(per_layer));

    let v = dims.vocab;
    // The real image ids only fit the real vocabulary; otherwise the top three ids.
    let (boi, eoi, img) = if v > 258882 {
        (255999, 258882, 258880)
    } else {
        (v - 3, v - 2, v - 1)
    };
    let eos = if v > 106 {
        json!([1, 106, 50])
    } else {
        json!([1])
    };
    let mut cfg = json!({
        "architectures": ["DiffusionGemmaForBlockDiffusion"],
        "model_type": "diffusion_gemma",
        "canvas_length": 256,
        "boi_token_id": boi,
        "eoi_token_id": eoi,
        "image_token_id": img,
        "eos_token_id": eos,
        "initializer_range": 0.02,
        "tie_word_embeddings": true,
        "dtype": "bfloat16",
        "text_config": Value::Object(tc),
        "transformers_version": "5.23.0",
    });
    if let Value::Object(m) = &mut cfg {
        m.extend(top_over);
    }
    let gen = json!({
        "max_denoising_steps": 48, "t_min": 0.4, "t_max": 0.8, "stability_threshold": 1,
        "confidence_threshold": 0.005, "max_new_tokens": 256, "pad_token_id": 0,
        "eos_token_id": cfg["eos_token_id"].clone(),
        "sampler_config": {"sampler_type": "EntropyBound", "entropy_bound": 0.1},
        "transformers_version": "5.23.0",
    });
    Ok((sorted(cfg), sorted(gen)))
}

/// xoshiro256++ seeded through splitmix64: fast, small, and the same on every platform.
#[derive(Debug, Clone)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Self {
            s: [next(), next(), next(), next()],
        }
    }

    /// Generator for one tensor: the seed mixed with an FNV-1a hash of the name.
    pub fn for_tensor(seed: u64, name: &str) -> Self {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in name.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3);
        }
        Self::new(seed ^ h.rotate_left(17))
    }

    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let r = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        r
    }

    /// Uniform in [0, 1) with 24 bits.
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
    }

    /// Fill with standard normals (Box–Muller, two values per draw pair).
    pub fn fill_normal(&mut self, out: &mut [f32]) {
        let mut chunks = out.chunks_exact_mut(2);
        for pair in &mut chunks {
            let (a, b) = self.normal_pair();
            pair[0] = a;
            pair[1] = b;
        }
        if let [last] = chunks.into_remainder() {
            *last = self.normal_pair().0;
        }
    }

    fn normal_pair(&mut self) -> (f32, f32) {
        let x = self.next_u64();
        // u1 in (0, 1] so ln is finite; u2 in [0, 1)
        let u1 = ((x >> 40) as f32 + 1.0) * (1.0 / (1u64 << 24) as f32);
        let u2 = ((x & 0xFF_FFFF) as f32) * (1.0 / (1u64 << 24) as f32);
        let r = (-2.0 * u1.ln()).sqrt();
        let (s, c) = (std::f32::consts::TAU * u2).sin_cos();
        (r * c, r * s)
    }
}

/// The f32 values of one tensor (before rounding to the stored dtype).
pub fn generate(spec: &TensorSpec, seed: u64) -> Vec<f32> {
    let mut rng = Rng::for_tensor(seed, &spec.name);
    let mut v = vec![0f32; spec.numel()];
    match spec.init {
        Init::Normal(std) => {
            rng.fill_normal(&mut v);
            v.iter_mut().for_each(|x| *x *= std);
        }
        Init::Around { center, rel } => {
            rng.fill_normal(&mut v);
            v.iter_mut().for_each(|x| *x = center * (1.0 + rel * *x));
        }
        Init::Uniform { lo, hi } => v
            .iter_mut()
            .for_each(|x| *x = lo + (hi - lo) * rng.uniform()),
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_has_hf_spelling_and_overrides() {
        let (cfg, gen) = build_config(
            Preset::Tiny,
            &[
                ("num_hidden_layers".into(), json!(7)),
                ("top.canvas_length".into(), json!(16)),
            ],
        )
        .expect("config");
        let tc = &cfg["text_config"];
        assert_eq!(tc["num_hidden_layers"], 7);
        assert!(tc.get("global_head_dim").is_none());
        assert_eq!(tc["per_layer_config"]["5"]["head_dim"], 64);
        assert_eq!(tc["per_layer_config"]["6"]["num_key_value_heads"], 1);
        assert_eq!(cfg["canvas_length"], 16);
        assert_eq!(cfg["image_token_id"], 2047);
        assert_eq!(gen["eos_token_id"], json!([1, 106, 50]));
        let keys: Vec<&String> = cfg.as_object().expect("object").keys().collect();
        let mut s = keys.clone();
        s.sort();
        assert_eq!(keys, s, "keys sorted like HF");
        assert_eq!(ModelDims::from_config(&cfg).expect("dims").layers.len(), 7);
    }

    #[test]
    fn generator_is_deterministic_and_roughly_normal() {
        let spec = TensorSpec {
            name: "x".into(),
            shape: vec![100_000],
            role: crate::checkpoint::dims::Role::Linear,
            init: Init::Normal(2.0),
        };
        let a = generate(&spec, 7);
        assert_eq!(a, generate(&spec, 7));
        assert_ne!(a, generate(&spec, 8));
        let mean = a.iter().sum::<f32>() / a.len() as f32;
        let var = a.iter().map(|x| (x - mean) * (x - mean)).sum::<f32>() / a.len() as f32;
        assert!(
            mean.abs() < 0.03 && (var.sqrt() - 2.0).abs() < 0.03,
            "{mean} {var}"
        );
    }

    #[test]
    fn bad_override_is_rejected() {
        let mut s = RandomSpec::new(Preset::Tiny, Layout::Hf);
        assert!(s.set("novalue").is_err());
        s.set("hidden_size=\"x\"").expect("parses");
        assert!(matches!(
            build_config(s.preset, &s.overrides),
            Err(RandomError::Dims(_))
        ));
    }
}
