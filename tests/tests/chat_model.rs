//! `hunch serve` with no model configured, on the real default model: SmolLM2-135M-Instruct as
//! its Q4_1 GGUF (`scripts/fetch-default-model.sh` puts it in the models cache; `setup.sh` runs
//! it), served by the real accelerator's chat-model family from its next-token label logits.
//!
//! The model is real, so besides the shape of every answer type these tests check that answers
//! carry meaning in the direction a 135M model can be trusted with: a message about a double
//! charge is more about billing than one about the weather.

use hunch_e2e::http::{get_json, post_systemone};
use hunch_e2e::{
    accelerator_bin, missing_prerequisite, start_hunch_with, wait_ready_or_logs, Hunch,
};
use serde_json::{json, Map, Value};
use std::path::PathBuf;
use std::time::Duration;

fn default_model() -> Option<PathBuf> {
    let cache = std::env::var_os("HUNCH_MODELS_CACHE")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/hunch/models"))
        })?;
    let path = cache.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    path.is_file().then_some(path)
}

async fn start() -> Option<Hunch> {
    if default_model().is_none() {
        missing_prerequisite(
            "chat_model",
            "the default model SmolLM2-135M-Instruct.Q4_1.gguf",
            "scripts/fetch-default-model.sh",
        );
        return None;
    }
    let bin = accelerator_bin().to_string_lossy().into_owned();
    let hunch = start_hunch_with(&[], &[("HUNCH_ACCELERATOR_BIN", bin)]);
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
}
