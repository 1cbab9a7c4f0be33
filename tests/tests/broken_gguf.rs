//! A damaged GGUF in a models directory, with a REAL sidecar: its load fails with a message that
//! names the tensor and the cause, the read is refused with that message (never a hang or a
//! crash of the server), and `/v1/models` lists the model `failed` with the same reason
//! (docs/models.md, "GGUF types"). The kinds of damage are the GGUF reader's own unit tests
//! (`accelerator/src/checkpoint/gguf/tests.rs`); this is the path from the file to the operator.

use hunch_e2e::http::{get_json, post_systemone};
use hunch_e2e::{eventually, start_hunch_over_models_dir, workspace_root};
use serde_json::{json, Value};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_gguf_fails_its_load_naming_the_tensor_and_models_lists_why() {
    let dir = tempfile::tempdir().expect("temp dir");
    let broken = dir.path().join("broken.gguf");
    std::fs::copy(
        workspace_root().join("accelerator/tests/data/causal/tiny-llama.q8_0.gguf"),
        &broken,
    )
    .expect("copy a checkpoint");
    // Cut into the last tensor's bytes, as an interrupted download would.
    let len = std::fs::metadata(&broken).expect("the copy").len();
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&broken)
        .expect("open");
    file.set_len(len - 100).expect("truncate");
    drop(file);

    let hunch = start_hunch_over_models_dir(dir.path()).await;

    let request = json!({"model": "broken", "state": "I was charged twice this month.",
        "questions": {"billing": {"type": "noul", "instructions": "Is this about billing?"}}});
    let response = post_systemone(&hunch.url, &request).await;
    let status = response.status().as_u16();
    let body: Value = response.json().await.expect("a JSON error");
    let message = body["detail"]["message"].as_str().unwrap_or_default();
    eprintln!("{status} for a truncated GGUF: {message}");
    // A truncated file is a refusal: nothing but a new file fixes it, so a 409, not a 5xx.
    assert_eq!(status, 409, "{body}");
    assert!(
        message.contains("tensor ") && message.contains("the file is truncated"),
        "the refusal names the tensor and the cause: {body}\nlogs:\n{}",
        hunch.process.logs()
    );

    let entry = eventually(Duration::from_secs(20), || async {
        let list = get_json(&format!("{}/v1/models", hunch.url)).await;
        let entry = list["models"]
            .as_array()
            .and_then(|m| m.iter().find(|e| e["name"] == "broken").cloned())
            .ok_or_else(|| format!("broken is not listed: {list}"))?;
        if entry["x_state"] == "failed" {
            Ok(entry)
        } else {
            Err(format!("broken is {}", entry["x_state"]))
        }
    })
    .await;
    assert_eq!(entry["x_refused"], true, "{entry}");
    let error = entry["x_error"].as_str().unwrap_or_default();
    assert!(
        error.contains("broken.gguf")
            && error.contains("tensor ")
            && error.contains("the file is truncated"),
        "{entry}"
    );
}
