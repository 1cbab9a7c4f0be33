//! The `hunch` binary's command line (and, as a side effect, cargo builds `target/*/hunch` for
//! `cargo test -p hunch`).

use std::process::Command;

fn hunch() -> Command {
    Command::new(env!("CARGO_BIN_EXE_hunch"))
}

#[test]
fn schema_and_openapi_print_json() {
    let out = hunch().arg("schema").output().unwrap();
    assert!(out.status.success());
    let schema: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(schema["title"], "SystemOneRequest");
    let out = hunch().arg("openapi").output().unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(doc["paths"]["/v1/systemone"].is_object());
}

#[test]
fn bad_configuration_exits_2_with_a_message() {
    let out = hunch()
        .args(["serve", "--upstream", "no-url-here"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--upstream"));
}

#[test]
fn a_missing_model_directory_or_sidecar_binary_fails_at_startup() {
    let out = hunch()
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--model",
            "x=/definitely/not/here",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("/definitely/not/here") && stderr.contains("does not exist"),
        "{stderr}"
    );
    // A model is a directory or a file; anything else is refused by name.
    #[cfg(unix)]
    {
        let out = hunch()
            .args(["serve", "--listen", "127.0.0.1:0", "--model", "x=/dev/null"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("/dev/null") && stderr.contains("neither a directory nor a file"),
            "{stderr}"
        );
    }
    let out = hunch()
        .args(["serve", "--listen", "127.0.0.1:0", "--model", "x=/tmp"])
        .env("HUNCH_ACCELERATOR_BIN", "/definitely/not/a/binary")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no sidecar binary"));
}

/// `hunch serve` with no model configured and `cache` as the models cache, whatever settings the
/// environment running the tests has.
fn serve_with_models_cache(cache: &std::path::Path) -> Command {
    let mut command = hunch();
    command
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("HUNCH_MODELS_CACHE", cache);
    for name in [
        "HUNCH_DEFAULT_MODEL",
        "HUNCH_DEMO",
        "HUNCH_NO_DEMO",
        "HUNCH_CONFIG",
        "HUNCH_MODELS",
        "HUNCH_ACCELERATORS",
        "HUNCH_UPSTREAMS",
    ] {
        command.env_remove(name);
    }
    command
}

#[test]
fn with_no_model_a_missing_default_model_fails_at_startup_saying_how_to_fetch_it() {
    let cache = tempfile::tempdir().unwrap();
    let out = serve_with_models_cache(cache.path()).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    for needle in [
        "scripts/fetch-default-model.sh",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "--model",
        "--demo",
    ] {
        assert!(stderr.contains(needle), "{stderr} lacks {needle}");
    }
    // Once the file is there the server gets as far as its sidecar (here a binary that does not
    // exist, so start-up fails on that instead), serving it under the model's name.
    std::fs::write(
        cache.path().join("SmolLM2-135M-Instruct.Q4_1.gguf"),
        b"GGUF",
    )
    .unwrap();
    let out = serve_with_models_cache(cache.path())
        .env("HUNCH_ACCELERATOR_BIN", "/definitely/not/a/binary")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("model smollm2-135m-instruct") && stderr.contains("no sidecar binary"),
        "{stderr}"
    );
}

#[test]
fn an_unreadable_upstream_ca_file_fails_at_startup_naming_it() {
    let out = hunch()
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            "up=https://127.0.0.1:9",
            "--upstream-ca-file",
            "/definitely/not/a/ca.pem",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("/definitely/not/a/ca.pem"), "{stderr}");
}
