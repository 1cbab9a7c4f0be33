//! Question isolation with the REAL accelerator (`hunch-accelerator`, DiffusionGemma on MLX) on
//! the generated tiny checkpoint: in isolated mode (the default) an answer is bit-identical
//! whether its question is asked alone, with 9 other questions, in any order or under another id;
//! joint mode stays available per request; the answer cache serves identical answers without a
//! read. Unknown top-level fields are ignored and named.
//!
//! Bits are compared on the reference BLAS the MLX wheel ships, pinned with the sidecar's
//! `--blas=reference` (the default BLAS is OpenBLAS where it is installed).

use hunch_e2e::http::{metrics, post_systemone};
use hunch_e2e::{
    accelerator_bin, start_hunch_with, tiny_checkpoint, wait_ready_or_logs, Hunch,
    REAL_READY_TIMEOUT, TINY_MODEL,
};
use serde_json::{json, Map, Value};

async fn start(extra: &[&str]) -> Hunch {
    let model = format!("{TINY_MODEL}={}", tiny_checkpoint().display());
    let mut args = vec!["--model", model.as_str(), "--sidecar-arg=--blas=reference"];
    args.extend_from_slice(extra);
    let hunch = start_hunch_with(
        &args,
        &[(
            "HUNCH_ACCELERATOR_BIN",
            accelerator_bin().to_string_lossy().into_owned(),
        )],
    );
    wait_ready_or_logs(&hunch, REAL_READY_TIMEOUT).await;
    hunch
}

async fn post(hunch: &Hunch, body: &Value) -> (reqwest::header::HeaderMap, Value) {
    let r = post_systemone(&hunch.url, body).await;
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let text = r.text().await.expect("a body");
    assert_eq!(status, 200, "{text}\nlogs:\n{}", hunch.process.logs());
    (headers, serde_json::from_str(&text).expect("JSON"))
}

const STATE: &str = "I was charged twice for my subscription and the app keeps crashing!";

/// The question whose answer is watched.
fn target() -> Value {
    json!({"type": "choice", "instructions": "Which team should handle this",
           "criteria": {"billing": "Payment or subscription issues", "technical": "Bugs, errors",
                        "sales": null}})
}

/// Nine other questions of every kind.
fn others() -> Vec<(String, Value)> {
    let mut out = vec![
        (
            "urgent".to_string(),
            json!({"type": "noul", "instructions": "The message conveys urgency"}),
        ),
        (
            "mood".into(),
            json!({"type": "score", "instructions": "How frustrated the customer appears",
                               "criteria": ["Calm", "Mildly annoyed", "Very frustrated"]}),
        ),
        (
            "refund".into(),
            json!({"type": "noul", "criteria": {"true": "Asks for a refund"}}),
        ),
        (
            "lang".into(),
            json!({"type": "choice", "criteria": {"en": "English", "de": null, "fr": null}}),
        ),
        (
            "ten".into(),
            json!({"type": "score", "instructions": "Severity",
                              "criteria": ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"]}),
        ),
    ];
    for i in 0..4 {
        out.push((
            format!("item {i}"),
            json!({"type": "noul", "instructions": format!("The customer mentions item {i}")}),
        ));
    }
    out
}

fn request(questions: Vec<(String, Value)>, extra: Value) -> Value {
    let mut body = json!({"model": "jev-latest", "state": STATE,
                          "questions": questions.into_iter().collect::<Map<String, Value>>()});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    body
}

#[tokio::test]
async fn an_isolated_answer_is_bit_identical_alone_with_others_in_any_order_and_renamed() {
    let hunch = start(&[]).await;
    let (headers, alone) = post(&hunch, &request(vec![("team".into(), target())], json!({}))).await;
    assert_eq!(headers["x-hunch-questions"], "isolated");
    let answer = &alone["answers"]["team"];

    // With 9 other questions, the target in the middle.
    let mut with_others = others();
    with_others.insert(4, ("team".into(), target()));
    let (_, ten) = post(&hunch, &request(with_others.clone(), json!({}))).await;
    assert_eq!(&ten["answers"]["team"], answer, "asked with 9 others");
    // Every read is counted: ten questions cost more than one.
    let tokens = |v: &Value| v["usage"]["input_tokens"].as_u64().unwrap();
    assert!(
        tokens(&ten) > 5 * tokens(&alone),
        "{} vs {}",
        tokens(&ten),
        tokens(&alone)
    );

    // Reversed, and under another id.
    let mut reversed = with_others;
    reversed.reverse();
    for (id, _) in reversed.iter_mut() {
        if id == "team" {
            *id = "routing 🔀".into();
        }
    }
    let (_, back) = post(&hunch, &request(reversed, json!({}))).await;
    assert_eq!(
        &back["answers"]["routing 🔀"], answer,
        "reversed and renamed"
    );
    // The others too answer as they did in the first order.
    for (id, _) in others() {
        assert_eq!(back["answers"][&id], ten["answers"][&id], "{id}");
    }

    // Joint reads stay available per request, as one prompt (one read's input tokens).
    let (headers, joint) = post(&hunch, &request(others(), json!({"x_questions": "joint"}))).await;
    assert_eq!(headers["x-hunch-questions"], "joint");
    assert!(tokens(&joint) < tokens(&ten));
}

#[tokio::test]
async fn cached_answers_are_identical_free_and_counted_and_unknown_fields_are_named() {
    let hunch = start(&["--answer-cache-mb", "4"]).await;
    let first = request(
        vec![
            ("team".into(), target()),
            ("urgent".into(), others()[0].1.clone()),
        ],
        json!({"x_trace_id": "abc-123", "x_sed": 7}),
    );
    let (headers, a) = post(&hunch, &first).await;
    assert_eq!(headers["x-hunch-answer-cache-hits"], "0");
    assert_eq!(headers["x-hunch-ignored-fields"], "x_trace_id, x_sed");
    // The same questions under other ids, one new: two hits, one read.
    let second = request(
        vec![
            ("new".into(), others()[1].1.clone()),
            ("u".into(), others()[0].1.clone()),
            ("t".into(), target()),
        ],
        json!({}),
    );
    let (headers, b) = post(&hunch, &second).await;
    assert_eq!(headers["x-hunch-answer-cache-hits"], "2");
    assert!(headers.get("x-hunch-ignored-fields").is_none());
    assert_eq!(b["answers"]["t"], a["answers"]["team"]);
    assert_eq!(b["answers"]["u"], a["answers"]["urgent"]);
    // All cached: no tokens.
    let (_, c) = post(&hunch, &request(vec![("t".into(), target())], json!({}))).await;
    assert_eq!(c["usage"], json!({"input_tokens": 0, "output_tokens": 0}));
    let metrics = metrics(&hunch.url).await;
    assert!(
        metrics.contains("hunch_answer_cache_hits_total 3\n"),
        "{metrics}"
    );
    // Joint reads never use the cache.
    let (headers, _) = post(
        &hunch,
        &request(
            vec![("t".into(), target())],
            json!({"x_questions": "joint"}),
        ),
    )
    .await;
    assert!(headers.get("x-hunch-answer-cache-hits").is_none());
}
