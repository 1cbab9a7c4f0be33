//! Qwen2 and Qwen2.5 (dense): Llama's stack with biases on the query, key and value
//! projections (none on the output), optionally a sliding window on the layers from
//! `max_window_layers` on (`use_sliding_window`; off in every published Qwen2.5 instruct model).
//! What is the family's own is the reading of its `config.json`.

use super::config::{hf_ropes, layer_types, Architecture, CausalConfig, ConfigError, HfObject};
use super::keys::{audit, check_quantization_config, HF_HARMLESS};
use super::llama::{descended, Descended};

/// The keys Qwen2 and Qwen3 configs have beside Llama's ([`super::llama::SHARED_KEYS`]).
pub(super) const OWN_KEYS: &[&str] = &[
    "use_sliding_window",
    "sliding_window",
    "max_window_layers",
    "layer_types",
];

/// Every key a Qwen2 or Qwen3 reader honours.
pub(super) fn honoured() -> Vec<&'static str> {
    super::llama::SHARED_KEYS
        .iter()
        .chain(OWN_KEYS)
        .copied()
        .collect()
}

/// Which Qwen layers slide and over how much, as transformers' Qwen2/Qwen3 configs derive it:
/// `layer_types` where given, else the layers from `max_window_layers` on when
/// `use_sliding_window` is set; the window is `sliding_window` (ignored when nothing slides).
pub(super) fn sliding(hf: &HfObject<'_>, num_layers: i32) -> Result<(Vec<bool>, i32), ConfigError> {
    let use_window = hf.bool_or("use_sliding_window", false)?;
    let window = hf.opt_int("sliding_window")?.filter(|_| use_window);
    let layers = match layer_types(hf, num_layers)? {
        Some(types) => types,
        None => {
            let from = hf.int_or("max_window_layers", num_layers)?;
            (0..num_layers)
                .map(|i| window.is_some() && i >= from)
                .collect()
        }
    };
    if layers.iter().any(|&s| s) && window.is_none() {
        return Err(ConfigError::Inconsistent(format!(
            "{}layer_types has sliding layers but no sliding_window is in use \
             (use_sliding_window {use_window})",
            hf.prefix
        )));
    }
    Ok((layers, window.unwrap_or(0)))
}

/// The config of a `model_type: qwen2` object.
pub fn config_from_hf(hf: &HfObject<'_>, ignored: &[String]) -> Result<CausalConfig, ConfigError> {
    let ignored_config_keys = audit(
        hf.map,
        "qwen2",
        hf.prefix,
        &honoured(),
        HF_HARMLESS,
        ignored,
    )?;
    check_quantization_config(hf.map)?;
    // Qwen2's q/k/v biases are unconditional; transformers has no switch for them and none for
    // the output projection.
    if let Some(value) = hf.get("attention_bias") {
        if value.as_bool() != Some(true) {
            return Err(ConfigError::Unsupported {
                key: format!("{}attention_bias", hf.prefix),
                value: super::keys::shown(value),
                why: "Qwen2's query, key and value projections always have biases".into(),
            });
        }
    }
    let (sliding_layers, sliding_window) = sliding(hf, hf.int("num_hidden_layers")?)?;
    descended(
        hf,
        Descended {
            architecture: Architecture::Qwen2,
            sliding_layers,
            sliding_window,
            ropes: hf_ropes(hf, 10_000.0, None)?,
            qkv_bias: true,
            o_bias: false,
            tie_default: false,
            max_positions_default: 32_768,
            ignored_config_keys,
        },
    )
}
