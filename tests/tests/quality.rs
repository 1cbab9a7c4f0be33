//! `scripts/quality.sh` end to end, on a few requests against the default model (docs/quality.md):
//! the script starts `hunch serve` itself (this build's binaries), runs a trimmed JevBench subset
//! beside jevbench's toy models and a trimmed labelled suite, and writes its report. The test
//! checks the report's shape, that every request was counted and none failed, and that the
//! ceiling (`fake:coherent`) scores above the floor (`fake:biased`). The script also stores the
//! report in the quality directory (`HUNCH_QUALITY_DIR`, a temporary one here) under its model's
//! fingerprint; the script's server has stopped by then, so the test starts `hunch serve` on the
//! same model again (the same file and build: the same fingerprint) and checks that
//! `GET /v1/models/NAME/quality` answers the stored report.
//!
//! About 40 requests, 9 of them JevBench cases of ~10 questions: 397 s with the debug build on
//! this project's 2-core machine under a load of 8 from other builds (2026-12-06); the labelled
//! requests are one question each.
//!
//! It needs the `.venv` of `scripts/python-env.sh` (jevbench) and the default model
//! (`scripts/fetch-default-model.sh`); `HUNCH_TEST_SKIP=python` (or `smollm2`) skips it on
//! purpose, as the other tests that need them.

use hunch_e2e::http::send_json;
use hunch_e2e::{
    default_model_or_skip, start_hunch_default_model, target_dir, venv_python, workspace_root,
};
use serde_json::Value;
use std::process::Command;

fn estimate_is_well_formed(what: &str, e: &Value) {
    let (v, lo, hi) = (e["value"].as_f64(), e["low"].as_f64(), e["high"].as_f64());
    let (Some(v), Some(lo), Some(hi)) = (v, lo, hi) else {
        panic!("{what}: not an estimate with an interval: {e}");
    };
    assert!(
        (0.0..=1.0).contains(&v) && lo <= v + 1e-12 && v <= hi + 1e-12,
        "{what}: {e}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_quality_script_reports_on_the_default_model() {
    if venv_python().is_none() {
        return;
    }
    if default_model_or_skip().is_none() {
        return;
    }
    let out_dir = tempfile::tempdir().expect("a temporary directory");
    let quality_dir = tempfile::tempdir().expect("a temporary quality directory");
    let bin = target_dir();
    let output = Command::new(workspace_root().join("scripts/quality.sh"))
        .args(["--max-requests", "40", "--remedies", "none,both", "--out"])
        .arg(out_dir.path())
        .env("HUNCH_BIN", bin.join("hunch"))
        .env("HUNCH_QUALITY_DIR", quality_dir.path())
        // `hunch serve` finds its sidecar beside itself; the script's `hunch batch` and
        // `hunch calibrate` are the same binary.
        .env(
            "PATH",
            format!(
                "{}:{}",
                bin.display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .output()
        .expect("scripts/quality.sh runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let server_log = std::fs::read_to_string(out_dir.path().join("server.log")).unwrap_or_default();
    assert!(
        output.status.success(),
        "quality.sh exited {:?}\nstderr:\n{stderr}\nserver:\n{server_log}",
        output.status.code()
    );
    assert!(stderr.contains("requests,"), "no progress line: {stderr}");
    let text = std::fs::read_to_string(out_dir.path().join("quality.json")).expect("quality.json");
    let q: Value = serde_json::from_str(&text).expect("quality.json is JSON");
    assert_eq!(q["model"], "smollm2-135m-instruct", "{q}");
    assert!(q["suite"]["jevbench"].is_string() && q["suite"]["labelled"].is_string());
    let requests = q["requests"].as_u64().expect("requests");
    assert!(
        (20..=80).contains(&requests),
        "about 40 requests were asked for: {requests}"
    );
    assert_eq!(q["errors"], 0, "{}", q["error_list"]);
    for what in ["score", "floor", "ceiling", "accuracy", "ece"] {
        estimate_is_well_formed(what, &q[what]);
    }
    for d in ["REP", "BAT", "MEA", "LOG", "CHO"] {
        estimate_is_well_formed(d, &q["dimensions"][d]);
    }
    assert!(
        q["ceiling"]["value"].as_f64() > q["floor"]["value"].as_f64(),
        "fake:coherent should score above fake:biased: {} vs {}",
        q["ceiling"],
        q["floor"]
    );
    for remedy in ["none", "both"] {
        let r = &q["labelled"][remedy];
        assert!(r["answered"].as_u64() > Some(0), "{remedy}: {r}");
        assert_eq!(r["answered"], r["items"], "{remedy}: every item answered");
        estimate_is_well_formed("position bias", &r["position_bias"]["reversed"]);
    }
    let md = std::fs::read_to_string(out_dir.path().join("quality.md")).expect("quality.md");
    assert!(
        md.contains("| overall |") && md.contains("remedy `both`"),
        "{md}"
    );
    stored_and_served(&q, quality_dir.path(), &stderr).await;
}

/// The report is stored once, as written, under the key of the fingerprint it names, and a
/// server on the same model answers it.
async fn stored_and_served(q: &Value, quality_dir: &std::path::Path, stderr: &str) {
    let fingerprint = q["fingerprint"]
        .as_str()
        .unwrap_or_else(|| panic!("the report names its model's fingerprint: {q}"));
    let measured_at = q["measured_at"].as_str().unwrap_or_default();
    assert!(
        measured_at.len() == 20 && measured_at.ends_with('Z'),
        "{measured_at}"
    );
    let folder = quality_dir.join(hunch::quality::key(fingerprint));
    let stored: Vec<_> = std::fs::read_dir(&folder)
        .unwrap_or_else(|e| panic!("{}: {e}\nstderr:\n{stderr}", folder.display()))
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(stored.len(), 1, "one report, no temporary file: {stored:?}");
    let text = std::fs::read_to_string(&stored[0]).expect("the stored report");
    let kept: Value = serde_json::from_str(&text).expect("the stored report is JSON");
    assert_eq!(&kept, q, "the stored report is quality.json");
    assert!(stderr.contains("stored "), "{stderr}");

    let quality_dir = (
        "HUNCH_QUALITY_DIR",
        quality_dir.to_string_lossy().into_owned(),
    );
    let hunch = start_hunch_default_model(&[], &[quality_dir]).await;
    let model = q["model"].as_str().expect("the model's name");
    let (status, _, served) =
        send_json(reqwest::Client::new().get(format!("{}/v1/models/{model}/quality", hunch.url)))
            .await;
    assert_eq!(status, 200, "{served}\nserver:\n{}", hunch.process.logs());
    assert_eq!(&served, q);
}
