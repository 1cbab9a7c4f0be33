//! `hunch serve` with no model configured, on the real default model: SmolLM2-135M-Instruct as
//! its Q4_1 GGUF (`scripts/fetch-default-model.sh` puts it in the models cache; `setup.sh` runs
//! it), served by the real accelerator's chat-model family from its next-token label logits.
//!
//! The model is real, so besides the shape of every answer type these tests check that answers
//! carry meaning in the direction a 135M model can be trusted with: a message about a double
//! charge is more about billing than one about the weather.

use hunch_e2e::http::{get_json, post_systemone};
use hunch_e2e::{
    accelerator_bin, assert_jevbench_check_passes, assert_sdk_script_passes, default_model_file,
    eventually, hunch_bin, missing_prerequisite, start_hunch_with, venv_python, wait_ready_or_logs,
    Hunch,
};
use serde_json::{json, Map, Value};
use std::time::Duration;

async fn start() -> Option<Hunch> {
    start_with(&[]).await
}

/// The server with no model configured (so the default model), and `args`.
async fn start_with(args: &[&str]) -> Option<Hunch> {
    if default_model_file().is_none() {
        missing_prerequisite(
            "chat_model",
            "the default model SmolLM2-135M-Instruct.Q4_1.gguf",
            "scripts/fetch-default-model.sh",
        );
        return None;
    }
    let bin = accelerator_bin().to_string_lossy().into_owned();
    let hunch = start_hunch_with(args, &[("HUNCH_ACCELERATOR_BIN", bin)]);
    wait_ready_or_logs(&hunch, Duration::from_secs(300)).await;
    Some(hunch)
}

async fn ok(hunch: &Hunch, body: &Value) -> Value {
    let r = post_systemone(&hunch.url, body).await;
    let status = r.status().as_u16();
    let text = r.text().await.expect("a body");
    assert_eq!(status, 200, "{text}\nlogs:\n{}", hunch.process.logs());
    serde_json::from_str(&text).expect("JSON")
}

fn probability_of_true(answer: &Value, id: &str) -> f64 {
    let p = answer["answers"][id]["noul"]
        .as_f64()
        .unwrap_or_else(|| panic!("no noul for {id}: {answer}"));
    assert!((0.0..=1.0).contains(&p), "{id}: noul {p}");
    p
}

#[tokio::test(flavor = "multi_thread")]
async fn the_default_model_serves_every_answer_type_with_meaning() {
    let Some(hunch) = start().await else { return };
    let models = get_json(&format!("{}/v1/models", hunch.url)).await;
    assert!(
        models.to_string().contains("smollm2-135m-instruct"),
        "{models}"
    );
    // What the model is, as the sidecar found it in the file: a Llama-architecture chat model in
    // a GGUF whose matrices are mostly Q4_1 (its embedding is Q8_0).
    let listed = models["models"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["name"] == "smollm2-135m-instruct"))
        .expect("the default model is listed");
    assert_eq!(listed["x_family"], "chat", "{listed}");
    assert_eq!(listed["x_architecture"], "llama", "{listed}");
    assert_eq!(listed["x_layout"], "gguf", "{listed}");
    assert_eq!(listed["x_quantization"], "Q4_1+Q8_0", "{listed}");
    assert_eq!(listed["x_read"], "logits-v1", "{listed}");
    assert!(listed["x_checkpoint_name"].is_string(), "{listed}");

    let billing = |state: &str| {
        json!({
            "model": "smollm2-135m-instruct",
            "state": state,
            "questions": {
                "billing": {"type": "noul", "instructions": "Is this message about a payment or a charge?"},
                "team": {"type": "choice", "instructions": "Which team should handle it?",
                         "criteria": {"billing": "Payments and refunds", "technical": "Bugs and outages",
                                      "sales": "New purchases"}},
                "urgency": {"type": "score", "instructions": "How urgent is it?",
                            "criteria": ["Can wait", "This week", "Today"]}
            }
        })
    };
    let charged = ok(
        &hunch,
        &billing("I was charged twice for my subscription this month. Please refund one."),
    )
    .await;
    let weather = ok(
        &hunch,
        &billing("The weather is lovely today, the sun is out over the hills."),
    )
    .await;
    for answer in [&charged, &weather] {
        for id in ["team", "urgency"] {
            let probabilities = answer["answers"][id]["probabilities"]
                .as_object()
                .unwrap_or_else(|| panic!("{id}: {answer}"));
            let sum: f64 = probabilities.values().filter_map(Value::as_f64).sum();
            assert!((sum - 1.0).abs() < 1e-6, "{id} sums to {sum}: {answer}");
        }
    }
    let (p_charged, p_weather) = (
        probability_of_true(&charged, "billing"),
        probability_of_true(&weather, "billing"),
    );
    assert!(
        p_charged > p_weather,
        "a double charge ({p_charged}) should read as more about payment than the weather \
         ({p_weather})"
    );

    // The same request again: the same bits (the prefix cache restores whole chunks exactly).
    let again = ok(
        &hunch,
        &billing("I was charged twice for my subscription this month. Please refund one."),
    )
    .await;
    assert_eq!(again["answers"], charged["answers"]);

    // Noise draws and seeds are the diffusion read's: accepted, and without effect on this
    // deterministic read (docs/logit-read.md).
    let mut seeded =
        billing("I was charged twice for my subscription this month. Please refund one.");
    seeded["x_draws"] = json!(4);
    seeded["x_seed"] = json!(7);
    let seeded = ok(&hunch, &seeded).await;
    assert_eq!(seeded["answers"], charged["answers"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_default_model_reads_choices_past_v1s_50_labels_and_refuses_what_cannot_fit() {
    let Some(hunch) = start().await else { return };
    // 60 options: past v1's 50 letters, into the further single-token labels. (The prompt lists
    // every option twice, so a 255-option read is several thousand tokens: the accelerator's
    // tests check the labels of all 255, `tests/logit_read.rs` and the planner's.)
    let mut options = Map::new();
    for i in 0..60 {
        options.insert(format!("option {i}"), Value::Null);
    }
    let body = json!({
        "model": "smollm2-135m-instruct",
        "state": "pick one",
        "questions": {"which": {"type": "choice", "criteria": options}}
    });
    let answer = ok(&hunch, &body).await;
    let probabilities = answer["answers"]["which"]["probabilities"]
        .as_object()
        .expect("probabilities");
    assert_eq!(probabilities.len(), 60);

    // 256 options can never be read: a 4xx naming the limit, not a 5xx.
    let mut too_many = Map::new();
    for i in 0..256 {
        too_many.insert(format!("option {i}"), Value::Null);
    }
    let body = json!({
        "model": "smollm2-135m-instruct",
        "state": "pick one",
        "questions": {"which": {"type": "choice", "criteria": too_many}}
    });
    let r = post_systemone(&hunch.url, &body).await;
    let status = r.status().as_u16();
    let text = r.text().await.expect("body");
    assert!((400..500).contains(&status), "{status}: {text}");
    assert!(text.contains("255") || text.contains("option"), "{text}");

    // Scores past ten levels take v1's letter labels (each one token at SmolLM2's answer
    // boundary): an 11- and a 50-level score are answered, the model lists its limit, and 51
    // levels are a 422 naming it.
    for levels in [11usize, 50] {
        let criteria: Vec<String> = (0..levels).map(|i| format!("level {i}")).collect();
        let body = json!({
            "model": "smollm2-135m-instruct",
            "state": "rate it",
            "questions": {"how": {"type": "score", "criteria": criteria}}
        });
        let answer = ok(&hunch, &body).await;
        let legend = answer["answers"]["how"]["legend"]
            .as_object()
            .expect("legend");
        assert_eq!(legend.len(), levels);
        let score = answer["answers"]["how"]["score"].as_f64().expect("score");
        assert!((0.0..=(levels - 1) as f64).contains(&score), "{score}");
    }
    let models = get_json(&format!("{}/v1/models", hunch.url)).await;
    let smollm2 = models["models"]
        .as_array()
        .and_then(|m| m.iter().find(|e| e["name"] == "smollm2-135m-instruct"))
        .expect("listed");
    assert_eq!(smollm2["x_max_score_levels"], 50, "{smollm2}");
    let criteria: Vec<String> = (0..51).map(|i| format!("level {i}")).collect();
    let body = json!({
        "model": "smollm2-135m-instruct",
        "state": "rate it",
        "questions": {"how": {"type": "score", "criteria": criteria}}
    });
    let r = post_systemone(&hunch.url, &body).await;
    assert_eq!(r.status().as_u16(), 422);
    let text = r.text().await.expect("body");
    assert!(text.contains("50"), "{text}");
}

/// The official clients against the default model, as users run them: TypeSafe's Python SDK
/// parses every answer type (`tests/python/sdk_e2e.py`: the model list, every type, a zstd body
/// of a 40-option choice over a long state, typed errors) and `jevbench check` reads one request
/// and every answer.
#[tokio::test(flavor = "multi_thread")]
async fn the_official_sdk_and_jevbench_check_pass_on_the_default_model() {
    let Some(python) = venv_python() else { return };
    let Some(hunch) = start().await else { return };
    assert_sdk_script_passes(&python, &hunch);
    assert_jevbench_check_passes(&python, &hunch.url);
}

/// `hunch calibrate` on the default model's own decision log: labelled decisions are joined to
/// their recorded reads and a temperature is fitted and measured, as for any other model.
#[tokio::test(flavor = "multi_thread")]
async fn hunch_calibrate_fits_the_default_models_decision_log() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("decisions.ndjson");
    let l = log.display().to_string();
    let Some(hunch) = start_with(&["--decision-log", &l]).await else {
        return;
    };
    let billing = [
        "I was charged twice this month, please refund one payment.",
        "My card was billed but the order never arrived.",
        "Why is there an extra fee on my invoice?",
        "Please cancel the charge for the annual plan.",
        "The refund you promised has not reached my account.",
        "I need a receipt for last month's payment.",
    ];
    let other = [
        "The app crashes when I open the settings page.",
        "What time does the store open on Sunday?",
        "It is sunny and warm in Lisbon today.",
        "How do I change my profile picture?",
        "The login page shows a blank screen.",
        "Can you recommend a good book about gardening?",
    ];
    let mut labels = String::new();
    // 36 labels: `hunch calibrate` fits a question from 30 up.
    for round in 0..3 {
        for (text, is_billing) in billing
            .iter()
            .map(|t| (t, true))
            .chain(other.iter().map(|t| (t, false)))
        {
            let state = format!("{text} (ticket {round})");
            let r = post_systemone(
                &hunch.url,
                &json!({
                    "model": "smollm2-135m-instruct",
                    "state": state,
                    "questions": {"billing": {"type": "noul",
                        "instructions": "Is this message about a payment or a charge?"}}
                }),
            )
            .await;
            assert_eq!(r.status().as_u16(), 200);
            let id = r
                .headers()
                .get("x-hunch-decision-id")
                .and_then(|v| v.to_str().ok())
                .expect("a decision id")
                .to_string();
            labels.push_str(
                &json!({"decision_id": id, "labels": {"billing": is_billing}}).to_string(),
            );
            labels.push('\n');
        }
    }
    let labels_path = dir.path().join("labels.jsonl");
    std::fs::write(&labels_path, labels).expect("write labels");
    eventually(Duration::from_secs(30), || async {
        let held = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .count();
        if held >= 36 {
            Ok(())
        } else {
            Err(format!("the log holds {held} of 36 decisions"))
        }
    })
    .await;
    let out_file = dir.path().join("calibration.json");
    let out = std::process::Command::new(hunch_bin())
        .args(["calibrate", "--json", "--log", &l, "--labels"])
        .arg(&labels_path)
        .arg("-o")
        .arg(&out_file)
        .output()
        .expect("hunch calibrate runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let fitted: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let questions = fitted["questions"].as_array().expect("questions");
    assert_eq!(questions.len(), 1, "{fitted:#}");
    assert_eq!(questions[0]["labels"], json!(36));
    assert!(questions[0]["temperature"]
        .as_f64()
        .is_some_and(|t| t > 0.0));
    for side in ["before", "after"] {
        assert!(questions[0][side]["ece"].is_number(), "{fitted:#}");
    }
}
