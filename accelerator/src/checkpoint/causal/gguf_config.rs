//! A chat model's configuration from a GGUF's metadata, as llama.cpp reads it (its per-
//! architecture hparams): the keys every family shares ([`Hparams`]), then each family's own
//! (Gemma 3's layer pattern, local base and window), with every `{arch}.*` key accounted for —
//! honoured, known not to change the math, or refused by name (docs/models.md, "Configs").
//!
//! A value of the wrong type is an error naming the key, never a default; a key that is
//! missing takes llama.cpp's default for it.

use mlx_rs::Dtype;

use crate::checkpoint::gguf::{FloatDtype, GgufFile, GgufWeight, MetaValue};
use crate::model::causal::config::SERVED_GGUF_ARCHITECTURES;
use crate::model::causal::{
    Activation, Architecture, CausalConfig, ConfigError, RopeScaling, RopeSpec,
};
use crate::model::ModelError;

use super::CausalLoadError;

/// `{arch}.*` keys every family's reader honours.
const SHARED_KEYS: &[&str] = &[
    "context_length",
    "embedding_length",
    "block_count",
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.layer_norm_rms_epsilon",
    "attention.key_length",
    "attention.value_length",
    "rope.dimension_count",
    "rope.freq_base",
    "rope.scaling.type",
    "rope.scaling.factor",
    "rope.scaling.original_context_length",
    "rope.scaling.attn_factor",
    "rope.scaling.yarn_beta_fast",
    "rope.scaling.yarn_beta_slow",
    "vocab_size",
    "expert_count",
    "expert_used_count",
    "attention.causal",
];

/// `{arch}.*` keys that never change the forward pass.
const HARMLESS_KEYS: &[&str] = &[
    // Whether the rope was fine-tuned at the scaled length: a training fact.
    "rope.scaling.finetuned",
];

/// Gemma 3's own keys.
const GEMMA3_KEYS: &[&str] = &[
    "attention.sliding_window",
    "attention.sliding_window_pattern",
    "rope.freq_base_swa",
    "final_logit_softcapping",
    "attn_logit_softcapping",
];

/// Llama's (Mistral's window, where a converter writes one).
const LLAMA_KEYS: &[&str] = &["attention.sliding_window"];

/// Namespaces outside `{arch}.` that describe the file, not the model's math: its identity,
/// its tokenizer (read by the tokenizer's own loader) and how it was quantised.
const HARMLESS_NAMESPACES: &[&str] = &["general.", "tokenizer.", "quantize."];

/// The metadata of one architecture read strictly.
struct Hparams<'a> {
    file: &'a GgufFile,
    arch: &'a str,
}

impl Hparams<'_> {
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    fn value(&self, k: &str) -> Option<&MetaValue> {
        self.file.get(&self.key(k))
    }

    fn wrong(&self, k: &str, what: &str) -> ConfigError {
        ConfigError::Invalid {
            key: self.key(k),
            value: self.value(k).map(|v| format!("{v:?}")).unwrap_or_default(),
            why: format!("is not {what}"),
        }
    }

    fn opt_int(&self, k: &str) -> Result<Option<i32>, ConfigError> {
        match self.value(k) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|n| i32::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| self.wrong(k, "a non-negative integer")),
        }
    }

    fn int(&self, k: &str) -> Result<i32, ConfigError> {
        self.opt_int(k)?.ok_or_else(|| ConfigError::Missing {
            key: self.key(k),
            why: "llama.cpp requires it too".into(),
        })
    }

    fn opt_float(&self, k: &str) -> Result<Option<f64>, ConfigError> {
        match self.value(k) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.wrong(k, "a number")),
        }
    }

    fn float(&self, k: &str) -> Result<f64, ConfigError> {
        self.opt_float(k)?.ok_or_else(|| ConfigError::Missing {
            key: self.key(k),
            why: "llama.cpp requires it too".into(),
        })
    }

    fn opt_str(&self, k: &str) -> Result<Option<&str>, ConfigError> {
        match self.value(k) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.wrong(k, "a string")),
        }
    }

    /// Every metadata key is this family's, harmless, or named in `ignored`; returns the
    /// ignored ones the file holds.
    fn audit(&self, own: &[&str], ignored: &[String]) -> Result<Vec<String>, ConfigError> {
        let prefix = format!("{}.", self.arch);
        let mut skipped = Vec::new();
        for (key, value) in self.file.metadata() {
            if HARMLESS_NAMESPACES.iter().any(|ns| key.starts_with(ns)) {
                continue;
            }
            if let Some(rest) = key.strip_prefix(&prefix) {
                if SHARED_KEYS.contains(&rest)
                    || HARMLESS_KEYS.contains(&rest)
                    || own.contains(&rest)
                {
                    continue;
                }
            }
            // gguf-split's keys on a file that is the whole model.
            if key.starts_with("split.") && self.file.uint("split.count") == Some(1) {
                continue;
            }
            if ignored.iter().any(|k| k == key) {
                skipped.push(key.clone());
                continue;
            }
            // A decision model (llama.cpp's `decision.type`): its type and fitted temperatures
            // are the read's, checked where the read is planned (`checkpoint::gguf::decision`);
            // a type Hunch does not serve is refused here, before any weight is read. Any other
            // `decision.*` key belongs to a head of its own that no served type has.
            if let Some(rest) = key.strip_prefix(&format!("{prefix}decision.")) {
                if rest == "type" {
                    let name = value.as_str().unwrap_or_default();
                    crate::checkpoint::gguf::DecisionKind::parse(name).map_err(|e| {
                        ConfigError::Unsupported {
                            key: key.clone(),
                            value: format!("{value:?}"),
                            why: e.to_string(),
                        }
                    })?;
                    continue;
                }
                if rest.starts_with("temperature.") {
                    continue;
                }
                return Err(ConfigError::Unsupported {
                    key: key.clone(),
                    value: format!("{value:?}"),
                    why: "a decision head's setting; the decision types Hunch serves (openjev, \
                          lev, pplx-decider) read label logits and have no such key"
                        .into(),
                });
            }
            if key.starts_with("split.") {
                return Err(ConfigError::Unsupported {
                    key: key.clone(),
                    value: format!("{value:?}"),
                    why: "split GGUF files are not read; merge them with llama-gguf-split --merge"
                        .into(),
                });
            }
            let mut shown = format!("{value:?}");
            if shown.len() > 80 {
                shown.truncate(80);
                shown.push('…');
            }
            return Err(ConfigError::UnknownKey {
                key: key.clone(),
                value: shown,
                family: family_name(self.arch),
            });
        }
        Ok(skipped)
    }
}

fn family_name(arch: &str) -> &'static str {
    Architecture::from_gguf(arch).map_or("this architecture", Architecture::name)
}

/// The configuration of `file`, with the metadata keys `ignored` the user said are harmless.
pub(super) fn config_from_metadata(
    file: &GgufFile,
    ignored: &[String],
) -> Result<CausalConfig, CausalLoadError> {
    let bad = |error: ConfigError| CausalLoadError::Config {
        path: file.path().to_path_buf(),
        why: error.to_string(),
    };
    let arch = match file.get("general.architecture") {
        Some(MetaValue::String(s)) => s.as_str(),
        Some(other) => {
            return Err(bad(ConfigError::Invalid {
                key: "general.architecture".into(),
                value: format!("{other:?}"),
                why: "is not a string".into(),
            }))
        }
        None => {
            return Err(bad(ConfigError::Missing {
                key: "general.architecture".into(),
                why: "the family cannot be told without it".into(),
            }))
        }
    };
    let architecture = Architecture::from_gguf(arch).ok_or_else(|| {
        bad(ConfigError::UnknownFamily {
            field: "general.architecture",
            value: arch.to_owned(),
            served: SERVED_GGUF_ARCHITECTURES,
        })
    })?;
    let rope_factors = rope_factors(file)?;
    let hp = Hparams { file, arch };
    read(&hp, architecture, rope_factors, ignored).map_err(bad)
}

/// llama.cpp's `rope_freqs` tensor (Llama 3.1's adjustment, computed by its converter).
fn rope_factors(file: &GgufFile) -> Result<Option<Vec<f32>>, CausalLoadError> {
    if file.tensor("rope_freqs.weight").is_none() {
        return Ok(None);
    }
    match file.load("rope_freqs.weight", FloatDtype::F32)? {
        GgufWeight::Dense(factors) => {
            let factors = factors.as_dtype(Dtype::Float32).map_err(ModelError::from)?;
            factors.eval().map_err(ModelError::from)?;
            Ok(Some(factors.as_slice::<f32>().to_vec()))
        }
        GgufWeight::Affine { .. } => Err(CausalLoadError::Tensor {
            path: file.path().to_path_buf(),
            name: "rope_freqs.weight".into(),
            why: "is quantised; it holds per-pair factors".into(),
        }),
    }
}

fn read(
    hp: &Hparams<'_>,
    architecture: Architecture,
    rope_factors: Option<Vec<f32>>,
    ignored: &[String],
) -> Result<CausalConfig, ConfigError> {
    let gemma = architecture == Architecture::Gemma3;
    let own: &[&str] = match architecture {
        Architecture::Gemma3 => GEMMA3_KEYS,
        Architecture::Llama => LLAMA_KEYS,
        Architecture::Qwen2 | Architecture::Qwen3 => &[],
    };
    let ignored_config_keys = hp.audit(own, ignored)?;
    for key in ["expert_count", "expert_used_count"] {
        if let Some(n) = hp.opt_int(key)?.filter(|&n| n > 0) {
            return Err(ConfigError::Unsupported {
                key: hp.key(key),
                value: n.to_string(),
                why: "mixture-of-experts chat models are not implemented".into(),
            });
        }
    }
    if let Some(causal) = hp.value("attention.causal") {
        if causal.as_bool() != Some(true) {
            return Err(ConfigError::Unsupported {
                key: hp.key("attention.causal"),
                value: format!("{causal:?}"),
                why: "non-causal attention (an encoder's) is not implemented".into(),
            });
        }
    }
    let hidden_size = hp.int("embedding_length")?;
    let num_layers = hp.int("block_count")?;
    let num_heads = hp.int("attention.head_count")?;
    if num_heads <= 0 {
        return Err(hp.wrong("attention.head_count", "positive"));
    }
    let head_dim = hp
        .opt_int("attention.key_length")?
        .unwrap_or(hidden_size / num_heads);
    if let Some(value_length) = hp.opt_int("attention.value_length")? {
        if value_length != head_dim {
            return Err(ConfigError::Unsupported {
                key: hp.key("attention.value_length"),
                value: value_length.to_string(),
                why: format!("values wider or narrower than keys ({head_dim}) are not implemented"),
            });
        }
    }
    if let Some(dims) = hp.opt_int("rope.dimension_count")? {
        if dims != head_dim {
            return Err(ConfigError::Unsupported {
                key: hp.key("rope.dimension_count"),
                value: dims.to_string(),
                why: format!("a rope over part of the {head_dim}-wide heads is not implemented"),
            });
        }
    }
    let context = hp.opt_int("context_length")?;
    let rope = rope(hp, rope_factors, context)?;
    let vocab_size = match hp.file.tensor("token_embd.weight") {
        Some(embed) => embed.shape().first().copied().unwrap_or(0),
        None => {
            return Err(ConfigError::Missing {
                key: "token_embd.weight".into(),
                why: "every chat model's GGUF has its embedding".into(),
            })
        }
    };
    if let Some(stated) = hp.opt_int("vocab_size")? {
        if stated != vocab_size {
            return Err(ConfigError::Inconsistent(format!(
                "{} is {stated} but token_embd.weight has {vocab_size} rows",
                hp.key("vocab_size")
            )));
        }
    }
    let (sliding_layers, sliding_window, rope_local) = if gemma {
        gemma3_layers(hp, num_layers, &rope)?
    } else {
        let window = match architecture {
            Architecture::Llama => hp.opt_int("attention.sliding_window")?,
            _ => None,
        };
        (
            vec![window.is_some(); num_layers.max(0) as usize],
            window.unwrap_or(0),
            rope.clone(),
        )
    };
    if gemma {
        if let Some(cap) = hp
            .opt_float("attn_logit_softcapping")?
            .filter(|&c| c != 0.0)
        {
            return Err(ConfigError::Unsupported {
                key: hp.key("attn_logit_softcapping"),
                value: cap.to_string(),
                why: "attention soft-capping is not implemented (Gemma 3 has none)".into(),
            });
        }
    }
    let attention_scale = if gemma && num_layers == 62 {
        // llama.cpp: Gemma 3 27B scales by `query_pre_attn_scalar` = hidden / heads, not the
        // head size (its GGUF carries no key for it).
        ((hidden_size / num_heads) as f32).powf(-0.5)
    } else {
        (head_dim as f32).powf(-0.5)
    };
    let has = |name: &str| hp.file.tensor(name).is_some();
    let config = CausalConfig {
        architecture,
        vocab_size,
        hidden_size,
        intermediate_size: hp.int("feed_forward_length")?,
        num_layers,
        num_heads,
        num_kv_heads: hp.opt_int("attention.head_count_kv")?.unwrap_or(num_heads),
        head_dim,
        // llama.cpp requires it for these architectures: no default would be the file's own.
        rms_norm_eps: hp.float("attention.layer_norm_rms_epsilon")? as f32,
        rope,
        rope_local,
        sliding_layers,
        sliding_window,
        attention_scale,
        activation: if gemma {
            Activation::GeluTanh
        } else {
            Activation::Silu
        },
        tie_word_embeddings: !has("output.weight"),
        final_logit_softcapping: if gemma {
            hp.opt_float("final_logit_softcapping")?
                .filter(|&c| c != 0.0)
                .map(|v| v as f32)
        } else {
            None
        },
        max_position_embeddings: context.filter(|&n| n > 0),
        // llama.cpp loads these biases where the converter wrote them (Qwen2 always does).
        qkv_bias: has("blk.0.attn_q.bias"),
        o_bias: has("blk.0.attn_output.bias"),
        ignored_config_keys,
    };
    config.validate().map_err(ConfigError::Inconsistent)?;
    Ok(config)
}

/// The rope of full-attention layers: `{arch}.rope.*` and the `rope_freqs` factors.
fn rope(
    hp: &Hparams<'_>,
    factors: Option<Vec<f32>>,
    context: Option<i32>,
) -> Result<RopeSpec, ConfigError> {
    let theta = hp.opt_float("rope.freq_base")?.unwrap_or(10_000.0) as f32;
    let factor = hp.opt_float("rope.scaling.factor")?;
    let kind = hp.opt_str("rope.scaling.type")?;
    let scaling = match kind {
        None | Some("none") => RopeScaling::None,
        Some("linear") => RopeScaling::Linear {
            factor: factor.ok_or_else(|| ConfigError::Missing {
                key: hp.key("rope.scaling.factor"),
                why: "linear rope scaling needs it".into(),
            })? as f32,
        },
        Some("yarn") => {
            let factor = factor.ok_or_else(|| ConfigError::Missing {
                key: hp.key("rope.scaling.factor"),
                why: "yarn needs it".into(),
            })? as f32;
            let original = hp
                .opt_int("rope.scaling.original_context_length")?
                .or(context)
                .ok_or_else(|| ConfigError::Missing {
                    key: hp.key("rope.scaling.original_context_length"),
                    why: "yarn needs the original context".into(),
                })? as f32;
            // llama.cpp's attention factor: 1 + 0.1 ln(factor), times attn_factor if given.
            let mscale = if factor > 1.0 {
                0.1 * factor.ln() + 1.0
            } else {
                1.0
            };
            let attn = hp.opt_float("rope.scaling.attn_factor")?.unwrap_or(1.0) as f32;
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: original,
                beta_fast: hp.opt_float("rope.scaling.yarn_beta_fast")?.unwrap_or(32.0) as f32,
                beta_slow: hp.opt_float("rope.scaling.yarn_beta_slow")?.unwrap_or(1.0) as f32,
                truncate: true,
                attention_factor: mscale * attn,
            }
        }
        Some(other) => {
            return Err(ConfigError::Unsupported {
                key: hp.key("rope.scaling.type"),
                value: format!("{other:?}"),
                why: "is not implemented (none, linear and yarn are)".into(),
            })
        }
    };
    let scaling = match factors {
        Some(factors) if scaling == RopeScaling::None => RopeScaling::Factors(factors),
        Some(_) => {
            return Err(ConfigError::Inconsistent(format!(
                "the file has both rope_freqs.weight and {} = {kind:?}",
                hp.key("rope.scaling.type")
            )))
        }
        None => scaling,
    };
    Ok(RopeSpec { theta, scaling })
}

/// Gemma 3's sliding layers, window and local rope: llama.cpp fixes the pattern (five local
/// layers, then a global one) unless the file states one, and the local base at 10,000 unless
/// `rope.freq_base_swa` says otherwise; the local layers are never scaled.
fn gemma3_layers(
    hp: &Hparams<'_>,
    num_layers: i32,
    rope: &RopeSpec,
) -> Result<(Vec<bool>, i32, RopeSpec), ConfigError> {
    if let RopeScaling::Factors(_) = rope.scaling {
        return Err(ConfigError::Unsupported {
            key: "rope_freqs.weight".into(),
            value: "per-pair factors".into(),
            why: "Gemma 3 has no such rope".into(),
        });
    }
    let layers: Vec<bool> = match hp.value("attention.sliding_window_pattern") {
        None => (0..num_layers).map(|i| (i + 1) % 6 != 0).collect(),
        Some(MetaValue::Array(flags)) => {
            let flags = flags
                .iter()
                .map(MetaValue::as_bool)
                .collect::<Option<Vec<bool>>>()
                .ok_or_else(|| hp.wrong("attention.sliding_window_pattern", "booleans"))?;
            if flags.len() != num_layers.max(0) as usize {
                return Err(ConfigError::Inconsistent(format!(
                    "{} has {} entries for {num_layers} layers",
                    hp.key("attention.sliding_window_pattern"),
                    flags.len()
                )));
            }
            flags
        }
        Some(_) => {
            let pattern = hp
                .opt_int("attention.sliding_window_pattern")?
                .filter(|&p| p > 0)
                .ok_or_else(|| hp.wrong("attention.sliding_window_pattern", "positive"))?;
            (0..num_layers).map(|i| (i + 1) % pattern != 0).collect()
        }
    };
    // llama.cpp requires Gemma 3's window; a default would only happen to match some models.
    let window = hp.int("attention.sliding_window")?;
    let local_theta = hp.opt_float("rope.freq_base_swa")?.unwrap_or(10_000.0) as f32;
    Ok((layers, window, RopeSpec::plain(local_theta)))
}
