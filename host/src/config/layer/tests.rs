use super::*;

/// A valid value for each variable, as a user would write it.
fn sample(env: &str) -> &'static str {
    match env {
        "HUNCH_MODELS" => "a=/m/a,/m/b",
        "HUNCH_ACCELERATORS" => "x=http://127.0.0.1:1",
        "HUNCH_UPSTREAMS" => "up=jev-latest@https://example.com",
        "HUNCH_API_KEYS" => "k1, k2",
        "HUNCH_ALIASES" => "fast=a",
        "HUNCH_CHAT_TEMPLATES" => "a=chatml",
        "HUNCH_SIDECAR_ARGS" => "--dtype=bfloat16 --queue 8",
        "HUNCH_MAX_BODY_BYTES" | "HUNCH_MAX_CONCURRENT_READS" | "HUNCH_MAX_QUEUED_READS" => "7",
        "HUNCH_CONSOLE_DECISIONS" => "7",
        "HUNCH_REQUEST_TIMEOUT" | "HUNCH_SHUTDOWN_GRACE" | "HUNCH_DRAIN_DELAY" => "2.5",
        "HUNCH_NO_DEMO" | "HUNCH_DEMO" => "1",
        "HUNCH_QUESTIONS" => "joint",
        "HUNCH_PRIOR" => "divide",
        "HUNCH_ORDER" => "cyclic_average",
        "HUNCH_ANSWER_CACHE_MB" => "64",
        "HUNCH_MEMORY_LIMIT" | "HUNCH_POLICY_MAX_MEMORY" | "HUNCH_MEMORY_BUDGET" => "48M",
        "HUNCH_POLICY_MAX_STACK" => "1M",
        "HUNCH_POLICY_POOL" | "HUNCH_POLICY_SHADOW_RUNS" | "HUNCH_POLICY_MAX_FUEL" => "9",
        "HUNCH_BUNDLE_POLL" | "HUNCH_BUNDLE_STALE_AFTER" | "HUNCH_MODEL_TTL" => "10s",
        "HUNCH_BUNDLE_ALLOW_UNSIGNED" => "true",
        _ => "some-value",
    }
}

#[test]
fn every_variable_and_every_key_sets_its_setting() {
    for (flag, env, key) in SETTINGS {
        let value = sample(env);
        let from_env = Layer::from_env(&|name| (name == *env).then(|| value.to_string()))
            .unwrap_or_else(|e| panic!("{env}={value}: {e}"));
        assert_ne!(from_env, Layer::default(), "{env} sets nothing");
        let toml_value = match *key {
            "models" => "[{ dir = \"/m\" }]".to_string(),
            "accelerators" => "[{ url = \"http://h:1\" }]".to_string(),
            "upstreams" => "[{ name = \"u\", url = \"http://h:1\" }]".to_string(),
            "api_keys" | "sidecar_args" | "models_dirs" => "[\"a\"]".to_string(),
            "aliases" => "{ fast = \"a\" }".to_string(),
            "chat_templates" => "{ a = \"chatml\" }".to_string(),
            "no_demo" | "demo" => "true".to_string(),
            "questions" => "\"joint\"".to_string(),
            "prior" => "\"divide\"".to_string(),
            "order" => "\"reversed_average\"".to_string(),
            "answer_cache_mb" => "64".to_string(),
            "memory_limit" | "policy_max_memory" | "policy_max_stack" | "memory_budget" => {
                "\"48M\"".to_string()
            }
            "policy_pool" | "policy_shadow_runs" | "policy_max_fuel" => "9".into(),
            "max_body_bytes" | "max_concurrent_reads" | "max_queued_reads" => "7".into(),
            "console_decisions" => "7".into(),
            "request_timeout" | "shutdown_grace" | "drain_delay" => "2.5".into(),
            "bundle.poll" | "bundle.stale_after" | "model_ttl" => "\"10s\"".into(),
            "bundle.allow_unsigned" => "true".into(),
            _ => "\"v\"".to_string(),
        };
        let from_file: Layer = toml::from_str(&format!("{key} = {toml_value}"))
            .unwrap_or_else(|e| panic!("{key} ({flag}): {e}"));
        assert_ne!(from_file, Layer::default(), "{key} sets nothing");
    }
}

#[test]
fn lists_in_the_environment_parse_like_their_flags() {
    let env = |name: &str| {
        Some(
            match name {
                "HUNCH_MODELS" => "a=/m/a,/m/b",
                "HUNCH_SIDECAR_ARGS" => " --dtype=bfloat16  --queue 8 ",
                "HUNCH_API_KEYS" => "k1, ,k2",
                _ => return None,
            }
            .to_string(),
        )
    };
    let layer = Layer::from_env(&env).unwrap();
    let models = layer.models.unwrap();
    assert_eq!(models[0].name.as_deref(), Some("a"));
    assert_eq!(models[1].name.as_deref(), Some("b"));
    assert_eq!(
        layer.sidecar_args.unwrap(),
        vec!["--dtype=bfloat16", "--queue", "8"]
    );
    assert_eq!(layer.api_keys.unwrap(), vec!["k1", "k2"]);
}

#[test]
fn a_bad_variable_is_refused_by_name() {
    let err = Layer::from_env(&|name| (name == "HUNCH_MAX_BODY_BYTES").then(|| "lots".to_string()))
        .unwrap_err();
    assert!(err.to_string().contains("HUNCH_MAX_BODY_BYTES"), "{err}");
    let err = Layer::from_env(&|name| (name == "HUNCH_NO_DEMO").then(|| "maybe".to_string()))
        .unwrap_err();
    assert!(err.to_string().contains("HUNCH_NO_DEMO"), "{err}");
    let err =
        Layer::from_env(&|name| (name == "HUNCH_DEMO").then(|| "sure".to_string())).unwrap_err();
    assert!(err.to_string().contains("HUNCH_DEMO"), "{err}");
}

#[test]
fn a_models_path_is_read_from_the_file_as_path_or_as_dir() {
    let layer: Layer = toml::from_str(
        "[[models]]\npath = \"/m/gemma-3-4b-it-Q4_0.gguf\"\n[[models]]\ndir = \"/m/dg\"\n",
    )
    .expect("valid TOML");
    let models = layer.models.expect("models");
    assert_eq!(models[0].path, PathBuf::from("/m/gemma-3-4b-it-Q4_0.gguf"));
    assert_eq!(models[1].path, PathBuf::from("/m/dg"));
    assert!(toml::from_str::<Layer>("[[models]]\npath = \"/a\"\ndir = \"/b\"\n").is_err());
}

#[test]
fn the_source_that_turns_demo_or_no_demo_on_decides_both() {
    let on = |demo, no_demo| Layer {
        demo,
        no_demo,
        ..Layer::default()
    };
    let merged = on(Some(true), None).over(on(None, Some(true)));
    assert_eq!((merged.demo, merged.no_demo), (Some(true), None));
    let merged = on(None, Some(true)).over(on(Some(true), None));
    assert_eq!((merged.demo, merged.no_demo), (None, Some(true)));
    // A source that only turns one off leaves the other to the lower source.
    let merged = on(Some(false), None).over(on(None, Some(true)));
    assert_eq!((merged.demo, merged.no_demo), (Some(false), Some(true)));
}

#[test]
fn an_empty_variable_is_unset() {
    let layer = Layer::from_env(&|_| Some("  ".to_string())).unwrap();
    assert_eq!(layer, Layer::default());
}
