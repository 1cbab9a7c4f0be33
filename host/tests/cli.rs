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
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a directory"));
    let out = hunch()
        .args(["serve", "--listen", "127.0.0.1:0", "--model", "x=/tmp"])
        .env("HUNCH_ACCELERATOR_BIN", "/definitely/not/a/binary")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no sidecar binary"));
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
