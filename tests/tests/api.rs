//! The raw System One API over HTTP against a real `hunch serve` with the fixture sidecar.

use hunch_e2e::http::{get_json, metrics, post_json};
use hunch_e2e::{sample_request, start_hunch_with_fixture};
use serde_json::{json, Value};

async fn post(url: &str, body: &Value) -> (u16, reqwest::header::HeaderMap, Value) {
    post_json(&format!("{url}/v1/systemone"), body, &[]).await
}

#[tokio::test]
async fn every_answer_type_in_request_order_with_the_real_model_name() {
    let hunch = start_hunch_with_fixture("dg-test", &[]).await;
    let (status, headers, body) = post(&hunch.url, &sample_request()).await;
    assert_eq!(status, 200, "{body}");
    assert!(headers.contains_key("x-typesafe-request-id"));
    assert_eq!(body["model"], "dg-test");
    let ids: Vec<&String> = body["answers"].as_object().unwrap().keys().collect();
    assert_eq!(ids, vec!["billing", "team", "urgency"]);
    let noul = body["answers"]["billing"]["noul"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&noul));
    let team = &body["answers"]["team"];
    assert_eq!(team["type"], "choice");
    let probs = team["probabilities"].as_object().unwrap();
    assert_eq!(
        probs.keys().collect::<Vec<_>>(),
        vec!["billing", "technical", "sales team"]
    );
    let sum: f64 = probs.values().map(|p| p.as_f64().unwrap()).sum();
    assert!((sum - 1.0).abs() < 1e-9);
    let urgency = &body["answers"]["urgency"];
    assert_eq!(
        urgency["legend"],
        json!({"0": "Can wait", "1": "This week", "2": "Today"})
    );
    assert!(body["usage"]["input_tokens"].is_u64());
    assert!(body["usage"]["output_tokens"].is_u64());
}

/// The host maps each answer back to the caller's id whatever the ids are (empty, 5000
/// characters, non-ASCII) and wherever the question sits. The fixture's answers depend only on
/// the state and the question's own text, so this checks the host's mapping, not whether a model's
/// answer depends on the other questions (that is the read's business, `docs/read.md`).
#[tokio::test]
async fn answers_are_mapped_back_to_the_callers_ids_in_any_order() {
    let hunch = start_hunch_with_fixture("dg-test", &[]).await;
    let (_, _, a) = post(&hunch.url, &sample_request()).await;
    let mut renamed = sample_request();
    let qs = renamed["questions"].as_object().unwrap().clone();
    let mut reordered = serde_json::Map::new();
    reordered.insert(
        "a whole new question".into(),
        json!({"type": "noul", "criteria": {"false": "nothing"}}),
    );
    reordered.insert("ȕrgency 🔥".into(), qs["urgency"].clone());
    reordered.insert("x".repeat(5000), qs["team"].clone());
    reordered.insert("".into(), qs["billing"].clone());
    renamed["questions"] = Value::Object(reordered);
    let (status, _, b) = post(&hunch.url, &renamed).await;
    assert_eq!(status, 200, "{b}");
    assert_eq!(a["answers"]["urgency"], b["answers"]["ȕrgency 🔥"]);
    assert_eq!(
        a["answers"]["team"],
        b["answers"]["x".repeat(5000).as_str()]
    );
    assert_eq!(a["answers"]["billing"], b["answers"][""]);
}

#[tokio::test]
async fn single_option_questions_need_no_read_and_legends_echo_objects() {
    let hunch = start_hunch_with_fixture("dg-test", &[]).await;
    let (status, _, body) = post(
        &hunch.url,
        &json!({"model": "dg-test", "state": ["a", {"b": 1}],
                "questions": {"one": {"type": "choice", "criteria": {"only option": "x"}},
                              "level": {"type": "score", "criteria": [{"desc": "the only level"}]}}}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["answers"]["one"],
        json!({"type": "choice", "choice": "only option", "confidence": 1.0, "probabilities": {"only option": 1.0}})
    );
    assert_eq!(
        body["answers"]["level"]["legend"],
        json!({"0": {"desc": "the only level"}})
    );
    assert_eq!(body["answers"]["level"]["score"], 0.0);
    assert_eq!(
        body["usage"],
        json!({"input_tokens": 0, "output_tokens": 0})
    );
}

#[tokio::test]
async fn models_health_metrics_openapi_and_request_ids() {
    let hunch = start_hunch_with_fixture("dg-test", &["--alias", "fast=dg-test"]).await;
    let client = reqwest::Client::new();
    let models = get_json(&format!("{}/v1/models", hunch.url)).await;
    let names: Vec<&str> = models["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["jev-latest", "fast", "dg-test"]);
    assert!(models["models"][0]["release_date"].as_str().unwrap().len() == 10);

    let r = client
        .get(format!("{}/healthz", hunch.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = client
        .get(format!("{}/readyz", hunch.url))
        .header("x-request-id", "my-req-1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-typesafe-request-id"], "my-req-1");
    let r = client
        .get(format!("{}/readyz", hunch.url))
        .header("x-request-id", "not plain!")
        .send()
        .await
        .unwrap();
    assert_ne!(r.headers()["x-typesafe-request-id"], "not plain!");

    let (status, _, _) = post(&hunch.url, &sample_request()).await;
    assert_eq!(status, 200);
    let metrics = metrics(&hunch.url).await;
    assert!(
        metrics.contains("hunch_http_requests_total{route=\"/v1/systemone\",status=\"200\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("hunch_http_request_duration_seconds_bucket{route=\"/v1/systemone\""));
    assert!(metrics.contains("hunch_reads_total{model=\"dg-test\",outcome=\"ok\"} 1"));
    assert!(metrics.contains("hunch_queue_depth 0"));
    assert!(metrics.contains("hunch_reads_in_flight 0"));

    let doc = get_json(&format!("{}/openapi.json", hunch.url)).await;
    for path in [
        "/v1/systemone",
        "/v1/models",
        "/healthz",
        "/readyz",
        "/metrics",
        "/openapi.json",
    ] {
        assert!(
            doc["paths"][path].is_object(),
            "{path} missing from openapi.json"
        );
    }
    let r = client
        .get(format!("{}/nope", hunch.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert!(r.headers().contains_key("x-typesafe-request-id"));
}

#[tokio::test]
async fn extensions_reach_the_reader_and_plain_requests_are_unchanged() {
    let hunch = start_hunch_with_fixture("dg-test", &[]).await;
    let (_, _, plain) = post(&hunch.url, &sample_request()).await;
    let mut seeded = sample_request();
    seeded["x_seed"] = json!(12345);
    seeded["x_draws"] = json!(3);
    let (status, _, s) = post(&hunch.url, &seeded).await;
    assert_eq!(status, 200, "{s}");
    // The fixture mixes the seed into its answers: the extension reached the reader.
    assert_ne!(plain["answers"]["team"], s["answers"]["team"]);
    let (_, _, again) = post(&hunch.url, &sample_request()).await;
    assert_eq!(plain, again);
}
