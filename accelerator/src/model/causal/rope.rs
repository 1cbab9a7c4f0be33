//! Rotary position embeddings of the causal families, in one place: what a config says
//! ([`RopeSpec`], read from either transformers dialect or a GGUF's metadata) and the
//! frequencies it means ([`RopeSpec::periods`], [`RopeSpec::attention_factor`]), computed in
//! float32 in the order transformers' `ROPE_INIT_FUNCTIONS` compute them (docs/models.md,
//! "Configs": the rope types and which are refused).
//!
//! A Hugging Face config names its rope in one of two dialects:
//! - transformers ≤ 4.x: `rope_theta` at the top and an optional `rope_scaling` dict
//!   (`rope_type`, or the older `type`, and the type's parameters); Gemma 3 adds
//!   `rope_local_base_freq` for its sliding layers;
//! - transformers 5: one `rope_parameters` dict holding `rope_theta` too, or one such dict per
//!   layer type (`{"full_attention": {...}, "sliding_attention": {...}}`).
//!
//! Both come here as dicts ([`RopeSpec::from_hf_dict`]); a key of a rope dict that is not
//! understood, or a rope type not implemented, is refused by name rather than guessed.

use super::keys::ConfigError;

/// How positions rotate on one kind of layer.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeSpec {
    /// Base θ.
    pub theta: f32,
    /// Frequency adjustment.
    pub scaling: RopeScaling,
}

/// The frequency adjustments implemented. `dynamic` (NTK) has no variant: it changes nothing for
/// prompts within `max_position_embeddings`, and longer prompts are refused
/// ([`RopeSpec::from_hf_dict`]).
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    /// Plain `θ^(-2i/d)`.
    None,
    /// Positions divided by `factor` (Gemma 3's global layers).
    Linear { factor: f32 },
    /// Llama 3.1's smooth interpolation between low and high frequencies.
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_max_position_embeddings: f32,
    },
    /// YaRN: frequencies ramped between interpolation and extrapolation over the pairs whose
    /// rotations in the original context fall between `beta_slow` and `beta_fast`, and the
    /// attention scaled by `attention_factor` on both queries and keys.
    Yarn {
        factor: f32,
        original_max_position_embeddings: f32,
        beta_fast: f32,
        beta_slow: f32,
        /// transformers' `truncate` (default true): the ramp's bounds rounded to whole pairs.
        truncate: bool,
        attention_factor: f32,
    },
    /// Each pair's period multiplied by its own factor: llama.cpp's `rope_freqs` tensor, in
    /// which its converter stores the Llama 3 adjustment already computed.
    Factors(Vec<f32>),
}

/// The keys a rope dict may hold, whatever its type; anything else in it is refused.
const ROPE_DICT_KEYS: [&str; 14] = [
    "rope_type",
    "type",
    "rope_theta",
    "factor",
    "original_max_position_embeddings",
    "low_freq_factor",
    "high_freq_factor",
    "attention_factor",
    "beta_fast",
    "beta_slow",
    "mscale",
    "mscale_all_dim",
    "truncate",
    "partial_rotary_factor",
];

/// YaRN's `get_mscale`: the attention factor of a context stretched `scale` times.
fn yarn_mscale(scale: f32, mscale: f32) -> f32 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * mscale * scale.ln() + 1.0
    }
}

impl RopeSpec {
    /// No adjustment at base `theta`.
    pub fn plain(theta: f32) -> RopeSpec {
        RopeSpec {
            theta,
            scaling: RopeScaling::None,
        }
    }

    /// A rope dict (`rope_scaling` or a `rope_parameters` entry; `None` or JSON null: no
    /// adjustment), `theta` taken from the dict's `rope_theta` or else `default_theta` (the
    /// old dialect's top-level `rope_theta`; `None` when the config has none either, which is an
    /// error: every family's θ is stated, and guessing it is what misread Qwen3). `key` names
    /// the dict in errors; `max_position_embeddings` is the config's, which YaRN's factor
    /// follows as transformers does.
    pub fn from_hf_dict(
        key: &str,
        dict: Option<&serde_json::Value>,
        default_theta: Option<f64>,
        max_position_embeddings: Option<i64>,
    ) -> Result<RopeSpec, ConfigError> {
        let dict = dict.filter(|v| !v.is_null());
        let object = match dict {
            None => None,
            Some(serde_json::Value::Object(map)) => Some(map),
            Some(other) => {
                return Err(ConfigError::Invalid {
                    key: key.to_owned(),
                    value: other.to_string(),
                    why: "is not an object".into(),
                })
            }
        };
        let empty = serde_json::Map::new();
        let map = object.unwrap_or(&empty);
        for (name, value) in map {
            if !ROPE_DICT_KEYS.contains(&name.as_str()) {
                return Err(ConfigError::Unsupported {
                    key: format!("{key}.{name}"),
                    value: value.to_string(),
                    why: "is not a rope parameter Hunch knows; it would change the rotation".into(),
                });
            }
        }
        let number = |name: &str| -> Result<Option<f64>, ConfigError> {
            match map.get(name) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(v) => v.as_f64().map(Some).ok_or_else(|| ConfigError::Invalid {
                    key: format!("{key}.{name}"),
                    value: v.to_string(),
                    why: "is not a number".into(),
                }),
            }
        };
        let required = |name: &str, kind: &str| -> Result<f32, ConfigError> {
            number(name)?
                .map(|v| v as f32)
                .ok_or_else(|| ConfigError::Missing {
                    key: format!("{key}.{name}"),
                    why: format!("rope type {kind} needs it"),
                })
        };
        if let Some(partial) = number("partial_rotary_factor")? {
            if partial != 1.0 {
                return Err(ConfigError::Unsupported {
                    key: format!("{key}.partial_rotary_factor"),
                    value: partial.to_string(),
                    why: "partial rotary embeddings are not implemented".into(),
                });
            }
        }
        let theta = match number("rope_theta")?.or(default_theta) {
            Some(theta) if theta.is_finite() && theta > 0.0 => theta as f32,
            Some(theta) => {
                return Err(ConfigError::Invalid {
                    key: format!("{key}.rope_theta"),
                    value: theta.to_string(),
                    why: "must be a positive number".into(),
                })
            }
            None => {
                return Err(ConfigError::Missing {
                    key: "rope_theta".into(),
                    why: "the rope's base is not stated (neither at the top nor in the rope \
                          parameters)"
                        .into(),
                })
            }
        };
        // transformers 5 writes both names for one rope; they must then say the same.
        if let (Some(a), Some(b)) = (map.get("rope_type"), map.get("type")) {
            if a != b {
                return Err(ConfigError::Inconsistent(format!(
                    "{key}.rope_type {a} and {key}.type {b} disagree"
                )));
            }
        }
        let kind = match map.get("rope_type").or_else(|| map.get("type")) {
            None | Some(serde_json::Value::Null) => "default".to_owned(),
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(other) => {
                return Err(ConfigError::Invalid {
                    key: format!("{key}.rope_type"),
                    value: other.to_string(),
                    why: "is not a string".into(),
                })
            }
        };
        // Parameters that belong to another type than the one named would be silently unused.
        let allowed: &[&str] = match kind.as_str() {
            "default" | "dynamic" => &["factor", "original_max_position_embeddings"],
            "linear" => &["factor"],
            "llama3" => &[
                "factor",
                "low_freq_factor",
                "high_freq_factor",
                "original_max_position_embeddings",
            ],
            "yarn" => &[
                "factor",
                "original_max_position_embeddings",
                "attention_factor",
                "beta_fast",
                "beta_slow",
                "mscale",
                "mscale_all_dim",
                "truncate",
            ],
            other => {
                return Err(ConfigError::Unsupported {
                    key: format!("{key}.rope_type"),
                    value: format!("{other:?}"),
                    why: "is not implemented (default, linear, llama3, yarn and dynamic are)"
                        .into(),
                })
            }
        };
        let generic = ["rope_type", "type", "rope_theta", "partial_rotary_factor"];
        for (name, value) in map {
            if !generic.contains(&name.as_str()) && !allowed.contains(&name.as_str()) {
                return Err(ConfigError::Unsupported {
                    key: format!("{key}.{name}"),
                    value: value.to_string(),
                    why: format!("has no meaning for rope type {kind:?}"),
                });
            }
        }
        let scaling = match kind.as_str() {
            // transformers' dynamic NTK rescales θ only once a sequence is longer than
            // `max_position_embeddings`, and Hunch refuses prompts past that length: within
            // it the rotation is the default one.
            "default" | "dynamic" => RopeScaling::None,
            "linear" => RopeScaling::Linear {
                factor: required("factor", "linear")?,
            },
            "llama3" => RopeScaling::Llama3 {
                factor: required("factor", "llama3")?,
                low_freq_factor: required("low_freq_factor", "llama3")?,
                high_freq_factor: required("high_freq_factor", "llama3")?,
                original_max_position_embeddings: required(
                    "original_max_position_embeddings",
                    "llama3",
                )?,
            },
            "yarn" => {
                let mut factor = required("factor", "yarn")?;
                // As transformers: with an original context stated, the factor is the ratio
                // of the contexts; without one, the config's own context is the original.
                let original = match number("original_max_position_embeddings")? {
                    Some(original) => {
                        if let Some(max) = max_position_embeddings {
                            factor = (max as f64 / original) as f32;
                        }
                        original as f32
                    }
                    None => max_position_embeddings.ok_or_else(|| ConfigError::Missing {
                        key: "max_position_embeddings".into(),
                        why: "yarn needs the original context".into(),
                    })? as f32,
                };
                let mscale = number("mscale")?.map(|v| v as f32);
                let mscale_all_dim = number("mscale_all_dim")?.map(|v| v as f32);
                let attention_factor = match number("attention_factor")? {
                    Some(f) => f as f32,
                    None => match (mscale, mscale_all_dim) {
                        (Some(m), Some(all)) if m != 0.0 && all != 0.0 => {
                            yarn_mscale(factor, m) / yarn_mscale(factor, all)
                        }
                        _ => yarn_mscale(factor, 1.0),
                    },
                };
                let truncate = match map.get("truncate") {
                    None | Some(serde_json::Value::Null) => true,
                    Some(serde_json::Value::Bool(b)) => *b,
                    Some(other) => {
                        return Err(ConfigError::Invalid {
                            key: format!("{key}.truncate"),
                            value: other.to_string(),
                            why: "is not a boolean".into(),
                        })
                    }
                };
                RopeScaling::Yarn {
                    factor,
                    original_max_position_embeddings: original,
                    beta_fast: number("beta_fast")?.map_or(32.0, |v| v as f32),
                    beta_slow: number("beta_slow")?.map_or(1.0, |v| v as f32),
                    truncate,
                    attention_factor,
                }
            }
            _ => unreachable!("refused above"),
        };
        Ok(RopeSpec { theta, scaling })
    }

    /// The period of each rotary pair (`head_dim / 2`) where the adjustment changes the
    /// frequencies themselves; `None` where they are plain `θ^(2i/d)` (the rotation may still
    /// scale positions: [`RopeSpec::position_scale`]).
    pub fn periods(&self, head_dim: i32) -> Option<Vec<f32>> {
        let half = (head_dim / 2).max(0);
        let plain = |i: i32| self.theta.powf(2.0 * i as f32 / head_dim as f32);
        match &self.scaling {
            RopeScaling::None | RopeScaling::Linear { .. } => None,
            RopeScaling::Factors(factors) => Some(
                (0..half)
                    .map(|i| plain(i) * factors.get(i as usize).copied().unwrap_or(1.0))
                    .collect(),
            ),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: context,
            } => {
                // As Llama 3.1's reference (and transformers) compute it, in float32:
                // wavelengths past the original context's low-frequency bound are stretched by
                // `factor`, those between the bounds interpolated smoothly, the short ones kept.
                let low_wavelen = context / low_freq_factor;
                let high_wavelen = context / high_freq_factor;
                Some(
                    (0..half)
                        .map(|i| {
                            let period = plain(i);
                            let wavelen = 2.0 * std::f32::consts::PI * period;
                            if wavelen > low_wavelen {
                                period * factor
                            } else if wavelen > high_wavelen {
                                let smooth = (context / wavelen - low_freq_factor)
                                    / (high_freq_factor - low_freq_factor);
                                period / ((1.0 - smooth) / factor + smooth)
                            } else {
                                period
                            }
                        })
                        .collect(),
                )
            }
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: original,
                beta_fast,
                beta_slow,
                truncate,
                ..
            } => {
                let dim = head_dim as f32;
                let base = self.theta;
                // The pair index at which a frequency turns `rotations` times over the
                // original context.
                let correction = |rotations: f32| {
                    (dim * (original / (rotations * 2.0 * std::f32::consts::PI)).ln())
                        / (2.0 * base.ln())
                };
                let (mut low, mut high) = (correction(*beta_fast), correction(*beta_slow));
                if *truncate {
                    low = low.floor();
                    high = high.ceil();
                }
                let low = low.max(0.0);
                let high = high.min(dim - 1.0);
                let high = if low == high { high + 0.001 } else { high };
                Some(
                    (0..half)
                        .map(|i| {
                            let pos_freq = plain(i);
                            let extrapolation = 1.0 / pos_freq;
                            let interpolation = 1.0 / (factor * pos_freq);
                            let ramp = ((i as f32 - low) / (high - low)).clamp(0.0, 1.0);
                            let extrapolation_share = 1.0 - ramp;
                            let inverse = interpolation * (1.0 - extrapolation_share)
                                + extrapolation * extrapolation_share;
                            1.0 / inverse
                        })
                        .collect(),
                )
            }
        }
    }

    /// What positions are multiplied by before the angles (`1 / factor` under linear scaling).
    pub fn position_scale(&self) -> f32 {
        match self.scaling {
            RopeScaling::Linear { factor } => 1.0 / factor,
            _ => 1.0,
        }
    }

    /// What the rotated queries and keys are each multiplied by (YaRN's attention factor; 1
    /// elsewhere). Both are, so the attention scores are scaled by its square.
    pub fn attention_factor(&self) -> f32 {
        match self.scaling {
            RopeScaling::Yarn {
                attention_factor, ..
            } => attention_factor,
            _ => 1.0,
        }
    }

    /// Checks the numbers are usable, naming the one that is not.
    pub fn validate(&self, what: &str) -> Result<(), String> {
        let positive = |name: &str, v: f32| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(format!("{what}: rope {name} is {v}; it must be positive"))
            }
        };
        positive("theta", self.theta)?;
        match &self.scaling {
            RopeScaling::None | RopeScaling::Factors(_) => Ok(()),
            RopeScaling::Linear { factor } => positive("factor", *factor),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                positive("factor", *factor)?;
                positive("low_freq_factor", *low_freq_factor)?;
                positive(
                    "original_max_position_embeddings",
                    *original_max_position_embeddings,
                )?;
                if high_freq_factor <= low_freq_factor {
                    return Err(format!(
                        "{what}: rope high_freq_factor {high_freq_factor} is not above \
                         low_freq_factor {low_freq_factor}"
                    ));
                }
                Ok(())
            }
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                attention_factor,
                ..
            } => {
                positive("factor", *factor)?;
                positive(
                    "original_max_position_embeddings",
                    *original_max_position_embeddings,
                )?;
                positive("beta_fast", *beta_fast)?;
                positive("beta_slow", *beta_slow)?;
                positive("attention_factor", *attention_factor)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(dict: serde_json::Value) -> Result<RopeSpec, ConfigError> {
        RopeSpec::from_hf_dict("rope_parameters", Some(&dict), None, Some(131_072))
    }

    #[test]
    fn llama3_matches_transformers_values() {
        // Llama 3.2 1B: head_dim 64, θ 500000, factor 32, low 1, high 4, original 8192.
        let spec = parse(
            json!({"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}),
        )
        .expect("llama3");
        let periods = spec.periods(64).expect("periods");
        // transformers' _compute_llama3_parameters (float32): the first pair is untouched, the
        // last stretched by the factor, one in the middle band interpolated.
        assert_eq!(periods[0], 1.0);
        let plain_last = 500000f32.powf(62.0 / 64.0);
        assert!((periods[31] / (plain_last * 32.0) - 1.0).abs() < 1e-6);
        let plain = |i: i32| 500000f32.powf(2.0 * i as f32 / 64.0);
        let middle = (0..32).find(|&i| {
            let w = 2.0 * std::f32::consts::PI * plain(i);
            w > 8192.0 / 4.0 && w < 8192.0
        });
        let i = middle.expect("a pair in the smooth band");
        let ratio = periods[i as usize] / plain(i);
        assert!(ratio > 1.0 && ratio < 32.0, "ratio {ratio}");
    }

    #[test]
    fn yarn_follows_transformers() {
        // Qwen2.5 with yarn factor 4 over 32768: transformers overrides the factor by the
        // contexts' ratio, and attention_factor = 0.1 ln(4) + 1.
        let spec = RopeSpec::from_hf_dict(
            "rope_scaling",
            Some(&json!({"type": "yarn", "factor": 4.0,
                "original_max_position_embeddings": 32768})),
            Some(1_000_000.0),
            Some(131_072),
        )
        .expect("yarn");
        assert!((spec.attention_factor() - (0.1 * 4f32.ln() + 1.0)).abs() < 1e-7);
        let periods = spec.periods(128).expect("periods");
        // High frequencies extrapolate (unchanged), the lowest interpolate (times factor).
        assert!((periods[0] - 1.0).abs() < 1e-6);
        let plain_last = 1_000_000f32.powf(126.0 / 128.0);
        assert!((periods[63] / (plain_last * 4.0) - 1.0).abs() < 1e-5);
    }

    #[test]
    fn dynamic_is_default_within_the_context_and_unknown_types_are_refused() {
        let dynamic = parse(json!({"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}))
            .expect("dynamic");
        assert_eq!(dynamic.scaling, RopeScaling::None);
        for kind in ["longrope", "mrope", "su"] {
            let err = parse(json!({"rope_type": kind, "rope_theta": 1e4})).unwrap_err();
            let text = err.to_string();
            assert!(text.contains(kind) && text.contains("rope_type"), "{text}");
        }
    }

    #[test]
    fn unknown_or_misplaced_parameters_are_refused_by_name() {
        let err = parse(json!({"rope_type": "default", "rope_theta": 1e4, "zoom": 3})).unwrap_err();
        assert!(err.to_string().contains("rope_parameters.zoom"), "{err}");
        let err = parse(
            json!({"rope_type": "linear", "rope_theta": 1e4, "factor": 8.0,
            "low_freq_factor": 1.0}),
        )
        .unwrap_err();
        assert!(err.to_string().contains("low_freq_factor"), "{err}");
        let err = parse(json!({"rope_theta": 1e4, "partial_rotary_factor": 0.5})).unwrap_err();
        assert!(err.to_string().contains("partial_rotary_factor"), "{err}");
    }

    #[test]
    fn theta_must_be_stated() {
        let err = RopeSpec::from_hf_dict("rope_scaling", None, None, None).unwrap_err();
        assert!(err.to_string().contains("rope_theta"), "{err}");
        let spec = RopeSpec::from_hf_dict("rope_scaling", None, Some(1e6), None).expect("plain");
        assert_eq!(spec, RopeSpec::plain(1e6));
    }
}
