//! Every key of a checkpoint's configuration accounted for: honoured (a field of the family's
//! config), known not to change the math, or refused by name — so the day a converter writes a
//! key Hunch has never seen, the load stops and says so instead of guessing
//! (docs/models.md, "Configs").
//!
//! A user who knows a new key is harmless names it for one model (`ignore_config_keys` in
//! `hunch-models.toml`); [`audit`] then skips it and reports it as ignored.

/// Why a configuration was refused; each names the key and, where there is one, its value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    #[error("{field} is {value:?}, which is not a family Hunch serves; it serves {served}")]
    UnknownFamily {
        field: &'static str,
        value: String,
        served: &'static str,
    },
    #[error(
        "{key} = {value} is not a key Hunch knows for {family}, so it cannot tell whether it \
         changes the model; if it does not, list it in the model's ignore_config_keys \
         (hunch-models.toml)"
    )]
    UnknownKey {
        key: String,
        value: String,
        family: &'static str,
    },
    #[error("{key} = {value}: {why}")]
    Unsupported {
        key: String,
        value: String,
        why: String,
    },
    #[error("{key} = {value} {why}")]
    Invalid {
        key: String,
        value: String,
        why: String,
    },
    #[error("{key} is missing: {why}")]
    Missing { key: String, why: String },
    #[error("{0}")]
    Inconsistent(String),
}

/// Keys of Hugging Face configs that never change a forward pass: identity, serialisation,
/// generation and training settings, token ids (the tokenizer's files are what the read uses).
/// transformers 4.2x wrote every `PretrainedConfig` default into config.json, hence the length.
pub const HF_HARMLESS: &[&str] = &[
    "_name_or_path",
    "architectures",
    "auto_map",
    "model_type",
    "torch_dtype",
    "dtype",
    "transformers_version",
    "use_cache",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "sep_token_id",
    "unk_token_id",
    "decoder_start_token_id",
    "initializer_range",
    "attention_dropout",
    "hidden_dropout",
    "embd_pdrop",
    "resid_pdrop",
    "output_attentions",
    "output_hidden_states",
    "return_dict",
    "torchscript",
    "use_bfloat16",
    "tf_legacy_loss",
    "pruned_heads",
    "chunk_size_feed_forward",
    "is_encoder_decoder",
    "is_decoder",
    "cross_attention_hidden_size",
    "add_cross_attention",
    "tie_encoder_decoder",
    "finetuning_task",
    "id2label",
    "label2id",
    "problem_type",
    "prefix",
    "task_specific_params",
    "tokenizer_class",
    "max_length",
    "min_length",
    "do_sample",
    "early_stopping",
    "num_beams",
    "num_beam_groups",
    "diversity_penalty",
    "temperature",
    "top_k",
    "top_p",
    "typical_p",
    "repetition_penalty",
    "length_penalty",
    "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size",
    "bad_words_ids",
    "num_return_sequences",
    "output_scores",
    "return_dict_in_generate",
    "forced_bos_token_id",
    "forced_eos_token_id",
    "remove_invalid_values",
    "exponential_decay_length_penalty",
    "suppress_tokens",
    "begin_suppress_tokens",
    "cache_implementation",
    "pretraining_tp",
    // mlx-community's record of how the weights were quantised: the loader reads bits and
    // group size from each tensor's shapes instead (docs/checkpoint-layouts.md).
    "quantization",
    "quantization_config",
];

/// The value of a key as the error messages show it.
pub fn shown(value: &serde_json::Value) -> String {
    let text = value.to_string();
    if text.chars().count() > 80 {
        format!("{}…", text.chars().take(80).collect::<String>())
    } else {
        text
    }
}

/// Checks that every key of `map` is `honoured` by `family`'s reader, listed as harmless, or
/// named in `ignored` by the user; returns the user-ignored keys the config holds. `prefix`
/// names the object in errors (`""` at the top level, `"text_config."` inside one).
pub fn audit(
    map: &serde_json::Map<String, serde_json::Value>,
    family: &'static str,
    prefix: &str,
    honoured: &[&str],
    harmless: &[&str],
    ignored: &[String],
) -> Result<Vec<String>, ConfigError> {
    let mut skipped = Vec::new();
    for (key, value) in map {
        let full = format!("{prefix}{key}");
        if honoured.contains(&key.as_str()) || harmless.contains(&key.as_str()) {
            continue;
        }
        if ignored.iter().any(|k| k == &full || k == key) {
            skipped.push(full);
            continue;
        }
        return Err(ConfigError::UnknownKey {
            key: full,
            value: shown(value),
            family,
        });
    }
    Ok(skipped)
}

/// A non-HF `quantization_config` (GPTQ, AWQ, bitsandbytes, FP8) means tensors Hunch does not
/// read; mlx-community's (bits and group size only) is fine.
pub fn check_quantization_config(
    map: &serde_json::Map<String, serde_json::Value>,
) -> Result<(), ConfigError> {
    if let Some(method) = map
        .get("quantization_config")
        .and_then(|q| q.get("quant_method"))
    {
        return Err(ConfigError::Unsupported {
            key: "quantization_config.quant_method".into(),
            value: shown(method),
            why: "checkpoints of that quantisation method are not read (mlx-community's \
                  affine layout and GGUF are)"
                .into(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unknown_keys_are_refused_by_name_unless_ignored() {
        let map = json!({"hidden_size": 8, "torch_dtype": "float32", "attn_zoom": 2.5});
        let map = map.as_object().expect("object");
        let err = audit(map, "llama", "", &["hidden_size"], HF_HARMLESS, &[]).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("attn_zoom = 2.5") && text.contains("ignore_config_keys"),
            "{text}"
        );
        let skipped = audit(
            map,
            "llama",
            "",
            &["hidden_size"],
            HF_HARMLESS,
            &["attn_zoom".to_owned()],
        )
        .expect("ignored");
        assert_eq!(skipped, vec!["attn_zoom".to_owned()]);
    }

    #[test]
    fn foreign_quantisation_is_refused() {
        let map = json!({"quantization_config": {"quant_method": "gptq", "bits": 4}});
        let err = check_quantization_config(map.as_object().expect("object")).unwrap_err();
        assert!(err.to_string().contains("gptq"), "{err}");
        let mlx = json!({"quantization_config": {"group_size": 64, "bits": 4}});
        check_quantization_config(mlx.as_object().expect("object")).expect("mlx");
    }
}
