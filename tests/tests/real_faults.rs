//! Faults of the REAL sidecar (`hunch-accelerator` on the generated tiny checkpoint), not the
//! fixture double: killed mid-request, and checkpoints that are broken on disk. The server must
//! never hang: a killed sidecar is a 503 + `Retry-After` and a restart; a checkpoint the sidecar
//! refuses is a 409 without `Retry-After` (no retry helps until the files or settings change)
//! that says which file is wrong and why, while its supervisor keeps restarting it.

use hunch_e2e::http::{metric, post_systemone};
use hunch_e2e::{
    copy_checkpoint, sidecar_pid, start_hunch_real, start_hunch_real_unready, target_dir,
    tiny_checkpoint, Hunch,
};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Posts the sample request until it is answered, within `timeout`, checking each refusal
/// meanwhile with `refused`; then the answering sidecar must be a new process, not `old`.
async fn answered_by_a_new_sidecar(
    hunch: &Hunch,
    old: u32,
    timeout: Duration,
    refused: impl AsyncFn(reqwest::Response),
) {
    let deadline = Instant::now() + timeout;
    loop {
        let r = post_systemone(&hunch.url, &hunch_e2e::sample_request()).await;
        if r.status() == 200 {
            break;
        }
        refused(r).await;
        assert!(
            Instant::now() < deadline,
            "the sidecar was not restarted; logs:\n{}",
            hunch.process.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let new = sidecar_pid(hunch.process.pid()).expect("a restarted sidecar");
    assert_ne!(old, new, "the answer came from a new sidecar process");
}

/// A read that keeps the real engine busy for a while: a long state, many questions, 64 draws.
fn slow_request() -> Value {
    let mut questions = serde_json::Map::new();
    for i in 0..12 {
        questions.insert(
            format!("q{i}"),
            json!({"type": "score", "instructions": format!("Rate aspect {i}."),
                   "criteria": ["low", "mid", "high", "very high"]}),
        );
    }
    json!({"model": "jev-latest", "state": "a long ticket about a refund. ".repeat(300),
           "questions": questions, "x_draws": 64})
}

#[tokio::test]
async fn the_real_sidecar_killed_mid_request_is_a_503_then_it_is_restarted_and_answers() {
    let hunch = start_hunch_real(&[]).await;
    let old = sidecar_pid(hunch.process.pid()).expect("hunch runs a hunch-accelerator child");

    let url = hunch.url.clone();
    let in_flight = tokio::spawn(async move {
        let started = Instant::now();
        let r = post_systemone(&url, &slow_request()).await;
        let status = r.status().as_u16();
        let retry_after = r.headers().get("retry-after").cloned();
        let body: Value = r.json().await.unwrap_or(Value::Null);
        (status, retry_after, body, started.elapsed())
    });
    // Kill it only once the read really is with the sidecar.
    let deadline = Instant::now() + Duration::from_secs(30);
    while metric::<f64>(&hunch.url, "hunch_reads_in_flight").await < 1.0 {
        assert!(Instant::now() < deadline, "the read never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !in_flight.is_finished(),
        "the slow read finished before the kill; make it slower"
    );
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &old.to_string()])
        .status()
        .expect("kill runs");
    assert!(killed.success());

    let (status, retry_after, body, took) = in_flight.await.expect("the request task");
    assert_eq!(status, 503, "{body}\n{}", hunch.process.logs());
    assert!(retry_after.is_some(), "503 without Retry-After");
    assert_eq!(body["detail"]["error_type"], "unavailable", "{body}");
    assert!(
        took < Duration::from_secs(60),
        "the killed read hung for {took:?}"
    );

    // Refused at once while it restarts, then a new sidecar (a new process) answers.
    answered_by_a_new_sidecar(&hunch, old, Duration::from_secs(120), async |r| {
        assert_eq!(r.status(), 503, "{}", r.text().await.unwrap_or_default());
        assert!(r.headers().contains_key("retry-after"));
    })
    .await;
    let logs = hunch.process.logs();
    assert!(logs.contains("the sidecar exited"), "{logs}");
}

/// The engine thread dying inside a live sidecar process (a panic in the model code) is not a
/// process exit: the sidecar must say `failed` on `/health`, and the host's supervisor must
/// restart it. The fault is injected through a hook the sidecar has only when built with the
/// `fault-injection` feature, which `scripts/test.sh` turns on.
#[tokio::test]
async fn a_sidecar_whose_engine_thread_panicked_reports_failed_and_is_restarted() {
    let marker_dir = tempfile::tempdir().expect("a temp dir");
    let marker = marker_dir.path().join("engine-panicked");
    let model = format!("{}={}", hunch_e2e::TINY_MODEL, tiny_checkpoint().display());
    let hunch = hunch_e2e::start_hunch_with(
        &["--model", &model],
        &[
            (
                "HUNCH_ACCELERATOR_BIN",
                hunch_e2e::accelerator_bin().to_string_lossy().into_owned(),
            ),
            (
                "HUNCH_TEST_ENGINE_PANIC_ONCE",
                marker.to_string_lossy().into_owned(),
            ),
        ],
    );
    hunch_e2e::wait_ready_or_logs(&hunch, hunch_e2e::REAL_READY_TIMEOUT).await;
    let old = sidecar_pid(hunch.process.pid()).expect("hunch runs a hunch-accelerator child");

    let r = post_systemone(&hunch.url, &hunch_e2e::sample_request()).await;
    assert!(
        marker.exists(),
        "the injected fault did not fire: build the sidecar with the `fault-injection` feature \
         (`cargo test --workspace --features hunch-accelerator/fault-injection`, as \
         scripts/test.sh does)"
    );
    assert_eq!(r.status(), 503, "{}", hunch.process.logs());
    assert!(r.headers().contains_key("retry-after"));

    let timeout = hunch_e2e::REAL_READY_TIMEOUT;
    answered_by_a_new_sidecar(&hunch, old, timeout, async |r| {
        let body = r.text().await.unwrap_or_default();
        assert!(
            !body.contains("queue is full"),
            "a dead engine reported as a full queue: {body}"
        );
    })
    .await;
    let logs = hunch.process.logs();
    assert!(logs.contains("the sidecar failed"), "{logs}");
    assert!(logs.contains("the engine thread stopped"), "{logs}");
}

/// A copy of the e2e checkpoint in a fresh directory under `target/`, to break.
fn broken_copy(name: &str) -> PathBuf {
    let dir = target_dir()
        .join("e2e-broken")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    copy_checkpoint(&tiny_checkpoint(), &dir);
    dir
}

/// Starts hunch on `dir` and waits until a read's 409 names `file` and says `why`; checks the
/// logs say it too and `/readyz` is 503. Returns the 409 message.
async fn the_server_names(dir: &Path, file: &str, why: &[&str]) -> (Hunch, String) {
    let path = dir.join(file).display().to_string();
    the_server_refuses(dir, &[], &path, why).await
}

/// Starts hunch on `dir` with `extra` flags and waits until a read's 409 (the load refused) says
/// `named` and each of `why`, 503 + `Retry-After` meanwhile (starting, loading) and never a 503
/// that names the refusal; checks the logs name it too and `/readyz` is 503. Returns the 409
/// message.
async fn the_server_refuses(
    dir: &Path,
    extra: &[&str],
    named: &str,
    why: &[&str],
) -> (Hunch, String) {
    let hunch = start_hunch_real_unready(dir, extra);
    let deadline = Instant::now() + Duration::from_secs(90);
    let message = loop {
        let r = post_systemone(&hunch.url, &hunch_e2e::sample_request()).await;
        let status = r.status().as_u16();
        let retry_after = r.headers().contains_key("retry-after");
        let body: Value = r.json().await.expect("a JSON error");
        let message = body["detail"]["message"].as_str().unwrap_or("").to_string();
        match status {
            409 => {
                assert!(!retry_after, "a refusal has no Retry-After: {body}");
                assert!(message.contains(named), "{named} missing from: {message}");
                break message;
            }
            503 => {
                assert!(retry_after, "a 503 without Retry-After: {body}");
                assert!(
                    !message.contains(named),
                    "a refused load answered 503: {message}"
                );
            }
            _ => panic!("a model that cannot load never answers: {status} {body}"),
        }
        assert!(
            Instant::now() < deadline,
            "no 409 named {named}; last: {message}\nlogs:\n{}",
            hunch.process.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    for w in why {
        assert!(message.contains(w), "{w:?} missing from: {message}");
    }
    let readyz = reqwest::get(format!("{}/readyz", hunch.url))
        .await
        .expect("readyz");
    assert_eq!(readyz.status(), 503);
    let logs = hunch.process.logs();
    assert!(logs.contains(named), "the logs name {named}:\n{logs}");
    (hunch, message)
}

/// `memory_limit` in the server's TOML reaches the sidecar it starts: a model larger than the
/// limit is refused before allocating, with the size it needed.
#[tokio::test]
async fn a_model_over_the_configured_memory_limit_is_refused_with_its_size() {
    let dir = tiny_checkpoint();
    let config = target_dir()
        .join("e2e-broken")
        .join(format!("memory-limit-{}.toml", std::process::id()));
    std::fs::create_dir_all(config.parent().expect("a parent")).expect("mkdir");
    std::fs::write(&config, "memory_limit = \"1K\"\n").expect("write the config");
    let config_arg = config.display().to_string();
    let named = dir.display().to_string();
    let (_hunch, message) = the_server_refuses(
        &dir,
        &["--config", &config_arg],
        &named,
        &["refused before allocating", "the memory limit set"],
    )
    .await;
    eprintln!("409 for a model over memory_limit: {message}");
    let _ = std::fs::remove_file(&config);
}

#[tokio::test]
async fn a_truncated_model_safetensors_is_named_with_why() {
    let dir = broken_copy("truncated");
    let file = dir.join("model.safetensors");
    let len = std::fs::metadata(&file).expect("model.safetensors").len();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .expect("open");
    f.set_len(len / 2).expect("truncate");
    let (_hunch, message) = the_server_names(
        &dir,
        "model.safetensors",
        &["truncated: ", "bytes, but its header describes"],
    )
    .await;
    eprintln!("409 for a truncated model.safetensors: {message}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_config_json_that_is_not_json_is_named_with_why() {
    let dir = broken_copy("config");
    std::fs::write(dir.join("config.json"), "this is { not JSON").expect("write");
    let (_hunch, message) = the_server_names(&dir, "config.json", &["not valid JSON"]).await;
    eprintln!("409 for a config.json that is not JSON: {message}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_missing_tokenizer_json_is_named_with_why() {
    let dir = broken_copy("tokenizer");
    std::fs::remove_file(dir.join("tokenizer.json")).expect("remove");
    let (_hunch, message) =
        the_server_names(&dir, "tokenizer.json", &["No such file or directory"]).await;
    eprintln!("409 for a missing tokenizer.json: {message}");
    let _ = std::fs::remove_dir_all(&dir);
}
