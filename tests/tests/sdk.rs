//! The official clients against a real `hunch serve`: TypeSafe's Python SDK 0.7.5 (zstd bodies on,
//! every answer type parsed by its models), `jevbench check`, and jevbench's `examples` suite run
//! to the end.
//!
//! The server is `start_hunch_for_clients`: the REAL accelerator on the generated tiny checkpoint
//! by default, or the server `HUNCH_E2E_SERVE_ARGS` describes (see tests/src/lib.rs).
//!
//! They need the venv made by `scripts/python-env.sh`. Without it they fail and say how to make
//! it, unless `HUNCH_TEST_SKIP=python` says to skip them on purpose.

use hunch_e2e::http::metrics;
use hunch_e2e::{
    assert_jevbench_check_passes, assert_sdk_script_passes, start_hunch_for_clients, target_dir,
    venv_python,
};
use std::process::Command;

#[tokio::test]
async fn the_official_python_sdk_parses_every_answer() {
    let Some(python) = venv_python() else { return };
    let hunch = start_hunch_for_clients(&[]).await;
    assert_sdk_script_passes(&python, &hunch);
    // The SDK really sent zstd bodies (it compresses from 1 KiB up).
    let metrics = metrics(&hunch.url).await;
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
    assert_jevbench_check_passes(&python, &hunch.url);
}

/// jevbench's bundled `examples` suite (one case, every scored relation: 43 requests with several
/// questions each) against the real model, to the end: exit 0, no request refused or invalid, and
/// the report written with every planned request's outcome.
#[tokio::test]
async fn jevbench_examples_suite_runs_to_the_end() {
    let Some(python) = venv_python() else { return };
    let hunch = start_hunch_for_clients(&[]).await;
    let jevbench = python.with_file_name("jevbench");
    let report = target_dir().join(format!("jevbench-examples-{}.json", std::process::id()));
    let out = Command::new(&jevbench)
        .args([
            "eval",
            "--suite",
            "examples",
            "--no-cache",
            "--concurrency",
            "2",
        ])
        .args(["--url", &format!("{}/v1/systemone", hunch.url)])
        .args(["--model", "jev-latest", "--out"])
        .arg(&report)
        .output()
        .expect("jevbench runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "jevbench eval exited {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}\nserver:\n{}",
        out.status.code(),
        hunch.process.logs()
    );
    let saved: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report).expect("the report was written"))
            .expect("the report is JSON");
    let result = &saved["result"];
    assert_eq!(
        result["errors"].as_array().map(Vec::len),
        Some(0),
        "refused or invalid answers: {}",
        result["errors"]
    );
    assert!(
        result
            .get("backend_down")
            .is_none_or(|v| v.is_null() || v == false),
        "backend down: {}",
        result["backend_down"]
    );
    assert!(
        result["outcomes"].as_array().is_some_and(|o| !o.is_empty()),
        "no relation outcomes in the report"
    );
    eprintln!("{stdout}");
    let _ = std::fs::remove_file(&report);
}
