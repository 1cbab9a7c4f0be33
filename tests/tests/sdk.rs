//! The official clients against a real `hunch serve`: TypeSafe's Python SDK 0.7.5 (zstd bodies on,
//! every answer type parsed by its models) and `jevbench check`.
//!
//! The server is `start_hunch_for_clients`: the fixture sidecar by default, the real accelerator
//! with `HUNCH_E2E_SERVE_ARGS` (see tests/src/lib.rs).
//!
//! They need the venv made by `scripts/python-env.sh`. Without it these tests say so and pass,
//! unless `HUNCH_E2E_REQUIRE_PYTHON=1` (CI sets it), which makes a missing venv a failure.

use hunch_e2e::{start_hunch_for_clients, workspace_root};
use std::path::PathBuf;
use std::process::Command;

fn venv_python() -> Option<PathBuf> {
    let python = workspace_root().join(".venv/bin/python");
    if python.exists() {
        return Some(python);
    }
    if std::env::var("HUNCH_E2E_REQUIRE_PYTHON").is_ok_and(|v| v == "1") {
        panic!("no .venv: run scripts/python-env.sh first");
    }
    eprintln!(
        "SKIPPED: no .venv (run scripts/python-env.sh to test with the official SDK and jevbench)"
    );
    None
}

#[tokio::test]
async fn the_official_python_sdk_parses_every_answer() {
    let Some(python) = venv_python() else { return };
    let hunch = start_hunch_for_clients(&[]).await;
    let script = workspace_root().join("tests/python/sdk_e2e.py");
    let out = Command::new(&python)
        .arg(&script)
        .env("TYPESAFE_BASE_URL", &hunch.url)
        .env("TYPESAFE_API_KEY", "any-key-auth-is-off")
        .output()
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("SDK E2E OK"),
        "stdout:\n{stdout}\nstderr:\n{stderr}\nserver:\n{}",
        hunch.process.logs()
    );
    // The SDK really sent zstd bodies (it compresses from 1 KiB up).
    let metrics = reqwest::get(format!("{}/metrics", hunch.url))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("hunch_request_bodies_total{encoding=\"zstd\"}"),
        "{metrics}"
    );
}

#[tokio::test]
async fn the_sdk_with_auth_on() {
    let Some(python) = venv_python() else { return };
    let hunch = start_hunch_for_clients(&["--api-key", "k-123"]).await;
    let code = "import typesafe_sdk as ts\n\
        c = ts.TypeSafeClient(retry=ts.RetryPolicy(max_retries=0))\n\
        print(c.system_one('hi', {'q': ts.Noul(instructions='ok?')}).answers['q'].noul)\n\
        try:\n    ts.TypeSafeClient(api_key='wrong').system_one('hi', {'q': ts.Noul(instructions='ok?')})\n    print('NO 401')\n\
        except ts.TypeSafeAuthenticationError:\n    print('401 OK')\n";
    let out = Command::new(&python)
        .args(["-c", code])
        .env("TYPESAFE_BASE_URL", &hunch.url)
        .env("TYPESAFE_API_KEY", "k-123")
        .output()
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("401 OK"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn jevbench_check_passes() {
    let Some(python) = venv_python() else { return };
    let hunch = start_hunch_for_clients(&[]).await;
    let jevbench = python.with_file_name("jevbench");
    let out = Command::new(&jevbench)
        .args([
            "check",
            "--url",
            &format!("{}/v1/systemone", hunch.url),
            "--model",
            "jev-latest",
        ])
        .output()
        .expect("jevbench runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("jevbench check: OK"),
        "stdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
