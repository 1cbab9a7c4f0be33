//! Every published config this family serves read as its authors meant, in both transformers
//! dialects: the `config.json` of SmolLM2, Qwen2.5, Qwen3, Gemma 3, Llama 3.2 and Mistral as their
//! repositories hold them (`tests/data/configs/v4`, transformers 4.x spelling) and as
//! transformers 5 writes the same models (`v5`, made by `make_dialects.py`: `rope_parameters`,
//! `layer_types`, `dtype`). Each pair must give the same configuration, with the values the
//! model cards state; configs that would change the math in a way Hunch does not implement must
//! be refused by name.

use std::path::{Path, PathBuf};

use hunch_accelerator::checkpoint::causal::config_from_json;
use hunch_accelerator::model::causal::{Architecture, CausalConfig, RopeScaling, RopeSpec};
use serde_json::{json, Value};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/configs")
}

fn read(dialect: &str, name: &str) -> Value {
    let path = dir().join(dialect).join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_json::from_str(&text).expect("json")
}

fn parse(json: &Value) -> CausalConfig {
    config_from_json(json, &[]).unwrap_or_else(|e| panic!("{e}"))
}

fn both(name: &str) -> CausalConfig {
    let old = parse(&read("v4", name));
    let new = parse(&read("v5", name));
    assert_eq!(old, new, "{name}: the two dialects disagree");
    old
}

const PUBLISHED: [&str; 10] = [
    "SmolLM2-135M-Instruct",
    "Qwen2.5-0.5B-Instruct",
    "Qwen2.5-1.5B-Instruct",
    "Qwen3-0.6B",
    "Qwen3-4B",
    "gemma-3-270m",
    "gemma-3-1b-it",
    "gemma-3-4b-it",
    "Llama-3.2-1B-Instruct",
    "Mistral-7B-Instruct-v0.3",
];

#[test]
fn every_published_config_reads_the_same_in_both_dialects() {
    for name in PUBLISHED {
        let config = both(name);
        assert!(config.ignored_config_keys.is_empty(), "{name}");
    }
}

#[test]
fn llama_family_values_are_the_model_cards() {
    let smol = both("SmolLM2-135M-Instruct");
    assert_eq!(smol.architecture, Architecture::Llama);
    assert_eq!(smol.rope, RopeSpec::plain(100_000.0));
    assert!(smol.tie_word_embeddings && !smol.qkv_bias);
    assert_eq!(
        (smol.num_heads, smol.num_kv_heads, smol.head_dim),
        (9, 3, 64)
    );

    let llama = both("Llama-3.2-1B-Instruct");
    assert_eq!(llama.rope.theta, 500_000.0);
    assert_eq!(
        llama.rope.scaling,
        RopeScaling::Llama3 {
            factor: 32.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192.0,
        }
    );
    assert_eq!(llama.max_position_embeddings, Some(131_072));

    let mistral = both("Mistral-7B-Instruct-v0.3");
    assert_eq!(mistral.architecture, Architecture::Llama);
    assert_eq!(mistral.rope, RopeSpec::plain(1_000_000.0));
    assert!(!mistral.tie_word_embeddings);
    assert!(mistral.sliding_layers.iter().all(|&s| !s));
    assert_eq!(mistral.rms_norm_eps, 1e-5);
}

#[test]
fn qwen_values_are_the_model_cards() {
    for name in ["Qwen2.5-0.5B-Instruct", "Qwen2.5-1.5B-Instruct"] {
        let qwen = both(name);
        assert_eq!(qwen.architecture, Architecture::Qwen2, "{name}");
        assert!(qwen.qkv_bias && !qwen.o_bias, "{name}");
        assert_eq!(qwen.rope, RopeSpec::plain(1_000_000.0), "{name}");
        // use_sliding_window is false: the window and max_window_layers change nothing.
        assert!(qwen.sliding_layers.iter().all(|&s| !s), "{name}");
        assert!(qwen.tie_word_embeddings, "{name}");
    }
    let qwen3 = both("Qwen3-4B");
    assert_eq!(qwen3.architecture, Architecture::Qwen3);
    assert_eq!((qwen3.num_heads, qwen3.head_dim), (32, 128));
    assert_eq!(qwen3.rope, RopeSpec::plain(1_000_000.0));
    assert!(!qwen3.qkv_bias);
}

#[test]
fn gemma3_values_are_the_model_cards() {
    let small = both("gemma-3-270m");
    assert_eq!(small.sliding_window, 512);
    assert_eq!(small.rope, RopeSpec::plain(1_000_000.0));
    assert_eq!(small.rope_local, RopeSpec::plain(10_000.0));
    let full: Vec<usize> = (0..18).filter(|&i| !small.sliding_layers[i]).collect();
    assert_eq!(full, vec![5, 11, 17]);

    // The multimodal 4B states only what differs from Gemma3TextConfig's defaults.
    let four = both("gemma-3-4b-it");
    assert_eq!(four.architecture, Architecture::Gemma3);
    assert_eq!(
        (four.num_layers, four.num_heads, four.num_kv_heads),
        (34, 8, 4)
    );
    assert_eq!(
        (four.head_dim, four.vocab_size, four.sliding_window),
        (256, 262_208, 1024)
    );
    assert_eq!(four.rope.scaling, RopeScaling::Linear { factor: 8.0 });
    assert_eq!(four.rope.theta, 1_000_000.0);
    assert_eq!(four.rope_local, RopeSpec::plain(10_000.0));
    assert_eq!(four.attention_scale, 256f32.powf(-0.5));
    assert!(four.tie_word_embeddings);
}

/// `edit` applied to a copy of a published config, which must then be refused with a message
/// holding each of `expect`.
fn refused(name: &str, edit: impl Fn(&mut serde_json::Map<String, Value>), expect: &[&str]) {
    for dialect in ["v4", "v5"] {
        let mut json = read(dialect, name);
        edit(json.as_object_mut().expect("object"));
        let err = config_from_json(&json, &[]).expect_err(name).to_string();
        for e in expect {
            assert!(err.contains(e), "{name} ({dialect}): {err:?} lacks {e:?}");
        }
    }
}

#[test]
fn what_would_change_the_math_is_refused_by_name() {
    refused(
        "Qwen3-0.6B",
        |m| {
            m.insert("attn_zoom".into(), json!(2.5));
        },
        &["attn_zoom", "2.5", "ignore_config_keys"],
    );
    refused(
        "Qwen2.5-0.5B-Instruct",
        |m| {
            m.insert("model_type".into(), json!("qwen2_moe"));
        },
        &["qwen2_moe", "not a family Hunch serves", "qwen2"],
    );
    refused(
        "SmolLM2-135M-Instruct",
        |m| {
            m.insert("mlp_bias".into(), json!(true));
        },
        &["mlp_bias", "true"],
    );
    refused(
        "SmolLM2-135M-Instruct",
        |m| {
            m.insert("hidden_act".into(), json!("gelu"));
        },
        &["hidden_act", "gelu"],
    );
    refused(
        "Llama-3.2-1B-Instruct",
        |m| {
            m.insert("sliding_window".into(), json!(4096));
        },
        &["sliding_window", "4096"],
    );
    refused(
        "gemma-3-1b-it",
        |m| {
            m.insert("attn_logit_softcapping".into(), json!(50.0));
        },
        &["attn_logit_softcapping", "50"],
    );
    refused(
        "Mistral-7B-Instruct-v0.3",
        |m| {
            m.insert(
                "quantization_config".into(),
                json!({"quant_method": "awq", "bits": 4}),
            );
        },
        &["quant_method", "awq"],
    );
}

#[test]
fn unknown_rope_types_and_parameters_are_refused_in_either_dialect() {
    let mut old = read("v4", "Llama-3.2-1B-Instruct");
    old["rope_scaling"]["rope_type"] = json!("longrope");
    let err = config_from_json(&old, &[]).unwrap_err().to_string();
    assert!(
        err.contains("longrope") && err.contains("rope_scaling.rope_type"),
        "{err}"
    );

    let mut new = read("v5", "Llama-3.2-1B-Instruct");
    new["rope_parameters"]["rope_type"] = json!("mrope");
    let err = config_from_json(&new, &[]).unwrap_err().to_string();
    assert!(
        err.contains("mrope") && err.contains("rope_parameters.rope_type"),
        "{err}"
    );

    let mut new = read("v5", "gemma-3-1b-it");
    new["rope_parameters"]["full_attention"]["attention_scaling"] = json!(2.0);
    let err = config_from_json(&new, &[]).unwrap_err().to_string();
    assert!(
        err.contains("rope_parameters.full_attention.attention_scaling"),
        "{err}"
    );

    // Both dialects in one file must agree.
    let mut mixed = read("v5", "Qwen3-0.6B");
    mixed["rope_theta"] = json!(10_000.0);
    let err = config_from_json(&mixed, &[]).unwrap_err().to_string();
    assert!(err.contains("disagree"), "{err}");
}

#[test]
fn keys_the_user_names_harmless_are_skipped_and_listed() {
    let mut json = read("v5", "Qwen3-0.6B");
    json["attn_zoom"] = json!(2.5);
    let config = config_from_json(&json, &["attn_zoom".to_owned()]).expect("ignored");
    assert_eq!(config.ignored_config_keys, vec!["attn_zoom".to_owned()]);
    let mut plain = read("v5", "Qwen3-0.6B");
    plain.as_object_mut().expect("object").remove("attn_zoom");
    let mut expected = config_from_json(&plain, &[]).expect("plain");
    expected.ignored_config_keys = config.ignored_config_keys.clone();
    assert_eq!(config, expected);
}

#[test]
fn yarn_and_dynamic_read_as_transformers_reads_them() {
    let mut json = read("v4", "Qwen2.5-1.5B-Instruct");
    json["rope_scaling"] = json!({"type": "yarn", "factor": 4.0,
        "original_max_position_embeddings": 32768});
    json["max_position_embeddings"] = json!(131072);
    let config = config_from_json(&json, &[]).expect("yarn");
    match config.rope.scaling {
        RopeScaling::Yarn {
            factor,
            attention_factor,
            ..
        } => {
            assert_eq!(factor, 4.0);
            assert!((attention_factor - (0.1 * 4f32.ln() + 1.0)).abs() < 1e-7);
        }
        other => panic!("{other:?}"),
    }
    let mut json = read("v4", "SmolLM2-135M-Instruct");
    json["rope_scaling"] = json!({"rope_type": "dynamic", "factor": 2.0});
    let config = config_from_json(&json, &[]).expect("dynamic");
    assert_eq!(config.rope, RopeSpec::plain(100_000.0));
}
