use super::*;
use clap::Parser;

/// `hunch serve`'s flags alone (the command line itself is parsed by the CLI module, above this one).
#[derive(Debug, Parser)]
struct Serve {
    #[command(flatten)]
    args: ServeArgs,
}

fn args(line: &[&str]) -> ServeArgs {
    let mut argv = vec!["hunch-serve"];
    argv.extend_from_slice(line);
    Serve::try_parse_from(argv).expect("valid flags").args
}

fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let vars: Vec<(String, String)> = vars
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
    move |name| vars.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone())
}

fn file(text: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("hunch.toml");
    std::fs::write(&path, text).expect("write config");
    let path = path.to_string_lossy().into_owned();
    (dir, path)
}

const FILE: &str = r#"
    listen = "0.0.0.0:9000"
    request_timeout = 5
    api_keys = ["from-file"]
    sidecar_args = ["--dtype=float32"]
    no_demo = true
    [[models]]
    name = "filed"
    dir = "/m/filed"
    [[upstreams]]
    name = "remote"
    url = "http://127.0.0.1:1"
    key = "k"
    [aliases]
    fast = "filed"
"#;

#[test]
fn a_flag_wins_over_its_variable_which_wins_over_the_file() {
    let (_dir, path) = file(FILE);
    let s = Settings::resolve(
        &args(&[
            "--config",
            &path,
            "--listen",
            "127.0.0.1:0",
            "--api-key",
            "a",
        ]),
        &env(&[
            ("HUNCH_LISTEN", "127.0.0.1:1"),
            ("HUNCH_API_KEYS", "b, c"),
            ("HUNCH_REQUEST_TIMEOUT", "7"),
            ("HUNCH_SIDECAR_ARGS", "--dtype=bfloat16 --queue 8"),
        ]),
    )
    .unwrap();
    assert_eq!(s.listen, "127.0.0.1:0");
    // Lists are not merged: the flags' keys replace the variable's and the file's.
    assert_eq!(s.api_keys, vec!["a"]);
    assert_eq!(s.limits.request_timeout, Duration::from_secs(7));
    assert_eq!(s.sidecar_args, vec!["--dtype=bfloat16", "--queue", "8"]);
    assert_eq!(s.fallback, Fallback::Nothing, "the file's no_demo = true");
    assert_eq!(s.aliases, vec![("fast".to_string(), "filed".to_string())]);
}

#[test]
fn the_variable_wins_over_the_file_for_lists_too() {
    let (_dir, path) = file(FILE);
    let s = Settings::resolve(
        &args(&["--sidecar-arg=--queue=2"]),
        &env(&[
            ("HUNCH_CONFIG", path.as_str()),
            ("HUNCH_API_KEYS", "b, c"),
            ("HUNCH_NO_DEMO", "false"),
        ]),
    )
    .unwrap();
    assert_eq!(
        s.listen, "0.0.0.0:9000",
        "the file named by HUNCH_CONFIG is read"
    );
    assert_eq!(s.api_keys, vec!["b", "c"]);
    assert_eq!(s.sidecar_args, vec!["--queue=2"]);
    assert!(
        matches!(s.fallback, Fallback::DefaultModel(_)),
        "HUNCH_NO_DEMO=false overrides the file's no_demo = true: {:?}",
        s.fallback
    );
}

#[test]
fn the_quality_directory_is_beside_the_models_cache_unless_set() {
    let quality = |line: &[&str], vars: &[(&str, &str)]| {
        Settings::resolve(&args(line), &env(vars))
            .unwrap()
            .quality_dir
    };
    let home = ("HOME", "/home/u");
    assert_eq!(
        quality(&[], &[home]),
        Some(PathBuf::from("/home/u/.cache/hunch/quality"))
    );
    assert_eq!(
        quality(&[], &[home, ("HUNCH_MODELS_CACHE", "/srv/models")]),
        Some(PathBuf::from("/srv/quality"))
    );
    assert_eq!(
        quality(&[], &[home, ("HUNCH_QUALITY_DIR", "/q")]),
        Some(PathBuf::from("/q"))
    );
    assert_eq!(
        quality(&["--quality-dir", "/flag"], &[("HUNCH_QUALITY_DIR", "/q")]),
        Some(PathBuf::from("/flag"))
    );
    assert_eq!(quality(&[], &[]), None);
}

#[test]
fn with_no_model_the_default_model_is_looked_for_in_the_models_cache_unless_set() {
    let cached = |path: &str| {
        Fallback::DefaultModel(DefaultModel::Cached(
            PathBuf::from(path).join(default_model::DEFAULT_MODEL_FILE),
        ))
    };
    let s = Settings::resolve(&args(&[]), &env(&[("HOME", "/home/u")])).unwrap();
    assert_eq!(s.fallback, cached("/home/u/.cache/hunch/models"));
    let s = Settings::resolve(
        &args(&[]),
        &env(&[("HOME", "/home/u"), ("HUNCH_MODELS_CACHE", "/models")]),
    )
    .unwrap();
    assert_eq!(s.fallback, cached("/models"));
    let s = Settings::resolve(&args(&[]), &env(&[])).unwrap();
    assert_eq!(s.fallback, Fallback::DefaultModel(DefaultModel::Nowhere));

    // The setting, from each source, in the usual order.
    let configured =
        |path: &str| Fallback::DefaultModel(DefaultModel::Configured(PathBuf::from(path)));
    let (_dir, path) = file("default_model = \"/file/m.gguf\"\n");
    let home = ("HOME", "/home/u");
    let s = Settings::resolve(&args(&["--config", &path]), &env(&[home])).unwrap();
    assert_eq!(s.fallback, configured("/file/m.gguf"));
    let s = Settings::resolve(
        &args(&["--config", &path]),
        &env(&[home, ("HUNCH_DEFAULT_MODEL", "/env/m.gguf")]),
    )
    .unwrap();
    assert_eq!(s.fallback, configured("/env/m.gguf"));
    let s = Settings::resolve(
        &args(&["--config", &path, "--default-model", "/flag/Qwen3-4B"]),
        &env(&[home, ("HUNCH_DEFAULT_MODEL", "/env/m.gguf")]),
    )
    .unwrap();
    assert_eq!(s.fallback, configured("/flag/Qwen3-4B"));
}

#[test]
fn demo_serves_the_demo_and_contradicting_no_demo_is_refused_in_one_source() {
    let s = Settings::resolve(&args(&["--demo"]), &env(&[])).unwrap();
    assert_eq!(s.fallback, Fallback::Demo);
    let s = Settings::resolve(&args(&[]), &env(&[("HUNCH_DEMO", "true")])).unwrap();
    assert_eq!(s.fallback, Fallback::Demo);
    let (_dir, path) = file("demo = true\n");
    let s = Settings::resolve(&args(&["--config", &path]), &env(&[])).unwrap();
    assert_eq!(s.fallback, Fallback::Demo);
    // A higher source decides the choice whole: the flag's --demo over the file's no_demo,
    // the flag's --no-demo over the variable's demo.
    let (_dir, no_demo) = file(FILE);
    let s = Settings::resolve(&args(&["--config", &no_demo, "--demo"]), &env(&[])).unwrap();
    assert_eq!(s.fallback, Fallback::Demo);
    let s = Settings::resolve(&args(&["--no-demo"]), &env(&[("HUNCH_DEMO", "1")])).unwrap();
    assert_eq!(s.fallback, Fallback::Nothing);
    // Both on in one source is a contradiction.
    let err = Settings::resolve(&args(&["--demo", "--no-demo"]), &env(&[])).unwrap_err();
    assert!(err.to_string().contains("both on"), "{err}");
    let (_dir, both) = file("demo = true\nno_demo = true\n");
    assert!(Settings::resolve(&args(&["--config", &both]), &env(&[])).is_err());
}

#[test]
fn a_gguf_file_is_a_model_named_by_its_lower_cased_stem() {
    let s = Settings::resolve(
        &args(&[
            "--model",
            "/m/gemma-3-4b-it-Q4_0.gguf",
            "--model",
            "qwen3=/m/Qwen3-4B",
        ]),
        &env(&[]),
    )
    .unwrap();
    let models: Vec<_> = s
        .models
        .iter()
        .map(|m| (m.name.clone(), m.source.clone()))
        .collect();
    assert_eq!(
        models,
        vec![
            (
                Some("gemma-3-4b-it-q4_0".to_string()),
                Source::Sidecar {
                    path: "/m/gemma-3-4b-it-Q4_0.gguf".into()
                }
            ),
            (
                Some("qwen3".to_string()),
                Source::Sidecar {
                    path: "/m/Qwen3-4B".into()
                }
            ),
        ]
    );
    let (_dir, path) = file("[[models]]\npath = \"/m/SmolLM2-135M-Instruct.Q4_1.gguf\"\n");
    let s = Settings::resolve(&args(&["--config", &path]), &env(&[])).unwrap();
    assert_eq!(
        s.models[0].name.as_deref(),
        Some("smollm2-135m-instruct.q4_1")
    );
}

#[test]
fn the_drain_delay_is_zero_unless_set_and_may_be_zero() {
    let unset = Settings::resolve(&args(&[]), &env(&[])).unwrap();
    assert_eq!(unset.drain_delay, std::time::Duration::ZERO);
    let set = Settings::resolve(&args(&[]), &env(&[("HUNCH_DRAIN_DELAY", "2.5")])).unwrap();
    assert_eq!(set.drain_delay, std::time::Duration::from_millis(2500));
    let zero = Settings::resolve(&args(&["--drain-delay", "0"]), &env(&[])).unwrap();
    assert_eq!(zero.drain_delay, std::time::Duration::ZERO);
    let wrong = Settings::resolve(&args(&["--drain-delay=-1"]), &env(&[])).unwrap_err();
    assert!(wrong.to_string().contains("drain_delay"), "{wrong}");
}

#[test]
fn the_memory_limit_reads_as_a_size_from_each_source() {
    let (_dir, path) = file("memory_limit = \"48G\"\n");
    let from_file = Settings::resolve(&args(&["--config", &path]), &env(&[])).unwrap();
    assert_eq!(from_file.memory_limit, Some(48 << 30));
    let (_dir, bytes) = file("memory_limit = 4096\n");
    let in_bytes = Settings::resolve(&args(&["--config", &bytes]), &env(&[])).unwrap();
    assert_eq!(in_bytes.memory_limit, Some(4096));
    let from_env = Settings::resolve(
        &args(&["--config", &path]),
        &env(&[("HUNCH_MEMORY_LIMIT", "512M")]),
    )
    .unwrap();
    assert_eq!(from_env.memory_limit, Some(512 << 20));
    let from_flag = Settings::resolve(
        &args(&["--memory-limit", "1.5G"]),
        &env(&[("HUNCH_MEMORY_LIMIT", "512M")]),
    )
    .unwrap();
    assert_eq!(from_flag.memory_limit, Some(3 << 29));
    let unset = Settings::resolve(&args(&[]), &env(&[])).unwrap();
    assert_eq!(unset.memory_limit, None);

    let wrong = Settings::resolve(&args(&[]), &env(&[("HUNCH_MEMORY_LIMIT", "lots")]))
        .expect_err("not a size");
    assert!(wrong.to_string().contains("HUNCH_MEMORY_LIMIT"), "{wrong}");
    let (_dir, wrong_file) = file("memory_limit = \"12X\"\n");
    let wrong =
        Settings::resolve(&args(&["--config", &wrong_file]), &env(&[])).expect_err("not a size");
    assert!(
        wrong.to_string().contains("\"12X\" is not a memory size"),
        "{wrong}"
    );
    assert!(
        Serve::try_parse_from(["hunch-serve", "--memory-limit", "much"]).is_err(),
        "the flag is checked when parsed"
    );
}

#[test]
fn models_come_from_the_source_that_sets_each_kind_in_kind_order() {
    let (_dir, path) = file(FILE);
    let s = Settings::resolve(
        &args(&["--config", &path, "--upstream", "up=jev-latest@https://h"]),
        &env(&[("HUNCH_ACCELERATORS", "http://127.0.0.1:5")]),
    )
    .unwrap();
    let names: Vec<_> = s.models.iter().map(|m| m.name.clone()).collect();
    // The file's model, the variable's accelerator (named by its /health), the flag's
    // upstream, which replaced the file's.
    assert_eq!(names, vec![Some("filed".into()), None, Some("up".into())]);
    assert_eq!(
        s.models[2].source,
        Source::Upstream {
            url: "https://h".into(),
            remote_model: "jev-latest".into(),
            key: None
        }
    );
    let s = Settings::resolve(&args(&["--config", &path]), &env(&[])).unwrap();
    assert_eq!(
        s.models[1].source,
        Source::Upstream {
            url: "http://127.0.0.1:1".into(),
            remote_model: "remote".into(),
            key: Some("k".into())
        }
    );
}

#[test]
fn the_sidecar_binary_is_read_from_the_variable_in_the_settings() {
    let s =
        Settings::resolve(&args(&[]), &env(&[("HUNCH_ACCELERATOR_BIN", "/x/sidecar")])).unwrap();
    assert_eq!(s.accelerator_bin, PathBuf::from("/x/sidecar"));
    let s = Settings::resolve(&args(&[]), &env(&[])).unwrap();
    assert!(s.accelerator_bin.ends_with(SIDECAR_BIN));
}

#[test]
fn bad_values_are_refused() {
    assert!(Settings::resolve(&args(&["--request-timeout=-1"]), &env(&[])).is_err());
    assert!(Settings::resolve(&args(&["--alias", "nope"]), &env(&[])).is_err());
    assert!(Settings::resolve(&args(&["--alias", "a=b", "--alias", "a=c"]), &env(&[])).is_err());
    assert!(toml::from_str::<Layer>("nonsense = 1").is_err());
    // A required decision log must give up on a hung disk before the request times out.
    let required = ["--decision-log", "/d", "--decision-log-required"];
    let slow = [&required[..], &["--request-timeout", "1"]].concat();
    assert!(Settings::resolve(&args(&slow), &env(&[])).is_err());
    let fast = [&slow[..], &["--decision-log-write-timeout", "0.5"]].concat();
    assert!(Settings::resolve(&args(&fast), &env(&[])).is_ok());
    let (_dir, path) = file("listen = 5");
    let err = Settings::resolve(&args(&["--config", &path]), &env(&[])).unwrap_err();
    assert!(err.to_string().contains("hunch.toml"), "{err}");
}
