//! A chat model whose checkpoint the sidecar refuses at load (docs/models.md, "Configs") is a
//! 409 naming the refusal, never a 503: with a REAL sidecar (`hunch-accelerator`) on a tiny
//! Qwen2 GGUF holding a config key Hunch does not know (`qwen2.attention.zoom`), beside a good
//! one. Its `/v1/models` entry says it failed, why, and that it was refused; the other model
//! keeps answering; and once the model's settings name the key harmless
//! (`ignore_config_keys` in `hunch-models.toml`), the same request loads it and is answered.

use hunch_e2e::http::{listed_model, post_systemone};
use hunch_e2e::{
    accelerator_bin, eventually, start_hunch_over_models_dir, start_hunch_with, wait_ready_or_logs,
    workspace_root,
};
use serde_json::{json, Value};
use std::time::Duration;

const KEY: &str = "qwen2.attention.zoom";

fn request(model: &str) -> Value {
    json!({"model": model, "state": "I was charged twice this month.",
           "questions": {"billing": {"type": "noul", "instructions": "Is this about billing?"}}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_checkpoint_is_a_409_until_its_settings_fix_it() {
    let data = workspace_root().join("accelerator/tests/data/causal");
    let dir = tempfile::tempdir().expect("temp dir");
    for (file, name) in [
        ("refused/tiny-qwen2.unknown-key.gguf", "zoom"),
        ("tiny-qwen2.q8_0.gguf", "good"),
    ] {
        std::fs::copy(data.join(file), dir.path().join(format!("{name}.gguf")))
            .expect("copy a checkpoint");
    }
    let hunch = start_hunch_over_models_dir(dir.path()).await;

    // The first read loads it, the sidecar refuses it, and the read is told so: 4xx, no retry.
    let response = post_systemone(&hunch.url, &request("zoom")).await;
    let status = response.status().as_u16();
    let retry_after = response.headers().get("retry-after").cloned();
    let text = response.text().await.unwrap_or_default();
    assert_eq!(status, 409, "{text}\nlogs:\n{}", hunch.process.logs());
    assert!(retry_after.is_none(), "a refusal has no Retry-After");
    for part in ["model zoom", KEY, "/v1/models", "ignore_config_keys"] {
        assert!(text.contains(part), "{part}: {text}");
    }

    let entry = listed_model(&hunch.url, "zoom").await;
    assert_eq!(entry["x_state"], "failed", "{entry}");
    assert_eq!(entry["x_refused"], true, "{entry}");
    let error = entry["x_error"].as_str().unwrap_or_default();
    assert!(error.contains(KEY), "{entry}");

    // The other model is unaffected.
    let good = post_systemone(&hunch.url, &request("good")).await;
    let good_status = good.status().as_u16();
    let good_text = good.text().await.unwrap_or_default();
    assert_eq!(good_status, 200, "{good_text}");
    let good_entry = listed_model(&hunch.url, "good").await;
    assert!(good_entry.get("x_refused").is_none(), "{good_entry}");

    // The operator names the key harmless; a rescan reads it and, past the failed load's
    // cooldown, the next read loads the model with it.
    std::fs::write(
        dir.path().join("hunch-models.toml"),
        format!("[models.\"zoom\"]\nignore_config_keys = [\"{KEY}\"]\n"),
    )
    .expect("write the settings");
    let url = hunch.url.clone();
    eventually(Duration::from_secs(40), || {
        let url = url.clone();
        async move {
            let response = post_systemone(&url, &request("zoom")).await;
            let status = response.status().as_u16();
            let text = response.text().await.unwrap_or_default();
            if status == 200 {
                Ok(())
            } else {
                Err(format!("{status}: {text}"))
            }
        }
    })
    .await;
    let entry = listed_model(&hunch.url, "zoom").await;
    assert_eq!(entry["x_state"], "loaded", "{entry}");
    assert!(entry.get("x_refused").is_none(), "{entry}");
    assert_eq!(entry["x_ignored_config_keys"], json!([KEY]), "{entry}");
}

/// A pinned `--model` whose checkpoint is refused: its sidecar keeps being restarted (a fixed
/// file is picked up), and meanwhile its reads are the same 409, not the 503 of a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_model_whose_checkpoint_is_refused_is_a_409_too() {
    let path =
        workspace_root().join("accelerator/tests/data/causal/refused/tiny-qwen2.unknown-key.gguf");
    let model = format!("zoom={}", path.display());
    let bin = accelerator_bin().to_string_lossy().into_owned();
    let hunch = start_hunch_with(&["--model", &model], &[("HUNCH_ACCELERATOR_BIN", bin)]);
    let url = hunch.url.clone();
    // 503 while its sidecar starts and loads; then the refusal.
    let text = eventually(Duration::from_secs(30), || {
        let url = url.clone();
        async move {
            let response = post_systemone(&url, &request("zoom")).await;
            let status = response.status().as_u16();
            let text = response.text().await.unwrap_or_default();
            match status {
                409 => Ok(text),
                503 if !text.contains(KEY) => Err(format!("still starting: {text}")),
                _ => panic!("neither starting nor refused: {status}: {text}"),
            }
        }
    })
    .await;
    assert!(text.contains("model zoom") && text.contains(KEY), "{text}");
    // Between its supervisor's restarts (backoff from 1 s) the entry says the refusal; while a
    // restart loads it says loading.
    eventually(Duration::from_secs(10), || {
        let url = url.clone();
        async move {
            let entry = listed_model(&url, "zoom").await;
            if entry["x_state"] == "failed" && entry["x_refused"] == true {
                assert!(
                    entry["x_error"].as_str().unwrap_or_default().contains(KEY),
                    "{entry}"
                );
                Ok(())
            } else {
                Err(format!("not shown refused: {entry}"))
            }
        }
    })
    .await;
}

/// A `--model` whose checkpoint has no chat template (a base model's) is refused saying how to
/// give one; `hunch serve --chat-template NAME=chatml` beside it makes the same files answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_without_a_template_is_answered_once_one_is_given() {
    let source = workspace_root().join("accelerator/tests/data/causal/tiny-qwen2");
    let dir = tempfile::tempdir().expect("temp dir");
    let folder = dir.path().join("base");
    std::fs::create_dir(&folder).expect("mkdir");
    for file in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(source.join(file), folder.join(file)).expect("copy");
    }
    let mut config: Value = serde_json::from_str(
        &std::fs::read_to_string(source.join("tokenizer_config.json")).expect("config"),
    )
    .expect("json");
    config
        .as_object_mut()
        .expect("object")
        .remove("chat_template");
    std::fs::write(folder.join("tokenizer_config.json"), config.to_string()).expect("write");
    let model = format!("base={}", folder.display());
    let bin = accelerator_bin().to_string_lossy().into_owned();

    let bare = start_hunch_with(
        &["--model", &model],
        &[("HUNCH_ACCELERATOR_BIN", bin.clone())],
    );
    let url = bare.url.clone();
    let text = eventually(Duration::from_secs(30), || {
        let url = url.clone();
        async move {
            let response = post_systemone(&url, &request("base")).await;
            let status = response.status().as_u16();
            let text = response.text().await.unwrap_or_default();
            match status {
                409 => Ok(text),
                503 if !text.contains("chat template") => Err(format!("starting: {text}")),
                _ => panic!("neither starting nor refused: {status}: {text}"),
            }
        }
    })
    .await;
    assert!(
        text.contains("no chat template") && text.contains("chatml"),
        "{text}"
    );
    drop(bare);

    let given = start_hunch_with(
        &["--model", &model, "--chat-template", "base=chatml"],
        &[("HUNCH_ACCELERATOR_BIN", bin)],
    );
    wait_ready_or_logs(&given, Duration::from_secs(60)).await;
    let response = post_systemone(&given.url, &request("base")).await;
    let status = response.status().as_u16();
    let text = response.text().await.unwrap_or_default();
    assert_eq!(status, 200, "{text}\nlogs:\n{}", given.process.logs());
}
